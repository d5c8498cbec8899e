// The public API of process meshes: HostMesh (this_host, attach_to_workers, spawn_procs) and the
// process-mesh members of ProcMesh, over the state in process_group.hpp.
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "monarch/actor/detail/hooks.hpp"
#include "monarch/channel/channel.hpp"
#include "process_group.hpp"

namespace monarch::mesh {

namespace process_detail {

HostMeshState::~HostMeshState() {
  gate->close();
  agents.clear();
  if (client) client->shutdown(client->options().stop_timeout);
  procs_gone->store(true, std::memory_order_release);  // actor meshes that outlive us refuse
  client.reset();
}

}  // namespace process_detail

struct HostMesh::State : process_detail::HostMeshState {};

namespace {
// Default mesh names: procs0, procs1, ... in spawn order (their own counter: g_counter also
// numbers addresses and controllers).
std::atomic<uint64_t> g_mesh_counter{0};

// HostMeshes that may be alive at exit (keep_hosts_at_exit in process.hpp). Never destroyed: the
// exit handler reads it after main returned.
struct LiveHosts {
  std::mutex mu;
  std::vector<std::weak_ptr<HostMesh::State>> states;   // in creation order
  std::vector<std::shared_ptr<HostMesh::State>> stuck;  // whose actors did not stop at exit
  bool keep = false;
  bool registered = false;  // the atexit handler
};
LiveHosts& live_hosts() {
  static auto* l = new LiveHosts();
  return *l;
}

// The atexit handler. A HostMesh alive here is kept by something that was never destroyed: most
// often an actor of its own client holding a copy (a cycle), which kept the client's I/O and
// actor threads running into the static destructors (asio's and spdlog's statics, used by them).
void stop_live_hosts_at_exit() {
  // exit() from a handler or the I/O thread: stopping would wait on the calling thread itself.
  if (monarch::detail::current_cell() != nullptr || channel::IoRuntime::on_io_thread()) return;
  std::vector<std::shared_ptr<HostMesh::State>> held;
  {
    auto& l = live_hosts();
    std::lock_guard lock(l.mu);
    if (l.keep) return;
    for (auto& w : l.states) {
      if (auto s = w.lock()) held.push_back(std::move(s));
    }
    l.states.clear();
  }
  while (!held.empty()) {  // newest first, as destructors would run
    auto s = std::move(held.back());
    held.pop_back();
    // Failures from here on are the exit's own (a mesh whose agent stops under it): not reported.
    s->exiting.store(true, std::memory_order_release);
    // Its process meshes stop first, side by side, while the client's actors (the agent, the
    // mesh controllers) still serve them. Held here, none is freed meanwhile by its last handle.
    std::vector<std::shared_ptr<process_detail::ProcessGroup>> groups;
    {
      std::lock_guard lock(s->groups_mu);
      for (auto* g : s->groups) {
        if (auto live = g->weak_from_this().lock()) groups.push_back(std::move(live));
      }
    }
    {
      std::vector<std::jthread> stops;
      for (auto& g : groups) stops.emplace_back([&g] { g->stop(); });
    }
    groups.clear();
    // Then the client's actors (cleanup() runs); destroying them releases the handles they held.
    if (!s->client->shutdown(s->client->options().stop_timeout)) {
      // Destroying it would wait on the actors that did not stop: the process's exit ends them.
      std::lock_guard lock(live_hosts().mu);
      live_hosts().stuck.push_back(std::move(s));
      continue;
    }
    s.reset();  // the last handle, unless something else still holds one: ~HostMeshState, here
  }
}

void track_at_exit(const std::shared_ptr<HostMesh::State>& s) {
  auto& l = live_hosts();
  std::lock_guard lock(l.mu);
  std::erase_if(l.states, [](const auto& w) { return w.expired(); });
  l.states.push_back(s);
  // Registered after the client Proc was built: the statics its threads use (spdlog's registry,
  // asio's error categories: IoRuntime builds them) are destroyed after this handler runs.
  if (!std::exchange(l.registered, true)) std::atexit(stop_live_hosts_at_exit);
}

std::shared_ptr<HostMesh::State> make_host_state(const HostOptions& options,
                                                 const std::string& listen) {
  options.timeouts.validate();
  process_detail::ProcessHost::instance();  // its threads (PDEATHSIG anchor) start before any child
  auto s = std::make_shared<HostMesh::State>();
  s->timeouts = options.timeouts;
  ProcOptions o;
  o.listen = listen;
  o.channel = options.channel;
  s->client = std::make_unique<Proc>(o);
  // Failures reaching the client: of actors on our procs -> MeshFailure; others -> the user hook.
  auto* raw = s.get();
  s->client->set_fault_hook([raw](const ActorSupervisionEvent& ev) { raw->on_fault(ev); });
  track_at_exit(s);
  return s;
}
}  // namespace

void keep_hosts_at_exit() {
  std::lock_guard lock(live_hosts().mu);
  live_hosts().keep = true;
}

HostMesh this_host(HostOptions options) {
  std::string listen = options.listen.empty()
                           ? "unix://@monarch-client-" + std::to_string(::getpid()) + "-" +
                                 std::to_string(process_detail::g_counter++)
                           : options.listen;
  auto s = make_host_state(options, listen);
  auto agent = s->client->spawn<process_detail::HostAgent>(
      "monarch.agent", process_detail::worker_listen_base(s->client->address()), s->gate);
  s->incarnations.push_back(
      agent.call(&process_detail::HostAgent::incarnation).get(options.timeouts.spawn_timeout));
  s->agents.push_back(agent);
  s->agent_addrs.push_back("embedded in " + s->client->address());
  return HostMesh(s);
}

HostMesh attach_to_workers(const std::vector<std::string>& agents, HostOptions options) {
  if (agents.empty()) throw UsageError("attach_to_workers: no agent addresses");
  std::string listen = options.listen;
  if (listen.empty()) {
    listen = agents[0].starts_with("tcp://")
                 ? "tcp://127.0.0.1:0"
                 : "unix://@monarch-client-" + std::to_string(::getpid()) + "-" +
                       std::to_string(process_detail::g_counter++);
  }
  auto s = make_host_state(options, listen);
  s->extent = ndslice::Extent({"hosts"}, {agents.size()});
  for (const auto& addr : agents) {
    std::string mismatch;
    try {
      auto ref = s->client->lookup_remote<process_detail::HostAgent>(addr, "monarch.agent")
                     .get(options.timeouts.spawn_timeout);
      s->incarnations.push_back(
          ref.call(&process_detail::HostAgent::incarnation).get(options.timeouts.spawn_timeout));
      // PH-8: one protocol version on both sides (incarnation() above is answered by every build).
      try {
        uint32_t v =
            ref.call(&process_detail::HostAgent::wire_version).get(options.timeouts.spawn_timeout);
        if (v != process_detail::kAgentWireVersion) {
          mismatch = "speaks agent wire version " + std::to_string(v) + ", this program " +
                     std::to_string(process_detail::kAgentWireVersion);
        }
      } catch (const DeliveryFailure& e) {
        if (e.reason().find("no registered endpoint") == std::string::npos) throw;
        mismatch =
            "is from an older monarch build (it does not report its wire version; this "
            "program speaks " +
            std::to_string(process_detail::kAgentWireVersion) + ")";
      }
      s->agents.push_back(ref);
      s->agent_addrs.push_back(addr);
    } catch (const TimeoutError&) {
      const std::string why = s->client->link_error(addr);
      // What is still queued for the agent is dropped now: the client Proc's shutdown (when `s`
      // goes) would otherwise wait up to its stop_timeout to flush it to a peer that is not there.
      s->client->forget_proc(addr, "attach_to_workers gave up on it");
      throw TimeoutError(
          "attach_to_workers: host agent " + addr + " did not answer within " +
          std::to_string(options.timeouts.spawn_timeout.count()) + " ms (mesh.spawn_timeout)" +
          (why.empty() ? std::string() : "; the last connection attempt failed: " + why) +
          ". Is `monarch agent --listen " + addr + "` running there, with this job's secret?");
    } catch (const std::exception& e) {
      throw Error("attach_to_workers: host agent " + addr + " unreachable: " + e.what());
    }
    if (!mismatch.empty()) {
      throw UsageError("attach_to_workers: host agent " + addr + " " + mismatch +
                       ": start the agents (`monarch agent`) from the same monarch build as "
                       "this program");
    }
  }
  return HostMesh(s);
}

const ndslice::Extent& HostMesh::extent() const {
  return state_->extent;
}
Proc& HostMesh::client() const {
  return *state_->client;
}
void HostMesh::set_fault_hook(Proc::FaultHook hook) const {
  std::lock_guard lock(state_->groups_mu);
  state_->fault_hook = std::move(hook);
}
const ProcTimeouts& HostMesh::timeouts() const {
  return state_->timeouts;
}

void check_proc_mesh_name(const std::string& name) {
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != '-') {
      throw UsageError("spawn_procs: mesh name '" + name +
                       "' may hold only letters, digits, '_' and '-'");
    }
  }
}

ProcMesh HostMesh::spawn_procs(const ndslice::Extent& per_host, SpawnOptions options) const {
  if (per_host.num_ranks() == 0)
    throw UsageError("spawn_procs: empty extent " + per_host.to_string());
  if (options.cast.fanout == 0)
    throw UsageError("spawn_procs: SpawnOptions::cast.fanout must be at least 1");
  std::vector<std::string> labels = state_->extent.labels();
  std::vector<size_t> sizes = state_->extent.sizes();
  for (const auto& l : per_host.labels()) labels.push_back(l);
  for (size_t s : per_host.sizes()) sizes.push_back(s);
  ndslice::Extent extent(labels, sizes);
  std::string name =
      options.name.empty() ? "procs" + std::to_string(g_mesh_counter++) : options.name;
  check_proc_mesh_name(name);
  ActorId owner = options.owner;
  Proc* owner_proc = options.owner_proc;
  if (!options.on_failure) {
    options.on_failure = process_detail::owner_failure_handler();
    if (const auto* c = monarch::detail::current_cell(); c != nullptr) {
      owner = c->id();
      owner_proc = &c->proc();
    }
  }
  if (owner_proc == &client()) owner_proc = nullptr;
  auto group = std::make_shared<process_detail::ProcessGroup>(
      state_, name, extent, per_host.num_ranks(), std::move(options));
  {
    std::lock_guard lock(group->mu);
    group->owner = std::move(owner);
    group->owner_proc = owner_proc;
  }
  group->start();
  auto st = std::make_shared<ProcMesh::State>();
  st->group = std::move(group);
  return ProcMesh(std::move(st), ndslice::Shape(extent));
}

process_detail::ProcessGroup& ProcMesh::group() const {
  if (!state_->group)
    throw UsageError("this ProcMesh is local (ProcMesh::local): it has no processes");
  return *state_->group;
}

Proc& ProcMesh::proc(size_t local) const {
  if (state_->group) {
    throw UsageError("ProcMesh::proc: mesh " + state_->group->name +
                     " runs in other processes; use address(), lookup<A>() or its actors");
  }
  return *state_->procs[view_.global_rank(local)];
}

const std::string& ProcMesh::name() const {
  return group().name;
}

std::string ProcMesh::address(size_t local) const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  return g.ranks.at(view_.global_rank(local)).addr;
}

int ProcMesh::pid(size_t local) const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  return static_cast<int>(g.ranks.at(view_.global_rank(local)).pid);
}

void ProcMesh::on_failure(FailureHandler handler) const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  g.options.on_failure = std::move(handler);
  g.owner = ActorId{};  // its failures no longer reach the actor that spawned it
  g.owner_proc = nullptr;
}

void ProcMesh::set_log_window(std::chrono::milliseconds window) const {
  if (window.count() < 0)
    throw UsageError("set_log_window: window must be >= 0 ms, not " +
                     std::to_string(window.count()));
  auto& g = group();
  std::lock_guard lock(g.mu);
  g.log_window = window;
  g.cv.notify_all();  // the monitor picks its new tick
}

void ProcMesh::set_forward_logs(bool on) const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  g.forward_logs = on;
}

std::vector<size_t> ProcMesh::failed_ranks() const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  std::vector<size_t> out;
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    if (g.ranks[r].st == process_detail::ProcessGroup::St::Failed) out.push_back(r);
  }
  return out;
}

Proc& ProcMesh::client() const {
  return *group().hosts->client;
}

detail::MeshLifetime ProcMesh::lifetime() const {
  auto& g = group();
  return detail::MeshLifetime{g.stopped_flag, g.hosts->procs_gone, g.name};
}

bool ProcMesh::stop() const {
  return group().stop();
}

std::vector<ActorId> ProcMesh::comm_ids() const {
  auto& g = group();
  std::lock_guard lock(g.mu);
  std::vector<ActorId> out;
  for (const auto& r : g.ranks) out.push_back(r.comm);
  return out;
}

size_t ProcMesh::cast_fanout() const {
  return state_->group ? state_->group->options.cast.fanout : state_->topo->fanout;
}

size_t ProcMesh::base_size() const {
  return state_->group ? state_->group->ranks.size() : state_->procs.size();
}

void ProcMesh::check_usable(size_t local) const {
  auto& g = group();
  size_t rank = view_.global_rank(local);
  std::lock_guard lock(g.mu);
  if (g.ranks.at(rank).st != process_detail::ProcessGroup::St::Ready) {
    throw UsageError("mesh " + g.name + ": rank " + std::to_string(rank) +
                     " failed or stopped; slice it out of the view");
  }
}

std::chrono::milliseconds ProcMesh::lookup_timeout() const {
  return group().hosts->timeouts.spawn_timeout;
}

}  // namespace monarch::mesh
