// Where a proc's failure becomes a MeshFailure, and where a MeshFailure goes.
//
// A rank of a process mesh fails when its process exits (on_exit, from the agent's pidfd), when
// an actor on it fails unhandled (on_actor_failed, reported by the worker; or fail_rank_of, when
// the report reaches the client Proc's fault hook: HostMeshState::on_fault), when it is silent
// for heartbeat_timeout (check_heartbeats_locked), or when the agent that spawned it restarted or
// was lost (check_agents_locked). fail_locked kills it and queues one MeshFailure;
// deliver_failures, on the monitor thread, declares its proc failed to the client Proc and hands
// the MeshFailure to the mesh's handler, by default the owning actor's supervise(const
// MeshFailure&) (owner_failure_handler); unhandled, it reaches the HostMesh fault hook as an
// ActorSupervisionEvent. The actor layer's side (an actor's failure -> its owner's supervise()):
// src/actor/supervision.cpp. Invariants PH-4, PH-5: docs/processes.md.
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "monarch/actor/detail/cell.hpp"
#include "process_group.hpp"

namespace monarch::mesh::process_detail {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool HostMeshState::dispatch(const ActorSupervisionEvent& ev) {
  std::lock_guard lock(groups_mu);
  for (ProcessGroup* g : groups) {
    if (g->fail_rank_of(ev)) return true;
  }
  return false;
}

void HostMeshState::notify_proc_failed(const std::vector<std::string>& dead,
                                       const std::string& cause) {
  std::vector<ActorRef<WorkerControl>> live;
  {
    std::lock_guard lock(groups_mu);
    for (ProcessGroup* g : groups) {
      std::lock_guard glock(g->mu);
      for (const auto& r : g->ranks) {
        if (r.st == ProcessGroup::St::Ready && r.control.valid()) live.push_back(r.control);
      }
    }
  }
  for (const auto& addr : dead) {
    for (const auto& c : live) {
      if (c.id().proc == addr) continue;
      try {
        // A call, not a send (host_agent.hpp): its failure (that worker died too) only completes
        // a future nobody waits on.
        (void)c.call(&WorkerControl::proc_failed, addr, cause);
      } catch (const std::exception&) {
        // That worker was declared failed meanwhile: nothing to tell it.
      }
    }
  }
}

void HostMeshState::on_fault(const ActorSupervisionEvent& ev) {
  if (exiting.load(std::memory_order_acquire)) {  // the program is exiting: stopping, not failing
    spdlog::debug("monarch: at exit, not reported: {}", ev.to_string());
    return;
  }
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

bool ProcessGroup::fail_rank_of(const ActorSupervisionEvent& ev) {
  std::lock_guard lock(mu);
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].addr.empty() && ranks[r].addr == ev.actor.proc) {
      fail_locked(r, "unhandled actor failure: " + ev.to_string());
      return true;
    }
  }
  return false;
}

void ProcessGroup::on_actor_failed(uint64_t rank, const std::string& report) {
  std::lock_guard lock(mu);
  if (rank < ranks.size()) fail_locked(rank, "unhandled actor failure: " + report);
}

void ProcessGroup::on_exit(uint64_t rank, const ExitStatus& st) {
  std::lock_guard lock(mu);
  if (rank >= ranks.size()) return;
  auto& r = ranks[rank];
  r.exited = true;
  // An error exit or an abort names what the proc last wrote on stderr; a kill does not (its
  // last line has nothing to do with it).
  const bool said_why = st.signal == 0 ? st.code != 0 : st.signal == SIGABRT;
  const std::string how =
      st.to_string() + (said_why && !r.last_stderr.empty()
                            ? " (its last line on stderr: " + r.last_stderr + ")"
                            : std::string());
  if (r.st == St::Stopping && (st.code != 0 || st.signal != 0) && st.signal != SIGKILL) {
    // Asked to stop, it crashed or failed on its way out (an actor's cleanup): no failure to
    // deliver any more, but not silence either. SIGKILL is this stop's own (past stop_timeout).
    spdlog::warn("proc mesh {}: rank {} {} while it stopped", name, rank, how);
  }
  fail_locked(rank, how);
  cv.notify_all();
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
    pending.emplace_back(std::move(f), Clock::now());
  } else if (!start_failure) {
    start_failure = std::move(f);
  }
  cv.notify_all();
}

void ProcessGroup::check_agents_locked(AgentPings& ap, Clock::time_point now) {
  const auto& t = hosts->timeouts;
  size_t num_hosts = ranks.size() / per_host;
  auto& [pings, ping_sent] = ap;
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
      cause = "host agent " + hosts->agent_addrs[h] + " lost (no answer within heartbeat_timeout " +
              std::to_string(t.heartbeat_timeout.count()) +
              " ms); the procs it started died with it";
      pings[h].reset();
    }
    if (cause.empty()) continue;
    for (size_t r = h * per_host; r < (h + 1) * per_host; ++r) {
      fail_locked(r, cause);
      ranks[r].exited = true;  // its procs died with it (PDEATHSIG); no exit report will come
    }
    incarnations[h].reset();  // nothing of ours left there to watch
  }
}

void ProcessGroup::check_heartbeats_locked(const AgentPings& ap, Clock::time_point now) {
  const auto& t = hosts->timeouts;
  const auto& [pings, ping_sent] = ap;
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
                           std::to_string(silent.count()) + " ms, no heartbeat from the proc for " +
                           std::to_string(ms.count()) + " ms); the procs it started died with it");
        ranks[r].exited = true;  // no exit report will come from a dead agent
        continue;
      }
      fail_locked(r, "no heartbeat for " + std::to_string(ms.count()) + " ms (heartbeat_timeout " +
                         std::to_string(t.heartbeat_timeout.count()) +
                         " ms): frozen or unreachable");
    }
  }
}

std::chrono::milliseconds ProcessGroup::kill_grace() const {
  return std::min<std::chrono::milliseconds>(hosts->timeouts.heartbeat_timeout, 1000ms);
}

bool ProcessGroup::deliverable_locked(Clock::time_point now) const {
  if (pending.empty()) return false;
  const auto& [f, at] = pending.front();
  if (now - at >= kill_grace()) return true;
  for (size_t r : f.ranks) {
    if (!ranks[r].exited) return false;
  }
  return true;
}

void ProcessGroup::deliver_failures(std::unique_lock<std::mutex>& lock) {
  while (!closing && deliverable_locked(Clock::now())) {
    MeshFailure f = std::move(pending.front().first);
    pending.pop_front();
    auto handler = options.on_failure;
    const ActorId heard_by = owner;
    Proc* heard_in = owner_proc;
    std::vector<std::string> dead;
    for (size_t r : f.ranks) dead.push_back(ranks[r].addr);
    lock.unlock();
    std::erase(dead, std::string());
    for (auto& a : dead) {
      hosts->client->declare_proc_failed(a, f.to_string(), heard_by);
      // An owner in another Proc of this process (an actor of a worker that spawned procs):
      // its links there close at once too, and its lost messages are not reported twice.
      if (heard_in != nullptr) heard_in->declare_proc_failed(a, f.to_string(), heard_by);
    }
    hosts->notify_proc_failed(dead, f.to_string());
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

ProcMesh::FailureHandler owner_failure_handler() {
  if (monarch::detail::Cell* owner = monarch::detail::current_cell(); owner != nullptr) {
    // Spawned inside an actor: that actor owns the mesh; failures go to its supervise().
    return [owner = monarch::detail::CellPtr::share(owner)](const MeshFailure& f) {
      monarch::detail::post_mesh_failure(owner.get(), std::make_shared<const MeshFailure>(f));
      return true;
    };
  }
  return {};
}

}  // namespace monarch::mesh::process_detail
