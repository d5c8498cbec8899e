// The chaos harness (issue 16, "Chaos test"): 16 worker procs over 4 `monarch agent` processes
// (4 procs each), cast tree fan-out 2, and a seeded random schedule of faults (SIGKILL, a SIGSTOP
// held past heartbeat_timeout, a short SIGSTOP that must cost only delay, an agent restart) on
// leaves, interior nodes of the tree and proc 0, while client threads keep casts (call, reduce,
// broadcast) to survivors() and to the whole mesh, per-host slices, direct calls (at(i).call,
// call_one) and streams in flight, several at once.
//
// Used by src/mesh/testing/chaos.test.cpp (a few rounds, in `make test`) and
// bench/chaos_bench.cpp (MONARCH_CHAOS_ROUNDS rounds, default 200, in `make bench`). Both binaries
// are their own workers: main() calls monarch::mesh::bootstrap(argc, argv, chaos::worker_setup).
//
// Invariants checked every round (numbered here, the one place; a violation is a line in
// Report::violations, printed with the seed that reproduces it):
//   CHAOS-1 Nothing hangs. Every future resolves within Config::margin of the later of its send
//           and the end of the last fault it overlapped (a failure's detection, a short stop's
//           SIGCONT), with a value or a named error: a monarch::Error whose what() names the
//           rank, actor, proc or mesh (and no empty endpoint). Detection itself must come within
//           Config::deadline() of the fault.
//   CHAOS-2 Per-sender order. Messages from one sender reach each live actor in order, with no
//           duplicates (the worker records per-sender sequence numbers; ChaosWorker::
//           take_violations returns what broke). Tree casts from one client thread share one
//           sender (CAST-3, across views); direct calls and streams have their own (CAST-4).
//   CHAOS-3 Casts that exclude the dead succeed. An operation sent while no failing fault was in
//           progress (injected, not yet detected) gives a value for every member whose proc was
//           not declared failed when it was sent: a cast to survivors() (exactly those members)
//           succeeds, its tree routing around the dead (CAST-12). Members declared failed get a
//           SupervisionError (a reduce or broadcast over them fails at once with one). Values
//           land in their member's slot; a reduce sums every member.
//   CHAOS-4 Stop has a deadline. ProcMesh::stop() returns within stop_timeout plus its kill grace
//           (PH-6), plus 500 ms of slack.
//   CHAOS-5 No process is left behind. Every worker pid is gone after a fault failed it and after
//           stop(); no agent has a live child after stop(); at the end no worker of the run and
//           no child of this process is alive (PH-1).
//   CHAOS-6 No failure without a fault. No proc fails that no fault was aimed at (a short SIGSTOP
//           is only a delay).
//
// Threads: run() on the caller's thread; Config::clients load threads per round; MeshFailures on
// the mesh's monitor thread; future completions on runtime threads. Not reentrant.
#pragma once

#include <execinfo.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "monarch/mesh/detail/cast_tree.hpp"
#include "monarch/mesh/process.hpp"
#include "testing/mesh_failures.hpp"
#include "testing/subprocess.hpp"

namespace monarch::testing::chaos {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using namespace std::chrono_literals;

// --- The worker actor ------------------------------------------------------------------------

/// One per worker proc, registered as "chaos". Every message carries (sender, seq); seqs from one
/// sender must strictly increase at each receiver (CHAOS-2: in order, no duplicates; gaps are
/// messages lost with a relay that died in flight).
struct ChaosWorker : monarch::Actor {
  explicit ChaosWorker(size_t rank) : rank_(rank) {}
  /// Records the message; returns this worker's rank in the full proc mesh.
  size_t hit(uint64_t sender, uint64_t seq) {
    record(sender, seq);
    return rank_;
  }
  /// The same, for broadcast (no reply).
  void hit_send(uint64_t sender, uint64_t seq) { record(sender, seq); }
  /// Order violations seen since the last call, as text naming the rank, sender and sequence
  /// numbers (each is reported once).
  std::vector<std::string> take_violations() { return std::exchange(violations_, {}); }
  /// Messages recorded so far.
  uint64_t received() const { return received_; }
  MONARCH_ENDPOINTS(ChaosWorker, hit, hit_send, take_violations, received)

 private:
  void record(uint64_t sender, uint64_t seq) {
    ++received_;
    auto [it, fresh] = last_.try_emplace(sender, seq);
    if (fresh) return;
    if (seq <= it->second) {
      violations_.push_back("rank " + std::to_string(rank_) + ": from sender " +
                            std::to_string(sender) + " seq " + std::to_string(seq) + " after " +
                            std::to_string(it->second) + (seq == it->second ? " (duplicate)" : ""));
    }
    it->second = std::max(it->second, seq);
  }
  size_t rank_;
  uint64_t received_ = 0;
  std::map<uint64_t, uint64_t> last_;
  std::vector<std::string> violations_;
};

/// The WorkerSetup of both chaos binaries.
inline void worker_setup(monarch::Proc& proc, const monarch::mesh::WorkerInfo& info) {
  proc.register_name("chaos", proc.spawn<ChaosWorker>("chaos", info.rank));
}

using Mesh = monarch::mesh::ActorMesh<ChaosWorker>;
using Ranks = ndslice::ValueMesh<size_t>;

// --- Configuration and report ------------------------------------------------------------------

enum class FaultKind { Kill, StopLong, StopShort, AgentRestart };
inline const char* to_string(FaultKind k) {
  switch (k) {
    case FaultKind::Kill:
      return "sigkill";
    case FaultKind::StopLong:
      return "sigstop_long";
    case FaultKind::StopShort:
      return "sigstop_short";
    case FaultKind::AgentRestart:
      return "agent_restart";
  }
  return "?";
}
enum class Target { Leaf, Interior, Root };
inline const char* to_string(Target t) {
  return t == Target::Leaf ? "leaf" : t == Target::Interior ? "interior" : "proc0";
}

struct Config {
  uint64_t seed = 1;
  size_t rounds = 4;
  size_t hosts = 4;     ///< `monarch agent` processes
  size_t per_host = 4;  ///< procs per agent
  size_t fanout = 2;
  size_t respawn_below = 10;  ///< fewer live procs than this before a round: a fresh mesh
  size_t clients = 2;         ///< load threads
  size_t in_flight = 4;       ///< operations each load thread keeps outstanding
  ms pace = 2ms;              ///< pause between a load thread's sends (2 cores, 16 workers)
  size_t ops_before_fault = 16, ops_after_detection = 24;  ///< per load thread, each round
  ms margin = 1500ms;  ///< on top of the detection time, for a loaded 2-core machine
  std::string cli;     ///< the `monarch` binary (agents)
  monarch::mesh::HostOptions host = defaults();
  bool verbose = false;
  /// Only these fault kinds (MONARCH_CHAOS_FAULTS=sigkill,agent_restart); empty: all four.
  std::vector<FaultKind> only;

  static monarch::mesh::HostOptions defaults() {
    monarch::mesh::HostOptions o;
    o.timeouts.heartbeat_interval = 100ms;
    o.timeouts.heartbeat_timeout = 2000ms;  // generous, as process_mesh_test: ctest -j2, sanitizers
    o.timeouts.spawn_timeout = 20s;
    o.timeouts.stop_timeout = 2s;
    o.channel.delivery_timeout = 6s;  // longer than deadline(): waiting it out is a violation
    return o;
  }
  size_t procs() const { return hosts * per_host; }
  /// The longest a fault may take to be detected (heartbeat_timeout plus the margin), and the
  /// longest anyone waits on an operation before CHAOS-1 calls it unresolved.
  ms deadline() const { return host.timeouts.heartbeat_timeout + margin; }
  /// CHAOS-4: stop_timeout plus the kill grace of ProcMesh::stop (min(stop_timeout, 2 s)).
  ms stop_bound() const {
    auto st = host.timeouts.stop_timeout;
    return st + std::min<ms>(st, 2000ms) + 500ms;
  }
  ms short_stop() const { return host.timeouts.heartbeat_timeout / 5; }

  /// Seed from MONARCH_CHAOS_SEED (else a random one), rounds from MONARCH_CHAOS_ROUNDS (else
  /// `default_rounds`).
  static Config from_env(size_t default_rounds) {
    Config c;
    const char* s = std::getenv("MONARCH_CHAOS_SEED");
    c.seed = s != nullptr ? std::stoull(s) : std::random_device{}();
    const char* r = std::getenv("MONARCH_CHAOS_ROUNDS");
    c.rounds = r != nullptr ? std::stoul(r) : default_rounds;
    c.verbose = std::getenv("MONARCH_CHAOS_VERBOSE") != nullptr;
    if (const char* only = std::getenv("MONARCH_CHAOS_FAULTS")) {
      std::string list = std::string(only) + ",";
      for (size_t at = 0, comma; (comma = list.find(',', at)) != std::string::npos;
           at = comma + 1) {
        const std::string name = list.substr(at, comma - at);
        bool known = false;
        for (auto k : {FaultKind::Kill, FaultKind::StopLong, FaultKind::StopShort,
                       FaultKind::AgentRestart}) {
          if (name == to_string(k)) {
            c.only.push_back(k);
            known = true;
          }
        }
        if (!known && !name.empty()) {
          throw monarch::UsageError("MONARCH_CHAOS_FAULTS: unknown fault '" + name +
                                    "' (sigkill, sigstop_long, sigstop_short, agent_restart)");
        }
      }
    }
    return c;
  }
};

struct Report {
  uint64_t seed = 0;
  size_t rounds = 0, respawns = 0, ops = 0, ops_failed = 0;
  std::map<std::string, size_t> faults;  ///< by "kind/target"
  std::vector<std::string> violations;
  /// SIGKILL rounds: kill -> MeshFailure delivered, kill -> first cast to survivors() that
  /// succeeded (sent once the failure was delivered), in ms.
  std::vector<double> detect_ms, recover_ms;
  double seconds = 0;
};

// --- Helpers -----------------------------------------------------------------------------------

/// The running agents' pids, for the crash handler (agents outlive a crashed client otherwise;
/// their workers die with them, PH-1).
inline std::atomic<int> g_agent_pids[64];

/// A crash of the client under chaos is a finding too: print its stack (addresses; resolve them
/// with addr2line -e BINARY) on stderr, kill the agents, then die of the signal. Call after
/// bootstrap() (the client only).
inline void print_stack_on_crash() {
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) {
    ::signal(sig, [](int s) {
      void* frames[64];
      int n = ::backtrace(frames, 64);
      const char head[] = "chaos: client crashed; stack:\n";
      (void)!::write(2, head, sizeof head - 1);
      ::backtrace_symbols_fd(frames, n, 2);
      for (auto& p : g_agent_pids)
        if (int pid = p.load(); pid > 0) ::kill(pid, SIGKILL);
      ::signal(s, SIG_DFL);
      ::raise(s);
    });
  }
}

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// Live (not zombie) children of `parent`, from /proc.
inline std::vector<int> live_children(int parent) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 4 >= line.size()) continue;
    char state = line[close + 2];
    int ppid = std::atoi(line.c_str() + close + 4);
    if (ppid == parent && state != 'Z' && state != 'X') out.push_back(std::stoi(name));
  }
  return out;
}

/// CHAOS-1's "named": a monarch::Error whose text names what failed (rank, actor, proc, mesh)
/// and has no empty endpoint ("message  to ...").
inline std::optional<std::string> unnamed(const std::exception_ptr& e, const std::string& mesh) {
  try {
    std::rethrow_exception(e);
  } catch (const monarch::Error& err) {
    std::string w = err.what();
    if (w.find("message  to") != std::string::npos) return "empty endpoint name: " + w;
    for (const char* k : {"rank", "chaos", "monarch.comm", "proc"}) {
      if (w.find(k) != std::string::npos) return std::nullopt;
    }
    if (w.find(mesh) != std::string::npos) return std::nullopt;
    return "error names no rank, actor, proc or mesh: " + w;
  } catch (const std::exception& other) {
    return std::string("not a monarch::Error: ") + other.what();
  } catch (...) {
    return std::string("not a std::exception");
  }
}

inline bool is_supervision(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const monarch::SupervisionError&) {
    return true;
  } catch (...) {
    return false;
  }
}

inline std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "?";
  }
}

// --- Operations in flight ----------------------------------------------------------------------

enum class OpKind { Call, Reduce, Broadcast, Direct, Stream };

/// One operation of a load thread. Completed on a runtime thread (or at once, when the adverb
/// threw); evaluated at the end of its round.
struct Op {
  OpKind kind{};
  std::string what;             ///< "call survivors", "reduce all", "direct rank 5", ...
  std::vector<size_t> members;  ///< global ranks, by local rank
  std::set<size_t> dead;        ///< ranks declared failed when it was sent
  bool survivors = false;       ///< cast to survivors(): its members must be exactly the live
  Clock::time_point sent = Clock::now();  ///< before its view is made (survivors())

  std::mutex mu;
  std::condition_variable cv;                  ///< notified once done is set
  size_t outstanding = 1;                      ///< replies still to come (streams: one per member)
  std::optional<Clock::time_point> done;       ///< when the last reply came
  std::exception_ptr whole;                    ///< the operation failed as a whole
  std::vector<std::exception_ptr> rank_error;  ///< by local rank
  std::vector<std::optional<size_t>> rank_value;
  std::optional<size_t> sum;  ///< reduce
};
using OpPtr = std::shared_ptr<Op>;

/// The failing-fault intervals of a round: [injected, last of its ranks declared failed].
struct Interval {
  Clock::time_point from, to;
};

// --- The harness -------------------------------------------------------------------------------

class Harness {
 public:
  explicit Harness(Config c) : cfg_(std::move(c)), rng_(cfg_.seed) {
    report_.seed = cfg_.seed;
    compute_tree();
  }
  ~Harness() { shutdown(); }

  /// Runs cfg.rounds rounds; returns what was seen. Throws only when the setup itself fails
  /// (agents that do not start, a mesh that cannot be spawned).
  Report run() {
    auto t0 = Clock::now();
    std::printf(
        "chaos: seed %llu (MONARCH_CHAOS_SEED=%llu reproduces it), %zu rounds, %zu procs "
        "over %zu agents, fan-out %zu\n",
        static_cast<unsigned long long>(cfg_.seed), static_cast<unsigned long long>(cfg_.seed),
        cfg_.rounds, cfg_.procs(), cfg_.hosts, cfg_.fanout);
    std::fflush(stdout);
    start_agents();
    for (size_t r = 0; r < cfg_.rounds; ++r) round(r);
    if (procs_) stop_and_check("final stop");
    shutdown(true);
    report_.seconds = ms_between(t0, Clock::now()) / 1000.0;
    return report_;
  }

 private:
  // ---- agents, meshes ----
  void start_agents() {
    for (size_t h = 0; h < cfg_.hosts; ++h) {
      addrs_.push_back("unix://@monarch-chaos-" + std::to_string(::getpid()) + "-" +
                       std::to_string(h));
      // die_with_parent: a harness killed mid-run (bench_chaos interrupted) leaves no agents,
      // and so no workers, behind. Agents start and restart on the thread that runs the rounds.
      agents_.emplace_back(std::make_unique<Subprocess>(
          cfg_.cli, std::vector<std::string>{"agent", "--listen", addrs_.back()},
          /*die_with_parent=*/true));
      agents_.back()->listening();
      g_agent_pids[h % 64] = agents_.back()->pid();
    }
    hosts_.emplace(monarch::mesh::attach_to_workers(addrs_, cfg_.host));
    hosts_->set_fault_hook([this](const monarch::ActorSupervisionEvent& e) {
      // Broadcasts that a dying proc did not acknowledge come back here (CH-4, REM-2): expected
      // while a fault is in progress; counted, not a violation.
      std::lock_guard lock(mu_);
      ++undeliverable_;
      if (cfg_.verbose) std::printf("  fault hook: %s\n", e.to_string().c_str());
    });
  }

  void restart_agent(size_t h) {
    g_agent_pids[h % 64] = 0;
    agents_[h]->kill(SIGKILL);  // reaps it: the address is free again
    agents_[h] = std::make_unique<Subprocess>(
        cfg_.cli, std::vector<std::string>{"agent", "--listen", addrs_[h]},
        /*die_with_parent=*/true);
    g_agent_pids[h % 64] = agents_[h]->pid();
    agents_[h]->listening();
  }

  void spawn_mesh() {
    size_t gen;
    {
      std::lock_guard lock(mu_);
      gen = ++generation_;
      failed_.clear();
      expected_.clear();
      unexpected_.clear();
    }
    monarch::mesh::SpawnOptions so;
    so.name = "chaos" + std::to_string(gen);
    so.cast = monarch::mesh::CastOptions{cfg_.fanout};
    so.on_failure = [this, gen](const monarch::MeshFailure& f) { return on_failure(gen, f); };
    so.log_sink = [](const monarch::mesh::LogRecord&) {};  // worker warnings are expected here
    // {hosts: agents} x {gpus: per_host}: proc rank = host * per_host + gpu.
    procs_.emplace(hosts_->spawn_procs(ndslice::Extent{{"gpus", cfg_.per_host}}, so));
    mesh_ = procs_->lookup<ChaosWorker>("chaos");
    rank_of_.clear();
    for (size_t g = 0; g < mesh_.size(); ++g) rank_of_[mesh_.at(g).id().proc] = g;
    pids_.clear();
    for (size_t i = 0; i < procs_->size(); ++i) pids_.push_back(procs_->pid(i));
    all_pids_.insert(all_pids_.end(), pids_.begin(), pids_.end());
  }

  void stop_and_check(const std::string& why) {
    auto t0 = Clock::now();
    procs_->stop();
    double took = ms_between(t0, Clock::now());
    if (took > static_cast<double>(cfg_.stop_bound().count())) {
      violation("CHAOS-4", why + ": stop() took " + std::to_string(took) + " ms (bound " +
                               std::to_string(cfg_.stop_bound().count()) + " ms)");
    }
    if (!all_dead(pids_, 5s)) {
      std::string alive;
      for (int p : pids_)
        if (process_alive(p)) alive += " " + std::to_string(p);
      violation("CHAOS-5", why + ": worker pids alive 5 s after stop():" + alive);
    }
    for (size_t h = 0; h < agents_.size(); ++h) {
      auto end = Clock::now() + 5s;
      std::vector<int> kids;
      while ((kids = live_children(agents_[h]->pid())).size() > 0 && Clock::now() < end) {
        std::this_thread::sleep_for(10ms);  // polling /proc: nothing to wait on
      }
      for (int k : kids) {
        violation("CHAOS-5", why + ": agent " + addrs_[h] + " still has child " +
                                 std::to_string(k) + " 5 s after stop()");
      }
    }
    procs_.reset();
    mesh_ = Mesh{};
  }

  // Ends the run: the mesh, the client, the agents. With `check`, CHAOS-5 over the whole run:
  // every worker ever spawned is gone and this process has no child left.
  void shutdown(bool check = false) {
    if (procs_) procs_->stop();
    procs_.reset();
    mesh_ = Mesh{};
    hosts_.reset();
    for (auto& a : agents_) a->kill(SIGKILL);
    agents_.clear();
    for (auto& p : g_agent_pids) p = 0;
    if (!check) return;
    if (!all_dead(all_pids_, 5s)) violation("CHAOS-5", "a worker outlived its agent");
    for (int k : live_children(::getpid())) {
      violation("CHAOS-5", "process " + std::to_string(k) + " outlived the run");
    }
  }

  // ---- the cast tree of the fresh mesh: CAST-2 paths over fan-out cfg.fanout ----
  void compute_tree() {
    const auto n = static_cast<uint32_t>(cfg_.procs());
    std::set<size_t> inner;
    for (uint32_t p = 0; p < n; ++p) {
      auto path = monarch::mesh::detail::cast_path(n, cfg_.fanout, p);
      for (size_t i = 0; i + 1 < path.size(); ++i) inner.insert(path[i]);
    }
    for (size_t p = 1; p < n; ++p) (inner.count(p) ? interior_ : leaves_).push_back(p);
  }

  // Global ranks (in the full mesh) of a view's members, by local rank: from the proc each
  // member lives on, whatever kind of view it is (slice, select, survivors).
  std::vector<size_t> members_of(const Mesh& view) const {
    std::vector<size_t> out(view.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = rank_of_.at(view.at(i).id().proc);
    return out;
  }

  // ---- failures ----
  bool on_failure(size_t gen, const monarch::MeshFailure& f) {
    std::lock_guard lock(mu_);
    if (gen != generation_) return true;  // a mesh stopped since: nobody's business now
    auto now = Clock::now();
    for (size_t r : f.ranks) {
      failed_[r] = now;
      if (!expected_.count(r)) {
        unexpected_.push_back({now - cfg_.host.timeouts.heartbeat_timeout - 200ms, now});
        violation_locked("CHAOS-6", "rank " + std::to_string(r) +
                                        " failed without a fault aimed at it: " + f.to_string());
      }
    }
    cv_.notify_all();
    return true;
  }
  std::set<size_t> dead_now() {
    std::lock_guard lock(mu_);
    std::set<size_t> out;
    for (auto& [r, t] : failed_) out.insert(r);
    return out;
  }
  size_t live_count() { return cfg_.procs() - dead_now().size(); }

  void violation(const std::string& inv, const std::string& text) {
    std::lock_guard lock(mu_);
    violation_locked(inv, text);
  }
  void violation_locked(const std::string& inv, const std::string& text) {
    std::string line = "[" + inv + "] round " + std::to_string(round_.load()) + " (seed " +
                       std::to_string(cfg_.seed) + "): " + text;
    std::printf("chaos VIOLATION %s\n", line.c_str());
    std::fflush(stdout);
    report_.violations.push_back(std::move(line));
  }

  // ---- one round ----
  struct Fault {
    FaultKind kind;
    Target target;
    std::vector<size_t> ranks;
    Clock::time_point injected;
  };

  void round(size_t r) {
    round_ = r;
    if (!procs_ || live_count() < cfg_.respawn_below) {
      if (procs_) {
        stop_and_check("respawn");
        ++report_.respawns;
      }
      spawn_mesh();
    }
    Fault f = pick_fault(r);
    report_.faults[std::string(to_string(f.kind)) + "/" + to_string(f.target)]++;
    const size_t live = live_count(), ops0 = report_.ops, failed0 = report_.ops_failed;
    const size_t bad0 = violations();
    const auto t0 = Clock::now();
    {
      std::lock_guard lock(mu_);
      intervals_.clear();
      delays_.clear();
    }
    start_load();
    wait_ops(cfg_.ops_before_fault);
    inject(f);
    wait_ops(cfg_.ops_after_detection);
    stop_load();
    evaluate_ops();
    check_order();
    ++report_.rounds;
    std::printf(
        "chaos round %zu: %s on %s rank %zu (%zu live): %zu ops, %zu with errors, %zu "
        "violations, %.0f ms\n",
        r, to_string(f.kind), to_string(f.target), f.ranks.front(), live, report_.ops - ops0,
        report_.ops_failed - failed0, violations() - bad0, ms_between(t0, Clock::now()));
    std::fflush(stdout);
  }
  size_t violations() {
    std::lock_guard lock(mu_);
    return report_.violations.size();
  }

  Fault pick_fault(size_t r) {
    // Each block of 4 rounds takes every kind once and each block of 3 every target class once,
    // in a seeded order, so that a short run covers them all.
    if (r % 4 == 0) {
      kinds_ = {FaultKind::Kill, FaultKind::StopLong, FaultKind::StopShort,
                FaultKind::AgentRestart};
      std::shuffle(kinds_.begin(), kinds_.end(), rng_);
      if (!cfg_.only.empty()) {  // the same draws, then only the kinds asked for
        for (auto& k : kinds_)
          k = cfg_.only[static_cast<size_t>(&k - kinds_.data()) % cfg_.only.size()];
      }
    }
    if (r % 3 == 0) {
      targets_ = {Target::Leaf, Target::Interior, Target::Root};
      std::shuffle(targets_.begin(), targets_.end(), rng_);
    }
    Fault f{kinds_[r % 4], targets_[r % 3], {}, {}};
    auto dead = dead_now();
    std::vector<size_t> pool;
    if (f.target == Target::Root) {
      for (size_t p = 0; p < cfg_.procs(); ++p) {  // the first live proc roots the tree
        if (!dead.count(p)) {
          pool.push_back(p);
          break;
        }
      }
    } else {
      for (size_t p : f.target == Target::Leaf ? leaves_ : interior_)
        if (!dead.count(p)) pool.push_back(p);
    }
    if (pool.empty()) {
      for (size_t p = 0; p < cfg_.procs(); ++p)
        if (!dead.count(p)) pool.push_back(p);
    }
    size_t victim = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng_)];
    if (f.kind == FaultKind::AgentRestart) {
      size_t h = victim / cfg_.per_host;
      for (size_t p = h * cfg_.per_host; p < (h + 1) * cfg_.per_host; ++p)
        if (!dead.count(p)) f.ranks.push_back(p);
      // Its victim first: the report names it.
      std::stable_partition(f.ranks.begin(), f.ranks.end(), [&](size_t p) { return p == victim; });
    } else {
      f.ranks.push_back(victim);
    }
    return f;
  }

  void inject(Fault& f) {
    const bool fails = f.kind != FaultKind::StopShort;
    {
      std::lock_guard lock(mu_);
      if (fails) expected_.insert(f.ranks.begin(), f.ranks.end());
    }
    const int pid = pids_[f.ranks.front()];
    f.injected = Clock::now();
    switch (f.kind) {
      case FaultKind::Kill:
        ::kill(pid, SIGKILL);
        break;
      case FaultKind::StopLong:
      case FaultKind::StopShort:
        ::kill(pid, SIGSTOP);
        break;
      case FaultKind::AgentRestart:
        restart_agent(f.ranks.front() / cfg_.per_host);
        break;
    }
    if (!fails) {
      // A stop shorter than heartbeat_timeout: only a delay. The load keeps going meanwhile.
      std::this_thread::sleep_for(cfg_.short_stop());  // the fault's own duration
      ::kill(pid, SIGCONT);
      std::lock_guard lock(mu_);
      delays_.push_back({f.injected, Clock::now()});
      return;
    }
    // Detection: every rank of the fault declared failed (its MeshFailure delivered).
    Clock::time_point detected;
    {
      std::unique_lock lock(mu_);
      bool ok = cv_.wait_for(lock, cfg_.deadline() + cfg_.margin, [&] {
        return std::all_of(f.ranks.begin(), f.ranks.end(),
                           [&](size_t r) { return failed_.count(r) > 0; });
      });
      detected = Clock::now();
      if (ok) {
        detected = f.injected;
        for (size_t r : f.ranks) detected = std::max(detected, failed_[r]);
      } else {
        violation_locked("CHAOS-1", std::string(to_string(f.kind)) + " of rank " +
                                        std::to_string(f.ranks.front()) + " not detected within " +
                                        std::to_string((cfg_.deadline() + cfg_.margin).count()) +
                                        " ms");
      }
      intervals_.push_back({f.injected, detected});
    }
    if (f.kind == FaultKind::Kill) probe_recovery(f.injected, detected);
    if (f.kind == FaultKind::StopLong && process_alive(pid)) ::kill(pid, SIGCONT);
    // CHAOS-5: the failed procs are gone (killed by the mesh, or with their agent).
    std::vector<int> gone;
    for (size_t r : f.ranks) gone.push_back(pids_[r]);
    if (!all_dead(gone, 5s)) {
      violation("CHAOS-5", std::string(to_string(f.kind)) + " of rank " +
                               std::to_string(f.ranks.front()) +
                               ": a failed proc is still alive 5 s after its failure");
    }
  }

  // The first cast to survivors() sent once the kill was detected must succeed (CHAOS-3);
  // its completion time is the recovery time of the bench.
  void probe_recovery(Clock::time_point killed, Clock::time_point detected) {
    auto op = std::make_shared<Op>();
    {
      std::lock_guard lock(ops_mu_);
      ops_.push_back(op);  // evaluated with the others too
    }
    issue_call(op, mesh_.survivors(), "probe call survivors", kProbeSender, ++probe_seq_);
    if (!wait_op(*op, Clock::now() + cfg_.deadline())) return;  // CHAOS-1 reports it
    std::lock_guard lock(op->mu);
    bool ok = !op->whole &&
              std::all_of(op->rank_error.begin(), op->rank_error.end(), [](auto& e) { return !e; });
    if (!ok) {
      violation("CHAOS-3", "the first cast to survivors() after a kill failed: " +
                               (op->whole ? what_of(op->whole) : first_error(*op)));
      return;
    }
    report_.detect_ms.push_back(ms_between(killed, detected));
    report_.recover_ms.push_back(ms_between(killed, *op->done));
  }

  // ---- load ----
  void start_load() {
    load_stop_ = false;
    {
      std::lock_guard lock(ops_mu_);
      completed_ = 0;
    }
    for (size_t c = 0; c < cfg_.clients; ++c) load_.emplace_back([this, c] { load_loop(c); });
  }
  void stop_load() {
    load_stop_ = true;
    for (auto& t : load_) t.join();
    load_.clear();
  }
  // Waits until the load threads completed `n` more operations each (bounded: a stuck load shows
  // as unresolved operations, evaluated afterwards).
  void wait_ops(size_t n) {
    std::unique_lock lock(ops_mu_);
    size_t target = completed_ + n * cfg_.clients;
    ops_cv_.wait_for(lock, cfg_.deadline() * 3, [&] { return completed_ >= target; });
  }

  // One load thread's senders: tree casts (call, reduce, broadcast to survivors, the whole mesh
  // or a host) share one sender and one counter, so CAST-3 is checked across views; direct calls
  // and streams have their own (CAST-4). Sender ids are unique per round and thread.
  struct Senders {
    uint64_t tree, direct, stream;
    uint64_t tree_seq = 0, direct_seq = 0, stream_seq = 0;
  };
  static constexpr uint64_t kProbeSender = 7;  // never a load sender (those end in 1..3)

  void load_loop(size_t c) {
    std::mt19937_64 rng(cfg_.seed * 1000003 + round_ * 101 + c);
    const uint64_t base = 100 * (round_ + 1) + 10 * c;
    Senders s{base + 1, base + 2, base + 3};
    std::deque<OpPtr> mine;
    auto retire = [&] {
      OpPtr op = std::move(mine.front());
      mine.pop_front();
      wait_op(*op, op->sent + cfg_.deadline());  // past it: evaluate_ops reports it
      std::lock_guard lock(ops_mu_);
      ++completed_;
      ops_cv_.notify_all();
    };
    while (!load_stop_) {
      // A thread never holds more than in_flight operations; completed ones retire at once.
      while (!mine.empty() && (mine.size() >= cfg_.in_flight || is_done(*mine.front()))) retire();
      auto op = std::make_shared<Op>();
      {
        std::lock_guard lock(ops_mu_);
        ops_.push_back(op);
      }
      issue_random(op, rng, s);
      mine.push_back(std::move(op));
      std::this_thread::sleep_for(cfg_.pace);  // a rate, not a wait for anything
    }
    while (!mine.empty()) retire();
  }

  static bool is_done(Op& op) {
    std::lock_guard lock(op.mu);
    return op.done.has_value();
  }
  static bool wait_op(Op& op, Clock::time_point until) {
    std::unique_lock lock(op.mu);
    return op.cv.wait_until(lock, until, [&] { return op.done.has_value(); });
  }

  void issue_random(const OpPtr& op, std::mt19937_64& rng, Senders& s) {
    auto pick = std::uniform_int_distribution<int>(0, 99)(rng);
    auto any_rank = std::uniform_int_distribution<size_t>(0, cfg_.procs() - 1)(rng);
    auto host = std::uniform_int_distribution<size_t>(0, cfg_.hosts - 1)(rng);
    if (pick < 25) return issue_call(op, mesh_.survivors(), "call survivors", s.tree, ++s.tree_seq);
    if (pick < 35) return issue_call(op, mesh_, "call all", s.tree, ++s.tree_seq);
    if (pick < 42) {
      return issue_call(op, mesh_.slice("hosts", host), "call host " + std::to_string(host), s.tree,
                        ++s.tree_seq);
    }
    if (pick < 55) {
      return issue_reduce(op, mesh_.survivors(), "reduce survivors", s.tree, ++s.tree_seq);
    }
    if (pick < 60) return issue_reduce(op, mesh_, "reduce all", s.tree, ++s.tree_seq);
    if (pick < 68) {
      return issue_broadcast(op, mesh_.survivors(), "broadcast survivors", s.tree, ++s.tree_seq);
    }
    if (pick < 72) return issue_broadcast(op, mesh_, "broadcast all", s.tree, ++s.tree_seq);
    if (pick < 82) return issue_direct(op, any_rank, false, s.direct, ++s.direct_seq);
    if (pick < 90) return issue_direct(op, any_rank, true, s.direct, ++s.direct_seq);
    return issue_stream(op, mesh_.survivors(), "stream survivors", s.stream, ++s.stream_seq);
  }

  void begin(Op& op, OpKind kind, std::string what, const Mesh& view) {
    op.kind = kind;
    op.what = std::move(what);
    op.dead = dead_now();  // op.sent was taken before the view: a failure in between overlaps
    op.members = members_of(view);
    op.survivors = op.what.find("survivors") != std::string::npos;
    op.rank_error.assign(op.members.size(), nullptr);
    op.rank_value.assign(op.members.size(), std::nullopt);
  }
  static void finish_locked(Op& op) {
    if (--op.outstanding > 0) return;
    op.done = Clock::now();
    op.cv.notify_all();
  }
  // The adverb threw: the operation resolved at once with that error.
  static void fail_at_once(Op& op, std::exception_ptr e, bool per_rank) {
    std::lock_guard lock(op.mu);
    if (per_rank && op.rank_error.size() == 1) {
      op.rank_error[0] = std::move(e);
    } else {
      op.whole = std::move(e);
    }
    op.outstanding = 1;
    finish_locked(op);
  }

  void issue_call(const OpPtr& op, const Mesh& view, std::string what, uint64_t sender,
                  uint64_t seq) {
    begin(*op, OpKind::Call, std::move(what), view);
    try {
      view.call(&ChaosWorker::hit, sender, seq).on_complete([op](monarch::detail::State<Ranks>& s) {
        std::lock_guard lock(op->mu);
        if (s.error) {
          op->whole = s.error;
        } else if (s.value->size() != op->members.size()) {
          op->whole = std::make_exception_ptr(
              monarch::Error("harness: a ValueMesh of " + std::to_string(s.value->size()) +
                             " ranks for a view of " + std::to_string(op->members.size())));
        } else {
          const Ranks& vm = *s.value;
          for (size_t i = 0; i < vm.size(); ++i) {
            if (vm.ok(i)) {
              op->rank_value[i] = vm[i];
            } else {
              op->rank_error[i] = vm.error(i);
            }
          }
        }
        finish_locked(*op);
      });
    } catch (...) {
      fail_at_once(*op, std::current_exception(), false);
    }
  }

  void issue_reduce(const OpPtr& op, const Mesh& view, std::string what, uint64_t sender,
                    uint64_t seq) {
    begin(*op, OpKind::Reduce, std::move(what), view);
    try {
      view.reduce(monarch::mesh::Sum{}, &ChaosWorker::hit, sender, seq)
          .on_complete([op](monarch::detail::State<size_t>& s) {
            std::lock_guard lock(op->mu);
            if (s.error) {
              op->whole = s.error;
            } else {
              op->sum = *s.value;
            }
            finish_locked(*op);
          });
    } catch (...) {
      fail_at_once(*op, std::current_exception(), false);
    }
  }

  void issue_broadcast(const OpPtr& op, const Mesh& view, std::string what, uint64_t sender,
                       uint64_t seq) {
    begin(*op, OpKind::Broadcast, std::move(what), view);
    try {
      view.broadcast(&ChaosWorker::hit_send, sender, seq);
      std::lock_guard lock(op->mu);
      finish_locked(*op);
    } catch (...) {
      fail_at_once(*op, std::current_exception(), false);
    }
  }

  void issue_direct(const OpPtr& op, size_t rank, bool one, uint64_t sender, uint64_t seq) {
    Mesh view = mesh_.slice("hosts", rank / cfg_.per_host).slice("gpus", rank % cfg_.per_host);
    begin(*op, OpKind::Direct, (one ? "call_one rank " : "at(i).call rank ") + std::to_string(rank),
          view);
    try {
      auto f = one ? view.call_one(&ChaosWorker::hit, sender, seq)
                   : mesh_.at(rank).call(&ChaosWorker::hit, sender, seq);
      f.on_complete([op](monarch::detail::State<size_t>& s) {
        std::lock_guard lock(op->mu);
        if (s.error) {
          op->rank_error[0] = s.error;
        } else {
          op->rank_value[0] = *s.value;
        }
        finish_locked(*op);
      });
    } catch (...) {
      fail_at_once(*op, std::current_exception(), true);
    }
  }

  void issue_stream(const OpPtr& op, const Mesh& view, std::string what, uint64_t sender,
                    uint64_t seq) {
    begin(*op, OpKind::Stream, std::move(what), view);
    try {
      auto s = view.stream(&ChaosWorker::hit, sender, seq);
      {
        std::lock_guard lock(op->mu);
        op->outstanding = std::max<size_t>(op->members.size(), 1);
        if (op->members.empty()) return finish_locked(*op);
      }
      // Stream::next blocks: a helper thread hands each reply (a ready future holding the value
      // or the member's error) to the op as it arrives.
      std::thread([op, s = std::move(s), wait = cfg_.deadline() * 2]() mutable {
        for (size_t n = 0; n < op->members.size(); ++n) {
          std::pair<size_t, Future<size_t>> item;
          try {
            item = s.next(wait);
          } catch (...) {
            return;  // none within twice the deadline: unresolved, evaluate_ops reports it
          }
          std::lock_guard lock(op->mu);
          try {
            op->rank_value.at(item.first) = item.second.get();
          } catch (...) {
            op->rank_error.at(item.first) = std::current_exception();
          }
          finish_locked(*op);
        }
      }).detach();
    } catch (...) {
      fail_at_once(*op, std::current_exception(), false);
    }
  }

  // ---- evaluation ----
  static std::string first_error(const Op& op) {
    for (size_t i = 0; i < op.rank_error.size(); ++i)
      if (op.rank_error[i])
        return "rank " + std::to_string(op.members[i]) + ": " + what_of(op.rank_error[i]);
    return "";
  }

  bool in_fault(const Op& op, Clock::time_point end) {
    std::lock_guard lock(mu_);
    auto overlaps = [&](const Interval& iv) { return op.sent <= iv.to && end >= iv.from; };
    return std::any_of(intervals_.begin(), intervals_.end(), overlaps) ||
           std::any_of(unexpected_.begin(), unexpected_.end(), overlaps);
  }

  // CHAOS-1's deadline of one operation: the margin after it was sent, or after the end of the
  // last fault it overlapped (a failure's detection, a short stop's SIGCONT).
  Clock::time_point deadline_of(const Op& op, Clock::time_point end) {
    std::lock_guard lock(mu_);
    auto from = op.sent;
    for (const auto* ivs : {&intervals_, &unexpected_, &delays_}) {
      for (const Interval& iv : *ivs)
        if (op.sent <= iv.to && end >= iv.from) from = std::max(from, iv.to);
    }
    return from + cfg_.margin;
  }

  void evaluate_ops() {
    std::vector<std::shared_ptr<Op>> ops;
    {
      std::lock_guard lock(ops_mu_);
      ops.swap(ops_);
    }
    const std::string mesh = procs_ ? procs_->name() : "";
    for (auto& sp : ops) {
      Op& op = *sp;
      // Streams' helper threads may still hold the op: wait until its deadline.
      wait_op(op, op.sent + cfg_.deadline());
      std::lock_guard lock(op.mu);
      ++report_.ops;
      std::string tag = op.what + " (sent " + std::to_string(op.members.size()) + " members, " +
                        std::to_string(op.dead.size()) + " known dead)";
      if (!op.done) {
        violation("CHAOS-1", tag + ": unresolved " + std::to_string(cfg_.deadline().count()) +
                                 " ms after it was sent");
        continue;  // its completion holds it (OpPtr) if it ever comes
      }
      const auto due = deadline_of(op, *op.done);
      if (*op.done > due) {
        violation("CHAOS-1", tag + ": resolved after " +
                                 std::to_string(ms_between(op.sent, *op.done)) + " ms, " +
                                 std::to_string(ms_between(due, *op.done)) +
                                 " ms past its deadline (detection or send + " +
                                 std::to_string(cfg_.margin.count()) + " ms)");
      }
      const bool exempt = in_fault(op, *op.done);
      bool any_error = op.whole != nullptr;
      auto check_named = [&](const std::exception_ptr& e, const std::string& who) {
        if (auto bad = unnamed(e, mesh)) violation("CHAOS-1", tag + ": " + who + ": " + *bad);
      };
      if (op.survivors && !exempt) {
        std::vector<size_t> live;
        for (size_t g = 0; g < cfg_.procs(); ++g)
          if (!op.dead.count(g)) live.push_back(g);
        if (op.members != live) {
          violation("CHAOS-3", tag + ": survivors() held " + std::to_string(op.members.size()) +
                                   " members, not the " + std::to_string(live.size()) +
                                   " ranks whose procs were not declared failed");
        }
      }
      bool view_has_dead = std::any_of(op.members.begin(), op.members.end(),
                                       [&](size_t g) { return op.dead.count(g) > 0; });
      if (op.whole) {
        check_named(op.whole, "failed");
        bool allowed = exempt || ((op.kind == OpKind::Reduce || op.kind == OpKind::Broadcast) &&
                                  view_has_dead && is_supervision(op.whole));
        if (!allowed) {
          violation("CHAOS-3", tag + ": failed as a whole: " + what_of(op.whole));
        }
      }
      if (!op.whole && !exempt && view_has_dead &&
          (op.kind == OpKind::Reduce || op.kind == OpKind::Broadcast)) {
        violation("CHAOS-3", tag + ": succeeded over a member already declared failed");
      }
      if (op.sum) {
        size_t want = std::accumulate(op.members.begin(), op.members.end(), size_t{0});
        if (*op.sum != want) {
          violation("CHAOS-3", tag + ": sum of ranks " + std::to_string(*op.sum) + ", expected " +
                                   std::to_string(want));
        }
      }
      for (size_t i = 0; i < op.members.size(); ++i) {
        const size_t g = op.members[i];
        const std::string who = "rank " + std::to_string(g);
        if (op.rank_value[i] && *op.rank_value[i] != g) {
          violation("CHAOS-3",
                    tag + ": slot of " + who + " holds rank " + std::to_string(*op.rank_value[i]));
        }
        if (!op.rank_error[i]) continue;
        any_error = true;
        check_named(op.rank_error[i], who);
        if (exempt) continue;
        if (!op.dead.count(g)) {
          violation("CHAOS-3",
                    tag + ": " + who + " (live when sent) failed: " + what_of(op.rank_error[i]));
        } else if (!is_supervision(op.rank_error[i])) {
          violation("CHAOS-3", tag + ": " + who + " (declared failed when sent) got " +
                                   what_of(op.rank_error[i]) + ", not a SupervisionError");
        }
      }
      if (op.kind == OpKind::Call || op.kind == OpKind::Direct || op.kind == OpKind::Stream) {
        if (!op.whole) {
          for (size_t i = 0; i < op.members.size(); ++i) {
            if (!op.rank_value[i] && !op.rank_error[i]) {
              violation("CHAOS-1", tag + ": rank " + std::to_string(op.members[i]) +
                                       " has neither a value nor an error");
            }
          }
        }
      }
      if (any_error) ++report_.ops_failed;
    }
  }

  // CHAOS-2: every live worker's record of per-sender sequence numbers.
  void check_order() {
    Mesh live = mesh_.survivors();
    const auto ranks = members_of(live);
    try {
      auto vm = live.call(&ChaosWorker::take_violations).get(cfg_.deadline());
      for (size_t i = 0; i < vm.size(); ++i) {
        if (!vm.ok(i)) {
          violation("CHAOS-3", "order check: rank " + std::to_string(ranks[i]) +
                                   " failed: " + what_of(vm.error(i)));
          continue;
        }
        for (const auto& v : vm[i]) violation("CHAOS-2", v);
      }
    } catch (const std::exception& e) {
      violation("CHAOS-3", std::string("order check: call to survivors() failed: ") + e.what());
    }
  }

  Config cfg_;
  std::mt19937_64 rng_;
  Report report_;
  std::vector<FaultKind> kinds_;
  std::vector<Target> targets_;
  std::vector<size_t> leaves_, interior_;

  std::vector<std::string> addrs_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
  std::optional<monarch::mesh::HostMesh> hosts_;
  std::optional<monarch::mesh::ProcMesh> procs_;
  Mesh mesh_;
  std::vector<int> pids_;
  std::map<std::string, size_t> rank_of_;  // proc address -> global rank, this mesh
  size_t generation_ = 0;                  // guarded by mu_
  std::atomic<size_t> round_{0};

  std::mutex mu_;  // failures, intervals, violations
  std::condition_variable cv_;
  std::map<size_t, Clock::time_point> failed_;  // rank -> MeshFailure delivered
  std::set<size_t> expected_;                   // ranks a fault was aimed at (this mesh)
  std::vector<Interval> intervals_, unexpected_;
  std::vector<Interval> delays_;  // short stops: [SIGSTOP, SIGCONT]
  size_t undeliverable_ = 0;

  std::mutex ops_mu_;
  std::condition_variable ops_cv_;
  std::vector<OpPtr> ops_;
  size_t completed_ = 0;
  std::atomic<bool> load_stop_{false};
  std::vector<std::thread> load_;
  uint64_t probe_seq_ = 0;
  std::vector<int> all_pids_;  // every worker of every mesh of the run
};

}  // namespace monarch::testing::chaos
