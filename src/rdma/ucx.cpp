// The ucx route: one-sided ucp_get_nbx / ucp_put_nbx on memory registered with ucp_mem_map.
//
// Threads: the UCP context is shared (mt_workers_shared), so registration runs on the caller's
// thread; the single worker is only touched on this plane's own I/O thread, which sleeps on the
// worker's event fd (ucp_worker_get_efd + ucp_worker_arm) inside an asio loop: no busy polling.
//
// Drop and bounds (RD-3, RD-4): the owner keeps a status entry per registration in a registered
// table: {reg_id, length} while registered, {0, 0} after drop. Shared-memory transports (cma, sm)
// do not check bounds or revoke access themselves, so every transfer first gets the entry and
// checks the registration and the range against it; a read gets the entry again after its data
// and fails with Dropped if it changed. (A write that races drop() on
// another thread can still land: on shared memory nothing revokes the mapping; docs/data-plane.md.)
//
// Timeouts (RD-2): at the deadline the transfer fails and its endpoint is force-closed, which
// cancels every request on it, so the caller's span is not touched afterwards.
#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>

#include <asio.hpp>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <optional>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "engine.hpp"
#include "monarch/config/config.hpp"

namespace monarch::rdma::detail {
namespace {

constexpr size_t kSlots = 1 << 16;

std::exception_ptr make_error(RdmaErrc c, const std::string& what) {
  return std::make_exception_ptr(RdmaError(c, what));
}

std::string key_of(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

/// One asynchronous step: continuation called once with the request's status.
struct Step {
  std::function<void(ucs_status_t)> k;
};

void step_cb(void* request, ucs_status_t status, void* user_data) {
  auto* s = static_cast<Step*>(user_data);
  auto k = std::move(s->k);
  delete s;
  ucp_request_free(request);
  k(status);
}

class Ucx final : public UcxPlane {
 public:
  Ucx() = default;
  ~Ucx() override = default;  // never destroyed in practice (the Engine is immortal)

  bool init(std::string& why) {
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return fail(why, "ucp_config_read failed");
    std::string tls = config::global().string("rdma.ucx_tls");
    if (!tls.empty() && ucp_config_modify(cfg, "TLS", tls.c_str()) != UCS_OK) {
      ucp_config_release(cfg);
      return fail(why, "bad rdma.ucx_tls '" + tls + "'");
    }
    tls_ = !tls.empty() ? tls : (std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "default");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    ucs_status_t st = ucp_init(&p, cfg, &ctx_);
    ucp_config_release(cfg);
    if (st != UCS_OK) return fail(why, std::string("ucp_init: ") + ucs_status_string(st));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(ctx_, &wp, &worker_);
    if (st != UCS_OK) return fail(why, std::string("ucp_worker_create: ") + ucs_status_string(st));
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) return fail(why, std::string("ucp_worker_get_address: ") + ucs_status_string(st));
    worker_address_.assign(reinterpret_cast<std::byte*>(addr), reinterpret_cast<std::byte*>(addr) + len);
    ucp_worker_release_address(worker_, addr);
    int fd = -1;
    st = ucp_worker_get_efd(worker_, &fd);
    if (st != UCS_OK) return fail(why, std::string("ucp_worker_get_efd: ") + ucs_status_string(st));
    efd_ = std::make_unique<asio::posix::stream_descriptor>(io_, ::dup(fd));

    // The status table (see the file comment).
    slots_.assign(2 * kSlots, 0);
    for (size_t i = kSlots; i-- > 1;) free_slots_.push_back(i);
    if (!map(slots_.data(), slots_.size() * sizeof(uint64_t), status_memh_, status_rkey_, why)) {
      return false;
    }

    guard_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
    asio::post(io_, [this] { progress_and_wait(); });
    return true;
  }

  void register_memory(Registration& reg, RdmaHandle& h) override {
    std::string why;
    std::vector<std::byte> rkey;
    ucp_mem_h memh = nullptr;
    if (!map(reg.base, reg.length, memh, rkey, why)) {
      throw RdmaError(RdmaErrc::BackendUnavailable,
                      "rdma: cannot register buffer '" + reg.name + "' with UCX: " + why);
    }
    {
      std::lock_guard lock(slot_mu_);
      if (free_slots_.empty()) {
        ucp_mem_unmap(ctx_, memh);
        throw RdmaError(RdmaErrc::BackendUnavailable,
                        "rdma: cannot register buffer '" + reg.name + "': more than " +
                            std::to_string(kSlots - 1) + " registrations live");
      }
      reg.ucx_slot = free_slots_.back();
      free_slots_.pop_back();
    }
    std::atomic_ref<uint64_t>(slots_[2 * reg.ucx_slot + 1]).store(reg.length, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(slots_[2 * reg.ucx_slot]).store(reg.id, std::memory_order_release);
    reg.ucx_memh = memh;
    h.rkey = std::move(rkey);
    h.worker_address = worker_address_;
    h.status_address = reinterpret_cast<uintptr_t>(&slots_[2 * reg.ucx_slot]);
    h.status_rkey = status_rkey_;
  }

  void deregister(Registration& reg) override {  // reg.mu held exclusively
    std::atomic_ref<uint64_t>(slots_[2 * reg.ucx_slot]).store(0, std::memory_order_release);
    std::atomic_ref<uint64_t>(slots_[2 * reg.ucx_slot + 1]).store(0, std::memory_order_relaxed);
    ucp_mem_unmap(ctx_, static_cast<ucp_mem_h>(reg.ucx_memh));
    reg.ucx_memh = nullptr;
    std::lock_guard lock(slot_mu_);
    free_slots_.push_back(reg.ucx_slot);
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
        close_peer(op->peer, "transfer timed out");
      });
      begin(op);
    });
  }

  std::string transport() const override {
    std::lock_guard lock(info_mu_);
    return std::string("ucx ") + ucp_get_version_string() + " tls=" + tls_ +
           (lanes_.empty() ? "" : " lanes: " + lanes_);
  }

 private:
  struct Peer {
    ucp_ep_h ep = nullptr;
    bool failed = false;
    std::string why;
    std::map<std::string, ucp_rkey_h> rkeys;  // packed rkey bytes -> unpacked
  };
  struct Op {
    bool read = true;
    RdmaHandle h;
    std::byte* local = nullptr;
    size_t size = 0;
    uint64_t offset = 0;
    std::string what;
    Done done;
    std::unique_ptr<asio::steady_timer> timer;
    std::shared_ptr<Peer> peer;
    uint64_t status[2] = {0, 0};  // the owner's {reg_id, length}
    bool finished = false;
  };

  static bool fail(std::string& why, std::string text) {
    why = std::move(text);
    return false;
  }

  bool map(void* base, size_t len, ucp_mem_h& memh, std::vector<std::byte>& rkey, std::string& why) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = len;
    ucs_status_t st = ucp_mem_map(ctx_, &mp, &memh);
    if (st != UCS_OK) return fail(why, std::string("ucp_mem_map: ") + ucs_status_string(st));
    void* buf = nullptr;
    size_t n = 0;
    st = ucp_rkey_pack(ctx_, memh, &buf, &n);
    if (st != UCS_OK) {
      ucp_mem_unmap(ctx_, memh);
      return fail(why, std::string("ucp_rkey_pack: ") + ucs_status_string(st));
    }
    rkey.assign(static_cast<std::byte*>(buf), static_cast<std::byte*>(buf) + n);
    ucp_rkey_buffer_release(buf);
    return true;
  }

  // ---- on the I/O thread from here on ----

  void progress_and_wait() {
    while (ucp_worker_progress(worker_) != 0) {
    }
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) {  // events arrived meanwhile: progress again, later in this loop
      asio::post(io_, [this] { progress_and_wait(); });
      return;
    }
    efd_->async_wait(asio::posix::stream_descriptor::wait_read, [this](const asio::error_code& ec) {
      if (ec) {
        spdlog::error("rdma: UCX event fd wait failed: {}", ec.message());
        return;
      }
      progress_and_wait();
    });
  }

  /// Kicks progress after posting work (the event fd only reports remote/transport events).
  void kick() { asio::post(io_, [this] { while (ucp_worker_progress(worker_) != 0) {} }); }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->failed = true;
    peer->why = std::string("endpoint failed: ") + ucs_status_string(status);
  }

  std::shared_ptr<Peer> peer_for(const RdmaHandle& h, std::string& why) {
    std::string key = key_of(h.worker_address);
    auto it = peers_.find(key);
    if (it != peers_.end() && !it->second->failed) return it->second;
    if (it != peers_.end()) close_peer(it->second, "endpoint failed");
    auto peer = std::make_shared<Peer>();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(h.worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Ucx::on_ep_error;
    ep.err_handler.arg = peer.get();
    ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
    if (st != UCS_OK) {
      why = std::string("ucp_ep_create: ") + ucs_status_string(st);
      return nullptr;
    }
    peers_[key] = peer;
    record_lanes(peer->ep);
    return peer;
  }

  void record_lanes(ucp_ep_h ep) {
    char* text = nullptr;
    size_t n = 0;
    FILE* f = open_memstream(&text, &n);
    if (f == nullptr) return;
    ucp_ep_print_info(ep, f);
    std::fclose(f);
    std::string all(text, n);
    std::free(text);
    // Lines like "#   lane[1]:  8:cma/memory.0 md[3]           rma_bw#0 ..."; keep the rma ones.
    std::string out;
    size_t pos = 0;
    while (pos < all.size()) {
      size_t nl = all.find('\n', pos);
      std::string line = all.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? all.size() : nl + 1;
      if (line.find("rma") == std::string::npos || line.find("lane[") == std::string::npos) continue;
      size_t colon = line.find(':', line.find("lane["));
      if (colon == std::string::npos) continue;
      std::string rest = line.substr(colon + 1);
      size_t a = rest.find_first_not_of(' ');
      size_t b = rest.find(' ', a);
      if (a == std::string::npos) continue;
      if (!out.empty()) out += ",";
      out += rest.substr(a, b - a);
    }
    std::lock_guard lock(info_mu_);
    lanes_ = out;
  }

  void close_peer(const std::shared_ptr<Peer>& peer, const std::string&) {
    if (!peer || peer->ep == nullptr) return;
    for (auto& [k, rk] : peer->rkeys) ucp_rkey_destroy(rk);
    peer->rkeys.clear();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // cancels every request on it (RD-2)
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
    peer->ep = nullptr;
    peer->failed = true;
    for (auto it = peers_.begin(); it != peers_.end(); ++it) {
      if (it->second == peer) {
        peers_.erase(it);
        break;
      }
    }
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
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
  void issue(Call call, std::function<void(ucs_status_t)> k) {
    auto* step = new Step{std::move(k)};
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
    kick();
  }

  bool check(Op& op, ucs_status_t st, const char* stage) {
    if (op.finished) return false;
    if (st == UCS_OK && op.peer->ep != nullptr) return true;
    if (st == UCS_OK) st = UCS_ERR_CANCELED;  // its endpoint was closed by another transfer
    std::string why = std::string(stage) + ": " + ucs_status_string(st);
    if (op.peer && op.peer->failed) why += " (" + op.peer->why + ")";
    finish(op, make_error(RdmaErrc::OwnerUnreachable, op.what + ": owner unreachable: " + why));
    return false;
  }

  void check_status(const std::shared_ptr<Op>& op, ucp_rkey_h srk, std::function<void()> then) {
    issue(
        [&](const ucp_request_param_t* p) {
          return ucp_get_nbx(op->peer->ep, op->status, sizeof op->status, op->h.status_address,
                             srk, p);
        },
        [this, op, then = std::move(then)](ucs_status_t st) {
          if (!check(*op, st, "status get")) return;
          if (op->status[0] != op->h.reg_id) {
            return finish(*op, make_error(RdmaErrc::Dropped,
                                          op->what + ": buffer '" + op->h.name +
                                              "' was dropped by its owner"));
          }
          uint64_t len = op->status[1];
          if (op->size > len || op->offset > len - op->size) {
            return finish(*op, make_error(RdmaErrc::OutOfBounds,
                                          op->what + ": past the end of the owner's " +
                                              std::to_string(len) + " B buffer"));
          }
          then();
        });
  }

  void begin(const std::shared_ptr<Op>& op) {
    if (op->finished) return;
    std::string why;
    op->peer = peer_for(op->h, why);
    if (!op->peer) {
      return finish(*op, make_error(RdmaErrc::OwnerUnreachable, op->what + ": " + why));
    }
    ucp_rkey_h rk = rkey_for(*op->peer, op->h.rkey, why);
    ucp_rkey_h srk = rk ? rkey_for(*op->peer, op->h.status_rkey, why) : nullptr;
    if (!rk || !srk) {
      return finish(*op, make_error(RdmaErrc::UnknownBuffer, op->what + ": " + why));
    }
    uint64_t remote = op->h.address + op->offset;
    if (op->read) {
      check_status(op, srk, [this, op, rk, srk, remote] { read_data(op, rk, srk, remote); });
      return;
    }
    write_data(op, rk, srk, remote);
  }

  void read_data(const std::shared_ptr<Op>& op, ucp_rkey_h rk, ucp_rkey_h srk, uint64_t remote) {
    issue(
        [&](const ucp_request_param_t* p) {
          return ucp_get_nbx(op->peer->ep, op->local, op->size, remote, rk, p);
        },
        [this, op, srk](ucs_status_t st) {
          if (!check(*op, st, "ucp_get_nbx")) return;
          check_status(op, srk, [this, op] { finish(*op, nullptr); });  // dropped meanwhile?
        });
  }

  void write_data(const std::shared_ptr<Op>& op, ucp_rkey_h rk, ucp_rkey_h srk, uint64_t remote) {
    check_status(op, srk, [this, op, rk, remote] {
      issue(
          [&](const ucp_request_param_t* p) {
            return ucp_put_nbx(op->peer->ep, op->local, op->size, remote, rk, p);
          },
          [this, op](ucs_status_t st) {
            if (!check(*op, st, "ucp_put_nbx")) return;
            // Put completion only means our buffer is reusable: flush for remote completion.
            issue([&](const ucp_request_param_t* p) { return ucp_ep_flush_nbx(op->peer->ep, p); },
                  [this, op](ucs_status_t st2) {
                    if (!check(*op, st2, "ucp_ep_flush_nbx")) return;
                    finish(*op, nullptr);
                  });
          });
    });
  }

  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> worker_address_;
  std::string tls_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
  std::unique_ptr<asio::posix::stream_descriptor> efd_;
  std::thread thread_;
  std::map<std::string, std::shared_ptr<Peer>> peers_;  // I/O thread only

  std::vector<uint64_t> slots_;
  ucp_mem_h status_memh_ = nullptr;
  std::vector<std::byte> status_rkey_;
  std::mutex slot_mu_;
  std::vector<size_t> free_slots_;

  mutable std::mutex info_mu_;
  std::string lanes_;
};

}  // namespace

std::unique_ptr<UcxPlane> make_ucx_plane(std::string& why) {
  auto u = std::make_unique<Ucx>();
  if (!u->init(why)) return nullptr;
  return u;
}

}  // namespace monarch::rdma::detail
