// ProcMesh: procs arranged in a multi-dimensional Extent, e.g. {hosts: 2, gpus: 4}.
//
//   auto procs = monarch::mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 4}});  // LocalAllocator
//   auto actors = procs.spawn<Worker>("worker", arg);                           //
//   ActorMesh<Worker>
//
// LocalAllocator (ProcMesh::local): every proc is a Proc inside this process; all share one
// thread pool, so a mesh of thousands of procs costs no threads of its own (tests, simulation).
// ProcessAllocator / attach_to_workers (process.hpp): every proc is a process of its own, spawned
// by a host agent; the mesh watches it (exit, heartbeat) and reports failures (on_failure).
//
// Lifetime: the ProcMesh owns its procs; views (slices) share them. Destroying the last view
// stops every actor of every proc (children first) and then the shared scheduler.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/actor_mesh.hpp"
#include "monarch/mesh/failure.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

namespace process_detail {
struct ProcessGroup;
}
class HostMesh;

class ProcMesh {
 public:
  /// Receives each MeshFailure on the mesh's monitor thread; true = handled. Must not destroy
  /// the mesh it is called for.
  using FailureHandler = std::function<bool(const MeshFailure&)>;

  /// `extent` procs in this process (LocalAllocator). `options.workers` sizes the shared pool
  /// (0: one per core); `options.name` prefixes proc names ("<name>[<rank>]"). Throws UsageError
  /// for an extent of 0 ranks (a dim of size 0); Extent{} (no dims) is one proc.
  /// `cast` sets the cast tree (fan-out; see docs/cast-tree.md). Every proc gets its comm actor
  /// (detail::install_comm). Throws UsageError for a fanout of 0.
  static ProcMesh local(const ndslice::Extent& extent, ProcOptions options = {},
                        CastOptions cast = {});

  const ndslice::Shape& shape() const { return view_; }
  const ndslice::Extent& extent() const { return view_.extent(); }
  size_t size() const { return view_.num_ranks(); }

  ProcMesh slice(std::string_view dim, size_t index) const {
    return {state_, view_.slice(dim, index)};
  }
  ProcMesh slice(std::string_view dim, const ndslice::Range& r) const {
    return {state_, view_.slice(dim, r)};
  }

  /// This mesh under another view of its procs: `v` must come from shape() by Shape operations
  /// (slice, split, flatten, rename). The Python front end's mesh algebra goes through it. Throws
  /// UsageError when `v` holds a rank outside the mesh.
  ProcMesh with_view(ndslice::Shape v) const {
    for (size_t i = 0; i < v.num_ranks(); ++i) {
      if (v.global_rank(i) >= base_size()) {
        throw UsageError("with_view: view " + v.to_string() + " holds rank " +
                         std::to_string(v.global_rank(i)) + ", outside the mesh's " +
                         std::to_string(base_size()) + " procs");
      }
    }
    return {state_, std::move(v)};
  }

  /// The proc at local rank `local` of this view. Local meshes only (UsageError otherwise).
  Proc& proc(size_t local) const;

  // --- Process meshes (this_host().spawn_procs, attach_to_workers): UsageError on local ones. ---

  /// True when the procs are processes (spawned by host agents).
  bool is_process() const { return state_->group != nullptr; }
  /// The mesh's name (SpawnOptions::name).
  const std::string& name() const;
  /// The channel address of the proc at local rank `local`.
  std::string address(size_t local) const;
  /// Its pid on its host.
  int pid(size_t local) const;
  /// Replaces the failure handler (shared by every view of the mesh). Without one, failures go
  /// to the client Proc's fault hook.
  void on_failure(FailureHandler handler) const;
  /// Log aggregation of this mesh from now on: identical lines from several procs within
  /// `window` print once, with the ranks that wrote them (0: every line at once). Lines already
  /// held print at the end of the current window. Default: the HostMesh's
  /// ProcTimeouts::log_window. Throws UsageError for a negative window. Any thread.
  void set_log_window(std::chrono::milliseconds window) const;
  /// Whether the procs' output is forwarded from now on (SpawnOptions::forward_logs at spawn;
  /// false drops lines as they arrive). Any thread.
  void set_forward_logs(bool on) const;
  /// Global ranks that failed so far, ascending. Failed procs are never reused.
  std::vector<size_t> failed_ranks() const;
  /// The client Proc that owns the mesh.
  Proc& client() const;
  /// Stops every proc of the whole mesh: a stop request reaches each rank directly; procs not
  /// gone within ProcTimeouts::stop_timeout are killed. Returns true when every live proc exited
  /// when asked. Blocks for at most stop_timeout plus a kill grace; idempotent. The destructor of
  /// the last view calls it.
  bool stop() const;

  /// Internal, for front ends that ship a process mesh to another process (the Python
  /// bindings), which then spawns on it as spawn() does: the comm actor of every proc by global
  /// rank, and the cast tree's fan-out (SpawnOptions::cast). Process meshes only (UsageError).
  std::vector<ActorId> comm_ids() const;
  size_t cast_fanout() const;

  /// The actors registered as `name` (Proc::register_name, e.g. in the WorkerSetup) on every
  /// proc of this view, as an ActorMesh. Blocks up to spawn_timeout. Throws UsageError when the
  /// view holds a failed rank, DeliveryFailure/UsageError from the lookup otherwise.
  template <class A>
  ActorMesh<A> lookup(const std::string& name) const {
    std::vector<ActorId> members(base_size());
    std::vector<std::pair<size_t, Future<ActorRef<A>>>> pending;
    for (size_t i = 0; i < size(); ++i) {
      check_usable(i);
      pending.emplace_back(view_.global_rank(i),
                           client().template lookup_remote<A>(address(i), name));
    }
    for (auto& [g, f] : pending) members[g] = f.get(lookup_timeout()).id();
    return ActorMesh<A>::from_ids(client(), members, view_, comm_ids(), cast_fanout(), 1, nullptr,
                                  lifetime());
  }

  /// One A per proc of this view, constructed from copies of `args`. Does not block; each actor's
  /// init() runs before its first message. The ActorMesh has the extent of this view.
  /// On a process mesh: remote spawn (Proc::spawn_remote) from the client Proc, which owns the
  /// actors; an unhandled failure of one becomes a MeshFailure of its rank. Throws UsageError when
  /// the view holds a failed rank.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const Args&... args) const {
    return spawn_per_proc<A>(name, ndslice::Extent(), args...);
  }

  /// Several A per proc: `per_proc` (e.g. {{"actors", 256}}) is appended to this view's dims, so
  ///   procs.spawn<W>("w", {{"actors", 256}}, arg)   // on {hosts: 2, gpus: 8}
  /// gives an ActorMesh with extent {hosts: 2, gpus: 8, actors: 256}; the members of one proc
  /// are consecutive in it. Throws UsageError when a per-proc dim repeats a proc dim.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const ndslice::Extent& per_proc,
                     const Args&... args) const {
    return spawn_per_proc<A>(name, per_proc, args...);
  }

 private:
  friend class HostMesh;
  template <class A, class... Args>
  ActorMesh<A> spawn_per_proc(const std::string& name, const ndslice::Extent& per_proc,
                              const Args&... args) const {
    const size_t k = per_proc.num_ranks();
    // The new mesh's view; member a of local proc i has local rank i * k + a in it, and that
    // point is its Context::actor_rank(). Built first: a repeated per-proc dim throws before any
    // spawn.
    ndslice::Shape view = actor_view(per_proc);
    const ndslice::Extent& extent = view.extent();
    if (is_process()) {
      // Casts travel down the cast tree of the workers' comm actors (installed at bootstrap).
      std::vector<ActorId> members(base_size() * k);
      for (size_t i = 0; i < size(); ++i) check_usable(i);
      // CAST-11: a request on each proc's link after its Spawns opens the mesh's cast fence.
      auto fence = std::make_shared<detail::CastFence>(size());
      for (size_t i = 0; i < size(); ++i) {
        size_t g = view_.global_rank(i);
        for (size_t a = 0; a < k; ++a) {
          members[g * k + a] = client()
                                   .template spawn_remote_member<A>(extent.point(i * k + a),
                                                                    address(i), name, args...)
                                   .id();
        }
        try {
          // Not lookup_remote: its then() would run in the calling actor, which may be blocked
          // waiting for this very cast (a handler that spawns, casts and get()s).
          client()
              .remote_lookup_id(address(i), kCommActorName,
                                monarch::detail::demangle(typeid(CommActor).name()))
              .on_complete([fence](auto&) { fence->arrive(); });
        } catch (...) {
          fence->arrive();  // the cast then fails on its own (DeliveryFailure, SupervisionError)
        }
      }
      return ActorMesh<A>::from_ids(client(), members, std::move(view), comm_ids(), cast_fanout(),
                                    k, std::move(fence), lifetime());
    }
    auto members = std::make_shared<std::vector<ActorRef<A>>>(state_->procs.size() * k);
    for (size_t i = 0; i < size(); ++i) {
      size_t g = view_.global_rank(i);
      for (size_t a = 0; a < k; ++a) {
        (*members)[g * k + a] = state_->procs[g]->template spawn_member<A>(
            std::make_shared<const ndslice::Point>(extent.point(i * k + a)), name, args...);
      }
    }
    return ActorMesh<A>(std::move(members), std::move(view), state_->topo, k);
  }

  struct State {
    std::shared_ptr<Scheduler> scheduler;
    std::vector<std::unique_ptr<Proc>> procs;  // by global rank (local meshes)
    std::shared_ptr<const detail::CastTopology> topo;
    std::shared_ptr<process_detail::ProcessGroup> group;  // process meshes
    // Local meshes: set once `procs` are shut down, before they are freed (MeshLifetime::gone).
    std::shared_ptr<std::atomic<bool>> procs_gone = std::make_shared<std::atomic<bool>>(false);
    ~State();
  };
  // This view with `per_proc`'s dims appended, over the actor base space (k ranks per proc).
  ndslice::Shape actor_view(const ndslice::Extent& per_proc) const;
  size_t base_size() const;
  void check_usable(size_t local) const;
  std::chrono::milliseconds lookup_timeout() const;
  // The lifetime flags of the meshes spawned here: this mesh's stop, its client Proc's end.
  detail::MeshLifetime lifetime() const;
  process_detail::ProcessGroup& group() const;

  ProcMesh(std::shared_ptr<State> s, ndslice::Shape v)
      : state_(std::move(s)), view_(std::move(v)) {}
  std::shared_ptr<State> state_;
  ndslice::Shape view_;
};

}  // namespace monarch::mesh
