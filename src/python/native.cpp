// monarch._native: the C++ runtime as seen from python/monarch. Everything here is internal; the
// public API (names, docstrings, argument checks) is the Python package's. See runtime.hpp for
// the threading and GIL rules every function below follows.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "monarch/config/config.hpp"
#include "monarch/mesh/cast.hpp"
#include "monarch/mesh/process.hpp"
#include "monarch/wire/serialize.hpp"
#include "runtime.hpp"

namespace monarch::python {

void register_reply(py::module_& m);
void set_worker_proc(Proc& p);
void register_rdma(py::module_& m);
void register_launch(py::module_& m);  // launch.cpp: SlurmJob, KubernetesJob
/// For rdma.cpp: a Future<void> as a NativeFuture whose result() is None (GIL held).
py::object native_future(Future<void> f);

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Mesh = mesh::ActorMesh<PyActor>;

// --- Futures ---------------------------------------------------------------------------------

// The completion of a C++ Future, seen from Python: completed on a runtime thread without the
// GIL (the value stays a C++ value until result() converts it, on the caller's thread).
struct FutureState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                   // guarded by mu
  std::atomic<bool> ready{false};      // set with done, read by the waiter's spin
  std::function<py::object()> make;    // converts the value, or rethrows the error (GIL held)
  std::vector<py::object*> callbacks;  // done callbacks, run once with the GIL
  ~FutureState() {
    if (callbacks.empty() || !py_alive()) return;
    Gil gil;
    for (auto* c : callbacks) delete c;
  }
};

void complete(const std::shared_ptr<FutureState>& s, std::function<py::object()> make) {
  std::vector<py::object*> cbs;
  {
    std::lock_guard lock(s->mu);
    s->make = std::move(make);
    s->done = true;
    s->ready.store(true, std::memory_order_release);
    cbs.swap(s->callbacks);
  }
  s->cv.notify_all();
  if (cbs.empty()) return;
  if (!py_alive()) return;  // leaked with the interpreter
  Gil gil;
  for (auto* cb : cbs) {
    try {
      (*cb)();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("monarch: future done callback");
    }
    delete cb;
  }
}

// While an actor's handler blocks its worker thread (a sync endpoint waiting on a future), the
// proc's scheduler is told, as Future::get() does, so that it lends a spare worker once every
// worker is blocked: a chain of actors on one proc, each waiting on the next, makes progress.
class BlockingWorker {
 public:
  BlockingWorker() {
    if (auto* c = monarch::detail::current_cell()) {
      sched_ = &c->proc().scheduler();
      NoGil nogil;
      sched_->begin_blocking();
    }
  }
  ~BlockingWorker() {
    if (sched_ == nullptr) return;
    NoGil nogil;
    sched_->end_blocking();
  }
  BlockingWorker(const BlockingWorker&) = delete;
  BlockingWorker& operator=(const BlockingWorker&) = delete;

 private:
  Scheduler* sched_ = nullptr;
};

// Every blocking wait of the bindings: runs `attempt(slice)` with the GIL released, in slices of
// at most 100 ms, until it gives a value or `deadline` passes (then nullopt), so that a signal
// (Ctrl-C) raises in the waiting thread between slices. `attempt` returns a std::optional.
template <class Attempt>
auto in_slices(Clock::time_point deadline, Attempt attempt)
    -> decltype(attempt(Clock::duration{})) {
  BlockingWorker blocking;
  while (true) {
    const auto slice =
        std::clamp<Clock::duration>(deadline - Clock::now(), Clock::duration::zero(), 100ms);
    {
      NoGil nogil;
      if (auto v = attempt(slice)) return v;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (Clock::now() >= deadline) return {};
  }
}

// Waits for `ready()` (under `mu`, signalled on `cv`). Returns false on timeout (timeout_s < 0:
// forever).
template <class Ready>
bool wait_released(std::mutex& mu, std::condition_variable& cv, Ready ready, double timeout_s) {
  {
    std::lock_guard lock(mu);
    if (ready()) return true;
  }
  return in_slices(deadline_after(timeout_s),
                   [&](Clock::duration slice) -> std::optional<bool> {
                     std::unique_lock lock(mu);
                     if (cv.wait_for(lock, slice, ready)) return true;
                     return std::nullopt;
                   })
      .has_value();
}

class NativeFuture {
 public:
  NativeFuture() : s_(std::make_shared<FutureState>()) {}
  explicit NativeFuture(std::shared_ptr<FutureState> s) : s_(std::move(s)) {}

  bool done() const {
    std::lock_guard lock(s_->mu);
    return s_->done;
  }
  bool wait(double timeout_s) const {
    auto& s = *s_;
    if (s.ready.load(std::memory_order_acquire)) return true;
    {
      // Replies across processes often arrive within tens of microseconds: spin (yielding, GIL
      // released) for up to actor.spin_us before sleeping, as the C++ Future::get does (WAIT-1).
      NoGil nogil;
      static const auto spin = std::chrono::microseconds(config::global().integer("actor.spin_us"));
      const auto until = std::min(Clock::now() + spin, deadline_after(timeout_s));
      while (Clock::now() < until) {
        if (s.ready.load(std::memory_order_acquire)) return true;
        std::this_thread::yield();
      }
    }
    return wait_released(
        s.mu, s.cv, [&] { return s.done; }, timeout_s);
  }
  py::object result() const {
    std::function<py::object()> make;
    {
      std::lock_guard lock(s_->mu);
      if (!s_->done) throw UsageError("future: result() before it completed");
      make = s_->make;
    }
    return make();
  }
  void add_done_callback(py::function fn) const {
    {
      std::lock_guard lock(s_->mu);
      if (!s_->done) {
        s_->callbacks.push_back(new py::object(std::move(fn)));
        return;
      }
    }
    fn();
  }
  const std::shared_ptr<FutureState>& state() const { return s_; }

 private:
  std::shared_ptr<FutureState> s_;
};

template <class T, class Conv>
NativeFuture watch(Future<T> f, Conv conv) {
  auto s = std::make_shared<FutureState>();
  f.on_complete([s, conv = std::move(conv)](monarch::detail::State<T>& st) mutable {
    if (st.error) {
      auto e = st.error;
      return complete(s, [e]() -> py::object { std::rethrow_exception(e); });
    }
    auto v = std::make_shared<monarch::detail::stored_t<T>>(std::move(*st.value));
    complete(s, [v, conv]() -> py::object { return conv(*v); });
  });
  return NativeFuture(s);
}

py::object to_bytes(const std::string& s) {
  return py::bytes(s);
}

// A ValueMesh of encoded replies as a list by local rank: bytes, or the rank's error (an
// exception instance, not raised).
py::object value_list(const ndslice::ValueMesh<std::string>& vm) {
  py::list out(vm.size());
  for (size_t r = 0; r < vm.size(); ++r) {
    if (vm.ok(r)) {
      out[r] = py::bytes(vm.get(r));
    } else {
      out[r] = error_object(vm.error(r));
    }
  }
  return out;
}

// --- Shapes ------------------------------------------------------------------------------------

ndslice::Shape make_shape(std::vector<std::string> labels, std::vector<size_t> sizes) {
  return ndslice::Shape(ndslice::Extent(std::move(labels), std::move(sizes)));
}

ndslice::Range make_range(size_t begin, std::optional<size_t> end, size_t step) {
  return ndslice::Range(begin, end, step);
}

std::vector<size_t> global_ranks(const ndslice::Shape& s) {
  std::vector<size_t> out(s.num_ranks());
  for (size_t i = 0; i < out.size(); ++i) out[i] = s.global_rank(i);
  return out;
}

// --- Process meshes ------------------------------------------------------------------------------

// One proc mesh, with the Python failure handler its monitor thread calls.
struct ProcMeshBox {
  struct Shared {
    std::mutex mu;
    py::object* on_failure = nullptr;  // callable(mesh, ranks, cause, text) -> bool
  };
  std::optional<mesh::ProcMesh> procs;  // set once spawned
  std::shared_ptr<Shared> shared;
  ProcMeshBox() = default;
  ProcMeshBox(const ProcMeshBox&) = delete;
  ProcMeshBox& operator=(const ProcMeshBox&) = delete;
  // The last view of a mesh stops its procs, which waits for its monitor thread: that thread may
  // be waiting for the GIL (a failure handler), so the GIL is released meanwhile.
  ~ProcMeshBox() {
    if (!procs || PyGILState_Check() == 0) return;
    NoGil nogil;
    procs.reset();
  }
};

bool handle_failure(const std::shared_ptr<ProcMeshBox::Shared>& sh, const MeshFailure& f) {
  if (!py_alive()) return true;  // the client is exiting: its procs die with it
  Gil gil;
  py::object* cb = nullptr;
  {
    std::lock_guard lock(sh->mu);
    cb = sh->on_failure;
  }
  if (cb == nullptr) return false;
  try {
    return (*cb)(f.mesh, f.ranks, f.cause, f.to_string()).cast<bool>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("monarch: ProcMesh failure handler");
    return false;
  }
}

std::shared_ptr<ProcMeshBox> spawn_procs(
    mesh::HostMesh& host, std::vector<std::string> labels, std::vector<size_t> sizes,
    std::string name, std::string program, std::vector<std::string> args,
    std::vector<std::string> env, bool owned_by_actor,
    std::optional<std::tuple<std::string, std::string, uint64_t>> owner) {
  auto box = std::make_shared<ProcMeshBox>();
  box->shared = std::make_shared<ProcMeshBox::Shared>();
  mesh::SpawnOptions o;
  o.name = std::move(name);
  o.program = std::move(program);
  o.args = std::move(args);
  o.env = std::move(env);
  auto sh = box->shared;
  if (!owned_by_actor) {
    o.on_failure = [sh](const MeshFailure& f) { return handle_failure(sh, f); };
  }
  // Spawned in an async endpoint: the handler forwards to that actor (ActorHost.owned_failure).
  if (owner) {
    o.owner = ActorId{std::get<0>(*owner), std::get<1>(*owner), std::get<2>(*owner)};
    o.owner_proc = &local_proc();  // where Python actors run
  }
  auto ext = ndslice::Extent(std::move(labels), std::move(sizes));
  box->procs = host.spawn_procs(ext, std::move(o));
  return box;
}

// The comm actor of this process's Proc (installed on first use in a client; a worker's
// bootstrap installs its own).
ActorId local_comm_id() {
  static std::mutex mu;
  std::lock_guard lock(mu);
  Proc& p = local_proc();
  if (auto c = p.lookup<mesh::CommActor>(mesh::kCommActorName)) return c->id();
  return mesh::detail::install_comm(p).id();
}

// A process mesh shipped to another process (ProcMesh pickled into a message): the procs of the
// sender's view, densely, and their comm actors. The receiver spawns on them from its own Proc
// (which then owns those actors), as ProcMesh::spawn does: Spawn messages, then the CAST-11 fence.
struct RemoteProcs {
  std::string name;
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  std::vector<std::string> addrs;  // by local rank of the extent
  std::vector<ActorId> comm;       // likewise
  size_t fanout = 16;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(name, labels, sizes, addrs, comm, fanout);
  }
  ndslice::Shape shape() const { return make_shape(labels, sizes); }
  RemoteProcs with_view(const ndslice::Shape& v) const {
    RemoteProcs out;
    out.name = name;
    out.labels = v.labels();
    out.sizes = v.sizes();
    out.fanout = fanout;
    for (size_t i = 0; i < v.num_ranks(); ++i) {
      const size_t g = v.global_rank(i);
      if (g >= addrs.size())
        throw UsageError("with_view: view " + v.to_string() + " holds rank " + std::to_string(g) +
                         ", outside the mesh's " + std::to_string(addrs.size()) + " procs");
      out.addrs.push_back(addrs[g]);
      out.comm.push_back(comm[g]);
    }
    return out;
  }
};

py::bytes encode_procs(const ProcMeshBox& b) {
  RemoteProcs w;
  {
    NoGil nogil;
    const auto& pm = *b.procs;
    const auto& v = pm.shape();
    w.name = pm.name();
    w.labels = v.labels();
    w.sizes = v.sizes();
    w.fanout = pm.cast_fanout();
    const auto comm = pm.comm_ids();
    for (size_t i = 0; i < pm.size(); ++i) {
      w.addrs.push_back(pm.address(i));
      w.comm.push_back(comm.at(v.global_rank(i)));
    }
  }
  auto bytes = wire::encode(w);
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

RemoteProcs decode_procs(const std::string& b) {
  return wire::decode<RemoteProcs>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), b.size()));
}

Mesh spawn_on_remote_procs(const RemoteProcs& rp, const std::string& name,
                           const std::string& spec) {
  Proc& p = local_proc();
  const ndslice::Extent ext(rp.labels, rp.sizes);
  const size_t n = rp.addrs.size();
  std::vector<ActorId> members(n);
  auto fence = std::make_shared<mesh::detail::CastFence>(n);
  for (size_t i = 0; i < n; ++i) {
    members[i] = p.spawn_remote_member<PyActor>(ext.point(i), rp.addrs[i], name, spec).id();
    try {  // a request after the Spawn on the same link opens the fence (CAST-11)
      p.remote_lookup_id(rp.addrs[i], mesh::kCommActorName,
                         monarch::detail::demangle(typeid(mesh::CommActor).name()))
          .on_complete([fence](auto&) { fence->arrive(); });
    } catch (...) {
      fence->arrive();
    }
  }
  return Mesh::from_ids(p, members, ndslice::Shape(ext), rp.comm, rp.fanout, 1, std::move(fence));
}

// --- Actor meshes --------------------------------------------------------------------------------

// A rectangular mesh on the wire, so that another process can rebuild it (as remote refs).
struct MeshWire {
  std::vector<ActorId> members;
  std::vector<std::string> labels;
  size_t offset = 0;
  std::vector<size_t> sizes, strides;
  std::vector<ActorId> comm;
  size_t fanout = 16;
  size_t per_proc = 1;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(members, labels, offset, sizes, strides, comm, fanout, per_proc);
  }
};

// Blocks (GIL released by the caller) until casts to `m` may go (its spawn fence, CAST-11), so
// that a copy of it in another process never casts ahead of the Spawn messages.
void wait_cast_ready(const Mesh& m) {
  const auto* topo = m.topology();
  if (topo == nullptr) return;
  Promise<void> p;
  auto f = p.get_future();
  topo->when_ready(
      [p = std::make_shared<Promise<void>>(std::move(p))]() mutable { p->set_value(); });
  f.get();
}

py::bytes encode_mesh(const Mesh& m) {
  MeshWire w;
  {
    NoGil nogil;
    wait_cast_ready(m);
    const auto* topo = m.topology();
    if (topo == nullptr) throw UsageError("this actor mesh has no cast tree; it cannot be sent");
    for (const auto& r : m.members()) w.members.push_back(r.valid() ? r.id() : ActorId{});
    for (const auto& c : topo->comm) w.comm.push_back(c.id());
    w.fanout = topo->fanout;
    w.per_proc = m.per_proc();
    const auto& v = m.view();
    w.labels = v.labels();
    w.offset = v.base().offset();
    w.sizes = v.base().sizes();
    w.strides = v.base().strides();
  }
  auto bytes = wire::encode(w);
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Mesh decode_mesh(const std::string& b) {
  auto w = wire::decode<MeshWire>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), b.size()));
  ndslice::Shape view(w.labels, ndslice::Slice(w.offset, w.sizes, w.strides));
  return Mesh::from_ids(local_proc(), w.members, std::move(view), w.comm, w.fanout, w.per_proc);
}

// A message over the frame limit would be refused by the channel (a direct call failing late):
// refuse it here, at the call site, naming the Python endpoint and the limit. Casts are refused
// by the runtime too (detail::check_cast_size), but it names PyActor's C++ endpoint.
void check_frame(const std::string& method, const std::string& payload) {
  static const size_t limit = config::global().bytes("channel.max_frame_bytes");
  constexpr size_t kHeadroom = 64 * 1024;  // headers, the cast tree's wire, the endpoint name
  if (payload.size() + kHeadroom > limit) {
    throw UsageError("endpoint " + method + ": the message is " + std::to_string(payload.size()) +
                     " bytes, more than channel.max_frame_bytes (" + std::to_string(limit) +
                     " bytes, less 64 KiB of headers) allows; send large tensors through "
                     "monarch.rdma.RDMABuffer, or raise MONARCH_CHANNEL_MAX_FRAME_BYTES");
  }
}

NativeFuture mesh_call(const Mesh& m, std::string method, std::string payload) {
  check_frame(method, payload);
  return watch(m.call(&PyActor::call, std::move(method), std::move(payload)), value_list);
}

NativeFuture mesh_call_one(const Mesh& m, std::string method, std::string payload) {
  check_frame(method, payload);
  return watch(m.call_one(&PyActor::call, std::move(method), std::move(payload)), to_bytes);
}

NativeFuture mesh_choose(const Mesh& m, std::string method, std::string payload) {
  check_frame(method, payload);
  return watch(m.choose(&PyActor::call, std::move(method), std::move(payload)), to_bytes);
}

NativeFuture mesh_reduce(const Mesh& m, std::string fn, std::string method, std::string payload) {
  check_frame(method, payload);
  return watch(
      m.reduce(PyReducer{std::move(fn)}, &PyActor::call, std::move(method), std::move(payload)),
      to_bytes);
}

// A stream's replies in arrival order: next(timeout_s) -> (local rank, bytes or error object).
struct NativeStream {
  std::shared_ptr<mesh::Stream<std::string>> s;
  size_t remaining() const { return s->remaining(); }
  py::object next(double timeout_s) {
    auto item = in_slices(
        deadline_after(timeout_s),
        [&](Clock::duration slice) -> std::optional<std::pair<size_t, Future<std::string>>> {
          try {
            return s->next(std::chrono::duration_cast<std::chrono::milliseconds>(slice));
          } catch (const TimeoutError&) {
            return std::nullopt;
          }
        });
    if (!item) {
      throw TimeoutError("stream: no reply within " + std::to_string(timeout_s) + " s (" +
                         std::to_string(s->remaining()) + " outstanding)");
    }
    auto& [rank, f] = *item;
    try {
      return py::make_tuple(rank, py::bytes(f.get()));
    } catch (...) {
      return py::make_tuple(rank, error_object(std::current_exception()));
    }
  }
};

Mesh spawn_actors(const ProcMeshBox& pm, const std::string& name, const std::string& spec) {
  return pm.procs->spawn<PyActor>(name, spec);
}

NativeStream mesh_stream(const Mesh& m, std::string method, std::string payload) {
  check_frame(method, payload);
  return NativeStream{std::make_shared<mesh::Stream<std::string>>(
      m.stream(&PyActor::call, std::move(method), std::move(payload)))};
}

// Stops every member of the view (each drains its queue, then its __cleanup__ runs).
// The method name of stop()'s barrier call: python/monarch/_host.py answers it at once.
constexpr const char* kBarrier = "__monarch_barrier__";
template <class Acc>
void stop_members(const Mesh& m, const std::shared_ptr<Acc>& acc);

NativeFuture mesh_stop(const Mesh& m) {
  // Completes when every member stopped, or fails after mesh.stop_timeout naming how many did
  // not: a handler that never returns holds its actor (and the barrier) for good, and the stop
  // must not wait with it. The members still stop if their handlers return later.
  struct Acc {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    bool finished = false;  // the future is completed (all stopped, or the timeout)
    std::exception_ptr first;
    std::shared_ptr<FutureState> s = std::make_shared<FutureState>();
    void one(std::exception_ptr e) {
      {
        std::lock_guard lock(mu);
        if (e && !first) first = e;
        if (--left != 0 || finished) return;
        finished = true;
      }
      cv.notify_all();
      auto err = first;
      complete(s, [err]() -> py::object {
        if (err) std::rethrow_exception(err);
        return py::none();
      });
    }
    void time_out(std::chrono::milliseconds limit, std::string what) {
      std::unique_lock lock(mu);
      if (cv.wait_for(lock, limit, [&] { return finished; })) return;
      finished = true;
      lock.unlock();
      auto msg = what + " did not finish within " + std::to_string(limit.count()) +
                 " ms (mesh.stop_timeout): a member is in a handler that does not return, which "
                 "holds its actor (a stop first waits for the messages sent before it), or in a "
                 "__cleanup__ that does not return, or still stopping the meshes it spawned "
                 "(each within its own mesh.stop_timeout); stop the procs (ProcMesh.stop()), "
                 "which ends them";
      complete(s, [msg]() -> py::object { throw TimeoutError(msg); });
    }
  };
  auto acc = std::make_shared<Acc>();
  acc->left = m.size() + 1;
  std::thread([acc, limit = mesh::ProcTimeouts{}.stop_timeout,
               what = "stop of actor mesh '" + (m.size() > 0 ? m.at(0).id().name : "") + "'"] {
    acc->time_out(limit, what);
  }).detach();
  // Casts sent before the stop travel the cast tree, a stop goes straight to each member: a
  // barrier call through the tree first, so that every earlier broadcast has run (stop drains
  // what was sent before it). Members that fail it (dead procs) are stopped all the same.
  Future<ndslice::ValueMesh<std::string>> barrier;
  try {
    barrier = m.call(&PyActor::call, std::string(kBarrier), std::string());
  } catch (...) {
    barrier = Future<ndslice::ValueMesh<std::string>>::ready_error(std::current_exception());
  }
  barrier.on_complete([acc, m](auto&) { stop_members(m, acc); });
  return NativeFuture(acc->s);
}

template <class Acc>
void stop_members(const Mesh& m, const std::shared_ptr<Acc>& acc) {
  for (size_t i = 0; i < m.size(); ++i) {
    Future<void> f;
    try {
      f = m.at(i).stop();
    } catch (...) {
      f = Future<void>::ready_error(std::current_exception());
    }
    // A member whose proc already failed is gone: nothing left to stop.
    f.on_complete([acc](monarch::detail::State<void>& st) {
      std::exception_ptr e = st.error;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const SupervisionError&) {
          e = nullptr;
        } catch (...) {
        }
      }
      acc->one(e);
    });
  }
  acc->one(nullptr);
}

// This process's Proc as a mesh of one: the actor runs here, and is reached through the Proc's
// own channel address like any other member, so casts and sends behave as across processes.
Mesh spawn_local(const std::string& name, const std::string& spec) {
  Proc& p = local_proc();
  auto comm = local_comm_id();
  auto ref = p.spawn<PyActor>(name, spec);
  return Mesh::from_ids(p, {ref.id()}, ndslice::Shape(), {comm}, 16, 1);
}

// --- Ports -----------------------------------------------------------------------------------

struct NativePort {
  Port<std::string> port;
  // sender: the sending actor's ActorHost `me` (None outside actors); a message the port's owner
  // cannot take comes back to that actor's undeliverable() (PY-7), also from an async endpoint.
  void send(const std::string& payload, const std::shared_ptr<Reply>& sender) const {
    std::string copy = payload;
    NoGil nogil;
    monarch::detail::CurrentCell as(sending_cell(sender));
    port.send(std::move(copy));
  }
  py::bytes encode() const {
    std::vector<std::byte> b;
    {
      NoGil nogil;
      b = wire::encode(port);
    }
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
};

NativePort decode_port(const std::string& b) {
  monarch::detail::DecodingScope scope(&local_proc());
  return NativePort{wire::decode<Port<std::string>>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), b.size()))};
}

struct NativeReceiver {
  std::shared_ptr<PortReceiver<std::string>> rx;
  py::object try_recv() {
    std::optional<std::string> v;
    {
      NoGil nogil;
      v = rx->try_recv();
    }
    if (!v) return py::none();
    return py::bytes(*v);
  }
  py::bytes recv(double timeout_s) {
    auto v = in_slices(
        deadline_after(timeout_s), [&](Clock::duration slice) -> std::optional<std::string> {
          try {
            return rx->recv(std::chrono::duration_cast<std::chrono::microseconds>(slice));
          } catch (const TimeoutError&) {
            return std::nullopt;
          }
        });
    if (!v) {
      throw TimeoutError("PortReceiver.recv: no message within " + std::to_string(timeout_s) +
                         " s");
    }
    return py::bytes(*v);
  }
};

}  // namespace

py::object native_future(Future<void> f) {
  return py::cast(watch(std::move(f), [](const Unit&) { return py::none(); }));
}

// Python errors: monarch::Error -> the class of its code (monarch.errors).
void register_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error&) {
      py::object e = error_object(p);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
    }
  });
}

}  // namespace monarch::python

namespace py = pybind11;
using namespace monarch;
using namespace monarch::python;

PYBIND11_MODULE(_native, m) {
  m.doc() = "monarch-cpp's runtime (internal; use monarch.actor).";
  register_errors();
  note_main_thread();
  // monarch.actor stops this process's meshes in its own atexit handler, while Python still runs;
  // the C++ one would stop the client's Python actors after the interpreter finalized.
  mesh::keep_hosts_at_exit();
  m.def("prepare_exit", &prepare_exit,
        "At exit: runtime threads stop entering Python before the interpreter finalizes.");
  register_reply(m);
  // Every process that imports the module can run casts of Python actors in its comm actor.
  mesh::register_cast<PyActor>(&PyActor::call);
  mesh::register_cast<PyActor>(&PyActor::send);
  mesh::register_cast<PyActor>(&PyActor::call, PyReducer{});

  py::class_<NativeFuture>(m, "NativeFuture")
      .def("done", &NativeFuture::done)
      .def("wait", &NativeFuture::wait, py::arg("timeout_s"),
           "Waits up to timeout_s seconds (< 0: forever) with the GIL released; True when done.")
      .def("result", &NativeFuture::result, "The value, or raises the error. Only once done().")
      .def("add_done_callback", &NativeFuture::add_done_callback, py::arg("fn"),
           "fn() runs once, with the GIL, on the completing thread (now when already done).");

  py::class_<ndslice::Shape>(m, "Shape")
      .def(py::init(&make_shape), py::arg("labels"), py::arg("sizes"))
      .def_property_readonly("labels", &ndslice::Shape::labels)
      .def_property_readonly("sizes", &ndslice::Shape::sizes)
      .def("__len__", &ndslice::Shape::num_ranks)
      .def("global_rank", &ndslice::Shape::global_rank)
      .def("global_ranks", &global_ranks)
      .def("slice_index",
           py::overload_cast<std::string_view, std::size_t>(&ndslice::Shape::slice, py::const_))
      .def("slice_range",
           [](const ndslice::Shape& s, std::string_view dim, size_t b, std::optional<size_t> e,
              size_t step) { return s.slice(dim, make_range(b, e, step)); })
      .def("split", &ndslice::Shape::split)
      .def("flatten", &ndslice::Shape::flatten)
      .def("rename", &ndslice::Shape::rename)
      .def("__eq__", [](const ndslice::Shape& a, const ndslice::Shape& b) { return a == b; })
      .def("__repr__", &ndslice::Shape::to_string);

  py::class_<ProcMeshBox, std::shared_ptr<ProcMeshBox>>(m, "ProcMesh")
      .def_property_readonly("shape", [](const ProcMeshBox& b) { return b.procs->shape(); })
      .def_property_readonly("name", [](const ProcMeshBox& b) { return b.procs->name(); })
      .def(
          "with_view",
          [](const ProcMeshBox& b, ndslice::Shape v) {
            auto out = std::make_shared<ProcMeshBox>();
            out->procs = b.procs->with_view(std::move(v));
            out->shared = b.shared;
            return out;
          },
          py::call_guard<NoGil>())
      .def("spawn", &spawn_actors, py::arg("name"), py::arg("spec"), py::call_guard<NoGil>())
      .def(
          "stop", [](const ProcMeshBox& b) { return b.procs->stop(); }, py::call_guard<NoGil>())
      .def(
          "failed_ranks", [](const ProcMeshBox& b) { return b.procs->failed_ranks(); },
          py::call_guard<NoGil>())
      .def("pid", [](const ProcMeshBox& b, size_t i) { return b.procs->pid(i); })
      .def("address", [](const ProcMeshBox& b, size_t i) { return b.procs->address(i); })
      .def(
          "set_log_window",
          [](const ProcMeshBox& b, double seconds) {
            b.procs->set_log_window(
                std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
          },
          py::call_guard<NoGil>())
      .def("encode", &encode_procs)
      .def(
          "set_stream_logs", [](const ProcMeshBox& b, bool on) { b.procs->set_forward_logs(on); },
          py::call_guard<NoGil>())
      .def("set_failure_handler", [](const ProcMeshBox& b, py::object fn) {
        auto* p = fn.is_none() ? nullptr : new py::object(std::move(fn));
        py::object* old = nullptr;
        {
          std::lock_guard lock(b.shared->mu);
          old = std::exchange(b.shared->on_failure, p);
        }
        delete old;
      });

  py::class_<mesh::HostMesh>(m, "HostMesh")
      .def_property_readonly("labels", [](const mesh::HostMesh& h) { return h.extent().labels(); })
      .def_property_readonly("sizes", [](const mesh::HostMesh& h) { return h.extent().sizes(); })
      .def("spawn_procs", &spawn_procs, py::arg("labels"), py::arg("sizes"), py::arg("name"),
           py::arg("program"), py::arg("args"), py::arg("env"), py::arg("owned_by_actor"),
           py::arg("owner") = py::none(), py::call_guard<NoGil>(),
           "Spawns procs on every host; blocks until they are ready (GIL released).");
  m.def(
      "this_host", [] { return local_host(); }, py::call_guard<NoGil>());
  m.def(
      "attach_to_workers",
      [](const std::vector<std::string>& agents) { return mesh::attach_to_workers(agents); },
      py::arg("agents"), py::call_guard<NoGil>());
  m.def("is_worker", &is_worker);
  m.def("check_proc_mesh_name", &mesh::check_proc_mesh_name, py::arg("name"));
  m.def(
      "max_frame_bytes", [] { return config::global().bytes("channel.max_frame_bytes"); },
      "channel.max_frame_bytes: the largest message (bytes, headers included).");
  m.def(
      "local_address", [] { return local_proc().address(); }, py::call_guard<NoGil>());
  m.def(
      "set_fault_hook",
      [](py::function fn) {
        auto* keep = new py::object(std::move(fn));  // lives as long as the process
        local_host().set_fault_hook([keep](const ActorSupervisionEvent& ev) {
          if (!py_alive()) return;
          Gil gil;
          try {
            (*keep)(ev.to_string());
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("monarch: unhandled fault hook");
          }
        });
      },
      py::arg("fn"), "fn(report: str) receives failures nobody handled (a runtime thread).");
  m.def(
      "run_worker",
      [] {
        {
          NoGil nogil;
          mesh::bootstrap(0, nullptr, [](Proc& p, const mesh::WorkerInfo&) { set_worker_proc(p); });
        }
        throw UsageError(
            "monarch._worker: this process was not started by a host agent "
            "(MONARCH_WORKER_OWNER is not set)");
      },
      "Serves this process as a worker proc; never returns (the process exits when stopped).");

  py::class_<Mesh>(m, "ActorMesh")
      .def_property_readonly("shape", &Mesh::shape)
      .def("__len__", &Mesh::size)
      .def("member_name", [](const Mesh& a, size_t i) { return a.at(i).id().to_string(); })
      .def("with_view", &Mesh::with_view, py::call_guard<NoGil>())
      .def("survivors", &Mesh::survivors, py::call_guard<NoGil>())
      .def(
          "select", [](const Mesh& a, std::string_view text) { return a.select(text); },
          py::call_guard<NoGil>())
      .def("call", &mesh_call, py::call_guard<NoGil>())
      .def("call_one", &mesh_call_one, py::call_guard<NoGil>())
      .def("choose", &mesh_choose, py::call_guard<NoGil>())
      .def("choose_rank", &Mesh::choose_rank)
      .def("reduce", &mesh_reduce, py::call_guard<NoGil>())
      .def("stream", &mesh_stream, py::call_guard<NoGil>())
      .def(
          "broadcast",
          [](const Mesh& a, std::string method, std::string payload,
             const std::shared_ptr<Reply>& sender) {
            check_frame(method, payload);
            // The sending actor (its ActorHost's `me`), also when the broadcast is made off its
            // thread (an async endpoint, a queued one sent by the spawn's thread): a member it
            // cannot reach is reported to that actor's undeliverable() (PY-7), not to its Proc's
            // fault hook, and an owner is not told of a member lost with its proc (REM-6).
            monarch::detail::CurrentCell as(sending_cell(sender));
            a.broadcast(&PyActor::send, std::move(method), std::move(payload));
          },
          py::arg("method"), py::arg("payload"), py::arg("sender") = nullptr,
          py::call_guard<NoGil>())
      .def("stop", &mesh_stop, py::call_guard<NoGil>())
      .def("encode", &encode_mesh);
  m.def("decode_mesh", &decode_mesh, py::call_guard<NoGil>());
  m.def("spawn_local", &spawn_local, py::arg("name"), py::arg("spec"), py::call_guard<NoGil>());

  py::class_<RemoteProcs>(m, "RemoteProcMesh")
      .def_property_readonly("shape", &RemoteProcs::shape)
      .def_property_readonly("name", [](const RemoteProcs& r) { return r.name; })
      .def("with_view", &RemoteProcs::with_view)
      .def("spawn", &spawn_on_remote_procs, py::arg("name"), py::arg("spec"),
           py::call_guard<NoGil>())
      .def("encode", [](const RemoteProcs& r) {
        auto bytes = wire::encode(r);
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      });
  m.def("decode_procs", &decode_procs);

  py::class_<NativeStream>(m, "NativeStream")
      .def("remaining", &NativeStream::remaining)
      .def("next", &NativeStream::next, py::arg("timeout_s"));

  py::class_<NativePort>(m, "Port")
      .def("send", &NativePort::send, py::arg("payload"), py::arg("sender") = nullptr)
      .def("encode", &NativePort::encode)
      .def("__repr__", [](const NativePort& p) { return p.port.id().to_string(); });
  py::class_<NativeReceiver>(m, "PortReceiver")
      .def("recv", &NativeReceiver::recv, py::arg("timeout_s"))
      .def("try_recv", &NativeReceiver::try_recv);
  m.def("open_port", [] {
    NoGil nogil;
    auto [port, rx] = local_proc().open_port<std::string>();
    return std::make_pair(
        NativePort{std::move(port)},
        NativeReceiver{std::make_shared<PortReceiver<std::string>>(std::move(rx))});
  });
  m.def("decode_port", &decode_port, py::call_guard<NoGil>());
  register_rdma(m);
  register_launch(m);
}
