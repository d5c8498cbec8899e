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
  // A hop to a proc declared failed: that failure was reported by supervision already (and the
  // hop may even have run there before the proc died, unacknowledged).
  const bool known = proc().proc_failed(failure.destination().proc);
  spdlog::log(known ? spdlog::level::debug : spdlog::level::warn,
              "monarch.comm: dropped an undeliverable report: {}", failure.what());
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
  // CAST-9: a hop this relay cannot run goes back to the caster; the relay lives on.
  auto give_back = [this, to = detail::broadcast_caster(w),
                    endpoint = detail::cast_endpoint(w)](const std::string& why) {
    spdlog::error("monarch.comm of {}: dropped a broadcast: {}", proc().name(), why);
    monarch::detail::return_to_sender(proc(), to, DeliveryFailure(id(), endpoint, why));
  };
  auto fn = detail::find_remote_cast(w.handler);
  if (!fn) {
    return give_back("no cast handler '" + w.handler +
                     "' in this process (call mesh::register_cast for that endpoint here)");
  }
  try {
    (*fn)(proc(), std::move(w)).on_complete([give_back](monarch::detail::State<std::string>& s) {
      if (s.error) give_back(monarch::detail::describe_exception(s.error));
    });
  } catch (const std::exception& e) {
    give_back(e.what());
  }
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

std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p, const DeadProcs& dead) {
  if (dead.has(p)) throw UsageError("cast_path: proc " + std::to_string(p) + " is dead");
  auto path = cast_path(procs, fanout, p);
  std::erase_if(path, [&](uint32_t q) { return dead.has(q); });
  return path;
}

void CastFence::arrive() {
  {
    std::lock_guard lock(mu_);
    if (left_ == 0 || --left_ != 0) return;
    draining_ = true;
  }
  // The held casts go in their order, and casts made meanwhile join the queue (then()) until it
  // is empty: one that went at once could overtake an earlier one of its sender (CAST-3).
  for (;;) {
    UniqueFunction<void()> f;
    {
      std::lock_guard lock(mu_);
      if (waiting_.empty()) {
        draining_ = false;
        return;
      }
      f = std::move(waiting_.front());
      waiting_.pop_front();
    }
    try {
      f();
    } catch (const std::exception& e) {  // one cast's failure must not strand the others
      spdlog::error("monarch: a cast held by the spawn fence failed to start: {}", e.what());
    }
  }
}

void CastFence::then(UniqueFunction<void()> f) {
  {
    std::lock_guard lock(mu_);
    if (left_ != 0 || draining_) {
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

void bounce_unknown_actor(Envelope* e, const ActorId* to, Proc* proc) {
  std::unique_ptr<Envelope> owned(e);
  e->bounce(monarch::detail::gone_actor_failure(proc, to != nullptr ? *to : ActorId{},
                                                std::string(e->endpoint())));
}

std::string to_string_bytes(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

namespace {
// A wire with `w`'s payload (handler, arguments, reducer), fan-out and member names, and no
// destinations yet.
CastWire same_payload(const CastWire& w) {
  CastWire out;
  out.handler = w.handler;
  out.args = w.args;
  out.reducer = w.reducer;
  out.fanout = w.fanout;
  out.names = w.names;
  out.caster_proc = w.caster_proc;
  out.caster = w.caster;
  return out;
}
}  // namespace

CastWire cast_subtree_wire(const CastWire& w, const CastSpan& s, const DeadProcs& dead) {
  CastWire sub = same_payload(w);
  sub.lo = s.lo;
  sub.hi = s.hi;
  sub.comm.assign(w.comm.begin() + (s.lo - w.lo), w.comm.begin() + (s.hi - w.lo));
  sub.procs.assign(w.procs.begin() + s.db, w.procs.begin() + s.de);
  for (uint32_t i = s.db; i <= s.de; ++i) sub.starts.push_back(w.starts[i] - w.starts[s.db]);
  sub.runs.assign(w.runs.begin() + w.starts[s.db], w.runs.begin() + w.starts[s.de]);
  const auto b = std::lower_bound(dead.procs.begin(), dead.procs.end(), s.lo);
  const auto e = std::lower_bound(b, dead.procs.end(), s.hi);
  sub.dead.assign(b, e);
  sub.dead_causes.assign(dead.causes.begin() + (b - dead.procs.begin()),
                         dead.causes.begin() + (e - dead.procs.begin()));
  return sub;
}

std::vector<uint32_t> cast_ranks(const CastWire& w) {
  std::vector<uint32_t> out;
  for (const auto& run : w.runs) {
    for (uint32_t k = 0; k < run.count; ++k) out.push_back(run.rank + k);
  }
  return out;
}

DeadProcs relay_dead(Proc& proc, const CastWire& w) {
  DeadProcs dead;
  dead.procs = w.dead;
  dead.causes = w.dead_causes;
  if (proc.failed_proc_count() == 0) return dead;
  for (uint32_t p = w.lo; p < w.hi; ++p) {
    if (auto why = proc.proc_failure(w.comm[p - w.lo].proc)) dead.add(p, std::move(*why));
  }
  return dead;
}

void check_cast_size(Proc& caster, size_t bytes, const std::string& endpoint) {
  constexpr size_t kHeader = 64 * 1024;  // member runs, comm ids, dead procs, the frame header
  const size_t limit = caster.options().channel.max_frame_bytes;
  if (bytes + kHeader > limit) {
    throw UsageError("cast of " + endpoint + ": its arguments are " + std::to_string(bytes) +
                     " bytes; a cast hop carries at most channel.max_frame_bytes (" +
                     std::to_string(limit) + " bytes) less 64 KiB of cast header");
  }
}

std::string cast_endpoint(const CastWire& w) {
  const auto slash = w.handler.rfind('/');
  return slash == std::string::npos ? w.handler : w.handler.substr(slash + 1);
}

monarch::detail::ReportTo broadcast_caster(const CastWire& w) {
  return {w.caster_proc, w.caster};
}

void return_broadcast(Proc& here, const monarch::detail::ReportTo& to, const DeliveryFailure& f,
                      bool proc_failed) {
  if (proc_failed && to.sender.uid == 0) {
    // Outside actors, the proc's failure itself is what the caster hears (MeshFailure, REM-6).
    spdlog::debug("monarch.comm of {}: broadcast not delivered: {}", here.name(), f.what());
    return;
  }
  monarch::detail::return_to_sender(here, to, f);
}

void send_broadcast_hop(Proc& here, const monarch::detail::ReportTo& to, const ActorId& comm,
                        CastWire&& hop) {
  try {
    monarch::detail::remote_send_as<CommActor>(here, &to, comm, static_cast<size_t>(-1),
                                               &CommActor::cast_send, std::move(hop));
  } catch (const std::exception& e) {
    return_broadcast(
        here, to,
        DeliveryFailure(comm,
                        monarch::detail::remote_endpoint_name<CommActor>(&CommActor::cast_send),
                        e.what()),
        here.proc_failed(comm.proc));
  }
}

void return_broadcast_on_dead_proc(Proc& here, const CastWire& w, uint32_t di,
                                   const std::string& cause) {
  auto members = cast_members_of(w, di);
  if (members.empty()) return;
  std::string why = "its proc was declared failed: " + cause;
  if (members.size() > 1)
    why += " (with " + std::to_string(members.size() - 1) + " more member(s) of this broadcast)";
  return_broadcast(here, broadcast_caster(w),
                   DeliveryFailure(members[0].second, cast_endpoint(w), why), true);
}

std::vector<std::pair<uint32_t, ActorId>> cast_members_of(const CastWire& w, uint32_t di) {
  std::vector<std::pair<uint32_t, ActorId>> out;
  const std::string& proc = w.comm[w.procs[di] - w.lo].proc;
  for (uint32_t i = w.starts[di]; i < w.starts[di + 1]; ++i) {
    const MemberRun& run = w.runs[i];
    const std::string name = run.name < w.names.size() ? w.names[run.name] : std::string();
    for (uint32_t k = 0; k < run.count; ++k)
      out.emplace_back(run.rank + k, ActorId{proc, name, run.uid + k});
  }
  return out;
}

CastWire cast_wire_without(const CastWire& w, const DeadProcs& dead,
                           std::vector<LostMember>& lost) {
  CastWire out = same_payload(w);
  out.lo = w.lo;
  out.hi = w.hi;
  out.comm = w.comm;
  out.starts.push_back(0);
  for (uint32_t di = 0; di < w.procs.size(); ++di) {
    if (dead.has(w.procs[di])) {
      for (auto& [rank, id] : cast_members_of(w, di))
        lost.push_back(LostMember{rank, std::move(id), dead.cause(w.procs[di])});
      continue;
    }
    out.procs.push_back(w.procs[di]);
    out.runs.insert(out.runs.end(), w.runs.begin() + w.starts[di],
                    w.runs.begin() + w.starts[di + 1]);
    out.starts.push_back(static_cast<uint32_t>(out.runs.size()));
  }
  return out;
}

std::vector<CastWire> cast_root_hops(CastWire w, const DeadProcs& dead) {
  if (w.procs.empty()) return {};  // every destination was on a dead proc
  w.dead = dead.procs;
  w.dead_causes = dead.causes;
  if (!dead.has(0)) return {std::move(w)};
  std::vector<CastWire> hops;
  const CastSpan root{w.lo, w.hi, 0, static_cast<uint32_t>(w.procs.size())};
  auto child = [&](const CastSpan& s) { hops.push_back(cast_subtree_wire(w, s, dead)); };
  auto lost = [](uint32_t) {};  // none: the caster took dead destinations out of the plan
  plan_live_span(root, w.fanout, w.procs, dead, child, lost);
  return hops;
}

DeadProcs CastTopology::dead() const {
  DeadProcs out;
  if (client == nullptr || client->failed_proc_count() == 0) return out;
  for (uint32_t p = 0; p < comm.size(); ++p) {
    if (auto why = client->proc_failure(comm[p].id().proc)) out.add(p, std::move(*why));
  }
  return out;
}

CastPlan CastPlan::make(const std::vector<size_t>& globals, size_t per_proc) {
  CastPlan plan;
  plan.members.reserve(globals.size());
  uint32_t rank = 0;
  for (size_t g : globals) plan.members.emplace_back(g, rank++);
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

CastPlan CastPlan::make(const ndslice::Shape& view, size_t per_proc) {
  std::vector<size_t> globals;
  globals.reserve(view.num_ranks());
  for (size_t g : view.base()) globals.push_back(g);
  // Views never permute dims, so global ranks already ascend in message-rank order; make()
  // sorts anyway so that a future transposing view stays correct.
  return make(globals, per_proc);
}

}  // namespace detail

}  // namespace monarch::mesh
