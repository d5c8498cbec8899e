// ProcMesh: procs arranged in a multi-dimensional Extent, e.g. {hosts: 2, gpus: 4}.
//
//   auto procs = monarch::mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 4}});  // LocalAllocator
//   auto actors = procs.spawn<Worker>("worker", arg);                           // ActorMesh<Worker>
//
// LocalAllocator (ProcMesh::local): every proc is a Proc inside this process; all share one
// thread pool, so a mesh of thousands of procs costs no threads of its own (tests, simulation).
// ProcessAllocator / attach_to_workers (process.hpp): every proc is a process of its own, spawned
// by a host agent; the mesh watches it (exit, heartbeat) and reports failures (on_failure).
//
// Lifetime: the ProcMesh owns its procs; views (slices) share them. Destroying the last view
// stops every actor of every proc (children first) and then the shared scheduler.
#pragma once

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
  /// for an empty extent.
  static ProcMesh local(const ndslice::Extent& extent, ProcOptions options = {});

  const ndslice::Shape& shape() const { return view_; }
  const ndslice::Extent& extent() const { return view_.extent(); }
  size_t size() const { return view_.num_ranks(); }

  ProcMesh slice(std::string_view dim, size_t index) const { return {state_, view_.slice(dim, index)}; }
  ProcMesh slice(std::string_view dim, const ndslice::Range& r) const {
    return {state_, view_.slice(dim, r)};
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
  /// Global ranks that failed so far, ascending. Failed procs are never reused.
  std::vector<size_t> failed_ranks() const;
  /// The client Proc that owns the mesh.
  Proc& client() const;
  /// Stops every proc of the whole mesh: a stop request reaches each rank directly; procs not
  /// gone within ProcTimeouts::stop_timeout are killed. Returns true when every live proc exited
  /// when asked. Blocks for at most stop_timeout plus a kill grace; idempotent. The destructor of
  /// the last view calls it.
  bool stop() const;

  /// The actors registered as `name` (Proc::register_name, e.g. in the WorkerSetup) on every
  /// proc of this view, as an ActorMesh. Blocks up to spawn_timeout. Throws UsageError when the
  /// view holds a failed rank, DeliveryFailure/UsageError from the lookup otherwise.
  template <class A>
  ActorMesh<A> lookup(const std::string& name) const {
    auto members = std::make_shared<std::vector<ActorRef<A>>>(base_size());
    std::vector<std::pair<size_t, Future<ActorRef<A>>>> pending;
    for (size_t i = 0; i < size(); ++i) {
      check_usable(i);
      pending.emplace_back(view_.global_rank(i), client().template lookup_remote<A>(address(i), name));
    }
    for (auto& [g, f] : pending) (*members)[g] = f.get(lookup_timeout());
    return ActorMesh<A>(std::move(members), view_);
  }

  /// One A per proc of this view, constructed from copies of `args`. Does not block; each actor's
  /// init() runs before its first message.
  /// On a process mesh: remote spawn (Proc::spawn_remote) from the client Proc, which owns the
  /// actors; an unhandled failure of one becomes a MeshFailure of its rank. Throws UsageError when
  /// the view holds a failed rank.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const Args&... args) const {
    if (is_process()) {
      auto members = std::make_shared<std::vector<ActorRef<A>>>(base_size());
      for (size_t i = 0; i < size(); ++i) {
        check_usable(i);
        (*members)[view_.global_rank(i)] = client().template spawn_remote<A>(address(i), name, args...);
      }
      return ActorMesh<A>(std::move(members), view_);
    }
    auto members = std::make_shared<std::vector<ActorRef<A>>>(state_->procs.size());
    for (size_t i = 0; i < size(); ++i) {
      size_t g = view_.global_rank(i);
      (*members)[g] = state_->procs[g]->template spawn<A>(name, args...);
    }
    return ActorMesh<A>(std::move(members), view_);
  }

 private:
  friend class HostMesh;
  struct State {
    std::shared_ptr<Scheduler> scheduler;
    std::vector<std::unique_ptr<Proc>> procs;  // by global rank (local meshes)
    std::shared_ptr<process_detail::ProcessGroup> group;  // process meshes
    ~State();
  };
  size_t base_size() const;
  void check_usable(size_t local) const;
  std::chrono::milliseconds lookup_timeout() const;
  process_detail::ProcessGroup& group() const;
  ProcMesh(std::shared_ptr<State> s, ndslice::Shape v) : state_(std::move(s)), view_(std::move(v)) {}
  std::shared_ptr<State> state_;
  ndslice::Shape view_;
};

}  // namespace monarch::mesh
