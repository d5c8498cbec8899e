// Quorum change of fault-tolerant training: how long until a new gloo group of 4 processes
// carries its first allreduce, the old group torn down first (what every member of a new quorum
// does before it trains on). monarch's AllreduceGroup::configure against the peer's idiom, a
// fresh c10d ProcessGroupGloo on a PrefixStore per quorum with its own device (what torchft's
// ProcessGroupGloo.configure does, and torch.distributed.new_group does by default).
//
// 4 forked processes on one TCPStore (StoreServer) on loopback; rounds alternate the two sides
// (A B A B ...), BENCH_FT_RECONFIGURE_ROUNDS per side (default 30). A round's time is the
// slowest rank's (the group is usable when its last member is); the figure is the median over
// rounds, with its spread. One line per side, unit ms, lower is better.
#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "common/report.hpp"
#include "monarch/ft/torch/allreduce.hpp"

namespace {

using monarch::bench::Clock;
using monarch::bench::us_since;
constexpr int kWorld = 4;

// One rank: `rounds` rounds per side, alternating; writes "side round ms" lines to `out`.
int rank_main(int rank, uint16_t port, int rounds, FILE* out) {
  const auto timeout = std::chrono::milliseconds(10000);
  monarch::ft::AllreduceGroup ours;
  c10d::TCPStoreOptions so;
  so.port = port;
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  c10::intrusive_ptr<c10d::ProcessGroup> peer;
  float x = 1.0f;
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < 2; ++side) {
      const std::string prefix = "r" + std::to_string(r) + (side == 0 ? "/monarch" : "/c10d");
      auto t0 = Clock::now();
      if (side == 0) {
        ours.configure("127.0.0.1", port, prefix, rank, kWorld, timeout);
        ours.allreduce_sum(std::span<float>(&x, 1));
        std::fprintf(out, "0 %d %.4f\n", r, us_since(t0) / 1e3);  // configure dropped the old group
      } else {
        peer.reset();  // the previous quorum's group goes first
        auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        opts->threads = 1;
        peer = c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, kWorld, opts);
        std::vector<at::Tensor> t{at::from_blob(&x, {1}, at::kFloat)};
        peer->allreduce(t)->wait();
        std::fprintf(out, "1 %d %.4f\n", r, us_since(t0) / 1e3);
      }
    }
  }
  peer.reset();
  std::fflush(out);
  return 0;
}

}  // namespace

int main() {
  const char* env = std::getenv("BENCH_FT_RECONFIGURE_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 30;
  // Fork the ranks before this process starts threads (the store's); each waits for the port.
  std::vector<pid_t> pids;
  std::vector<int> port_w, res_r;
  for (int rank = 0; rank < kWorld; ++rank) {
    int pp[2], rp[2];
    if (::pipe(pp) != 0 || ::pipe(rp) != 0) return 1;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pp[1]);
      ::close(rp[0]);
      uint16_t port = 0;
      if (::read(pp[0], &port, sizeof port) != sizeof port) ::_exit(1);
      FILE* out = ::fdopen(rp[1], "w");
      int rc = 1;
      try {
        rc = rank_main(rank, port, rounds, out);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_ft_reconfigure rank %d: %s\n", rank, e.what());
      }
      std::fclose(out);
      ::_exit(rc);
    }
    ::close(pp[0]);
    ::close(rp[1]);
    pids.push_back(pid);
    port_w.push_back(pp[1]);
    res_r.push_back(rp[0]);
  }
  monarch::ft::StoreServer server("127.0.0.1");
  const uint16_t port = server.port();
  for (int fd : port_w) {
    if (::write(fd, &port, sizeof port) != sizeof port) return 1;
    ::close(fd);
  }
  // round time = the slowest rank's, per side
  std::vector<std::vector<double>> worst(2, std::vector<double>(static_cast<size_t>(rounds), 0));
  for (int fd : res_r) {
    FILE* in = ::fdopen(fd, "r");
    int side = 0, r = 0;
    double ms = 0;
    while (std::fscanf(in, "%d %d %lf", &side, &r, &ms) == 3) {
      if (side < 0 || side > 1 || r < 0 || r >= rounds) continue;
      auto& w = worst[static_cast<size_t>(side)][static_cast<size_t>(r)];
      w = std::max(w, ms);
    }
    std::fclose(in);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  if (!ok) {
    std::fprintf(stderr, "bench_ft_reconfigure: a rank failed\n");
    return 1;
  }
  const char* impl[2] = {"monarch", "c10d_gloo"};
  for (int side = 0; side < 2; ++side) {
    auto& v = worst[static_cast<size_t>(side)];
    monarch::bench::report(
        "ft_reconfigure", impl[side], "p50", monarch::bench::percentile(v, 0.5), "ms", "lower",
        {{"world", kWorld},
         {"rounds", rounds},
         {"spread",
          {*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())}}});
  }
  return 0;
}
