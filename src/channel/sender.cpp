// The sending end of a socket channel: connects, handshakes, numbers and writes messages, keeps
// them until acknowledged, reconnects with backoff and resends, and returns what it could not
// deliver (CH-4, CH-7). Wire protocol: channel_internal.hpp. The other end: listener.cpp.
//
// Connection state lives on the IoRuntime thread. Sender::send runs on any thread: it queues under
// SenderCore::mu, or, on an idle connected link, writes the frame itself (the direct path, see
// SenderCore::write_direct); everything the two paths share (queue, unacked, sequence numbers,
// the partially written tail, the socket's fd) is guarded by SenderCore::mu.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>

#include "channel_internal.hpp"
#include "path_stats.hpp"

namespace monarch::channel {

using namespace detail;

namespace {

std::string bytes_text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

detail::SendPathStats& detail::send_path_stats() {
  static SendPathStats stats;
  return stats;
}

namespace {

struct Pending {
  uint64_t seq = 0;  // assigned when first written (so a new session can renumber from 1)
  Message msg;
  Clock::time_point sent_at;
};

struct SenderCore : std::enable_shared_from_this<SenderCore> {
  SenderCore(asio::io_context& c, ChannelAddr a, ChannelOptions o, Sender::FailureHandler f)
      : ctx(c), addr(std::move(a)), opt(std::move(o)), on_failure(std::move(f)), wake(c), tick(c) {}

  asio::io_context& ctx;
  ChannelAddr addr;
  ChannelOptions opt;
  Sender::FailureHandler on_failure;
  std::string secret;
  uint64_t session = random64();

  // Shared with sending threads, guarded by mu.
  mutable std::mutex mu;
  std::deque<Pending> queue;
  bool wake_posted = false;
  std::atomic<bool> closed{false};
  std::atomic<size_t> pending_count{0};
  std::string close_reason;
  std::function<void(const std::string&)> close_handler;
  std::deque<Pending> unacked;  // in seq order; written by the direct path, popped by acks
  uint64_t next_seq = 1;
  uint64_t written_upto = 0;  // highest seq handed to the current connection (written or in tail)
  // Direct path (write_direct): allowed while direct_fd >= 0 (connected, handshake done) and the
  // writer coroutine is idle (!writer_busy), which also means every message in unacked is written
  // and queue is empty. The writer clears writer_busy only when it has nothing left to write; a
  // (re)connect sets it, so resends always go out before anything new.
  int direct_fd = -1;
  bool writer_busy = true;
  Bytes tail;                     // unwritten end of a frame the direct path began writing
  Clock::time_point last_send{};  // of the previous send() (direct path pacing)
  Bytes direct_prefix;            // reused encode buffer for the direct path
  std::vector<std::span<const std::byte>> direct_spans;

  // IoRuntime thread only.
  uint64_t peer_incarnation = 0;
  std::shared_ptr<Socket> sock;
  bool connected = false;
  bool ever_connected = false;     // once true, ChannelOptions::close_if_refused no longer applies
  Clock::time_point down_since{};  // when the peer became unreachable (CH-7); epoch = reachable
  std::string last_error;          // of the last failed connection, for reports (err_mu)
  mutable std::mutex err_mu;       // last_error: written here, read by last_connection_error()
  asio::steady_timer wake;
  asio::steady_timer tick;

  void set_last_error(std::string e) {
    std::lock_guard lock(err_mu);
    last_error = std::move(e);
  }
  std::string last_connection_error() const {
    std::lock_guard lock(err_mu);
    return last_error;
  }

  // Marks the current connection unusable for the direct path; call before closing its socket.
  void stop_direct() {
    std::lock_guard lock(mu);
    direct_fd = -1;
    writer_busy = true;
    tail.clear();
  }

  void send(Message m) {
    if (m.size_bytes() > opt.max_frame_bytes) {
      throw ChannelError("message of " + std::to_string(m.size_bytes()) +
                         " bytes exceeds max_frame_bytes " + std::to_string(opt.max_frame_bytes) +
                         " (to " + addr.to_string() + "); the link is unaffected");
    }
    bool post = false;
    bool accepted = false;
    {
      std::lock_guard lock(mu);
      if (!closed) {
        auto now = Clock::now();
        bool paced = now - last_send >= kDirectIdle;
        last_send = now;
        accepted = true;
        pending_count.fetch_add(1, std::memory_order_relaxed);
        if (paced && direct_fd >= 0 && !writer_busy && queue.empty() && direct_fits(m)) {
          bool rest = write_direct(std::move(m), now);
          last_send = Clock::now();  // pacing counts the caller's gap, not the write's own time
          auto& st = detail::send_path_stats();
          (rest ? st.direct_deferred : st.direct_whole).fetch_add(1, std::memory_order_relaxed);
          if (!rest) return;  // written whole: nothing for the writer
        } else {
          queue.push_back(Pending{0, std::move(m), now});
          detail::send_path_stats().queued.fetch_add(1, std::memory_order_relaxed);
        }
        post = !wake_posted;
        wake_posted = true;
      }
    }
    auto self = shared_from_this();
    if (!accepted) {
      asio::post(ctx,
                 [self, m = std::move(m)]() mutable { self->fail(std::move(m), self->reason()); });
      return;
    }
    if (post) asio::post(ctx, [self] { self->wake.cancel(); });
  }

  // Direct path: only small messages (their unwritten end is copied into tail), only when the
  // previous send() was at least kDirectIdle ago. Back-to-back sends (streaming) are queued
  // instead, so the writer batches them into few large writes.
  static constexpr size_t kDirectMaxBytes = 64 * 1024;
  static constexpr size_t kDirectMaxParts = 64;
  static constexpr auto kDirectIdle = std::chrono::microseconds(5);

  bool direct_fits(const Message& m) const {
    return m.parts.size() + m.shared_parts.size() <= kDirectMaxParts &&
           m.size_bytes() <= kDirectMaxBytes;
  }

  // Caller holds mu, and direct_fd >= 0 && !writer_busy && queue.empty() (so unacked is all
  // written and this frame is next on the wire). Numbers m, writes it with one non-blocking
  // sendmsg and keeps it in unacked. Returns true when the writer must finish the job: the write
  // was partial or would block (the rest is in tail, writer_busy is set), or failed (the writer's
  // own write then fails too and the connection is replaced; m is resent from unacked).
  bool write_direct(Message&& m, Clock::time_point now) {
    uint64_t seq = next_seq++;
    direct_spans.clear();
    m.for_each_part([&](std::span<const std::byte> part) { direct_spans.push_back(part); });
    direct_prefix.clear();
    wire::encode_prefix(header(FrameKind::Data, session, process_incarnation(), seq), direct_spans,
                        direct_prefix);
    iovec iov[kDirectMaxParts + 1];
    size_t n_iov = 0;
    iov[n_iov++] = {direct_prefix.data(), direct_prefix.size()};
    size_t total = direct_prefix.size();
    for (const auto& sp : direct_spans) {
      if (sp.empty()) continue;
      iov[n_iov++] = {const_cast<std::byte*>(sp.data()), sp.size()};
      total += sp.size();
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = n_iov;
    ssize_t r;
    do {
      r = ::sendmsg(direct_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (r < 0 && errno == EINTR);
    size_t done = r > 0 ? static_cast<size_t>(r) : 0;
    written_upto = seq;
    if (done < total) {
      // Keep the unwritten end for the writer; nothing else may be written before it.
      size_t skip = done;
      for (size_t i = 0; i < n_iov; ++i) {
        auto* b = static_cast<const std::byte*>(iov[i].iov_base);
        size_t len = iov[i].iov_len;
        if (skip >= len) {
          skip -= len;
          continue;
        }
        tail.insert(tail.end(), b + skip, b + len);
        skip = 0;
      }
      writer_busy = true;
    }
    unacked.push_back(Pending{seq, std::move(m), now});
    return done < total;
  }

  std::string reason() {
    std::lock_guard lock(mu);
    return close_reason;
  }

  void fail(Message&& m, const std::string& why) {
    if (on_failure) on_failure(std::move(m), why);
  }

  // CH-4 / close(): returns every unacknowledged and queued message, in order.
  // `quiet`: the peer is gone by design (close_quietly); what was undelivered is not news.
  void close_link(const std::string& why, bool quiet = false) {
    std::deque<Pending> q, all;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      closed = true;
      close_reason = why;
      q.swap(queue);
      all.swap(unacked);
      direct_fd = -1;
      writer_busy = true;
      tail.clear();
    }
    for (auto& p : q) all.push_back(std::move(p));
    if (!all.empty()) {
      spdlog::log(quiet ? spdlog::level::debug : spdlog::level::warn,
                  "channel to {}: link closed with {} message(s) undelivered: {}", addr.to_string(),
                  all.size(), why);
    }
    pending_count.store(0);
    if (sock) {
      asio::error_code ignored;
      sock->close(ignored);
    }
    wake.cancel();
    tick.cancel();
    for (auto& p : all) fail(std::move(p.msg), why);
    std::function<void(const std::string&)> h;
    {
      std::lock_guard lock(mu);
      h = std::move(close_handler);
      close_handler = nullptr;
    }
    if (h) h(why);
  }

  awaitable<void> watchdog() {
    auto self = shared_from_this();
    auto period = std::clamp<std::chrono::milliseconds>(
        opt.delivery_timeout / 4, std::chrono::milliseconds(1), std::chrono::milliseconds(250));
    while (!closed) {
      tick.expires_after(period);
      asio::error_code ec;
      co_await tick.async_wait(asio::redirect_error(use_awaitable, ec));
      if (closed) break;
      auto oldest = Clock::time_point::max();
      {
        std::lock_guard lock(mu);
        if (!unacked.empty()) oldest = unacked.front().sent_at;
        if (!queue.empty()) oldest = std::min(oldest, queue.front().sent_at);
      }
      const std::string why = last_connection_error();
      std::string detail = why.empty() ? "" : " (last connection error: " + why + ")";
      if (oldest != Clock::time_point::max() && Clock::now() - oldest > opt.delivery_timeout) {
        close_link("delivery timeout: no acknowledgement from " + addr.to_string() + " within " +
                   std::to_string(opt.delivery_timeout.count()) + " ms" + detail);
      } else if (!connected && down_since != Clock::time_point{} &&
                 Clock::now() - down_since > opt.delivery_timeout) {
        close_link("peer " + addr.to_string() + " unreachable for " +
                   std::to_string(opt.delivery_timeout.count()) + " ms" + detail);
      }
    }
  }

  awaitable<void> run() {
    auto self = shared_from_this();
    auto backoff = opt.reconnect_initial;
    while (!closed) {
      bool was_connected = false;
      try {
        co_await connect_and_handshake();
        was_connected = true;
        ever_connected = true;
        down_since = Clock::time_point{};
        set_last_error({});
        backoff = opt.reconnect_initial;
        asio::co_spawn(ctx, reader(), asio::detached);
        co_await writer();
      } catch (const wire::FrameError& e) {
        spdlog::warn("channel to {}: protocol error: {}", addr.to_string(), e.what());
        set_last_error(e.what());
      } catch (const ChannelError& e) {
        close_link(e.what());
      } catch (const std::system_error& e) {
        spdlog::debug("channel to {}: connection lost: {}", addr.to_string(), e.what());
        set_last_error(e.code().message());
        if (opt.close_if_refused && !ever_connected &&
            (e.code() == asio::error::connection_refused ||
             e.code() == asio::error_code(ENOENT, asio::error::get_system_category()))) {
          // Quietly: the owner said the peer exited; each message goes back to its handler.
          close_link("peer " + addr.to_string() + " has exited (" + e.code().message() + ")",
                     /*quiet=*/true);
        }
      }
      connected = false;
      stop_direct();
      if (down_since == Clock::time_point{}) down_since = Clock::now();
      if (sock) {
        asio::error_code ignored;
        sock->close(ignored);
      }
      if (closed) break;
      if (!was_connected) {
        asio::steady_timer t(ctx, backoff);
        asio::error_code ec;
        co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
        backoff = std::min(backoff * 2, opt.reconnect_max);
      }
    }
  }

  awaitable<void> connect_and_handshake() {
    sock = std::make_shared<Socket>(ctx);
    Endpoint ep = to_endpoint(ctx, addr);
    co_await sock->async_connect(ep, use_awaitable);
    if (addr.transport == Transport::Tcp) sock->set_option(asio::ip::tcp::no_delay(true));
    size_unix_buffers(*sock, addr.transport, opt);
    wire::FrameDecoder dec(limits_of(opt));
    std::vector<std::byte> buf(4096);
    Watchdog wd(ctx, *sock, opt.handshake_timeout);
    wire::Frame hello = co_await read_frame(*sock, dec, buf);
    if (hello.header.kind != FrameKind::Hello || hello.parts.size() != 1) {
      throw wire::FrameError("handshake: expected Hello from " + addr.to_string());
    }
    Bytes proof;
    if (addr.transport == Transport::Tcp) {
      proof = compute_hmac(secret, hello.parts[0], session, process_incarnation());
    }
    std::vector<Bytes> auth_parts{proof};
    co_await write_frame(*sock, header(FrameKind::Auth, session, process_incarnation(), 0),
                         auth_parts);
    wire::Frame reply = co_await read_frame(*sock, dec, buf);
    if (reply.header.kind == FrameKind::Reject) {
      std::string why = reply.parts.empty() ? "" : bytes_text(reply.parts[0]);
      throw ChannelError("refused by " + addr.to_string() + ": " + why);
    }
    if (reply.header.kind != FrameKind::Accept) {
      throw wire::FrameError(std::string("handshake: expected Accept, got ") +
                             wire::to_string(reply.header.kind));
    }
    on_accept(reply.header.incarnation, reply.header.seq);
    connected = true;
    std::lock_guard lock(mu);
    direct_fd = sock->native_handle();
    writer_busy = true;  // until the writer has resent what the new session lacks
    tail.clear();
  }

  void on_accept(uint64_t incarnation, uint64_t last_delivered) {
    std::unique_lock lock(mu);
    if (peer_incarnation != 0 && incarnation != peer_incarnation) {
      // CH-3: the listener's process restarted; unacknowledged messages may have reached the
      // old one. Return them rather than risk a second delivery, and start numbering afresh.
      std::deque<Pending> lost;
      lost.swap(unacked);
      next_seq = 1;
      written_upto = last_delivered;
      peer_incarnation = incarnation;
      lock.unlock();
      pending_count.fetch_sub(lost.size());
      for (auto& p : lost) {
        fail(std::move(p.msg), "peer " + addr.to_string() +
                                   " restarted (new incarnation) before acknowledging; "
                                   "delivery unknown");
      }
      return;
    }
    while (!unacked.empty() && unacked.front().seq <= last_delivered) {
      unacked.pop_front();  // delivered before the connection broke
      pending_count.fetch_sub(1);
    }
    peer_incarnation = incarnation;
    written_upto = last_delivered;
    if (!unacked.empty()) written_upto = unacked.front().seq - 1;
  }

  awaitable<void> reader() {
    auto self = shared_from_this();
    std::shared_ptr<Socket> s = sock;  // keeps this connection's socket alive past a reconnect
    wire::FrameDecoder dec(limits_of(opt));
    std::vector<std::byte> buf(4096);
    std::vector<Message> acked;
    try {
      while (true) {
        wire::Frame f = co_await read_frame(*s, dec, buf);
        if (f.header.kind != FrameKind::Ack) continue;
        {
          // Acknowledged messages are freed after the lock is released (senders wait on it).
          std::lock_guard lock(mu);
          while (!unacked.empty() && unacked.front().seq <= f.header.seq) {
            acked.push_back(std::move(unacked.front().msg));
            unacked.pop_front();
          }
        }
        // Free first: pending() == 0 then means the channel holds no part of them (shared
        // parts' keep-alives, e.g. leases on borrowed memory, are released).
        size_t n = acked.size();
        acked.clear();
        pending_count.fetch_sub(n);
      }
    } catch (const std::exception& e) {
      spdlog::debug("channel to {}: reader ended: {}", addr.to_string(), e.what());
    }
    if (s == sock) {
      connected = false;
      stop_direct();
      asio::error_code ignored;
      s->close(ignored);
      wake.cancel();
    }
  }

  awaitable<void> writer() {
    // One gathering write per batch. Headers, part tables and small parts are copied into one
    // reused buffer (no allocation per message); parts of kDirectPart bytes or more are written
    // straight from the message (never copied).
    constexpr size_t kDirectPart = 16 * 1024;
    constexpr size_t kMaxBatchBytes = 8u << 20;
    struct Segment {
      const std::byte* ext;  // nullptr: [off, off+len) of `batch`
      size_t off;
      size_t len;
    };
    std::vector<std::byte> batch;
    std::vector<Segment> segs;
    std::vector<std::span<const std::byte>> spans;
    std::vector<asio::const_buffer> bufs;
    uint64_t upto = 0;
    bool wrote = false;
    bool idle = false;
    while (connected && !closed) {
      batch.clear();
      segs.clear();
      {
        // Every message in unacked is numbered; while writer_busy is set the direct path stays
        // out, so unacked, next_seq and written_upto are this thread's until it is cleared.
        std::lock_guard lock(mu);
        if (wrote) written_upto = upto;
        wrote = false;
        wake_posted = false;
        while (!queue.empty()) {
          queue.front().seq = next_seq++;
          unacked.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        if (!tail.empty()) {
          batch.swap(tail);  // the end of a frame the direct path began: it goes first
          segs.push_back({nullptr, 0, batch.size()});
        }
        bool more = !unacked.empty() && unacked.back().seq > written_upto;
        writer_busy = more || !segs.empty();
        upto = written_upto;
        idle = !writer_busy;
      }
      if (idle) {  // send() may write directly now; it posts `wake` when it queues
        wake.expires_at(Clock::time_point::max());
        asio::error_code ec;
        co_await wake.async_wait(asio::redirect_error(use_awaitable, ec));
        continue;
      }
      size_t bytes = 0;
      auto small = [&](size_t from) {
        if (batch.size() > from) segs.push_back({nullptr, from, batch.size() - from});
      };
      for (auto& p : unacked) {
        if (p.seq <= upto) continue;
        if (bytes > kMaxBatchBytes || segs.size() > 900) break;
        spans.clear();
        p.msg.for_each_part([&](std::span<const std::byte> part) { spans.push_back(part); });
        size_t from = batch.size();
        wire::encode_prefix(header(FrameKind::Data, session, process_incarnation(), p.seq), spans,
                            batch);
        p.msg.for_each_part([&](std::span<const std::byte> part) {
          if (part.size() < kDirectPart) {
            batch.insert(batch.end(), part.begin(), part.end());
            return;
          }
          small(from);
          segs.push_back({part.data(), 0, part.size()});
          from = batch.size();
        });
        small(from);
        bytes += p.msg.size_bytes() + wire::kFrameHeaderSize;
        upto = p.seq;
      }
      // Adjacent pieces of `batch` are merged so small messages go out as one iovec.
      bufs.clear();
      for (size_t i = 0; i < segs.size(); ++i) {
        if (segs[i].ext != nullptr) {
          bufs.emplace_back(segs[i].ext, segs[i].len);
          continue;
        }
        size_t off = segs[i].off, len = segs[i].len;
        while (i + 1 < segs.size() && segs[i + 1].ext == nullptr && segs[i + 1].off == off + len) {
          len += segs[++i].len;
        }
        bufs.emplace_back(batch.data() + off, len);
      }
      co_await asio::async_write(*sock, bufs, whole_writes, use_awaitable);
      wrote = true;
    }
    if (!connected) throw std::system_error(std::make_error_code(std::errc::connection_reset));
  }
};

struct SocketSender final : Sender {
  std::shared_ptr<SenderCore> core;
  ~SocketSender() override {
    auto c = core;
    asio::post(c->ctx, [c] { c->close_link("sender destroyed"); });
  }
  void send(Message m) override { core->send(std::move(m)); }
  size_t pending() const override { return core->pending_count.load(); }
  bool closed() const override { return core->closed.load(); }
  std::string last_connection_error() const override { return core->last_connection_error(); }
  const ChannelAddr& addr() const override { return core->addr; }
  void close(const std::string& reason) override {
    auto c = core;
    run_on_io(c->ctx, [c, reason] { c->close_link(reason); });
  }
  void close_quietly(const std::string& reason) override {
    auto c = core;
    run_on_io(c->ctx, [c, reason] { c->close_link(reason, /*quiet=*/true); });
  }
  void on_close(std::function<void(const std::string&)> f) override {
    std::string why;
    {
      std::lock_guard lock(core->mu);
      if (!core->closed) {
        core->close_handler = std::move(f);
        return;
      }
      why = core->close_reason;
    }
    auto c = core;
    asio::post(c->ctx, [f = std::move(f), why] { f(why); });
  }
};

}  // namespace

std::shared_ptr<Sender> Sender::connect(IoRuntime& io, const ChannelAddr& addr,
                                        ChannelOptions options, FailureHandler on_failure) {
  auto& ctx = ctx_of(io);
  ChannelAddr target = addr.dial_addr();
  if (target.transport == Transport::Inproc) {
    return connect_inproc(ctx, target, std::move(options), std::move(on_failure));
  }
  auto core = std::make_shared<SenderCore>(ctx, target, options, std::move(on_failure));
  core->secret = job_secret(options);
  if (target.transport == Transport::Tcp && core->secret.empty()) {
    throw ChannelError("tcp channel to " + target.to_string() +
                       " requires the job's shared secret: set ChannelOptions::secret, "
                       "MONARCH_SECRET or MONARCH_SECRET_FILE");
  }
  asio::post(ctx, [core] {
    asio::co_spawn(core->ctx, core->run(), asio::detached);
    asio::co_spawn(core->ctx, core->watchdog(), asio::detached);
  });
  auto s = std::make_shared<SocketSender>();
  s->core = std::move(core);
  return s;
}

}  // namespace monarch::channel
