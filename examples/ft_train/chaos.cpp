#include "chaos.hpp"

#include <algorithm>
#include <set>

#include "cli_checks.hpp"
#include "monarch/config/config.hpp"

namespace monarch::ft::example {

void add_chaos_flags(CLI::App& app, ChaosOptions& o) {
  app.add_flag("--chaos", o.on,
               "the faulty run injects a seeded random fault schedule (--seed): two groups at "
               "once, faults during heals and quorums, the lighthouse frozen, overlapping");
  app.add_option("--chaos-faults", o.faults, "faults of a --chaos run (at least 4)")
      ->check(monarch::cli::integer_in(4, 1000));
}

int64_t prepare_chaos(const ChaosOptions& o, int64_t replicas, int64_t freeze_ms,
                      const std::string& lighthouse_addr) {
  if (replicas < 3)
    throw UsageError("--chaos needs --replicas >= 3 (two groups die at once, one must survive)");
  if (!lighthouse_addr.empty())
    throw UsageError(
        "--chaos runs the lighthouse in a process of its own (to freeze it): drop "
        "--lighthouse " +
        lighthouse_addr);
  auto hb = config::global().duration("ft.heartbeat_timeout");
  if (std::chrono::milliseconds(freeze_ms) <= hb) {
    throw UsageError("--chaos freezes the lighthouse for --freeze-ms (" +
                     std::to_string(freeze_ms) + " ms), which must exceed ft.heartbeat_timeout (" +
                     std::to_string(hb.count()) + " ms)");
  }
  return o.faults;
}

const std::vector<FaultKind>& chaos_required_kinds() {
  static const std::vector<FaultKind> k{FaultKind::sigkill_two_at_once,
                                        FaultKind::kill_healer_mid_heal, FaultKind::kill_in_quorum,
                                        FaultKind::lighthouse_freeze};
  return k;
}

const std::vector<FaultKind>& chaos_other_kinds() {
  static const std::vector<FaultKind> k{FaultKind::sigkill, FaultKind::sigstop,
                                        FaultKind::allreduce_throw, FaultKind::kill_donor_mid_heal};
  return k;
}

std::vector<ChaosFault> chaos_plan(uint64_t seed, int64_t faults, int64_t steps) {
  std::mt19937_64 rng(seed * 104729 + 7);
  std::vector<FaultKind> kinds = chaos_required_kinds(), others = chaos_other_kinds();
  std::shuffle(others.begin(), others.end(), rng);
  for (auto k : others) {
    if (static_cast<int64_t>(kinds.size()) < faults) kinds.push_back(k);
  }
  std::vector<FaultKind> all = kinds;
  while (static_cast<int64_t>(kinds.size()) < faults) kinds.push_back(all[rng() % all.size()]);
  std::shuffle(kinds.begin(), kinds.end(), rng);
  // Faults between 10 % and ~70 % of the run on average: long gaps average twice the mean.
  int64_t mean = std::max<int64_t>(4, steps * 6 / 10 / std::max<int64_t>(1, faults));
  std::vector<ChaosFault> plan;
  for (auto k : kinds) {
    int64_t gap = rng() % 2 ? 2 + static_cast<int64_t>(rng() % 14)
                            : mean + static_cast<int64_t>(rng() % static_cast<uint64_t>(mean));
    plan.push_back({k, plan.empty() ? 0 : gap});
  }
  return plan;
}

ScheduledController::ScheduledController(std::vector<mesh::HostMesh> hosts,
                                         ActorRef<Lighthouse> lighthouse,
                                         ReplicaControllerOptions options, ScheduleOptions schedule)
    : ReplicaController(std::move(hosts), std::move(lighthouse), std::move(options)),
      sched_(schedule),
      rng_(sched_.seed * 7919 + 17) {
  int64_t steps = this->options().steps;
  if (sched_.chaos.on) {
    if (sched_.faults > 0) chaos_ = chaos_plan(sched_.seed, sched_.faults, steps);
    due_at_ = std::max<int64_t>(5, steps / 10);
    return;
  }
  // Faults spread over [10%, 60%] of the run, kinds in a fixed rotation from a seeded offset.
  int64_t first = std::max<int64_t>(5, steps / 10), last = steps * 6 / 10;
  int offset = static_cast<int>(rng_() % 4);
  for (int64_t i = 0; i < sched_.faults; ++i)
    plan_.push_back({first + (last - first) * i / std::max<int64_t>(1, sched_.faults),
                     static_cast<FaultKind>((offset + i) % 4)});
}

void ScheduledController::note_left_out(int64_t step, int64_t last, size_t planned) {
  if (cut_short_ || step <= last || next_ >= planned) return;
  cut_short_ = true;
  event("faults: " + std::to_string(next_) + " of " + std::to_string(planned) +
        " planned started; the others found no quiet point (every group back in the quorum, no "
        "fault open) before step " +
        std::to_string(last) + ", the last a fault may start at");
}

void ScheduledController::inject_due(int64_t step) {
  if (sched_.chaos.on) {
    note_left_out(step, options().steps * 85 / 100, chaos_.size());
    return inject_chaos(step);
  }
  note_left_out(step, options().steps * 8 / 10, plan_.size());
  if (next_ < plan_.size() && step >= plan_[next_].first && step <= options().steps * 8 / 10 &&
      quiet())  // one recovery at a time, everyone back in the quorum first
    inject(plan_[next_++].second,
           static_cast<int64_t>(rng_() % static_cast<uint64_t>(options().groups)), sched_.freeze);
}

void ScheduledController::replan_unfired(int64_t step) {
  const auto& all = faults();
  for (; replanned_ < all.size() && !all[replanned_].open(); ++replanned_) {
    const FaultRecord& f = all[replanned_];
    if (!f.at_point() || f.fired || replans_ >= kMaxReplans) continue;
    ++replans_;
    if (next_ >= chaos_.size()) due_at_ = step + 2;
    chaos_.push_back({f.kind, 2});
    event(std::string("chaos: ") + fault_name(f.kind) + " at step " + std::to_string(f.step) +
          " closed without its point firing; planned again");
  }
}

void ScheduledController::inject_chaos(int64_t step) {
  replan_unfired(step);
  if (next_ >= chaos_.size() || step < due_at_ || step > options().steps * 85 / 100) return;
  FaultKind kind = chaos_[next_].kind;
  // Free groups: running and in no open fault (a frozen lighthouse holds them all).
  if (next_ == 0 && step == due_at_) {
    std::string kinds;
    for (const auto& c : chaos_)
      kinds += std::string(" ") + fault_name(c.kind) + "@+" + std::to_string(c.gap);
    event("chaos plan (seed " + std::to_string(sched_.seed) + "):" + kinds);
  }
  std::set<std::string> busy;
  bool frozen = false;
  size_t reserved = 0;  // a donor for each kill_donor_mid_heal whose point has not fired yet
  for (const auto& f : faults()) {
    if (!f.open()) continue;
    reserved += f.kind == FaultKind::kill_donor_mid_heal && !f.donor_killed;
    busy.insert(f.pending_rejoin.begin(), f.pending_rejoin.end());
    busy.insert(f.victims.begin(), f.victims.end());
    frozen = frozen || f.kind == FaultKind::lighthouse_freeze;
  }
  std::vector<int64_t> free;
  for (int64_t r = 0; r < options().groups; ++r) {
    if (running(r) && !busy.count("replica" + std::to_string(r))) free.push_back(r);
  }
  // Victims, plus one group that must stay outside every open fault (a donor also dies for
  // kill_donor_mid_heal). A freeze needs none but no other freeze.
  size_t need =
      kind == FaultKind::sigkill_two_at_once || kind == FaultKind::kill_donor_mid_heal ? 3 : 2;
  if (kind == FaultKind::lighthouse_freeze ? frozen : free.size() < need + reserved)
    return;  // not yet
  std::shuffle(free.begin(), free.end(), rng_);
  switch (kind) {
    case FaultKind::sigkill_two_at_once:
      inject_two(free[0], free[1]);
      break;
    case FaultKind::lighthouse_freeze:
      freeze_lighthouse(sched_.chaos.lighthouse_pid, sched_.freeze);
      break;
    default:
      inject(kind, free[0], sched_.freeze);
  }
  if (++next_ < chaos_.size()) due_at_ = step + chaos_[next_].gap;
}

LighthouseProc::~LighthouseProc() {
  procs.stop();
}

std::unique_ptr<LighthouseProc> spawn_lighthouse_proc(const mesh::HostMesh& host,
                                                      const std::string& run_name) {
  auto procs = host.spawn_procs({{"ranks", 1}}, {.name = "lighthouse-" + run_name});
  LighthouseOptions lo;
  lo.recovery_wait = config::global().duration("ft.heartbeat_timeout");  // as monarch lighthouse
  auto lh = procs.spawn<Lighthouse>(kLighthouseName, lo);
  int pid = procs.pid(0);
  return std::unique_ptr<LighthouseProc>(new LighthouseProc{procs, lh.at(0), pid});
}

}  // namespace monarch::ft::example
