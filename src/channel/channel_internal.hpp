// Internal: what the channel's transports share. The socket listener (listener.cpp) and sender
// (sender.cpp) are the two ends of one session protocol over asio (C++20 coroutines): handshake
// with HMAC challenge, sequence numbers, acknowledgements, reconnect with backoff, resend and
// duplicate drop. See channel.hpp (CH-n). The in-process transport is inproc.cpp. channel.cpp
// defines what is declared here, the process incarnation and IoRuntime.
//
// Wire protocol, per connection (frames from monarch/wire/frame.hpp):
//   listener -> sender  Hello   {incarnation = listener's process}       parts: [16-byte nonce]
//   sender -> listener  Auth    {session_id, incarnation = sender's}      parts: [HMAC or empty]
//   listener -> sender  Accept  {incarnation, seq = last delivered seq of this session}
//                    or Reject  parts: [reason]
//   sender -> listener  Data    {session_id, seq}                          parts: the message
//   listener -> sender  Ack     {seq = highest delivered}
#pragma once

#include <asio.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "monarch/channel/channel.hpp"
#include "monarch/wire/frame.hpp"

namespace monarch::channel::detail {

using asio::awaitable;
using asio::use_awaitable;
using Socket = asio::generic::stream_protocol::socket;
using Acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;
using Endpoint = asio::generic::stream_protocol::endpoint;
using Clock = std::chrono::steady_clock;
using wire::FrameHeader;
using wire::FrameKind;

/// Never 0.
uint64_t random64();
/// The handshake's proof: HMAC-SHA256 over nonce, session and incarnation.
Bytes compute_hmac(const std::string& secret, const Bytes& nonce, uint64_t session,
                   uint64_t incarnation);
Endpoint to_endpoint(asio::io_context& ctx, const ChannelAddr& a);
wire::DecoderLimits limits_of(const ChannelOptions& o);
FrameHeader header(FrameKind kind, uint64_t session, uint64_t incarnation, uint64_t seq);
/// async_write's completion condition for one sendmsg of everything left.
std::size_t whole_writes(const asio::error_code& ec, std::size_t);
/// ChannelOptions::unix_socket_buffer on a unix-socket connection (both directions).
void size_unix_buffers(Socket& s, Transport t, const ChannelOptions& o);
awaitable<void> write_frame(Socket& s, const FrameHeader& h, const std::vector<Bytes>& parts);
/// Writes a frame without parts now, with one non-blocking write (io thread; nothing else may be
/// writing to `s`). True if the socket took it whole. For a frame sent on the way out (a
/// Listener's last Ack before it closes the connection); a partial write leaves a truncated frame,
/// which the peer treats as a broken connection.
bool write_frame_now(Socket& s, const FrameHeader& h);
/// Reads until the decoder yields one frame.
awaitable<wire::Frame> read_frame(Socket& s, wire::FrameDecoder& dec, std::vector<std::byte>& buf);

// Closes the socket unless cancelled first (bounds a handshake).
struct Watchdog {
  asio::steady_timer timer;
  Watchdog(asio::io_context& ctx, Socket& s, std::chrono::milliseconds after) : timer(ctx, after) {
    timer.async_wait([&s](const asio::error_code& ec) {
      if (!ec) {
        asio::error_code ignored;
        s.close(ignored);
      }
    });
  }
  ~Watchdog() { timer.cancel(); }
};

inline asio::io_context& ctx_of(IoRuntime& io) {
  return *static_cast<asio::io_context*>(io.context());
}

// Runs fn on the io thread and waits for it (or runs inline when already on it).
template <class F>
void run_on_io(asio::io_context& ctx, F fn) {
  if (ctx.get_executor().running_in_this_thread()) return fn();
  std::promise<void> done;
  asio::post(ctx, [&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

/// The in-process transport (inproc.cpp): what Listener::serve and Sender::connect return for
/// inproc:// addresses.
std::unique_ptr<Listener> serve_inproc(const ChannelAddr& addr, Listener::Handler handler);
std::shared_ptr<Sender> connect_inproc(asio::io_context& ctx, const ChannelAddr& target,
                                       ChannelOptions options, Sender::FailureHandler on_failure);

}  // namespace monarch::channel::detail
