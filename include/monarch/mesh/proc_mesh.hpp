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
  static ProcMesh local(const ndslice::Extent& extent, ProcOptions options = {});

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
  /// init() runs before its first message.
  template <class A, class... Args>
  ActorMesh<A> spawn(const std::string& name, const Args&... args) const {
    auto members = std::make_shared<std::vector<ActorRef<A>>>(state_->procs.size());
    for (size_t i = 0; i < size(); ++i) {
      size_t g = view_.global_rank(i);
      (*members)[g] = state_->procs[g]->template spawn<A>(name, args...);
    }
    return ActorMesh<A>(std::move(members), view_);
  }

 private:
  struct State {
    std::shared_ptr<Scheduler> scheduler;
    std::vector<std::unique_ptr<Proc>> procs;  // by global rank
    ~State();
  };
  ProcMesh(std::shared_ptr<State> s, ndslice::Shape v) : state_(std::move(s)), view_(std::move(v)) {}
  std::shared_ptr<State> state_;
  ndslice::Shape view_;
};

}  // namespace monarch::mesh
