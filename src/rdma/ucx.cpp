// The ucx route: one-sided ucp_get_nbx / ucp_put_nbx on memory registered with ucp_mem_map.
//
// One UCP context and worker with UCP_FEATURE_WAKEUP, driven by this file's own I/O thread: it
// sleeps on the worker's event fd (ucp_worker_get_efd + ucp_worker_arm) in an asio loop and
// progresses when woken, so an owner serves emulated RMA (tcp) without polling.
//
// Why no shared-memory plane (measured with Debian's UCX 1.13.1): WAKEUP excludes the transports
// that cannot signal (cma, posix, sysv). A second context without WAKEUP selects cma only as an
// rma_bw lane when AM/TAG is enabled too (openucx/ucx#8537, fixed in 1.14), and ucp_get_nbx on
// user memory then still runs as AM-emulated bcopy over posix/sysv, which needs the owner to
// progress (polling) and reached 0.2-1 GB/s. So handles carry a list of routes (kind 2 = network
// today), ready for a shared-memory route once UCX uses cma for RMA.
//
// Drop and bounds (RD-3, RD-4): the owner keeps a status entry per registration in a registered
// table (the engine's StatusTable, local.hpp, shared with the cma route): {reg_id, length, ...}
// while registered, {0, 0, ...} after drop. Shared-memory transports do not
// check bounds or revoke access themselves, so every transfer first gets the entry and checks the
// registration and the range against it; a read gets the entry again after its data and fails
// with Dropped if it changed. (A write that races drop() on another thread can still land: on
// shared memory nothing revokes the mapping; docs/data-plane.md.)
//
// Timeouts (RD-2): at the deadline the transfer fails and its endpoint is force-closed, which
// cancels every request on it, so the caller's span is not touched afterwards.
#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/debug.h>

#include <asio.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine.hpp"
#include "monarch/config/config.hpp"

namespace monarch::rdma::detail {
namespace {

constexpr uint8_t kNet = 2;

std::exception_ptr make_error(RdmaErrc c, const std::string& what) {
  return std::make_exception_ptr(RdmaError(c, what));
}

std::string key_of(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

bool fail(std::string& why, std::string text) {
  why = std::move(text);
  return false;
}

struct Peer {
  ucp_ep_h ep = nullptr;
  bool failed = false;
  std::string why;
  std::map<std::string, ucp_rkey_h> rkeys;  // packed rkey bytes -> unpacked
};

struct Plane {
  uint8_t kind = 0;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<std::byte> worker_address;
  std::unique_ptr<asio::posix::stream_descriptor> efd;
  ucp_mem_h status_memh = nullptr;
  std::vector<std::byte> status_rkey;
  std::map<std::string, std::shared_ptr<Peer>> peers;  // I/O thread only
  size_t inflight = 0;                                 // requests not yet completed
  std::string tls;
  std::string lanes;  // guarded by Ucx::info_mu_

  bool init(uint8_t k, const std::string& want_tls, std::string& why) {
    kind = k;
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK)
      return fail(why, "ucp_config_read failed");
    tls = want_tls;
    if (!tls.empty() && ucp_config_modify(cfg, "TLS", tls.c_str()) != UCS_OK) {
      ucp_config_release(cfg);
      return fail(why, "UCX rejects transports '" + tls + "' (rdma.ucx_tls)");
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    ucs_status_t st = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return fail(why, std::string("ucp_init: ") + ucs_status_string(st));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(ctx, &wp, &worker);
    if (st != UCS_OK) return fail(why, std::string("ucp_worker_create: ") + ucs_status_string(st));
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker, &addr, &len);
    if (st != UCS_OK)
      return fail(why, std::string("ucp_worker_get_address: ") + ucs_status_string(st));
    auto* b = reinterpret_cast<std::byte*>(addr);
    worker_address.assign(b, b + len);
    ucp_worker_release_address(worker, addr);
    return true;
  }

  bool map(void* base, size_t len, ucp_mem_h& memh, std::vector<std::byte>& rkey, std::string& why,
           MemoryKind memory = MemoryKind::Host) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = len;
    if (memory != MemoryKind::Host) {  // device memory: say so rather than let UCX guess
      mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      mp.memory_type = memory == MemoryKind::Cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_ROCM;
    }
    ucs_status_t st = ucp_mem_map(ctx, &mp, &memh);
    if (st != UCS_OK) return fail(why, std::string("ucp_mem_map: ") + ucs_status_string(st));
    void* buf = nullptr;
    size_t n = 0;
    st = ucp_rkey_pack(ctx, memh, &buf, &n);
    if (st != UCS_OK) {
      ucp_mem_unmap(ctx, memh);
      return fail(why, std::string("ucp_rkey_pack: ") + ucs_status_string(st));
    }
    rkey.assign(static_cast<std::byte*>(buf), static_cast<std::byte*>(buf) + n);
    ucp_rkey_buffer_release(buf);
    return true;
  }
};

/// One asynchronous step: continuation called once with the request's status.
struct Step {
  Plane* plane;
  std::function<void(ucs_status_t)> k;
};

void step_cb(void* request, ucs_status_t status, void* user_data) {
  auto* s = static_cast<Step*>(user_data);
  auto k = std::move(s->k);
  --s->plane->inflight;
  delete s;
  ucp_request_free(request);
  k(status);
}

/// The endpoint's lanes ("#   lane[0]:  2:tcp/lo.0 md[1] -> ... am am_bw#0"), as "tcp/lo.0,...".
std::string rma_lanes(ucp_ep_h ep) {
  char* text = nullptr;
  size_t n = 0;
  FILE* f = open_memstream(&text, &n);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string all(text, n);
  std::free(text);
  std::string out;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    std::string line = all.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? all.size() : nl + 1;
    size_t lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    size_t colon = line.find(':', lane);
    if (colon == std::string::npos) continue;
    size_t a = line.find_first_not_of(' ', colon + 1);
    if (a == std::string::npos) continue;
    size_t b = line.find(' ', a);
    std::string tl = line.substr(a, b - a);  // "8:cma/memory.0"
    size_t c = tl.find(':');
    if (c != std::string::npos) tl = tl.substr(c + 1);
    if (out.find(tl) == std::string::npos) out += (out.empty() ? "" : ",") + tl;
  }
  return out;
}

class Ucx final : public UcxPlane {
 public:
  Ucx() = default;
  ~Ucx() override {  // at exit, after shutdown(); UCX objects are left to the process's end
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  bool init(StatusTable& status, std::string& why) {
    std::string tls = config::global().string("rdma.ucx_tls");
    if (tls.empty() && std::getenv("UCX_TLS") != nullptr) tls = std::getenv("UCX_TLS");
    auto net = std::make_unique<Plane>();
    if (!net->init(kNet, tls, why)) return false;
    int fd = -1;
    ucs_status_t st = ucp_worker_get_efd(net->worker, &fd);
    if (st != UCS_OK) return fail(why, std::string("ucp_worker_get_efd: ") + ucs_status_string(st));
    net->efd = std::make_unique<asio::posix::stream_descriptor>(io_, ::dup(fd));
    planes_.push_back(std::move(net));

    // The engine's status table (see the file comment), registered on every plane.
    for (auto& pl : planes_) {
      if (!pl->map(status.base(), status.bytes(), pl->status_memh, pl->status_rkey, why)) {
        return false;
      }
    }
    guard_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
    for (auto& pl : planes_) {
      if (pl->efd) asio::post(io_, [this, p = pl.get()] { progress_and_wait(*p); });
    }
    return true;
  }

  void register_memory(Registration& reg, RdmaHandle& h) override {
    h.ucx_routes.clear();
    for (size_t i = 0; i < planes_.size(); ++i) {
      Plane& pl = *planes_[i];
      std::string why;
      UcxRoute r;
      ucp_mem_h memh = nullptr;
      if (!pl.map(reg.base, reg.length, memh, r.rkey, why, reg.kind)) {
        unmap(reg);
        throw RdmaError(RdmaErrc::BackendUnavailable,
                        "rdma: cannot register buffer '" + reg.name + "' with UCX: " + why);
      }
      reg.ucx_memh[i] = memh;
      r.kind = pl.kind;
      r.worker_address = pl.worker_address;
      r.status_rkey = pl.status_rkey;
      h.ucx_routes.push_back(std::move(r));
    }
    // h.status_address: the engine's entry for reg, published before this call.
  }

  void deregister(Registration& reg) override {  // reg.mu held exclusively, status cleared
    unmap(reg);
  }

  void start(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
             std::chrono::milliseconds timeout, std::string what, Done done) override {
    auto op = std::make_shared<Op>();
    op->read = read;
    op->h = h;
    op->local = local;
    op->size = size;
    op->offset = offset;
    op->what = std::move(what);
    op->done = std::move(done);
    op->timer = std::make_unique<asio::steady_timer>(io_, timeout);
    asio::post(io_, [this, op, timeout] {
      op->timer->async_wait([this, op, timeout](const asio::error_code& ec) {
        if (ec || op->finished) return;
        finish(*op, make_error(RdmaErrc::Timeout, op->what + ": not complete after " +
                                                      std::to_string(timeout.count()) +
                                                      " ms (owner dead, frozen or too slow?)"));
        if (op->plane != nullptr) close_peer(*op->plane, op->peer);
      });
      begin(op);
    });
  }

  void shutdown() override {
    auto done = std::make_shared<std::promise<void>>();
    auto f = done->get_future();
    asio::post(io_, [this, done] {
      io_.stop();
      done->set_value();
    });
    f.wait_for(std::chrono::seconds(2));
  }

  uint32_t memory_kinds() const override {
    uint32_t kinds = 1u << static_cast<int>(MemoryKind::Host);
    const std::pair<ucs_memory_type_t, MemoryKind> device[] = {
        {UCS_MEMORY_TYPE_CUDA, MemoryKind::Cuda}, {UCS_MEMORY_TYPE_ROCM, MemoryKind::Rocm}};
    for (auto [type, kind] : device) {
      bool all = !planes_.empty();
      for (const auto& pl : planes_) {
        ucp_context_attr_t a{};
        a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
        all = all && ucp_context_query(pl->ctx, &a) == UCS_OK &&
              (a.memory_types & UCS_BIT(type)) != 0;
      }
      if (all) kinds |= 1u << static_cast<int>(kind);
    }
    return kinds;
  }

  std::string transport() const override {
    std::lock_guard lock(info_mu_);
    std::string out = std::string("ucx ") + ucp_get_version_string();
    for (const auto& pl : planes_) {
      out += "; net";
      out += " tls=" + (pl->tls.empty() ? std::string("default") : pl->tls);
      if (!pl->lanes.empty()) out += " lanes=" + pl->lanes;
    }
    return out;
  }

 private:
  struct Op {
    bool read = true;
    RdmaHandle h;
    std::byte* local = nullptr;
    size_t size = 0;
    uint64_t offset = 0;
    std::string what;
    Done done;
    std::unique_ptr<asio::steady_timer> timer;
    Plane* plane = nullptr;
    const UcxRoute* route = nullptr;  // into h.ucx_routes
    std::shared_ptr<Peer> peer;
    uint64_t status[2] = {0, 0};  // the owner's {reg_id, length}
    bool finished = false;
  };

  void unmap(Registration& reg) {
    for (size_t i = 0; i < planes_.size(); ++i) {
      if (reg.ucx_memh[i] == nullptr) continue;
      ucp_mem_unmap(planes_[i]->ctx, static_cast<ucp_mem_h>(reg.ucx_memh[i]));
      reg.ucx_memh[i] = nullptr;
    }
  }

  // ---- on the I/O thread from here on ----

  /// net plane: progress, then sleep on the event fd until the transports signal.
  void progress_and_wait(Plane& pl) {
    while (ucp_worker_progress(pl.worker) != 0) {
    }
    ucs_status_t st = ucp_worker_arm(pl.worker);
    if (st == UCS_ERR_BUSY) {  // events arrived meanwhile: progress again, after other handlers
      asio::post(io_, [this, p = &pl] { progress_and_wait(*p); });
      return;
    }
    pl.efd->async_wait(asio::posix::stream_descriptor::wait_read,
                       [this, p = &pl](const asio::error_code& ec) {
                         if (ec) {
                           spdlog::error("rdma: UCX event fd wait failed: {}", ec.message());
                           return;
                         }
                         progress_and_wait(*p);
                       });
  }

  /// After posting work: drain once now (the event fd wakes the loop for what comes later).
  void kick(Plane& pl) {
    asio::post(io_, [p = &pl] {
      while (ucp_worker_progress(p->worker) != 0) {
      }
    });
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->failed = true;
    peer->why = std::string("endpoint failed: ") + ucs_status_string(status);
  }

  std::shared_ptr<Peer> peer_for(Plane& pl, const UcxRoute& r, std::string& why) {
    std::string key = key_of(r.worker_address);
    auto it = pl.peers.find(key);
    if (it != pl.peers.end() && !it->second->failed) return it->second;
    if (it != pl.peers.end()) close_peer(pl, it->second);
    auto peer = std::make_shared<Peer>();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(r.worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead owner fails its requests (tcp reset)
    ep.err_handler.cb = &Ucx::on_ep_error;
    ep.err_handler.arg = peer.get();
    ucs_status_t st = ucp_ep_create(pl.worker, &ep, &peer->ep);
    if (st != UCS_OK) {
      why = std::string("ucp_ep_create: ") + ucs_status_string(st);
      return nullptr;
    }
    pl.peers[key] = peer;
    std::string lanes = rma_lanes(peer->ep);
    std::lock_guard lock(info_mu_);
    pl.lanes = lanes;
    return peer;
  }

  void close_peer(Plane& pl, const std::shared_ptr<Peer>& peer) {
    if (!peer || peer->ep == nullptr) return;
    for (auto& [k, rk] : peer->rkeys) ucp_rkey_destroy(rk);
    peer->rkeys.clear();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // cancels every request on it (RD-2)
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
    peer->ep = nullptr;
    peer->failed = true;
    for (auto it = pl.peers.begin(); it != pl.peers.end(); ++it) {
      if (it->second == peer) {
        pl.peers.erase(it);
        break;
      }
    }
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(pl.worker);
      ucp_request_free(r);
    }
  }

  ucp_rkey_h rkey_for(Peer& peer, const std::vector<std::byte>& packed, std::string& why) {
    std::string key = key_of(packed);
    auto it = peer.rkeys.find(key);
    if (it != peer.rkeys.end()) return it->second;
    ucp_rkey_h rk = nullptr;
    ucs_status_t st = ucp_ep_rkey_unpack(peer.ep, packed.data(), &rk);
    if (st != UCS_OK) {
      why = std::string("ucp_ep_rkey_unpack: ") + ucs_status_string(st);
      return nullptr;
    }
    peer.rkeys[key] = rk;
    return rk;
  }

  void finish(Op& op, std::exception_ptr err) {
    if (op.finished) return;
    op.finished = true;
    op.timer.reset();
    auto done = std::move(op.done);
    done(err);
  }

  /// Runs `call(param)` (a ucp_*_nbx) and continues with k(status), now or on completion.
  template <class Call>
  void issue(Plane& pl, Call call, std::function<void(ucs_status_t)> k) {
    auto* step = new Step{&pl, std::move(k)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &step_cb;
    p.user_data = step;
    ucs_status_ptr_t r = call(&p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      auto k2 = std::move(step->k);
      delete step;
      k2(r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
      return;
    }
    ++pl.inflight;
    kick(pl);
  }

  bool check(Op& op, ucs_status_t st, const char* stage) {
    if (op.finished) return false;
    if (st == UCS_OK && op.peer->ep != nullptr) return true;
    if (st == UCS_OK) st = UCS_ERR_CANCELED;  // its endpoint was closed by another transfer
    std::string why = std::string(stage) + ": " + ucs_status_string(st);
    if (op.peer->failed && !op.peer->why.empty()) why += " (" + op.peer->why + ")";
    finish(op, make_error(RdmaErrc::OwnerUnreachable, op.what + ": owner unreachable: " + why));
    return false;
  }

  void check_status(const std::shared_ptr<Op>& op, ucp_rkey_h srk, std::function<void()> then) {
    issue(
        *op->plane,
        [&](const ucp_request_param_t* p) {
          return ucp_get_nbx(op->peer->ep, op->status, sizeof op->status, op->h.status_address, srk,
                             p);
        },
        [this, op, then = std::move(then)](ucs_status_t st) {
          if (!check(*op, st, "status get")) return;
          if (op->status[0] != op->h.reg_id) {
            return finish(*op, make_error(RdmaErrc::Dropped, op->what + ": buffer '" + op->h.name +
                                                                 "' was dropped by its owner"));
          }
          uint64_t len = op->status[1];
          if (op->size > len || op->offset > len - op->size) {
            return finish(
                *op, make_error(RdmaErrc::OutOfBounds, op->what + ": past the end of the owner's " +
                                                           std::to_string(len) + " B buffer"));
          }
          then();
        });
  }

  void begin(const std::shared_ptr<Op>& op) {
    if (op->finished) return;
    std::string why;
    for (const auto& r : op->h.ucx_routes) {  // best route first; unreachable ones are skipped
      for (auto& pl : planes_) {
        if (op->peer || pl->kind != r.kind) continue;
        std::string w;
        op->peer = peer_for(*pl, r, w);
        if (op->peer) {
          op->plane = pl.get();
          op->route = &r;
        } else {
          why += (why.empty() ? "" : "; ") + w;
        }
      }
    }
    if (!op->peer) {
      return finish(
          *op, make_error(RdmaErrc::OwnerUnreachable, op->what + ": no UCX route to the owner: " +
                                                          (why.empty() ? "no common plane" : why)));
    }
    ucp_rkey_h rk = rkey_for(*op->peer, op->route->rkey, why);
    ucp_rkey_h srk = rk ? rkey_for(*op->peer, op->route->status_rkey, why) : nullptr;
    if (!rk || !srk) {
      return finish(*op, make_error(RdmaErrc::UnknownBuffer, op->what + ": " + why));
    }
    uint64_t remote = op->h.address + op->offset;
    check_status(op, srk, [this, op, rk, srk, remote] {
      if (op->read) return read_data(op, rk, srk, remote);
      write_data(op, rk, remote);
    });
  }

  void read_data(const std::shared_ptr<Op>& op, ucp_rkey_h rk, ucp_rkey_h srk, uint64_t remote) {
    issue(
        *op->plane,
        [&](const ucp_request_param_t* p) {
          return ucp_get_nbx(op->peer->ep, op->local, op->size, remote, rk, p);
        },
        [this, op, srk](ucs_status_t st) {
          if (!check(*op, st, "ucp_get_nbx")) return;
          check_status(op, srk, [this, op] { finish(*op, nullptr); });  // dropped meanwhile?
        });
  }

  void write_data(const std::shared_ptr<Op>& op, ucp_rkey_h rk, uint64_t remote) {
    issue(
        *op->plane,
        [&](const ucp_request_param_t* p) {
          return ucp_put_nbx(op->peer->ep, op->local, op->size, remote, rk, p);
        },
        [this, op](ucs_status_t st) {
          if (!check(*op, st, "ucp_put_nbx")) return;
          // Put completion only means our buffer is reusable: flush for remote completion.
          issue(
              *op->plane,
              [&](const ucp_request_param_t* p) { return ucp_ep_flush_nbx(op->peer->ep, p); },
              [this, op](ucs_status_t st2) {
                if (!check(*op, st2, "ucp_ep_flush_nbx")) return;
                finish(*op, nullptr);
              });
        });
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
  std::thread thread_;
  std::vector<std::unique_ptr<Plane>> planes_;  // fixed after init; index = Registration::ucx_memh

  mutable std::mutex info_mu_;
};

// libucs's load-time constructor takes process-wide signals (Debian's UCX 1.13 defaults:
// UCX_DEBUG_SIGNO=HUP, UCX_ERROR_SIGNALS=ILL,SEGV,BUS,FPE). Its SIGHUP handler only raises UCX's
// log level, so a hang-up (a closed terminal, a dropped ssh session) no longer ended a client or
// its workers; its error handlers print UCX's backtrace in place of the process's own (Python's
// faulthandler, a sanitizer's). A transport must not change a process's signal dispositions: each
// handler that lives in libucs is given back (ucs_debug_disable_signal restores the one it saved).
// Runs once, at load (below): ucp_init installs no signal handlers (rdma_test_ucx checks the
// handlers after the backend started).
void give_back_signals_ucx_took() {
  for (int sig : {SIGHUP, SIGILL, SIGSEGV, SIGBUS, SIGFPE}) {
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    void* handler = (sa.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(sa.sa_sigaction)
                                                    : reinterpret_cast<void*>(sa.sa_handler);
    if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) continue;
    Dl_info info{};
    if (dladdr(handler, &info) != 0 && info.dli_fname != nullptr &&
        std::strstr(info.dli_fname, "libucs") != nullptr) {
      ucs_debug_disable_signal(sig);
    }
  }
}

[[maybe_unused]] const bool signals_given_back_at_load = (give_back_signals_ucx_took(), true);

}  // namespace

std::unique_ptr<UcxPlane> make_ucx_plane(StatusTable& status, std::string& why) {
  auto u = std::make_unique<Ucx>();
  if (!u->init(status, why)) return nullptr;
  return u;
}

}  // namespace monarch::rdma::detail
