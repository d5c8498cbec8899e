// ft_train's fault schedules (docs/ft.md, "Faults" and "Chaos mode"): the fixed rotation of
// `--faults N` and the seeded random schedule of `--chaos`, on top of ft::ReplicaController's
// fault points and actions. Also the lighthouse in a process of its own, which chaos freezes.
//
// Threads: ScheduledController runs in its actor like its base (inject_due is called from the
// on_commit hook). spawn_lighthouse_proc and prepare_chaos run on the job's main thread.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "monarch/ft/controller.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::ft::example {

/// --chaos and its knobs.
struct ChaosOptions {
  bool on = false;
  int64_t faults = 8;      ///< --chaos-faults: at least 4 (the required kinds, below)
  int lighthouse_pid = 0;  ///< the lighthouse's own process (spawn_lighthouse_proc); set by the job
};

/// Adds --chaos and --chaos-faults to `app`.
void add_chaos_flags(CLI::App& app, ChaosOptions& o);
/// Checks the chaos flags against the job's (UsageError naming the flag: at least 3 replica
/// groups, a freeze longer than ft.heartbeat_timeout, no external --lighthouse) and returns the
/// number of faults of the faulty run. Call only with o.on.
int64_t prepare_chaos(const ChaosOptions& o, int64_t replicas, int64_t freeze_ms,
                      const std::string& lighthouse_addr);

/// Kinds every chaos run injects at least once: two groups at once, a fault during a heal, a
/// fault during quorum, the lighthouse frozen.
const std::vector<FaultKind>& chaos_required_kinds();
/// Kinds a chaos run adds when --chaos-faults allows (8 and more: all of them).
const std::vector<FaultKind>& chaos_other_kinds();

/// One planned chaos fault: its kind, and how many committed steps after the previous
/// injection (the first: after 10 % of the run) it is due.
struct ChaosFault {
  FaultKind kind;
  int64_t gap;
};
/// The seeded plan of a chaos run of `steps` steps with `faults` faults: every required kind,
/// then the other kinds (seeded order), then random kinds; shuffled; gaps alternate at random
/// between short ones (2-15 steps: inside the previous fault's recovery) and long ones.
std::vector<ChaosFault> chaos_plan(uint64_t seed, int64_t faults, int64_t steps);

struct ScheduleOptions {
  uint64_t seed = 1;
  int64_t faults = 0;                      ///< 0: no faults
  std::chrono::milliseconds freeze{2000};  ///< sigstop and lighthouse_freeze
  ChaosOptions chaos{};
};

/// A ReplicaController that injects the job's faults. Without chaos: `faults` kinds in a fixed
/// rotation (sigkill, sigstop, allreduce_exception, kill_donor_mid_heal from a seeded offset)
/// between 10 % and 60 % of the run, one at a time, only when quiet(). With chaos: chaos_plan's
/// faults, each once its gap passed and enough groups are free (running, in no open fault: at
/// least one group must stay outside every open fault, whose state is the job's), between 10 %
/// and 85 % of the run, overlapping the recoveries still open.
class ScheduledController : public ReplicaController {
 public:
  ScheduledController(std::vector<mesh::HostMesh> hosts, ActorRef<Lighthouse> lighthouse,
                      ReplicaControllerOptions options, ScheduleOptions schedule);

 protected:
  /// From on_commit(step): injects what is due at committed step `step`.
  void inject_due(int64_t step);

 private:
  void inject_chaos(int64_t step);
  // A fault-point kind whose fault closed without its point firing (a donor spared as the last
  // up-to-date group, a healer or donor already gone) is planned again, a few steps on: chaos
  // promises every kind, and which group is where when a point is reached is timing.
  void replan_unfired(int64_t step);

  ScheduleOptions sched_;
  std::mt19937_64 rng_;
  std::vector<std::pair<int64_t, FaultKind>> plan_;  // fixed rotation: (step, kind)
  std::vector<ChaosFault> chaos_;
  size_t next_ = 0;
  bool cut_short_ = false;  // said that planned faults were left out
  // Past the last step a fault may start at: says once how many planned faults were left out.
  void note_left_out(int64_t step, int64_t last, size_t planned);
  int64_t due_at_ = 0;
  size_t replanned_ = 0;  // faults_ records looked at by replan_unfired (closed ones, in order)
  int64_t replans_ = 0;   // kinds planned again so far (at most kMaxReplans)
  static constexpr int64_t kMaxReplans = 4;
};

/// A Lighthouse actor on a one-proc ProcMesh of its own on `host` (so that it can be frozen
/// alone), with Q-7's recovery wait = ft.heartbeat_timeout as `monarch lighthouse` has. Stops
/// the proc when destroyed.
struct LighthouseProc {
  mesh::ProcMesh procs;
  ActorRef<Lighthouse> ref;
  int pid = 0;
  ~LighthouseProc();
};
std::unique_ptr<LighthouseProc> spawn_lighthouse_proc(const mesh::HostMesh& host,
                                                      const std::string& run_name);

}  // namespace monarch::ft::example
