// CAF 0.17 half of bench_procs' cast_gather_procs (see procs_bench.cpp): the same number of
// remote actors in 16 worker processes, one ping to each and every reply gathered, per iteration.
//
// Workers: this binary re-executed as `--role caf_worker PARENT_PID` (posix_spawn, stdout on a
// pipe). Each sets PR_SET_PDEATHSIG(SIGKILL) (and exits if its parent is already gone), runs an
// actor_system with caf::io::middleman and scheduler.max-threads 2 (like the other CAF peers),
// publishes on 127.0.0.1 port 0 a directory actor, and writes "PORT <n>\n" to the pipe. The
// directory answers (leaves_atom, k) by spawning k leaf actors (a leaf answers an int with that
// int) and replying with their handles (std::vector<caf::actor>, a CAF builtin type).
//
// Client (this process): remote_actor() to each directory, asks each for k leaves (CAF makes a
// proxy per remote leaf), then times, per iteration, a scoped_actor plain-sending one int to
// every remote leaf and receiving every reply (their sum is checked). Plain send, with replies
// arriving as ordinary messages, skips request ids and per-request timeouts. Of the idioms tried
// this was the fastest here: an event-based gather actor in the client doing the same sends and
// counting replies (as bench_mesh's CAF peer does, timed by a request from a scoped_actor) was
// ~15-25% slower at 16x64 and 16x256 over 6 alternating runs each on this loaded 2-core box
// (e.g. 16x64 p50 ~12 ms vs ~10 ms). CAF has no trees: this is a flat fan-out over one TCP
// connection per worker, and a reply times out after 30 s of silence (the rows are then skipped).
//
// Scheduler policy: CAF's central-queue "sharing" policy in client and workers by default (as in
// bench_mesh's CAF peer; 0.17's work-stealing deque steals in O(queue length)); here the default
// work-stealing policy was 2-4x slower (16x64 p50 39 ms vs 11 ms, back to back).
// PROCS_BENCH_CAF_POLICY=stealing keeps it and reports impl "caf_stealing".
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#pragma GCC diagnostic pop

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/report.hpp"

extern char** environ;

namespace procs_bench {

namespace {

using monarch::bench::Clock;
using leaves_atom = caf::atom_constant<caf::atom("leaves")>;

constexpr int kStartTimeoutMs = 10000;  // a worker must report its port within this

bool stealing_policy() {
  const char* pol = std::getenv("PROCS_BENCH_CAF_POLICY");
  return pol != nullptr && std::string(pol) == "stealing";
}

void configure(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  cfg.set("scheduler.max-threads", 2);
  if (!stealing_policy()) cfg.set("scheduler.policy", caf::atom("sharing"));
}

caf::behavior leaf_fun(caf::event_based_actor*) {
  return {[](int x) { return x; }};
}

// Spawns k leaves per request; the previous request's leaves are told to exit.
caf::behavior directory_fun(caf::event_based_actor* self) {
  auto mine = std::make_shared<std::vector<caf::actor>>();
  return {[self, mine](leaves_atom, int k) {
    for (const auto& l : *mine) self->send_exit(l, caf::exit_reason::user_shutdown);
    mine->clear();
    for (int i = 0; i < k; ++i) mine->push_back(self->spawn(leaf_fun));
    return *mine;
  }};
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;        // read end of the worker's stdout pipe
  std::string out{};  // what it wrote so far
  uint16_t port = 0;  // 0 until "PORT n" was read
};

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

std::string exit_text(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, WNOHANG) != pid) return "still running";
  if (WIFEXITED(st)) return "exited with code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + strsignal(WTERMSIG(st));
  return "stopped";
}

void stop_workers(std::vector<Worker>& ws) {
  for (auto& w : ws) {
    if (w.fd >= 0) ::close(w.fd);
    w.fd = -1;
    if (w.pid > 0) {
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
    }
    w.pid = -1;
  }
}

// Starts n workers and waits (up to kStartTimeoutMs in all) for each one's port. On failure
// prints which worker failed and why, stops them all and returns false.
bool start_workers(size_t n, std::vector<Worker>& ws) {
  std::string exe = self_exe();
  std::string parent = std::to_string(::getpid());
  for (size_t i = 0; i < n; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "bench_procs: caf worker %zu: pipe: %s\n", i, std::strerror(errno));
      stop_workers(ws);
      return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    char role[] = "--role", name[] = "caf_worker";
    char* argv[] = {exe.data(), role, name, parent.data(), nullptr};
    Worker w;
    int rc = posix_spawn(&w.pid, exe.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    w.fd = fds[0];
    if (rc != 0) {
      std::fprintf(stderr, "bench_procs: caf worker %zu: posix_spawn %s: %s\n", i, exe.c_str(),
                   std::strerror(rc));
      w.pid = -1;
      ws.push_back(w);
      stop_workers(ws);
      return false;
    }
    ws.push_back(w);
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(kStartTimeoutMs);
  size_t ready = 0;
  while (ready < ws.size()) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    std::vector<pollfd> pfds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].port == 0) {
        pfds.push_back({ws[i].fd, POLLIN, 0});
        idx.push_back(i);
      }
    }
    int r = ::poll(pfds.data(), pfds.size(), static_cast<int>(left));
    if (r < 0 && errno != EINTR) break;
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (pfds[j].revents == 0) continue;
      Worker& w = ws[idx[j]];
      char buf[128];
      ssize_t got = ::read(w.fd, buf, sizeof buf);
      if (got <= 0) {
        std::fprintf(stderr,
                     "bench_procs: caf worker %zu (pid %d) closed its pipe before reporting a port "
                     "(%s); skipping the caf cast_gather_procs rows\n",
                     idx[j], static_cast<int>(w.pid), exit_text(w.pid).c_str());
        stop_workers(ws);
        return false;
      }
      w.out.append(buf, static_cast<size_t>(got));
      unsigned port = 0;
      if (w.out.find('\n') != std::string::npos) {
        if (std::sscanf(w.out.c_str(), "PORT %u", &port) != 1 || port == 0 || port > 65535) {
          std::fprintf(stderr,
                       "bench_procs: caf worker %zu (pid %d) wrote '%s', not 'PORT n'; "
                       "skipping the caf cast_gather_procs rows\n",
                       idx[j], static_cast<int>(w.pid), w.out.substr(0, w.out.find('\n')).c_str());
          stop_workers(ws);
          return false;
        }
        w.port = static_cast<uint16_t>(port);
        ++ready;
      }
    }
  }
  if (ready < ws.size()) {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].port == 0) {
        std::fprintf(stderr,
                     "bench_procs: caf worker %zu (pid %d) did not report its port within %d ms "
                     "(%s); skipping the caf cast_gather_procs rows\n",
                     i, static_cast<int>(ws[i].pid), kStartTimeoutMs, exit_text(ws[i].pid).c_str());
        break;
      }
    }
    stop_workers(ws);
    return false;
  }
  return true;
}

// Runs the timed part with the workers up; false (after printing why) on any failure.
bool run_client(const std::vector<Worker>& ws, const std::vector<size_t>& ks, int warmup,
                const std::function<int(size_t)>& iters) {
  caf::actor_system_config cfg;
  configure(cfg);
  caf::actor_system sys{cfg};
  const std::string impl = stealing_policy() ? "caf_stealing" : "caf";
  std::vector<caf::actor> dirs;
  for (size_t i = 0; i < ws.size(); ++i) {
    auto dir = sys.middleman().remote_actor("127.0.0.1", ws[i].port);
    if (!dir) {
      std::fprintf(stderr,
                   "bench_procs: caf remote_actor to worker %zu (127.0.0.1:%u) failed: %s\n", i,
                   static_cast<unsigned>(ws[i].port), sys.render(dir.error()).c_str());
      return false;
    }
    dirs.push_back(*dir);
  }
  bool ok = true;
  {
    caf::scoped_actor self{sys};
    for (size_t k : ks) {
      std::vector<caf::actor> leaves;
      for (size_t i = 0; i < dirs.size() && ok; ++i) {
        self->request(dirs[i], std::chrono::seconds(30), leaves_atom::value, static_cast<int>(k))
            .receive(
                [&](const std::vector<caf::actor>& got) {
                  if (got.size() != k) {
                    std::fprintf(stderr, "bench_procs: caf worker %zu gave %zu leaves, asked %zu\n",
                                 i, got.size(), k);
                    ok = false;
                  }
                  leaves.insert(leaves.end(), got.begin(), got.end());
                },
                [&](caf::error& e) {
                  std::fprintf(stderr,
                               "bench_procs: caf worker %zu: asking for %zu leaves failed: %s\n", i,
                               k, sys.render(e).c_str());
                  ok = false;
                });
      }
      if (!ok) break;
      const int want = static_cast<int>(leaves.size());
      std::vector<double> us;
      const int n = iters(k);
      for (int i = 0; i < warmup + n && ok; ++i) {
        auto t0 = Clock::now();
        for (const auto& leaf : leaves) self->send(leaf, 1);
        int sum = 0;
        int got = 0;
        self->do_receive(
                [&](int r) {
                  sum += r;
                  ++got;
                },
                caf::after(std::chrono::seconds(30)) >>
                    [&] {
                      std::fprintf(stderr,
                                   "bench_procs: caf gather: %d of %d remote leaves answered, then "
                                   "none for 30 s\n",
                                   got, want);
                      ok = false;
                    })
            .until([&] { return got == want || !ok; });
        if (ok && sum != want) {
          std::fprintf(stderr, "bench_procs: caf gather of %d leaves summed to %d\n", want, sum);
          ok = false;
        }
        if (i >= warmup) us.push_back(monarch::bench::us_since(t0));
      }
      if (!ok) break;
      nlohmann::json q = {{"procs", ws.size()}, {"actors_per_proc", k}, {"actors", leaves.size()}};
      using monarch::bench::percentile;
      monarch::bench::report("cast_gather_procs", impl, "p50", percentile(us, 0.5), "us", "lower",
                             q);
      monarch::bench::report("cast_gather_procs", impl, "p99", percentile(us, 0.99), "us", "lower",
                             q);
    }
    for (const auto& d : dirs) self->send_exit(d, caf::exit_reason::user_shutdown);
  }
  return ok;
}

}  // namespace

int caf_worker_role(const char* parent_pid) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != static_cast<pid_t>(std::atoi(parent_pid))) return 1;  // parent already gone
  caf::actor_system_config cfg;
  configure(cfg);
  caf::actor_system sys{cfg};
  auto dir = sys.spawn(directory_fun);
  auto port = sys.middleman().publish(dir, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "bench_procs caf_worker: publish on 127.0.0.1 failed: %s\n",
                 sys.render(port.error()).c_str());
    return 1;
  }
  std::printf("PORT %u\n", static_cast<unsigned>(*port));
  std::fflush(stdout);
  for (;;) ::pause();  // until the parent kills it (or dies: PDEATHSIG)
}

void caf_cast_gather_procs(size_t procs, const std::vector<size_t>& ks, int warmup,
                           const std::function<int(size_t)>& iters) {
  std::vector<Worker> ws;
  if (!start_workers(procs, ws)) return;
  if (!run_client(ws, ks, warmup, iters)) {
    std::fprintf(
        stderr,
        "bench_procs: caf cast_gather_procs stopped early; its remaining rows are skipped\n");
  }
  stop_workers(ws);
}

}  // namespace procs_bench
