// ProcessGroup: the client side of one process mesh. start() spawns its procs through the host
// agents and waits until they are ready; the monitor thread watches them and forwards their logs;
// stop() ends them within its deadline. MeshController, the actor the agents and workers call,
// forwards to it. How a proc's failure is detected and delivered: proc_failure.cpp.
#include "process_group.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace monarch::mesh {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string LogRecord::to_string() const {
  std::string r;
  for (size_t i = 0; i < ranks.size(); ++i) r += (i ? "," : "") + std::to_string(ranks[i]);
  return "[" + mesh + " " + r + "] " + text;
}

namespace process_detail {

namespace {
std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("spawn_procs: cannot read /proc/self/exe; set SpawnOptions::program");
  return std::string(buf, static_cast<size_t>(n));
}
}  // namespace

#define MONARCH_WITH_GROUP(expr, dflt)      \
  std::lock_guard lock(link_->mu);          \
  if (link_->group == nullptr) return dflt; \
  return link_->group->expr;

bool MeshController::ready(uint64_t rank, std::string addr, int64_t pid, ActorRef<WorkerControl> c,
                           ActorId comm) {
  MONARCH_WITH_GROUP(on_ready(rank, std::move(addr), pid, std::move(c), std::move(comm)), false)
}
namespace {
struct HeldReplies {
  std::atomic<bool> held{false};
  std::mutex mu;
  std::vector<std::pair<Promise<bool>, bool>> replies;  // guarded by mu
};
HeldReplies& held_replies() {
  static HeldReplies h;
  return h;
}
}  // namespace

void hold_heartbeat_replies() {
  held_replies().held.store(true);
}

void release_heartbeat_replies() {
  auto& h = held_replies();
  std::vector<std::pair<Promise<bool>, bool>> out;
  {
    std::lock_guard lock(h.mu);
    h.held.store(false);
    out.swap(h.replies);
  }
  for (auto& [p, wanted] : out) p.set_value(wanted);
}

Future<bool> MeshController::heartbeat(uint64_t rank) {
  bool wanted = false;
  {
    std::lock_guard lock(link_->mu);
    if (link_->group != nullptr) wanted = link_->group->on_heartbeat(rank);
  }
  if (auto& h = held_replies(); h.held.load(std::memory_order_relaxed)) {
    std::lock_guard lock(h.mu);
    if (h.held.load()) {
      Promise<bool> p;
      auto f = p.get_future();
      h.replies.emplace_back(std::move(p), wanted);
      return f;
    }
  }
  return Future<bool>::ready_value(wanted);
}
void MeshController::actor_failed(uint64_t rank, std::string report) {
  MONARCH_WITH_GROUP(on_actor_failed(rank, report), )
}
void MeshController::exited(uint64_t rank, int code, int sig, bool core) {
  MONARCH_WITH_GROUP(on_exit(rank, ExitStatus{code, sig, core}), )
}
void MeshController::log(uint64_t rank, int stream, std::string line){
    MONARCH_WITH_GROUP(on_log(rank, stream, std::move(line)), )}
#undef MONARCH_WITH_GROUP

ProcessGroup::ProcessGroup(std::shared_ptr<HostMeshState> h, std::string n, ndslice::Extent e,
                           size_t ph, SpawnOptions o)
    : hosts(std::move(h)),
      name(std::move(n)),
      extent(std::move(e)),
      per_host(ph),
      options(std::move(o)) {
  log_window = hosts->timeouts.log_window;
  forward_logs = options.forward_logs;
  ranks.resize(extent.num_ranks());
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r].host = r / per_host;
  incarnations.resize(ranks.size() / per_host);
}

ProcessGroup::~ProcessGroup() {
  stop();
  {
    std::lock_guard lock(hosts->groups_mu);
    std::erase(hosts->groups, this);
  }
  if (monitor.joinable()) {
    if (monitor.get_id() == std::this_thread::get_id()) {
      monitor.detach();
    } else {
      monitor.join();
    }
  }
  if (link) {
    std::lock_guard lock(link->mu);
    link->group = nullptr;
  }
  if (controller.valid()) (void)controller.stop();
}

void ProcessGroup::start() {
  link = std::make_shared<MeshController::Link>();
  link->group = this;
  {
    std::lock_guard lock(hosts->groups_mu);
    hosts->groups.push_back(this);
  }
  const auto& t = hosts->timeouts;
  std::string controller_name = "monarch.mesh." + name + "." + std::to_string(g_counter++);
  controller = hosts->client->spawn<MeshController>("mesh." + name, link);
  hosts->client->register_name(controller_name, controller);
  monitor = std::thread([this] { monitor_loop(); });

  SpawnSpec spec;
  spec.mesh = name;
  spec.program = options.program.empty() ? self_exe() : options.program;
  spec.args = options.args;
  spec.env = options.env;
  spec.fork_server = options.fork_server;
  spec.count = per_host;
  spec.heartbeat_interval_ms = t.heartbeat_interval.count();
  spec.heartbeat_timeout_ms = t.heartbeat_timeout.count();
  spec.controller_name = controller_name;
  size_t num_hosts = ranks.size() / per_host;
  std::vector<Future<SpawnReply>> spawned;
  for (size_t h = 0; h < num_hosts; ++h) {
    spec.first_rank = h * per_host;
    spawned.push_back(hosts->agents[h].call(&HostAgent::spawn, spec, controller));
  }
  const auto deadline = Clock::now() + t.spawn_timeout;
  for (size_t h = 0; h < num_hosts; ++h) {
    SpawnReply reply;
    std::string error;
    try {
      reply = spawned[h].get(std::max(Clock::duration(0), deadline - Clock::now()));
    } catch (const TimeoutError&) {
      // A frozen agent, or one that is gone (the channel retries it quietly until its delivery
      // timeout): say which, when the channel knows, rather than "Future::get: timed out".
      const std::string last = hosts->client->link_error(hosts->agent_addrs[h]);
      error =
          "no answer within mesh.spawn_timeout (" + std::to_string(t.spawn_timeout.count()) +
          " ms): " +
          (last.empty() ? "the agent is frozen, overloaded or lost"
                        : "the agent is lost (the last connection attempt failed: " + last + ")");
    } catch (const std::exception& e) {
      error = e.what();
    }
    const auto& pids = reply.pids;
    std::lock_guard lock(mu);
    if (!error.empty() || pids.size() != per_host) {
      std::vector<size_t> rs;
      for (size_t i = 0; i < per_host; ++i) rs.push_back(h * per_host + i);
      if (!start_failure) {
        start_failure = MeshFailure{name, rs,
                                    "host agent " + hosts->agent_addrs[h] + " could not spawn: " +
                                        (error.empty() ? "bad reply" : error)};
      }
      continue;
    }
    incarnations[h] = reply.incarnation;
    for (size_t i = 0; i < per_host; ++i) {
      auto& r = ranks[h * per_host + i];
      if (r.pid == 0) r.pid = pids[i];
      if (r.st == St::Failed && !r.exited) kill_rank(r);
    }
  }
  std::unique_lock lock(mu);
  bool ok = cv.wait_until(lock, deadline, [&] {
    return start_failure.has_value() ||
           std::all_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.st == St::Ready; });
  });
  if (ok && !start_failure) {
    started = true;
    return;
  }
  std::string why;
  if (start_failure) {
    why = start_failure->to_string();
  } else {
    std::vector<size_t> late;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].st != St::Ready) late.push_back(r);
    }
    why = MeshFailure{name, late,
                      "not ready within spawn_timeout (" + std::to_string(t.spawn_timeout.count()) +
                          " ms)"}
              .to_string();
  }
  lock.unlock();
  stop();
  throw Error("spawn_procs: " + why);
}

bool ProcessGroup::on_ready(uint64_t rank, std::string addr, int64_t pid, ActorRef<WorkerControl> c,
                            ActorId comm) {
  std::lock_guard lock(mu);
  if (rank >= ranks.size()) return false;
  auto& r = ranks[rank];
  if (r.st != St::Starting) return false;
  r.st = St::Ready;
  r.addr = std::move(addr);
  r.pid = pid;
  r.control = std::move(c);
  r.comm = std::move(comm);
  r.last_heartbeat = Clock::now();
  cv.notify_all();
  return true;
}

bool ProcessGroup::on_heartbeat(uint64_t rank) {
  std::lock_guard lock(mu);
  if (rank >= ranks.size()) return false;
  auto& r = ranks[rank];
  if (r.st == St::Failed) return false;
  r.last_heartbeat = Clock::now();
  return true;
}

void ProcessGroup::kill_rank(const Rank& r) {
  if (r.pid == 0 || r.exited) return;
  (void)hosts->agents[r.host].call(&HostAgent::kill, r.pid, static_cast<int>(SIGKILL));
}

void ProcessGroup::emit(const LogRecord& rec) {
  if (options.log_sink) return options.log_sink(rec);
  std::string s = rec.to_string() + "\n";
  std::fwrite(s.data(), 1, s.size(), rec.stream == 2 ? stderr : stdout);
  if (rec.stream != 2) std::fflush(stdout);
}

void ProcessGroup::on_log(uint64_t rank, int stream, std::string line) {
  std::unique_lock lock(mu);
  // Kept for on_exit: a proc that exits with an error usually said why last (a ConfigError, a
  // Python traceback's last line). The agent sends a proc's lines before its exit.
  constexpr size_t kMaxKept = 400;
  if (stream == 2 && rank < ranks.size() && !line.empty())
    ranks[rank].last_stderr.assign(line, 0, kMaxKept);  // reuses its buffer
  if (!forward_logs) return;
  if (log_window.count() == 0) {
    lock.unlock();
    return emit(LogRecord{name, {rank}, stream, std::move(line)});
  }
  auto key = std::make_pair(stream, std::move(line));
  auto [it, fresh] = agg.try_emplace(key);
  if (fresh) agg_order.push_back(key);
  it->second.ranks.push_back(rank);
}

void ProcessGroup::flush_logs(std::unique_lock<std::mutex>& lock) {
  if (agg_order.empty()) return;
  std::vector<LogRecord> out;
  for (auto& key : agg_order) {
    auto& a = agg[key];
    std::sort(a.ranks.begin(), a.ranks.end());
    out.push_back(LogRecord{name, std::move(a.ranks), key.first, key.second});
  }
  agg.clear();
  agg_order.clear();
  lock.unlock();
  for (auto& rec : out) emit(rec);
  lock.lock();
}

void ProcessGroup::monitor_loop() {
  const auto& t = hosts->timeouts;
  AgentPings pings(ranks.size() / per_host);
  auto last_flush = Clock::now();
  std::unique_lock lock(mu);
  while (!closing) {
    auto tick = t.heartbeat_interval;  // log_window may change (ProcMesh::set_log_window)
    if (log_window.count() > 0) tick = std::min(tick, log_window);
    // Wakes for a failure once it may be delivered (an exit report notifies cv).
    cv.wait_for(lock, tick, [&] { return closing || deliverable_locked(Clock::now()); });
    if (closing) break;
    auto now = Clock::now();
    // Agents first: when an agent died, it is the cause, not its procs' silence (proc_failure.cpp).
    check_agents_locked(pings, now);
    check_heartbeats_locked(pings, now);
    if (log_window.count() == 0 || now - last_flush >= log_window) {
      last_flush = now;
      flush_logs(lock);
    }
    deliver_failures(lock);
  }
  flush_logs(lock);
}

bool ProcessGroup::stop() {
  std::unique_lock lock(mu);
  if (stopped) return true;
  stopped = true;
  stopped_flag->store(true, std::memory_order_release);
  std::vector<ActorRef<WorkerControl>> asked;
  std::vector<std::string>
      stopping;  // every proc of this mesh: told to each, they forget each other
  for (auto& r : ranks) {
    if (!r.addr.empty()) stopping.push_back(r.addr);
    if (r.st == St::Ready) {
      r.st = St::Stopping;
      asked.push_back(r.control);
    } else if (r.st == St::Starting) {
      r.st = St::Stopping;
      kill_rank(r);
    }
  }
  lock.unlock();
  // Every stop goes to each rank directly; a dead or frozen one does not delay the others.
  for (auto& c : asked) (void)c.call(&WorkerControl::stop_worker, stopping);
  lock.lock();
  auto all_gone = [&] {
    return std::all_of(ranks.begin(), ranks.end(),
                       [](const Rank& r) { return r.exited || r.pid == 0; });
  };
  const auto& t = hosts->timeouts;
  bool graceful = cv.wait_for(lock, t.stop_timeout, all_gone);
  if (!graceful) {
    for (auto& r : ranks) kill_rank(r);
    cv.wait_for(lock, std::min<std::chrono::milliseconds>(t.stop_timeout, 2000ms), all_gone);
  }
  closing = true;
  cv.notify_all();
  std::vector<std::string> dead;
  for (auto& r : ranks) {
    if (r.exited) dead.push_back(r.addr);
  }
  lock.unlock();
  // They exited when asked (or were killed by this stop): what they did not acknowledge is moot.
  for (auto& a : dead) {
    if (!a.empty()) hosts->client->forget_proc(a, "proc of mesh " + name + " stopped");
  }
  if (monitor.joinable() && monitor.get_id() != std::this_thread::get_id()) monitor.join();
  return graceful;
}

}  // namespace process_detail
}  // namespace monarch::mesh
