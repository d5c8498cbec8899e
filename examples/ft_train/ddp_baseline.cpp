// ddp_baseline: plain static data-parallel training of the ft_train model, N worker processes
// on this host with one fixed gloo group and no fault tolerance. It is the reference the FT job
// is measured against (per-step overhead, accuracy) and a smoke test of the libtorch pieces:
//   build/bin/ddp_baseline --replicas 4 --steps 700 --metrics /tmp/ddp.jsonl
// The parent hosts the StoreServer and spawns itself with --worker for each rank. Rank 0 writes
// the metrics JSONL ({"step","loss"} per step, plus "accuracy" every --eval-every steps) and the
// summary; every rank checks at the end that all replicas hold bitwise-equal state.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_checks.hpp"
#include "fashion_mnist.hpp"
#include "model.hpp"
#include "monarch/ft/torch/allreduce.hpp"
#include "monarch/run_main.hpp"
#include "plot.hpp"

extern char** environ;

namespace ex = monarch::ft::example;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int replicas = 4;
  long steps = 700;
  long global_batch = 256;
  double lr = 1e-3;
  std::uint64_t seed = 1;
  long eval_every = 100;
  std::string data_dir = ex::kFashionMnistDir;
  std::string metrics;
  std::string json_summary;
  // worker only
  bool worker = false;
  int rank = 0;
  int port = 0;
};

double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

int worker(const Options& o) {
  ex::init_torch_worker(1);
  auto train = ex::load_fashion_mnist(o.data_dir, ex::Split::train);
  auto test = ex::load_fashion_mnist(o.data_dir, ex::Split::test);
  ex::Model model(o.seed);
  ex::Sampler sampler(train.size, o.seed);
  monarch::ft::AllreduceGroup group;
  group.configure("127.0.0.1", static_cast<std::uint16_t>(o.port), "ddp", o.rank, o.replicas,
                  std::chrono::seconds(60));
  auto& state = model.state();
  std::ofstream metrics;
  if (o.rank == 0 && !o.metrics.empty()) metrics.open(o.metrics);
  std::vector<double> fb_ms, ar_ms, opt_ms, step_ms;
  const auto start = Clock::now();
  auto prev_end = start;
  double accuracy = 0;
  for (long step = 1; step <= o.steps; ++step) {
    auto t0 = Clock::now();
    auto idx = sampler.shard(state.data_position(), o.global_batch, o.rank, o.replicas);
    double loss = model.forward_backward(train, idx);
    auto t1 = Clock::now();
    group.allreduce_sum(state.grads());
    state.scale_grads(1.0f / static_cast<float>(o.replicas));
    auto t2 = Clock::now();
    state.adam_step({.lr = o.lr});
    state.set_data_position(state.data_position() + o.global_batch);
    auto t3 = Clock::now();
    fb_ms.push_back(ms(t1 - t0));
    ar_ms.push_back(ms(t2 - t1));
    opt_ms.push_back(ms(t3 - t2));
    nlohmann::json line{{"step", step}, {"loss", loss}};
    if (step % o.eval_every == 0 || step == o.steps) {
      accuracy = model.evaluate(test);  // every rank: keeps them in lockstep
      line["accuracy"] = accuracy;
      if (o.rank == 0) {
        std::printf("step %ld loss %.4f test accuracy %.2f%% (%.1f s)\n", step, loss,
                    100 * accuracy, std::chrono::duration<double>(Clock::now() - start).count());
        std::fflush(stdout);
      }
    }
    if (metrics.is_open()) metrics << line.dump() << "\n";
    // step_ms is the gap between consecutive step ends, as ft_train's (the gap between its
    // commits), so that bench_ft compares like with like; an evaluation step's gap is a tail.
    const auto end = Clock::now();
    step_ms.push_back(ms(end - prev_end));
    prev_end = end;
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();

  // Gather every rank's state hash (as four exact 16-bit chunks) and compare.
  std::vector<float> hashes(static_cast<std::size_t>(o.replicas) * 4, 0.0f);
  const std::uint64_t h = state.hash();
  for (int c = 0; c < 4; ++c) {
    hashes[static_cast<std::size_t>(o.rank * 4 + c)] = static_cast<float>((h >> (16 * c)) & 0xffff);
  }
  group.allreduce_sum(hashes);
  bool equal = true;
  for (int r = 1; r < o.replicas; ++r) {
    equal = equal && std::equal(hashes.begin(), hashes.begin() + 4, hashes.begin() + r * 4);
  }
  if (o.rank == 0) {
    nlohmann::json summary{
        {"replicas", o.replicas},
        {"steps", o.steps},
        {"global_batch", o.global_batch},
        {"test_accuracy", accuracy},
        {"replicas_bitwise_equal", equal},
        {"wall_s", wall_s},
        {"samples_per_s", static_cast<double>(o.steps * o.global_batch) / wall_s},
        {"step_ms_p50", percentile(step_ms, 0.5)},
        {"step_ms_p95", percentile(step_ms, 0.95)},
        {"forward_backward_ms_p50", percentile(fb_ms, 0.5)},
        {"allreduce_ms_p50", percentile(ar_ms, 0.5)},
        {"optimizer_ms_p50", percentile(opt_ms, 0.5)},
        {"params", state.num_params()},
    };
    std::cout << summary.dump(2) << std::endl;
    if (!o.json_summary.empty()) {
      const std::string text = summary.dump(2) + "\n";
      ex::write_file("--json-summary", o.json_summary, &text);
    }
  }
  return equal ? 0 : 3;
}

}  // namespace

static int run(int argc, char** argv) {
  Options o;
  CLI::App app{"Static gloo data-parallel training of the ft_train MLP (the FT baseline)"};
  app.add_option("--replicas", o.replicas, "worker processes")
      ->check(monarch::cli::integer_in(1, 64));
  app.add_option("--steps", o.steps, "optimizer steps")
      ->check(monarch::cli::integer_in(1, 1000000));
  app.add_option("--batch", o.global_batch, "global batch (samples per step over all replicas)")
      ->check(monarch::cli::integer_in(1, 1 << 20));
  app.add_option("--lr", o.lr, "Adam learning rate")->check(monarch::cli::positive_number());
  app.add_option("--seed", o.seed, "model init and data order seed")
      ->check(monarch::cli::unsigned_integer());
  app.add_option("--eval-every", o.eval_every, "test-set evaluation period in steps")
      ->check(monarch::cli::integer_in(1, 1000000));
  app.add_option("--data", o.data_dir, "Fashion-MNIST directory");
  app.add_option("--metrics", o.metrics, "JSONL metrics output (rank 0)");
  app.add_option("--json-summary", o.json_summary, "summary JSON output");
  app.add_flag("--worker", o.worker)->group("");
  app.add_option("--rank", o.rank)->group("");
  app.add_option("--port", o.port)->group("");
  if (int rc = monarch::cli::parse(app, argc, argv); rc >= 0) return rc;
  try {
    if (o.worker) return worker(o);
    // Fail early (and readably) when the data is missing, before spawning workers.
    ex::load_fashion_mnist(o.data_dir, ex::Split::test);
    if (!o.json_summary.empty()) ex::write_file("--json-summary", o.json_summary, nullptr);
    monarch::ft::StoreServer store;
    std::vector<pid_t> pids;
    for (int r = 0; r < o.replicas; ++r) {
      std::vector<std::string> args(argv, argv + argc);
      for (const auto& a : {std::string("--worker"), "--rank=" + std::to_string(r),
                            "--port=" + std::to_string(store.port())}) {
        args.push_back(a);
      }
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      pid_t pid = 0;
      if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) != 0) {
        std::cerr << "ddp_baseline: cannot spawn worker " << r << "\n";
        return 1;
      }
      pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    if (failed != 0) std::cerr << "ddp_baseline: " << failed << " worker(s) failed\n";
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "ddp_baseline: " << e.what() << "\n";
    return 1;
  }
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
