// ProcMesh: procs arranged in a multi-dimensional Extent, e.g. {hosts: 2, gpus: 4}.
//
//   auto procs = monarch::mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 4}});  // LocalAllocator
//   auto actors = procs.spawn<Worker>("worker", arg);                           // ActorMesh<Worker>
//
// LocalAllocator (ProcMesh::local): every proc is a Proc inside this process; all share one
// thread pool, so a mesh of thousands of procs costs no threads of its own (tests, simulation).
// Process and remote allocators come next (issue 5).
//
// Lifetime: the ProcMesh owns its procs; views (slices) share them. Destroying the last view
// stops every actor of every proc (children first) and then the shared scheduler.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/actor_mesh.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

class ProcMesh {
 public:
  /// `extent` procs in this process (LocalAllocator). `options.workers` sizes the shared pool
  /// (0: one per core); `options.name` prefixes proc names ("<name>[<rank>]"). Throws UsageError
  /// for an empty extent.
  /// `cast` sets the cast tree (fan-out; see docs/cast-tree.md). Every proc gets its comm actor
  /// (detail::install_comm). Throws UsageError for a fanout of 0.
  static ProcMesh local(const ndslice::Extent& extent, ProcOptions options = {}, CastOptions cast = {});

  const ndslice::Shape& shape() const { return view_; }
  const ndslice::Extent& extent() const { return view_.extent(); }
  size_t size() const { return view_.num_ranks(); }

  ProcMesh slice(std::string_view dim, size_t index) const { return {state_, view_.slice(dim, index)}; }
  ProcMesh slice(std::string_view dim, const ndslice::Range& r) const {
    return {state_, view_.slice(dim, r)};
  }

  /// The proc at local rank `local` of this view.
  Proc& proc(size_t local) const { return *state_->procs[view_.global_rank(local)]; }

  /// One A per proc of this view, constructed from copies of `args`. Does not block; each actor's
  /// init() runs before its first message. The ActorMesh has the extent of this view.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const Args&... args) const {
    return spawn_per_proc<A>(name, ndslice::Extent(), args...);
  }

  /// Several A per proc: `per_proc` (e.g. {{"actors", 256}}) is appended to this view's dims, so
  ///   procs.spawn<W>("w", {{"actors", 256}}, arg)   // on {hosts: 2, gpus: 8}
  /// gives an ActorMesh with extent {hosts: 2, gpus: 8, actors: 256}; the members of one proc
  /// are consecutive in it. Throws UsageError when a per-proc dim repeats a proc dim.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const ndslice::Extent& per_proc, const Args&... args) const {
    return spawn_per_proc<A>(name, per_proc, args...);
  }

 private:
  template <class A, class... Args>
  ActorMesh<A> spawn_per_proc(const std::string& name, const ndslice::Extent& per_proc, const Args&... args) const {
    const size_t k = per_proc.num_ranks();
    auto members = std::make_shared<std::vector<ActorRef<A>>>(state_->procs.size() * k);
    for (size_t i = 0; i < size(); ++i) {
      size_t g = view_.global_rank(i);
      for (size_t a = 0; a < k; ++a) (*members)[g * k + a] = state_->procs[g]->template spawn<A>(name, args...);
    }
    return ActorMesh<A>(std::move(members), actor_view(per_proc), state_->topo, k);
  }

  struct State {
    std::shared_ptr<Scheduler> scheduler;
    std::vector<std::unique_ptr<Proc>> procs;  // by global rank
    std::shared_ptr<const detail::CastTopology> topo;
    ~State();
  };
  // This view with `per_proc`'s dims appended, over the actor base space (k ranks per proc).
  ndslice::Shape actor_view(const ndslice::Extent& per_proc) const;

  ProcMesh(std::shared_ptr<State> s, ndslice::Shape v) : state_(std::move(s)), view_(std::move(v)) {}
  std::shared_ptr<State> state_;
  ndslice::Shape view_;
};

}  // namespace monarch::mesh
