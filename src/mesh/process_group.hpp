// Internal: the actors of the agent protocol and the client-side state of one process mesh.
//
// Protocol (all messages are actor calls over the existing remote-actor layer):
//   client -> agent   HostAgent::spawn(spec, controller) -> {incarnation, pids};
//                     HostAgent::kill(pid, sig); HostAgent::incarnation() (pinged every
//                     heartbeat_interval: an answer other than the incarnation that spawned a
//                     mesh's procs (a restart), or none (a lost agent), fails that host's ranks)
//   agent -> client   MeshController::exited(rank, code, signal, core) at once on exit (pidfd);
//                     MeshController::log(rank, stream, line)
//   worker -> client  MeshController::ready(rank, addr, pid, control, comm); heartbeat(rank) every
//                     heartbeat_interval (false = you were declared failed: exit);
//                     actor_failed(rank, report) before exiting on an unhandled actor failure
//   client -> worker  WorkerControl::stop_worker(addresses of the procs stopped with it)
// Outside actors only calls are used (never send): an undeliverable send would reach the sending
// Proc's fault hook, which fails fast; a call's failure just completes its future.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "monarch/mesh/process.hpp"
#include "process_host.hpp"

namespace monarch::mesh::process_detail {

struct ProcessGroup;
class MeshController;

struct SpawnSpec {
  std::string mesh;
  std::string program;
  std::vector<std::string> args;
  std::vector<std::string> env;
  uint64_t first_rank = 0;
  uint64_t count = 0;
  int64_t heartbeat_interval_ms = 0;
  int64_t heartbeat_timeout_ms = 0;
  std::string controller_name;  // registered name of the MeshController in the client Proc
  template <class Ar>
  void serialize(Ar& ar) {
    ar(mesh, program, args, env, first_rank, count, heartbeat_interval_ms, heartbeat_timeout_ms,
       controller_name);
  }
};

/// What HostAgent::spawn answers: the agent's incarnation (the procs die with it) and their pids.
struct SpawnReply {
  uint64_t incarnation = 0;
  std::vector<int64_t> pids;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(incarnation, pids);
  }
};

/// The worker's control actor (registered as "monarch.worker").
class WorkerControl : public Actor {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::vector<std::string> stopping;   // procs stopped with this one (stop_worker)
    std::optional<std::string> failure;  // an unhandled actor failure to report
  };
  explicit WorkerControl(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  /// The owner stops this proc and `stopping` (its mesh's procs) with it: messages between them
  /// that are still unacknowledged are moot, so the worker forgets those procs (Proc::forget_proc)
  /// before it shuts down instead of waiting for acks or warning of their loss.
  void stop_worker(std::vector<std::string> stopping);
  MONARCH_ENDPOINTS(WorkerControl, stop_worker)

 private:
  std::shared_ptr<Shared> s_;
};

/// Client side; one per process mesh. Forwards to the ProcessGroup while it exists.
class MeshController : public Actor {
 public:
  struct Link {
    std::mutex mu;
    ProcessGroup* group = nullptr;  // null once the group is gone
  };
  explicit MeshController(std::shared_ptr<Link> link) : link_(std::move(link)) {}
  bool ready(uint64_t rank, std::string addr, int64_t pid, ActorRef<WorkerControl> control,
             ActorId comm);
  bool heartbeat(uint64_t rank);
  void actor_failed(uint64_t rank, std::string report);
  void exited(uint64_t rank, int code, int sig, bool core);
  void log(uint64_t rank, int stream, std::string line);
  MONARCH_ENDPOINTS(MeshController, ready, heartbeat, actor_failed, exited, log)

 private:
  std::shared_ptr<Link> link_;
};

/// Exit and log callbacks of the agent's children run on the reaper thread and post to the
/// controller through its Proc. An embedded agent's Proc is the client's, which the HostMesh
/// destroys: it closes the gate first, waiting for a callback in flight, so none touches it after.
struct CallbackGate {
  std::mutex mu;
  bool open = true;
  uint64_t next = 0;
  // The refs live here, not in the callbacks: close() releases them while the Proc is alive.
  std::unordered_map<uint64_t, ActorRef<MeshController>> targets;
  uint64_t add(ActorRef<MeshController> ref) {
    std::lock_guard lock(mu);
    targets.emplace(next, std::move(ref));
    return next++;
  }
  template <class F>
  void with(uint64_t id, F&& f) {
    std::lock_guard lock(mu);
    if (!open) return;
    if (auto it = targets.find(id); it != targets.end()) f(it->second);
  }
  void close() {
    std::unordered_map<uint64_t, ActorRef<MeshController>> gone;
    std::lock_guard lock(mu);
    open = false;
    gone.swap(targets);
  }
};

/// The host agent actor (registered as "monarch.agent" by run_agent; embedded for this_host()).
class HostAgent : public Actor {
 public:
  /// `listen_base`: workers listen on "<base>-<n>" (unix) or "<base>:0" (tcp).
  HostAgent(std::string listen_base, std::shared_ptr<CallbackGate> gate);
  SpawnReply spawn(SpawnSpec spec, ActorRef<MeshController> controller);
  bool kill(int64_t pid, int sig);
  uint64_t incarnation() const { return incarnation_; }
  MONARCH_ENDPOINTS(HostAgent, spawn, kill, incarnation)

 private:
  std::string listen_base_;
  std::shared_ptr<CallbackGate> gate_;
  uint64_t incarnation_;
  uint64_t next_ = 0;
};

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
  /// The client Proc's fault hook: failures of actors on our procs become MeshFailures.
  void on_fault(const ActorSupervisionEvent& ev);
  bool dispatch(const ActorSupervisionEvent& ev);
  ~HostMeshState();
};

struct ProcessGroup {
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

  /// Spawns on every host and waits until ready; throws on a start failure (after stopping).
  void start();
  bool stop();

  std::shared_ptr<HostMeshState> hosts;
  std::string name;
  ndslice::Extent extent;
  size_t per_host;
  SpawnOptions options;
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
  bool closing = false;             // monitor thread exits
  std::deque<MeshFailure> pending;  // to deliver on the monitor thread
  std::optional<MeshFailure> start_failure;
  struct Agg {
    std::vector<size_t> ranks;
  };
  std::map<std::pair<int, std::string>, Agg> agg;  // aggregated lines of the current window
  std::vector<std::pair<int, std::string>> agg_order;
  std::thread monitor;

  /// Marks `rank` failed (once), kills it, queues the MeshFailure. Requires `mu`.
  void fail_locked(size_t rank, const std::string& cause);

 private:
  void kill_rank(const Rank& r);
  void monitor_loop();
  void flush_logs(std::unique_lock<std::mutex>& lock);
  void emit(const LogRecord& rec);
};

}  // namespace monarch::mesh::process_detail
