// ft_train: fault-tolerant elastic training on Fashion-MNIST, the project's main job (`make demo`).
//
//   build/bin/ft_train                       # fault-free run, then the same seed with 6 faults
//   build/bin/ft_train --steps 300 --faults 8 --seed 3 --json-summary out.json
//   build/bin/ft_train --no-faults           # only the fault-free run
//   build/bin/ft_train --sync-every 8        # DiLoCo mode: 8 local steps between state averages
//
// N replica groups (--replicas, default 4) of M ranks (--ranks, default 1) train one MLP each on
// disjoint shares of every global batch. Every step each rank asks its group's Manager for the
// quorum (the Lighthouse decides who takes part), heals from a live donor if it is behind (one
// RdmaBuffer read of the donor's committed state), sums gradients with the other participants
// (gloo, regrouped whenever the quorum changes), and applies Adam only if its whole group agrees
// to commit. The Controller owns one ProcMesh per replica group; its supervise() respawns a group
// that failed and never touches the survivors. A seeded injector kills (SIGKILL), freezes
// (SIGSTOP, then SIGCONT), throws inside the allreduce, and kills a donor in the middle of a heal.
//
// Output: a progress line, JSONL metrics (one line per committed step, one per fault with its
// timeline), a summary table, a PNG chart (gnuplot) of both runs, and --json-summary.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "fashion_mnist.hpp"
#include "model.hpp"
#include "monarch/config/config.hpp"
#include "monarch/ft/lighthouse.hpp"
#include "monarch/ft/torch/allreduce.hpp"
#include "monarch/mesh/process.hpp"
#include "monarch/run_main.hpp"
#include "plot.hpp"

using namespace std::chrono_literals;
namespace ft = monarch::ft;
namespace ex = monarch::ft::example;
namespace mesh = monarch::mesh;
namespace rdma = monarch::rdma;
using monarch::ActorRef;
using monarch::Future;
using monarch::Promise;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

int64_t now_ns() {
  return Clock::now().time_since_epoch().count();
}

struct TrainConfig {
  int64_t steps = 2000;
  int64_t replicas = 4;
  int64_t ranks = 1;
  uint64_t seed = 1;
  int64_t global_batch = 256;
  double lr = 1e-3;
  int64_t hidden = 256;
  std::string data_dir = ex::kFashionMnistDir;
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  int64_t collective_timeout_ms = 1000;
  int64_t step_timeout_ms = 10000;
  int64_t eval_every = 50;  // accuracy on a test subset every this many steps (replica rank 0)
  int64_t eval_samples = 2000;
  int64_t heal_chunk_bytes = 256 << 10;
  int64_t sync_every = 1;               // > 1: DiLoCo mode, K local steps between state averages
  std::string store_namespace = "run";  // each run of the job gets its own keys in the shared store
  template <class A>
  void serialize(A& ar) {
    ar(sync_every, store_namespace, steps, replicas, ranks, seed, global_batch, lr, hidden,
       data_dir, store_host, store_port, collective_timeout_ms, step_timeout_ms, eval_every,
       eval_samples, heal_chunk_bytes);
  }
};

/// What a rank tells the controller after every step (committed or not).
struct StepReport {
  std::string replica_id;
  int64_t incarnation = 0;
  int64_t rank = 0;
  int64_t step = 0;  // committed steps after this one
  bool committed = false;
  double loss = -1;  // mean loss of this rank's shard; -1 while healing (it contributed zeros)
  int64_t quorum_id = 0;
  int64_t participants = 0;
  int64_t healing = 0;
  bool healed = false;
  std::string donor;
  double heal_ms = 0;
  uint64_t heal_bytes = 0;
  uint64_t hash = 0;  // FlatState::hash() after a commit
  int64_t t_ns = 0;
  std::string error;
  double accuracy = -1;      // on the test subset (or the whole test set when final)
  bool final = false;        // the rank reached --steps and stops
  uint64_t state_bytes = 0;  // final: size of the committed state
  template <class A>
  void serialize(A& ar) {
    ar(state_bytes, replica_id, incarnation, rank, step, committed, loss, quorum_id, participants,
       healing, healed, donor, heal_ms, heal_bytes, hash, t_ns, error, accuracy, final);
  }
};

struct Controller;

/// One rank of one replica group: a training thread plus the endpoints the controller uses.
struct Trainer : monarch::Actor {
  Trainer(TrainConfig cfg, ActorRef<Controller> controller, ActorRef<ft::Manager> manager,
          std::string replica_id, int64_t incarnation)
      : cfg_(std::move(cfg)),
        controller_(std::move(controller)),
        manager_(std::move(manager)),
        replica_id_(std::move(replica_id)),
        incarnation_(incarnation) {}

  /// Loads the data and builds the model before the first message, so that a group counts as
  /// started only once it can train (the first quorum then has everyone).
  void init() override {
    ex::init_torch_worker(1);
    train_ = ex::load_fashion_mnist(cfg_.data_dir, ex::Split::train);
    test_ = ex::load_fashion_mnist(cfg_.data_dir, ex::Split::test);
    test_subset_.size = std::min<int64_t>(cfg_.eval_samples, test_.size);
    test_subset_.images.assign(test_.images.begin(),
                               test_.images.begin() + test_subset_.size * ex::kImagePixels);
    test_subset_.labels.assign(test_.labels.begin(), test_.labels.begin() + test_subset_.size);
    model_ = std::make_unique<ex::Model>(cfg_.seed, static_cast<int>(cfg_.hidden));
  }
  /// The process id (for fault injection); answers once init() is done.
  int pid() { return ::getpid(); }
  /// Starts the training thread as rank `rank` of the group. `kill_donor_mid_heal`: fault
  /// injection point "heal.after_first_chunk": ask the controller to kill the donor there.
  void start(int64_t rank, bool kill_donor_mid_heal) {
    if (thread_.joinable())
      throw monarch::UsageError("Trainer " + replica_id_ + ": already started");
    rank_ = rank;
    kill_donor_mid_heal_ = kill_donor_mid_heal;
    thread_ = std::thread([this] { loop(); });
  }
  /// Fault injection point "allreduce.enter": the next allreduce throws on this rank.
  void arm_allreduce_fault() { allreduce_fault_ = true; }
  void cleanup(const std::optional<monarch::ActorSupervisionEvent>&) override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  MONARCH_ENDPOINTS(Trainer, pid, start, arm_allreduce_fault)

 private:
  void loop();
  void heal(const ft::QuorumResult& q, ft::FlatState& st, StepReport& rep);
  void send(StepReport r);

  TrainConfig cfg_;
  ActorRef<Controller> controller_;
  ActorRef<ft::Manager> manager_;
  std::string replica_id_;
  int64_t incarnation_;
  int64_t rank_ = 0;
  bool kill_donor_mid_heal_ = false;
  std::atomic<bool> allreduce_fault_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  ex::Dataset train_, test_, test_subset_;
  std::unique_ptr<ex::Model> model_;
};

// ---------------------------------------------------------------------------------------------
// Controller: owns the replica groups, injects faults, watches every step.

enum class FaultKind { sigkill, sigstop, allreduce_throw, kill_donor_mid_heal };
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
  }
  return "?";
}

struct FaultRecord {
  FaultKind kind{};
  int64_t step = 0;               // last committed step when injected
  int64_t quorum_id = 0;          // quorum id when injected
  std::set<std::string> victims;  // replica ids hit (the donor joins for kill_donor_mid_heal)
  std::set<std::string> pending_rejoin;
  std::string note;
  int64_t injected = 0, detected = 0, new_quorum = 0, survivors_resumed = 0, respawned = 0,
          healed = 0, rejoined = 0;
  bool open() const { return !pending_rejoin.empty(); }
  json to_json(int64_t t0) const {
    auto rel = [&](int64_t t) {
      return t ? json(static_cast<double>(t - t0) / 1e9) : json(nullptr);
    };
    return json{{"fault", fault_name(kind)},
                {"step", step},
                {"victims", victims},
                {"note", note},
                {"injected_s", rel(injected)},
                {"detected_s", rel(detected)},
                {"new_quorum_s", rel(new_quorum)},
                {"survivors_resumed_s", rel(survivors_resumed)},
                {"respawned_s", rel(respawned)},
                {"healed_s", rel(healed)},
                {"rejoined_s", rel(rejoined)},
                {"recovery_s",
                 rejoined ? json(static_cast<double>(rejoined - injected) / 1e9) : json(nullptr)}};
  }
};

struct RunResult {
  std::string name;
  int64_t steps = 0;
  double wall_s = 0;
  double test_accuracy = -1;
  bool replicas_bitwise_equal = false;
  int64_t hash_mismatches = 0;
  int64_t faults_injected = 0;
  int64_t survivor_restarts = 0;
  int64_t respawns = 0;
  double max_survivor_stall_s = 0;
  std::string max_stall_where;
  std::vector<double> recovery_s;
  double committed_samples_per_s = 0;
  double heal_gbps = 0;
  uint64_t state_bytes = 0;
  double step_ms_p50 = 0;  // time between consecutive committed steps
  double step_ms_p95 = 0;
  std::vector<json> faults;
  std::string error;
  template <class A>
  void serialize(A& ar) {
    ar(state_bytes, step_ms_p50, step_ms_p95, max_stall_where, name, steps, wall_s, test_accuracy,
       replicas_bitwise_equal, hash_mismatches, faults_injected, survivor_restarts, respawns,
       max_survivor_stall_s, recovery_s, committed_samples_per_s, heal_gbps, error);
  }
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  auto lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

struct RunOptions {
  std::string name = "faulty";
  int64_t faults = 6;
  int64_t freeze_ms = 2000;
  std::string metrics_path;
  bool progress = true;
  template <class A>
  void serialize(A& ar) {
    ar(name, faults, freeze_ms, metrics_path, progress);
  }
};

struct Controller : monarch::Actor {
  Controller(TrainConfig cfg, RunOptions run, mesh::HostMesh host,
             ActorRef<ft::Lighthouse> lighthouse)
      : cfg_(std::move(cfg)),
        run_(std::move(run)),
        host_(std::move(host)),
        lighthouse_(std::move(lighthouse)),
        rng_(cfg_.seed * 7919 + 17) {
    groups_.resize(static_cast<size_t>(cfg_.replicas));
    if (!run_.metrics_path.empty()) metrics_.open(run_.metrics_path, std::ios::trunc);
    plan_faults();
  }

  /// Spawns every replica group (procs, manager, trainers); does not start training.
  void spawn_all() {
    t0_ = now_ns();
    for (int64_t r = 0; r < cfg_.replicas; ++r) spawn_group(r, false);
  }
  /// Starts the training threads of every group (after the lighthouse knows them all).
  void start_all() {
    started_ = now_ns();
    for (int64_t r = 0; r < cfg_.replicas; ++r) start_group(r, false);
  }
  /// Completes with the run's result once every group reached --steps (or the run failed).
  Future<RunResult> done() {
    Promise<RunResult> p;
    auto f = p.get_future();
    if (finished_) {
      p.set_value(result_);
    } else {
      done_ = std::move(p);
    }
    return f;
  }
  /// Stops every replica group.
  void shutdown() {
    for (auto& g : groups_) {
      if (g.procs) g.procs->stop();
    }
    for (auto& t : thaw_threads_) t.join();
    thaw_threads_.clear();
    for (auto& t : stop_threads_) t.join();
    stop_threads_.clear();
  }

  void report(StepReport r);
  /// Ends the run now with what is known (the run's deadline passed): replicas that did not
  /// finish count as not equal.
  void finish_now() {
    if (finished_) return;
    result_.error = std::to_string(finals_.size()) + " of " + std::to_string(cfg_.replicas) +
                    " replica groups finished before the deadline";
    event(result_.error);
    finish(/*complete=*/false);
  }
  /// Fault injection point "heal.after_first_chunk": the healer asks; the donor dies now.
  bool kill_donor(std::string healer, std::string donor);
  void respawn(int64_t r);
  bool supervise(const mesh::MeshFailure& f) override;
  /// A message to a dead replica (a start or a fault to arm): the group's MeshFailure follows.
  void undeliverable(const monarch::DeliveryFailure& f) override {
    event(std::string("undeliverable: ") + f.what());
  }

  MONARCH_ENDPOINTS(Controller, spawn_all, start_all, done, shutdown, report, finish_now,
                    kill_donor, respawn)

 private:
  struct Group {
    std::optional<mesh::ProcMesh> procs;
    std::optional<mesh::ActorMesh<Trainer>> trainers;
    int64_t incarnation = -1;
    std::vector<int> pids;
    bool up = false;
    int64_t failures_in_a_row = 0;
    bool arm_kill_donor = false;
  };
  static std::string replica_id(int64_t r) { return "replica" + std::to_string(r); }
  static std::string mesh_name(int64_t r, int64_t inc) {
    return replica_id(r) + "-" + std::to_string(inc);
  }

  // Spawns group r's procs, manager and trainers. Initial spawn: waits until every trainer is
  // ready. Respawn: returns at once; the trainers start once ready (then() runs in this actor),
  // so the controller keeps handling reports and failures meanwhile.
  void spawn_group(int64_t r, bool respawned) {
    auto& g = groups_[static_cast<size_t>(r)];
    g.incarnation += 1;
    g.up = false;
    g.pids.clear();
    g.procs = host_.spawn_procs({{"ranks", static_cast<size_t>(cfg_.ranks)}},
                                {.name = mesh_name(r, g.incarnation)});
    auto managers = g.procs->slice("ranks", 0)
                        .spawn<ft::Manager>("manager", lighthouse_, replica_id(r), cfg_.ranks,
                                            std::chrono::milliseconds(0));
    g.trainers = g.procs->spawn<Trainer>("trainer", cfg_, self<Controller>(), managers.at(0),
                                         replica_id(r), g.incarnation);
    // pid() answers after Trainer::init (data loaded, model built): the group is ready to train.
    auto pids = g.trainers->call(&Trainer::pid);
    if (!respawned) {
      auto v = pids.get(monarch::config::global().duration("mesh.spawn_timeout"));
      for (size_t i = 0; i < v.size(); ++i) g.pids.push_back(v[i]);
      return;
    }
    ++result_.respawns;
    bool arm = std::exchange(g.arm_kill_donor, false);
    (void)pids.then([this, r, inc = g.incarnation, arm](auto v) {
      auto& grp = groups_[static_cast<size_t>(r)];
      if (grp.incarnation != inc || finished_)
        return;  // replaced again meanwhile, or the run ended
      for (size_t i = 0; i < v.size(); ++i) grp.pids.push_back(v[i]);
      start_group(r, arm);
      for (auto& f : faults_) {
        if (f.open() && f.victims.count(replica_id(r)) && !f.respawned) f.respawned = now_ns();
      }
      event("respawned " + replica_id(r) + " as mesh " + mesh_name(r, inc) + " (ready)");
    });
  }
  void start_group(int64_t r, bool arm_kill_donor) {
    auto& g = groups_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < cfg_.ranks; ++i) {
      g.trainers->at(static_cast<size_t>(i)).send(&Trainer::start, i, arm_kill_donor);
    }
    g.up = true;
  }

  void plan_faults() {
    // Spread the faults over [10%, 60%] of the run (none after 80%: a group must have time to
    // heal and rejoin before the end); kinds in a fixed rotation (all four kinds
    // appear once there are four faults), starting at a seeded offset.
    int64_t n = run_.faults;
    if (n <= 0) return;
    int64_t first = std::max<int64_t>(5, cfg_.steps / 10), last = cfg_.steps * 6 / 10;
    int offset = static_cast<int>(rng_() % 4);
    for (int64_t i = 0; i < n; ++i) {
      int64_t at = first + (last - first) * i / std::max<int64_t>(1, n);
      plan_.push_back({at, static_cast<FaultKind>((offset + i) % 4)});
    }
  }

  void event(const std::string& what) {
    std::string line = fmt_time(now_ns()) + " " + run_.name + ": " + what;
    if (run_.progress) {
      std::printf("\r%-110s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  std::string fmt_time(int64_t t) const {
    char b[32];
    std::snprintf(b, sizeof b, "[%7.2fs]", static_cast<double>(t - t0_) / 1e9);
    return b;
  }
  FaultRecord* open_fault() {
    for (auto& f : faults_) {
      if (f.open()) return &f;
    }
    return nullptr;
  }
  bool is_victim_at(const std::string& id, int64_t from, int64_t to) const {
    for (const auto& f : faults_) {
      if (f.victims.count(id) && f.injected > from && f.injected <= to) return true;
      if (f.victims.count(id) && f.open() && f.injected <= from) return true;
    }
    return false;
  }
  // Survivor stalls: time between two steps of progress (commit, heal, finish) of the same group
  // incarnation, unless the group was itself hit by a fault in between.
  void note_progress(const StepReport& r) {
    std::string key =
        r.replica_id + "/" + std::to_string(r.incarnation) + "/" + std::to_string(r.rank);
    if (auto it = last_commit_at_.find(key); it != last_commit_at_.end()) {
      if (!is_victim_at(r.replica_id, it->second, r.t_ns)) {
        double gap = static_cast<double>(r.t_ns - it->second) / 1e9;
        if (gap > result_.max_survivor_stall_s) {
          result_.max_survivor_stall_s = gap;
          result_.max_stall_where = r.replica_id + " before step " + std::to_string(r.step);
        }
      }
    }
    last_commit_at_[key] = r.t_ns;
  }
  void maybe_inject(int64_t committed_step);
  void inject(FaultKind kind);
  void finish_if_done() {
    if (!finished_ && static_cast<int64_t>(finals_.size()) >= cfg_.replicas) finish(true);
  }
  void finish(bool complete);
  // Writes one metrics line per committed step below `before` not written yet, in step order.
  void write_step_lines(int64_t before) {
    for (auto it = steps_.upper_bound(written_upto_); it != steps_.end() && it->first < before;
         ++it) {
      const StepInfo& info = it->second;
      json j{{"run", run_.name},
             {"step", it->first},
             {"participants", info.participants},
             {"healing", info.healing},
             {"quorum_id", info.quorum_id},
             {"t_s", static_cast<double>(info.t_ns - t0_) / 1e9}};
      if (info.loss_n) j["loss"] = info.loss_sum / static_cast<double>(info.loss_n);
      if (info.accuracy >= 0) j["accuracy"] = info.accuracy;
      write_metrics(j);
      written_upto_ = it->first;
    }
  }
  void write_metrics(const json& j) {
    if (metrics_.is_open()) metrics_ << j.dump() << "\n" << std::flush;
  }

  TrainConfig cfg_;
  RunOptions run_;
  mesh::HostMesh host_;
  ActorRef<ft::Lighthouse> lighthouse_;
  std::mt19937_64 rng_;
  std::vector<Group> groups_;
  std::vector<std::pair<int64_t, FaultKind>> plan_;
  size_t next_fault_ = 0;
  std::vector<FaultRecord> faults_;
  std::vector<std::thread> thaw_threads_;
  std::vector<std::thread> stop_threads_;
  std::ofstream metrics_;
  int64_t t0_ = 0, started_ = 0;
  // step bookkeeping
  struct StepInfo {
    uint64_t hash = 0;
    int64_t reports = 0;
    double loss_sum = 0;
    int64_t loss_n = 0;
    int64_t participants = 0;
    int64_t healing = 0;
    int64_t quorum_id = 0;
    int64_t t_ns = 0;
    double accuracy = -1;
  };
  std::map<int64_t, StepInfo> steps_;
  int64_t max_committed_ = 0;
  int64_t written_upto_ = -1;  // metrics lines are written for steps up to this one
  int64_t prev_progress_ = 0;
  int64_t last_qid_ = 0;
  int64_t first_commit_ns_ = 0, last_commit_ns_ = 0;
  std::map<std::string, int64_t> last_commit_at_;  // replica/incarnation -> time of its last commit
  std::map<std::string, std::pair<uint64_t, double>> finals_;
  std::set<std::string> errors_seen_;  // replica -> (hash, accuracy)
  double heal_bytes_ = 0, heal_secs_ = 0;
  RunResult result_;
  bool finished_ = false;
  std::optional<Promise<RunResult>> done_;
};

void Controller::report(StepReport r) {
  auto gi = static_cast<size_t>(std::stoll(r.replica_id.substr(7)));
  if (gi >= groups_.size() || r.incarnation != groups_[gi].incarnation)
    return;  // from a replaced group
  auto& g = groups_[gi];
  if (!r.error.empty()) {
    // A failed step during a recovery is expected; show each replica's first error per quorum.
    if (auto* f = open_fault(); f && !f->detected) f->detected = r.t_ns;
    auto key = r.replica_id + "/" + std::to_string(r.quorum_id);
    if (errors_seen_.insert(key).second) {
      event(r.replica_id + " step " + std::to_string(r.step + 1) + " not committed (quorum " +
            std::to_string(r.quorum_id) + "): " + r.error);
    }
  }
  if (r.quorum_id != last_qid_ && r.rank == 0) {
    if (r.quorum_id > last_qid_) {
      for (auto& f : faults_) {
        if (f.open() && !f.new_quorum && r.quorum_id > f.quorum_id) {
          f.new_quorum = r.t_ns;
          if (!f.detected) f.detected = r.t_ns;
        }
      }
      if (last_qid_ != 0)
        event("quorum " + std::to_string(r.quorum_id) + ": " + std::to_string(r.participants) +
              " participant(s), " + std::to_string(r.healing) + " healing");
      last_qid_ = r.quorum_id;
    }
  }
  if (r.healed) {
    heal_bytes_ += static_cast<double>(r.heal_bytes);
    heal_secs_ += r.heal_ms / 1e3;
    event(r.replica_id + " healed from " + r.donor + " at step " + std::to_string(r.step) + " (" +
          std::to_string(r.heal_bytes >> 10) + " KiB in " + std::to_string(r.heal_ms).substr(0, 5) +
          " ms)");
    for (auto& f : faults_) {
      if (f.open() && f.victims.count(r.replica_id) && !f.healed) f.healed = r.t_ns;
    }
  }
  if (r.final || r.healed) note_progress(r);
  if (r.final) {
    finals_[r.replica_id] = {r.hash, r.accuracy};
    result_.state_bytes = r.state_bytes;
    finish_if_done();
    return;
  }
  if (!r.committed) return;

  // Bitwise equality: every rank that committed step s holds the same state.
  auto& s = steps_[r.step];
  if (s.reports == 0) {
    s.hash = r.hash;
    s.participants = r.participants;
    s.healing = r.healing;
    s.quorum_id = r.quorum_id;
    s.t_ns = r.t_ns;
  } else if (s.hash != r.hash) {
    ++result_.hash_mismatches;
    event("MISMATCH: " + r.replica_id + " committed step " + std::to_string(r.step) +
          " with a different state");
  }
  ++s.reports;
  if (r.loss >= 0) s.loss_sum += r.loss, ++s.loss_n;
  if (r.accuracy >= 0) s.accuracy = r.accuracy;
  if (!first_commit_ns_) first_commit_ns_ = r.t_ns;
  last_commit_ns_ = std::max(last_commit_ns_, r.t_ns);

  note_progress(r);

  for (auto& f : faults_) {
    if (!f.open()) continue;
    if (!f.victims.count(r.replica_id) && !f.survivors_resumed && r.quorum_id > f.quorum_id)
      f.survivors_resumed = r.t_ns;
    if (f.pending_rejoin.count(r.replica_id) && r.t_ns > f.injected && r.quorum_id > f.quorum_id) {
      f.pending_rejoin.erase(r.replica_id);
      if (!f.open()) {
        f.rejoined = r.t_ns;
        result_.recovery_s.push_back(static_cast<double>(f.rejoined - f.injected) / 1e9);
        event(std::string("recovered from ") + fault_name(f.kind) + " in " +
              std::to_string(result_.recovery_s.back()).substr(0, 5) + " s");
        write_metrics(f.to_json(t0_));
      }
    }
  }
  g.failures_in_a_row = 0;

  // One metrics line per step, once the next step has started arriving.
  if (r.step > max_committed_) {
    max_committed_ = r.step;
    write_step_lines(max_committed_ - 1);
    if (run_.progress && (r.step / 10 != prev_progress_ / 10 || r.step == cfg_.steps)) {
      prev_progress_ = r.step;
      double loss = s.loss_n ? s.loss_sum / static_cast<double>(s.loss_n) : r.loss;
      std::printf(
          "\r%s %s: step %5lld/%lld  loss %.4f  participants %lld/%lld  quorum %lld  faults %zu   ",
          fmt_time(r.t_ns).c_str(), run_.name.c_str(), static_cast<long long>(r.step),
          static_cast<long long>(cfg_.steps), loss, static_cast<long long>(r.participants),
          static_cast<long long>(cfg_.replicas), static_cast<long long>(r.quorum_id),
          faults_.size());
      std::fflush(stdout);
    }
    maybe_inject(r.step);
  }
}

void Controller::maybe_inject(int64_t committed_step) {
  if (next_fault_ >= plan_.size() || committed_step < plan_[next_fault_].first) return;
  if (open_fault()) return;  // one recovery at a time
  if (committed_step > cfg_.steps * 8 / 10) return;
  for (auto& g : groups_) {
    if (!g.up) return;
  }
  if (steps_[committed_step].participants < cfg_.replicas)
    return;  // everyone back in the quorum first
  inject(plan_[next_fault_++].second);
}

void Controller::inject(FaultKind kind) {
  FaultRecord f;
  f.kind = kind;
  f.step = max_committed_;
  f.quorum_id = last_qid_;
  f.injected = now_ns();
  auto victim = static_cast<int64_t>(rng_() % static_cast<uint64_t>(cfg_.replicas));
  auto& g = groups_[static_cast<size_t>(victim)];
  std::string id = replica_id(victim);
  f.victims.insert(id);
  f.pending_rejoin.insert(id);
  int pid = g.pids.at(0);
  switch (kind) {
    case FaultKind::sigkill:
      ::kill(pid, SIGKILL);
      f.note = "SIGKILL to " + id + " (pid " + std::to_string(pid) + ")";
      break;
    case FaultKind::sigstop: {
      ::kill(pid, SIGSTOP);
      f.note = "SIGSTOP to " + id + " for " + std::to_string(run_.freeze_ms) + " ms, then SIGCONT";
      thaw_threads_.emplace_back([pid, ms = run_.freeze_ms] {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(ms));  // the fault itself: a frozen process
        ::kill(pid, SIGCONT);
      });
      break;
    }
    case FaultKind::allreduce_throw:
      g.trainers->at(0).send(&Trainer::arm_allreduce_fault);
      f.note = "exception inside the allreduce on " + id;
      break;
    case FaultKind::kill_donor_mid_heal:
      // Kill the victim; its replacement will heal, and the injection point in its heal kills the
      // donor after the first chunk.
      ::kill(pid, SIGKILL);
      g.arm_kill_donor = true;
      f.note = "SIGKILL to " + id + ", then its donor is killed in the middle of the heal";
      break;
  }
  result_.faults_injected += 1;
  event("FAULT " + std::string(fault_name(kind)) + ": " + f.note);
  faults_.push_back(std::move(f));
}

bool Controller::kill_donor(std::string healer, std::string donor) {
  auto di = static_cast<size_t>(std::stoll(donor.substr(7)));
  auto& g = groups_.at(di);
  if (g.pids.empty()) return false;  // not running right now
  int pid = g.pids.at(0);
  ::kill(pid, SIGKILL);
  result_.faults_injected += 1;
  for (auto& f : faults_) {
    if (f.open() && f.kind == FaultKind::kill_donor_mid_heal) {
      f.victims.insert(donor);
      f.pending_rejoin.insert(donor);
    }
  }
  event("FAULT kill_donor_mid_heal: SIGKILL to donor " + donor + " while " + healer +
        " reads its state");
  return true;
}

bool Controller::supervise(const mesh::MeshFailure& failure) {
  // Mesh names are "replica<r>-<incarnation>".
  auto dash = failure.mesh.rfind('-');
  if (failure.mesh.rfind("replica", 0) != 0 || dash == std::string::npos)
    return false;  // not ours: fail fast
  int64_t r = std::stoll(failure.mesh.substr(7, dash - 7));
  int64_t inc = std::stoll(failure.mesh.substr(dash + 1));
  auto& g = groups_.at(static_cast<size_t>(r));
  if (inc != g.incarnation || !g.up) return true;  // an old incarnation, already replaced
  g.up = false;
  std::string id = replica_id(r);
  int64_t t = now_ns();
  bool victim = false;
  for (auto& f : faults_) {
    if (f.open() && f.victims.count(id)) {
      victim = true;
      if (!f.detected) f.detected = t;
    }
  }
  if (!victim) ++result_.survivor_restarts;
  event("supervise: " + failure.to_string() + (victim ? "" : "  (NOT an injected fault)"));
  lighthouse_.send(&ft::Lighthouse::evict, id, failure.cause);
  self<Controller>().send(&Controller::respawn, r);
  return true;  // handled: the other groups keep training
}

void Controller::respawn(int64_t r) {
  auto& g = groups_.at(static_cast<size_t>(r));
  if (finished_) return;
  g.failures_in_a_row += 1;
  if (g.procs && g.procs->size() > 1) {
    // The group's other ranks may still be alive, blocked on the dead rank: stop them off this
    // actor (stop() waits up to mesh.stop_timeout), so reports and failures keep flowing.
    stop_threads_.emplace_back([old = *g.procs] { old.stop(); });
  }
  if (g.failures_in_a_row >= 3) {
    event(replica_id(r) + " failed " + std::to_string(g.failures_in_a_row) +
          " times without a commit: reallocating (fresh procs, new mesh)");
  }
  spawn_group(r, true);
}

void Controller::finish(bool complete) {
  finished_ = true;
  result_.name = run_.name;
  result_.steps = cfg_.steps;
  result_.wall_s = static_cast<double>(now_ns() - started_) / 1e9;
  std::set<uint64_t> hashes;
  double acc = 1;
  for (auto& [id, hv] : finals_) {
    hashes.insert(hv.first);
    acc = std::min(acc, hv.second);
  }
  result_.test_accuracy = finals_.empty() ? -1 : acc;
  result_.replicas_bitwise_equal = complete && hashes.size() == 1 && result_.hash_mismatches == 0;
  double span = static_cast<double>(last_commit_ns_ - first_commit_ns_) / 1e9;
  if (span > 0)
    result_.committed_samples_per_s =
        static_cast<double>(max_committed_ * cfg_.global_batch) / span;
  if (heal_secs_ > 0) result_.heal_gbps = heal_bytes_ / heal_secs_ / 1e9;
  std::vector<double> gaps;
  int64_t prev = 0;
  for (auto& [step, info] : steps_) {
    if (prev) gaps.push_back(static_cast<double>(info.t_ns - prev) / 1e6);
    prev = info.t_ns;
  }
  result_.step_ms_p50 = percentile(gaps, 0.5);
  result_.step_ms_p95 = percentile(gaps, 0.95);
  for (auto& f : faults_) result_.faults.push_back(f.to_json(t0_));
  if (steps_.count(cfg_.steps)) steps_[cfg_.steps].accuracy = acc;  // the final, whole test set
  write_step_lines(std::numeric_limits<int64_t>::max());            // the remaining metric lines
  for (auto& f : faults_) {
    if (f.open()) write_metrics(f.to_json(t0_));
  }
  if (run_.progress) std::printf("\n");
  if (done_) {
    done_->set_value(result_);
    done_.reset();
  }
}

// ---------------------------------------------------------------------------------------------
// Trainer thread

void Trainer::send(StepReport r) {
  r.replica_id = replica_id_;
  r.incarnation = incarnation_;
  r.rank = rank_;
  r.t_ns = now_ns();
  (void)controller_.call(&Controller::report, std::move(r));  // a lost report is only a lost metric
}

void Trainer::heal(const ft::QuorumResult& q, ft::FlatState& st, StepReport& rep) {
  if (!q.donor_state) throw std::runtime_error("heal: donor " + q.donor_id + " offered no state");
  const rdma::RdmaHandle& h = *q.donor_state;
  if (h.length != st.bytes().size()) {
    throw std::runtime_error("heal: donor " + q.donor_id + " state is " + std::to_string(h.length) +
                             " B, ours " + std::to_string(st.bytes().size()) + " B");
  }
  std::vector<std::byte> buf(h.length);
  auto t = Clock::now();
  rdma::TransferOptions topts{std::chrono::milliseconds(cfg_.step_timeout_ms)};
  // The first chunk alone (fault injection point "heal.after_first_chunk" follows it), then
  // the rest as one batch of parallel reads.
  auto chunk = std::min<uint64_t>(static_cast<uint64_t>(cfg_.heal_chunk_bytes), h.length);
  auto wait = std::chrono::milliseconds(cfg_.step_timeout_ms);
  h.read_into(std::span(buf).first(chunk), 0, topts).get(wait);
  if (kill_donor_mid_heal_) {
    kill_donor_mid_heal_ = false;
    controller_.call(&Controller::kill_donor, replica_id_, q.donor_id).get(10s);
  }
  rdma::RdmaBatch rest;
  for (uint64_t off = chunk; off < h.length; off += 4 * chunk) {
    uint64_t n = std::min<uint64_t>(4 * chunk, h.length - off);
    rest.read_into(h, std::span(buf).subspan(off, n), off);
  }
  rest.submit(topts).get(wait);
  st.load_from(buf);
  if (st.step() != q.max_step) {
    throw std::runtime_error("heal: state read from " + q.donor_id + " is at step " +
                             std::to_string(st.step()) + ", quorum max_step is " +
                             std::to_string(q.max_step));
  }
  rep.healed = true;
  rep.donor = q.donor_id;
  rep.heal_bytes = h.length;
  rep.heal_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void Trainer::loop() {
  try {
    const ex::Dataset& train = train_;
    const ex::Dataset& test = test_;
    const ex::Dataset& test_subset = test_subset_;
    ex::Model& model = *model_;
    ft::FlatState& st = model.state();
    // Per step (sync_every 1), donors are read in place: the state changes only at a commit,
    // and a commit needs the allreduce that every healer joins after its read completed. In
    // DiLoCo mode (sync_every K > 1) the state changes during the K local steps, so healers read
    // a copy of the committed state instead, rewritten only at a commit (same argument).
    const bool local_steps = cfg_.sync_every > 1;
    std::vector<std::byte> committed;
    if (local_steps) committed.assign(st.bytes().begin(), st.bytes().end());
    rdma::RdmaBuffer exposed(local_steps ? std::span<std::byte>(committed) : st.bytes(),
                             replica_id_ + ".r" + std::to_string(rank_) + ".state");
    // DiLoCo: everything after the 64-byte header is float state (parameters, Adam moments).
    std::span<float> state_floats(reinterpret_cast<float*>(st.bytes().data() + 64),
                                  (st.bytes().size() - 64) / 4);
    ft::AllreduceGroup group;
    ex::Sampler sampler(train.size, cfg_.seed);
    ft::AdamOptions adam;
    adam.lr = cfg_.lr;
    auto step_timeout = std::chrono::milliseconds(cfg_.step_timeout_ms);
    bool commit_failed = false;
    int64_t qid = -1;

    bool final_sent = false;
    auto ask_quorum = [&] {
      return manager_
          .call(&ft::Manager::quorum, rank_, st.step(), commit_failed,
                std::optional<rdma::RdmaHandle>(exposed.handle()))
          .get(step_timeout);
    };
    while (!stop_) {
      if (st.step() >= cfg_.steps) {
        if (!final_sent) {
          StepReport fin;
          fin.final = true;
          fin.step = st.step();
          fin.hash = st.hash();
          fin.state_bytes = st.bytes().size();
          fin.accuracy = model.evaluate(test);
          send(std::move(fin));
          final_sent = true;
        }
        // Hold: keep taking part in quorums without training, so that a group still behind can
        // heal from this one (whose state no longer changes), until the controller stops the job.
        try {
          (void)ask_quorum();
        } catch (const std::exception&) {
        }
        std::this_thread::sleep_for(50ms);  // pacing of the hold loop
        continue;
      }
      StepReport rep;
      bool ok = true;
      int64_t step0 = -1, position0 = st.data_position(), round = 1;
      try {
        auto q = ask_quorum();
        rep.quorum_id = q.quorum_id;
        rep.participants = q.replica_world_size;
        rep.healing = static_cast<int64_t>(q.healing.size());
        if (q.max_step >= cfg_.steps) {
          // The others finished and hold: catch up by healing only (they run no allreduce).
          if (q.heal) {
            try {
              heal(q, st, rep);
              if (local_steps) std::copy(st.bytes().begin(), st.bytes().end(), committed.begin());
              exposed.sync();
            } catch (const std::exception& e) {
              rep.error = e.what();
            }
          }
          rep.step = st.step();
          send(std::move(rep));
          continue;
        }
        try {
          if (q.quorum_id != qid) {
            qid = -1;
            group.configure(cfg_.store_host, cfg_.store_port,
                            cfg_.store_namespace + "/" + q.store_prefix,
                            static_cast<int>(q.global_rank), static_cast<int>(q.global_world_size),
                            std::chrono::milliseconds(cfg_.collective_timeout_ms));
            qid = q.quorum_id;
          } else if (!group.configured()) {
            throw std::runtime_error("allreduce group of quorum " + std::to_string(qid) +
                                     " is closed");
          }
          // Heal after joining the group: if the heal fails, abort() below makes the peers fail
          // at once instead of waiting out the collective timeout for a member that never came.
          if (q.heal) {
            heal(q, st, rep);
            if (local_steps) std::copy(st.bytes().begin(), st.bytes().end(), committed.begin());
            exposed.sync();
          }
          // Up-to-date groups share the global batch; healers contribute zeros this step.
          int64_t slot = -1, slots = q.up_to_date_groups * cfg_.ranks;
          if (!q.heal) {
            int64_t i = 0;
            for (const auto& p : q.participants) {
              if (std::find(q.healing.begin(), q.healing.end(), p) != q.healing.end()) continue;
              if (p == replica_id_) slot = i * cfg_.ranks + rank_;
              ++i;
            }
          }
          step0 = st.step();
          position0 = st.data_position();
          round = std::min(cfg_.sync_every, cfg_.steps - step0);
          if (!local_steps) {
            if (slot >= 0) {
              auto idx = sampler.shard(position0, cfg_.global_batch, static_cast<int>(slot),
                                       static_cast<int>(slots));
              rep.loss = model.forward_backward(train, idx);
            } else {
              st.zero_grads();
            }
          } else if (slot >= 0) {
            // DiLoCo round: `round` local Adam steps on this group's shares, no communication.
            double loss = 0;
            for (int64_t k = 0; k < round; ++k) {
              auto idx = sampler.shard(position0 + k * cfg_.global_batch, cfg_.global_batch,
                                       static_cast<int>(slot), static_cast<int>(slots));
              loss += model.forward_backward(train, idx);
              st.adam_step(adam);
            }
            rep.loss = loss / static_cast<double>(round);
          }
          if (allreduce_fault_.exchange(false)) {  // fault injection point "allreduce.enter"
            throw std::runtime_error("injected exception inside the allreduce");
          }
          if (!local_steps) {
            group.allreduce_sum(st.grads());
            st.scale_grads(1.0f / static_cast<float>(slots));
          } else {
            // Average the whole float state (parameters and moments) over the groups that trained;
            // healers contribute zeros and take the average.
            if (slot < 0) std::fill(state_floats.begin(), state_floats.end(), 0.0f);
            group.allreduce_sum(state_floats);
            const float inv = 1.0f / static_cast<float>(slots);
            for (float& x : state_floats) x *= inv;
          }
        } catch (const std::exception& e) {
          ok = false;
          rep.error = e.what();
          group.abort();  // peers blocked on this group fail now, not at their timeout
          qid = -1;
        }
        bool commit =
            manager_.call(&ft::Manager::should_commit, rank_, step0 >= 0 ? step0 : st.step(), ok)
                .get(step_timeout);
        if (commit && !local_steps) {
          st.adam_step(adam);
          st.set_data_position(position0 + cfg_.global_batch);
        } else if (commit) {
          st.set_step(step0 + round);
          st.set_data_position(position0 + round * cfg_.global_batch);
          std::copy(st.bytes().begin(), st.bytes().end(), committed.begin());  // healers read this
        } else if (local_steps && step0 >= 0) {
          st.load_from(committed);  // undo the round's local steps
        }
        if (commit) {
          exposed.sync();
          rep.committed = true;
          rep.hash = st.hash();
          if (q.replica_rank == 0 && rank_ == 0 && cfg_.eval_every > 0 &&
              st.step() / cfg_.eval_every !=
                  (st.step() - 1 - (local_steps ? round - 1 : 0)) / cfg_.eval_every) {
            rep.accuracy = model.evaluate(test_subset);
          }
        } else if (rep.error.empty()) {
          rep.error = "another rank of the group voted not to commit";
        }
        commit_failed = !commit;
      } catch (const std::exception& e) {  // no quorum or no vote in time: try again
        rep.error = e.what();
        commit_failed = true;
        group.abort();
        qid = -1;
      }
      rep.step = st.step();
      send(std::move(rep));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_train: %s rank %lld: fatal: %s\n", replica_id_.c_str(),
                 static_cast<long long>(rank_), e.what());
    std::fflush(stderr);
    std::_Exit(2);  // the controller's supervise() sees the exit and respawns the group
  }
}

// ---------------------------------------------------------------------------------------------
// main

// `lighthouse_addr`: a standalone lighthouse (`monarch lighthouse`) to use; empty: one in this
// process, for this run only.
RunResult run_job(const mesh::HostMesh& host, TrainConfig cfg, RunOptions run,
                  const ft::StoreServer& store, const std::string& lighthouse_addr) {
  cfg.store_host = store.host();
  cfg.store_port = store.port();
  cfg.store_namespace = run.name;
  auto& client = host.client();
  auto spawn_timeout = monarch::config::global().duration("mesh.spawn_timeout");
  auto lighthouse =
      lighthouse_addr.empty()
          ? client.spawn<ft::Lighthouse>("lighthouse." + run.name, ft::LighthouseOptions{})
          : ft::connect_lighthouse(client, lighthouse_addr, spawn_timeout);
  auto controller = client.spawn<Controller>("controller." + run.name, cfg, run, host, lighthouse);
  controller.call(&Controller::spawn_all).get(spawn_timeout * 2);
  // Start training once the lighthouse has heard from every group, so the first quorum has all.
  auto deadline = Clock::now() + spawn_timeout;
  while (lighthouse.call(&ft::Lighthouse::healthy).get(spawn_timeout).size() <
         static_cast<size_t>(cfg.replicas)) {
    if (Clock::now() > deadline)
      throw std::runtime_error("the replica groups did not heartbeat the lighthouse in time");
    std::this_thread::sleep_for(20ms);  // polling the lighthouse's view, not waiting for a settle
  }
  controller.call(&Controller::start_all).get(spawn_timeout);
  auto budget =
      std::chrono::milliseconds(cfg.step_timeout_ms) * 6 + std::chrono::seconds(cfg.steps) + 120s;
  auto done = controller.call(&Controller::done);
  if (!done.wait_for(budget)) controller.call(&Controller::finish_now).get(spawn_timeout);
  RunResult res = done.get(spawn_timeout);
  // The lighthouse first: holders waiting for a quorum get an error at once and see the stop.
  // An external one outlives the job (its holders keep forming quorums until stopped).
  if (lighthouse_addr.empty()) lighthouse.stop().get(spawn_timeout);
  controller.call(&Controller::shutdown).get(spawn_timeout * 2);
  controller.stop().get(spawn_timeout);
  return res;
}

// memcpy bandwidth of a buffer the size of the training state (the limit for healing), GB/s.
double memcpy_gbps(size_t bytes) {
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

json summary_json(const RunResult& faulty, const RunResult* fault_free, double detection_s) {
  json j{{"faults_injected", faulty.faults_injected},
         {"survivor_restarts", faulty.survivor_restarts},
         {"replicas_bitwise_equal",
          faulty.replicas_bitwise_equal && (!fault_free || fault_free->replicas_bitwise_equal)},
         {"hash_mismatches", faulty.hash_mismatches},
         {"test_accuracy", faulty.test_accuracy},
         {"test_accuracy_fault_free", fault_free ? json(fault_free->test_accuracy) : json(nullptr)},
         {"max_survivor_stall_s", faulty.max_survivor_stall_s},
         {"max_survivor_stall_at", faulty.max_stall_where},
         {"detection_timeout_s", detection_s},
         {"recovery_p50_s", percentile(faulty.recovery_s, 0.5)},
         {"recovery_p95_s", percentile(faulty.recovery_s, 0.95)},
         {"recoveries", faulty.recovery_s.size()},
         {"respawns", faulty.respawns},
         {"committed_samples_per_s", faulty.committed_samples_per_s},
         {"committed_samples_per_s_fault_free",
          fault_free ? json(fault_free->committed_samples_per_s) : json(nullptr)},
         {"heal_gbps", faulty.heal_gbps},
         {"state_bytes", faulty.state_bytes},
         {"memcpy_gbps", memcpy_gbps(std::max<size_t>(faulty.state_bytes, 4096))},
         {"step_ms_p50", faulty.step_ms_p50},
         {"step_ms_p95", faulty.step_ms_p95},
         {"step_ms_p50_fault_free", fault_free ? json(fault_free->step_ms_p50) : json(nullptr)},
         {"steps", faulty.steps},
         {"wall_s", faulty.wall_s},
         {"faults", faulty.faults}};
  return j;
}

void print_table(const RunResult* ff, const RunResult& fr, double detection_s) {
  auto row = [](const char* what, const std::string& a, const std::string& b) {
    std::printf("  %-28s %14s %14s\n", what, a.c_str(), b.c_str());
  };
  auto num = [](double v, int prec = 3) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", prec, v);
    return std::string(b);
  };
  std::printf("\n== ft_train summary ==\n");
  row("", ff ? ff->name : "", fr.name);
  row("test accuracy (%)", ff ? num(ff->test_accuracy * 100, 2) : "-",
      num(fr.test_accuracy * 100, 2));
  row("replicas bitwise equal", ff ? (ff->replicas_bitwise_equal ? "yes" : "NO") : "-",
      fr.replicas_bitwise_equal ? "yes" : "NO");
  row("faults injected", ff ? std::to_string(ff->faults_injected) : "-",
      std::to_string(fr.faults_injected));
  row("survivor restarts", ff ? std::to_string(ff->survivor_restarts) : "-",
      std::to_string(fr.survivor_restarts));
  row("max survivor stall (s)", ff ? num(ff->max_survivor_stall_s) : "-",
      num(fr.max_survivor_stall_s));
  row("recovery p50 / p95 (s)", "-",
      num(percentile(fr.recovery_s, 0.5), 2) + " / " + num(percentile(fr.recovery_s, 0.95), 2));
  row("committed samples/s", ff ? num(ff->committed_samples_per_s, 0) : "-",
      num(fr.committed_samples_per_s, 0));
  row("wall time (s)", ff ? num(ff->wall_s, 1) : "-", num(fr.wall_s, 1));
  std::printf("  detection timeout %.2f s; stall bound %.2f s\n", detection_s, detection_s + 0.5);
}

}  // namespace

static int run(int argc, char** argv) {
  mesh::bootstrap(argc, argv);  // worker processes (replica ranks) serve here and never return
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  TrainConfig cfg;
  RunOptions run;
  bool no_faults = false;
  std::string json_summary, out_dir = "ft_train_out", lighthouse_addr;
  CLI::App app{
      "ft_train: fault-tolerant elastic training on Fashion-MNIST (monarch-cpp's main job)"};
  app.add_option("--steps", cfg.steps, "training steps (committed)")->check(CLI::Range(1, 1000000));
  app.add_option("--replicas", cfg.replicas, "replica groups")->check(CLI::Range(1, 64));
  app.add_option("--ranks", cfg.ranks, "ranks per replica group")->check(CLI::Range(1, 16));
  app.add_option("--faults", run.faults, "faults to inject in the faulty run")
      ->check(CLI::Range(0, 1000));
  app.add_option("--seed", cfg.seed, "seed of the model, the data order and the fault injector");
  app.add_flag("--no-faults", no_faults, "run only the fault-free run");
  app.add_option(
         "--sync-every", cfg.sync_every,
         "DiLoCo mode: K local Adam steps per group between averages of the whole state (1: "
         "gradient allreduce every step)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--batch", cfg.global_batch, "global batch (samples per step, all groups)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", cfg.lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--data", cfg.data_dir, "Fashion-MNIST directory (Debian dataset-fashion-mnist)");
  app.add_option("--freeze-ms", run.freeze_ms, "how long a SIGSTOP fault freezes its victim")
      ->check(CLI::Range(1, 5000));
  app.add_option("--json-summary", json_summary, "write the summary JSON here");
  app.add_option("--out", out_dir, "directory for metrics JSONL and the PNG chart");
  app.add_flag("!--no-progress", run.progress, "no live progress line");
  app.add_option("--lighthouse", lighthouse_addr,
                 "address of a standalone lighthouse (`monarch lighthouse --listen ADDR`) to use "
                 "instead of one in this process");
  CLI11_PARSE(app, argc, argv);
  if (cfg.global_batch < cfg.replicas * cfg.ranks) {
    std::fprintf(stderr, "ft_train: --batch %lld is smaller than replicas x ranks\n",
                 static_cast<long long>(cfg.global_batch));
    return 2;
  }

  try {
    // Fail before spawning anything if the data is missing (the message names the package).
    (void)ex::load_fashion_mnist(cfg.data_dir, ex::Split::test);
    auto& conf = monarch::config::global();
    cfg.collective_timeout_ms = conf.duration("ft.collective_timeout").count();
    cfg.step_timeout_ms = conf.duration("ft.step_timeout").count();
    double detection_s = static_cast<double>(std::max(conf.duration("ft.collective_timeout"),
                                                      conf.duration("ft.heartbeat_timeout"))
                                                 .count()) /
                         1e3;
    // A SIGSTOP fault must outlast the lighthouse's heartbeat timeout (so the group is left out of
    // the quorum) but not the mesh's (which would declare the proc frozen and replace it).
    auto mesh_hb = conf.duration("mesh.heartbeat_timeout");
    if (std::chrono::milliseconds(run.freeze_ms) + 2s > mesh_hb) {
      conf.set("mesh.heartbeat_timeout", std::to_string(run.freeze_ms + 3000) + "ms");
    }
    std::filesystem::create_directories(out_dir);
    ft::StoreServer store;
    mesh::HostMesh host = mesh::this_host();

    std::optional<RunResult> fault_free, faulty;
    RunOptions ff_opts = run;
    ff_opts.name = "fault_free";
    ff_opts.faults = 0;
    ff_opts.metrics_path = out_dir + "/fault_free.jsonl";
    std::printf(
        "ft_train: %lld replica group(s) x %lld rank(s), %lld steps, global batch %lld, seed "
        "%llu\n",
        static_cast<long long>(cfg.replicas), static_cast<long long>(cfg.ranks),
        static_cast<long long>(cfg.steps), static_cast<long long>(cfg.global_batch),
        static_cast<unsigned long long>(cfg.seed));
    fault_free = run_job(host, cfg, ff_opts, store, lighthouse_addr);
    if (!no_faults && run.faults > 0) {
      run.name = "faulty";
      run.metrics_path = out_dir + "/faulty.jsonl";
      faulty = run_job(host, cfg, run, store, lighthouse_addr);
    }
    const RunResult& main_run = faulty ? *faulty : *fault_free;
    print_table(faulty ? &*fault_free : nullptr, main_run, detection_s);
    json summary = summary_json(main_run, &*fault_free, detection_s);
    if (faulty) {
      try {
        ex::plot_loss_accuracy(out_dir + "/fault_free.jsonl", out_dir + "/faulty.jsonl",
                               out_dir + "/ft_train.png");
        std::printf("  chart: %s/ft_train.png; metrics: %s/{fault_free,faulty}.jsonl\n",
                    out_dir.c_str(), out_dir.c_str());
      } catch (const std::exception& e) {
        std::printf("  (no chart: %s)\n", e.what());
      }
    }
    if (!json_summary.empty()) {
      std::ofstream(json_summary) << summary.dump(2) << "\n";
      std::printf("  summary: %s\n", json_summary.c_str());
    }
    bool ok = main_run.replicas_bitwise_equal && main_run.survivor_restarts == 0;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_train: %s\n", e.what());
    return 1;
  }
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
