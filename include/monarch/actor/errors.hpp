// Failure reports of the actor runtime (vocabulary: docs/actor-runtime.md). All derive from
// monarch::Error (monarch/error.hpp: the one root of every layer's errors, and UsageError), so
// `catch (const monarch::Error&)` catches every runtime failure. Each names what failed and carries
// its ErrorCode and Origin (the actor; for SupervisionError also its proc's address).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "monarch/actor/actor_id.hpp"
#include "monarch/error.hpp"

namespace monarch {

/// A request/reply handler threw. Delivered to the caller's Future; the actor lives on.
/// `actor()` is the actor that threw, `endpoint()` the handler ("Counter::incr" when registered,
/// otherwise "endpoint"), `remote_message()` the exception's what().
class ActorError : public Error {
 public:
  ActorError(ActorId actor, std::string endpoint, std::string message)
      : Error(ErrorCode::Actor,
              "actor " + actor.to_string() + " failed in " + endpoint + ": " + message,
              Origin{.actor = actor.to_string()}),
        actor_(std::move(actor)),
        endpoint_(std::move(endpoint)),
        message_(std::move(message)) {}
  const ActorId& actor() const { return actor_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& remote_message() const { return message_; }

 private:
  ActorId actor_;
  std::string endpoint_;
  std::string message_;
};

/// A message could not be delivered: its destination is stopped, failed, killed or unknown.
/// Returned to the sender: a call's Future fails with it; a send goes to the sending actor's
/// `undeliverable()` (or to the Proc's fault hook when sent from outside any actor).
/// `actor_failed`: the destination had failed (a handler or its constructor threw and nothing
/// handled it), rather than stopped or never existed; `reason` then quotes its failure ("actor
/// failed: CAUSE", "actor TYPE 'NAME' failed: CAUSE"). It survives the trip back across processes.
class DeliveryFailure : public Error {
 public:
  DeliveryFailure(ActorId dest, std::string endpoint, std::string reason, bool actor_failed = false)
      : Error(ErrorCode::Delivery,
              "message " + endpoint + " to " + dest.to_string() + " undeliverable: " + reason,
              Origin{.actor = dest.to_string()}),
        dest_(std::move(dest)),
        endpoint_(std::move(endpoint)),
        reason_(std::move(reason)),
        actor_failed_(actor_failed) {}
  const ActorId& destination() const { return dest_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& reason() const { return reason_; }
  /// Whether the destination actor had failed. A mesh member's failure fails its proc, so the
  /// Python front end reports such a member as SupervisionError, whichever of the bounce and the
  /// proc's declared failure reaches the caller first (PY-5).
  bool actor_failed() const { return actor_failed_; }

 private:
  ActorId dest_;
  std::string endpoint_;
  std::string reason_;
  bool actor_failed_;
};

/// An actor can no longer be reached because its Proc was declared failed (crashed, frozen or
/// lost: Proc::declare_proc_failed, called by the mesh layer when it learns so). Every call pending
/// on an actor of that Proc fails with it at once, and later calls/sends/stops fail with it at once
/// too (a failed Proc is never reused). `actor()` is the actor addressed, `proc()` its Proc's
/// address, `cause()` why the Proc was declared failed (e.g. "process exited with signal 9").
class SupervisionError : public Error {
 public:
  SupervisionError(ActorId actor, std::string cause)
      : Error(
            ErrorCode::Supervision,
            "actor " + actor.to_string() + " unreachable: proc " + actor.proc + " failed: " + cause,
            Origin{.actor = actor.to_string(), .address = actor.proc}),
        actor_(std::move(actor)),
        cause_(std::move(cause)) {}
  const ActorId& actor() const { return actor_; }
  const std::string& proc() const { return actor_.proc; }
  const std::string& cause() const { return cause_; }

 private:
  ActorId actor_;
  std::string cause_;
};

/// A wait with a deadline expired. The future or receiver is left intact and can be waited on
/// again.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message, Origin origin = {})
      : Error(ErrorCode::Timeout, message, std::move(origin)) {}
};

/// A blocking wait that can never complete: an actor blocking on a reply only it can produce
/// (directly, or through a cycle of actors each blocked on the next).
class DeadlockError : public Error {
 public:
  explicit DeadlockError(const std::string& message, Origin origin = {})
      : Error(ErrorCode::Deadlock, message, std::move(origin)) {}
};

// UsageError (misuse of a Future/Port: value already retrieved, OncePort used twice, etc.) is
// defined with the root in monarch/error.hpp, so that every layer can throw it.

}  // namespace monarch
