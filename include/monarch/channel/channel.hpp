// Channels: ordered, acknowledged, reconnecting message links between processes.
//
//   monarch::channel::IoRuntime io;                                   // one event-loop thread
//   auto rx = Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), opts,
//                             [](Message&& m) { /* io thread, in per-sender order */ });
//   auto tx = Sender::connect(io, rx->bound_addr(), opts,
//                             [](Message&& m, const std::string& why) { /* returned */ });
//   tx->send(Message{{bytes}});                                        // any thread
//
// Guarantees (numbered; tests cite them):
//  CH-1 Messages on one Sender are delivered to the Listener's handler in send order, each at
//       most once, across any number of reconnects.
//  CH-2 A message is kept by the Sender until acknowledged. After a broken connection it reconnects
//       (backoff from reconnect_initial doubling to reconnect_max) and resends what the Listener
//       has not yet delivered; the Listener drops duplicates by sequence number. A Listener that
//       is destroyed first acknowledges what it delivered (one non-blocking write per connection),
//       so the senders of a peer that exits cleanly are left holding nothing.
//  CH-3 If the Listener's process restarted (new incarnation), messages that were sent but not
//       acknowledged may have reached the dead process, so they are returned to the sender as
//       failures ("peer restarted"), never delivered twice; later messages go to the new process
//       as a new session.
//  CH-4 A message not acknowledged within delivery_timeout of being sent closes the link: it and
//       every queued or unacknowledged message are returned through the failure handler, and
//       later sends fail at once. Nothing is lost silently.
//  CH-5 TCP listeners require the job's shared secret (HMAC-SHA256 challenge at connect). A peer
//       that fails the challenge is refused with a logged reason; other peers are unaffected.
//  CH-6 Malformed, truncated or oversize frames close only the connection that sent them (logged).
//  CH-7 A peer that cannot be reached (connection lost or refused, reconnects failing) for
//       delivery_timeout closes the link even when nothing is pending, so owners of requests
//       awaiting replies from it learn of it (Sender::on_close); the reason names the last error.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "monarch/channel/address.hpp"
#include "monarch/config/config.hpp"

namespace monarch::channel {

using Bytes = std::vector<std::byte>;

/// A part the sender does not own a copy of: `bytes` stays valid while `keep` lives. The channel
/// holds `keep` until the receiver acknowledges the message (or the message is returned as
/// undeliverable), so the owner of the memory learns when the channel is done with it from
/// `keep`'s destructor. From a shared buffer: `SharedPart(std::make_shared<const Bytes>(...))`.
struct SharedPart {
  std::shared_ptr<const void> keep;
  std::span<const std::byte> bytes;
  SharedPart(std::shared_ptr<const Bytes>
                 b)  // NOLINT(google-explicit-constructor): a shared buffer is a part
      : keep(b), bytes(b ? std::span<const std::byte>(*b) : std::span<const std::byte>()) {}
  /// Memory kept valid by `keep_alive` (e.g. a lease on a registered buffer).
  SharedPart(std::shared_ptr<const void> keep_alive, std::span<const std::byte> memory)
      : keep(std::move(keep_alive)), bytes(memory) {}
};

/// One message: byte parts, delivered as `parts` in the order [parts..., shared_parts...].
/// `shared_parts` are buffers the sender keeps sharing (e.g. one payload sent to many peers, a
/// large tensor, or registered memory): they are written straight from their memory, never
/// copied in user space, and kept alive until the receiver acknowledges them. Large owned parts
/// are not copied either. Total size (all parts) is limited by ChannelOptions::max_frame_bytes.
struct Message {
  std::vector<Bytes> parts;
  std::vector<SharedPart> shared_parts{};
  size_t size_bytes() const {
    size_t n = 0;
    for (const auto& p : parts) n += p.size();
    for (const auto& p : shared_parts) n += p.bytes.size();
    return n;
  }
  /// Calls f(std::span<const std::byte>) for every part, in delivery order.
  template <class F>
  void for_each_part(F&& f) const {
    for (const auto& p : parts) f(std::span<const std::byte>(p));
    for (const auto& p : shared_parts) f(p.bytes);
  }
};

/// Defaults come from the config layer (monarch/config/config.hpp, docs/config.md: file, then
/// MONARCH_CHANNEL_* variables), read when the options object is constructed; setting a field in
/// code is the runtime override. Construction throws config::ConfigError on a bad config layer.
struct ChannelOptions {
  /// Largest message accepted, in bytes (sum of parts). Larger sends throw ChannelError at the
  /// sender; larger incoming frames close the offending connection.
  size_t max_frame_bytes = config::global().bytes("channel.max_frame_bytes");
  /// The Listener acknowledges after this many messages, or after ack_interval, whichever first.
  uint32_t ack_every = static_cast<uint32_t>(config::global().integer("channel.ack_every"));
  std::chrono::milliseconds ack_interval = config::global().duration("channel.ack_interval");
  /// See CH-4. Default 30 s.
  std::chrono::milliseconds delivery_timeout =
      config::global().duration("channel.delivery_timeout");
  /// Reconnect backoff: starts here, doubles up to reconnect_max.
  std::chrono::milliseconds reconnect_initial =
      config::global().duration("channel.reconnect_initial");
  std::chrono::milliseconds reconnect_max = config::global().duration("channel.reconnect_max");
  /// Handshake (hello/auth/accept) must finish within this, else the connection is dropped.
  std::chrono::milliseconds handshake_timeout =
      config::global().duration("channel.handshake_timeout");
  /// SO_SNDBUF and SO_RCVBUF of unix-socket connections, bytes (0: the system default). The
  /// kernel caps it at net.core.wmem_max / rmem_max. TCP connections keep autotuning.
  size_t unix_socket_buffer = config::global().bytes("channel.unix_socket_buffer");
  /// For a link to a peer known to have exited (Proc::forget_proc): a connection refused (or, for
  /// a unix path, a socket file missing) before the link's first connection closes the link at
  /// once, returning what was sent through the failure handler (CH-4), instead of retrying until
  /// delivery_timeout. A peer listening at the address again is reached as usual.
  bool close_if_refused = false;
  /// Shared secret for TCP (CH-5). Empty: taken from $MONARCH_SECRET, else from the file named by
  /// $MONARCH_SECRET_FILE. A TCP Listener without any secret refuses to start.
  std::string secret{};
};

/// The job's shared secret as channels use it: `o.secret`, else $MONARCH_SECRET, else the contents
/// of the file named by $MONARCH_SECRET_FILE (read_secret_file); empty when none is set. Throws
/// ChannelError naming the file when it cannot be used. Any thread.
std::string job_secret(const ChannelOptions& o);
/// The contents of the secret file `path` without trailing newlines. `label` says where the path
/// came from ("MONARCH_SECRET_FILE", "--secret-file") in errors. Throws ChannelError naming the
/// file when it cannot be read, is a directory, or holds nothing. Any thread.
std::string read_secret_file(const std::string& path, const std::string& label);

/// Points spdlog's default logger, which the runtime logs through, at stderr instead of spdlog's
/// built-in stdout sink, so that runtime warnings do not mix with a program's output (or with a
/// worker's forwarded stdout). Only when the default logger is still spdlog's own (unnamed, one
/// stdout colour sink); its level is kept. Once per process; IoRuntime and the actor scheduler
/// call it before starting their threads. A program that sets its own default logger keeps it.
void log_to_stderr_by_default();

/// The event loop that runs channel I/O: one thread, owned by this object.
class IoRuntime {
 public:
  IoRuntime();
  ~IoRuntime();
  IoRuntime(const IoRuntime&) = delete;
  IoRuntime& operator=(const IoRuntime&) = delete;
  /// Internal: the asio::io_context (opaque here to keep asio out of this header).
  void* context();
  /// A process-wide runtime, created on first use.
  static IoRuntime& shared();
  /// True on the thread of any IoRuntime (where channel handlers run). Any thread.
  static bool on_io_thread() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Receives messages on an address. Handler calls run on the IoRuntime thread, one at a time, in
/// send order per Sender (CH-1). Destroying the Listener closes its connections.
class Listener {
 public:
  using Handler = std::function<void(Message&&)>;

  /// Binds and listens. Returns once bound: bound_addr() has the real port for tcp port 0.
  /// Throws ChannelError when the address cannot be bound (names it and the OS error) or when a
  /// TCP listener has no secret.
  static std::unique_ptr<Listener> serve(IoRuntime& io, const ChannelAddr& addr,
                                         ChannelOptions options, Handler handler);
  virtual ~Listener() = default;
  /// The address peers dial (DIAL part of DIAL@BIND, real port for port 0).
  virtual ChannelAddr bound_addr() const = 0;
  /// Number of connections refused or dropped for protocol errors or a bad secret (CH-5/6).
  virtual size_t rejected_connections() const = 0;
};

/// Sends messages to one address. Thread-safe. Connects lazily and reconnects (CH-2).
class Sender {
 public:
  /// Called (on the IoRuntime thread) with each message that could not be delivered (CH-3, CH-4).
  using FailureHandler = std::function<void(Message&&, const std::string& reason)>;

  static std::shared_ptr<Sender> connect(IoRuntime& io, const ChannelAddr& addr,
                                         ChannelOptions options, FailureHandler on_failure);
  virtual ~Sender() = default;
  /// Sends `m` (any thread, never blocks on the network). On an idle connected link the calling
  /// thread writes the frame itself with one non-blocking write (no hand-off to the IoRuntime
  /// thread); otherwise, or for what that write could not take, the IoRuntime thread writes it.
  /// Both paths keep CH-1. Throws ChannelError if m exceeds max_frame_bytes (the link is
  /// unaffected). After the link closed (CH-4), `m` goes to the failure handler instead.
  virtual void send(Message m) = 0;
  /// Messages sent but not yet acknowledged, plus those queued.
  virtual size_t pending() const = 0;
  virtual bool closed() const = 0;
  virtual const ChannelAddr& addr() const = 0;
  /// Why the last connection attempt (or the last connection) to addr() failed, e.g.
  /// "Connection refused"; empty while connected and before any failure. For error reports:
  /// a peer that is down is retried quietly (CH-7). Any thread.
  virtual std::string last_connection_error() const = 0;
  /// Closes the link; pending messages go to the failure handler with `reason`.
  virtual void close(const std::string& reason) = 0;
  /// As close(), for a peer that is gone by design (it exited when asked to stop) or whose failure
  /// was already reported (a proc declared failed): the number of undelivered messages is logged
  /// at debug level instead of as a warning.
  virtual void close_quietly(const std::string& reason) = 0;
  /// Registers `f(reason)`, called once (on the IoRuntime thread) when the link closes: by
  /// close(), a delivery timeout (CH-4), a refusal, or the peer being unreachable for
  /// delivery_timeout after a connection was lost (CH-7). Called at once if already closed.
  virtual void on_close(std::function<void(const std::string&)> f) = 0;
};

/// This process's incarnation: random, fixed for the life of the process.
uint64_t process_incarnation();

}  // namespace monarch::channel
