// Internal: messages to actors in other processes. An ActorRef whose actor lives in another Proc
// (its ActorId's `proc` is that Proc's channel address) sends through the local Proc's channel:
//
//   parts[0] = RemoteHeader (cereal), parts[1] = payload (endpoint arguments, or the reply value)
//
// The receiving Proc looks the actor up by uid, finds the endpoint by its registered name
// (MONARCH_ENDPOINTS) and posts an ordinary envelope, so remote messages keep every local
// guarantee (FIFO per sender, one message at a time, supervision). Replies and errors come back
// the same way; an undeliverable message comes back as DeliveryFailure.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <typeindex>
#include <vector>

#include "monarch/actor/actor_id.hpp"
#include "monarch/actor/detail/unique_function.hpp"
#include "monarch/actor/errors.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch {

class Proc;

template <class Archive>
void serialize(Archive& ar, ActorId& id) {
  ar(id.proc, id.name, id.uid);
}

namespace detail {

class Cell;
using Bytes = std::vector<std::byte>;

enum class RemoteKind : uint8_t {
  Call = 1,
  Send = 2,
  Reply = 3,
  Bounce = 4,
  Lookup = 5,
  PortSend = 6,
  Spawn = 7,  // dest = the new actor's id, endpoint = factory key, sender = owner; payload = args;
              // message_rank, spawn_labels, spawn_sizes = its point in an ActorMesh (or none)
  Supervise = 8,  // dest = the owner, payload = the event chain (a remotely spawned actor failed)
  Stop = 9,       // dest = the actor, endpoint = "stop" | "kill"; replied to once it stopped
};

/// uids of remotely spawned actors have this bit set (local spawns never reach it).
inline constexpr uint64_t kRemoteSpawnBit = uint64_t{1} << 63;

/// An error crossing the wire: rebuilt on arrival as the same exception type.
struct WireError {
  uint8_t kind = 0;  // 0 none, 1 ActorError, 2 DeliveryFailure, 3 UsageError, 4 other Error,
                     // 5 SupervisionError (message = cause), 6 DeliveryFailure whose
                     // destination actor had failed (DeliveryFailure::actor_failed)
  ActorId actor;
  std::string endpoint;
  std::string message;
  /// kind 4: the monarch::ErrorCode of the error thrown (0: not a monarch::Error), so the caller
  /// gets a monarch::Error with the same code and message.
  uint16_t code = 0;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(kind, actor, endpoint, message, code);
  }
  static WireError from(const std::exception_ptr& e);
  [[noreturn]] void rethrow() const;
  std::exception_ptr to_exception_ptr() const;
};

struct RemoteHeader {
  RemoteKind kind = RemoteKind::Call;
  ActorId dest;             // Call/Send: the actor; Lookup: dest.name = well-known name;
                            // PortSend: the port's owner (request_id = port index)
  std::string endpoint;     // Call/Send: registered endpoint name; Lookup: expected type name
  std::string reply_proc;   // where replies and bounces go (the sending Proc's address)
  uint64_t request_id = 0;  // Call/Lookup/Reply
  ActorId sender;           // Send/Bounce: the sending actor (uid 0: outside any actor)
  WireError error;          // Reply/Bounce
  uint64_t message_rank = UINT64_MAX;  // Call/Send from a mesh adverb: Context::message_rank();
                                       // Spawn: the new actor's rank in its ActorMesh
  // Spawn only, and serialised only for Spawn (no other kind carries these bytes): the extent of
  // the ActorMesh the new actor is a member of (ProcMesh::spawn), as labels and sizes; its point
  // there is rank message_rank. message_rank UINT64_MAX: not a mesh member.
  std::vector<std::string> spawn_labels;
  std::vector<uint64_t> spawn_sizes;
  // Call/Lookup/Stop only, and serialised only for them: the caller's
  // ChannelOptions::max_frame_bytes (0: unknown). The replier checks its reply against the smaller
  // of this and its own limit and, when the reply is larger, answers with a DeliveryFailure
  // instead: a frame over the caller's limit would be refused by the caller's listener and resent
  // until the link gave up, leaving the call unanswered.
  uint64_t reply_limit = 0;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(kind, dest, endpoint, reply_proc, request_id, sender, error, message_rank);
    if (kind == RemoteKind::Spawn) ar(spawn_labels, spawn_sizes);  // `kind` is already read
    if (kind == RemoteKind::Call || kind == RemoteKind::Lookup || kind == RemoteKind::Stop)
      ar(reply_limit);
  }
};

/// The outcome of a remote call: payload (encoded value) or error.
struct RemoteResult {
  Bytes payload;
  std::exception_ptr error;
};
using ReplyHandler = UniqueFunction<void(RemoteResult&&)>;

/// A remote Call/Send arriving for a local actor.
struct RemoteRequest {
  Bytes payload;
  bool is_call = true;
  size_t message_rank = static_cast<size_t>(-1);  // Context::message_rank() of the handler
  UniqueFunction<void(RemoteResult&&)> reply;     // Call
  UniqueFunction<void(const DeliveryFailure&)> bounce_send;  // Send: back to the remote sender
};

/// Decodes arguments and posts the envelope for one endpoint of one actor type.
using RemoteInvoker = UniqueFunction<void(Cell&, RemoteRequest&&)>;
void add_remote_invoker(std::type_index type, std::string endpoint, RemoteInvoker inv);

/// Whom a message's undeliverable report goes to when that is not the actor running on the
/// sending thread: a comm actor relays a caster's broadcast on the caster's behalf (CAST-9), so a
/// member or hop it cannot reach is reported to the caster, in the caster's own Proc.
struct ReportTo {
  std::string proc;  // the address of the Proc the caster sent from (its reply_proc)
  ActorId sender;    // the caster; uid 0: code outside actors (that Proc's fault hook)
};

/// Sends a Call or Send to `dest` (in another Proc) through `proc`'s channel. For a call,
/// `on_reply` runs once with the result, or a DeliveryFailure when it cannot be delivered.
/// `message_rank` travels to the handler's Context::message_rank() (SIZE_MAX: none). A Send's
/// undeliverable report goes to the actor running on this thread (outside actors: `proc`'s fault
/// hook), or to `report_to` when given (ReportTo). Throws what the channel throws for a Send (for
/// a proc declared failed: SupervisionError).
void remote_dispatch(Proc& proc, const ActorId& dest, RemoteKind kind, const char* endpoint,
                     Bytes payload, ReplyHandler on_reply,
                     size_t message_rank = static_cast<size_t>(-1),
                     const ReportTo* report_to = nullptr);

/// Hands `f` to `to.sender`: in `proc` itself (to.proc is proc's name, or proc does not listen),
/// to that actor's undeliverable() or, for uid 0 or an actor that is gone, to proc's fault hook;
/// in another Proc, as a Bounce message that does the same there. A report that cannot be sent is
/// logged. Never throws; any thread.
void return_to_sender(Proc& proc, const ReportTo& to, const DeliveryFailure& f) noexcept;

/// The Proc decoding the current remote message on this thread (resolves ActorRefs in payloads).
Proc* decoding_proc() noexcept;

/// Sets decoding_proc() for its lifetime on this thread (restoring the previous one after): the
/// runtime wraps each remote message's handling in one; a front end that decodes refs and ports
/// itself (the Python bindings' unpickling) opens one around that decode.
struct DecodingScope {
  Proc* prev;
  explicit DecodingScope(Proc* p);
  ~DecodingScope();
  DecodingScope(const DecodingScope&) = delete;
  DecodingScope& operator=(const DecodingScope&) = delete;
};

}  // namespace detail
}  // namespace monarch
