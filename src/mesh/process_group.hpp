// Internal: the client-side state of one process mesh (ProcessGroup) and of the hosts it runs on
// (HostMeshState). The agent protocol's actors are in host_agent.hpp.
//
// Files: process_group.cpp (start, stop, the monitor thread, logs), proc_failure.cpp (how a
// proc's exit, silence or actor failure becomes a MeshFailure and reaches its handler),
// host_mesh.cpp (the public HostMesh / ProcMesh API over these).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "host_agent.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::mesh::process_detail {

struct HostMeshState {
  std::unique_ptr<Proc> client;
  ProcTimeouts timeouts;
  ndslice::Extent extent;  // {} or {hosts: N}
  std::vector<ActorRef<HostAgent>> agents;
  std::vector<std::string> agent_addrs;  // "embedded" for this_host()
  std::vector<uint64_t> incarnations;    // at attach (spawns record their own: ProcessGroup)
  std::shared_ptr<CallbackGate> gate = std::make_shared<CallbackGate>();  // embedded agent's
  std::mutex groups_mu;                                                   // groups, fault_hook
  std::vector<ProcessGroup*> groups;  // live process meshes on these hosts
  Proc::FaultHook fault_hook;         // HostMesh::set_fault_hook; empty: fail fast
  // Set by the exit handler (keep_hosts_at_exit): on_fault then drops failures quietly.
  std::atomic<bool> exiting{false};
  // Set once `client` is shut down, before it is freed (MeshLifetime::gone).
  std::shared_ptr<std::atomic<bool>> procs_gone = std::make_shared<std::atomic<bool>>(false);
  /// The client Proc's fault hook: failures of actors on our procs become MeshFailures.
  void on_fault(const ActorSupervisionEvent& ev);
  /// Hands `ev` to the group whose proc the failed actor ran on (ProcessGroup::fail_rank_of);
  /// false when it ran on none of them.
  bool dispatch(const ActorSupervisionEvent& ev);
  /// Tells every live worker of every mesh on these hosts that the procs at `dead` failed
  /// (WorkerControl::proc_failed), so their links there close and their comm actors route around
  /// them (CAST-12). Fire and forget: calls whose futures nobody waits on. Any thread but under
  /// no group's `mu`.
  void notify_proc_failed(const std::vector<std::string>& dead, const std::string& cause);
  ~HostMeshState();
};

struct ProcessGroup : std::enable_shared_from_this<ProcessGroup> {
  enum class St { Starting, Ready, Stopping, Failed };
  struct Rank {
    St st = St::Starting;
    size_t host = 0;
    int64_t pid = 0;
    std::string addr;
    ActorRef<WorkerControl> control;
    ActorId comm;  // the proc's cast-tree comm actor (install_comm)
    std::chrono::steady_clock::time_point last_heartbeat{};
    bool exited = false;
    std::string last_stderr;  // its last line on stderr (on_log), for the cause of a bad exit
  };

  ProcessGroup(std::shared_ptr<HostMeshState> hosts, std::string name, ndslice::Extent extent,
               size_t per_host, SpawnOptions options);
  ~ProcessGroup();

  // From the controller (client Proc worker thread).
  bool on_ready(uint64_t rank, std::string addr, int64_t pid, ActorRef<WorkerControl> control,
                ActorId comm);
  bool on_heartbeat(uint64_t rank);
  void on_actor_failed(uint64_t rank, const std::string& report);
  void on_exit(uint64_t rank, const ExitStatus& st);
  void on_log(uint64_t rank, int stream, std::string line);

  /// From HostMeshState::dispatch: an unhandled failure of an actor on one of this mesh's procs
  /// fails that rank (under `mu`). False when `ev`'s actor ran on none of them.
  bool fail_rank_of(const ActorSupervisionEvent& ev);

  /// Spawns on every host and waits until ready; throws on a start failure (after stopping).
  void start();
  bool stop();

  std::shared_ptr<HostMeshState> hosts;
  // Set when stop() begins (MeshLifetime::stopped): actor meshes on these procs refuse at once.
  std::shared_ptr<std::atomic<bool>> stopped_flag = std::make_shared<std::atomic<bool>>(false);
  std::string name;
  ndslice::Extent extent;
  size_t per_host;
  SpawnOptions options;
  // The actor whose supervise() hears this mesh's failures (owner_failure_handler: spawned
  // inside it with no on_failure of its own; or SpawnOptions::owner), and its Proc when that is
  // not the client Proc (null otherwise); none once ProcMesh::on_failure replaced the handler.
  // Guarded by mu. Each failed proc is declared failed in both Procs, naming the owner.
  ActorId owner;
  Proc* owner_proc = nullptr;
  std::shared_ptr<MeshController::Link> link;
  ActorRef<MeshController> controller;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Rank> ranks;
  // Per host: the incarnation of the agent that spawned our procs there (from its spawn reply);
  // unset until that reply arrives. The monitor pings only hosts whose incarnation is known.
  std::vector<std::optional<uint64_t>> incarnations;
  bool started = false;  // failures before this are start errors, not MeshFailures
  bool stopped = false;
  bool closing = false;  // monitor thread exits
  // To deliver on the monitor thread, each once its ranks are known to be dead (see
  // deliverable_locked), with when it was queued.
  std::deque<std::pair<MeshFailure, std::chrono::steady_clock::time_point>> pending;
  std::optional<MeshFailure> start_failure;
  struct Agg {
    std::vector<size_t> ranks;
  };
  // The aggregation window of this mesh (guarded by mu): hosts->timeouts.log_window until
  // ProcMesh::set_log_window changes it. 0: every line prints at once.
  std::chrono::milliseconds log_window{0};
  // Whether output is forwarded (guarded by mu): SpawnOptions::forward_logs until
  // ProcMesh::set_forward_logs changes it.
  bool forward_logs = true;
  std::map<std::pair<int, std::string>, Agg> agg;  // aggregated lines of the current window
  std::vector<std::pair<int, std::string>> agg_order;
  std::thread monitor;

 private:
  /// The monitor's pings of the agents, per host (its thread only).
  struct AgentPings {
    explicit AgentPings(size_t num_hosts) : pings(num_hosts), ping_sent(num_hosts) {}
    std::vector<std::optional<Future<uint64_t>>> pings;
    std::vector<std::chrono::steady_clock::time_point> ping_sent;
  };

  /// Marks `rank` failed (once), kills it, queues the MeshFailure. Requires `mu`.
  void fail_locked(size_t rank, const std::string& cause);
  /// Monitor thread, under `mu`: fails the ranks of agents that restarted or were lost.
  void check_agents_locked(AgentPings& ap, std::chrono::steady_clock::time_point now);
  /// Monitor thread, under `mu`: fails the Ready ranks silent for heartbeat_timeout.
  void check_heartbeats_locked(const AgentPings& ap, std::chrono::steady_clock::time_point now);
  /// Monitor thread: hands each queued MeshFailure to its handler, or else to HostMeshState's
  /// fault path. Unlocks `lock` around them.
  void deliver_failures(std::unique_lock<std::mutex>& lock);
  /// Under `mu`: whether the oldest pending failure may be delivered: every rank of it has exited
  /// (the agent reported it), or kill_grace passed since it was queued. A frozen proc is killed
  /// first and declared failed only then, so that it cannot wake up (SIGCONT) after casts were
  /// routed around it and act on messages it held (CAST-3, CAST-12).
  bool deliverable_locked(std::chrono::steady_clock::time_point now) const;
  /// How long a failure waits for its ranks' exit reports before it is delivered anyway.
  std::chrono::milliseconds kill_grace() const;
  void kill_rank(const Rank& r);
  void monitor_loop();
  void flush_logs(std::unique_lock<std::mutex>& lock);
  void emit(const LogRecord& rec);
};

/// The failure handler of a mesh spawned inside an actor's handler without one: that actor owns
/// the mesh, and each MeshFailure goes to its supervise(const MeshFailure&). Empty outside actors.
ProcMesh::FailureHandler owner_failure_handler();

}  // namespace monarch::mesh::process_detail
