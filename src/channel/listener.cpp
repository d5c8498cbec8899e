// The listening end of a socket channel: accepts connections, runs the handshake (Hello, Auth
// with the HMAC proof on TCP, Accept or Reject), delivers each session's Data frames once and in
// order (duplicates after a resend are dropped: CH-2) and acknowledges them. Wire protocol:
// channel_internal.hpp. The other end: sender.cpp.
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "channel_internal.hpp"

namespace monarch::channel {

using namespace detail;

namespace {

Bytes random_bytes(size_t n) {
  Bytes b(n);
  RAND_bytes(reinterpret_cast<unsigned char*>(b.data()), static_cast<int>(n));
  return b;
}

Bytes text_bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return Bytes(p, p + s.size());
}

std::string peer_name(Socket& s) {
  asio::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "peer";
  if (ep.protocol().family() == AF_INET || ep.protocol().family() == AF_INET6) {
    asio::ip::tcp::endpoint t;
    std::memcpy(t.data(), ep.data(), std::min<size_t>(ep.size(), t.capacity()));
    t.resize(ep.size());
    std::ostringstream os;
    os << t;
    return os.str();
  }
  return "unix peer";
}

struct SessionState {
  uint64_t sender_incarnation = 0;
  uint64_t last_delivered = 0;
};

struct ListenerCore;

struct Conn {
  explicit Conn(asio::io_context& ctx) : sock(ctx), ack_timer(ctx, Clock::time_point::max()) {}
  Socket sock;
  asio::steady_timer ack_timer;
  bool open = true;
  bool ack_armed = false;
  bool writing_ack = false;  // ack_writer is in write_frame: nothing else may write
  uint32_t since_ack = 0;
  uint64_t last_acked = 0;
  uint64_t session = 0;
  SessionState* state = nullptr;  // sessions_[session]; node addresses are stable
};

struct ListenerCore : std::enable_shared_from_this<ListenerCore> {
  ListenerCore(asio::io_context& c, ChannelOptions o) : ctx(c), opt(std::move(o)), acceptor(c) {}
  asio::io_context& ctx;
  ChannelOptions opt;
  std::string secret;
  Listener::Handler handler;
  ChannelAddr bound;
  Acceptor acceptor;
  std::unordered_map<uint64_t, SessionState> sessions;
  std::unordered_set<std::shared_ptr<Conn>> conns;
  std::atomic<size_t> rejected{0};
  bool closed = false;
  std::string unlink_path;
  // A new Listener on a reused address is a new incarnation, even in the same process (CH-3).
  uint64_t incarnation = random64();

  awaitable<void> accept_loop() {
    auto self = shared_from_this();
    while (!closed) {
      auto conn = std::make_shared<Conn>(ctx);
      asio::error_code ec;
      co_await acceptor.async_accept(conn->sock, asio::redirect_error(use_awaitable, ec));
      if (ec) {
        if (closed) break;
        spdlog::warn("channel {}: accept failed: {}", bound.to_string(), ec.message());
        continue;
      }
      if (bound.transport == Transport::Tcp) {
        asio::error_code ignored;
        conn->sock.set_option(asio::ip::tcp::no_delay(true), ignored);
      }
      size_unix_buffers(conn->sock, bound.transport, opt);
      conns.insert(conn);
      asio::co_spawn(ctx, serve(conn), asio::detached);
    }
  }

  void drop(const std::shared_ptr<Conn>& c) {
    c->open = false;
    asio::error_code ignored;
    c->sock.close(ignored);
    c->ack_timer.cancel();
    conns.erase(c);
  }

  awaitable<void> serve(std::shared_ptr<Conn> c) {
    auto self = shared_from_this();
    std::string peer = peer_name(c->sock);
    wire::FrameDecoder dec(limits_of(opt));
    std::vector<std::byte> buf(64 * 1024);
    try {
      uint64_t session = 0;
      {
        Watchdog wd(ctx, c->sock, opt.handshake_timeout);
        Bytes nonce = random_bytes(16);
        std::vector<Bytes> hello_parts{nonce};
        co_await write_frame(c->sock, header(FrameKind::Hello, 0, incarnation, 0), hello_parts);
        wire::Frame auth = co_await read_frame(c->sock, dec, buf);
        if (auth.header.kind != FrameKind::Auth) {
          throw wire::FrameError(std::string("handshake: expected Auth, got ") +
                                 wire::to_string(auth.header.kind));
        }
        if (bound.transport == Transport::Tcp) {
          Bytes want = compute_hmac(secret, nonce, auth.header.session_id, auth.header.incarnation);
          bool ok = auth.parts.size() == 1 && auth.parts[0].size() == want.size() &&
                    CRYPTO_memcmp(auth.parts[0].data(), want.data(), want.size()) == 0;
          if (!ok) {
            rejected.fetch_add(1);
            spdlog::warn("channel {}: refused {}: shared secret mismatch (HMAC challenge failed)",
                         bound.to_string(), peer);
            std::vector<Bytes> why{text_bytes("shared secret mismatch")};
            co_await write_frame(c->sock, header(FrameKind::Reject, 0, incarnation, 0), why);
            drop(c);
            co_return;
          }
        }
        session = auth.header.session_id;
        SessionState& ss = sessions[session];
        if (ss.sender_incarnation != auth.header.incarnation) {
          ss = SessionState{auth.header.incarnation, 0};  // a new or restarted sender
        }
        std::vector<Bytes> none;
        co_await write_frame(
            c->sock, header(FrameKind::Accept, session, incarnation, ss.last_delivered), none);
      }
      c->session = session;
      c->state = &sessions[session];
      c->last_acked = c->state->last_delivered;
      asio::co_spawn(ctx, ack_writer(c), asio::detached);
      while (c->open) {
        // Large parts are read straight into their final buffers (no copy through `buf`).
        auto direct = dec.direct_buffer();
        if (!direct.empty()) {
          size_t n = co_await c->sock.async_read_some(asio::buffer(direct.data(), direct.size()),
                                                      use_awaitable);
          dec.commit_direct(n);
        } else {
          size_t n = co_await c->sock.async_read_some(asio::buffer(buf), use_awaitable);
          dec.feed(std::span<const std::byte>(buf.data(), n));
        }
        while (auto f = dec.next()) on_frame(*c, std::move(*f), dec);
      }
    } catch (const wire::FrameError& e) {
      rejected.fetch_add(1);
      spdlog::warn("channel {}: dropping connection from {}: {}", bound.to_string(), peer,
                   e.what());
    } catch (const std::system_error& e) {
      // EOF, reset, or closed by us: the sender reconnects if it wants to.
      spdlog::debug("channel {}: connection from {} ended: {}", bound.to_string(), peer, e.what());
    } catch (const std::exception& e) {
      spdlog::error("channel {}: handler failed on a message from {}: {}; dropping the connection",
                    bound.to_string(), peer, e.what());
    }
    drop(c);
  }

  void on_frame(Conn& c, wire::Frame&& f, wire::FrameDecoder& dec) {
    switch (f.header.kind) {
      case FrameKind::Data: {
        SessionState& ss = *c.state;
        if (f.header.session_id != c.session) {
          throw wire::FrameError("data frame for session " + std::to_string(f.header.session_id) +
                                 " on a connection of session " + std::to_string(c.session));
        }
        if (f.header.seq <= ss.last_delivered) return;  // duplicate after a resend (CH-2)
        if (f.header.seq != ss.last_delivered + 1) {
          throw wire::FrameError("sequence gap: got " + std::to_string(f.header.seq) + " after " +
                                 std::to_string(ss.last_delivered));
        }
        ss.last_delivered = f.header.seq;
        Message m{std::move(f.parts)};
        handler(std::move(m));
        for (auto& p : m.parts) dec.recycle(std::move(p));  // parts the handler did not keep
        if (++c.since_ack >= opt.ack_every) {
          c.ack_timer.expires_at(Clock::time_point::min());
        } else if (!c.ack_armed) {
          c.ack_armed = true;
          c.ack_timer.expires_after(opt.ack_interval);
        }
        return;
      }
      case FrameKind::Heartbeat:
        return;
      case FrameKind::Close:
        c.open = false;
        return;
      default:
        throw wire::FrameError(std::string("unexpected ") + wire::to_string(f.header.kind) +
                               " frame after handshake");
    }
  }

  awaitable<void> ack_writer(std::shared_ptr<Conn> c) {
    auto self = shared_from_this();
    try {
      while (c->open) {
        asio::error_code ec;
        co_await c->ack_timer.async_wait(asio::redirect_error(use_awaitable, ec));
        if (!c->open) break;
        if (c->ack_timer.expiry() > Clock::now()) continue;  // re-armed while waiting
        c->ack_timer.expires_at(Clock::time_point::max());
        c->ack_armed = false;
        uint64_t last = c->state->last_delivered;
        if (last <= c->last_acked) continue;
        c->since_ack = 0;
        c->last_acked = last;
        std::vector<Bytes> none;
        c->writing_ack = true;
        co_await write_frame(c->sock, header(FrameKind::Ack, c->session, incarnation, last), none);
        c->writing_ack = false;
      }
    } catch (const std::system_error&) {
      // The reader notices the broken connection and drops it.
    }
  }

  // Acknowledges what the connection delivered since its last Ack, before it is closed. Without
  // it a sender that sent its last messages within ack_interval of our shutdown holds them as
  // unacknowledged: it waits for an Ack that never comes (a Proc's stop_remote waited out its
  // 2 s cap) and then reports them as undelivered although the handler had them. Best effort.
  void ack_before_close(Conn& c) {
    if (!c.open || c.state == nullptr || c.writing_ack) return;
    uint64_t last = c.state->last_delivered;
    if (last <= c.last_acked) return;
    if (write_frame_now(c.sock, header(FrameKind::Ack, c.session, incarnation, last)))
      c.last_acked = last;
  }

  void shutdown() {
    closed = true;
    asio::error_code ignored;
    acceptor.close(ignored);
    auto all = conns;
    for (auto& c : all) {
      ack_before_close(*c);
      drop(c);
    }
    if (!unlink_path.empty()) ::unlink(unlink_path.c_str());
  }
};

struct SocketListener final : Listener {
  std::shared_ptr<ListenerCore> core;
  ~SocketListener() override {
    auto c = core;
    run_on_io(c->ctx, [c] { c->shutdown(); });
  }
  ChannelAddr bound_addr() const override { return core->bound; }
  size_t rejected_connections() const override { return core->rejected.load(); }
};

// A unix socket path to bind: free it if it holds a stale socket (a listener that exited without
// unlinking). Anything else there is refused: a live listener's socket (binding would take its
// path over silently), or a file that is not a socket (unlinking would delete it).
void remove_stale_socket(const ChannelAddr& addr) {
  const std::string& path = addr.name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there (or unreadable: bind will say)
  if (!S_ISSOCK(st.st_mode)) {
    throw ChannelError("cannot listen on " + addr.to_string() + ": " + path +
                       " exists and is not a socket");
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ChannelError("socket(AF_UNIX) failed: " + std::string(std::strerror(errno)));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
  int err = errno;
  ::close(fd);
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) {  // accepted, or a full backlog: alive
    throw ChannelError("cannot listen on " + addr.to_string() + ": address already in use (" +
                       path + " has a live listener)");
  }
  if (err != ECONNREFUSED) {
    throw ChannelError("cannot listen on " + addr.to_string() + ": cannot probe " + path + ": " +
                       std::strerror(err));
  }
  ::unlink(path.c_str());  // stale: nobody listens there
}

}  // namespace

std::unique_ptr<Listener> Listener::serve(IoRuntime& io, const ChannelAddr& addr,
                                          ChannelOptions options, Handler handler) {
  if (!handler) throw ChannelError("Listener::serve(" + addr.to_string() + "): empty handler");
  auto& ctx = ctx_of(io);
  if (addr.transport == Transport::Inproc) return serve_inproc(addr, std::move(handler));

  auto core = std::make_shared<ListenerCore>(ctx, options);
  core->secret = job_secret(options);
  if (addr.transport == Transport::Tcp && core->secret.empty()) {
    throw ChannelError("tcp listener " + addr.to_string() +
                       " requires the job's shared secret: set ChannelOptions::secret, "
                       "MONARCH_SECRET or MONARCH_SECRET_FILE");
  }
  core->handler = std::move(handler);
  ChannelAddr local = addr.without_dial();
  std::exception_ptr error;
  run_on_io(ctx, [&] {
    try {
      Endpoint ep = to_endpoint(ctx, local);
      core->acceptor.open(ep.protocol());
      if (local.transport == Transport::Tcp)
        core->acceptor.set_option(Acceptor::reuse_address(true));
      if (local.transport == Transport::Unix && !local.abstract) remove_stale_socket(local);
      core->acceptor.bind(ep);
      if (local.transport == Transport::Unix && !local.abstract) {
        // Before listen(): nobody can connect yet, so no window with wider permissions.
        if (::chmod(local.name.c_str(), 0600) != 0) {
          throw ChannelError("chmod 0600 " + local.name + " failed");
        }
        core->unlink_path = local.name;
      }
      core->acceptor.listen(asio::socket_base::max_listen_connections);
      ChannelAddr bound = local;
      if (local.transport == Transport::Tcp) {
        auto actual = core->acceptor.local_endpoint();
        asio::ip::tcp::endpoint t;
        std::memcpy(t.data(), actual.data(), std::min<size_t>(actual.size(), t.capacity()));
        t.resize(actual.size());
        bound.port = t.port();
      }
      core->bound = addr.dial ? *addr.dial : bound;
      asio::co_spawn(ctx, core->accept_loop(), asio::detached);
    } catch (const std::system_error& e) {
      error = std::make_exception_ptr(
          ChannelError("cannot listen on " + addr.to_string() + ": " + e.code().message()));
    } catch (...) {
      error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  auto l = std::make_unique<SocketListener>();
  l->core = std::move(core);
  return l;
}

}  // namespace monarch::channel
