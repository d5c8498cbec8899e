#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "monarch/mesh/proc_mesh.hpp"
#include "process_group.hpp"

namespace monarch::mesh {

size_t Context::message_rank() {
  size_t r = monarch::detail::current_message_rank();
  if (r == std::numeric_limits<size_t>::max()) {
    throw UsageError("Context::message_rank(): this handler was not reached through a mesh cast");
  }
  return r;
}

void CommActor::undeliverable(const DeliveryFailure& failure) {
  spdlog::warn("monarch.comm: dropped an undeliverable report: {}", failure.what());
}

Future<std::string> CommActor::cast(CastWire w) {
  auto fn = detail::find_remote_cast(w.handler);
  if (!fn) {
    return Future<std::string>::ready_error(std::make_exception_ptr(
        UsageError("comm actor of " + proc().name() + ": no cast handler '" + w.handler +
                   "' in this process (call mesh::register_cast for that endpoint here)")));
  }
  return (*fn)(proc(), std::move(w));
}

void CommActor::cast_send(CastWire w) {
  auto fn = detail::find_remote_cast(w.handler);
  if (!fn) {
    spdlog::error("monarch.comm of {}: dropped a broadcast: no cast handler '{}' in this process",
                  proc().name(), w.handler);
    return;
  }
  (void)(*fn)(proc(), std::move(w));
}

namespace detail {

namespace {
// Function-local: handlers are also registered during static initialisation of other
// translation units (RemoteCast::auto_registered), before this file's globals would exist.
struct CastRegistry {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<RemoteCastFn>> map;
};
CastRegistry& casts() {
  static CastRegistry* r = new CastRegistry;  // never destroyed: used until process exit
  return *r;
}
}  // namespace

void add_remote_cast(const std::string& key, std::shared_ptr<RemoteCastFn> fn) {
  auto& r = casts();
  std::lock_guard lock(r.mu);
  r.map.try_emplace(key, std::move(fn));
}

std::shared_ptr<RemoteCastFn> find_remote_cast(const std::string& key) {
  auto& r = casts();
  std::lock_guard lock(r.mu);
  auto it = r.map.find(key);
  return it == r.map.end() ? nullptr : it->second;
}

void throw_not_castable(const char* adverb, const std::string& what) {
  throw UsageError(std::string(adverb) + ": " + what +
                   " not serialisable (or the reducer captures state that is not), so this cast "
                   "cannot reach comm actors in other processes");
}

ActorRef<CommActor> install_comm(Proc& proc) {
  auto ref = proc.spawn<CommActor>(kCommActorName);
  proc.register_name(kCommActorName, ref);
  return ref;
}

std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p) {
  if (p >= procs)
    throw UsageError("cast_path: proc " + std::to_string(p) + " is not below " +
                     std::to_string(procs));
  std::vector<uint32_t> path{0};
  uint32_t lo = 0, hi = procs;
  while (lo != p) {
    const uint32_t chunk = cast_chunk(lo, hi, fanout);
    const uint32_t clo = lo + 1 + (p - lo - 1) / chunk * chunk;
    hi = std::min(clo + chunk, hi);
    lo = clo;
    path.push_back(lo);
  }
  return path;
}

CastPlan CastPlan::make(const ndslice::Shape& view, size_t per_proc) {
  CastPlan plan;
  plan.members.reserve(view.num_ranks());
  uint32_t rank = 0;
  for (size_t g : view.base()) plan.members.emplace_back(g, rank++);
  // Views never permute dims, so global ranks already ascend in message-rank order; sort anyway
  // so that a future transposing view stays correct.
  if (!std::is_sorted(plan.members.begin(), plan.members.end()))
    std::sort(plan.members.begin(), plan.members.end());
  for (uint32_t i = 0; i < plan.members.size(); ++i) {
    auto p = static_cast<uint32_t>(plan.members[i].first / per_proc);
    if (plan.procs.empty() || plan.procs.back() != p) {
      plan.procs.push_back(p);
      plan.starts.push_back(i);
    }
  }
  plan.starts.push_back(static_cast<uint32_t>(plan.members.size()));
  return plan;
}

}  // namespace detail

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
  topo.reset();  // our references to the comm actors go before their procs
  procs.clear();
}

}  // namespace monarch::mesh
