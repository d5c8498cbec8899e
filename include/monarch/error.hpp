// The one error root of monarch-cpp. Every error any layer throws or delivers derives from
// monarch::Error, so `catch (const monarch::Error&)` catches every failure of the framework, and
// each carries:
//   - a stable ErrorCode (never renumbered; the Python layer maps codes to exception classes),
//   - a human message (what() and message(): what failed, where, and what to do),
//   - where known, its Origin: the actor, the rank in its mesh, the address.
// The hierarchy, with the layer that throws each type: docs/errors.md.
//
// Threads: errors are immutable values once built; copy and rethrow them on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace monarch {

/// Stable codes, one per error class. Append only: a code's number never changes meaning, because
/// it crosses the wire (detail::WireError) and Python maps it to an exception class.
enum class ErrorCode : uint16_t {
  Error = 1,           ///< monarch::Error itself, with no more specific class
  Usage = 2,           ///< UsageError: misuse of an API (bad argument, wrong order, used twice)
  Timeout = 3,         ///< TimeoutError: a wait with a deadline expired
  Deadlock = 4,        ///< DeadlockError: a blocking wait that can never complete
  Config = 5,          ///< config::ConfigError: bad setting (key, value, source)
  Slice = 6,           ///< ndslice::SliceError: bad extent, slice, point, region or selection
  SelectionParse = 7,  ///< ndslice::ParseError: selection text that does not parse
  Frame = 8,           ///< wire::FrameError: a malformed or oversize frame
  Decode = 9,          ///< wire::DecodeError: a payload that does not decode as its type
  Channel = 10,        ///< channel::ChannelError: bad address, bind/listen failure, bad secret
  Actor = 11,          ///< ActorError: a request/reply handler threw
  Delivery = 12,       ///< DeliveryFailure: a message could not be delivered
  Supervision = 13,    ///< SupervisionError: the actor's proc was declared failed
  Rdma = 14,           ///< rdma::RdmaError: a data-plane transfer or registration failed
  Quorum = 15,         ///< ft::QuorumError: the lighthouse gave up on a quorum request
  Allreduce = 16,      ///< ft::AllreduceError: a collective failed or timed out
  Slurm = 17,          ///< launch::SlurmError: sbatch/squeue/scancel failed, or the job ended
  Hostlist = 18,       ///< launch::HostlistError: a SLURM hostlist that does not parse
  Kubernetes = 19,     ///< launch::KubernetesError: kubectl failed, or the job's pods did
};

/// "usage", "timeout", "slice", ... (lower case, stable; "unknown" for a value outside the enum).
std::string_view error_code_name(ErrorCode code) noexcept;

/// Where an error comes from, as far as the thrower knows it. Empty fields are unknown.
struct Origin {
  std::string actor{};                ///< ActorId text, "world[0].counter[3]"
  std::optional<std::size_t> rank{};  ///< rank in the mesh the failing member belongs to
  std::string address{};              ///< channel address of the proc, host or peer at fault

  bool empty() const { return actor.empty() && !rank && address.empty(); }
  /// "actor A, rank R, address X" with the known fields only; "" when empty().
  std::string to_string() const;
};

/// Base of every error the framework throws or delivers. what() == message().
class Error : public std::runtime_error {
 public:
  /// A generic error (code Error). Prefer a specific subclass.
  explicit Error(const std::string& message) : Error(ErrorCode::Error, message) {}
  Error(ErrorCode code, const std::string& message, Origin origin = {})
      : std::runtime_error(message), code_(code), origin_(std::move(origin)) {}

  ErrorCode code() const noexcept { return code_; }
  std::string message() const { return what(); }
  const Origin& origin() const noexcept { return origin_; }

 private:
  ErrorCode code_;
  Origin origin_;
};

/// Misuse of an API: an argument out of range, a Future read twice, a OncePort used twice, a
/// call in the wrong state. The message names the function and the offending value.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message, Origin origin = {})
      : Error(ErrorCode::Usage, message, std::move(origin)) {}

 protected:
  /// For kinds of misuse with a code of their own (config::ConfigError: a bad setting).
  UsageError(ErrorCode code, const std::string& message, Origin origin = {})
      : Error(code, message, std::move(origin)) {}
};

}  // namespace monarch
