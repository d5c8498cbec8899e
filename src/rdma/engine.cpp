// The data plane's engine and its channel route.
//
// Channel protocol (every message: part 0 = Header (cereal), part 1 = data where noted):
//   requester -> owner  Read  {req, reg, gen, offset, length, stream, reply_to}
//   requester -> owner  Write {req, reg, gen, offset, length, stream, reply_to}  + data
//   owner -> requester  ReadData {req, offset, length}                            + data
//   owner -> requester  WriteAck {req, offset, length}
//   owner -> requester  Error {req, code, error}
// A transfer is cut into chunks of rdma.chunk_bytes (a smaller one into rdma.streams even chunks
// of at least 256 KiB), spread round-robin over rdma.streams links
// (one channel Sender each, i.e. one connection each) to the owner; the owner answers on its own
// link per (requester, stream). At most 2 chunks per stream are in flight per transfer, so a
// 256 MiB transfer never queues 256 MiB.
#include "engine.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <unordered_map>

#include "monarch/channel/channel.hpp"
#include "monarch/config/config.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch::rdma {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Channel:
      return "channel";
    case Backend::Ucx:
      return "ucx";
  }
  return "?";
}

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::Host:
      return "host";
    case MemoryKind::Cuda:
      return "cuda";
    case MemoryKind::Rocm:
      return "rocm";
  }
  return "?";
}

const char* errc_name(RdmaErrc c) {
  switch (c) {
    case RdmaErrc::InvalidArgument:
      return "invalid argument";
    case RdmaErrc::OutOfBounds:
      return "out of bounds";
    case RdmaErrc::UnknownBuffer:
      return "unknown buffer";
    case RdmaErrc::Dropped:
      return "dropped";
    case RdmaErrc::Timeout:
      return "timeout";
    case RdmaErrc::OwnerUnreachable:
      return "owner unreachable";
    case RdmaErrc::BackendUnavailable:
      return "backend unavailable";
  }
  return "?";
}

std::string RdmaHandle::describe() const {
  return "'" + name + "' (reg " + std::to_string(reg_id) + ", " + std::to_string(length) +
         " B at " + owner + ", " + backend_name(backend) + ")";
}

namespace detail {
namespace {

using channel::Bytes;
using channel::Message;

enum Kind : uint8_t { kRead = 1, kWrite, kReadData, kWriteAck, kError };

struct Header {
  uint8_t kind = 0;
  uint64_t req = 0;
  uint64_t reg = 0;
  uint64_t gen = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t stream = 0;
  std::string reply_to;
  uint8_t code = 0;
  std::string error;
  template <class A>
  void serialize(A& ar) {
    ar(kind, req, reg, gen, offset, length, stream, reply_to, code, error);
  }
};

std::exception_ptr make_error(RdmaErrc c, const std::string& what) {
  return std::make_exception_ptr(RdmaError(c, what));
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

/// One transfer in flight on the channel route.
struct Op {
  uint64_t id = 0;
  bool read = true;
  RdmaHandle h;
  std::byte* local = nullptr;
  size_t size = 0;
  uint64_t offset = 0;
  size_t chunk = 0;
  size_t nchunks = 0;
  size_t next = 0;       // next chunk to send
  size_t completed = 0;  // chunks answered
  std::string what;
  Done done;
  std::unique_ptr<asio::steady_timer> timer;  // destroyed (cancelled) with the Op
  // Writes: chunks are sent straight from the caller's span, so the transfer completes only
  // once it is answered (all acknowledged, or failed) and the channel holds none of its chunks.
  std::atomic<size_t> lent{0};        // write chunks the channel still holds
  std::atomic<bool> answered{false};  // result is set
  std::atomic<bool> done_called{false};
  std::exception_ptr result;
};

struct Engine::Impl {
  channel::IoRuntime io;
  asio::io_context& ctx = *static_cast<asio::io_context*>(io.context());
  channel::ChannelOptions copts;
  std::unique_ptr<channel::Listener> listener;
  std::string addr;
  uint64_t incarnation = channel::process_incarnation();
  StatusTable status{size_t{1} << 16};  // before ucx, which registers it
  LocalRoutes local{incarnation};
  size_t chunk = 4 << 20;
  uint32_t streams = 4;
  /// Leases of every registration, dropped ones included (lent_replies()); shared with the
  /// leases, which the channel may release while Impl is destroyed at exit.
  std::shared_ptr<std::atomic<size_t>> lent_total = std::make_shared<std::atomic<size_t>>(0);
  std::unique_ptr<UcxPlane> ucx;
  std::string ucx_why;

  std::mutex reg_mu;
  std::unordered_map<uint64_t, std::shared_ptr<Registration>> regs;
  std::unordered_map<uint64_t, std::string> dropped;  // id -> name, for "was dropped" errors
  uint64_t next_reg = 1;

  std::mutex ops_mu;
  std::unordered_map<uint64_t, std::shared_ptr<Op>> ops;
  uint64_t next_op = 1;

  std::mutex tx_mu;
  std::map<std::pair<std::string, uint32_t>, std::shared_ptr<channel::Sender>> senders;

  /// What this process can register, Host first (life_mu_ held by the caller).
  std::vector<MemoryKind> memory_kinds() const {
    uint32_t bits = 1u << static_cast<int>(MemoryKind::Host);
    if (ucx) bits |= ucx->memory_kinds();
    std::vector<MemoryKind> out;
    for (MemoryKind k : {MemoryKind::Host, MemoryKind::Cuda, MemoryKind::Rocm}) {
      if ((bits & (1u << static_cast<int>(k))) != 0) out.push_back(k);
    }
    return out;
  }

  /// For error messages: the UCX in use, or why the ucx backend is not running.
  std::string ucx_state() const {
    if (ucx) return ucx->transport();
    return "ucx backend not running: " +
           (ucx_why.empty() ? std::string("rdma.backend=channel") : ucx_why);
  }

  // ---- links ----
  std::shared_ptr<channel::Sender> sender(const std::string& to, uint32_t stream) {
    std::shared_ptr<channel::Sender> s;
    {
      std::lock_guard lock(tx_mu);
      auto& slot = senders[{to, stream}];
      if (slot && !slot->closed()) return slot;
      slot = channel::Sender::connect(
          io, channel::ChannelAddr::parse(to), copts,
          [this, to](Message&& m, const std::string& why) { on_returned(std::move(m), to, why); });
      s = slot;
    }
    std::weak_ptr<channel::Sender> weak = s;
    s->on_close([this, to, stream, weak](const std::string&) {
      std::lock_guard lock(tx_mu);
      auto it = senders.find({to, stream});
      if (it != senders.end() && it->second == weak.lock()) senders.erase(it);
    });
    return s;
  }

  void send(const std::string& to, uint32_t stream, Message m) {
    std::shared_ptr<channel::Sender> s = sender(to, stream);
    s->send(std::move(m));
  }

  /// A message the channel could not deliver. Requests fail their transfer; replies are dropped
  /// (their requester is gone and times out or has timed out).
  void on_returned(Message&& m, const std::string& to, const std::string& why) {
    if (m.parts.empty()) return;
    Header hd;
    try {
      hd = wire::decode<Header>(m.parts[0]);
    } catch (...) {
      return;
    }
    if (hd.kind != kRead && hd.kind != kWrite) return;
    fail(hd.req, RdmaErrc::OwnerUnreachable, "owner at " + to + " unreachable: " + why);
  }

  // ---- requester side ----
  void fail(uint64_t id, RdmaErrc code, const std::string& why) {
    std::shared_ptr<Op> op;
    {
      std::lock_guard lock(ops_mu);
      auto it = ops.find(id);
      if (it == ops.end()) return;
      op = std::move(it->second);
      ops.erase(it);
    }
    settle(op, make_error(code, op->what + ": " + why));
    if (op->lent.load() > 0 && (code == RdmaErrc::Timeout || code == RdmaErrc::OwnerUnreachable)) {
      // Chunks of the caller's span still queued for an owner that does not answer: closing the
      // links returns them (failing the transfers they carry), so this one completes now.
      std::vector<std::pair<std::string, uint32_t>> links;
      for (uint32_t s = 0; s < streams; ++s) links.emplace_back(op->h.owner, s);
      close_links(links, op->what + ": " + why);
    }
  }

  /// The transfer is answered (err: nullptr on success). Reads complete now; writes when the
  /// channel also let go of every chunk sent from the caller's span (RD-2: after the Future
  /// completed, the span is not touched).
  static void settle(const std::shared_ptr<Op>& op, std::exception_ptr err) {
    op->result = std::move(err);
    op->answered.store(true);
    if (op->lent.load() == 0) complete(op);
  }
  static void complete(const std::shared_ptr<Op>& op) {
    if (op->done_called.exchange(true)) return;
    op->done(op->result);
  }

  /// A lease on write chunk memory of op. Its release may run under the channel's locks: it only
  /// counts, and posts the completion to the I/O thread.
  std::shared_ptr<const void> lend_span(const std::shared_ptr<Op>& op) {
    op->lent.fetch_add(1);
    return std::shared_ptr<const void>(nullptr, [op, c = &ctx](const void*) {
      if (op->lent.fetch_sub(1) == 1 && op->answered.load()) {
        asio::post(*c, [op] { complete(op); });
      }
    });
  }

  /// Closes the given links (ours, by (address, stream)); their queued and unacknowledged
  /// messages are returned at once (on_returned).
  void close_links(const std::vector<std::pair<std::string, uint32_t>>& links,
                   const std::string& why) {
    for (const auto& link : links) {
      std::shared_ptr<channel::Sender> s;
      {
        std::lock_guard tx(tx_mu);  // not held across close(): its close handler takes tx_mu
        auto it = senders.find(link);
        if (it != senders.end()) s = it->second;
      }
      if (s) s->close(why);
    }
  }

  /// Builds the message for chunk `i` of op (ops_mu held).
  Message chunk_message(const std::shared_ptr<Op>& op_ptr, size_t i, uint32_t& stream) {
    Op& op = *op_ptr;
    uint64_t at = static_cast<uint64_t>(i) * op.chunk;
    size_t len = std::min(op.chunk, op.size - static_cast<size_t>(at));
    stream = static_cast<uint32_t>(i % streams);
    Header hd;
    hd.kind = op.read ? kRead : kWrite;
    hd.req = op.id;
    hd.reg = op.h.reg_id;
    hd.gen = op.h.owner_incarnation;
    hd.offset = op.offset + at;
    hd.length = len;
    hd.stream = stream;
    hd.reply_to = addr;
    Message m;
    m.parts.push_back(wire::encode(hd));
    if (!op.read) {  // zero-copy: the channel writes straight from the caller's span
      m.shared_parts.emplace_back(lend_span(op_ptr),
                                  std::span<const std::byte>(op.local + at, len));
    }
    return m;
  }

  void send_chunks(const std::shared_ptr<Op>& op, std::vector<std::pair<uint32_t, Message>> out) {
    for (auto& [stream, m] : out) {
      try {
        send(op->h.owner, stream, std::move(m));
      } catch (const std::exception& e) {
        fail(op->id, RdmaErrc::OwnerUnreachable, std::string("cannot send to owner: ") + e.what());
        return;
      }
    }
  }

  void on_reply(const Header& hd, Message& m) {
    std::shared_ptr<Op> op;
    std::vector<std::pair<uint32_t, Message>> out;
    std::exception_ptr error;
    bool finished = false;
    {
      std::lock_guard lock(ops_mu);
      auto it = ops.find(hd.req);
      if (it == ops.end()) return;  // finished, failed or timed out: never touch its span (RD-2)
      op = it->second;
      if (hd.kind == kError) {
        error = make_error(static_cast<RdmaErrc>(hd.code), op->what + ": " + hd.error);
      } else if (hd.offset < op->offset || hd.offset - op->offset + hd.length > op->size ||
                 (hd.kind == kReadData) != op->read ||
                 (hd.kind == kReadData && (m.parts.size() < 2 || m.parts[1].size() != hd.length))) {
        error = make_error(RdmaErrc::OwnerUnreachable, op->what + ": malformed reply from owner");
      } else {
        if (hd.kind == kReadData) {
          std::memcpy(op->local + (hd.offset - op->offset), m.parts[1].data(), hd.length);
        }
        ++op->completed;
        if (op->completed == op->nchunks) {
          finished = true;
        } else if (op->next < op->nchunks) {
          uint32_t stream = 0;
          Message next = chunk_message(op, op->next++, stream);
          out.emplace_back(stream, std::move(next));
        }
      }
      if (error || finished) ops.erase(it);
    }
    if (error) {
      settle(op, error);
    } else if (finished) {
      settle(op, nullptr);
    } else {
      send_chunks(op, std::move(out));
    }
  }

  // ---- owner side ----
  void reply_error(const Header& req, RdmaErrc code, const std::string& why) {
    Header hd;
    hd.kind = kError;
    hd.req = req.req;
    hd.code = static_cast<uint8_t>(code);
    hd.error = why;
    Message m;
    m.parts.push_back(wire::encode(hd));
    send(req.reply_to, req.stream, std::move(m));
  }

  /// Finds the registration for a request, or the error to answer with.
  std::shared_ptr<Registration> lookup(uint64_t reg, uint64_t gen, RdmaErrc& code,
                                       std::string& why) {
    if (gen != incarnation) {
      code = RdmaErrc::UnknownBuffer;
      why = "handle is from another incarnation of the owner process (owner restarted?)";
      return nullptr;
    }
    std::lock_guard lock(reg_mu);
    auto it = regs.find(reg);
    if (it != regs.end()) return it->second;
    auto d = dropped.find(reg);
    if (d != dropped.end()) {
      code = RdmaErrc::Dropped;
      why = "buffer '" + d->second + "' (reg " + std::to_string(reg) + ") was dropped by its owner";
    } else {
      code = RdmaErrc::UnknownBuffer;
      why = "owner has no registration " + std::to_string(reg);
    }
    return nullptr;
  }

  /// A lease on reg's memory for one reply on link (to, stream); reg->mu held (shared), not
  /// dropped. Released when the channel lets go of the reply (acknowledged or returned).
  std::shared_ptr<const void> lend(const std::shared_ptr<Registration>& reg, const std::string& to,
                                   uint32_t stream) {
    std::pair<std::string, uint32_t> link{to, stream};
    {
      std::lock_guard lock(reg->lend_mu);
      ++reg->lent[link];
    }
    lent_total->fetch_add(1);
    return std::shared_ptr<const void>(nullptr, [reg, link, total = lent_total](const void*) {
      total->fetch_sub(1);
      std::lock_guard lock(reg->lend_mu);
      auto it = reg->lent.find(link);
      if (it != reg->lent.end() && --it->second == 0) reg->lent.erase(it);
      if (reg->lent.empty()) reg->lend_cv.notify_all();
    });
  }

  /// drop(): waits until the channel holds no reply sent from reg's memory (RD-5). Replies are
  /// released when acknowledged, within a few channel.ack_interval; links whose requester has
  /// not acknowledged within `grace` (frozen, or gone) are closed, which returns their messages
  /// at once. On the I/O thread (a drop from a completion callback) nothing can be waited for:
  /// the links are closed right away.
  /// sync() (close_stragglers false): the same wait, without closing anything; a frozen requester
  /// then delays it by the grace at most.
  void wait_unlent(Registration& reg, bool close_stragglers = true) {
    std::unique_lock lock(reg.lend_mu);
    if (reg.lent.empty()) return;
    auto grace =
        std::max<std::chrono::milliseconds>(8 * copts.ack_interval, std::chrono::milliseconds(200));
    bool on_io = ctx.get_executor().running_in_this_thread();
    if (!on_io && reg.lend_cv.wait_for(lock, grace, [&] { return reg.lent.empty(); })) return;
    if (!close_stragglers) return;
    std::vector<std::pair<std::string, uint32_t>> links;
    for (const auto& [link, n] : reg.lent) links.push_back(link);
    lock.unlock();
    close_links(links, "buffer '" + reg.name +
                           "' dropped while a requester had not acknowledged "
                           "data read from it");
    lock.lock();
    // Closing returned every message of those links; nothing else holds a lease.
    if (!reg.lend_cv.wait_for(lock, std::chrono::seconds(5), [&] { return reg.lent.empty(); })) {
      spdlog::error("rdma: drop of '{}' still has {} link(s) holding its memory", reg.name,
                    reg.lent.size());
    }
  }

  void serve(const Header& hd, Message& m) {
    RdmaErrc code{};
    std::string why;
    auto reg = lookup(hd.reg, hd.gen, code, why);
    if (!reg) return reply_error(hd, code, why);
    Message out;
    {
      std::shared_lock lock(reg->mu);
      if (reg->dropped) {
        return reply_error(hd, RdmaErrc::Dropped,
                           "buffer '" + reg->name + "' (reg " + std::to_string(reg->id) +
                               ") was dropped by its owner");
      }
      if (reg->kind != MemoryKind::Host) {
        return reply_error(hd, RdmaErrc::BackendUnavailable,
                           "buffer '" + reg->name + "' is " + memory_kind_name(reg->kind) +
                               " memory: only the ucx route reaches it");
      }
      if (hd.kind != kRead && reg->read_only) {
        return reply_error(hd, RdmaErrc::InvalidArgument,
                           "buffer '" + reg->name + "' is registered read-only");
      }
      if (hd.length > reg->length || hd.offset > reg->length - hd.length) {
        return reply_error(hd, RdmaErrc::OutOfBounds,
                           "bytes [" + std::to_string(hd.offset) + ", " +
                               std::to_string(hd.offset + hd.length) + ") outside buffer '" +
                               reg->name + "' of " + std::to_string(reg->length) + " B");
      }
      Header r;
      r.req = hd.req;
      r.offset = hd.offset;
      r.length = hd.length;
      if (hd.kind == kRead) {
        r.kind = kReadData;
        out.parts.push_back(wire::encode(r));
        // Zero-copy: the channel writes the chunk straight from the registered memory and holds
        // a lease on it until the requester acknowledged the message; drop() waits for leases.
        out.shared_parts.emplace_back(lend(reg, hd.reply_to, hd.stream),
                                      std::span<const std::byte>(reg->base + hd.offset, hd.length));
      } else {
        if (m.parts.size() < 2 || m.parts[1].size() != hd.length) {
          return reply_error(hd, RdmaErrc::InvalidArgument, "write chunk of the wrong size");
        }
        std::memcpy(reg->base + hd.offset, m.parts[1].data(), hd.length);
        r.kind = kWriteAck;
        out.parts.push_back(wire::encode(r));
      }
    }
    send(hd.reply_to, hd.stream, std::move(out));
  }

  void on_message(Message&& m) {
    if (m.parts.empty()) return;
    Header hd;
    try {
      hd = wire::decode<Header>(m.parts[0]);
    } catch (const std::exception& e) {
      spdlog::warn("rdma: dropping malformed data-plane message: {}", e.what());
      return;
    }
    try {
      if (hd.kind == kRead || hd.kind == kWrite) return serve(hd, m);
      on_reply(hd, m);
    } catch (const std::exception& e) {  // e.g. a bad reply_to address: nobody to tell
      spdlog::warn("rdma: cannot answer a data-plane request: {}", e.what());
    }
  }
};

Engine& Engine::get() {
  static Engine* engine = new Engine();  // never destroyed: see engine.hpp
  return *engine;
}

void Engine::shutdown_at_exit() {
  std::unique_ptr<Impl> dying;
  {
    std::unique_lock life(life_mu_);  // waits for calls in progress; later ones fail fast
    dying = std::move(impl_);
  }
  if (!dying) return;
  // Order matters: the ucx thread first; then no more incoming messages (the listener, closed on
  // its live I/O thread); then our links (outside tx_mu: their close callbacks take it); then the
  // I/O loop stops; then pending transfers (their Futures fail "promise dropped"), and last the
  // I/O thread, joined.
  if (dying->ucx) dying->ucx->shutdown();
  dying->ucx.reset();
  dying->listener.reset();
  std::map<std::pair<std::string, uint32_t>, std::shared_ptr<channel::Sender>> links;
  {
    std::lock_guard lock(dying->tx_mu);
    links.swap(dying->senders);
  }
  links.clear();
  // Destroying the links returns their undelivered messages on the I/O thread (on_returned ->
  // fail, which uses `ops`): stop the thread's loop before Impl's members go. The stop runs as a
  // handler, so once it ran no other handler runs (the thread is joined with `io`, last).
  auto stopped = std::make_shared<std::promise<void>>();
  asio::post(dying->ctx, [ctx = &dying->ctx, stopped] {
    ctx->stop();
    stopped->set_value();
  });
  stopped->get_future().wait_for(std::chrono::seconds(2));
  dying.reset();
}

Engine::Engine() : impl_(std::make_unique<Impl>()) {
  auto& cfg = config::global();
  timeout_ = cfg.duration("rdma.timeout");
  impl_->chunk = static_cast<size_t>(cfg.bytes("rdma.chunk_bytes"));
  impl_->streams = static_cast<uint32_t>(cfg.integer("rdma.streams"));
  impl_->copts.max_frame_bytes =
      std::max<size_t>(impl_->copts.max_frame_bytes, impl_->chunk + 4096);
  // Chunks are lent to the channel until acknowledged (reads: the owner's memory, writes: the
  // caller's span, whose transfer completes only then): by default each message is acknowledged
  // at once.
  impl_->copts.ack_every = static_cast<uint32_t>(cfg.integer("rdma.ack_every"));
  std::string listen = cfg.string("rdma.listen");
  if (listen.empty()) {
    listen = "unix://@monarch-rdma-" + std::to_string(::getpid()) + "-" + hex(impl_->incarnation);
  }
  try {
    impl_->listener = channel::Listener::serve(
        impl_->io, channel::ChannelAddr::parse(listen), impl_->copts,
        [impl = impl_.get()](Message&& m) { impl->on_message(std::move(m)); });
  } catch (const std::exception& e) {
    throw RdmaError(RdmaErrc::BackendUnavailable,
                    "rdma: data plane cannot listen on " + listen + " (rdma.listen): " + e.what());
  }
  impl_->addr = impl_->listener->bound_addr().to_string();

  std::string want = cfg.string("rdma.backend");
  if (want != "channel") {
    impl_->ucx = make_ucx_plane(impl_->status, impl_->ucx_why);
    if (!impl_->ucx) {
#ifdef MONARCH_HAVE_UCX
      constexpr bool built_with_ucx = true;
#else
      constexpr bool built_with_ucx = false;
#endif
      // Falling back warns, except for "auto" in a build without UCX (nothing was expected).
      if (want == "ucx" || built_with_ucx) {
        spdlog::warn("rdma: rdma.backend={} but UCX is unavailable ({}); using the channel backend",
                     want, impl_->ucx_why);
      } else {
        spdlog::info("rdma: UCX unavailable ({}); using the channel backend", impl_->ucx_why);
      }
    }
  }
  // The engine object is never deleted, but its threads must stop before the process's static
  // destructors run (they log through spdlog, whose registry is a static). Registered after the
  // IoRuntime created spdlog's registry, so this runs before the registry is destroyed.
  std::atexit([] { Engine::get().shutdown_at_exit(); });
}

size_t Engine::lent_replies() {
  std::shared_lock life(life_mu_);
  return impl_ ? impl_->lent_total->load() : 0;
}

std::string Engine::route_for(const RdmaHandle& h, bool write) {
  std::shared_lock life(life_mu_);
  if (!impl_) return "none (the process is exiting)";
  if (h.memory != MemoryKind::Host) {
    bool ucx =
        h.owner != impl_->addr && h.backend == Backend::Ucx && impl_->ucx && !h.ucx_routes.empty();
    return ucx ? "ucx"
               : std::string("none (") + memory_kind_name(h.memory) + " memory: ucx route only)";
  }
  if (h.owner == impl_->addr) return "in-process";
  if (config::global().flag("rdma.local_routes")) {
    std::string r = impl_->local.route(!write, h);
    if (!r.empty()) return r;
  }
  if (h.backend == Backend::Ucx && impl_->ucx && !h.ucx_routes.empty()) return "ucx";
  return "channel";
}

Backend Engine::backend() const {
  std::shared_lock life(life_mu_);
  return impl_ && impl_->ucx ? Backend::Ucx : Backend::Channel;
}

std::string Engine::transport() const {
  std::shared_lock life(life_mu_);
  if (!impl_) return "shut down";
  if (impl_->ucx) return impl_->ucx->transport();
  return impl_->addr + " x" + std::to_string(impl_->streams) + " streams";
}

std::vector<MemoryKind> Engine::memory_kinds() const {
  std::shared_lock life(life_mu_);
  return impl_ ? impl_->memory_kinds() : std::vector<MemoryKind>{MemoryKind::Host};
}

std::shared_ptr<Registration> Engine::register_memory(std::span<std::byte> memory,
                                                      const std::string& name, MemoryKind kind,
                                                      RdmaHandle& h, bool read_only) {
  std::shared_lock life(life_mu_);
  if (!impl_) {
    throw RdmaError(RdmaErrc::BackendUnavailable,
                    "rdma: cannot register buffer '" + name + "': the process is exiting");
  }
  if (memory.empty() || memory.data() == nullptr) {
    throw RdmaError(RdmaErrc::InvalidArgument,
                    "rdma: cannot register buffer '" + name + "': zero length");
  }
  auto kinds = impl_->memory_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    std::string have;
    for (MemoryKind k : kinds) have += std::string(have.empty() ? "" : ", ") + memory_kind_name(k);
    throw RdmaError(RdmaErrc::BackendUnavailable,
                    "rdma: cannot register buffer '" + name + "' of " + memory_kind_name(kind) +
                        " memory: it needs the ucx backend on a UCX built with " +
                        memory_kind_name(kind) + " support; this process can register: " + have +
                        " (" + impl_->ucx_state() + ")");
  }
  auto reg = std::make_shared<Registration>();
  reg->base = memory.data();
  reg->length = memory.size();
  reg->name = name;
  reg->kind = kind;
  reg->read_only = read_only;
  {
    std::lock_guard lock(impl_->reg_mu);
    reg->id = impl_->next_reg++;
  }
  return add(std::move(reg), h);
}

std::shared_ptr<Registration> Engine::allocate(size_t bytes, const std::string& name,
                                               RdmaHandle& h) {
  std::shared_lock life(life_mu_);
  if (!impl_) {
    throw RdmaError(RdmaErrc::BackendUnavailable,
                    "rdma: cannot allocate buffer '" + name + "': the process is exiting");
  }
  if (bytes == 0) {
    throw RdmaError(RdmaErrc::InvalidArgument,
                    "rdma: cannot allocate buffer '" + name + "': zero length");
  }
  auto reg = std::make_shared<Registration>();
  reg->name = name;
  {
    std::lock_guard lock(impl_->reg_mu);
    reg->id = impl_->next_reg++;
  }
  reg->shm = std::make_shared<ShmSegment>(bytes, reg->id, impl_->incarnation, name);
  reg->base = reg->shm->data();
  reg->length = bytes;
  return add(std::move(reg), h);
}

// life_mu_ held (shared) by the caller, impl_ set.
std::shared_ptr<Registration> Engine::add(std::shared_ptr<Registration> reg, RdmaHandle& h) {
  h = RdmaHandle{};
  h.name = reg->name;
  h.owner = impl_->addr;
  h.owner_incarnation = impl_->incarnation;
  h.reg_id = reg->id;
  h.address = reinterpret_cast<uintptr_t>(reg->base);
  h.length = reg->length;
  h.backend = Backend::Channel;
  reg->status = impl_->status.claim(reg->id, reg->length, impl_->incarnation, reg->name);
  h.status_address = reinterpret_cast<uintptr_t>(reg->status);
  h.memory = reg->kind;
  h.read_only = reg->read_only;
  if (reg->kind == MemoryKind::Host) {  // the CPU copies of the same-host routes: host memory only
    h.local.host = host_identity();
    h.local.pid = static_cast<int32_t>(::getpid());
    h.local.shm_fd = reg->shm ? reg->shm->fd() : -1;
  }
  if (impl_->ucx) {
    try {
      impl_->ucx->register_memory(*reg, h);
    } catch (...) {
      impl_->status.release(reg->status);
      throw;
    }
    h.backend = Backend::Ucx;
  }
  std::lock_guard lock(impl_->reg_mu);
  impl_->regs[reg->id] = reg;
  return reg;
}

void Engine::sync(Registration& reg) {
  {
    // Serving holds the registration's lock (shared); taking it exclusively orders this thread
    // after everything already served, and everything served later after this thread's past.
    std::unique_lock lock(reg.mu);
  }
  // Read replies are written from the memory after serving, until acknowledged: wait for them.
  std::shared_lock life(life_mu_);
  if (impl_) impl_->wait_unlent(reg, /*close_stragglers=*/false);
}

void Engine::drop(Registration& reg) {
  std::shared_lock life(life_mu_);
  if (!impl_) {  // after shutdown_at_exit: nothing serves the memory any more
    std::unique_lock lock(reg.mu);
    reg.dropped = true;
    if (reg.shm) reg.shm->revoke(std::chrono::milliseconds(100), reg.name);
    return;
  }
  {
    std::unique_lock lock(reg.mu);  // waits for transfers touching the memory (RD-3)
    if (reg.dropped) return;
    reg.dropped = true;
    impl_->status.release(reg.status);  // ucx and cma readers see the drop
    reg.status = nullptr;
    if (reg.shm) reg.shm->revoke(timeout_, reg.name);  // waits for same-host copies
    if (impl_->ucx) impl_->ucx->deregister(reg);
  }
  impl_->wait_unlent(reg);  // channel-route replies still sending from the memory
  std::lock_guard lock(impl_->reg_mu);
  impl_->regs.erase(reg.id);
  impl_->dropped[reg.id] = reg.name;
}

void Engine::start(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
                   std::chrono::milliseconds timeout, Done done) {
  std::shared_lock life(life_mu_);
  if (!impl_) {
    return done(make_error(RdmaErrc::BackendUnavailable, "rdma: transfer of " + h.describe() +
                                                             " started while the process exits"));
  }
  // Built only where needed: formatting it costs as much as a small same-host copy.
  auto what = [&] { return transfer_text(read, h, offset, size); };
  if (size == 0 || local == nullptr) {
    return done(make_error(RdmaErrc::InvalidArgument, what() + ": zero length"));
  }
  if (h.length == 0 || h.owner.empty()) {
    return done(make_error(RdmaErrc::UnknownBuffer, what() + ": empty handle"));
  }
  if (size > h.length || offset > h.length - size) {
    return done(make_error(RdmaErrc::OutOfBounds, what() + ": past the end of the " +
                                                      std::to_string(h.length) + " B buffer"));
  }
  if (!read && h.read_only) {
    return done(
        make_error(RdmaErrc::InvalidArgument,
                   what() + ": the buffer is registered read-only (RdmaBuffer::read_only)"));
  }
  if (timeout.count() < 0 || timeout > config::kMaxDuration) {
    return done(
        make_error(RdmaErrc::InvalidArgument,
                   what() + ": timeout " + std::to_string(timeout.count()) + " ms is outside [0, " +
                       std::to_string(config::kMaxDuration.count()) + "] ms (0: rdma.timeout)"));
  }
  if (timeout.count() == 0) timeout = timeout_;
  if (h.memory != MemoryKind::Host && !(h.owner != impl_->addr && h.backend == Backend::Ucx &&
                                        impl_->ucx && !h.ucx_routes.empty())) {
    return done(
        make_error(RdmaErrc::BackendUnavailable,
                   what() + ": the buffer is " + memory_kind_name(h.memory) +
                       " memory, which only the ucx route between two processes reaches (" +
                       (impl_->ucx ? std::string("the owner registered it without ucx routes")
                                   : impl_->ucx_state()) +
                       ")"));
  }

  // Same process: copy directly (still honouring drop, RD-3).
  if (h.owner == impl_->addr) {
    RdmaErrc code{};
    std::string why;
    auto reg = impl_->lookup(h.reg_id, h.owner_incarnation, code, why);
    if (!reg) return done(make_error(code, what() + ": " + why));
    {
      std::shared_lock lock(reg->mu);
      if (reg->dropped) {
        return done(make_error(RdmaErrc::Dropped, what() + ": buffer was dropped by its owner"));
      }
      if (size > reg->length || offset > reg->length - size) {
        return done(make_error(RdmaErrc::OutOfBounds, what() + ": past the end of the buffer"));
      }
      if (!read && reg->read_only) {
        return done(
            make_error(RdmaErrc::InvalidArgument, what() + ": the buffer is registered read-only"));
      }
      if (read) {
        std::memmove(local, reg->base + offset, size);
      } else {
        std::memmove(reg->base + offset, local, size);
      }
    }
    return done(nullptr);
  }

  // Same host: shm or cma, on this thread (local.hpp).
  if (config::global().flag("rdma.local_routes") &&
      impl_->local.run(read, h, local, size, offset, done) == LocalRoutes::Outcome::Done) {
    return;
  }

  if (h.backend == Backend::Ucx && impl_->ucx && !h.ucx_routes.empty()) {
    return impl_->ucx->start(read, h, local, size, offset, timeout, what(), std::move(done));
  }

  auto op = std::make_shared<Op>();
  op->read = read;
  op->h = h;
  op->local = local;
  op->size = size;
  op->offset = offset;
  // A transfer that would fill fewer chunks than there are links is cut evenly over the links
  // (4 KiB multiples, at least 256 KiB a chunk), so that a 4 MiB transfer uses both default
  // links: 5 alternating runs, 4 MiB read/write 0.72/0.68 -> 0.79/0.80 of the raw socket.
  constexpr size_t kMinSplitChunk = 256u << 10;
  const size_t even = ((size + impl_->streams - 1) / impl_->streams + 4095) / 4096 * 4096;
  op->chunk = std::min(impl_->chunk, std::max(even, kMinSplitChunk));
  op->nchunks = (size + op->chunk - 1) / op->chunk;
  op->what = what();
  op->done = std::move(done);
  op->timer = std::make_unique<asio::steady_timer>(impl_->ctx, timeout);
  std::vector<std::pair<uint32_t, Message>> out;
  {
    std::lock_guard lock(impl_->ops_mu);
    op->id = impl_->next_op++;
    impl_->ops[op->id] = op;
    size_t window = std::min<size_t>(op->nchunks, 2 * impl_->streams);
    for (size_t i = 0; i < window; ++i) {
      uint32_t stream = 0;
      Message m = impl_->chunk_message(op, op->next++, stream);
      out.emplace_back(stream, std::move(m));
    }
    op->timer->async_wait([impl = impl_.get(), id = op->id, timeout](const asio::error_code& ec) {
      if (ec) return;  // cancelled: the op finished
      impl->fail(id, RdmaErrc::Timeout,
                 "not complete after " + std::to_string(timeout.count()) +
                     " ms (owner dead, frozen or too slow?)");
    });
  }
  impl_->send_chunks(op, std::move(out));
}

}  // namespace detail

// ---- public API ----

namespace {

Future<void> run(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
                 TransferOptions o) {
  Promise<void> p;
  Future<void> f = p.get_future();
  auto shared = std::make_shared<Promise<void>>(std::move(p));
  try {
    auto& e = detail::Engine::get();
    e.start(read, h, local, size, offset, o.timeout, [shared](std::exception_ptr err) {
      if (err) {
        shared->set_error(err);
      } else {
        shared->set_value();
      }
    });
  } catch (...) {
    if (!shared->satisfied()) shared->set_error(std::current_exception());
  }
  return f;
}

}  // namespace

Future<void> RdmaHandle::read_into(std::span<std::byte> dst, uint64_t offset,
                                   TransferOptions opts) const {
  return run(true, *this, dst.data(), dst.size(), offset, opts);
}

Future<void> RdmaHandle::write_from(std::span<const std::byte> src, uint64_t offset,
                                    TransferOptions opts) const {
  // The engine never writes through `local` for a write.
  return run(false, *this, const_cast<std::byte*>(src.data()), src.size(), offset, opts);
}

RdmaBuffer::RdmaBuffer(std::span<std::byte> memory, std::string name, MemoryKind kind)
    : memory_(memory) {
  reg_ = detail::Engine::get().register_memory(memory, name, kind, handle_);
}

RdmaBuffer RdmaBuffer::read_only(std::span<const std::byte> memory, std::string name,
                                 MemoryKind kind) {
  RdmaBuffer b;
  // The engine writes into `memory` only for peers' writes, which this registration refuses.
  b.memory_ = std::span<std::byte>(const_cast<std::byte*>(memory.data()), memory.size());
  b.reg_ = detail::Engine::get().register_memory(b.memory_, name, kind, b.handle_, true);
  return b;
}

RdmaBuffer RdmaBuffer::allocate(size_t bytes, std::string name) {
  RdmaBuffer b;
  auto reg = detail::Engine::get().allocate(bytes, name, b.handle_);
  b.memory_ = std::span<std::byte>(reg->base, reg->length);
  b.storage_ = reg->shm;
  b.reg_ = std::move(reg);
  return b;
}

RdmaBuffer::RdmaBuffer(RdmaBuffer&& o) noexcept
    : memory_(o.memory_),
      reg_(std::move(o.reg_)),
      storage_(std::move(o.storage_)),
      handle_(std::move(o.handle_)) {
  o.reg_ = nullptr;
  o.memory_ = {};
}

RdmaBuffer& RdmaBuffer::operator=(RdmaBuffer&& o) noexcept {
  if (this != &o) {
    drop();
    memory_ = o.memory_;
    reg_ = std::move(o.reg_);
    storage_ = std::move(o.storage_);
    handle_ = std::move(o.handle_);
    o.reg_ = nullptr;
    o.memory_ = {};
  }
  return *this;
}

RdmaBuffer::~RdmaBuffer() {
  drop();
}

RdmaHandle RdmaBuffer::handle() const {
  if (!reg_) {
    throw RdmaError(RdmaErrc::Dropped, "rdma: buffer " + handle_.describe() + " was dropped");
  }
  return handle_;
}

void RdmaBuffer::sync() const {
  if (!reg_) return;
  detail::Engine::get().sync(*static_cast<detail::Registration*>(reg_.get()));
}

void RdmaBuffer::drop() {
  if (!reg_) return;
  detail::Engine::get().drop(*static_cast<detail::Registration*>(reg_.get()));
  reg_ = nullptr;
}

RdmaBatch& RdmaBatch::read_into(const RdmaHandle& h, std::span<std::byte> dst, uint64_t offset) {
  actions_.push_back(Action{true, h, dst.data(), dst.size(), offset});
  return *this;
}

RdmaBatch& RdmaBatch::write_from(const RdmaHandle& h, std::span<const std::byte> src,
                                 uint64_t offset) {
  actions_.push_back(Action{false, h, const_cast<std::byte*>(src.data()), src.size(), offset});
  return *this;
}

Future<void> RdmaBatch::submit(TransferOptions opts) {
  if (actions_.empty()) return Future<void>::ready_value();
  struct State {
    std::mutex mu;
    size_t left;
    std::exception_ptr first;
    Promise<void> promise;
  };
  auto st = std::make_shared<State>();
  st->left = actions_.size();
  Future<void> f = st->promise.get_future();
  auto actions = std::move(actions_);
  actions_.clear();
  for (auto& a : actions) {
    detail::Done done = [st](std::exception_ptr err) {
      std::unique_lock lock(st->mu);
      if (err && !st->first) st->first = err;
      if (--st->left != 0) return;
      auto first = st->first;
      lock.unlock();
      if (first) {
        st->promise.set_error(first);
      } else {
        st->promise.set_value();
      }
    };
    try {
      detail::Engine::get().start(a.read, a.handle, a.local, a.size, a.offset, opts.timeout, done);
    } catch (...) {
      done(std::current_exception());
    }
  }
  return f;
}

std::string active_backend() {
  return backend_name(detail::Engine::get().backend());
}
std::vector<MemoryKind> supported_memory_kinds() {
  return detail::Engine::get().memory_kinds();
}
std::string active_transport() {
  return detail::Engine::get().transport();
}
std::string route_for(const RdmaHandle& h, bool write) {
  return detail::Engine::get().route_for(h, write);
}

}  // namespace monarch::rdma
