// The non-template parts of the cast tree (monarch/mesh/cast.hpp): the comm actor's endpoints,
// the per-process registry of remote cast handlers, the tree planner's path, the cast plan and the
// hop of a child subtree across processes.
#include "monarch/mesh/cast.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace monarch::mesh {

size_t Context::message_rank() {
  size_t r = monarch::detail::current_message_rank();
  if (r == std::numeric_limits<size_t>::max()) {
    throw UsageError("Context::message_rank(): this handler was not reached through a mesh cast");
  }
  return r;
}

ndslice::Point Context::actor_rank() {
  const monarch::detail::Cell* c = monarch::detail::current_cell();
  if (c == nullptr) {
    throw UsageError("Context::actor_rank(): called outside an actor's handler");
  }
  if (!c->mesh_point()) {
    throw UsageError("Context::actor_rank(): actor " + c->id().to_string() + " (" + c->type_name() +
                     ") was not spawned by ProcMesh::spawn, so it has no rank in an actor mesh");
  }
  return *c->mesh_point();
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
  // Follows the relay's own planner down to p: a cast whose only destination is proc p.
  const std::vector<uint32_t> dest{p};
  std::vector<uint32_t> path{0};
  CastSpan node{0, procs, 0, 1};
  while (node.lo != p) {
    plan_cast_node(node, fanout, dest, [&](const CastSpan& child) { node = child; });
    path.push_back(node.lo);
  }
  return path;
}

void CastFence::arrive() {
  std::vector<UniqueFunction<void()>> run;
  {
    std::lock_guard lock(mu_);
    if (left_ == 0 || --left_ != 0) return;
    run.swap(waiting_);
  }
  for (auto& f : run) f();
}

void CastFence::then(UniqueFunction<void()> f) {
  {
    std::lock_guard lock(mu_);
    if (left_ != 0) {
      waiting_.push_back(std::move(f));
      return;
    }
  }
  f();
}

void CastTopology::when_ready(UniqueFunction<void()> send) const {
  if (fence) return fence->then(std::move(send));
  send();
}

void bounce_unknown_actor(Envelope* e, const ActorId* to) {
  std::unique_ptr<Envelope> owned(e);
  e->bounce(DeliveryFailure(to != nullptr ? *to : ActorId{}, std::string(e->endpoint()),
                            "unknown actor"));
}

std::string to_string_bytes(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

CastWire cast_subtree_wire(const CastWire& w, const CastSpan& s) {
  CastWire sub;
  sub.handler = w.handler;
  sub.args = w.args;
  sub.reducer = w.reducer;
  sub.lo = s.lo;
  sub.hi = s.hi;
  sub.fanout = w.fanout;
  sub.comm.assign(w.comm.begin() + (s.lo - w.lo), w.comm.begin() + (s.hi - w.lo));
  sub.procs.assign(w.procs.begin() + s.db, w.procs.begin() + s.de);
  for (uint32_t i = s.db; i <= s.de; ++i) sub.starts.push_back(w.starts[i] - w.starts[s.db]);
  sub.names = w.names;
  sub.runs.assign(w.runs.begin() + w.starts[s.db], w.runs.begin() + w.starts[s.de]);
  return sub;
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

}  // namespace monarch::mesh
