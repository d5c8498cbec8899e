#include <limits>

#include "monarch/mesh/proc_mesh.hpp"
#include "process_group.hpp"

namespace monarch::mesh {

size_t Context::message_rank() {
  size_t r = detail::current_message_rank();
  if (r == std::numeric_limits<size_t>::max()) {
    throw UsageError("Context::message_rank(): this handler was not reached through a mesh cast");
  }
  return r;
}

ProcMesh ProcMesh::local(const ndslice::Extent& extent, ProcOptions options) {
  if (extent.num_ranks() == 0) throw UsageError("ProcMesh::local: empty extent " + extent.to_string());
  auto state = std::make_shared<State>();
  state->scheduler = std::make_shared<ThreadPoolScheduler>(options.workers, options.batch);
  state->procs.reserve(extent.num_ranks());
  const std::string base = options.name == ProcOptions{}.name ? "local" : options.name;
  for (size_t r = 0; r < extent.num_ranks(); ++r) {
    ProcOptions o = options;
    o.name = base + "[" + std::to_string(r) + "]";
    o.scheduler = state->scheduler;
    state->procs.push_back(std::make_unique<Proc>(std::move(o)));
  }
  return ProcMesh(std::move(state), ndslice::Shape(extent));
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
  procs.clear();
}

}  // namespace monarch::mesh
