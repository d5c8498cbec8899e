// The chaos test of issue 16, short version (in `make test`): a few rounds of the harness in
// chaos.hpp (16 procs over 4 `monarch agent` processes, fan-out 2, seeded faults on leaves,
// interior nodes and proc 0 under a stream of casts, calls, reductions and direct calls). The long
// version is bench/chaos_bench.cpp. MONARCH_CHAOS_SEED reproduces a run, MONARCH_CHAOS_ROUNDS
// lengthens it, MONARCH_CHAOS_FAULTS=sigkill,agent_restart keeps only those kinds,
// MONARCH_CHAOS_VERBOSE prints what the fault hook receives.
//
// This binary is also the worker: main() calls bootstrap() first.
#include "mesh/testing/chaos.hpp"

#include <gtest/gtest.h>

namespace {

namespace chaos = monarch::testing::chaos;

// CHAOS-1..6 (chaos.hpp) over four rounds: one of each fault kind, each target class at least once.
TEST(Chaos, FaultsUnderLoadKeepEveryInvariant) {
  auto cfg = chaos::Config::from_env(4);
  cfg.cli = MONARCH_CLI;
  chaos::Report rep = chaos::Harness(cfg).run();
  EXPECT_EQ(rep.rounds, cfg.rounds);
  EXPECT_GE(rep.ops, rep.rounds * cfg.clients * (cfg.ops_before_fault + cfg.ops_after_detection))
      << "the load did not run";
  for (const auto& v : rep.violations) ADD_FAILURE() << v;
  std::printf("chaos: seed %llu, %zu rounds, %zu ops (%zu with errors), %zu respawns, %.1f s\n",
              static_cast<unsigned long long>(rep.seed), rep.rounds, rep.ops, rep.ops_failed,
              rep.respawns, rep.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv, chaos::worker_setup);  // a worker never returns from here
  chaos::print_stack_on_crash();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
