// ReplicaController: the replica-group lifecycle of a fault-tolerant training job (docs/ft.md,
// "Parts"). Torch-free (monarch_ft); the training side is ReplicaClient (torch/replica_client.hpp).
//
//   struct MyController : ft::ReplicaController {
//     using ReplicaController::ReplicaController;
//     Future<void> spawn_trainers(const ft::GroupInfo& g, const mesh::ProcMesh& procs) override {
//       // opts: ReplicaClientOptions with self<ReplicaController>(); no identity yet
//       auto t = procs.spawn<MyTrainer>("trainer", opts);
//       trainers_.insert_or_assign(g.mesh, t);
//       return t.call(&MyTrainer::ready).then([](auto v) { (void)v.to_vector(); });
//     }
//     void start_trainers(const ft::GroupInfo& g, ActorRef<ft::Manager> manager) override {
//       auto& t = trainers_.at(g.mesh);
//       for (size_t i = 0; i < t.size(); ++i)
//         t.at(i).send(&MyTrainer::start, int64_t(i), g.replica_id, g.incarnation, manager);
//     }
//     MONARCH_FT_CONTROLLER_ENDPOINTS(MyController)
//   };
//   auto c = client.spawn<MyController>("controller", hosts, lighthouse, options);
//   c.call(&MyController::spawn_all).get(timeout);  // every group and spare ready
//   c.call(&MyController::start_all).get(timeout);  // once the lighthouse has heard them all
//   ft::RunStats stats = c.call(&MyController::done).get(run_timeout);
//
// Groups: group r (replica id "replica<r>") runs `ranks` procs, first on host_for(r) (default
// hosts[r % hosts.size()]) as mesh "replica<r>-0"; its rank-0 proc holds the group's Manager,
// every proc a FaultAgent (fault points, below) and the user's trainer actor.
// Spares (options.spares): N more meshes "spare<k>" on host_for_spare(k), with FaultAgents and
// the user's trainers spawned and initialised (data loaded, model built) but no Manager: not part
// of the job, unknown to the lighthouse. Trainers learn their identity (replica id, incarnation,
// Manager) only in start_trainers, so any ready mesh can become any group.
// supervise(MeshFailure) of a group's mesh evicts the group at the lighthouse (survivors form a
// quorum without it at once) and replaces it (a new incarnation): by promoting a ready spare
// (a Manager spawned on the spare's rank 0, start_trainers, then a new spare refills the pool) or,
// with no spare ready, on fresh procs "replica<r>-<incarnation>"; the other groups are never
// touched. A failed spare is replaced and logged (no fault of the job). Mesh names map to groups
// explicitly (a promoted spare keeps its name); meshes the controller did not spawn are not
// handled (fail fast).
//
// Counting: every group whose procs failed is one fault: injected by inject(), inject_two() or a
// fault point (faults_injected; a lighthouse freeze counts one too), or not (faults_outside: a
// `kill -9` by a user, an OOM kill). survivor_restarts counts groups restarted without having
// failed (an invariant: 0).
//
// Threads: everything runs in the actor (its handlers and then() continuations). The virtual hooks
// are called there too; they must not block for long (spawn_trainers returns a Future). Spawning
// procs (HostMesh::spawn_procs) blocks the actor until they run (exec, not the trainers' init):
// a spare refill is a message of its own, handled after the promotion that caused it.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "monarch/actor/actor.hpp"
#include "monarch/actor/future.hpp"
#include "monarch/ft/lighthouse.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::ft {

// ---------------------------------------------------------------------------------------------
// Fault points inside a replica's processes (ReplicaClient calls them; FaultAgent arms them).

/// "allreduce.enter": the next ReplicaClient::allreduce in the process throws.
inline constexpr const char* kFaultAllreduceEnter = "allreduce.enter";
/// "heal.after_first_chunk": a healer, after reading the first chunk of its donor's state, asks
/// the controller to SIGKILL the donor (kill_donor_mid_heal) or the healer itself
/// (kill_healer_mid_heal), then goes on reading (and fails, or dies).
inline constexpr const char* kFaultHealAfterFirstChunk = "heal.after_first_chunk";
/// "quorum.after_request": the group's Manager, right after forwarding its quorum request to the
/// lighthouse, asks the lighthouse whether the request is pending there (Lighthouse::status);
/// if it is, it asks the controller to SIGKILL the group (kill_in_quorum); if the quorum formed
/// first, the point re-arms itself for the next request.
inline constexpr const char* kFaultQuorumAfterRequest = "quorum.after_request";

/// Arms `point` in this process (thread-safe). Unknown names are rejected (UsageError).
void arm_fault(const std::string& point);
/// True once per arm: consumes `point` when it is armed in this process (thread-safe).
bool take_fault(std::string_view point);
/// Whether `point` is armed in this process now, without consuming it (thread-safe).
bool fault_armed(std::string_view point);
/// Fault point "heal.after_first_chunk" of healer group `healer` reading from `donor`: when armed,
/// asks the controller (blocks up to 10 s) to kill the donor or the healer, naming this process
/// (getpid()). No-op otherwise.
void fault_point_kill_donor(const std::string& healer, const std::string& donor);
/// Fault point "quorum.after_request" of group `replica_id`, whose request for step `step` was
/// just sent to `lighthouse` (Manager::send_inflight calls it on the Manager's thread). When
/// armed, a helper thread checks the lighthouse's status (up to 2 s) and asks the controller to
/// kill the group while the request is pending; re-arms the point when it was not. No-op
/// otherwise.
void fault_point_quorum_request(const ActorRef<Lighthouse>& lighthouse,
                                const std::string& replica_id, int64_t step);

class ReplicaController;

/// One per proc of every replica group (the controller spawns it as "ft.faults"): arms this
/// process's fault points and tells fault_point_kill_donor which controller to ask.
class FaultAgent : public Actor {
 public:
  explicit FaultAgent(ActorRef<ReplicaController> controller);
  void arm(std::string point) { arm_fault(point); }
  MONARCH_ENDPOINTS(FaultAgent, arm)
};

// ---------------------------------------------------------------------------------------------
// Reports and the fault timeline.

/// What each rank tells its controller after every step (committed or not) and once at the end
/// (`final`). ReplicaClient::report fills it.
struct StepReport {
  std::string replica_id;
  int64_t incarnation = 0;
  int64_t rank = 0;
  int64_t step = 0;  ///< committed steps after this one
  bool committed = false;
  double loss = -1;  ///< mean loss of this rank's share; -1 when it did not train (healing)
  int64_t quorum_id = 0;
  int64_t participants = 0;
  int64_t healing = 0;
  bool healed = false;  ///< this step healed from `donor`
  std::string donor;
  double heal_ms = 0;
  uint64_t heal_bytes = 0;
  uint64_t hash = 0;    ///< FlatState::hash() when `hashed`
  bool hashed = false;  ///< `hash` is set: a commit of a step that is a multiple of hash_every,
                        ///< and the final report
  int64_t t_ns = 0;     ///< steady_clock, ns (same host as the controller for timelines)
  std::string error;    ///< why the step did not commit
  double metric = -1;   ///< the model's quality metric when evaluated (-1: not this step)
  bool final = false;   ///< the rank reached the last step and holds
  uint64_t state_bytes = 0;
  /// `error` is a program error (ReplicaClient::allreduce's UsageError, e.g. replicas whose
  /// states differ in size), not a fault: no retry or respawn can fix it, and the controller
  /// ends the run with it (RunStats::error).
  bool fatal = false;
  template <class A>
  void serialize(A& ar) {
    ar(replica_id, incarnation, rank, step, committed, loss, quorum_id, participants, healing,
       healed, donor, heal_ms, heal_bytes, hash, t_ns, error, metric, final, state_bytes, hashed,
       fatal);
  }
};

enum class FaultKind {
  sigkill,
  sigstop,
  allreduce_throw,
  kill_donor_mid_heal,
  outside,
  sigkill_two_at_once,   ///< inject_two(): two groups SIGKILLed in the same handler
  kill_healer_mid_heal,  ///< SIGKILL; the replacement dies at heal.after_first_chunk
  kill_in_quorum,        ///< SIGKILL at quorum.after_request, its request pending
  lighthouse_freeze,     ///< freeze_lighthouse(): SIGSTOP of the lighthouse's process, SIGCONT
};
/// "sigkill", "sigstop", "allreduce_exception", "kill_donor_mid_heal", "outside",
/// "sigkill_two_at_once", "kill_healer_mid_heal", "kill_in_quorum", "lighthouse_freeze".
const char* fault_name(FaultKind kind);

/// One fault and its recovery. Times are steady_clock ns (0: not yet).
struct FaultRecord {
  FaultKind kind{};
  int64_t step = 0;       ///< last committed step when injected (or detected, for outside)
  int64_t quorum_id = 0;  ///< quorum id then
  /// Groups hit (the donor joins for kill_donor_mid_heal); "lighthouse" for lighthouse_freeze.
  std::set<std::string> victims;
  /// Victims not committed in a newer quorum yet (or final: healed to the last step); for
  /// lighthouse_freeze every group, until it commits after the thaw (the fast path may keep the
  /// quorum id).
  std::set<std::string> pending_rejoin;
  /// Victims whose failure supervise() has matched with this fault. A later failure of the same
  /// group (its replacement died too) is a fault of its own.
  std::set<std::string> failed;
  std::string note;
  bool donor_killed = false;  ///< the heal point was handled (once per fault)
  /// A fault point's kill happened (kill_donor_mid_heal: the donor, not spared;
  /// kill_healer_mid_heal: the healer; kill_in_quorum: the group, its request pending).
  bool fired = false;
  int64_t injected = 0, detected = 0, new_quorum = 0, survivors_resumed = 0, respawned = 0,
          healed = 0, rejoined = 0;
  /// A respawn on fresh procs, split: the replacement's processes run (spawn_procs returned), and
  /// its trainers are initialised (spawn_trainers' future); `respawned` follows once its Manager
  /// answers. 0 for a promoted spare (its procs and trainers were up before the fault).
  int64_t procs_up = 0, trainers_ready = 0;
  int64_t thawed = 0;       ///< lighthouse_freeze: when the SIGCONT is due (injected + freeze)
  std::string unrecovered;  ///< why recovery_s is null (set when the run ends with it open)
  bool open() const { return !pending_rejoin.empty(); }
  /// Its kill happens at a named fault point, which may not be reached (see `fired`).
  bool at_point() const {
    return kind == FaultKind::kill_donor_mid_heal || kind == FaultKind::kill_healer_mid_heal ||
           kind == FaultKind::kill_in_quorum;
  }
  /// A kill_in_quorum whose point has not fired yet: nothing happened to the group so far.
  bool armed_only() const { return kind == FaultKind::kill_in_quorum && !fired; }
  /// recovery_s = rejoined - injected; other keys "<event>_s" relative to `t0` (null when unset);
  /// "unrecovered" says why a fault has no recovery_s; "fired" (fault-point kinds only, else
  /// null) whether the point's kill happened.
  nlohmann::json to_json(int64_t t0) const;
};

/// What one committed step looked like across the groups that committed it.
struct StepInfo {
  uint64_t hash = 0;
  bool hashed = false;  ///< a report of this step carried a hash (steps that are multiples of
                        ///< ReplicaClientOptions::hash_every)
  int64_t reports = 0;
  double loss_sum = 0;
  int64_t loss_n = 0;
  int64_t participants = 0;
  int64_t healing = 0;
  int64_t quorum_id = 0;
  int64_t t_ns = 0;    ///< first commit report of the step
  double metric = -1;  ///< as reported (rank 0 of replica rank 0), or the final value
  double loss() const { return loss_n ? loss_sum / static_cast<double>(loss_n) : -1; }
  /// The metrics line of step `step` (see ReplicaControllerOptions::metrics_path).
  nlohmann::json to_json(int64_t step, int64_t t0, const std::string& run,
                         const std::string& metric_name) const;
};

/// The run's outcome (ReplicaController::done).
struct RunStats {
  int64_t steps = 0;
  double wall_s = 0;
  double metric = -1;  ///< the final metric (full held-out set) of replica0
  bool replicas_bitwise_equal = false;
  int64_t hash_mismatches = 0;
  /// Groups failed by inject(), inject_two() (2), the fault points (a donor or healer killed at
  /// heal.after_first_chunk, a kill at quorum.after_request), plus lighthouse freezes.
  int64_t faults_injected = 0;
  int64_t faults_outside = 0;  ///< groups that failed without an injected fault
  int64_t survivor_restarts = 0;
  int64_t respawns = 0;         ///< groups replaced (promoted spares and fresh procs)
  int64_t spares_promoted = 0;  ///< replacements that were a ready spare
  int64_t spare_failures = 0;   ///< spare meshes that failed (replaced; not faults of the job)
  double max_survivor_stall_s = 0;
  std::string max_stall_where;
  std::vector<double> recovery_s;
  double committed_samples_per_s = 0;
  double heal_gbps = 0;
  uint64_t state_bytes = 0;
  double step_ms_p50 = 0, step_ms_p95 = 0;  ///< between consecutive committed steps
  std::string faults_json;                  ///< JSON array of FaultRecord::to_json
  std::string error;
  template <class A>
  void serialize(A& ar) {
    ar(steps, wall_s, metric, replicas_bitwise_equal, hash_mismatches, faults_injected,
       faults_outside, survivor_restarts, respawns, spares_promoted, spare_failures,
       max_survivor_stall_s, max_stall_where, recovery_s, committed_samples_per_s, heal_gbps,
       state_bytes, step_ms_p50, step_ms_p95, faults_json, error);
  }
};

/// memcpy bandwidth (GB/s) of a buffer of `bytes` (at least 4 KiB), hot: the same copy 50
/// times in a row, source, destination and TLB warm (the heal target's peer, docs/ft.md).
double memcpy_gbps(size_t bytes);
/// memcpy bandwidth (GB/s) of one copy of `bytes` (at least 4 KiB) between buffers evicted from
/// the caches (a read of twice the last-level cache, at least 64 MiB, before each copy): the
/// median of 9. A heal is one such copy. Takes about 0.1-0.5 s; allocates the eviction buffer for
/// the call. Any thread.
double memcpy_cold_gbps(size_t bytes);
/// q-quantile (0..1, linear interpolation) of `v`; 0 when empty.
double percentile(std::vector<double> v, double q);

// ---------------------------------------------------------------------------------------------

struct ReplicaControllerOptions {
  int64_t groups = 1;            ///< replica groups
  int64_t ranks = 1;             ///< procs (trainer ranks) per group
  int64_t steps = 0;             ///< the run ends when every group reported final at this step
  int64_t samples_per_step = 0;  ///< for committed_samples_per_s
  std::string run_name = "run";  ///< prefixes event lines; "run" key of metrics lines
  /// Non-empty: JSONL metrics written here (truncated first): one line per committed step in
  /// step order (run, step, participants, healing, quorum_id, t_s, loss, <metric_name> when
  /// evaluated) and one per fault (FaultRecord::to_json) when it closes or at the end.
  std::string metrics_path{};
  std::string metric_name = "metric";
  /// Warm spare groups (>= 0): spawned and initialised at start and after each promotion, so
  /// that a failed group's replacement does not wait for process start. Each costs one group's
  /// procs (memory, and their start CPU, also when a refill runs during training).
  int64_t spares = 0;
  /// Fork the groups' procs from a fork server per host (mesh::SpawnOptions::fork_server) rather
  /// than exec each: a replacement's procs start in milliseconds instead of reloading the
  /// trainer program's libraries (libtorch: most of a second), and unlike a spare nothing runs
  /// meanwhile. The trainer program must start no thread before mesh::bootstrap().
  bool fork_server = true;
  /// The run fails (RunStats::error, done() completes) when no group has committed a step for
  /// this long, naming what the lighthouse waits for: a job whose state is lost (every group that
  /// held it died), or a lighthouse that is gone or misconfigured, ends with an error instead of
  /// waiting forever. Counted from start_all() and from each new highest commit; time the
  /// controller itself was stopped (SIGSTOP of its process) does not count. 0: ft.progress_timeout
  /// (0 there: off); negative: off. Keep it above any freeze the run injects.
  std::chrono::milliseconds progress_timeout{0};
  template <class A>
  void serialize(A& ar) {
    ar(groups, ranks, steps, samples_per_step, run_name, metrics_path, metric_name, spares,
       fork_server, progress_timeout);
  }
};

/// What the hooks learn. spawn_trainers: only `mesh` (and `spare`); the trainers are nobody yet.
/// start_trainers: the group the mesh's trainers become.
struct GroupInfo {
  int64_t group = -1;        ///< start_trainers: the group; -1 in spawn_trainers
  std::string replica_id;    ///< start_trainers: "replica<group>"; "" in spawn_trainers
  int64_t incarnation = -1;  ///< start_trainers: 0 at the start, +1 per replacement
  bool respawn = false;      ///< start_trainers: a replacement (promoted spare or fresh procs)
  std::string mesh;    ///< the mesh the trainers run on ("replica<r>-<i>", "spare<k>"): their key
  bool spare = false;  ///< spawn_trainers: spawned as a spare
};

class ReplicaController : public Actor {
 public:
  /// `hosts`: at least one; options.groups and options.ranks at least 1 (UsageError otherwise,
  /// from the constructor: spawned as an actor, that fails the actor, and unhandled at the top
  /// it ends the process with the message, as any actor's failing constructor does).
  /// `lighthouse`: the job's (in this process or external).
  ReplicaController(std::vector<mesh::HostMesh> hosts, ActorRef<Lighthouse> lighthouse,
                    ReplicaControllerOptions options);
  ~ReplicaController() override;

  /// Spawns every group (procs, manager, fault agents, trainers) and options.spares spares;
  /// completes once every group's and spare's spawn_trainers future did. Fails with an Error
  /// naming the first group or spare whose future failed ("spawn_all: replica2 (mesh replica2-0)
  /// did not start: <its error>"; e.g. a process killed while its trainers initialise): a
  /// failure before training starts is not healed. A spawn_trainers future that never completes
  /// never completes this one either: bound the wait. Does not start training.
  Future<void> spawn_all();
  /// Waits (polling, up to mesh.spawn_timeout) until the lighthouse has heard from every group,
  /// so that the first quorum has them all, then calls start_trainers for every group.
  void start_all();
  /// Completes with the run's statistics once every group reported final (or finish_now()).
  Future<RunStats> done();
  /// Ends the run now with what is known: groups that did not finish make it not equal.
  void finish_now();
  /// Stops every group's procs (and joins the helper threads).
  void shutdown();
  /// A rank's step reports, oldest first (ReplicaClient::report sends them: plain commits in
  /// batches, anything else at once with the batch before it). Timelines use each report's own
  /// t_ns, so a batch's delay moves only when the controller learns of a step.
  void report(std::vector<StepReport> reports);
  /// Fault point "heal.after_first_chunk": once per open kill_donor_mid_heal fault of `healer`,
  /// SIGKILLs `donor`'s rank 0 (unless it is the last up-to-date group outside every open fault:
  /// then it spares it and says so); once per open kill_healer_mid_heal fault, SIGKILLs `healer`.
  /// `pid` is the asking process (any rank of `healer`): a request from a process the healer's
  /// group no longer runs on (its heal is gone with it) kills nothing and returns false.
  bool kill_donor(std::string healer, std::string donor, int64_t pid);
  /// Fault point "quorum.after_request": SIGKILLs `replica_id`'s rank 0 once per open
  /// kill_in_quorum fault of it; `detail` (what the lighthouse showed) goes into its note. `pid`
  /// is the asking process (the point's): a request from a process the group no longer runs on
  /// (an earlier incarnation's, arriving after a respawn) kills nothing and returns false.
  bool kill_in_quorum(std::string replica_id, int64_t pid, std::string detail);
  /// Replaces group `group`: a ready spare, else fresh procs (supervise() sends it).
  void respawn(int64_t group);
  /// Spawns spares until options.spares are ready or spawning (promotions send it).
  void refill_spares();
  /// The progress watchdog (options.progress_timeout): its own thread sends it once a second or
  /// so from start_all() on; ends the run with an error when no step committed in time.
  void check_progress();
  bool supervise(const mesh::MeshFailure& failure) override;
  void undeliverable(const DeliveryFailure& failure) override;

  MONARCH_ENDPOINTS(ReplicaController, spawn_all, start_all, done, finish_now, shutdown, report,
                    kill_donor, kill_in_quorum, respawn, refill_spares, check_progress)

 protected:
  /// Where group `group` runs; default hosts[group % hosts.size()]. A launcher that replaces
  /// dead hosts overrides it (with replace_host).
  virtual const mesh::HostMesh& host_for(int64_t group);
  /// Group `group`'s host looks gone (`why`): its procs failed with a cause naming their host
  /// agent ("host agent ADDR lost ..." or "... restarted ..."; called in supervise, before the
  /// respawn), or a respawn could not spawn procs on host_for(group) (the spawn error). Return
  /// true when host_for(group) will now give another host: the respawn goes there, and a failed
  /// respawn spawn is retried once on it. Default false. A respawn that still cannot spawn (or
  /// whose host_for throws) ends the run: RunStats::error "cannot respawn replicaN: <the error>".
  /// May block (e.g. starting that host is left to host_for).
  virtual bool replace_host(int64_t group, const std::string& why) {
    (void)group;
    (void)why;
    return false;
  }
  /// Where spare `k` (0, 1, ... over the run) runs; default host_for(k % groups). A promoted spare
  /// stays where it is. A launcher with one host per group (SLURM) has no room for spares unless
  /// it overrides this with hosts of their own.
  virtual const mesh::HostMesh& host_for_spare(int64_t k);
  /// Spawns the user's trainer actors (one per rank) on `procs` (mesh g.mesh), handing them
  /// self<ReplicaController>(), and initialises them (data, model); the Future completes once they
  /// are ready to train. They have no identity yet: they may become any group.
  virtual Future<void> spawn_trainers(const GroupInfo& g, const mesh::ProcMesh& procs) = 0;
  /// The trainers spawned on mesh g.mesh become group g.group (g.replica_id, g.incarnation, its
  /// Manager `manager` on the mesh's rank 0, already running) and start training.
  virtual void start_trainers(const GroupInfo& g, ActorRef<Manager> manager) = 0;
  /// An event line (fault, supervision, quorum change, heal, recovery). Default: nothing.
  virtual void on_event(const std::string& line) { (void)line; }
  /// The first commit report of a new highest step (progress, fault scheduling).
  virtual void on_commit(int64_t step, const StepInfo& info) {
    (void)step;
    (void)info;
  }
  /// Steps in order, once the next one started (and all remaining at the end), after their
  /// metrics line.
  virtual void on_step(int64_t step, const StepInfo& info) {
    (void)step;
    (void)info;
  }
  /// A fault closed (its victims rejoined), or was still open at the end.
  virtual void on_fault(const FaultRecord& f) { (void)f; }

  /// Fault injection: `kind` on group `group` (sigstop: frozen for `freeze`, then SIGCONT;
  /// kill_donor_mid_heal / kill_healer_mid_heal: SIGKILL, then the replacement's heal kills its
  /// donor / itself after the first chunk; kill_in_quorum: arms quorum.after_request in the
  /// group's rank 0, the kill follows at its next quorum request). Only in the actor. UsageError
  /// for a bad group, a group not running, or kinds outside, sigkill_two_at_once and
  /// lighthouse_freeze (their own calls below). The signals go to ProcMesh::pid(0) with kill(2):
  /// procs on this host only (a remote host's agent would have to deliver them).
  void inject(FaultKind kind, int64_t group,
              std::chrono::milliseconds freeze = std::chrono::milliseconds(2000));
  /// sigkill_two_at_once: SIGKILL to groups `a` and `b` back to back in this handler (one fault,
  /// two victims). UsageError as inject(), or when a == b.
  void inject_two(int64_t a, int64_t b);
  /// lighthouse_freeze: SIGSTOP to the lighthouse's process `pid` (it must run in its own process
  /// on this host), SIGCONT after `freeze`. Every group is held up (not a survivor stall); the
  /// fault closes once every group committed after the thaw. UsageError for pid <= 0.
  void freeze_lighthouse(int pid, std::chrono::milliseconds freeze);
  /// Group `group` runs (its trainers started) and its procs have not failed.
  bool running(int64_t group) const;
  /// Every group up, no fault open, and the last committed step had every group.
  bool quiet() const;
  /// Spares ready to be promoted now.
  int64_t spares_ready() const;
  /// The last committed step (highest over all groups).
  int64_t max_committed() const { return max_committed_; }
  const ReplicaControllerOptions& options() const { return opts_; }
  const std::vector<FaultRecord>& faults() const { return faults_; }
  int64_t t0_ns() const { return t0_; }
  /// "[  12.34s] <run>: what", relative to spawn_all.
  std::string stamp(int64_t t_ns) const;
  void event(const std::string& what);

 private:
  void take_report(StepReport r);  // one report of report()'s batch
  // One spawned mesh: procs, fault agents and the user's trainers (a group's or a spare).
  struct Unit {
    std::string mesh;
    std::optional<mesh::ProcMesh> procs;
    std::optional<mesh::ActorMesh<FaultAgent>> agents;
    bool ready = false;  // spawn_trainers completed
  };
  struct Group {
    Unit unit;
    std::optional<ActorRef<Manager>> manager;
    int64_t incarnation = -1;
    bool up = false;
    bool failed = false;  // this incarnation's procs failed (supervise)
    int64_t failures_in_a_row = 0;
    bool arm_kill_donor = false;  // arm heal.after_first_chunk in the next incarnation
  };
  struct MeshOwner {
    int64_t group = -1;  // -1: a spare (in spares_)
    int64_t incarnation = -1;
  };
  static std::string replica_id(int64_t r) { return "replica" + std::to_string(r); }
  GroupInfo info(int64_t r) const;
  Unit spawn_unit(const mesh::HostMesh& host, const std::string& name);
  Future<void> spawn_group(int64_t r, bool respawned);
  Future<void> spawn_spare();
  void promote(int64_t r, Unit spare);
  void attach(int64_t r);
  /// Sets `when` (if unset) to now in every open fault with group r among its victims.
  void mark_victims(int64_t r, int64_t FaultRecord::*when);
  void start_replacement(int64_t r, const std::string& how);
  void start_group(int64_t r);
  void note_progress(const StepReport& r);
  bool is_victim_at(const std::string& id, int64_t from, int64_t to) const;
  FaultRecord* open_fault();
  // `id` is back for `f` (committed in a newer quorum, or reached the last step) at `t`; closes
  // `f` with its recovery time when it was the last victim pending.
  void rejoin(FaultRecord& f, const std::string& id, int64_t t);
  void flush_steps(int64_t before);
  void finish(bool complete);
  void fail_run(std::string why);  // finish(false) with RunStats::error `why`, as an event too

  std::vector<mesh::HostMesh> hosts_;
  ActorRef<Lighthouse> lighthouse_;
  ReplicaControllerOptions opts_;
  std::string job_;  // QuorumMember::job of this run's groups
  std::vector<Group> groups_;
  std::vector<Unit> spares_;                 // spawning or ready, oldest first
  std::map<std::string, MeshOwner> meshes_;  // every mesh spawned -> who runs on it
  int64_t next_spare_ = 0, spare_failures_in_a_row_ = 0;
  std::vector<FaultRecord> faults_;
  std::vector<std::thread> helpers_;  // SIGCONT timers, stops of old meshes
  std::ofstream metrics_;
  int64_t t0_ = 0, started_ = 0;
  std::map<int64_t, StepInfo> steps_;
  int64_t max_committed_ = 0, flushed_upto_ = -1, last_qid_ = 0;
  int64_t first_commit_ns_ = 0, last_commit_ns_ = 0;
  std::map<std::string, int64_t> last_progress_at_;            // replica/incarnation/rank -> time
  std::map<std::string, std::pair<uint64_t, double>> finals_;  // replica -> (hash, metric)
  std::set<std::string> errors_seen_;
  double heal_bytes_ = 0, heal_secs_ = 0;
  RunStats stats_;
  bool finished_ = false;
  std::optional<Promise<RunStats>> done_;
  std::chrono::milliseconds progress_timeout_{0};  // resolved; <= 0: off
  std::chrono::milliseconds progress_period_{0};   // how often the watchdog checks
  int64_t progress_since_ns_ = 0;                  // the watchdog's baseline
  int64_t last_check_ns_ = 0;                      // its previous check
  detail::Periodic watchdog_;
};

}  // namespace monarch::ft

/// MONARCH_ENDPOINTS for a ReplicaController subclass C: the base's endpoints (trainers in other
/// processes call report/kill_donor through an ActorRef<ReplicaController>) plus C's own.
#define MONARCH_FT_CONTROLLER_ENDPOINTS(C, ...)                                              \
  MONARCH_ENDPOINTS(C, spawn_all, start_all, done, finish_now, shutdown, report, kill_donor, \
                    kill_in_quorum, respawn, refill_spares,                                  \
                    check_progress __VA_OPT__(, ) __VA_ARGS__)
