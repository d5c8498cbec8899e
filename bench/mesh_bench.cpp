// Mesh cast benchmarks: monarch's cast tree vs CAF 0.17 (the CAF half is caf_mesh_bench.cpp).
//
// Both sides run in one process, one after the other, with 2 worker threads each, and time from
// a caller outside the actor system until the gathered result is in its hands:
//   cast_gather  call() to every member of 16 procs x {1, 64, 256} actors and gather the replies
//                (monarch: ValueMesh through the cast tree; CAF: one gather actor sends to every
//                leaf and counts the replies); p50/p99 in us over kSamples casts after a warm-up.
//   cast_reduce  the same with reduce(Sum) (monarch only: CAF has no in-tree reduction; its
//                cast_gather already sums).
//   cast_100k    one cast + reduction to 100k actors (monarch: 1000 procs x 100): "time" is the
//                median of 5, "first" the first cast (cold caches), ms.
//   idle_actor   memory per idle actor: RSS growth / actors after spawning 100k (bytes).
// Environment: MESH_BENCH_IMPL=monarch|caf runs one side only; MESH_BENCH_CAF_POLICY=stealing
// runs CAF with its default work-stealing scheduler (reported as "caf_stealing"; default: CAF's
// "sharing" policy, its faster one for this fan-out).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/report.hpp"
#include "monarch/mesh/proc_mesh.hpp"

namespace mesh_bench {
// Defined in caf_mesh_bench.cpp (CAF headers are not -Wpedantic clean).
void run_caf(int workers, const std::vector<int>& sizes, int warmup, int samples, int big);
}  // namespace mesh_bench

namespace {

using monarch::bench::Clock;
using monarch::bench::report;

constexpr int kWorkers = 2;
constexpr int kProcs = 16;
constexpr int kWarmup = 50;
constexpr int kSamples = 500;
constexpr int kBigProcs = 1000;
constexpr int kBigPerProc = 100;

struct Leaf : monarch::Actor {
  long ping(long x) { return x + 1; }
  MONARCH_ENDPOINTS(Leaf, ping)
};

double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void run_monarch() {
  monarch::ProcOptions opts;
  opts.workers = kWorkers;
  for (int per_proc : {1, 64, 256}) {
    auto procs = monarch::mesh::ProcMesh::local({{"procs", kProcs}}, opts);
    auto leaves = procs.spawn<Leaf>(
        "leaf", monarch::ndslice::Extent{{"actors", static_cast<size_t>(per_proc)}});
    const int n = kProcs * per_proc;
    nlohmann::json params = {{"procs", kProcs}, {"per_proc", per_proc}, {"actors", n}};
    std::vector<double> gather, reduce;
    long sink = 0;
    for (int i = 0; i < kWarmup + kSamples; ++i) {
      auto t0 = Clock::now();
      auto v = leaves.call(&Leaf::ping, 1L).get(std::chrono::seconds(30));
      double us = monarch::bench::us_since(t0);
      sink += v[0];
      if (i >= kWarmup) gather.push_back(us);
    }
    for (int i = 0; i < kWarmup + kSamples; ++i) {
      auto t0 = Clock::now();
      sink += leaves.reduce(monarch::mesh::Sum{}, &Leaf::ping, 1L).get(std::chrono::seconds(30));
      double us = monarch::bench::us_since(t0);
      if (i >= kWarmup) reduce.push_back(us);
    }
    if (sink == 42) std::printf(" ");
    report("cast_gather", "monarch", "p50", monarch::bench::percentile(gather, 0.5), "us", "lower",
           params);
    report("cast_gather", "monarch", "p99", monarch::bench::percentile(gather, 0.99), "us", "lower",
           params);
    report("cast_reduce", "monarch", "p50", monarch::bench::percentile(reduce, 0.5), "us", "lower",
           params);
    report("cast_reduce", "monarch", "p99", monarch::bench::percentile(reduce, 0.99), "us", "lower",
           params);
  }
  {
    auto procs = monarch::mesh::ProcMesh::local({{"procs", kBigProcs}}, opts);
    // Warm the allocator's arenas and the procs, then measure what 100k idle actors add.
    double before = rss_bytes();
    auto leaves = procs.spawn<Leaf>(
        "leaf", monarch::ndslice::Extent{{"actors", static_cast<size_t>(kBigPerProc)}});
    const long n = static_cast<long>(leaves.size());
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      long sum = leaves.reduce(monarch::mesh::Sum{}, &Leaf::ping, 0L).get(std::chrono::seconds(60));
      ms.push_back(monarch::bench::us_since(t0) / 1e3);
      if (sum != n) std::fprintf(stderr, "cast_100k: wrong sum %ld\n", sum);
      if (i == 0) {
        report("idle_actor", "monarch", "memory", (rss_bytes() - before) / static_cast<double>(n),
               "bytes", "lower", {{"actors", n}});
      }
    }
    report("cast_100k", "monarch", "time", monarch::bench::percentile(ms, 0.5), "ms", "lower",
           {{"actors", n}});
    report("cast_100k", "monarch", "first", ms[0], "ms", "lower", {{"actors", n}});
  }
}

}  // namespace

int main() {
  const char* impl = std::getenv("MESH_BENCH_IMPL");
  std::string which = impl != nullptr ? impl : "";
  if (which.empty() || which == "monarch") run_monarch();
  if (which.empty() || which == "caf") {
    mesh_bench::run_caf(kWorkers, {kProcs * 1, kProcs * 64, kProcs * 256}, kWarmup, kSamples,
                        kBigProcs * kBigPerProc);
  }
  return 0;
}
