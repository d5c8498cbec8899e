#include "monarch/ft/controller.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>

#include "monarch/config/config.hpp"

namespace monarch::ft {
namespace {

using Clock = std::chrono::steady_clock;
int64_t now_ns() {
  return Clock::now().time_since_epoch().count();
}

// This process's fault points (a replica's procs; the controller arms them through FaultAgent).
struct FaultPoints {
  std::mutex mu;
  std::multiset<std::string> armed;
  std::optional<ActorRef<ReplicaController>> controller;
};
FaultPoints& points() {
  static FaultPoints* p = new FaultPoints;  // never destroyed: read from any thread at exit
  return *p;
}

// "replica<r>" -> r, or -1.
int64_t group_of(const std::string& id, size_t groups) {
  if (id.rfind("replica", 0) != 0 || id.size() == 7) return -1;
  try {
    size_t used = 0;
    int64_t r = std::stoll(id.substr(7), &used);
    if (used != id.size() - 7 || r < 0 || static_cast<size_t>(r) >= groups) return -1;
    return r;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

void arm_fault(const std::string& point) {
  if (point != kFaultAllreduceEnter && point != kFaultHealAfterFirstChunk &&
      point != kFaultQuorumAfterRequest) {
    throw UsageError("arm_fault: unknown fault point '" + point + "'; expected " +
                     kFaultAllreduceEnter + ", " + kFaultHealAfterFirstChunk + " or " +
                     kFaultQuorumAfterRequest);
  }
  std::lock_guard lock(points().mu);
  points().armed.insert(point);
}

bool take_fault(std::string_view point) {
  auto& p = points();
  std::lock_guard lock(p.mu);
  auto it = p.armed.find(std::string(point));
  if (it == p.armed.end()) return false;
  p.armed.erase(it);
  return true;
}

bool fault_armed(std::string_view point) {
  auto& p = points();
  std::lock_guard lock(p.mu);
  return p.armed.count(std::string(point)) > 0;
}

void fault_point_kill_donor(const std::string& healer, const std::string& donor) {
  if (!take_fault(kFaultHealAfterFirstChunk)) return;
  std::optional<ActorRef<ReplicaController>> c;
  {
    std::lock_guard lock(points().mu);
    c = points().controller;
  }
  if (!c) return;
  c->call(&ReplicaController::kill_donor, healer, donor, static_cast<int64_t>(::getpid()))
      .get(std::chrono::seconds(10));
}

void fault_point_quorum_request(const ActorRef<Lighthouse>& lighthouse,
                                const std::string& replica_id, int64_t step) {
  if (!take_fault(kFaultQuorumAfterRequest)) return;
  std::optional<ActorRef<ReplicaController>> c;
  {
    std::lock_guard lock(points().mu);
    c = points().controller;
  }
  if (!c) return;
  // Off the Manager's thread: the status call queues behind the request on the same link, so a
  // pending entry for this step means the lighthouse holds the request and formed no quorum yet.
  std::thread([lighthouse, c = *c, replica_id, step] {
    bool pending = false;
    int64_t pending_groups = 0;
    try {
      LighthouseStatus st = lighthouse.call(&Lighthouse::status).get(std::chrono::seconds(2));
      pending_groups = static_cast<int64_t>(st.pending.size());
      for (const auto& r : st.replicas)
        pending = pending || (r.replica_id == replica_id && r.pending && r.step == step);
    } catch (const std::exception&) {
      // a frozen or stopped lighthouse: not known to be pending, try the next request
    }
    if (!pending) {
      arm_fault(kFaultQuorumAfterRequest);
      return;
    }
    try {
      (void)c
          .call(&ReplicaController::kill_in_quorum, replica_id, static_cast<int64_t>(::getpid()),
                "its request for step " + std::to_string(step) +
                    " pending at the lighthouse with " + std::to_string(pending_groups) +
                    " pending request(s)")
          .get(std::chrono::seconds(10));
    } catch (const std::exception&) {
      // the controller is gone (the run ended)
    }
  }).detach();
}

FaultAgent::FaultAgent(ActorRef<ReplicaController> controller) {
  std::lock_guard lock(points().mu);
  points().controller = std::move(controller);
}

const char* fault_name(FaultKind k) {
  switch (k) {
    case FaultKind::sigkill:
      return "sigkill";
    case FaultKind::sigstop:
      return "sigstop";
    case FaultKind::allreduce_throw:
      return "allreduce_exception";
    case FaultKind::kill_donor_mid_heal:
      return "kill_donor_mid_heal";
    case FaultKind::outside:
      return "outside";
    case FaultKind::sigkill_two_at_once:
      return "sigkill_two_at_once";
    case FaultKind::kill_healer_mid_heal:
      return "kill_healer_mid_heal";
    case FaultKind::kill_in_quorum:
      return "kill_in_quorum";
    case FaultKind::lighthouse_freeze:
      return "lighthouse_freeze";
  }
  return "?";
}

nlohmann::json FaultRecord::to_json(int64_t t0) const {
  auto rel = [&](int64_t t) {
    return t ? nlohmann::json(static_cast<double>(t - t0) / 1e9) : nlohmann::json(nullptr);
  };
  return {
      {"fault", fault_name(kind)},
      {"step", step},
      {"victims", victims},
      {"note", note},
      {"injected_s", rel(injected)},
      {"detected_s", rel(detected)},
      {"new_quorum_s", rel(new_quorum)},
      {"survivors_resumed_s", rel(survivors_resumed)},
      {"procs_up_s", rel(procs_up)},
      {"trainers_ready_s", rel(trainers_ready)},
      {"respawned_s", rel(respawned)},
      {"healed_s", rel(healed)},
      {"rejoined_s", rel(rejoined)},
      {"recovery_s", rejoined ? nlohmann::json(static_cast<double>(rejoined - injected) / 1e9)
                              : nlohmann::json(nullptr)},
      {"fired", at_point() ? nlohmann::json(fired) : nlohmann::json(nullptr)},
      {"unrecovered", unrecovered.empty() ? nlohmann::json(nullptr) : nlohmann::json(unrecovered)}};
}

nlohmann::json StepInfo::to_json(int64_t step, int64_t t0, const std::string& run,
                                 const std::string& metric_name) const {
  nlohmann::json j{{"run", run},
                   {"step", step},
                   {"participants", participants},
                   {"healing", healing},
                   {"quorum_id", quorum_id},
                   {"t_s", static_cast<double>(t_ns - t0) / 1e9}};
  if (loss_n) j["loss"] = loss();
  if (metric >= 0) j[metric_name] = metric;
  return j;
}

double memcpy_gbps(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);  // fault the pages in
  int reps = 50;
  auto t = Clock::now();
  for (int i = 0; i < reps; ++i) {
    a[static_cast<size_t>(i)] = static_cast<char>(i);
    std::memcpy(b.data(), a.data(), bytes);
  }
  double s = std::chrono::duration<double>(Clock::now() - t).count();
  return b[7] == 7 ? static_cast<double>(bytes) * reps / s / 1e9 : 0;
}

double memcpy_cold_gbps(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  const size_t evict_bytes = std::min<size_t>(
      std::max<size_t>(2 * static_cast<size_t>(std::max(llc, 0L)), 64u << 20), 512u << 20);
  std::vector<char> a(bytes, 1), b(bytes, 0), evict(evict_bytes, 1);
  std::vector<double> gbps;
  for (int i = 0; i < 9; ++i) {
    // Reads (not writes) evict: the lines left behind are clean, so the copy pays no write-backs
    // of the eviction buffer.
    unsigned sum = 0;
    for (size_t k = 0; k < evict.size(); k += 64) sum += static_cast<unsigned char>(evict[k]);
    a[static_cast<size_t>(i)] = static_cast<char>(sum + static_cast<unsigned>(i));
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    double s = std::chrono::duration<double>(Clock::now() - t).count();
    if (b[static_cast<size_t>(i)] != a[static_cast<size_t>(i)]) return 0;
    gbps.push_back(static_cast<double>(bytes) / std::max(s, 1e-9) / 1e9);
  }
  return percentile(std::move(gbps), 0.5);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  auto lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// ---------------------------------------------------------------------------------------------

ReplicaController::ReplicaController(std::vector<mesh::HostMesh> hosts,
                                     ActorRef<Lighthouse> lighthouse,
                                     ReplicaControllerOptions options)
    : hosts_(std::move(hosts)), lighthouse_(std::move(lighthouse)), opts_(std::move(options)) {
  if (hosts_.empty()) throw UsageError("ReplicaController: no hosts");
  if (opts_.groups < 1 || opts_.ranks < 1) {
    throw UsageError("ReplicaController: groups (" + std::to_string(opts_.groups) +
                     ") and ranks (" + std::to_string(opts_.ranks) + ") must be >= 1");
  }
  if (opts_.spares < 0)
    throw UsageError("ReplicaController: spares (" + std::to_string(opts_.spares) +
                     ") must be >= 0");
  groups_.resize(static_cast<size_t>(opts_.groups));
  // this run's name on the lighthouse, unique per run (a lighthouse outlives runs).
  std::random_device rd;
  job_ = fmt::format("{}-{:08x}{:08x}", opts_.run_name, rd(), rd());
  if (!opts_.metrics_path.empty()) {
    metrics_.open(opts_.metrics_path, std::ios::trunc);
    if (!metrics_) throw UsageError("ReplicaController: cannot write " + opts_.metrics_path);
  }
}

ReplicaController::~ReplicaController() {
  watchdog_.stop();
  for (auto& t : helpers_) {
    if (t.joinable()) t.join();
  }
}

const mesh::HostMesh& ReplicaController::host_for(int64_t group) {
  return hosts_[static_cast<size_t>(group) % hosts_.size()];
}

const mesh::HostMesh& ReplicaController::host_for_spare(int64_t k) {
  return host_for(k % opts_.groups);
}

GroupInfo ReplicaController::info(int64_t r) const {
  const auto& g = groups_[static_cast<size_t>(r)];
  return {r, replica_id(r), g.incarnation, g.incarnation > 0, g.unit.mesh, false};
}

std::string ReplicaController::stamp(int64_t t_ns) const {
  char b[32];
  std::snprintf(b, sizeof b, "[%7.2fs]", static_cast<double>(t_ns - t0_) / 1e9);
  return std::string(b) + " " + opts_.run_name + ": ";
}

void ReplicaController::event(const std::string& what) {
  on_event(stamp(now_ns()) + what);
}

Future<void> ReplicaController::spawn_all() {
  t0_ = now_ns();
  struct Pending {
    std::mutex mu;
    int64_t left;
    bool failed = false;
    Promise<void> all;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = opts_.groups + opts_.spares;
  auto f = pending->all.get_future();
  // Completes on the thread that readied (or failed) each group or spare. A group whose procs or
  // trainers fail before they are up fails spawn_all naming it (its future's own error, e.g.
  // "promise dropped", names neither the group nor the mesh).
  auto one = [pending](std::string what) {
    return [pending, what = std::move(what)](monarch::detail::State<void>& s) {
      std::unique_lock lock(pending->mu);
      if (pending->failed) return;
      if (s.error) {
        pending->failed = true;
        lock.unlock();
        pending->all.set_error(std::make_exception_ptr(
            Error("spawn_all: " + what +
                  " did not start: " + monarch::detail::describe_exception(s.error) +
                  " (a failure before training starts is not healed; see the supervise "
                  "events)")));
        return;
      }
      if (--pending->left == 0) {
        lock.unlock();
        pending->all.set_value();
      }
    };
  };
  for (int64_t r = 0; r < opts_.groups; ++r) {
    spawn_group(r, false).on_complete(
        one(replica_id(r) + " (mesh " + replica_id(r) + "-" +
            std::to_string(groups_[static_cast<size_t>(r)].incarnation) + ")"));
  }
  for (int64_t k = 0; k < opts_.spares; ++k)
    spawn_spare().on_complete(one("spare" + std::to_string(next_spare_ - 1)));
  return f;
}

void ReplicaController::start_all() {
  // The first quorum should have every group: wait until the lighthouse has heard from all.
  auto timeout = config::global().duration("mesh.spawn_timeout");
  auto deadline = Clock::now() + timeout;
  while (lighthouse_.call(&Lighthouse::healthy).get(timeout).size() <
         static_cast<size_t>(opts_.groups)) {
    if (Clock::now() > deadline) {
      throw std::runtime_error("the replica groups did not heartbeat the lighthouse within " +
                               std::to_string(timeout.count()) + " ms (mesh.spawn_timeout)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling the lighthouse's view
  }
  started_ = now_ns();
  for (int64_t r = 0; r < opts_.groups; ++r) start_group(r);
  progress_timeout_ = opts_.progress_timeout.count() != 0
                          ? opts_.progress_timeout
                          : config::global().duration("ft.progress_timeout");
  if (progress_timeout_.count() > 0) {
    progress_since_ns_ = last_check_ns_ = started_;
    progress_period_ = std::clamp(progress_timeout_ / 10, std::chrono::milliseconds(10),
                                  std::chrono::milliseconds(1000));
    // call(), not send(): a check that reaches a stopped controller just fails its future.
    watchdog_.start(progress_period_, [self = self<ReplicaController>()] {
      (void)self.call(&ReplicaController::check_progress);
    });
  }
}

void ReplicaController::check_progress() {
  if (finished_ || progress_timeout_.count() <= 0) return;
  const int64_t now = now_ns();
  const auto period_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(progress_period_).count();
  // Checks come every period. A much longer gap means this process was stopped or starved (the
  // groups may have been waiting on it, not the other way round): that time does not count.
  if (now - last_check_ns_ > 4 * period_ns + 1'000'000'000)
    progress_since_ns_ += now - last_check_ns_;
  last_check_ns_ = now;
  const int64_t since = std::max(progress_since_ns_, last_commit_ns_);
  if (now - since < std::chrono::duration_cast<std::chrono::nanoseconds>(progress_timeout_).count())
    return;
  std::string why;
  try {
    auto st = lighthouse_.call(&Lighthouse::status).get(std::chrono::seconds(2));
    why = "; the lighthouse is waiting for: " +
          (st.waiting_for.empty() ? "nothing (no request pending)" : st.waiting_for);
  } catch (const std::exception& e) {
    why = "; the lighthouse " + lighthouse_.id().to_string() +
          " did not answer a status call within 2 s (is it running?): " + e.what();
  }
  fail_run("no replica group committed a step for " +
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::nanoseconds(now - since))
                              .count()) +
           " s (ft.progress_timeout " + std::to_string(progress_timeout_.count()) +
           " ms; the last committed step is " + std::to_string(max_committed_) + ")" + why);
}

Future<RunStats> ReplicaController::done() {
  Promise<RunStats> p;
  auto f = p.get_future();
  if (finished_) {
    p.set_value(stats_);
  } else {
    done_ = std::move(p);
  }
  return f;
}

void ReplicaController::finish_now() {
  if (finished_) return;
  fail_run(std::to_string(finals_.size()) + " of " + std::to_string(opts_.groups) +
           " replica groups finished before the deadline");
}

void ReplicaController::fail_run(std::string why) {
  stats_.error = std::move(why);
  event(stats_.error);
  finish(false);
}

void ReplicaController::shutdown() {
  for (auto& g : groups_) {
    if (g.unit.procs) g.unit.procs->stop();
  }
  for (auto& s : spares_) {
    if (s.procs) s.procs->stop();
  }
  for (auto& t : helpers_) t.join();
  helpers_.clear();
}

// One mesh of `ranks` procs named `name` on `host`, with a FaultAgent per proc (spawn_procs blocks
// until the procs run; the trainers' init happens in spawn_trainers' future).
ReplicaController::Unit ReplicaController::spawn_unit(const mesh::HostMesh& host,
                                                      const std::string& name) {
  Unit u;
  u.mesh = name;
  u.procs = host.spawn_procs({{"ranks", static_cast<size_t>(opts_.ranks)}},
                             {.name = name, .fork_server = opts_.fork_server});
  u.agents = u.procs->spawn<FaultAgent>("ft.faults", self<ReplicaController>());
  return u;
}

// Spawns group r on fresh procs. The returned future completes once its trainers are ready and
// its Manager runs; a respawn starts them then (then() runs in this actor, so the controller keeps
// handling reports and failures meanwhile).
Future<void> ReplicaController::spawn_group(int64_t r, bool respawned) {
  auto& g = groups_[static_cast<size_t>(r)];
  g.incarnation += 1;
  g.up = false;
  g.failed = false;
  g.manager.reset();
  std::string name = replica_id(r) + "-" + std::to_string(g.incarnation);
  meshes_[name] = {r, g.incarnation};
  try {
    g.unit = spawn_unit(host_for(r), name);
  } catch (const std::exception& e) {
    if (!respawned || !replace_host(r, e.what())) throw;
    event(replica_id(r) + ": cannot spawn on its host (" + e.what() + "); trying a fresh host");
    g.unit = spawn_unit(host_for(r), name);
  }
  if (respawned) mark_victims(r, &FaultRecord::procs_up);
  GroupInfo gi;
  gi.mesh = name;
  auto ready = spawn_trainers(gi, *g.unit.procs);
  if (respawned) ++stats_.respawns;
  return ready.then([this, r, inc = g.incarnation, respawned, name] {
    auto& grp = groups_[static_cast<size_t>(r)];
    if (grp.incarnation != inc || finished_) return;  // replaced again meanwhile, or the run ended
    grp.unit.ready = true;
    if (respawned) mark_victims(r, &FaultRecord::trainers_ready);
    attach(r);
    if (respawned) start_replacement(r, "respawned " + replica_id(r) + " as mesh " + name);
  });
}

// A spare: procs, agents and initialised trainers, no Manager. Throws what spawn_procs throws.
Future<void> ReplicaController::spawn_spare() {
  std::string name = "spare" + std::to_string(next_spare_);
  Unit u = spawn_unit(host_for_spare(next_spare_++), name);
  meshes_[name] = {};
  GroupInfo gi;
  gi.mesh = name;
  gi.spare = true;
  auto ready = spawn_trainers(gi, *u.procs);
  spares_.push_back(std::move(u));
  return ready.then([this, name] {
    for (auto& s : spares_) {
      if (s.mesh != name) continue;
      s.ready = true;
      spare_failures_in_a_row_ = 0;
      if (started_) event("spare " + name + " ready");
    }
  });
}

void ReplicaController::refill_spares() {
  if (finished_ || static_cast<int64_t>(spares_.size()) >= opts_.spares) return;
  if (spare_failures_in_a_row_ >= 3) {
    event("spares: " + std::to_string(spare_failures_in_a_row_) +
          " failed in a row; not spawning more (failed groups respawn on fresh procs)");
    return;
  }
  try {
    (void)spawn_spare();
  } catch (const std::exception& e) {
    ++stats_.spare_failures;
    ++spare_failures_in_a_row_;
    event(std::string("spare did not start: ") + e.what());
  }
  // One spawn per message: the controller handles reports and failures in between.
  if (static_cast<int64_t>(spares_.size()) < opts_.spares)
    self<ReplicaController>().send(&ReplicaController::refill_spares);
}

// Group r's replacement `spare` (ready) becomes its next incarnation. The new spare is spawned
// once the fault closed (report()): spawn_procs blocks this actor for a process start, which would
// otherwise delay the promoted group's start, and its CPU would compete with the heal.
void ReplicaController::promote(int64_t r, Unit spare) {
  auto& g = groups_[static_cast<size_t>(r)];
  g.incarnation += 1;
  g.up = false;
  g.failed = false;
  g.unit = std::move(spare);
  meshes_[g.unit.mesh] = {r, g.incarnation};
  ++stats_.respawns;
  ++stats_.spares_promoted;
  attach(r);
  start_replacement(r, "promoted " + g.unit.mesh + " to " + replica_id(r) + " (incarnation " +
                           std::to_string(g.incarnation) + ")");
  if (!open_fault()) self<ReplicaController>().send(&ReplicaController::refill_spares);
}

// Group r's Manager on its mesh's rank 0: it starts heartbeating the lighthouse.
void ReplicaController::attach(int64_t r) {
  auto& g = groups_[static_cast<size_t>(r)];
  g.manager = g.unit.procs->slice("ranks", 0)
                  .spawn<Manager>("manager", lighthouse_, replica_id(r), opts_.ranks,
                                  std::chrono::milliseconds(0), job_)
                  .at(0);
  if (std::exchange(g.arm_kill_donor, false)) {
    for (size_t i = 0; i < g.unit.agents->size(); ++i)
      g.unit.agents->at(i).send(&FaultAgent::arm, std::string(kFaultHealAfterFirstChunk));
  }
  // A kill_in_quorum armed in a process that died of something else first (another fault made it
  // a donor and killed it, say) is armed again in its replacement: else it never fires, and the
  // run ends with it open.
  for (const auto& f : faults_) {
    if (f.open() && f.armed_only() && f.victims.count(replica_id(r))) {
      g.unit.agents->at(0).send(&FaultAgent::arm, std::string(kFaultQuorumAfterRequest));
      break;
    }
  }
}

// Starts a replacement once its Manager answers (so no rank asks it for a quorum before it runs).
void ReplicaController::start_replacement(int64_t r, const std::string& how) {
  auto& g = groups_[static_cast<size_t>(r)];
  (void)g.manager->call(&Manager::resend).then([this, r, inc = g.incarnation, how] {
    if (groups_[static_cast<size_t>(r)].incarnation != inc || finished_) return;
    start_group(r);
    mark_victims(r, &FaultRecord::respawned);
    event(how + " (ready)");
  });
}

void ReplicaController::mark_victims(int64_t r, int64_t FaultRecord::*when) {
  int64_t t = now_ns();
  for (auto& f : faults_) {
    if (f.open() && f.victims.count(replica_id(r)) && !(f.*when)) f.*when = t;
  }
}

void ReplicaController::start_group(int64_t r) {
  auto& g = groups_[static_cast<size_t>(r)];
  start_trainers(info(r), *g.manager);
  g.up = true;
}

int64_t ReplicaController::spares_ready() const {
  return std::count_if(spares_.begin(), spares_.end(), [](const Unit& u) { return u.ready; });
}

bool ReplicaController::running(int64_t group) const {
  if (group < 0 || group >= opts_.groups) return false;
  const auto& g = groups_[static_cast<size_t>(group)];
  return g.unit.procs && g.up && !g.failed;
}

bool ReplicaController::quiet() const {
  for (const auto& g : groups_) {
    if (!g.up) return false;
  }
  for (const auto& f : faults_) {
    if (f.open()) return false;
  }
  auto it = steps_.find(max_committed_);
  return it != steps_.end() && it->second.participants >= opts_.groups;
}

FaultRecord* ReplicaController::open_fault() {
  for (auto& f : faults_) {
    if (f.open() && !f.armed_only()) return &f;
  }
  return nullptr;
}

bool ReplicaController::is_victim_at(const std::string& id, int64_t from, int64_t to) const {
  for (const auto& f : faults_) {
    // A frozen lighthouse holds every group up: none of them is a survivor then.
    bool hit = f.victims.count(id) || f.kind == FaultKind::lighthouse_freeze;
    if (hit && f.injected > from && f.injected <= to) return true;
    if (hit && f.open() && f.injected <= from) return true;
  }
  return false;
}

// Survivor stalls: time between two steps of progress (commit, heal, finish) of the same group
// incarnation and rank, unless the group was itself hit by a fault in between.
void ReplicaController::note_progress(const StepReport& r) {
  std::string key =
      r.replica_id + "/" + std::to_string(r.incarnation) + "/" + std::to_string(r.rank);
  if (auto it = last_progress_at_.find(key); it != last_progress_at_.end()) {
    if (!is_victim_at(r.replica_id, it->second, r.t_ns)) {
      double gap = static_cast<double>(r.t_ns - it->second) / 1e9;
      if (gap > stats_.max_survivor_stall_s) {
        stats_.max_survivor_stall_s = gap;
        stats_.max_stall_where = r.replica_id + " before step " + std::to_string(r.step);
      }
    }
  }
  last_progress_at_[key] = r.t_ns;
}

void ReplicaController::flush_steps(int64_t before) {
  for (auto it = steps_.upper_bound(flushed_upto_); it != steps_.end() && it->first < before;
       ++it) {
    if (metrics_.is_open()) {
      metrics_ << it->second.to_json(it->first, t0_, opts_.run_name, opts_.metric_name).dump()
               << "\n"
               << std::flush;
    }
    on_step(it->first, it->second);
    flushed_upto_ = it->first;
  }
}

void ReplicaController::report(std::vector<StepReport> reports) {
  for (auto& r : reports) take_report(std::move(r));
}

void ReplicaController::take_report(StepReport r) {
  int64_t gi = group_of(r.replica_id, groups_.size());
  if (gi < 0 || r.incarnation != groups_[static_cast<size_t>(gi)].incarnation || finished_)
    return;  // from a replaced group, or late
  auto& g = groups_[static_cast<size_t>(gi)];
  if (r.fatal) {
    return fail_run(r.replica_id + " rank " + std::to_string(r.rank) + ": " + r.error +
                    " (a program error, not a fault: no retry or respawn can fix it)");
  }
  if (!r.error.empty()) {
    // A failed step during a recovery is expected; show each group's first error per quorum.
    if (auto* f = open_fault(); f && !f->detected) f->detected = r.t_ns;
    if (errors_seen_.insert(r.replica_id + "/" + std::to_string(r.quorum_id)).second) {
      event(r.replica_id + " step " + std::to_string(r.step + 1) + " not committed (quorum " +
            std::to_string(r.quorum_id) + "): " + r.error);
    }
  }
  if (r.quorum_id > last_qid_ && r.rank == 0) {
    for (auto& f : faults_) {
      if (f.open() && !f.armed_only() && !f.new_quorum && r.quorum_id > f.quorum_id) {
        f.new_quorum = r.t_ns;
        if (!f.detected) f.detected = r.t_ns;
      }
    }
    if (last_qid_ != 0) {
      event("quorum " + std::to_string(r.quorum_id) + ": " + std::to_string(r.participants) +
            " participant(s), " + std::to_string(r.healing) + " healing");
    }
    last_qid_ = r.quorum_id;
  }
  if (r.healed) {
    heal_bytes_ += static_cast<double>(r.heal_bytes);
    heal_secs_ += r.heal_ms / 1e3;
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.2f", r.heal_ms);
    event(r.replica_id + " healed from " + r.donor + " at step " + std::to_string(r.step) + " (" +
          std::to_string(r.heal_bytes >> 10) + " KiB in " + ms + " ms)");
    for (auto& f : faults_) {
      if (f.open() && f.victims.count(r.replica_id) && !f.healed) f.healed = r.t_ns;
    }
  }
  if (r.healed) note_progress(r);  // not final: its full evaluation is no stall
  if (r.final) {
    // A victim that caught up by healing to the last step (the others hold there) is back too.
    for (auto& f : faults_) {
      if (f.open() && !f.armed_only() &&
          r.t_ns > (f.kind == FaultKind::lighthouse_freeze ? f.thawed : f.injected))
        rejoin(f, r.replica_id, r.t_ns);
    }
    finals_[r.replica_id] = {r.hash, r.metric};
    stats_.state_bytes = r.state_bytes;
    if (static_cast<int64_t>(finals_.size()) >= opts_.groups) finish(true);
    return;
  }
  if (!r.committed) return;

  // Bitwise equality: every rank that committed step s holds the same state.
  auto& s = steps_[r.step];
  if (s.reports == 0) {
    s.participants = r.participants;
    s.healing = r.healing;
    s.quorum_id = r.quorum_id;
    s.t_ns = r.t_ns;
  }
  if (r.hashed && !s.hashed) {
    s.hash = r.hash;
    s.hashed = true;
  } else if (r.hashed && s.hash != r.hash) {
    ++stats_.hash_mismatches;
    event("MISMATCH: " + r.replica_id + " committed step " + std::to_string(r.step) +
          " with a different state");
  }
  ++s.reports;
  if (r.loss >= 0) s.loss_sum += r.loss, ++s.loss_n;
  if (r.metric >= 0) s.metric = r.metric;
  if (!first_commit_ns_) first_commit_ns_ = r.t_ns;
  last_commit_ns_ = std::max(last_commit_ns_, r.t_ns);
  note_progress(r);

  for (auto& f : faults_) {
    if (!f.open() || f.armed_only()) continue;
    // After a lighthouse freeze the fast path may keep the quorum id: a commit after the thaw.
    bool back = f.kind == FaultKind::lighthouse_freeze
                    ? r.t_ns > f.thawed
                    : r.t_ns > f.injected && r.quorum_id > f.quorum_id;
    if (!f.victims.count(r.replica_id) && !f.survivors_resumed && back)
      f.survivors_resumed = r.t_ns;
    if (back) rejoin(f, r.replica_id, r.t_ns);
  }
  g.failures_in_a_row = 0;
  if (r.step > max_committed_) {
    max_committed_ = r.step;
    flush_steps(max_committed_ - 1);
    on_commit(r.step, s);
  }
}

void ReplicaController::rejoin(FaultRecord& f, const std::string& id, int64_t t) {
  if (!f.pending_rejoin.erase(id) || f.open()) return;
  f.rejoined = t;
  stats_.recovery_s.push_back(static_cast<double>(f.rejoined - f.injected) / 1e9);
  char s3[32];
  std::snprintf(s3, sizeof s3, "%.3f", stats_.recovery_s.back());
  event(std::string("recovered from ") + fault_name(f.kind) + " in " + s3 + " s");
  if (metrics_.is_open()) metrics_ << f.to_json(t0_).dump() << "\n" << std::flush;
  on_fault(f);
  if (static_cast<int64_t>(spares_.size()) < opts_.spares)
    self<ReplicaController>().send(&ReplicaController::refill_spares);
}

void ReplicaController::inject(FaultKind kind, int64_t group, std::chrono::milliseconds freeze) {
  if (group < 0 || group >= opts_.groups)
    throw UsageError("inject: no replica group " + std::to_string(group));
  auto& g = groups_[static_cast<size_t>(group)];
  if (!g.unit.procs || !g.up) throw UsageError("inject: " + replica_id(group) + " is not running");
  FaultRecord f;
  f.kind = kind;
  f.step = max_committed_;
  f.quorum_id = last_qid_;
  f.injected = now_ns();
  std::string id = replica_id(group);
  f.victims.insert(id);
  f.pending_rejoin.insert(id);
  int pid = g.unit.procs->pid(0);
  switch (kind) {
    case FaultKind::sigkill:
      ::kill(pid, SIGKILL);
      f.note = "SIGKILL to " + id + " (pid " + std::to_string(pid) + ")";
      break;
    case FaultKind::sigstop:
      ::kill(pid, SIGSTOP);
      f.note = "SIGSTOP to " + id + " for " + std::to_string(freeze.count()) + " ms, then SIGCONT";
      helpers_.emplace_back([pid, freeze] {
        std::this_thread::sleep_for(freeze);  // the fault itself: a frozen process
        ::kill(pid, SIGCONT);
      });
      break;
    case FaultKind::allreduce_throw:
      g.unit.agents->at(0).send(&FaultAgent::arm, std::string(kFaultAllreduceEnter));
      f.note = "exception inside the allreduce on " + id;
      break;
    case FaultKind::kill_donor_mid_heal:
      // The replacement heals; its heal.after_first_chunk point kills the donor.
      ::kill(pid, SIGKILL);
      g.arm_kill_donor = true;
      f.note = "SIGKILL to " + id + ", then its donor is killed in the middle of the heal";
      break;
    case FaultKind::kill_healer_mid_heal:
      // The replacement heals; its heal.after_first_chunk point kills the replacement itself.
      ::kill(pid, SIGKILL);
      g.arm_kill_donor = true;
      f.note = "SIGKILL to " + id + ", then its replacement is killed in the middle of its heal";
      break;
    case FaultKind::kill_in_quorum:
      // The kill comes from the point (kill_in_quorum), once the request is pending.
      g.unit.agents->at(0).send(&FaultAgent::arm, std::string(kFaultQuorumAfterRequest));
      f.note = "quorum.after_request armed in " + id;
      break;
    case FaultKind::outside:
      throw UsageError("inject: 'outside' faults are the ones the job did not inject");
    case FaultKind::sigkill_two_at_once:
    case FaultKind::lighthouse_freeze:
      throw UsageError(std::string("inject: ") + fault_name(kind) +
                       " has its own call (inject_two, freeze_lighthouse)");
  }
  if (kind != FaultKind::kill_in_quorum) stats_.faults_injected += 1;  // that one: when it fires
  event("FAULT " + std::string(fault_name(kind)) + ": " + f.note);
  faults_.push_back(std::move(f));
}

bool ReplicaController::kill_donor(std::string healer, std::string donor, int64_t pid) {
  int64_t di = group_of(donor, groups_.size()), hi = group_of(healer, groups_.size());
  if (di < 0 || hi < 0) return false;
  {
    // The heal that asks may be an earlier incarnation's, its process replaced since: the
    // request would kill the new healer, or a donor for a heal that is gone.
    const auto& h = groups_[static_cast<size_t>(hi)];
    bool current = false;
    for (size_t i = 0; h.unit.procs && i < h.unit.procs->size(); ++i)
      current = current || h.unit.procs->pid(i) == pid;
    if (!current) {
      event("kill_donor of " + donor + " from healer " + healer + " (pid " + std::to_string(pid) +
            ") ignored: the group no longer runs in that process");
      return false;
    }
  }
  FaultRecord* rec = nullptr;
  for (auto& f : faults_) {
    if (f.open() && !f.donor_killed && f.victims.count(healer) &&
        (f.kind == FaultKind::kill_donor_mid_heal || f.kind == FaultKind::kill_healer_mid_heal))
      rec = &f;
  }
  if (!rec) return false;  // fired once already
  rec->donor_killed = true;
  if (rec->kind == FaultKind::kill_healer_mid_heal) {
    auto& h = groups_[static_cast<size_t>(hi)];
    if (!h.unit.procs || h.failed) return false;
    ::kill(h.unit.procs->pid(0), SIGKILL);
    rec->fired = true;
    rec->failed.erase(healer);    // its second failure is this fault's too
    stats_.faults_injected += 1;  // one more group failed
    rec->note += "; the replacement was killed after reading 1 chunk from " + donor;
    event("FAULT kill_healer_mid_heal: SIGKILL to healer " + healer + " while it reads " + donor);
    return true;
  }
  auto& g = groups_[static_cast<size_t>(di)];
  if (!g.unit.procs || !g.up || g.failed) return false;  // not running now
  // Never kill the last up-to-date group outside every open group fault: its state is the job's
  // (a frozen lighthouse leaves every group's state intact).
  int64_t others = 0;
  for (int64_t r = 0; r < opts_.groups; ++r) {
    bool busy = false;
    for (const auto& f : faults_) {
      busy = busy || (f.open() && f.kind != FaultKind::lighthouse_freeze &&
                      f.pending_rejoin.count(replica_id(r)));
    }
    if (r != di && running(r) && !busy) ++others;
  }
  if (others == 0) {
    rec->note += "; donor " + donor + " spared: the last up-to-date group";
    event("kill_donor_mid_heal: donor " + donor + " spared (the last up-to-date group)");
    return false;
  }
  ::kill(g.unit.procs->pid(0), SIGKILL);
  rec->fired = true;
  rec->victims.insert(donor);
  rec->pending_rejoin.insert(donor);
  stats_.faults_injected += 1;
  event("FAULT kill_donor_mid_heal: SIGKILL to donor " + donor + " while " + healer +
        " reads its state");
  return true;
}

bool ReplicaController::kill_in_quorum(std::string id, int64_t pid, std::string detail) {
  int64_t r = group_of(id, groups_.size());
  if (r < 0) return false;
  FaultRecord* rec = nullptr;
  for (auto& f : faults_) {
    if (f.open() && !f.fired && f.kind == FaultKind::kill_in_quorum && f.victims.count(id))
      rec = &f;
  }
  auto& g = groups_[static_cast<size_t>(r)];
  if (!rec || !g.unit.procs || g.failed) return false;
  const int now = g.unit.procs->pid(0);
  if (pid != now) {
    // The point's helper thread asks up to 2 s after the request: its process may be gone and
    // the group respawned since. The fault stays armed in the new process (attach()).
    event("kill_in_quorum of " + id + " from pid " + std::to_string(pid) +
          " ignored: the group runs in pid " + std::to_string(now) + " now");
    return false;
  }
  ::kill(now, SIGKILL);
  rec->fired = true;
  stats_.faults_injected += 1;
  rec->injected = now_ns();  // the recovery starts at the kill, not at the arming
  rec->step = max_committed_;
  rec->quorum_id = last_qid_;
  rec->note = "SIGKILL to " + id + " with " + detail;
  event("FAULT kill_in_quorum: " + rec->note);
  return true;
}

void ReplicaController::inject_two(int64_t a, int64_t b) {
  if (a == b) throw UsageError("inject_two: the same group twice (" + std::to_string(a) + ")");
  for (int64_t r : {a, b}) {
    if (!running(r)) throw UsageError("inject_two: " + replica_id(r) + " is not running");
  }
  FaultRecord f;
  f.kind = FaultKind::sigkill_two_at_once;
  f.step = max_committed_;
  f.quorum_id = last_qid_;
  f.injected = now_ns();
  std::vector<int> pids;
  for (int64_t r : {a, b}) pids.push_back(groups_[static_cast<size_t>(r)].unit.procs->pid(0));
  for (int pid : pids) ::kill(pid, SIGKILL);  // back to back: the same instant for the groups
  for (int64_t r : {a, b}) {
    f.victims.insert(replica_id(r));
    f.pending_rejoin.insert(replica_id(r));
  }
  f.note = "SIGKILL to " + replica_id(a) + " (pid " + std::to_string(pids[0]) + ") and " +
           replica_id(b) + " (pid " + std::to_string(pids[1]) + ") at once";
  stats_.faults_injected += 2;  // two groups failed
  event("FAULT sigkill_two_at_once: " + f.note);
  faults_.push_back(std::move(f));
}

void ReplicaController::freeze_lighthouse(int pid, std::chrono::milliseconds freeze) {
  if (pid <= 0)
    throw UsageError("freeze_lighthouse: no lighthouse process (pid " + std::to_string(pid) + ")");
  FaultRecord f;
  f.kind = FaultKind::lighthouse_freeze;
  f.step = max_committed_;
  f.quorum_id = last_qid_;
  f.injected = now_ns();
  f.thawed = f.injected + std::chrono::nanoseconds(freeze).count();
  f.victims.insert("lighthouse");
  for (int64_t r = 0; r < opts_.groups; ++r) f.pending_rejoin.insert(replica_id(r));
  if (::kill(pid, SIGSTOP) != 0)
    throw Error("freeze_lighthouse: SIGSTOP to pid " + std::to_string(pid) + ": " +
                std::strerror(errno));
  helpers_.emplace_back([pid, freeze] {
    std::this_thread::sleep_for(freeze);  // the fault itself: a frozen lighthouse
    ::kill(pid, SIGCONT);
  });
  f.note = "SIGSTOP to the lighthouse (pid " + std::to_string(pid) + ") for " +
           std::to_string(freeze.count()) + " ms, then SIGCONT";
  stats_.faults_injected += 1;
  event("FAULT lighthouse_freeze: " + f.note);
  faults_.push_back(std::move(f));
}

bool ReplicaController::supervise(const mesh::MeshFailure& failure) {
  auto owner = meshes_.find(failure.mesh);
  if (owner == meshes_.end()) return false;  // not ours: fail fast
  auto [r, inc] = owner->second;
  if (r < 0) {
    // A spare (never promoted: promotions re-map the name): replace it; the job is not hit.
    auto s = std::find_if(spares_.begin(), spares_.end(),
                          [&](const Unit& u) { return u.mesh == failure.mesh; });
    if (s == spares_.end()) return true;
    if (s->procs && s->procs->size() > 1) helpers_.emplace_back([old = *s->procs] { old.stop(); });
    spares_.erase(s);
    ++stats_.spare_failures;
    ++spare_failures_in_a_row_;
    event("supervise: " + failure.to_string() + "  (a spare: replaced; not a fault of the job)");
    self<ReplicaController>().send(&ReplicaController::refill_spares);
    return true;
  }
  auto& g = groups_[static_cast<size_t>(r)];
  if (inc != g.incarnation || g.failed) return true;  // an old incarnation, or already handled
  g.failed = true;
  g.up = false;
  std::string id = replica_id(r);
  int64_t t = now_ns();
  // Injected faults whose victim this group is and whose failure is still to come (not an armed
  // kill_in_quorum: nothing happened to the group yet). A group that fails again after such a
  // fault took it (e.g. an outside kill of its replacement) is a new fault, not injected.
  bool victim = false;
  for (auto& f : faults_) {
    if (f.open() && !f.armed_only() && f.victims.count(id) && f.failed.insert(id).second) {
      victim = true;
      if (!f.detected) f.detected = t;
    }
  }
  if (!victim) {
    // Not injected by the job (a kill from outside, the OOM killer): still a fault, with a
    // timeline of its own.
    FaultRecord f;
    f.kind = FaultKind::outside;
    f.step = max_committed_;
    f.quorum_id = last_qid_;
    f.injected = f.detected = t;
    f.victims.insert(id);
    f.failed.insert(id);
    f.pending_rejoin.insert(id);
    f.note = failure.cause;
    faults_.push_back(std::move(f));
    stats_.faults_outside += 1;
  }
  event("supervise: " + failure.to_string() + (victim ? "" : "  (a fault the job did not inject)"));
  // The mesh names the host agent when the host itself went (src/mesh/proc_failure.cpp).
  const std::string& cause = failure.cause;
  if (cause.find("host agent ") != std::string::npos &&
      (cause.find(" lost (") != std::string::npos ||
       cause.find(" restarted") != std::string::npos) &&
      replace_host(r, cause))
    event(id + ": its host is gone; the respawn goes to a fresh host");
  lighthouse_.send(&Lighthouse::evict, id, failure.cause);
  if (max_committed_ > 0 && !finished_ &&
      std::none_of(groups_.begin(), groups_.end(), [](const Group& x) { return x.up; })) {
    // Nobody left to heal from: replacements would wait forever for step max_committed_.
    fail_run("every replica group has failed (the last: " + failure.to_string() +
             "): the state of step " + std::to_string(max_committed_) +
             " is lost with them (no live group holds it, and there is no checkpoint)");
    return true;
  }
  self<ReplicaController>().send(&ReplicaController::respawn, r);
  return true;  // handled: the other groups keep training
}

void ReplicaController::undeliverable(const DeliveryFailure& f) {
  // A message to a dead group (a start or an arm): the group's MeshFailure follows.
  event(std::string("undeliverable: ") + f.what());
}

void ReplicaController::respawn(int64_t r) {
  if (r < 0 || r >= opts_.groups)
    throw UsageError("respawn: no replica group " + std::to_string(r));
  auto& g = groups_[static_cast<size_t>(r)];
  if (finished_) return;
  if (!g.failed) ++stats_.survivor_restarts;  // restarted without having failed
  g.failures_in_a_row += 1;
  if (g.unit.procs && g.unit.procs->size() > 1) {
    // The group's other ranks may still be alive, blocked on the dead rank: stop them off this
    // actor (stop() waits up to mesh.stop_timeout), so reports and failures keep flowing.
    helpers_.emplace_back([old = *g.unit.procs] { old.stop(); });
  }
  if (g.failures_in_a_row >= 3) {
    event(replica_id(r) + " failed " + std::to_string(g.failures_in_a_row) +
          " times without a commit: respawning on fresh procs again");
  }
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (!it->ready) continue;
    Unit spare = std::move(*it);
    spares_.erase(it);
    promote(r, std::move(spare));
    return;
  }
  try {
    (void)spawn_group(r, true);  // no spare ready: fresh procs
  } catch (const std::exception& e) {
    // Not thrown out of this handler: that would stop the controller, and the job would only
    // hear that its done() promise was dropped.
    fail_run("cannot respawn " + replica_id(r) + ": " + e.what());
  }
}

void ReplicaController::finish(bool complete) {
  finished_ = true;
  stats_.steps = opts_.steps;
  stats_.wall_s = static_cast<double>(now_ns() - started_) / 1e9;
  std::set<uint64_t> hashes;
  for (auto& [id, hv] : finals_) hashes.insert(hv.first);
  if (auto it = finals_.find(replica_id(0)); it != finals_.end()) {
    stats_.metric = it->second.second;
  } else if (!finals_.empty()) {
    stats_.metric = finals_.begin()->second.second;
  }
  stats_.replicas_bitwise_equal = complete && hashes.size() == 1 && stats_.hash_mismatches == 0;
  double span = static_cast<double>(last_commit_ns_ - first_commit_ns_) / 1e9;
  if (span > 0) {
    stats_.committed_samples_per_s =
        static_cast<double>(max_committed_ * opts_.samples_per_step) / span;
  }
  if (heal_secs_ > 0) stats_.heal_gbps = heal_bytes_ / heal_secs_ / 1e9;
  std::vector<double> gaps;
  int64_t prev = 0;
  for (auto& [step, s] : steps_) {
    if (prev) gaps.push_back(static_cast<double>(s.t_ns - prev) / 1e6);
    prev = s.t_ns;
  }
  stats_.step_ms_p50 = percentile(gaps, 0.5);
  stats_.step_ms_p95 = percentile(gaps, 0.95);
  for (auto& f : faults_) {
    if (!f.open()) continue;
    std::string who;
    for (const auto& v : f.pending_rejoin) who += (who.empty() ? "" : ", ") + v;
    f.unrecovered = f.armed_only() ? "the run ended before quorum.after_request fired"
                                   : "the run ended before " + who + " committed again";
  }
  auto all = nlohmann::json::array();
  for (auto& f : faults_) all.push_back(f.to_json(t0_));
  stats_.faults_json = all.dump();
  if (auto it = steps_.find(opts_.steps); it != steps_.end()) it->second.metric = stats_.metric;
  flush_steps(std::numeric_limits<int64_t>::max());
  for (auto& f : faults_) {
    if (!f.open()) continue;
    if (metrics_.is_open()) metrics_ << f.to_json(t0_).dump() << "\n" << std::flush;
    on_fault(f);
  }
  if (done_) {
    done_->set_value(stats_);
    done_.reset();
  }
}

}  // namespace monarch::ft
