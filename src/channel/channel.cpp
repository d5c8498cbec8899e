// Channel sessions over asio (C++20 coroutines): handshake with HMAC challenge, sequence numbers,
// acknowledgements, reconnect with backoff, resend and duplicate drop. See channel.hpp (CH-n).
//
// Wire protocol, per connection (frames from monarch/wire/frame.hpp):
//   listener -> sender  Hello   {incarnation = listener's process}       parts: [16-byte nonce]
//   sender -> listener  Auth    {session_id, incarnation = sender's}      parts: [HMAC or empty]
//   listener -> sender  Accept  {incarnation, seq = last delivered seq of this session}
//                    or Reject  parts: [reason]
//   sender -> listener  Data    {session_id, seq}                          parts: the message
//   listener -> sender  Ack     {seq = highest delivered}
// Connection state lives on the IoRuntime thread. Sender::send runs on any thread: it queues under
// SenderCore::mu, or, on an idle connected link, writes the frame itself (the direct path, see
// SenderCore::write_direct); everything the two paths share (queue, unacked, sequence numbers,
// the partially written tail, the socket's fd) is guarded by SenderCore::mu.
#include "monarch/channel/channel.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <asio.hpp>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "monarch/wire/frame.hpp"
#include "path_stats.hpp"

namespace monarch::channel {

using asio::awaitable;
using asio::use_awaitable;
using Socket = asio::generic::stream_protocol::socket;
using Acceptor = asio::basic_socket_acceptor<asio::generic::stream_protocol>;
using Endpoint = asio::generic::stream_protocol::endpoint;
using Clock = std::chrono::steady_clock;
using wire::FrameHeader;
using wire::FrameKind;

namespace {

uint64_t random64() {
  uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1) {
    std::random_device rd;
    v = (uint64_t{rd()} << 32) ^ rd();
  }
  return v == 0 ? 1 : v;
}

std::string resolve_secret(const ChannelOptions& o) {
  if (!o.secret.empty()) return o.secret;
  if (const char* s = std::getenv("MONARCH_SECRET"); s != nullptr && *s != '\0') return s;
  if (const char* f = std::getenv("MONARCH_SECRET_FILE"); f != nullptr && *f != '\0') {
    std::ifstream in(f);
    if (!in) throw ChannelError(std::string("cannot read MONARCH_SECRET_FILE '") + f + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string secret = ss.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty()) throw ChannelError(std::string("MONARCH_SECRET_FILE '") + f + "' is empty");
    return secret;
  }
  return {};
}

Bytes compute_hmac(const std::string& secret, const Bytes& nonce, uint64_t session,
                   uint64_t incarnation) {
  Bytes msg(nonce);
  auto append = [&](uint64_t v) {
    auto* p = reinterpret_cast<const std::byte*>(&v);
    msg.insert(msg.end(), p, p + sizeof v);
  };
  append(session);
  append(incarnation);
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
       reinterpret_cast<unsigned char*>(out.data()), &len);
  out.resize(len);
  return out;
}

Bytes random_bytes(size_t n) {
  Bytes b(n);
  RAND_bytes(reinterpret_cast<unsigned char*>(b.data()), static_cast<int>(n));
  return b;
}

Bytes text_bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return Bytes(p, p + s.size());
}
std::string bytes_text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

Endpoint to_endpoint(asio::io_context& ctx, const ChannelAddr& a) {
  if (a.transport == Transport::Unix) {
    std::string path = a.abstract ? std::string(1, '\0') + a.name : a.name;
    return Endpoint(asio::local::stream_protocol::endpoint(path));
  }
  asio::ip::tcp::resolver resolver(ctx);
  asio::error_code ec;
  auto results = resolver.resolve(a.host, std::to_string(a.port), ec);
  if (ec || results.empty()) {
    throw ChannelError("cannot resolve host '" + a.host + "' of " + a.to_string() + ": " +
                       ec.message());
  }
  return Endpoint(results.begin()->endpoint());
}

wire::DecoderLimits limits_of(const ChannelOptions& o) {
  wire::DecoderLimits l;
  // The frame body also carries the part-length table.
  l.max_frame_bytes = o.max_frame_bytes + 4 * l.max_parts;
  return l;
}

FrameHeader header(FrameKind kind, uint64_t session, uint64_t incarnation, uint64_t seq) {
  FrameHeader h{};
  h.kind = kind;
  h.session_id = session;
  h.incarnation = incarnation;
  h.seq = seq;
  return h;
}

// Encodes a frame's prefix (header + part-length table) for parts.
std::vector<std::byte> prefix_of(const FrameHeader& h, const std::vector<Bytes>& parts) {
  std::vector<std::span<const std::byte>> spans;
  spans.reserve(parts.size());
  for (const auto& p : parts) spans.emplace_back(p.data(), p.size());
  std::vector<std::byte> out;
  wire::encode_prefix(h, spans, out);
  return out;
}

// asio::async_write's default completion condition (transfer_all) hands the socket at most
// 64 KiB per sendmsg: a 1 MiB part took 16 system calls and as many wake-ups of the reader.
// This one lets each sendmsg take everything that is left (the kernel takes what fits).
std::size_t whole_writes(const asio::error_code& ec, std::size_t) {
  return ec ? 0 : std::numeric_limits<std::size_t>::max();
}

// Unix-socket connections get ChannelOptions::unix_socket_buffer for both directions: with the
// default (~208 KiB) a 1 MiB message crossed in five writes, each waking the reader. TCP keeps
// the kernel's autotuning.
void size_unix_buffers(Socket& s, Transport t, const ChannelOptions& o) {
  if (t != Transport::Unix || o.unix_socket_buffer == 0) return;
  const int n = static_cast<int>(std::min<size_t>(o.unix_socket_buffer, 1u << 30));
  asio::error_code ignored;  // best effort: the kernel caps it at net.core.{w,r}mem_max
  s.set_option(asio::socket_base::send_buffer_size(n), ignored);
  s.set_option(asio::socket_base::receive_buffer_size(n), ignored);
}

awaitable<void> write_frame(Socket& s, const FrameHeader& h, const std::vector<Bytes>& parts) {
  auto prefix = prefix_of(h, parts);
  std::vector<asio::const_buffer> bufs;
  bufs.emplace_back(prefix.data(), prefix.size());
  for (const auto& p : parts) bufs.emplace_back(p.data(), p.size());
  co_await asio::async_write(s, bufs, whole_writes, use_awaitable);
}

// Reads until the decoder yields one frame.
awaitable<wire::Frame> read_frame(Socket& s, wire::FrameDecoder& dec, std::vector<std::byte>& buf) {
  while (true) {
    if (auto f = dec.next()) co_return std::move(*f);
    size_t n = co_await s.async_read_some(asio::buffer(buf), use_awaitable);
    dec.feed(std::span<const std::byte>(buf.data(), n));
  }
}

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

}  // namespace

detail::SendPathStats& detail::send_path_stats() {
  static SendPathStats stats;
  return stats;
}

uint64_t process_incarnation() {
  static const uint64_t inc = random64();
  return inc;
}

// ---------------------------------------------------------------------------------------------
// IoRuntime

struct IoRuntime::Impl {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  std::thread thread;
};

IoRuntime::IoRuntime() : impl_(std::make_unique<Impl>()) {
  // Create spdlog's registry before our thread starts: it is a lazily built static inside the
  // (uninstrumented) shared library, so racing to build it would be invisible to TSan.
  (void)spdlog::default_logger_raw();
  impl_->thread = std::thread([this] { impl_->ctx.run(); });
}

IoRuntime::~IoRuntime() {
  impl_->guard.reset();
  impl_->ctx.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void* IoRuntime::context() {
  return &impl_->ctx;
}

IoRuntime& IoRuntime::shared() {
  static IoRuntime rt;
  return rt;
}

namespace {

asio::io_context& ctx_of(IoRuntime& io) {
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

// ---------------------------------------------------------------------------------------------
// In-process transport: a registry of named listeners; delivery is a post to the io thread.

struct InprocListener;
std::mutex g_inproc_mu;
std::unordered_map<std::string, std::weak_ptr<InprocListener>> g_inproc;

struct InprocListener final : Listener {
  ChannelAddr addr;
  std::shared_ptr<Listener::Handler> handler;
  ~InprocListener() override {
    std::lock_guard lock(g_inproc_mu);
    g_inproc.erase(addr.name);
  }
  ChannelAddr bound_addr() const override { return addr; }
  size_t rejected_connections() const override { return 0; }
};

struct InprocSender final : Sender {
  asio::io_context& ctx;
  ChannelAddr target;
  ChannelOptions opt;
  FailureHandler on_failure;
  std::atomic<bool> is_closed{false};
  InprocSender(asio::io_context& c, ChannelAddr a, ChannelOptions o, FailureHandler f)
      : ctx(c), target(std::move(a)), opt(std::move(o)), on_failure(std::move(f)) {}

  void send(Message m) override {
    if (m.size_bytes() > opt.max_frame_bytes) {
      throw ChannelError("message of " + std::to_string(m.size_bytes()) +
                         " bytes exceeds max_frame_bytes " + std::to_string(opt.max_frame_bytes) +
                         " (to " + target.to_string() + ")");
    }
    std::shared_ptr<Listener::Handler> h;
    {
      std::lock_guard lock(g_inproc_mu);
      auto it = g_inproc.find(target.name);
      if (it != g_inproc.end()) {
        if (auto l = it->second.lock()) h = l->handler;
      }
    }
    for (auto& sp : m.shared_parts)
      m.parts.emplace_back(sp.bytes.begin(), sp.bytes.end());  // receivers own parts
    m.shared_parts.clear();
    std::string why = is_closed ? "link closed" : "no inproc listener named '" + target.name + "'";
    asio::post(ctx, [h, m = std::move(m), fail = on_failure, why]() mutable {
      if (h) return (*h)(std::move(m));
      if (fail) fail(std::move(m), why);
    });
  }
  size_t pending() const override { return 0; }
  bool closed() const override { return is_closed; }
  const ChannelAddr& addr() const override { return target; }
  void close_quietly(const std::string& why) override { close(why); }
  void close(const std::string& why) override {
    is_closed = true;
    std::function<void(const std::string&)> h;
    {
      std::lock_guard lock(mu);
      h = std::move(close_handler);
    }
    if (h) asio::post(ctx, [h, why] { h(why); });
  }
  void on_close(std::function<void(const std::string&)> f) override {
    std::lock_guard lock(mu);
    close_handler = std::move(f);
  }
  std::mutex mu;
  std::function<void(const std::string&)> close_handler;
};

// ---------------------------------------------------------------------------------------------
// Socket listener

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
        co_await write_frame(c->sock, header(FrameKind::Ack, c->session, incarnation, last), none);
      }
    } catch (const std::system_error&) {
      // The reader notices the broken connection and drops it.
    }
  }

  void shutdown() {
    closed = true;
    asio::error_code ignored;
    acceptor.close(ignored);
    auto all = conns;
    for (auto& c : all) drop(c);
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

}  // namespace

std::unique_ptr<Listener> Listener::serve(IoRuntime& io, const ChannelAddr& addr,
                                          ChannelOptions options, Handler handler) {
  if (!handler) throw ChannelError("Listener::serve(" + addr.to_string() + "): empty handler");
  auto& ctx = ctx_of(io);
  if (addr.transport == Transport::Inproc) {
    auto l = std::make_shared<InprocListener>();
    l->addr = addr;
    l->handler = std::make_shared<Listener::Handler>(std::move(handler));
    std::lock_guard lock(g_inproc_mu);
    auto& slot = g_inproc[addr.name];
    if (!slot.expired())
      throw ChannelError("inproc address " + addr.to_string() + " already in use");
    slot = l;
    // The registry holds a weak reference; the caller owns the listener.
    struct Owner final : Listener {
      std::shared_ptr<InprocListener> l;
      ChannelAddr bound_addr() const override { return l->bound_addr(); }
      size_t rejected_connections() const override { return 0; }
    };
    auto o = std::make_unique<Owner>();
    o->l = std::move(l);
    return o;
  }

  auto core = std::make_shared<ListenerCore>(ctx, options);
  core->secret = resolve_secret(options);
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
      if (local.transport == Transport::Unix && !local.abstract) ::unlink(local.name.c_str());
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

// ---------------------------------------------------------------------------------------------
// Socket sender

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
  Clock::time_point down_since{};  // when the peer became unreachable (CH-7); epoch = reachable
  std::string last_error;          // of the last failed connection, for reports
  asio::steady_timer wake;
  asio::steady_timer tick;

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
      std::string detail = last_error.empty() ? "" : " (last connection error: " + last_error + ")";
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
        down_since = Clock::time_point{};
        last_error.clear();
        backoff = opt.reconnect_initial;
        asio::co_spawn(ctx, reader(), asio::detached);
        co_await writer();
      } catch (const wire::FrameError& e) {
        spdlog::warn("channel to {}: protocol error: {}", addr.to_string(), e.what());
        last_error = e.what();
      } catch (const ChannelError& e) {
        close_link(e.what());
      } catch (const std::system_error& e) {
        spdlog::debug("channel to {}: connection lost: {}", addr.to_string(), e.what());
        last_error = e.code().message();
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
    return std::make_shared<InprocSender>(ctx, target, std::move(options), std::move(on_failure));
  }
  auto core = std::make_shared<SenderCore>(ctx, target, options, std::move(on_failure));
  core->secret = resolve_secret(options);
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
