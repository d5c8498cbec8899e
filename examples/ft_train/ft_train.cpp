// ft_train: fault-tolerant elastic training, the project's main job (`make demo`).
//
//   build/bin/ft_train                       # fault-free run, then the same seed with 6 faults
//   build/bin/ft_train --steps 300 --faults 8 --seed 3 --json-summary out.json
//   build/bin/ft_train --no-faults           # only the fault-free run
//   build/bin/ft_train --chaos --seed 5      # a seeded random, overlapping fault schedule
//
// N replica groups (--replicas) of M ranks (--ranks) train one model (--model, workload.hpp) on
// disjoint shares of every global batch. Here: model, data, flags and reporting. The step
// protocol is ft::ReplicaClient (Trainer::loop), the group lifecycle ft::ReplicaController, which
// JobController extends with a seeded fault schedule and progress (docs/ft.md). Output: progress
// (a live line on a terminal, else a plain line every --progress-every steps), events, JSONL
// metrics, a summary table, a PNG chart of both runs (gnuplot), --json-summary.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "chaos.hpp"
#include "cli_checks.hpp"
#include "launcher.hpp"
#include "model.hpp"
#include "monarch/config/config.hpp"
#include "monarch/ft/controller.hpp"
#include "monarch/ft/torch/replica_client.hpp"
#include "monarch/mesh/process.hpp"
#include "monarch/run_main.hpp"
#include "plot.hpp"
#include "summary.hpp"
#include "workload.hpp"

using namespace std::chrono_literals;
namespace ft = monarch::ft;
namespace ex = monarch::ft::example;
namespace mesh = monarch::mesh;
using monarch::ActorRef;
using monarch::Future;
using json = nlohmann::json;

namespace {

struct TrainConfig {
  int64_t steps = 0, replicas = 4, ranks = 1;  // steps, batch, eval_samples 0: the model's default
  uint64_t seed = 1;
  int64_t global_batch = 0;
  double lr = 1e-3;
  std::string model = "mlp", data_dir;
  int64_t eval_every = 50;  // quick metric every this many steps (replica rank 0)
  int64_t eval_samples = 0;
  ft::ReplicaClientOptions client;  // the store, the group's replica id; each trainer sets its rank
  template <class A>
  void serialize(A& ar) {
    ar(steps, replicas, ranks, seed, global_batch, lr, model, data_dir, eval_every, eval_samples,
       client);
  }
};

/// One rank of one replica group: a training thread around an ft::ReplicaClient.
struct Trainer : monarch::Actor {
  explicit Trainer(TrainConfig cfg) : cfg_(std::move(cfg)) {}
  /// Loads the data and builds the model before the first message: a group (or a spare) is ready
  /// (ready() answers) only once it can train, so the first quorum has everyone.
  void init() override {
    ex::init_torch_worker(1);
    work_ = ex::make_workload({cfg_.model, cfg_.seed, cfg_.data_dir, cfg_.eval_samples});
  }
  bool ready() { return true; }
  /// Starts the training thread as rank `rank` of group `replica_id` (its Manager `manager`).
  void start(int64_t rank, std::string replica_id, int64_t incarnation,
             ActorRef<ft::Manager> manager) {
    if (thread_.joinable())
      throw monarch::UsageError("Trainer " + cfg_.client.replica_id + ": already started");
    cfg_.client.rank = rank;
    cfg_.client.local_host = ex::worker_gloo_host();  // this host's address, reachable by peers
    cfg_.client.replica_id = std::move(replica_id);
    cfg_.client.incarnation = incarnation;
    manager_ = std::move(manager);
    thread_ = std::thread([this] { loop(); });
  }
  void cleanup(const std::optional<monarch::ActorSupervisionEvent>&) override {
    stop_ = true;
    stop_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  MONARCH_ENDPOINTS(Trainer, ready, start)

 private:
  void loop() {
    try {
      ft::FlatState& st = work_->state();
      ft::ReplicaClient client(*manager_, st, cfg_.client);
      ft::AdamOptions adam{.lr = cfg_.lr};
      while (!stop_ && st.step() < cfg_.steps) {
        double loss = -1, metric = -1;
        try {
          ft::StepPlan plan = client.start_quorum();
          if (plan.step) {
            int64_t pos = st.data_position();
            bool ok = true;
            try {
              if (plan.train)
                loss = work_->forward_backward(pos, cfg_.global_batch, plan.slot, plan.slots);
              client.allreduce(st.grads());
            } catch (const std::exception&) {
              ok = false;  // the client aborted the group and remembers why
            }
            if (client.should_commit(ok)) {
              st.adam_step(adam);
              st.set_data_position(pos + cfg_.global_batch);
              if (cfg_.client.rank == 0 && plan.participants.at(0) == cfg_.client.replica_id &&
                  cfg_.eval_every > 0 && st.step() % cfg_.eval_every == 0)
                metric = work_->evaluate(false);
            }
          }
        } catch (const monarch::UsageError&) {
          // A program error (two trainers with one rank, replicas of different sizes): no step
          // can succeed. The report carries it as fatal, the controller ends the run with it
          // and stops this trainer.
          client.report(loss, metric);
          stop_.wait(false);
          return;
        } catch (const std::exception&) {
          // no quorum, no vote or a failed heal (client.last_error()): the next step retries
        }
        client.report(loss, metric);
      }
      // Replicas end bitwise equal: replica0 alone evaluates the whole held-out split.
      bool judge = cfg_.client.replica_id == "replica0" && cfg_.client.rank == 0;
      if (!stop_) client.report(-1, judge ? work_->evaluate(true) : -1, /*final=*/true);
      while (!stop_) client.hold(&stop_);  // laggards heal from this group until the job stops it
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ft_train: %s rank %lld: fatal: %s\n", cfg_.client.replica_id.c_str(),
                   static_cast<long long>(cfg_.client.rank), e.what());
      std::_Exit(2);  // the controller's supervise() sees the exit and respawns the group
    }
  }

  TrainConfig cfg_;
  std::optional<ActorRef<ft::Manager>> manager_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::unique_ptr<ex::Workload> work_;
};

struct RunOptions {
  ex::Launcher* launcher = nullptr;  // where the groups run (--launcher); outlives the runs
  std::string name = "faulty", metrics_path, metric = "accuracy";
  int64_t faults = 6, freeze_ms = 2000, spares = 0;
  bool fork_server = true;       // --no-fork-server: exec every group's procs
  bool progress = true;          // events and progress at all (--no-progress: none)
  bool live = true;              // stdout is a terminal: one \r-rewritten progress line
  int64_t progress_every = 100;  // not a terminal: a plain progress line every this many steps
  ex::ChaosOptions chaos;        // --chaos (chaos.hpp)
};

/// The job's controller: the library's group lifecycle plus the seeded fault schedule of
/// chaos.hpp (fixed rotation or --chaos), progress and metrics.
struct JobController : ex::ScheduledController {
  JobController(std::vector<mesh::HostMesh> hosts, ActorRef<ft::Lighthouse> lighthouse,
                TrainConfig cfg, RunOptions run)
      : ScheduledController(
            std::move(hosts), std::move(lighthouse),
            {cfg.replicas, cfg.ranks, cfg.steps, cfg.global_batch, run.name, run.metrics_path,
             run.metric, run.spares, run.fork_server},
            {cfg.seed, run.faults, std::chrono::milliseconds(run.freeze_ms), run.chaos}),
        cfg_(std::move(cfg)),
        run_(std::move(run)) {}
  MONARCH_FT_CONTROLLER_ENDPOINTS(JobController)

 protected:
  Future<void> spawn_trainers(const ft::GroupInfo& g, const mesh::ProcMesh& procs) override {
    TrainConfig c = cfg_;
    c.client.controller = self<ft::ReplicaController>();
    auto t = procs.spawn<Trainer>("trainer", c);
    trainers_.insert_or_assign(g.mesh, t);
    return t.call(&Trainer::ready).then([](auto v) { (void)v.to_vector(); });
  }
  void start_trainers(const ft::GroupInfo& g, ActorRef<ft::Manager> manager) override {
    auto& t = trainers_.at(g.mesh);
    for (size_t i = 0; i < t.size(); ++i)
      t.at(i).send(&Trainer::start, static_cast<int64_t>(i), g.replica_id, g.incarnation, manager);
  }
  const mesh::HostMesh& host_for(int64_t r) override { return run_.launcher->host_for(r); }
  bool replace_host(int64_t r, const std::string& why) override {
    return run_.launcher->host_lost(r, why);
  }
  void on_event(const std::string& line) override {
    if (run_.progress) std::printf(run_.live ? "\r%-110s\n" : "%s\n", line.c_str());
  }
  void on_commit(int64_t step, const ft::StepInfo& s) override {
    bool last = step == cfg_.steps;
    if (run_.progress && (run_.live ? step % 10 == 0 || last : step % run_.progress_every == 0)) {
      std::printf(
          "%s%sstep %5lld/%lld  loss %.4f  participants %lld/%lld  quorum %lld  faults %zu%s",
          run_.live ? "\r" : "", stamp(s.t_ns).c_str(), static_cast<long long>(step),
          static_cast<long long>(cfg_.steps), s.loss(), static_cast<long long>(s.participants),
          static_cast<long long>(cfg_.replicas), static_cast<long long>(s.quorum_id),
          faults().size(), run_.live && !last ? "   " : "\n");
      std::fflush(stdout);
    }
    inject_due(step);
  }

 private:
  TrainConfig cfg_;
  RunOptions run_;
  std::map<std::string, mesh::ActorMesh<Trainer>> trainers_;  // by mesh name
};

struct RunResult {
  std::string name;
  ft::RunStats s;
};

/// One run of the job on `hosts` with the caller's lighthouse (in this process or external; an
/// external one is not ours to stop: `own_lighthouse` false).
RunResult run_job(std::vector<mesh::HostMesh> hosts, ActorRef<ft::Lighthouse> lighthouse,
                  bool own_lighthouse, TrainConfig cfg, const RunOptions& run,
                  const ft::StoreServer& store) {
  cfg.client.store_host = store.host();
  cfg.client.store_port = store.port();
  cfg.client.store_namespace = run.name;
  cfg.client.ranks = cfg.ranks;
  cfg.client.max_steps = cfg.steps;
  auto& client = hosts.at(0).client();
  auto c = client.spawn<JobController>("controller." + run.name, hosts, lighthouse, cfg, run);
  auto spawn_timeout = monarch::config::global().duration("mesh.spawn_timeout");
  c.call(&JobController::spawn_all).get(spawn_timeout * 2);
  c.call(&JobController::start_all).get(spawn_timeout * 2);  // once the lighthouse has them all
  auto budget = monarch::config::global().duration("ft.step_timeout") * 6 +
                std::chrono::seconds(cfg.steps) + 120s;
  auto done = c.call(&JobController::done);
  if (!done.wait_for(budget)) c.call(&JobController::finish_now).get(spawn_timeout);
  RunResult res{run.name, done.get(spawn_timeout)};
  // Every group finished: stop the groups before the lighthouse, so that no manager heartbeats a
  // stopped one. A run cut short by finish_now may have ranks waiting for a quorum: the lighthouse
  // first then, so that they get an error at once and see the stop.
  const bool lighthouse_first = own_lighthouse && !res.s.error.empty();
  if (lighthouse_first) lighthouse.stop().get(spawn_timeout);
  c.call(&JobController::shutdown).get(spawn_timeout * 2);
  if (own_lighthouse && !lighthouse_first) lighthouse.stop().get(spawn_timeout);
  c.stop().get(spawn_timeout);
  if (!res.s.error.empty())
    throw std::runtime_error("the " + run.name + " run failed: " + res.s.error);
  return res;
}

}  // namespace

static int run(int argc, char** argv) {
  mesh::bootstrap(argc, argv);  // worker processes (replica ranks) serve here and never return
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  TrainConfig cfg;
  RunOptions run;
  run.live = ::isatty(STDOUT_FILENO) == 1;
  bool no_faults = false;
  std::string json_summary, out_dir = "ft_train_out", lighthouse_addr;
  ex::LauncherOptions lo;
  CLI::App app{"ft_train: fault-tolerant elastic training (monarch-cpp's main job)"};
  app.add_option("--model", cfg.model, "mlp (Fashion-MNIST) or llama-tiny");
  app.add_option("--steps", cfg.steps, "training steps (committed)")
      ->check(monarch::cli::integer_in(1, 1000000));
  app.add_option("--replicas", cfg.replicas, "replica groups")
      ->check(monarch::cli::integer_in(1, 64));
  app.add_option("--ranks", cfg.ranks, "ranks per replica group")
      ->check(monarch::cli::integer_in(1, 16));
  app.add_option("--faults", run.faults, "faults to inject in the faulty run")
      ->check(monarch::cli::integer_in(0, 1000));
  app.add_option("--seed", cfg.seed, "seed of the model, the data order and the fault injector")
      ->check(monarch::cli::unsigned_integer());
  app.add_flag("--no-faults", no_faults, "run only the fault-free run");
  app.add_option("--batch", cfg.global_batch, "global batch (samples per step, all groups)")
      ->check(monarch::cli::integer_in(1, 1 << 20));
  app.add_option("--lr", cfg.lr, "Adam learning rate")->check(monarch::cli::positive_number());
  app.add_option("--data", cfg.data_dir, "the model's data (default: its Debian package's)")
      ->check(monarch::cli::non_empty());
  app.add_option("--spares", run.spares, "warm spare groups (a failed group's quick replacement)")
      ->check(monarch::cli::integer_in(0, 16));
  app.add_flag_callback(
      "--no-fork-server", [&run] { run.fork_server = false; },
      "exec every group's procs instead of forking them from a fork server per host");
  app.add_option("--freeze-ms", run.freeze_ms, "how long a SIGSTOP fault freezes its victim")
      ->check(monarch::cli::integer_in(1, 5000));
  app.add_option("--json-summary", json_summary, "write the summary JSON here")
      ->check(monarch::cli::non_empty());
  app.add_option("--out", out_dir, "directory for metrics JSONL and the PNG chart")
      ->check(monarch::cli::non_empty());
  app.add_flag_callback(
      "--no-progress", [&run] { run.progress = false; }, "no progress and event lines");
  app.add_option("--progress-every", run.progress_every,
                 "when stdout is not a terminal: a plain progress line every N steps")
      ->check(monarch::cli::integer_in(1, 1000000));
  app.add_option("--lighthouse", lighthouse_addr,
                 "a standalone lighthouse (`monarch lighthouse --listen ADDR`) instead of one here")
      ->check(monarch::cli::non_empty());
  ex::add_launcher_flags(app, lo);  // --launcher, --slurm-*, --k8s-*
  ex::add_chaos_flags(app, run.chaos);
  if (int rc = monarch::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (auto problem = monarch::cli::tcp_secret_problem("--lighthouse", lighthouse_addr);
      !problem.empty()) {
    std::fprintf(stderr, "ft_train: %s\n", problem.c_str());
    return 2;
  }
  auto defaults = ex::workload_defaults(cfg.model);  // UsageError on an unknown model
  for (auto [v, d] : {std::pair{&cfg.steps, defaults.steps},
                      {&cfg.global_batch, defaults.batch},
                      {&cfg.eval_samples, defaults.eval_samples}})
    *v = *v ? *v : d;
  const bool faults = !no_faults && (run.faults > 0 || run.chaos.on);
  if (cfg.global_batch < cfg.replicas * cfg.ranks || (faults && cfg.replicas < 2)) {
    std::fprintf(stderr, "ft_train: %s\n",
                 faults && cfg.replicas < 2
                     ? "one replica group cannot heal a fault (no peer holds the state): "
                       "--replicas 2 or more, or --no-faults"
                     : "--batch is smaller than replicas x ranks");
    return 2;
  }
  try {
    if (run.chaos.on)
      run.faults = ex::prepare_chaos(run.chaos, cfg.replicas, run.freeze_ms, lighthouse_addr);
    // Fail before spawning anything on a bad model or missing data (the message names the package).
    auto probe = ex::make_workload({cfg.model, cfg.seed, cfg.data_dir, cfg.eval_samples});
    const std::string metric = run.metric = probe->metric();
    if (const long long epoch = probe->train_samples(); cfg.global_batch > epoch) {
      // Allowed before, and a step that big outlasted ft.collective_timeout on a 2-core box: every
      // allreduce timed out and the run ended with a quorum error that did not name the batch.
      std::fprintf(stderr,
                   "ft_train: --batch %lld is more than one epoch of %s's training data (%lld "
                   "samples): at most %lld\n",
                   static_cast<long long>(cfg.global_batch), cfg.model.c_str(), epoch, epoch);
      return 2;
    }
    probe.reset();
    auto& conf = monarch::config::global();
    if (conf.source("ft.quorum_every") == "default")
      cfg.client.quorum_every = defaults.quorum_every;
    double detect_s = static_cast<double>(std::max(conf.duration("ft.collective_timeout"),
                                                   conf.duration("ft.heartbeat_timeout"))
                                              .count()) /
                      1e3;
    // A SIGSTOP fault must outlast the lighthouse's heartbeat timeout (so the group is left out of
    // the quorum) but not the mesh's (which would declare the proc frozen and replace it).
    if (std::chrono::milliseconds(run.freeze_ms) + 2s > conf.duration("mesh.heartbeat_timeout"))
      conf.set("mesh.heartbeat_timeout", std::to_string(run.freeze_ms + 3000) + "ms");
    ex::make_dir("--out", out_dir);
    if (!json_summary.empty()) ex::write_file("--json-summary", json_summary, nullptr);
    ex::Launcher launcher(lo);
    ft::StoreServer store(launcher.advertise_host());
    std::vector<mesh::HostMesh> hosts = launcher.start_hosts(cfg.replicas);
    run.launcher = &launcher;
    auto one_run = [&](RunOptions o) {  // an external lighthouse outlives the job: not ours
      auto& client = hosts[0].client();
      if (!lighthouse_addr.empty())
        return run_job(hosts, ft::connect_lighthouse(client, lighthouse_addr, 30s), false, cfg, o,
                       store);
      if (o.chaos.on) {  // in a process of its own, which chaos freezes
        auto lh = ex::spawn_lighthouse_proc(hosts[0], o.name);
        o.chaos.lighthouse_pid = lh->pid;
        return run_job(hosts, lh->ref, true, cfg, o, store);
      }
      auto lighthouse =
          client.spawn<ft::Lighthouse>("lighthouse." + o.name, ft::LighthouseOptions{});
      return run_job(hosts, lighthouse, true, cfg, o, store);
    };
    const std::string lh = lighthouse_addr.empty() ? "" : ", lighthouse " + lighthouse_addr;
    std::printf(
        "ft_train: %s, %lld replica group(s) x %lld rank(s), %lld steps, batch %lld, seed %llu%s\n",
        cfg.model.c_str(), static_cast<long long>(cfg.replicas), static_cast<long long>(cfg.ranks),
        static_cast<long long>(cfg.steps), static_cast<long long>(cfg.global_batch),
        static_cast<unsigned long long>(cfg.seed), lh.c_str());
    RunOptions ff_opts = run;
    ff_opts.name = "fault_free";
    ff_opts.faults = 0;
    ff_opts.metrics_path = out_dir + "/fault_free.jsonl";
    RunResult fault_free = one_run(ff_opts);
    std::optional<RunResult> faulty;
    if (!no_faults && run.faults > 0) {
      run.name = "faulty";
      run.metrics_path = out_dir + "/faulty.jsonl";
      faulty = one_run(run);
    }
    const RunResult& main_run = faulty ? *faulty : fault_free;
    json summary = ex::run_json(main_run.s, metric, detect_s);
    json ffj = faulty ? ex::run_json(fault_free.s, metric, detect_s) : summary;
    // The heal's peers in bench_ft (docs/ft.md): this machine's copy speeds for the state's size,
    // measured once per job (the cold one reads 64 MiB or more, 9 times).
    summary["memcpy_gbps"] = ft::memcpy_gbps(main_run.s.state_bytes);
    summary["memcpy_cold_gbps"] = ft::memcpy_cold_gbps(main_run.s.state_bytes);
    ex::print_table(faulty ? &ffj : nullptr, summary, faulty ? fault_free.name : "", main_run.name);
    std::printf("  metric: %s; detection timeout %.2f s; stall bound %.2f s\n", metric.c_str(),
                detect_s, detect_s + 0.5);
    for (const char* k :
         {"metric_value", "test_accuracy", "committed_samples_per_s", "step_ms_p50"})
      summary[std::string(k) + "_fault_free"] = ffj[k];
    summary["replicas_bitwise_equal"] =
        main_run.s.replicas_bitwise_equal && fault_free.s.replicas_bitwise_equal;
    if (faulty) {
      try {
        ex::plot_loss_accuracy(out_dir + "/fault_free.jsonl", out_dir + "/faulty.jsonl",
                               out_dir + "/ft_train.png", "ft_train --model " + cfg.model, metric);
        std::printf("  chart: %s/ft_train.png; metrics: %s/{fault_free,faulty}.jsonl\n",
                    out_dir.c_str(), out_dir.c_str());
      } catch (const std::exception& e) {
        std::printf("  (no chart: %s)\n", e.what());
      }
    }
    if (!json_summary.empty()) {
      const std::string text = summary.dump(2) + "\n";
      ex::write_file("--json-summary", json_summary, &text);
      std::printf("  summary: %s\n", json_summary.c_str());
    }
    return summary["replicas_bitwise_equal"] == true && main_run.s.survivor_restarts == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_train: %s\n", e.what());
    return 1;
  }
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
