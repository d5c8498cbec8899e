// Internal: the actors of the agent protocol (host agent, mesh controller, worker control).
//
// Protocol (all messages are actor calls over the existing remote-actor layer):
//   client -> agent   HostAgent::spawn(spec, controller) -> {incarnation, pids};
//                     HostAgent::kill(pid, sig); HostAgent::incarnation() (pinged every
//                     heartbeat_interval: an answer other than the incarnation that spawned a
//                     mesh's procs (a restart), or none (a lost agent), fails that host's ranks);
//                     HostAgent::wire_version(), once at attach_to_workers (PH-8)
//   agent -> client   MeshController::exited(rank, code, signal, core) at once on exit (pidfd);
//                     MeshController::log(rank, stream, line)
//   worker -> client  MeshController::ready(rank, addr, pid, control, comm); heartbeat(rank) every
//                     heartbeat_interval, answered or not (false = you were declared failed:
//                     exit; a failed call = the link to the owner closed: exit);
//                     actor_failed(rank, report) before exiting on an unhandled actor failure
//   client -> worker  WorkerControl::stop_worker(addresses of the procs stopped with it);
//                     proc_failed(addr, cause) when any proc of this host mesh was declared failed
// Outside actors only calls are used (never send): an undeliverable send would reach the sending
// Proc's fault hook, which fails fast; a call's failure just completes its future.
//
// Their bodies: HostAgent in host_agent.cpp, MeshController in process_group.cpp (it forwards to
// the ProcessGroup), WorkerControl in bootstrap.cpp (the worker's side).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "monarch/mesh/process.hpp"
#include "process_host.hpp"

namespace monarch::mesh::process_detail {

struct ProcessGroup;
class MeshController;

/// Unique suffixes for the names and addresses this process makes (mesh and controller names,
/// listen addresses): one counter for all of them (host_agent.cpp).
extern std::atomic<uint64_t> g_counter;

/// Where the workers of the agent listening on `agent_addr` listen:
/// "unix://@x" -> "unix://@monarch-w-<pid>-<n>"; "tcp://H:P" -> "tcp://H".
std::string worker_listen_base(const std::string& agent_addr);

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
  bool fork_server = false;     // SpawnOptions::fork_server
  template <class Ar>
  void serialize(Ar& ar) {
    ar(mesh, program, args, env, first_rank, count, heartbeat_interval_ms, heartbeat_timeout_ms,
       controller_name, fork_server);
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
  /// The owner declared the proc at `addr` failed (`cause`: the MeshFailure's text): this worker
  /// declares it failed too (Proc::declare_proc_failed), so that its link there closes at once,
  /// its calls pending there fail with SupervisionError naming the cause, and its comm actor routes
  /// casts around that proc (CAST-12) instead of waiting out the delivery timeout.
  void proc_failed(std::string addr, std::string cause);
  MONARCH_ENDPOINTS(WorkerControl, stop_worker, proc_failed)

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
  /// Whether the group still wants `rank`. Answered at once, unless the fault point below holds it.
  Future<bool> heartbeat(uint64_t rank);
  void actor_failed(uint64_t rank, std::string report);
  void exited(uint64_t rank, int code, int sig, bool core);
  void log(uint64_t rank, int stream, std::string line);
  MONARCH_ENDPOINTS(MeshController, ready, heartbeat, actor_failed, exited, log)

 private:
  std::shared_ptr<Link> link_;
};

/// Fault point "mesh.heartbeat_reply_held", for tests: between hold and release, the
/// MeshControllers of this (client) process still take heartbeats (the rank is not silent) but
/// keep their answers; release sends every kept answer. It stands in for an answer queued behind
/// bulk data on a busy owner->worker link. Process-wide; any thread.
void hold_heartbeat_replies();
void release_heartbeat_replies();

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

/// The version of this protocol's messages. attach_to_workers asks each agent for its version and
/// refuses one that differs, or one too old to answer (PH-8 in docs/processes.md): a spawn
/// between builds would otherwise fail to decode ("malformed input"). Bump it whenever SpawnSpec,
/// SpawnReply, an endpoint of these actors, or a message the workers exchange (CastWire) changes.
/// 3: CastWire carries the broadcast's caster.
inline constexpr uint32_t kAgentWireVersion = 3;

/// The host agent actor (registered as "monarch.agent" by run_agent; embedded for this_host()).
class HostAgent : public Actor {
 public:
  /// `listen_base`: workers listen on "<base>-<n>" (unix) or "<base>:0" (tcp).
  HostAgent(std::string listen_base, std::shared_ptr<CallbackGate> gate);
  SpawnReply spawn(SpawnSpec spec, ActorRef<MeshController> controller);
  bool kill(int64_t pid, int sig);
  uint64_t incarnation() const { return incarnation_; }
  /// kAgentWireVersion; for tests, MONARCH_TESTING_AGENT_WIRE_VERSION (an integer) in the agent's
  /// environment makes it claim another version.
  uint32_t wire_version() const { return wire_version_; }
  MONARCH_ENDPOINTS(HostAgent, spawn, kill, incarnation, wire_version)

 private:
  std::string listen_base_;
  std::shared_ptr<CallbackGate> gate_;
  uint64_t incarnation_;
  uint32_t wire_version_;
  uint64_t next_ = 0;
};

}  // namespace monarch::mesh::process_detail
