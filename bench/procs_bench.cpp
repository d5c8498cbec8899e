// bench_procs: process meshes.
//
//   spawn_procs  this_host().spawn_procs({gpus: 16}) with one actor per proc, until every proc is
//                ready and the ActorMesh is looked up (ms, p50 over runs); peer "posix_spawn":
//                16 copies of this binary started with posix_spawn, each writing one line to a
//                pipe once its main() runs (the floor: process start alone, no runtime).
//
//   cast_gather_procs  call() (cast down the comm-actor tree, replies gathered in it) to 16 worker
//                processes x {1, 64, 256} actors each, us p50/p99; reduce_procs the same with Sum.
//                Peer "caf" (caf_procs_bench.cpp): CAF 0.17 io, 16 worker processes x the same
//                number of remote actors, one ping to each and every reply gathered.
//
// This binary is also the worker (bootstrap at the top of main), the posix_spawn peer
// (`--role ready`) and the CAF worker (`--role caf_worker PARENT_PID`). PROCS_BENCH_ONLY=caf runs
// only the CAF rows.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/report.hpp"
#include "monarch/mesh/process.hpp"

extern char** environ;

namespace procs_bench {
// caf_procs_bench.cpp
int caf_worker_role(const char* parent_pid);
void caf_cast_gather_procs(size_t procs, const std::vector<size_t>& ks, int warmup,
                           const std::function<int(size_t)>& iters);
}  // namespace procs_bench

namespace {

struct Probe : monarch::Actor {
  int ping() { return 1; }
  MONARCH_ENDPOINTS(Probe, ping)
};

constexpr size_t kProcs = 16;
constexpr int kRuns = 10;
constexpr int kWarmup = 10;  // cast_gather_procs iterations not timed, per mesh size
const std::vector<size_t> kActorsPerProc = {1, 64, 256};

int gather_iters(size_t actors_per_proc) {
  return actors_per_proc >= 256 ? 100 : 300;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

double posix_spawn_ready_ms() {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  std::string exe = self_exe();
  auto t0 = monarch::bench::Clock::now();
  std::vector<pid_t> pids;
  for (size_t i = 0; i < kProcs; ++i) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    char role[] = "--role", ready[] = "ready";
    char* argv[] = {exe.data(), role, ready, nullptr};
    pid_t pid;
    if (posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ) == 0) pids.push_back(pid);
    posix_spawn_file_actions_destroy(&fa);
  }
  ::close(fds[1]);
  size_t lines = 0;
  char buf[256];
  while (lines < pids.size()) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) lines += buf[i] == '\n';
  }
  double ms = monarch::bench::us_since(t0) / 1000.0;
  ::close(fds[0]);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv, [](monarch::Proc& proc, const monarch::mesh::WorkerInfo&) {
    monarch::mesh::register_cast<Probe>(&Probe::ping);
    proc.register_name("probe", proc.spawn<Probe>("probe"));
  });
  if (argc >= 3 && std::strcmp(argv[1], "--role") == 0) {
    if (argc == 4 && std::strcmp(argv[2], "caf_worker") == 0)
      return procs_bench::caf_worker_role(argv[3]);
    std::printf("ready\n");
    return 0;
  }
  // PROCS_BENCH_ONLY=caf runs only the CAF peer of cast_gather_procs; =gather1 only its monarch
  // row at 1 actor per proc (py_bench alternates it with the Python front end's gather).
  const char* only = std::getenv("PROCS_BENCH_ONLY");
  if (only != nullptr && std::strcmp(only, "caf") == 0) {
    procs_bench::caf_cast_gather_procs(kProcs, kActorsPerProc, kWarmup, gather_iters);
    return 0;
  }
  const bool gather1 = only != nullptr && std::strcmp(only, "gather1") == 0;
  if (only != nullptr && !gather1) {
    std::fprintf(stderr, "bench_procs: PROCS_BENCH_ONLY=%s: expected caf or gather1\n", only);
    return 2;
  }
  auto host = monarch::mesh::this_host();
  using monarch::bench::percentile;
  using monarch::bench::report;
  if (!gather1) {  // spawn_procs: not part of gather1
    std::vector<double> monarch_ms, first_call_ms, peer_ms;
    for (int run = 0; run < kRuns; ++run) {
      auto t0 = monarch::bench::Clock::now();
      auto procs = host.spawn_procs({{"gpus", kProcs}});
      auto probes = procs.lookup<Probe>("probe");
      monarch_ms.push_back(monarch::bench::us_since(t0) / 1000.0);
      probes.call(&Probe::ping).get(std::chrono::seconds(10)).throw_if_failed();
      first_call_ms.push_back(monarch::bench::us_since(t0) / 1000.0);
      procs.stop();
      peer_ms.push_back(posix_spawn_ready_ms());
    }
    nlohmann::json p = {{"procs", kProcs}, {"runs", kRuns}};
    report("spawn_procs", "monarch", "p50", percentile(monarch_ms, 0.5), "ms", "lower", p);
    report("spawn_procs", "monarch", "max", percentile(monarch_ms, 1.0), "ms", "lower", p);
    report("spawn_procs_first_call", "monarch", "p50", percentile(first_call_ms, 0.5), "ms",
           "lower", p);
    report("spawn_procs", "posix_spawn", "p50", percentile(peer_ms, 0.5), "ms", "lower", p);
  }

  // Cast + gather / reduce over worker processes (issue 5 target: 4096 actors on 16 procs <= 2 ms
  // p50).
  auto procs = host.spawn_procs({{"procs", kProcs}});
  for (size_t k : kActorsPerProc) {
    if (gather1 && k != 1) continue;
    auto mesh = procs.spawn<Probe>("probe" + std::to_string(k), {{"actors", k}});
    const int iters = gather_iters(k);
    std::vector<double> gather_us, reduce_us;
    for (int i = 0; i < iters + kWarmup; ++i) {
      auto t0 = monarch::bench::Clock::now();
      auto all = mesh.call(&Probe::ping).get(std::chrono::seconds(30));
      if (i >= kWarmup) gather_us.push_back(monarch::bench::us_since(t0));
      if (all.size() != kProcs * k) std::abort();
      t0 = monarch::bench::Clock::now();
      int sum = mesh.reduce(monarch::mesh::Sum{}, &Probe::ping).get(std::chrono::seconds(30));
      if (i >= kWarmup) reduce_us.push_back(monarch::bench::us_since(t0));
      if (sum != static_cast<int>(kProcs * k)) std::abort();
    }
    nlohmann::json q = {{"procs", kProcs}, {"actors_per_proc", k}, {"actors", kProcs * k}};
    report("cast_gather_procs", "monarch", "p50", percentile(gather_us, 0.5), "us", "lower", q);
    report("cast_gather_procs", "monarch", "p99", percentile(gather_us, 0.99), "us", "lower", q);
    report("reduce_procs", "monarch", "p50", percentile(reduce_us, 0.5), "us", "lower", q);
  }
  procs.stop();
  if (gather1) return 0;

  // CAF peer of cast_gather_procs, after monarch's workers are gone (same counts).
  procs_bench::caf_cast_gather_procs(kProcs, kActorsPerProc, kWarmup, gather_iters);
  return 0;
}
