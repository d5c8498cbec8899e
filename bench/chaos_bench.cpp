// bench_chaos: the long chaos run of issue 16 (the harness of src/mesh/testing/chaos.hpp, shared
// with chaos_test): MONARCH_CHAOS_ROUNDS rounds (default 200) of seeded faults on 16 procs over
// 4 `monarch agent` processes, fan-out 2, under a stream of casts and calls. MONARCH_CHAOS_SEED
// reproduces a run.
//
//   chaos_recovery  from a SIGKILL to the first cast to survivors() that succeeded (sent once the
//                   MeshFailure was delivered), ms p50/p95 over the SIGKILL rounds. Next to it,
//                   "detection": from the SIGKILL to the MeshFailure (recovery includes it), and
//                   "target": detection + 5 ms, which monarch should be ahead of.
//   chaos_run       rounds, faults by kind, operations, violations (counts).
//
// Violations are printed on stderr with the seed and counted in chaos_run/violations. This binary
// is also the worker (bootstrap at the top of main).
#include <cstdio>
#include <string>
#include <vector>

#include "common/report.hpp"
#include "mesh/testing/chaos.hpp"

namespace chaos = monarch::testing::chaos;
using monarch::bench::percentile;
using monarch::bench::report;

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv, chaos::worker_setup);  // a worker never returns from here
  if (argc > 1) {  // settings come from the environment; any argument is a request for help
    const std::string a = argv[1];
    const bool help = a == "-h" || a == "--help";
    std::fprintf(help ? stdout : stderr,
                 "%s%s takes no arguments; it runs the chaos benchmark (200 rounds, a few "
                 "minutes) with settings from the environment:\n"
                 "  MONARCH_CHAOS_ROUNDS=N     rounds (default 200)\n"
                 "  MONARCH_CHAOS_SEED=N       the seed of a run to reproduce\n"
                 "  MONARCH_CHAOS_FAULTS=a,b   only these fault kinds (sigkill, sigstop_long, "
                 "sigstop_short, agent_restart)\n"
                 "  MONARCH_CHAOS_VERBOSE=1    print each round\n",
                 help ? "" : ("bench_chaos: unexpected argument '" + a + "'\n").c_str(), argv[0]);
    return help ? 0 : 2;
  }
  chaos::print_stack_on_crash();
  auto cfg = chaos::Config::from_env(200);
  cfg.cli = MONARCH_CLI;
  chaos::Report rep = chaos::Harness(cfg).run();

  nlohmann::json p = {{"procs", cfg.procs()},
                      {"fanout", cfg.fanout},
                      {"seed", rep.seed},
                      {"kills", rep.recover_ms.size()}};
  std::vector<double> target;  // per kill: its detection + 5 ms
  for (double d : rep.detect_ms) target.push_back(d + 5.0);
  for (double q : {0.5, 0.95}) {
    const std::string m = q == 0.5 ? "p50" : "p95";
    report("chaos_recovery", "monarch", m, percentile(rep.recover_ms, q), "ms", "lower", p);
    report("chaos_recovery", "detection", m, percentile(rep.detect_ms, q), "ms", "lower", p);
    report("chaos_recovery", "target", m, percentile(target, q), "ms", "lower", p);
  }
  nlohmann::json run = {{"seed", rep.seed}};
  report("chaos_run", "monarch", "rounds", static_cast<double>(rep.rounds), "count", "higher", run);
  report("chaos_run", "monarch", "respawns", static_cast<double>(rep.respawns), "count", "lower",
         run);
  report("chaos_run", "monarch", "ops", static_cast<double>(rep.ops), "count", "higher", run);
  report("chaos_run", "monarch", "ops_with_errors", static_cast<double>(rep.ops_failed), "count",
         "lower", run);
  for (const auto& [kind, n] : rep.faults) {
    report("chaos_faults", "monarch", kind, static_cast<double>(n), "count", "higher", run);
  }
  report("chaos_run", "monarch", "violations", static_cast<double>(rep.violations.size()), "count",
         "lower", run);
  report("chaos_run", "monarch", "seconds", rep.seconds, "s", "lower", run);
  // stderr: scripts/run-bench.sh keeps stdout in a log, and a violation must be seen.
  std::fprintf(stderr, "bench_chaos: seed %llu: %zu rounds, %zu violations\n",
               static_cast<unsigned long long>(rep.seed), rep.rounds, rep.violations.size());
  for (const auto& v : rep.violations) std::fprintf(stderr, "  %s\n", v.c_str());
  return 0;  // not 1: run-bench.sh stops at the first failing bench; the count is a metric
}
