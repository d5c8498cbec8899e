// Process meshes: host agents, the process allocator, worker bootstrap (see process.hpp).
#include "monarch/mesh/process.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "monarch/mesh/cast.hpp"
#include "process_group.hpp"

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
std::atomic<uint64_t> g_counter{0};

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("spawn_procs: cannot read /proc/self/exe; set SpawnOptions::program");
  return std::string(buf, static_cast<size_t>(n));
}

std::string env_or(const char* key, const char* dflt) {
  const char* v = std::getenv(key);
  return v != nullptr ? v : dflt;
}

// "unix://@x" -> "unix://@monarch-w-<pid>"; "tcp://H:P" -> "tcp://H".
std::string worker_listen_base(const std::string& agent_addr) {
  if (agent_addr.starts_with("tcp://")) {
    auto rest = agent_addr.substr(6);
    auto colon = rest.rfind(':');
    return "tcp://" + rest.substr(0, colon);
  }
  return "unix://@monarch-w-" + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Actors

void WorkerControl::stop_worker(std::vector<std::string> stopping) {
  std::lock_guard lock(s_->mu);
  s_->stop = true;
  s_->stopping = std::move(stopping);
  s_->cv.notify_all();
}

#define MONARCH_WITH_GROUP(expr, dflt)      \
  std::lock_guard lock(link_->mu);          \
  if (link_->group == nullptr) return dflt; \
  return link_->group->expr;

bool MeshController::ready(uint64_t rank, std::string addr, int64_t pid, ActorRef<WorkerControl> c,
                           ActorId comm) {
  MONARCH_WITH_GROUP(on_ready(rank, std::move(addr), pid, std::move(c), std::move(comm)), false)
}
bool MeshController::heartbeat(uint64_t rank) {
  MONARCH_WITH_GROUP(on_heartbeat(rank), false)
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

HostAgent::HostAgent(std::string listen_base, std::shared_ptr<CallbackGate> gate)
    : listen_base_(std::move(listen_base)),
      gate_(std::move(gate)),
      incarnation_(std::random_device{}() | 1) {
}

SpawnReply HostAgent::spawn(SpawnSpec spec, ActorRef<MeshController> controller) {
  SpawnReply reply{incarnation_, {}};
  auto& pids = reply.pids;
  const uint64_t target = gate_->add(controller);
  for (uint64_t i = 0; i < spec.count; ++i) {
    uint64_t rank = spec.first_rank + i;
    ChildSpec child;
    child.program = spec.program;
    child.args = spec.args;
    child.env = spec.env;
    std::string listen = listen_base_.starts_with("tcp://")
                             ? listen_base_ + ":0"
                             : listen_base_ + "-" + std::to_string(next_++);
    child.env.push_back("MONARCH_WORKER_OWNER=" + controller.id().proc);
    child.env.push_back("MONARCH_WORKER_CONTROLLER=" + spec.controller_name);
    child.env.push_back("MONARCH_WORKER_MESH=" + spec.mesh);
    child.env.push_back("MONARCH_WORKER_RANK=" + std::to_string(rank));
    child.env.push_back("MONARCH_WORKER_LISTEN=" + listen);
    child.env.push_back("MONARCH_WORKER_HEARTBEAT_INTERVAL_MS=" +
                        std::to_string(spec.heartbeat_interval_ms));
    child.env.push_back("MONARCH_WORKER_HEARTBEAT_TIMEOUT_MS=" +
                        std::to_string(spec.heartbeat_timeout_ms));
    auto on_line = [target, rank, gate = gate_](int stream, std::string line) {
      gate->with(target, [&](const ActorRef<MeshController>& c) {
        (void)c.call(&MeshController::log, rank, stream, std::move(line));
      });
    };
    auto on_exit = [target, rank, gate = gate_](const ExitStatus& st) {
      gate->with(target, [&](const ActorRef<MeshController>& c) {
        (void)c.call(&MeshController::exited, rank, st.code, st.signal, st.core);
      });
    };
    pids.push_back(ProcessHost::instance().spawn(child, std::move(on_line), std::move(on_exit)));
  }
  return reply;
}

bool HostAgent::kill(int64_t pid, int sig) {
  return ProcessHost::instance().signal(static_cast<pid_t>(pid), sig);
}

bool HostMeshState::dispatch(const ActorSupervisionEvent& ev) {
  std::lock_guard lock(groups_mu);
  for (ProcessGroup* g : groups) {
    std::lock_guard glock(g->mu);
    for (size_t r = 0; r < g->ranks.size(); ++r) {
      if (!g->ranks[r].addr.empty() && g->ranks[r].addr == ev.actor.proc) {
        g->fail_locked(r, "unhandled actor failure: " + ev.to_string());
        return true;
      }
    }
  }
  return false;
}

void HostMeshState::on_fault(const ActorSupervisionEvent& ev) {
  if (dispatch(ev)) return;
  Proc::FaultHook hook;
  {
    std::lock_guard lock(groups_mu);
    hook = fault_hook;
  }
  if (hook) return hook(ev);
  std::fprintf(stderr, "monarch: unhandled failure; exiting (fail fast)\n%s\n",
               ev.to_string().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);  // like Proc's default hook: no static destructors while other threads run
}

HostMeshState::~HostMeshState() {
  gate->close();
  agents.clear();
  client.reset();
}

// ---------------------------------------------------------------------------------------------
// ProcessGroup

ProcessGroup::ProcessGroup(std::shared_ptr<HostMeshState> h, std::string n, ndslice::Extent e,
                           size_t ph, SpawnOptions o)
    : hosts(std::move(h)),
      name(std::move(n)),
      extent(std::move(e)),
      per_host(ph),
      options(std::move(o)) {
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

void ProcessGroup::on_actor_failed(uint64_t rank, const std::string& report) {
  std::lock_guard lock(mu);
  if (rank < ranks.size()) fail_locked(rank, "unhandled actor failure: " + report);
}

void ProcessGroup::on_exit(uint64_t rank, const ExitStatus& st) {
  std::lock_guard lock(mu);
  if (rank >= ranks.size()) return;
  ranks[rank].exited = true;
  fail_locked(rank, st.to_string());
  cv.notify_all();
}

void ProcessGroup::kill_rank(const Rank& r) {
  if (r.pid == 0 || r.exited) return;
  (void)hosts->agents[r.host].call(&HostAgent::kill, r.pid, static_cast<int>(SIGKILL));
}

void ProcessGroup::fail_locked(size_t rank, const std::string& cause) {
  auto& r = ranks[rank];
  if (r.st == St::Failed || r.st == St::Stopping) return;
  r.st = St::Failed;
  kill_rank(r);  // never reused; a frozen proc must not wake up and act
  // The monitor thread declares the proc failed (Proc::declare_proc_failed) before the handler
  // runs, so calls pending on it fail with SupervisionError.
  MeshFailure f{name, {rank}, cause};
  if (started) {
    pending.push_back(std::move(f));
  } else if (!start_failure) {
    start_failure = std::move(f);
  }
  cv.notify_all();
}

void ProcessGroup::emit(const LogRecord& rec) {
  if (options.log_sink) return options.log_sink(rec);
  std::string s = rec.to_string() + "\n";
  std::fwrite(s.data(), 1, s.size(), rec.stream == 2 ? stderr : stdout);
  if (rec.stream != 2) std::fflush(stdout);
}

void ProcessGroup::on_log(uint64_t rank, int stream, std::string line) {
  if (!options.forward_logs) return;
  std::unique_lock lock(mu);
  if (hosts->timeouts.log_window.count() == 0) {
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
  auto tick = t.heartbeat_interval;
  if (t.log_window.count() > 0) tick = std::min(tick, t.log_window);
  size_t num_hosts = ranks.size() / per_host;
  std::vector<std::optional<Future<uint64_t>>> pings(num_hosts);
  std::vector<Clock::time_point> ping_sent(num_hosts);
  auto last_flush = Clock::now();
  std::unique_lock lock(mu);
  while (!closing) {
    cv.wait_for(lock, tick, [&] { return closing || !pending.empty(); });
    if (closing) break;
    auto now = Clock::now();
    // Agent liveness: a restarted agent answers with a new incarnation; a lost one not at all.
    // Either way the procs it spawned died with it (PDEATHSIG).
    for (size_t h = 0; h < num_hosts; ++h) {
      if (!incarnations[h]) continue;  // its spawn reply has not arrived yet
      std::string cause;
      if (!pings[h]) {
        pings[h] = hosts->agents[h].call(&HostAgent::incarnation);
        ping_sent[h] = now;
      } else if (pings[h]->wait_for(0ms)) {
        try {
          uint64_t inc = pings[h]->get();
          if (inc != *incarnations[h]) {
            cause = "host agent " + hosts->agent_addrs[h] +
                    " restarted; the procs it started died with it";
          }
        } catch (const std::exception& e) {
          cause = "host agent " + hosts->agent_addrs[h] + " lost (" + e.what() +
                  "); the procs it started died with it";
        }
        pings[h].reset();
      } else if (now - ping_sent[h] > t.heartbeat_timeout) {
        cause =
            "host agent " + hosts->agent_addrs[h] + " lost (no answer within heartbeat_timeout " +
            std::to_string(t.heartbeat_timeout.count()) + " ms); the procs it started died with it";
        pings[h].reset();
      }
      if (cause.empty()) continue;
      for (size_t r = h * per_host; r < (h + 1) * per_host; ++r) {
        fail_locked(r, cause);
        ranks[r].exited = true;  // its procs died with it (PDEATHSIG); no exit report will come
      }
      incarnations[h].reset();  // nothing of ours left there to watch
    }
    // After the agents: when an agent died, its procs' heartbeats stop too; the cause is the agent.
    // A silent proc whose agent has not answered for half the heartbeat_timeout either (an agent
    // answers in ms) died with it; its last ping has not timed out only because it was sent
    // after the proc's last heartbeat.
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].st == St::Ready && now - ranks[r].last_heartbeat > t.heartbeat_timeout) {
        auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - ranks[r].last_heartbeat);
        const size_t h = ranks[r].host;
        if (incarnations[h] && pings[h] && now - ping_sent[h] > t.heartbeat_timeout / 2) {
          auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - ping_sent[h]);
          fail_locked(r, "host agent " + hosts->agent_addrs[h] + " lost (no answer for " +
                             std::to_string(silent.count()) +
                             " ms, no heartbeat from the proc for " + std::to_string(ms.count()) +
                             " ms); the procs it started died with it");
          ranks[r].exited = true;  // no exit report will come from a dead agent
          continue;
        }
        fail_locked(r, "no heartbeat for " + std::to_string(ms.count()) +
                           " ms (heartbeat_timeout " + std::to_string(t.heartbeat_timeout.count()) +
                           " ms): frozen or unreachable");
      }
    }
    if (t.log_window.count() > 0 && now - last_flush >= t.log_window) {
      last_flush = now;
      flush_logs(lock);
    }
    while (!pending.empty() && !closing) {
      MeshFailure f = std::move(pending.front());
      pending.pop_front();
      auto handler = options.on_failure;
      std::vector<std::string> dead;
      for (size_t r : f.ranks) dead.push_back(ranks[r].addr);
      lock.unlock();
      for (auto& a : dead) {
        if (!a.empty()) hosts->client->declare_proc_failed(a, f.to_string());
      }
      bool handled = false;
      try {
        handled = handler && handler(f);
      } catch (const std::exception& e) {
        f.cause += " (and the failure handler threw: " + std::string(e.what()) + ")";
      }
      if (!handled) {
        Proc& c = *hosts->client;
        hosts->on_fault(ActorSupervisionEvent{ActorId{c.name(), "mesh." + name, 0}, "ProcMesh",
                                              f.to_string(), nullptr});
      }
      lock.lock();
    }
  }
  flush_logs(lock);
}

bool ProcessGroup::stop() {
  std::unique_lock lock(mu);
  if (stopped) return true;
  stopped = true;
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

// ---------------------------------------------------------------------------------------------
// Worker

namespace {

[[noreturn]] void quit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

int run_worker(const WorkerSetup& setup) {
  const std::string owner = env_or("MONARCH_WORKER_OWNER", "");
  const std::string controller_name = env_or("MONARCH_WORKER_CONTROLLER", "");
  WorkerInfo info{env_or("MONARCH_WORKER_MESH", "procs"),
                  std::stoull(env_or("MONARCH_WORKER_RANK", "0"))};
  const std::chrono::milliseconds interval{
      std::stoll(env_or("MONARCH_WORKER_HEARTBEAT_INTERVAL_MS", "100"))};
  const std::chrono::milliseconds timeout{
      std::stoll(env_or("MONARCH_WORKER_HEARTBEAT_TIMEOUT_MS", "1500"))};
  auto shared = std::make_shared<WorkerControl::Shared>();

  ProcOptions o;
  o.listen = env_or("MONARCH_WORKER_LISTEN", "");
  o.channel.delivery_timeout = timeout;
  o.stop_timeout = std::max<std::chrono::milliseconds>(timeout, 1000ms);
  Proc proc(o);
  // An unhandled actor failure: the main loop reports it to the owner, then the proc exits.
  proc.set_fault_hook([shared](const ActorSupervisionEvent& ev) {
    std::lock_guard lock(shared->mu);
    if (!shared->failure) shared->failure = ev.to_string();
    shared->cv.notify_all();
  });
  ActorRef<MeshController> owner_ref;
  try {
    owner_ref = proc.lookup_remote<MeshController>(owner, controller_name).get(timeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker %s[%zu]: cannot reach owner %s: %s\n", info.mesh.c_str(),
                 info.rank, owner.c_str(), e.what());
    quit(2);
  }
  auto report = [&](const std::string& why) {
    try {
      owner_ref.call(&MeshController::actor_failed, uint64_t{info.rank}, why).get(timeout);
    } catch (...) {
    }
    quit(1);
  };
  try {
    if (setup) setup(proc, info);
  } catch (const std::exception& e) {
    report(std::string("worker setup threw: ") + e.what());
  }
  auto control = proc.spawn<WorkerControl>("monarch.worker", shared);
  auto comm = monarch::mesh::detail::install_comm(proc);  // this proc's node of the cast tree
  try {
    if (!owner_ref
             .call(&MeshController::ready, uint64_t{info.rank}, proc.address(), int64_t{::getpid()},
                   control, comm.id())
             .get(timeout)) {
      quit(0);  // the owner no longer wants this rank
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker %s[%zu]: ready not acknowledged: %s\n", info.mesh.c_str(),
                 info.rank, e.what());
    quit(2);
  }
  std::vector<std::string> stopping;  // procs stopped with this one
  while (true) {
    std::optional<std::string> failure;
    {
      std::unique_lock lock(shared->mu);
      shared->cv.wait_for(lock, interval, [&] { return shared->stop || shared->failure; });
      if (shared->failure) failure = shared->failure;
      if (shared->stop && !failure) {
        stopping = shared->stopping;
        break;
      }
    }
    if (failure) report(*failure);
    bool wanted = false;
    try {
      wanted = owner_ref.call(&MeshController::heartbeat, uint64_t{info.rank}).get(timeout);
    } catch (const std::exception& e) {
      // The owner is gone (killed, or its link lost): a worker never outlives its owner.
      std::fprintf(stderr, "monarch worker %s[%zu]: owner unreachable (%s); exiting\n",
                   info.mesh.c_str(), info.rank, e.what());
      quit(0);
    }
    if (!wanted) quit(0);
  }
  // Not under shared->mu: forget_proc waits for the channel I/O thread, which runs the fault hook.
  for (const auto& peer : stopping) {
    if (peer != proc.address())
      proc.forget_proc(peer, "proc " + peer + " stopped with " + proc.address());
  }
  proc.shutdown(o.stop_timeout);
  return 0;
}

}  // namespace
}  // namespace process_detail

void bootstrap(int argc, char** argv, WorkerSetup setup) {
  (void)argc;
  (void)argv;
  if (std::getenv("MONARCH_WORKER_OWNER") == nullptr ||
      std::getenv("MONARCH_WORKER_CONTROLLER") == nullptr)
    return;
  int code = 1;
  try {
    code = process_detail::run_worker(setup);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker: %s\n", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

int run_agent(const std::string& listen,
              const std::function<void(const std::string&)>& on_listening) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit it
  process_detail::ProcessHost::instance();
  ProcOptions o;
  o.listen = listen;
  Proc proc(o);
  proc.set_fault_hook([](const ActorSupervisionEvent& ev) {
    std::fprintf(stderr, "monarch agent: %s\n", ev.to_string().c_str());
  });
  auto agent = proc.spawn<process_detail::HostAgent>(
      "monarch.agent", process_detail::worker_listen_base(proc.address()),
      std::make_shared<process_detail::CallbackGate>());
  proc.register_name("monarch.agent", agent);
  if (on_listening) on_listening(proc.address());
  int sig = 0;
  ::sigwait(&set, &sig);
  // Workers die with this process (PDEATHSIG); exit without waiting on them.
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(0);
}

// ---------------------------------------------------------------------------------------------
// HostMesh / ProcMesh

struct HostMesh::State : process_detail::HostMeshState {};

namespace {
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
  return s;
}
}  // namespace

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
    try {
      auto ref = s->client->lookup_remote<process_detail::HostAgent>(addr, "monarch.agent")
                     .get(options.timeouts.spawn_timeout);
      s->incarnations.push_back(
          ref.call(&process_detail::HostAgent::incarnation).get(options.timeouts.spawn_timeout));
      s->agents.push_back(ref);
      s->agent_addrs.push_back(addr);
    } catch (const std::exception& e) {
      throw Error("attach_to_workers: host agent " + addr + " unreachable: " + e.what());
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

ProcMesh HostMesh::spawn_procs(const ndslice::Extent& per_host, SpawnOptions options) const {
  if (per_host.num_ranks() == 0)
    throw UsageError("spawn_procs: empty extent " + per_host.to_string());
  std::vector<std::string> labels = state_->extent.labels();
  std::vector<size_t> sizes = state_->extent.sizes();
  for (const auto& l : per_host.labels()) labels.push_back(l);
  for (size_t s : per_host.sizes()) sizes.push_back(s);
  ndslice::Extent extent(labels, sizes);
  std::string name =
      options.name.empty() ? "procs" + std::to_string(process_detail::g_counter++) : options.name;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != '-') {
      throw UsageError("spawn_procs: mesh name '" + name +
                       "' may hold only letters, digits, '_' and '-'");
    }
  }
  if (!options.on_failure) {
    if (monarch::detail::Cell* owner = monarch::detail::current_cell(); owner != nullptr) {
      // Spawned inside an actor: that actor owns the mesh; failures go to its supervise().
      options.on_failure = [owner = monarch::detail::CellPtr::share(owner)](const MeshFailure& f) {
        monarch::detail::post_mesh_failure(owner.get(), std::make_shared<const MeshFailure>(f));
        return true;
      };
    }
  }
  auto group = std::make_shared<process_detail::ProcessGroup>(
      state_, name, extent, per_host.num_ranks(), std::move(options));
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
