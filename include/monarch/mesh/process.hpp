// Procs in other processes: host agents, the process allocator, worker bootstrap, log forwarding.
//
//   int main(int argc, char** argv) {
//     monarch::mesh::bootstrap(argc, argv, setup);  // a worker started by an agent never returns
//     auto procs = monarch::mesh::this_host().spawn_procs({{"gpus", 4}});     // ProcessAllocator
//     procs.on_failure([](const monarch::mesh::MeshFailure& f) { ...; return true; });  // handled
//     auto workers = procs.lookup<Worker>("worker");                 // ActorMesh<Worker>
//     ...
//   }
//
// Allocators: ProcMesh::local (procs inside this process), this_host() (ProcessAllocator: child
// processes of an agent embedded in this process), attach_to_workers({"tcp://h1:26600", ...})
// (agents started by any launcher: `monarch agent --listen tcp://0.0.0.0:26600`).
//
// Host agent (one per host; embedded for this_host()): forks the worker processes from one
// long-lived thread with PR_SET_PDEATHSIG(SIGKILL), so they die with it; watches each with a
// pidfd and reports its exit (code or signal) to the mesh at once; forwards its stdout/stderr.
//
// Worker: the user's own binary (default: this executable, /proc/self/exe) or `monarch worker`.
// bootstrap() at the top of main turns a process started by an agent into a worker Proc: it
// listens on a channel address, runs `setup` (register the actors the client will look up),
// reports ready to the mesh owner, heartbeats it every ProcTimeouts::heartbeat_interval, and exits
// when asked to stop, or when its owner stays unreachable for heartbeat_timeout.
//
// Actors: ProcMesh::spawn<A>(name, args...) spawns one A on every proc (remote spawn; A and its
// argument types must be serialisable, and the worker binary must contain the same spawn call,
// which it does when it is this executable), or actors registered by the bootstrap setup are
// found with ProcMesh::lookup<A>(name).
//
// Supervision (see failure.hpp): a proc that exits, is killed, stops heartbeating (frozen), or
// whose actor fails unhandled (one spawned by ProcMesh::spawn, or one owned by the worker)
// becomes a MeshFailure naming the mesh, the rank and the cause. The
// failed proc is killed and never reused. A handler set with ProcMesh::on_failure that returns
// true handles it (slices without the failed ranks keep working); otherwise the failure goes to
// the HostMesh fault hook (default: print and exit 1, fail fast). Calls pending on a failed proc
// fail at once with SupervisionError (Proc::declare_proc_failed).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/failure.hpp"
#include "monarch/mesh/proc_mesh.hpp"
#include "monarch/mesh/timeouts.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

/// A forwarded output line, or several identical ones aggregated over ProcTimeouts::log_window.
struct LogRecord {
  std::string mesh;
  std::vector<size_t> ranks;  ///< who wrote it (one rank unless aggregated), ascending
  int stream = 1;             ///< 1 stdout, 2 stderr
  std::string text;           ///< the line, without its newline
  /// "[mesh 3] text", or "[mesh 0,1,2,3] text" for an aggregated line.
  std::string to_string() const;
};
/// Receives forwarded lines; runs on a client Proc worker thread (or the mesh monitor thread when
/// aggregating). Must be quick.
using LogSink = std::function<void(const LogRecord&)>;

struct HostOptions {
  ProcTimeouts timeouts{};
  /// Address the client Proc listens on (workers reach it here). Empty: a unique abstract unix
  /// socket for this_host(), "tcp://0.0.0.0:0"-style is needed for agents on other hosts.
  std::string listen{};
  channel::ChannelOptions channel{};
};

struct SpawnOptions {
  /// Mesh name: in MeshFailures, log prefixes, ActorIds. Empty: "procs<N>".
  std::string name{};
  /// Worker executable; empty: this executable (it must call bootstrap() first thing in main).
  std::string program{};
  std::vector<std::string> args{};
  /// Extra environment of the workers, "KEY=VALUE".
  std::vector<std::string> env{};
  /// Fork the workers from a fork server instead of exec'ing each (PH-7, docs/processes.md): the
  /// first spawn_procs of this program, args and env on a host starts, besides the workers, one
  /// idle process that loaded the program's libraries and waits in bootstrap(); this and later
  /// spawns there (a respawned replica) fork from it in milliseconds, where an exec of a
  /// libtorch program takes most of a second. The program must start no thread before
  /// bootstrap(); if it does, or exits first, its workers are exec'd as without this flag (one
  /// warning). The server lives as long as its host agent.
  bool fork_server = false;
  /// Failure handler (see ProcMesh::on_failure); may also be set later. Left empty when
  /// spawn_procs is called inside an actor's handler, that actor owns the mesh: each MeshFailure
  /// goes to its supervise(const MeshFailure&) (false there fails the actor: fail fast).
  ProcMesh::FailureHandler on_failure{};
  /// The actor that `on_failure` reports to, when it is set and forwards failures to an actor
  /// (uid 0: none), and the Proc that actor runs in (null: the HostMesh's client Proc). It must
  /// outlive the mesh. An owner (this actor, or the spawning actor when on_failure is left empty)
  /// hears a proc's failure as a MeshFailure, so what it sent to that proc and comes back
  /// undelivered is not reported to its undeliverable() a second time (REM-6): a proc that dies
  /// within the channel's Ack window leaves the messages it was just sent unacknowledged. Its
  /// Proc is told of the failure too (Proc::declare_proc_failed), as the client Proc is.
  ActorId owner{};
  Proc* owner_proc = nullptr;
  /// Where worker output goes; empty: our stdout/stderr with a "[mesh rank] " prefix.
  LogSink log_sink{};
  /// Forward worker output at all (config key mesh.log_forwarding); false drops it.
  bool forward_logs = config::global().flag("mesh.log_forwarding");
  /// The cast tree of the mesh's ActorMeshes (fan-out; default: config key mesh.cast_fanout).
  CastOptions cast{};
};

/// The rule for a proc mesh's name (SpawnOptions::name): letters, digits, '_' and '-' (it
/// becomes part of process and actor names). Throws UsageError naming `name` otherwise.
/// HostMesh::spawn_procs applies it; front ends call it to reject a name before spawning.
void check_proc_mesh_name(const std::string& name);

/// Hosts, each running a host agent. Copies share the agents and the client Proc.
class HostMesh {
 public:
  /// {hosts: N} for attach_to_workers; {} (zero-dimensional, one host) for this_host().
  const ndslice::Extent& extent() const;
  /// `per_host` procs on every host: the ProcMesh's extent is this extent followed by
  /// `per_host` ({hosts: 2} x {gpus: 4} -> {hosts: 2, gpus: 4}). Blocks until every proc is
  /// ready. Throws Error naming the mesh, the rank and the cause when a proc fails to start or is
  /// not ready within spawn_timeout (the others are then stopped), UsageError on a bad name.
  ProcMesh spawn_procs(const ndslice::Extent& per_host, SpawnOptions options = {}) const;
  /// The client Proc: owner of the meshes and of the actors ProcMesh::spawn puts on them. Its
  /// fault hook belongs to this HostMesh (it turns failures of actors on our procs into
  /// MeshFailures); set yours with set_fault_hook, not client().set_fault_hook.
  Proc& client() const;
  /// Receives what nobody handled: unhandled MeshFailures (as an ActorSupervisionEvent of actor
  /// "<client>.mesh.<name>", type "ProcMesh") and other failures reaching the client Proc.
  /// Default: print and exit(1) (fail fast). Runs on a mesh monitor or channel I/O thread.
  void set_fault_hook(Proc::FaultHook hook) const;
  const ProcTimeouts& timeouts() const;

  struct State;
  explicit HostMesh(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

/// This host, through an agent embedded in this process (the default ProcessAllocator).
/// Throws UsageError when options.timeouts do not validate.
HostMesh this_host(HostOptions options = {});
/// Hosts whose agents (`monarch agent --listen ADDR`) serve `agents`. Throws Error naming the
/// address of an agent that cannot be reached within spawn_timeout.
HostMesh attach_to_workers(const std::vector<std::string>& agents, HostOptions options = {});

/// At the program's exit (a return from main, or std::exit), a HostMesh that is still alive, such
/// as one kept only by an actor of its own client, is stopped by an atexit handler before static
/// destructors run, newest first:
///   - its ProcMeshes stop side by side (as ProcMesh::stop, within stop_timeout each);
///   - then the client Proc's actors stop (their cleanup() runs), which releases what they held;
///   - a HostMesh that nothing else holds then goes as its destructor does.
/// Failures during it are not reported (no fault hook runs). Left running (the process's exit
/// ends them): a HostMesh with a client actor that did not stop within the client Proc's
/// stop_timeout, and all of them when exit is called from an actor's handler or a channel I/O
/// thread. keep_hosts_at_exit() turns the handler off for this process: the Python client calls
/// it, because it stops its meshes itself, before the interpreter finalizes. Any thread.
void keep_hosts_at_exit();

/// What a worker knows about itself.
struct WorkerInfo {
  std::string mesh;
  size_t rank = 0;
};
/// Runs in the worker before it reports ready (register the actors the client looks up).
/// An exception fails the proc (MeshFailure with the exception's message).
using WorkerSetup = std::function<void(Proc&, const WorkerInfo&)>;

/// Call first thing in main. In a process started by a host agent (MONARCH_WORKER_OWNER set), runs
/// the worker and exits the process (never returns); otherwise returns at once.
void bootstrap(int argc, char** argv, WorkerSetup setup = {});

/// Runs a host agent serving `listen` until SIGTERM or SIGINT; `on_listening(bound address)` runs
/// once it serves. Its workers die with it. Returns the process exit code.
int run_agent(const std::string& listen,
              const std::function<void(const std::string&)>& on_listening = {});

}  // namespace monarch::mesh
