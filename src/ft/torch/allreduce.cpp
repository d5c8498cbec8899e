// AllreduceGroup over c10d ProcessGroupGloo (include/monarch/ft/torch/allreduce.hpp).
#include "monarch/ft/torch/allreduce.hpp"

#include <ATen/ATen.h>
#include <gloo/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef MONARCH_FT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace monarch::ft {

namespace {

std::string describe(const std::exception& e) {
  // c10::Error::what() carries a C++ backtrace after the first line; the first line is the cause.
  std::string s = e.what();
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// Groups whose collective is still running when the caller gives up on it (a Watch abandoned it,
// or the guard ran out) cannot be destroyed without blocking (~ProcessGroupGloo joins its worker
// thread, which waits in gloo until the group timeout). They are parked here with their work,
// their connections closed, and dropped once the work completed (at the next parking).
struct Parked {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Work> work;
};
std::mutex graveyard_mu;
std::vector<Parked>& graveyard() {
  static auto* g = new std::vector<Parked>();
  return *g;
}

void park(Parked p) {
  std::vector<Parked> done;  // destroyed outside the lock: joins idle worker threads
  {
    std::lock_guard lock(graveyard_mu);
    auto& g = graveyard();
    for (auto& x : g)
      if (!x.work || x.work->isCompleted()) done.push_back(std::move(x));
    g.erase(std::remove_if(g.begin(), g.end(), [](const Parked& x) { return !x.pg; }), g.end());
    g.push_back(std::move(p));
  }
}

// ProcessGroupGloo whose connections can be closed while an op is in flight: contexts_ (the
// gloo contexts, whose pairs are the connections to the peers) is protected there.
class WatchableGloo : public c10d::ProcessGroupGloo {
 public:
  using ProcessGroupGloo::ProcessGroupGloo;
  // Closes every pair (the connections to the peers): nothing more is read into or sent from
  // the op's buffers (a reduction step already running finishes, in microseconds), and peers
  // blocked on this member see the connection close and fail fast. An op waiting on a pair keeps
  // waiting until gloo's own timeout.
  void close_pairs() {
    for (auto& ctx : contexts_) {
      for (int i = 0; i < ctx->size; ++i) {
        if (i == ctx->rank) continue;
        if (auto& pair = ctx->getPair(i)) pair->close();
      }
    }
  }
};

// gloo's TCP event loop (libgloo 0.0~git20220518) wakes every 10 ms when idle, and a thread other
// than the loop's that takes a socket off it waits for the loop's next wakeup: up to 10 ms per
// socket, one socket after the other. A group is built and destroyed that way (each pair drops a
// listening socket while connecting; every pair's socket goes when the group is destroyed), so
// forming a group of 4 took 40-70 ms on the 2-core VM, in steps of 10 ms, and every quorum
// change paid it. LoopPump registers an eventfd on the device's loop and, while a Pumping guard
// lives, writes it every 200 us, so that those waits end within about that.
class LoopPump final : public gloo::transport::tcp::Handler {
 public:
  explicit LoopPump(std::shared_ptr<gloo::transport::tcp::Device> device)
      : device_(std::move(device)), fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ >= 0) device_->registerDescriptor(fd_, EPOLLIN, this);
  }
  ~LoopPump() override {
    if (fd_ < 0) return;
    device_->unregisterDescriptor(fd_, this);  // waits for one loop wakeup: after this, no calls
    ::close(fd_);
  }
  LoopPump(const LoopPump&) = delete;
  LoopPump& operator=(const LoopPump&) = delete;

  // On the loop's thread.
  void handleEvents(int) override {
    std::uint64_t n;
    while (::read(fd_, &n, sizeof n) > 0) {
    }
  }

  // Wakes the loop from a thread of its own until destroyed: every 200 us for the first 20 ms (a
  // group of 4 builds in about 8), then half as often each time, down to gloo's own pace, so that
  // a build waiting long for a starved or dead peer does not keep a core busy. Never throws:
  // without a thread (none could start) the waits are gloo's own.
  class Pumping {
   public:
    explicit Pumping(LoopPump* pump) noexcept {
      if (pump == nullptr || pump->fd_ < 0) return;
      try {
        thread_ = std::jthread([fd = pump->fd_](std::stop_token stop) {
          using namespace std::chrono_literals;
          const auto fast_until = std::chrono::steady_clock::now() + 20ms;
          std::chrono::microseconds every = 200us;
          std::mutex mu;
          std::condition_variable_any cv;  // woken by the stop request alone: the guard's end
          std::unique_lock lock(mu);
          while (!stop.stop_requested()) {
            const std::uint64_t one = 1;
            (void)!::write(fd, &one, sizeof one);
            cv.wait_for(lock, stop, every, [] { return false; });
            if (std::chrono::steady_clock::now() > fast_until) every = std::min(every * 2, 10000us);
          }
        });
      } catch (const std::exception&) {
      }
    }

   private:
    std::jthread thread_;
  };

 private:
  std::shared_ptr<gloo::transport::tcp::Device> device_;
  int fd_;
};

// Completion of a work, waited for in slices (Work::wait(timeout) throws a c10::Error with a
// backtrace when it times out: too costly to poll with).
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

}  // namespace

AllreduceError::AllreduceError(std::string prefix, int rank, int world_size,
                               const std::string& cause)
    : monarch::Error(ErrorCode::Allreduce,
                     "allreduce group '" + prefix + "' (rank " + std::to_string(rank) + " of " +
                         std::to_string(world_size) + "): " + cause,
                     Origin{.rank = static_cast<std::size_t>(rank)}),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_size_(world_size) {}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(std::string host)
    : impl_(std::make_unique<Impl>()), host_(std::move(host)) {
  c10d::TCPStoreOptions opts;
  opts.port = 0;  // ephemeral
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.multiTenant = true;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host_, opts);
  } catch (const std::exception& e) {
    throw monarch::Error(ErrorCode::Allreduce,
                         "StoreServer: cannot listen for " + host_ + ": " + describe(e));
  }
  port_ = impl_->store->getPort();
}

StoreServer::~StoreServer() = default;

struct AllreduceGroup::Impl {
  // The client connection to the store, reused while the store address stays the same.
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string store_host;
  std::uint16_t store_port = 0;

  // The gloo device (its TCP event loop), reused while local_host stays the same, and the pump
  // that speeds its loop up while a group is built or destroyed (null if the device is not gloo's
  // TCP one). Declared before pg: destroyed after it.
  std::shared_ptr<gloo::transport::Device> device;
  std::string device_host;
  std::unique_ptr<LoopPump> pump;

  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  // The number of floats every member of pg was found to pass (check_sizes); 0: not checked yet.
  std::size_t checked_size = 0;
  AllreduceBackend backend = AllreduceBackend::gloo;
  std::chrono::milliseconds timeout{0};
  // A second client connection to the same store, for the abort key alone: the first one may be
  // busy (a peer address wait in the group's construction) when configure() polls or when a
  // member that gives up publishes.
  c10::intrusive_ptr<c10d::TCPStore> signal;
  std::string published;  // the last prefix this member published as aborted

  // The key a member that gives up on group `prefix` sets, so that members still configuring it
  // stop waiting for it, and members whose op fails because it closed its connections can say
  // why (a PrefixStore key of the group's own prefix; gloo uses only rank numbers).
  static std::string abort_key(const std::string& prefix) { return prefix + "/monarch.aborted"; }

  // Sets the abort key of `prefix` (once per prefix) and waits until the store has it: a SET gets
  // no reply, a CHECK on the same connection does, so a peer that sees this member's
  // connections close afterwards also finds the key.
  void publish_abort(const std::string& prefix) noexcept {
    if (prefix.empty() || published == prefix || !signal) return;
    published = prefix;
    try {
      signal->set(abort_key(prefix), std::vector<std::uint8_t>{1});
      signal->check({abort_key(prefix)});
    } catch (const std::exception&) {
      // the store is gone (the job is ending): nobody is left configuring
    }
  }

  // Whether another member gave up on `prefix` (false if this one did, or the store is gone).
  bool other_gave_up(const std::string& prefix) noexcept {
    if (prefix.empty() || published == prefix || !signal) return false;
    try {
      return signal->check({abort_key(prefix)});
    } catch (const std::exception&) {
      return false;
    }
  }
};

AllreduceGroup::AllreduceGroup() : impl_(std::make_unique<Impl>()) {
  // gloo writes to its pair sockets without MSG_NOSIGNAL: a member that writes after its peers
  // closed the group (a SIGSTOPped replica that wakes up) would die of SIGPIPE instead of getting
  // an AllreduceError. EPIPE is handled as an error instead.
  static std::once_flag once;
  std::call_once(once, [] { std::signal(SIGPIPE, SIG_IGN); });
}

AllreduceGroup::~AllreduceGroup() {
  abort();
}

bool AllreduceGroup::configured() const noexcept {
  return static_cast<bool>(impl_->pg);
}

void AllreduceGroup::abort() noexcept {
  // Members still inside configure() of this group wait for a peer address, not on a socket of
  // ours: the abort key tells them (a member never rejoins a prefix it left). It is set first, so
  // that members whose op fails on our closed sockets can name the cause.
  impl_->publish_abort(prefix_);
  // Dropping the last reference destroys the ProcessGroupGloo: its worker thread is joined (it
  // is idle: every allreduce_sum waits for its work) and the gloo pairs close their sockets, so
  // peers blocked on a recv from us see "connection closed" at once.
  if (!impl_->pg) return;
  LoopPump::Pumping pumping(impl_->pump.get());
  impl_->pg.reset();
}

void AllreduceGroup::configure(const std::string& store_host, std::uint16_t store_port,
                               const std::string& prefix, int rank, int world_size,
                               std::chrono::milliseconds timeout, AllreduceBackend backend,
                               const std::string& local_host) {
  abort();
  impl_->checked_size = 0;
  prefix_ = prefix;
  rank_ = rank;
  world_size_ = world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw AllreduceError(prefix, rank, world_size, "invalid rank/world size");
  }
  if (timeout.count() <= 0)
    throw AllreduceError(prefix, rank, world_size, "timeout must be > 0 ms");
  try {
    if (!impl_->store || impl_->store_host != store_host || impl_->store_port != store_port) {
      impl_->store.reset();
      impl_->signal.reset();
      c10d::TCPStoreOptions opts;
      opts.port = store_port;
      opts.isServer = false;
      opts.waitWorkers = false;
      // Connecting: with a 300 ms timeout, c10d's connect failed at once in a test ("timed out
      // after 0s", two clients connecting together); a live store answers within ms anyway.
      opts.timeout = std::max(timeout, std::chrono::milliseconds(5000));
      impl_->store = c10::make_intrusive<c10d::TCPStore>(store_host, opts);
      impl_->signal = c10::make_intrusive<c10d::TCPStore>(store_host, opts);
      impl_->store_host = store_host;
      impl_->store_port = store_port;
    }
    // The store timeout bounds the rendezvous (each get/wait of a peer's address).
    impl_->store->setTimeout(timeout);
    impl_->signal->setTimeout(timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store);
    impl_->backend = backend;
    impl_->timeout = timeout;
    if (backend == AllreduceBackend::gloo) {
      if (!impl_->device || impl_->device_host != local_host) {
        impl_->pump.reset();
        impl_->device = c10d::ProcessGroupGloo::createDeviceForHostname(local_host);
        impl_->device_host = local_host;
        if (auto tcp = std::dynamic_pointer_cast<gloo::transport::tcp::Device>(impl_->device))
          impl_->pump = std::make_unique<LoopPump>(std::move(tcp));
      }
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(impl_->device);
      opts->threads = 1;
      // gloo's connect to a peer that published its address and then died retries past the
      // group timeout (seen: 4-5 s for a 1 s timeout). Build the group on its own thread and
      // give up at the deadline; a late construction finishes there and is dropped.
      auto made = std::make_shared<std::promise<c10::intrusive_ptr<c10d::ProcessGroup>>>();
      auto ready = made->get_future();
      std::thread([made, prefixed, rank, world_size, opts] {
        try {
          made->set_value(c10::make_intrusive<WatchableGloo>(prefixed, rank, world_size, opts));
        } catch (...) {
          made->set_exception(std::current_exception());
        }
      }).detach();
      // Meanwhile, every few ms: has a member given up on this group (abort key)? Then the
      // missing member is not coming either (it died, or left for a newer quorum).
      LoopPump::Pumping pumping(impl_->pump.get());
      const auto deadline =
          std::chrono::steady_clock::now() + timeout + std::chrono::milliseconds(100);
      while (ready.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
        if (std::chrono::steady_clock::now() >= deadline) {
          throw AllreduceError(prefix, rank, world_size,
                               "configure: not every member joined within " +
                                   std::to_string(timeout.count()) + " ms");
        }
        if (impl_->signal->check({Impl::abort_key(prefix)})) {
          throw AllreduceError(prefix, rank, world_size,
                               "configure: another member gave up on this group (its allreduce "
                               "or configure failed, or it left for a newer quorum)");
        }
      }
      impl_->pg = ready.get();
      return;
    }
#ifdef MONARCH_FT_HAVE_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world_size, opts);
#else
    throw AllreduceError(prefix, rank, world_size,
                         "NCCL backend requested, but monarch_ft_torch was built against a "
                         "libtorch without CUDA (Debian's libtorch-dev has none); use gloo");
#endif
  } catch (const AllreduceError&) {
    abort();  // this member gives up on the group: the others stop waiting for it
    throw;
  } catch (const std::exception& e) {
    abort();
    throw AllreduceError(prefix, rank, world_size, "configure: " + describe(e));
  }
}

// A collective of this group (`op`) ended with `e`: closes the group (the op ended, its worker is
// idle) and throws AllreduceError. Connections closed by a member that gave up first (its watch,
// its error, abort()) fail the op with a socket error that names no member: say that one did.
void AllreduceGroup::op_failed(const std::exception& e, const std::string& op) {
  std::string cause = describe(e);
  if (impl_->other_gave_up(prefix_)) {
    cause += " (another member had already given up on this group and closed its connections)";
  }
  abort();
  throw AllreduceError(prefix_, rank_, world_size_, op + ": " + cause);
}

struct AllreduceGroup::Collective {
  std::vector<at::Tensor> tensors;
  c10d::ReduceOp reduce;
  std::size_t floats;  // what the caller passes, for messages
  const char* label;   // "" (the allreduce) or ": size check"
  // "allreduce of <n> floats<label>", built only when an error names it (not on every step).
  std::string what() const { return "allreduce of " + std::to_string(floats) + " floats" + label; }
};

// Members that pass different sizes must not reach gloo's ring allreduce: a member receiving a
// chunk larger than it expects aborts its whole process (gloo::EnforceNotMet thrown on gloo's
// device thread, op.preamble.length <= op.nbytes), and the member with the odd size may go on.
// So the first allreduce of each size in a group first reduces (n, -n) with MAX: one 16-byte
// collective per group and size, after which every member knows the largest and smallest size.
void AllreduceGroup::check_sizes(std::size_t n, const Watch* watch) {
  Collective op{{}, c10d::ReduceOp::MAX, n, ": size check"};
  try {
    op.tensors.push_back(at::tensor({static_cast<std::int64_t>(n), -static_cast<std::int64_t>(n)},
                                    at::TensorOptions().dtype(at::kLong)));
  } catch (const std::exception& e) {
    op_failed(e, op.what());
  }
  run(op, watch);
  const std::int64_t most = op.tensors[0][0].item<std::int64_t>();
  const std::int64_t least = -op.tensors[0][1].item<std::int64_t>();
  if (most != static_cast<std::int64_t>(n) || least != static_cast<std::int64_t>(n)) {
    abort();
    throw UsageError("allreduce of group " + prefix_ + " (rank " + std::to_string(rank_) + " of " +
                     std::to_string(world_size_) + "): this member passes " + std::to_string(n) +
                     " floats, and the members pass between " + std::to_string(least) + " and " +
                     std::to_string(most) +
                     ": every member must pass the same number (replicas of one model: every "
                     "replica must build the same architecture)");
  }
  impl_->checked_size = n;
}

void AllreduceGroup::allreduce_sum(std::span<float> data, const Watch* watch) {
  if (!impl_->pg) {
    throw AllreduceError(prefix_, rank_, world_size_,
                         "not configured (or closed by an earlier error/abort)");
  }
  if (world_size_ == 1 || data.empty()) return;
  if (impl_->backend == AllreduceBackend::gloo && impl_->checked_size != data.size())
    check_sizes(data.size(), watch);
  Collective op{{}, c10d::ReduceOp::SUM, data.size(), ""};
  at::Tensor cpu;
#ifdef MONARCH_FT_HAVE_NCCL
  const bool on_gpu = impl_->backend == AllreduceBackend::nccl;
#else
  const bool on_gpu = false;
#endif
  try {
    cpu = at::from_blob(data.data(), {static_cast<int64_t>(data.size())},
                        at::TensorOptions().dtype(at::kFloat));
    op.tensors.push_back(on_gpu ? cpu.to(at::kCUDA) : cpu);
  } catch (const std::exception& e) {
    op_failed(e, op.what());
  }
  run(op, watch);
  if (!on_gpu) return;
  try {
    cpu.copy_(op.tensors[0].cpu());
  } catch (const std::exception& e) {
    op_failed(e, op.what());
  }
}

void AllreduceGroup::run(Collective& op, const Watch* watch) {
  const bool watching = watch && watch->probe && watch->every.count() > 0;
  c10::intrusive_ptr<c10d::Work> work;
  std::string abandoned;
  auto c = std::make_shared<Completion>();
  try {
    c10d::AllreduceOptions opts;
    opts.reduceOp = op.reduce;
    opts.timeout = impl_->timeout;
    work = impl_->pg->allreduce(op.tensors, opts);
    // gloo's own timeout (the configure timeout) completes the work with an error; the guard
    // here only covers a wedged backend.
    const auto start = std::chrono::steady_clock::now();
    const auto guard = start + impl_->timeout + std::chrono::seconds(5);
    work->getFuture()->addCallback([c](c10::ivalue::Future&) {
      std::lock_guard lock(c->mu);
      c->done = true;
      c->cv.notify_all();
    });
    auto next_probe = watching ? start + watch->after : guard;
    std::unique_lock lock(c->mu);
    while (!c->done) {
      if (c->cv.wait_until(lock, std::min(guard, next_probe), [&] { return c->done; })) break;
      if (std::chrono::steady_clock::now() >= guard) {
        abandoned = "no completion within the group timeout + 5 s";
        break;
      }
      lock.unlock();
      try {
        abandoned = watch->probe();
      } catch (const std::exception&) {
        abandoned.clear();  // a probe that fails reports nothing
      }
      lock.lock();
      if (!abandoned.empty()) break;
      next_probe = std::chrono::steady_clock::now() + watch->every;
    }
    if (c->done) abandoned.clear();  // it completed meanwhile: use the result
    lock.unlock();
    if (abandoned.empty()) {
      work->wait();  // completed: rethrows the collective's error
      return;
    }
  } catch (const std::exception& e) {
    op_failed(e, op.what());
  }
  // Given up on while gloo still runs it (a frozen peer never closes its sockets, so gloo would
  // wait out its timeout): close the group's connections, so that nothing more arrives into the
  // tensors and the peers blocked on this member fail fast. The worker itself stays in its wait
  // until gloo's timeout, so the group is parked rather than destroyed (which would join it).
  impl_->publish_abort(prefix_);  // before the connections close: see other_gave_up()
  auto* gloo = dynamic_cast<WatchableGloo*>(impl_->pg.get());
  if (gloo) {
    LoopPump::Pumping pumping(impl_->pump.get());  // each pair's socket leaves the loop
    gloo->close_pairs();
  }
  park({std::move(impl_->pg), std::move(work)});
  abort();
  throw AllreduceError(prefix_, rank_, world_size_, op.what() + " abandoned: " + abandoned);
}

}  // namespace monarch::ft
