#include <algorithm>

#include "monarch/mesh/proc_mesh.hpp"
#include "process_group.hpp"

namespace monarch::mesh {

ProcMesh ProcMesh::local(const ndslice::Extent& extent, ProcOptions options, CastOptions cast) {
  if (extent.num_ranks() == 0)
    throw UsageError("ProcMesh::local: empty extent " + extent.to_string());
  if (extent.num_ranks() > 1 && !options.listen.empty() &&
      options.listen.find("{rank}") == std::string::npos) {
    throw UsageError("ProcMesh::local: ProcOptions::listen '" + options.listen +
                     "' must contain {rank} (each proc serves its own address)");
  }
  if (cast.fanout == 0) throw UsageError("ProcMesh::local: CastOptions::fanout must be at least 1");
  auto state = std::make_shared<State>();
  state->scheduler = std::make_shared<ThreadPoolScheduler>(options.workers, options.batch);
  state->procs.reserve(extent.num_ranks());
  const std::string base = options.name == ProcOptions{}.name ? "local" : options.name;
  auto topo = std::make_shared<detail::CastTopology>();
  topo->fanout = cast.fanout;
  topo->life.gone = state->procs_gone;
  topo->life.mesh = base;
  topo->comm.reserve(extent.num_ranks());
  for (size_t r = 0; r < extent.num_ranks(); ++r) {
    ProcOptions o = options;
    o.name = base + "[" + std::to_string(r) + "]";
    if (auto at = o.listen.find("{rank}"); at != std::string::npos)
      o.listen.replace(at, 6, std::to_string(r));
    o.scheduler = state->scheduler;
    state->procs.push_back(std::make_unique<Proc>(std::move(o)));
    topo->comm.push_back(detail::install_comm(*state->procs.back()));
  }
  state->topo = std::move(topo);
  return ProcMesh(std::move(state), ndslice::Shape(extent));
}

ndslice::Shape ProcMesh::actor_view(const ndslice::Extent& per_proc) const {
  const size_t k = per_proc.num_ranks();
  const auto& sl = view_.base();
  std::vector<std::string> labels = view_.labels();
  std::vector<size_t> sizes = sl.sizes();
  std::vector<size_t> strides;
  strides.reserve(sizes.size() + per_proc.sizes().size());
  for (size_t s : sl.strides()) strides.push_back(s * k);
  for (const auto& l : per_proc.labels()) {
    if (std::find(labels.begin(), labels.end(), l) != labels.end()) {
      throw UsageError("ProcMesh::spawn: per-proc dim '" + l + "' repeats a dim of the proc mesh " +
                       extent().to_string());
    }
    labels.push_back(l);
  }
  // Row-major dense strides of the per-proc dims (the last one fastest).
  const auto& psizes = per_proc.sizes();
  std::vector<size_t> pstrides(psizes.size());
  size_t stride = 1;
  for (size_t i = psizes.size(); i-- > 0;) {
    pstrides[i] = stride;
    stride *= psizes[i];
  }
  sizes.insert(sizes.end(), psizes.begin(), psizes.end());
  strides.insert(strides.end(), pstrides.begin(), pstrides.end());
  return ndslice::Shape(std::move(labels),
                        ndslice::Slice(sl.offset() * k, std::move(sizes), std::move(strides)));
}

ProcMesh::State::~State() {
  if (group) {
    group->stop();
    group.reset();
    return;
  }
  // Stop every proc's actors in parallel (all requests go out before anyone waits), then join the
  // shared pool (so no actor runs afterwards), then destroy the procs: the same order as a Proc
  // with its own scheduler.
  for (auto& p : procs) p->begin_shutdown();
  for (auto& p : procs) p->shutdown(p->options().stop_timeout);
  if (scheduler) scheduler->shutdown();
  procs_gone->store(true, std::memory_order_release);  // actor meshes that outlive us refuse
  topo.reset();  // our references to the comm actors go before their procs
  procs.clear();
}

}  // namespace monarch::mesh
