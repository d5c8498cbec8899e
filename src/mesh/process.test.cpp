// Process meshes: real worker processes spawned by host agents (embedded and `monarch agent`),
// their failures as MeshFailures, stop deadlines, orphans, and log forwarding.
//
// This binary is also the worker: main() calls bootstrap() first (see the bottom of the file).
#include "monarch/mesh/process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "host_agent.hpp"
#include "process_host.hpp"
#include "testing/config_override.hpp"
#include "testing/freeze.hpp"
#include "testing/log_capture.hpp"
#include "testing/mesh_failures.hpp"
#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::mesh::HostOptions;
using monarch::mesh::LogRecord;
using monarch::mesh::MeshFailure;
using monarch::mesh::ProcMesh;
using monarch::mesh::SpawnOptions;
using monarch::ndslice::Extent;
using monarch::ndslice::Range;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// PH-7: a fork server needs a process with one thread at bootstrap(); TSan's runtime adds one.
#if defined(__SANITIZE_THREAD__)
#define SKIP_WITHOUT_FORK_SERVER() \
  GTEST_SKIP() << "TSan runs a thread in every process: no fork server can serve"
#else
#define SKIP_WITHOUT_FORK_SERVER() (void)0
#endif

namespace {

using Failures = monarch::testing::FailureLog;
using monarch::testing::all_dead;

// What this (client) process logs; added to the default logger in main().
std::shared_ptr<monarch::testing::LogCapture> g_warnings;

struct Worker : monarch::Actor {
  explicit Worker(size_t rank) : rank_(rank) {}
  size_t rank() const { return rank_; }
  int pid() const { return ::getpid(); }
  size_t where() const { return monarch::mesh::Context::message_rank(); }
  // Fault injection, by name: "exit3", "segv", "throw" (a send handler that throws: the actor
  // fails unhandled), "freeze" (never returns).
  void crash(std::string how) {
    if (how == "exit3") {
      std::fprintf(stderr, "rank %zu gives up\n", rank_);
      ::_exit(3);
    }
    if (how == "segv") {
      ::signal(SIGSEGV, SIG_DFL);  // not a sanitizer's handler: die of the signal itself
      ::raise(SIGSEGV);
    }
    if (how == "throw") throw std::runtime_error("rank " + std::to_string(rank_) + " exploded");
  }
  // Writes `line` to stdout (forwarded to the client's log sink).
  void say(std::string line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  MONARCH_ENDPOINTS(Worker, rank, pid, where, crash, say)
  size_t rank_;
};

// A second actor per worker, so that a call can hang on it while Worker takes the fault.
struct Blocker : monarch::Actor {
  int freeze() {
    std::promise<void> never;
    never.get_future().wait();
    return 0;
  }
  MONARCH_ENDPOINTS(Blocker, freeze)
};

// What every worker of this binary does before it reports ready.
void worker_setup(monarch::Proc& proc, const monarch::mesh::WorkerInfo& info) {
  // No register_cast here: the casts this binary makes register their handlers in every process
  // running it (RemoteCast::auto_registered), and `where` is cast without being registered.
  proc.register_name("worker", proc.spawn<Worker>("worker", info.rank));
  proc.register_name("blocker", proc.spawn<Blocker>("blocker"));
  if (info.mesh.starts_with("logs")) {
    std::printf("hello from rank %zu\n", info.rank);
    std::printf("same on every rank\n");
    std::fflush(stdout);
    std::fprintf(stderr, "warning from rank %zu\n", info.rank);
  }
}

HostOptions fast() {
  HostOptions o;
  o.timeouts.heartbeat_interval = 100ms;
  o.timeouts.heartbeat_timeout = 2000ms;  // generous: sanitizer builds under ctest -j2 are slow
  o.timeouts.spawn_timeout = 20s;
  o.timeouts.stop_timeout = 3s;
  o.channel.delivery_timeout = 5s;  // > heartbeat_timeout, as the config layer orders them
  return o;
}

std::vector<int> pids_of(const ProcMesh& m) {
  std::vector<int> out;
  for (size_t i = 0; i < m.size(); ++i) out.push_back(m.pid(i));
  return out;
}

TEST(ProcessMesh, SpawnsWorkersCallsThemAndStops) {
  auto host = monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "basic";
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  EXPECT_EQ(procs.extent().to_string(), "{gpus=4}");
  EXPECT_TRUE(procs.is_process());
  auto workers = procs.lookup<Worker>("worker");
  auto ranks = workers.call(&Worker::rank).get(10s);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r], r);
  auto pids = workers.call(&Worker::pid).get(10s);
  std::set<int> distinct;
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(pids[r], procs.pid(r));
    EXPECT_NE(pids[r], ::getpid());
    distinct.insert(pids[r]);
  }
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_EQ(workers.slice("gpus", Range(1, 3)).call(&Worker::rank).get(10s)[1], 2u);
  EXPECT_THROW(procs.proc(0), monarch::UsageError);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(procs.stop());  // every worker exited when asked
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_TRUE(all_dead(pids_of(procs), 5s));
  EXPECT_TRUE(procs.failed_ranks().empty());
}

// An actor mesh used after its procs were stopped: every adverb refuses at once naming the stop (a
// call waited out channel.delivery_timeout, 30 s, and a broadcast made the client exit 30 s
// later). Once every HostMesh and ProcMesh of its client Proc is gone it refuses too (it read
// freed memory).
TEST(ProcessMesh, AnActorMeshUsedAfterItsProcsStoppedRefusesAtOnce) {
  monarch::mesh::ActorMesh<Worker> workers;
  {
    auto host = monarch::mesh::this_host(fast());
    SpawnOptions so;
    so.name = "stopped";
    auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
    workers = procs.lookup<Worker>("worker");
    ASSERT_EQ(workers.call(&Worker::rank).get(10s)[1], 1u);
    ASSERT_TRUE(procs.stop());
    try {
      (void)workers.call(&Worker::rank);
      ADD_FAILURE() << "a call to a stopped mesh went out";
    } catch (const monarch::UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("ActorMesh::call: proc mesh 'stopped' was stopped"));
    }
    EXPECT_THROW((void)workers.reduce(monarch::mesh::Sum{}, &Worker::rank), monarch::UsageError);
    EXPECT_THROW(workers.broadcast(&Worker::where), monarch::UsageError);
    EXPECT_THROW((void)workers.slice("gpus", 1).call_one(&Worker::rank), monarch::UsageError);
    EXPECT_THROW((void)workers.choose(&Worker::rank), monarch::UsageError);
    EXPECT_EQ(workers.at(1).id().name, "worker");  // the refs themselves are still readable
    // A reference taken out of the mesh (at) is not checked: its call goes out, and fails at
    // once, naming the stop, instead of waiting out the 5 s delivery timeout (the link to the
    // exited proc closes at its first refused connection).
    auto stale = workers.at(1);
    try {
      (void)stale.call(&Worker::rank).get(4s);
      ADD_FAILURE() << "a call to a stopped proc was answered";
    } catch (const monarch::DeliveryFailure& e) {
      EXPECT_THAT(e.what(), HasSubstr("has exited"));
      EXPECT_THAT(e.what(), HasSubstr("proc of mesh stopped stopped"));
    }
  }  // the last HostMesh and ProcMesh of the client Proc go: it is shut down and freed
  try {
    (void)workers.call(&Worker::rank);
    ADD_FAILURE() << "a call went through a freed Proc";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ActorMesh::call: mesh of proc mesh 'stopped': the procs"));
  }
  EXPECT_THROW((void)workers.at(0), monarch::UsageError);
  EXPECT_THROW(workers.broadcast(&Worker::where), monarch::UsageError);
  EXPECT_THROW((void)workers.stream(&Worker::rank), monarch::UsageError);
}

// A call still waiting when its procs are stopped and freed ends with an error in each member's
// slot, each naming what could not be reached (not a hang, not a UsageError from the reply path:
// the end of a call names the members of a failed hop without at(), which refuses once the procs
// are gone).
TEST(ProcessMesh, ACallPendingWhenItsProcsGoEndsWithAnErrorPerMember) {
  using Pending =
      decltype(std::declval<monarch::mesh::ActorMesh<Blocker>>().call(&Blocker::freeze));
  std::optional<Pending> pending;
  {
    auto host = monarch::mesh::this_host(fast());
    SpawnOptions so;
    so.name = "pending";
    so.cast.fanout = 2;  // 4 procs: rank 0 relays for the others
    auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
    auto blockers = procs.lookup<Blocker>("blocker");
    pending.emplace(blockers.call(&Blocker::freeze));
  }  // the procs are stopped (killed after stop_timeout: freeze never returns) and freed
  auto got = pending->get(30s);
  EXPECT_EQ(got.failed_ranks().size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    // Each names what could not be reached: the member, or the comm actor relaying to it.
    try {
      (void)got[r];
    } catch (const monarch::DeliveryFailure& e) {
      EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("blocker["), HasSubstr("monarch.comm[")));
    }
  }
}

// A requested stop is not a loss: neither the client nor the workers warn of messages the stopped
// procs did not acknowledge (workers of a cast tree used to wait out their flush and then warn
// "reply ... lost: delivery timeout" for replies to a parent comm proc that stopped first).
TEST(ProcessMesh, ANormalStopIsQuietAndQuick) {  // PH-6
  std::mutex mu;
  std::vector<std::string> worker_lines;
  SpawnOptions so;
  so.log_sink = [&](const LogRecord& r) {
    std::lock_guard lock(mu);
    worker_lines.push_back(r.to_string());
  };
  auto host = monarch::mesh::this_host(fast());
  // Acks travel every few ms, so a loss shows only when the stop follows the last cast closely:
  // several rounds, each stopping right after its casts.
  for (int round = 0; round < 6; ++round) {
    so.name = "quiet" + std::to_string(round);
    auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
    auto pids = pids_of(procs);
    auto workers = procs.lookup<Worker>("worker");
    auto spawned = procs.spawn<Worker>("more", Extent{{"actors", 8}}, size_t{5});
    g_warnings->take_warnings();
    // Casts through the tree (workers forward to and reply to each other), then stop at once.
    EXPECT_EQ(spawned.reduce(monarch::mesh::Sum{}, &Worker::rank).get(10s), 4u * 8u * 5u);
    EXPECT_EQ(workers.slice("gpus", Range(1, 4)).call(&Worker::rank).get(10s)[2], 3u);
    EXPECT_EQ(workers.call(&Worker::rank).get(10s)[3], 3u);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(procs.stop());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);  // no flush waits on stopped peers
    EXPECT_TRUE(all_dead(pids, 5s));
    for (const auto& w : g_warnings->take_warnings())
      ADD_FAILURE() << "round " << round << ": client logged: " << w;
  }
  std::lock_guard lock(mu);  // a worker's lines arrive before its exit (PH-2), so all are here
  for (const auto& l : worker_lines) {
    EXPECT_EQ(l.find("[warning]"), std::string::npos) << l;
    EXPECT_EQ(l.find("[error]"), std::string::npos) << l;
  }
}

struct Fault {
  const char* name;
  std::function<void(const ProcMesh&, const monarch::mesh::ActorMesh<Worker>&)> inject;
  const char* cause;
};

class ProcessFailure : public ::testing::TestWithParam<Fault> {};

TEST_P(ProcessFailure, BecomesAMeshFailureAndTheRestKeepsWorking) {  // PH-4, PH-5 (handled)
  const Fault& fault = GetParam();
  auto host = monarch::mesh::this_host(fast());
  Failures failures;
  SpawnOptions so;
  so.name = std::string("fault-") + fault.name;
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  auto workers = procs.lookup<Worker>("worker");
  auto pids = pids_of(procs);
  // A send (broadcast) to a proc that dies before acknowledging it comes back undeliverable to
  // the sender (CH-4); from outside actors that is the client's fault hook.
  host.set_fault_hook([](const monarch::ActorSupervisionEvent& e) {
    EXPECT_THAT(e.cause, HasSubstr("undeliverable"));
  });
  auto pending = procs.slice("gpus", 2).lookup<Blocker>("blocker").call_one(&Blocker::freeze);
  fault.inject(procs, workers);

  MeshFailure f = failures.wait_one();
  EXPECT_EQ(f.mesh, so.name);
  EXPECT_THAT(f.ranks, ElementsAre(2u));
  EXPECT_THAT(f.cause, HasSubstr(fault.cause));
  EXPECT_THAT(f.to_string(), HasSubstr("mesh " + so.name + ": rank [2] failed: "));
  EXPECT_THAT(procs.failed_ranks(), ElementsAre(2u));
  // The call pending on the failed rank fails at once instead of hanging.
  EXPECT_THROW(pending.get(10s), monarch::SupervisionError);
  // The failed proc is killed (a frozen one too), never reused; the others keep working.
  EXPECT_TRUE(all_dead({pids[2]}, 5s));
  auto ok = workers.slice("gpus", Range(0, 2)).call(&Worker::rank).get(10s);
  EXPECT_EQ(ok[1], 1u);
  EXPECT_EQ(workers.slice("gpus", 3).call_one(&Worker::rank).get(10s), 3u);
  EXPECT_THROW(procs.slice("gpus", 2).lookup<Worker>("worker"), monarch::UsageError);
  EXPECT_TRUE(procs.stop());
  EXPECT_TRUE(all_dead(pids, 5s));
  std::lock_guard lock(failures.mu);
  EXPECT_EQ(failures.got.size(), 1u);  // one failure, reported once
}

INSTANTIATE_TEST_SUITE_P(
    Faults, ProcessFailure,
    ::testing::Values(
        Fault{"exit3",
              [](auto&, auto& w) {
                (void)w.slice("gpus", 2).at(0).call(&Worker::crash, std::string("exit3"));
              },
              "exited with code 3 (its last line on stderr: rank 2 gives up)"},
        Fault{"sigkill", [](auto& p, auto&) { ::kill(p.pid(2), SIGKILL); },
              "killed by signal 9 (SIGKILL)"},
        Fault{"segv",
              [](auto&, auto& w) {
                (void)w.slice("gpus", 2).at(0).call(&Worker::crash, std::string("segv"));
              },
              "killed by signal 11 (SIGSEGV)"},
        Fault{"sigstop", [](auto& p, auto&) { ::kill(p.pid(2), SIGSTOP); }, "no heartbeat for"},
        Fault{"actor",
              [](auto&, auto& w) {
                w.slice("gpus", 2).broadcast(&Worker::crash, std::string("throw"));
              },
              "rank 2 exploded"}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(ProcessMesh, SpawnedActorsRunInTheWorkersAndTheirFailuresAreMeshFailures) {  // PH-4, PH-5
  auto host = monarch::mesh::this_host(fast());
  Failures failures;
  SpawnOptions so;
  so.name = "spawned";
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 3}}, so);
  auto workers = procs.spawn<Worker>("spawned", size_t{7});  // remote spawn, one per proc
  auto blockers = procs.spawn<Blocker>("blocker");
  auto got = workers.call(&Worker::rank).get(10s);
  auto pids = workers.call(&Worker::pid).get(10s);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], 7u);
    EXPECT_EQ(pids[r], procs.pid(r));  // each actor lives in its own worker process
  }
  // The receiver's rank in the cast view travels across processes: through the cast tree
  // (call) and on direct calls (call_one, choose).
  auto where = workers.call(&Worker::where).get(10s);
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(where[r], r);
  EXPECT_EQ(workers.slice("gpus", 2).call_one(&Worker::where).get(10s), 0u);
  EXPECT_EQ(workers.slice("gpus", monarch::ndslice::Range(1, 3))
                .slice("gpus", 1)
                .call_one(&Worker::where)
                .get(10s),
            0u);
  EXPECT_LT(workers.choose(&Worker::where).get(10s), 3u);
  auto stream = workers.slice("gpus", monarch::ndslice::Range(1, 3)).stream(&Worker::where);
  std::set<size_t> seen;
  for (int i = 0; i < 2; ++i) {
    auto [rank, value] = stream.next(10s);
    EXPECT_EQ(value.get(1s), rank);  // the rank within the streamed view
    seen.insert(rank);
  }
  EXPECT_EQ(seen, (std::set<size_t>{0, 1}));
  EXPECT_EQ(stream.remaining(), 0u);
  auto pending = blockers.slice("gpus", 1).call_one(&Blocker::freeze);
  workers.slice("gpus", 1).broadcast(&Worker::crash, std::string("throw"));
  MeshFailure f = failures.wait_one();
  EXPECT_THAT(f.ranks, ElementsAre(1u));
  EXPECT_THAT(f.cause, HasSubstr("unhandled actor failure"));
  EXPECT_THAT(f.cause, HasSubstr("rank 7 exploded"));
  EXPECT_THROW(pending.get(10s), monarch::SupervisionError);
  EXPECT_TRUE(all_dead({procs.pid(1)}, 5s));  // the failed proc is killed, never reused
  EXPECT_EQ(workers.slice("gpus", 2).call_one(&Worker::rank).get(10s), 7u);
  EXPECT_THROW(procs.spawn<Worker>("again", size_t{1}), monarch::UsageError);
  EXPECT_EQ(
      procs.slice("gpus", 0).spawn<Worker>("again", size_t{1}).call_one(&Worker::rank).get(10s),
      1u);
  EXPECT_TRUE(procs.stop());
}

// Issue 16 item 7: a remotely spawned member's Context::actor_rank() is its point in the whole
// ActorMesh; the point travels in the Spawn message, so init() sees it too.
std::string describe_actor_rank() {
  try {
    auto p = monarch::mesh::Context::actor_rank();
    return p.to_string() + " in " + p.extent().to_string();
  } catch (const monarch::UsageError& e) {
    return std::string("UsageError: ") + e.what();
  }
}
std::string point_in(const Extent& e, size_t rank) {
  return e.point(rank).to_string() + " in " + e.to_string();
}
struct RankProbe : monarch::Actor {
  void init() override { at_init_ = describe_actor_rank(); }
  std::string now() const { return describe_actor_rank(); }
  std::string at_init() const { return at_init_; }
  MONARCH_ENDPOINTS(RankProbe, now, at_init)
  std::string at_init_;
};

// Checks every member of `probes` (spawned on `procs` with per-proc {actors: 2}).
void expect_actor_ranks(const monarch::mesh::ActorMesh<RankProbe>& probes, const Extent& full) {
  ASSERT_EQ(probes.extent(), full);
  auto cast = probes.call(&RankProbe::now).get(10s);  // through the cast tree
  auto init = probes.call(&RankProbe::at_init).get(10s);
  for (size_t r = 0; r < full.num_ranks(); ++r) {
    EXPECT_EQ(cast[r], point_in(full, r));
    EXPECT_EQ(init[r], point_in(full, r));
    EXPECT_EQ(probes.at(r).call(&RankProbe::now).get(10s), point_in(full, r));  // direct call
  }
}

TEST(ProcessMesh, ActorRankIsThePointInTheWholeSpawnedMesh) {
  auto host = monarch::mesh::this_host(fast());
  Failures failures;
  SpawnOptions so;
  so.name = "ranks";
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"hosts", 2}, {"gpus", 2}}, so);  // 2x2 procs
  auto probes = procs.spawn<RankProbe>("probe", Extent{{"actors", 2}});
  const Extent full{{"hosts", 2}, {"gpus", 2}, {"actors", 2}};
  expect_actor_ranks(probes, full);
  // Through a slice, message ranks restart at 0; actor_rank stays the point in the whole mesh.
  auto host1 = probes.slice("hosts", 1).call(&RankProbe::now).get(10s);
  ASSERT_EQ(host1.size(), 4u);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(host1[r], point_in(full, 4 + r));
  // Spawned from a sliced ProcMesh: the point in that (smaller) ActorMesh.
  auto sub = procs.slice("gpus", 1).spawn<RankProbe>("sub");
  const Extent sub_extent{{"hosts", 2}};
  ASSERT_EQ(sub.extent(), sub_extent);
  auto in_sub = sub.call(&RankProbe::now).get(10s);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(in_sub[r], point_in(sub_extent, r));
  EXPECT_TRUE(failures.snapshot().empty());
  EXPECT_TRUE(procs.stop());
}

// A heartbeat answered later than heartbeat_timeout by an owner that is alive ends nothing: the
// worker keeps heartbeating and waits for the answer. Fault point mesh.heartbeat_reply_held
// stands in for what happened in python_tensor_test: the answers queued behind 400 MiB of
// tensors on the owner->worker link, and the worker exited "owner unreachable" after
// heartbeat_timeout (its owner then saw a MeshFailure).
TEST(ProcessMesh, AHeartbeatAnsweredLatePastTheTimeoutEndsNothing) {
  namespace pd = monarch::mesh::process_detail;
  const auto opts = fast();
  auto host = monarch::mesh::this_host(opts);
  Failures failures;
  SpawnOptions so;
  so.name = "late";
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  auto workers = procs.lookup<Worker>("worker");
  ASSERT_EQ(workers.call(&Worker::rank).get(10s)[1], 1u);
  pd::hold_heartbeat_replies();
  struct Release {
    ~Release() { monarch::mesh::process_detail::release_heartbeat_replies(); }
  } release;
  // Three heartbeat_timeouts without an answer: the first one ended both workers before.
  EXPECT_FALSE(failures.wait(1, 3 * opts.timeouts.heartbeat_timeout))
      << failures.snapshot().front().to_string();
  pd::release_heartbeat_replies();
  auto ranks = workers.call(&Worker::rank).get(10s);
  EXPECT_EQ(ranks[0], 0u);
  EXPECT_EQ(ranks[1], 1u);
  for (int pid : pids_of(procs)) EXPECT_TRUE(monarch::testing::process_alive(pid));
  EXPECT_TRUE(failures.snapshot().empty());
  EXPECT_TRUE(procs.stop());
}

// CAST-11: a cast right after ProcMesh::spawn travels through comm actors, not on the link that
// carried the Spawns; it must still reach every new actor (before the fence, ~1 run in 3 of
// bench_procs failed with "unknown actor"). Also CAST-10's member runs: a strided slice breaks
// them into single members, and every message rank must still land in its slot.
TEST(ProcessMesh, ACastRightAfterSpawnReachesEveryNewActor) {
  auto host = monarch::mesh::this_host(fast());
  Failures failures;
  SpawnOptions so;
  so.name = "fresh";
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  for (size_t round = 0; round < 16; ++round) {
    auto workers =
        procs.spawn<Worker>("fresh" + std::to_string(round), Extent{{"actors", 64}}, round);
    auto ranks = workers.call(&Worker::rank).get(10s);  // no wait between spawn and cast
    ASSERT_EQ(ranks.size(), 4u * 64u);
    for (size_t i = 0; i < ranks.size(); ++i) ASSERT_EQ(ranks[i], round) << "member " << i;
    auto strided =
        workers.slice("actors", Range(1, 64, 3));  // 21 members per proc, no two consecutive
    auto where = strided.call(&Worker::where).get(10s);
    ASSERT_EQ(where.size(), 4u * 21u);
    for (size_t i = 0; i < where.size(); ++i) ASSERT_EQ(where[i], i);
    EXPECT_EQ(strided.reduce(monarch::mesh::Sum{}, &Worker::where).get(10s), (84u * 83u) / 2);
  }
  EXPECT_TRUE(failures.snapshot().empty());
  EXPECT_TRUE(procs.stop());
}

// CAST-11 from inside an actor: a handler that spawns, casts and blocks on the reply must not
// wait on itself (the fence once waited for a continuation queued to that very actor).
struct Spawner : monarch::Actor {
  explicit Spawner(monarch::mesh::HostMesh* host) : host_(host) {}
  size_t spawn_and_cast() {
    auto procs = host_->spawn_procs(Extent{{"gpus", 2}}, SpawnOptions{.name = "inner"});
    auto workers = procs.spawn<Worker>("inner", size_t{5});
    auto ranks = workers.call(&Worker::rank).get(10s);
    procs.stop();
    return ranks[0] + ranks[1];
  }
  MONARCH_ENDPOINTS(Spawner, spawn_and_cast)
  monarch::mesh::HostMesh* host_;
};

TEST(ProcessMesh, AHandlerThatSpawnsCastsAndWaitsDoesNotWaitOnItself) {
  auto host = monarch::mesh::this_host(fast());
  auto spawner = host.client().spawn<Spawner>("spawner", &host);
  EXPECT_EQ(spawner.call(&Spawner::spawn_and_cast).get(20s), 10u);
}

// REM-6 for a mesh an actor owns: the owner hears a proc's failure in supervise(), so its
// broadcast that the proc never acknowledged is not reported to its undeliverable() a second
// time (that report failed an owner whose supervise() had handled the failure: a proc that dies
// within the channel's Ack window leaves what it was just sent unacknowledged, although its
// handler ran). An actor that does not own the mesh still gets its lost broadcast back.
struct MeshOwner : monarch::Actor {
  MeshOwner(monarch::mesh::HostMesh* host, std::shared_ptr<std::promise<MeshFailure>> failed)
      : host_(host), failed_(std::move(failed)) {}
  std::vector<int> start() {
    procs_ = host_->spawn_procs(Extent{{"gpus", 2}}, SpawnOptions{.name = "owned"});
    workers_ = procs_->spawn<Worker>("w", size_t{0});  // not lookup: it would wait on this actor
    return pids_of(*procs_);
  }
  monarch::mesh::ActorMesh<Worker> workers() const { return *workers_; }
  void lose(size_t rank) {
    workers_->slice("gpus", rank).broadcast(&Worker::say, std::string("x"));
  }
  std::vector<size_t> failed_ranks() const { return procs_->failed_ranks(); }
  std::vector<std::string> reports() const { return reports_; }
  bool supervise(const MeshFailure& f) override {
    failed_->set_value(f);
    return true;
  }
  void undeliverable(const monarch::DeliveryFailure& f) override { reports_.push_back(f.what()); }
  MONARCH_ENDPOINTS(MeshOwner, start, workers, lose, failed_ranks, reports)
  monarch::mesh::HostMesh* host_;
  std::shared_ptr<std::promise<MeshFailure>> failed_;
  std::optional<ProcMesh> procs_;
  std::optional<monarch::mesh::ActorMesh<Worker>> workers_;
  std::vector<std::string> reports_;
};

struct Stranger : monarch::Actor {
  explicit Stranger(std::shared_ptr<std::promise<std::string>> lost) : lost_(std::move(lost)) {}
  void lose(monarch::mesh::ActorMesh<Worker> workers, size_t rank) {
    workers.slice("gpus", rank).broadcast(&Worker::say, std::string("y"));
  }
  void undeliverable(const monarch::DeliveryFailure& f) override { lost_->set_value(f.what()); }
  MONARCH_ENDPOINTS(Stranger, lose)
  std::shared_ptr<std::promise<std::string>> lost_;
};

TEST(ProcessMesh, REM6_AnOwnerIsNotToldTwiceOfABroadcastLostWithItsProc) {
  auto host = monarch::mesh::this_host(fast());
  auto failed = std::make_shared<std::promise<MeshFailure>>();
  auto lost = std::make_shared<std::promise<std::string>>();
  auto owner = host.client().spawn<MeshOwner>("owner", &host, failed);
  auto stranger = host.client().spawn<Stranger>("stranger", lost);
  auto pids = owner.call(&MeshOwner::start).get(20s);
  ASSERT_EQ(pids.size(), 2u);
  // Rank 0 stopped, so neither broadcast to it is acknowledged; both wait on the client's link to
  // it (rank 0 is the root of the cast tree: no relay). Then it is killed: its exit, not the
  // heartbeat timeout or the link's delivery timeout, declares it failed, which returns both.
  ASSERT_TRUE(monarch::testing::freeze(pids[0]));
  owner.call(&MeshOwner::lose, size_t{0}).get(10s);
  stranger.call(&Stranger::lose, owner.call(&MeshOwner::workers).get(10s), size_t{0}).get(10s);
  ASSERT_EQ(::kill(pids[0], SIGKILL), 0);
  auto f = failed->get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
  EXPECT_THAT(f.get().ranks, ElementsAre(0u));
  // The two come back in the order they were sent, so once the stranger's report is in, the
  // owner's was dropped or posted to it, ahead of the next call.
  auto l = lost->get_future();
  ASSERT_EQ(l.wait_for(20s), std::future_status::ready);
  EXPECT_THAT(l.get(), HasSubstr("its proc was declared failed"));
  EXPECT_EQ(owner.call(&MeshOwner::reports).get(10s), std::vector<std::string>{});
  EXPECT_THAT(owner.call(&MeshOwner::failed_ranks).get(10s), ElementsAre(0u));  // and it lives
}

TEST(ProcessMesh, UnhandledFailureGoesToTheClientFaultHook) {  // PH-5
  auto host = monarch::mesh::this_host(fast());
  std::promise<std::string> report;
  std::atomic<bool> once{false};
  host.set_fault_hook([&](const monarch::ActorSupervisionEvent& e) {
    if (!once.exchange(true)) report.set_value(e.to_string());
  });
  SpawnOptions so;
  so.name = "unhandled";
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  ::kill(procs.pid(1), SIGKILL);
  auto f = report.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_THAT(f.get(), HasSubstr("mesh unhandled: rank [1] failed: killed by signal 9 (SIGKILL)"));
}

TEST(ProcessMesh, StopFinishesWithinItsDeadlineWhenRanksAreFrozenOrDead) {  // PH-6
  auto opts = fast();
  opts.timeouts.stop_timeout = 1s;
  auto host = monarch::mesh::this_host(opts);
  Failures failures;
  SpawnOptions so;
  so.name = "stopper";
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 3}}, so);
  auto pids = pids_of(procs);
  ::kill(pids[0], SIGSTOP);
  ::kill(pids[1], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(procs.stop());  // rank 0 did not exit when asked: it was killed
  EXPECT_LT(std::chrono::steady_clock::now() - t0,
            1s + 1s + 1s);  // stop_timeout + kill grace + slack
  EXPECT_TRUE(all_dead(pids, 5s));
}

TEST(ProcessMesh, LogLinesArriveWithTheRankPrefix) {
  std::mutex mu;
  std::vector<std::string> lines;
  std::condition_variable cv;
  SpawnOptions so;
  so.name = "logs";
  so.log_sink = [&](const LogRecord& r) {
    std::lock_guard lock(mu);
    lines.push_back((r.stream == 2 ? "E " : "O ") + r.to_string());
    cv.notify_all();
  };
  auto host = monarch::mesh::this_host(fast());
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return lines.size() >= 6; })) << lines.size();
  for (size_t r = 0; r < 2; ++r) {
    auto rs = std::to_string(r);
    EXPECT_THAT(lines, ::testing::Contains("O [logs " + rs + "] hello from rank " + rs));
    EXPECT_THAT(lines, ::testing::Contains("O [logs " + rs + "] same on every rank"));
    EXPECT_THAT(lines, ::testing::Contains("E [logs " + rs + "] warning from rank " + rs));
  }
}

TEST(ProcessMesh, RepeatedLinesAggregateOverAWindow) {
  std::mutex mu;
  std::vector<LogRecord> recs;
  std::condition_variable cv;
  SpawnOptions so;
  so.name = "logs-agg";
  so.log_sink = [&](const LogRecord& r) {
    std::lock_guard lock(mu);
    recs.push_back(r);
    cv.notify_all();
  };
  auto opts = fast();
  opts.timeouts.log_window = 300ms;
  auto host = monarch::mesh::this_host(opts);
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  std::unique_lock lock(mu);
  auto same = [&] {
    std::vector<size_t> ranks;
    for (auto& r : recs) {
      if (r.text == "same on every rank") ranks.insert(ranks.end(), r.ranks.begin(), r.ranks.end());
    }
    return ranks;
  };
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return same().size() == 4; }));
  // Each rank's line counted once, and at least two ranks shared one record.
  auto ranks = same();
  std::sort(ranks.begin(), ranks.end());
  EXPECT_THAT(ranks, ElementsAre(0u, 1u, 2u, 3u));
  size_t records = 0;
  for (auto& r : recs) records += r.text == "same on every rank";
  EXPECT_LT(records, 4u);
  for (auto& r : recs) {
    if (r.text == "same on every rank" && r.ranks.size() > 1) {
      EXPECT_THAT(r.to_string(), HasSubstr("[logs-agg "));
    }
  }
}

// ProcMesh::set_log_window: the aggregation window changes while the mesh runs (Python's
// logging_option(aggregate_window_sec=...)); back to 0, every line is its own record.
TEST(ProcessMesh, TheLogWindowChangesWhileTheMeshRuns) {
  std::mutex mu;
  std::vector<LogRecord> recs;
  std::condition_variable cv;
  SpawnOptions so;
  so.name = "window";
  so.log_sink = [&](const LogRecord& r) {
    std::lock_guard lock(mu);
    recs.push_back(r);
    cv.notify_all();
  };
  auto host = monarch::mesh::this_host(fast());  // log_window 0: no aggregation to start with
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  auto workers = procs.lookup<Worker>("worker");
  EXPECT_THROW(procs.set_log_window(-1ms), monarch::UsageError);
  auto records_of = [&](const std::string& text) {
    std::vector<LogRecord> out;
    for (auto& r : recs) {
      if (r.text == text) out.push_back(r);
    }
    return out;
  };
  auto ranks_in = [](const std::vector<LogRecord>& rs) {
    std::vector<size_t> out;
    for (auto& r : rs) out.insert(out.end(), r.ranks.begin(), r.ranks.end());
    std::sort(out.begin(), out.end());
    return out;
  };
  procs.set_log_window(500ms);
  (void)workers.call(&Worker::say, std::string("together")).get(10s);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, 10s, [&] { return ranks_in(records_of("together")).size() == 4; }));
    EXPECT_THAT(ranks_in(records_of("together")), ElementsAre(0u, 1u, 2u, 3u));
    EXPECT_LT(records_of("together").size(), 4u);  // some ranks shared one record
  }
  procs.set_log_window(0ms);
  (void)workers.call(&Worker::say, std::string("alone")).get(10s);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return records_of("alone").size() == 4; }));
  for (auto& r : records_of("alone")) EXPECT_EQ(r.ranks.size(), 1u) << r.to_string();
}

TEST(ProcessMesh, AgentProcessesAndAttachToWorkers) {
  std::string stem = "unix://@monarch-agent-test-" + std::to_string(::getpid());
  monarch::testing::Subprocess agent0(MONARCH_CLI, {"agent", "--listen", stem + "-0"});
  monarch::testing::Subprocess agent1(MONARCH_CLI, {"agent", "--listen", stem + "-1"});
  std::string a0 = agent0.listening(), a1 = agent1.listening();
  auto hosts = monarch::mesh::attach_to_workers({a0, a1}, fast());
  EXPECT_EQ(hosts.extent().to_string(), "{hosts=2}");
  Failures failures;
  SpawnOptions so;
  so.name = "attached";
  so.on_failure = failures.handler();
  auto procs = hosts.spawn_procs(Extent{{"gpus", 2}}, so);
  EXPECT_EQ(procs.extent().to_string(), "{hosts=2, gpus=2}");
  auto workers = procs.lookup<Worker>("worker");
  auto ranks = workers.call(&Worker::rank).get(10s);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r], r);
  expect_actor_ranks(procs.spawn<RankProbe>("probe", Extent{{"actors", 2}}),
                     Extent{{"hosts", 2}, {"gpus", 2}, {"actors", 2}});
  auto pids = pids_of(procs);

  // Host 1's agent dies: its workers die with it and its ranks fail; host 0 keeps working.
  agent1.kill(SIGKILL);
  EXPECT_TRUE(all_dead({pids[2], pids[3]}, 5s));
  std::unique_lock lock(failures.mu);
  ASSERT_TRUE(failures.cv.wait_for(lock, 10s, [&] { return failures.got.size() >= 2; }));
  std::set<size_t> failed;
  for (auto& f : failures.got) failed.insert(f.ranks.begin(), f.ranks.end());
  lock.unlock();
  EXPECT_EQ(failed, (std::set<size_t>{2, 3}));
  for (auto& f : failures.snapshot()) EXPECT_THAT(f.cause, HasSubstr("host agent " + a1 + " lost"));
  EXPECT_EQ(workers.slice("hosts", 0).call(&Worker::rank).get(10s)[1], 1u);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(procs.stop());
  EXPECT_LT(std::chrono::steady_clock::now() - t0,
            fast().timeouts.stop_timeout);  // not waiting on the dead
  EXPECT_TRUE(all_dead(pids, 5s));
}

// Nobody listens at the address: the error says what to check, not "Future::get: timed out".
TEST(ProcessMesh, AttachingToAnAddressWithoutAnAgentTimesOutSayingWhatToCheck) {
  HostOptions o = fast();
  o.timeouts.spawn_timeout = 3s;  // above heartbeat_timeout, below the channel's delivery_timeout
  const std::string addr = "unix://@monarch-no-agent-" + std::to_string(::getpid());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)monarch::mesh::attach_to_workers({addr}, o);
    FAIL() << "attached to " << addr << ", where nothing listens";
  } catch (const monarch::TimeoutError& e) {
    // It gives up after spawn_timeout, not after a further stop_timeout spent flushing the
    // lookup to nobody (it took 5 s here).
    EXPECT_LT(std::chrono::steady_clock::now() - t0, o.timeouts.spawn_timeout + 1s);
    EXPECT_THAT(e.what(), HasSubstr("host agent " + addr + " did not answer within 3000 ms"));
    // The channel retries a peer that is down quietly (CH-7): the error itself says why.
    EXPECT_THAT(e.what(), HasSubstr("the last connection attempt failed: Connection refused"));
    EXPECT_THAT(e.what(), HasSubstr("monarch agent --listen " + addr));
  }
}

// PH-8: an agent of another protocol version (another monarch build) is refused when the client
// attaches, with an error that names the agent and both versions, instead of attaching and failing
// the first spawn with "malformed input". An agent of this build attaches and spawns.
TEST(ProcessMesh, AnAgentOfAnotherWireVersionIsRefusedAtAttach) {
  std::string stem = "unix://@monarch-agent-version-" + std::to_string(::getpid());
  const std::string theirs = std::to_string(monarch::mesh::process_detail::kAgentWireVersion + 1);
  monarch::testing::Subprocess other(
      "/usr/bin/env", {"MONARCH_TESTING_AGENT_WIRE_VERSION=" + theirs, MONARCH_CLI, "agent",
                       "--listen", stem + "-other"});
  monarch::testing::Subprocess same(MONARCH_CLI, {"agent", "--listen", stem + "-same"});
  const std::string a_other = other.listening(), a_same = same.listening();
  try {
    (void)monarch::mesh::attach_to_workers({a_same, a_other}, fast());
    FAIL() << "attached to an agent of wire version " << theirs;
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("host agent " + a_other + " speaks agent wire version " + theirs +
                          ", this program " +
                          std::to_string(monarch::mesh::process_detail::kAgentWireVersion)));
    EXPECT_THAT(e.what(), HasSubstr("same monarch build"));
  }
  auto hosts = monarch::mesh::attach_to_workers({a_same}, fast());
  auto procs = hosts.spawn_procs(Extent{{"gpus", 1}}, {.name = "versioned"});
  EXPECT_EQ(procs.lookup<Worker>("worker").call(&Worker::rank).get(10s)[0], 0u);
  EXPECT_TRUE(procs.stop());
}

// PH-3: the agent is killed (-9) and a new one serves the same address. The client must not take
// the new agent for the old one: the old procs died with their agent (PDEATHSIG) and become one
// MeshFailure per rank whose cause names the agent, calls pending on them fail with
// SupervisionError, and the restarted agent serves a new mesh.
TEST(ProcessMesh, AnAgentRestartFailsItsProcsAndTheNewAgentServes) {
  const std::string addr = "unix://@monarch-agent-restart-" + std::to_string(::getpid());
  std::optional<monarch::testing::Subprocess> agent;
  agent.emplace(MONARCH_CLI, std::vector<std::string>{"agent", "--listen", addr});
  ASSERT_EQ(agent->listening(), addr);
  auto hosts = monarch::mesh::attach_to_workers({addr}, fast());
  Failures failures;
  SpawnOptions so;
  so.name = "restarted";
  so.on_failure = failures.handler();
  auto procs = hosts.spawn_procs(Extent{{"gpus", 2}}, so);
  auto workers = procs.lookup<Worker>("worker");
  ASSERT_EQ(workers.call(&Worker::rank).get(10s)[1], 1u);
  auto pids = pids_of(procs);
  auto pending = procs.slice("gpus", 1).lookup<Blocker>("blocker").call_one(&Blocker::freeze);

  agent->kill(SIGKILL);
  EXPECT_TRUE(all_dead(pids, 5s)) << "a worker outlived its agent";
  agent.emplace(MONARCH_CLI, std::vector<std::string>{"agent", "--listen", addr});
  ASSERT_EQ(agent->listening(), addr);

  ASSERT_TRUE(failures.wait(2, 10s)) << "the agent restart was not detected";
  std::set<size_t> failed;
  for (const MeshFailure& f : failures.snapshot()) {
    EXPECT_EQ(f.mesh, "restarted");
    EXPECT_THAT(f.cause, ::testing::AnyOf(HasSubstr("host agent " + addr + " restarted"),
                                          HasSubstr("host agent " + addr + " lost")));
    EXPECT_THAT(f.cause, HasSubstr("the procs it started died with it"));
    failed.insert(f.ranks.begin(), f.ranks.end());
  }
  EXPECT_EQ(failed, (std::set<size_t>{0, 1}));
  EXPECT_THAT(procs.failed_ranks(), ElementsAre(0u, 1u));
  EXPECT_THROW(pending.get(10s), monarch::SupervisionError);
  auto known = workers.call(&Worker::rank).get(10s);  // known dead: fails at once, per rank
  EXPECT_EQ(known.failed_ranks(), (std::vector<size_t>{0, 1}));
  EXPECT_THROW(known.throw_if_failed(), monarch::SupervisionError);
  auto t0 = std::chrono::steady_clock::now();
  procs.stop();  // every rank failed already: nothing to wait for
  EXPECT_LT(std::chrono::steady_clock::now() - t0, fast().timeouts.stop_timeout);
  EXPECT_EQ(failures.snapshot().size(), 2u);  // each rank reported once

  // The restarted agent serves the same HostMesh; its procs are not taken for old ones.
  Failures later;
  SpawnOptions again;
  again.name = "after-restart";
  again.on_failure = later.handler();
  auto fresh = hosts.spawn_procs(Extent{{"gpus", 2}}, again);
  EXPECT_EQ(fresh.lookup<Worker>("worker").call(&Worker::rank).get(10s)[1], 1u);
  EXPECT_FALSE(later.wait(1, 3 * fast().timeouts.heartbeat_interval))
      << later.snapshot().front().to_string();
  auto fresh_pids = pids_of(fresh);
  EXPECT_TRUE(fresh.stop());
  EXPECT_TRUE(all_dead(fresh_pids, 5s));
}

// spawn_procs on an attached host whose agent is frozen, then gone: the error names the agent
// and what was seen ("Future::get: timed out waiting for the result" said neither).
TEST(ProcessMesh, SpawningOnAFrozenOrLostAgentSaysSo) {
  const std::string addr = "unix://@monarch-agent-lost-" + std::to_string(::getpid());
  monarch::testing::Subprocess agent(MONARCH_CLI, {"agent", "--listen", addr});
  ASSERT_EQ(agent.listening(), addr);
  HostOptions o = fast();
  o.timeouts.spawn_timeout = 3s;  // below the channel's delivery_timeout (5 s)
  auto hosts = monarch::mesh::attach_to_workers({addr}, o);
  SpawnOptions so;
  so.name = "on-lost";
  auto spawn_error = [&] {
    try {
      (void)hosts.spawn_procs(Extent{{"gpus", 1}}, so);
      ADD_FAILURE() << "spawned on an agent that cannot answer";
    } catch (const monarch::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("host agent " + addr + " could not spawn: "));
      return std::string(e.what());
    }
    return std::string();
  };
  agent.kill(SIGSTOP);
  EXPECT_THAT(spawn_error(), HasSubstr("no answer within mesh.spawn_timeout (3000 ms): the agent "
                                       "is frozen, overloaded or lost"));
  agent.kill(SIGCONT);
  agent.kill(SIGKILL);  // reaped
  // Either the spawn times out, or the link gives up first (its delivery timeout counts from the
  // oldest unacknowledged message, which may be the frozen agent's spawn): both say why.
  EXPECT_THAT(spawn_error(),
              ::testing::AnyOf(HasSubstr("the agent is lost (the last connection attempt failed: "
                                         "Connection refused)"),
                               HasSubstr("(last connection error: Connection refused)")));
}

// Replies of a chosen size.
struct Blobs : monarch::Actor {
  std::string make(uint64_t n) const { return std::string(n, 'x'); }
  MONARCH_ENDPOINTS(Blobs, make)
};

// A reply over the workers' channel.max_frame_bytes fails its call with a named error instead of
// never completing (issue 16 item 4): a direct call, and a cast whose gathered reply at the root of
// the tree is over the limit although every member's fits (the hop's reply, CommActor::cast, takes
// the same path). The mesh keeps working.
TEST(ProcessMesh, AnOversizeReplyFailsItsCallNamingTheLimit) {
  auto host = monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "oversize";
  so.env = {"MONARCH_CHANNEL_MAX_FRAME_BYTES=1MiB"};
  auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
  auto blobs = procs.spawn<Blobs>("blobs");
  try {
    blobs.slice("gpus", 1).call_one(&Blobs::make, uint64_t{2} << 20).get(10s);
    FAIL() << "a 2 MiB reply arrived over a 1 MiB limit";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr("Blobs::make to "));
    EXPECT_THAT(e.what(), HasSubstr("blobs"));
    EXPECT_THAT(e.reason(), HasSubstr("exceeds channel.max_frame_bytes (1048576)"));
  }
  try {
    auto all = blobs.call(&Blobs::make, uint64_t{400} << 10).get(10s);
    (void)all[0];  // where failures are per rank, the rank's error
    FAIL() << "4 x 400 KiB arrived through a root with a 1 MiB limit";
  } catch (const monarch::Error& e) {
    EXPECT_EQ(e.code(), monarch::ErrorCode::Delivery) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("max_frame_bytes (1048576)"));
  }
  EXPECT_EQ(blobs.call(&Blobs::make, uint64_t{10}).get(10s)[3], std::string(10, 'x'));
  EXPECT_EQ(blobs.slice("gpus", 2).call_one(&Blobs::make, uint64_t{1} << 19).get(10s).size(),
            size_t{1} << 19);
  EXPECT_TRUE(procs.stop());
}

// An actor of the client that holds the client's own HostMesh and a mesh of its procs: neither is
// ever destroyed by the program, only by the exit handler (keep_hosts_at_exit in process.hpp).
struct Keeper : monarch::Actor {
  Keeper(monarch::mesh::HostMesh host, ProcMesh procs)
      : host_(std::move(host)), procs_(std::move(procs)) {}
  void cleanup(const std::optional<monarch::ActorSupervisionEvent>&) override {
    std::printf("CLEANUP %zu procs\n", procs_.size());
    std::fflush(stdout);
  }
  int freeze() {
    std::promise<void> never;
    never.get_future().wait();
    return 0;
  }
  MONARCH_ENDPOINTS(Keeper, freeze)
  monarch::mesh::HostMesh host_;
  ProcMesh procs_;
};

// "keeper-exit": main returns while a Keeper holds the HostMesh; "keeper-stuck-exit": the same,
// with the Keeper frozen in a handler.
int run_keeper_client(const std::string& mode) {
  auto host = monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "kept";
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  for (size_t i = 0; i < procs.size(); ++i) std::printf("PID %d\n", procs.pid(i));
  auto keeper = host.client().spawn<Keeper>("keeper", host, procs);
  if (mode == "keeper-stuck-exit") keeper.send(&Keeper::freeze);
  std::printf("READY\n");
  std::fflush(stdout);
  return 0;  // host, procs and keeper's ref go; the Keeper keeps the HostMesh alive
}

// A child that starts a `monarch agent` as the chaos harness does (die_with_parent), prints its
// pid, and waits to be killed.
int run_agent_parent() {
  monarch::testing::Subprocess agent(
      MONARCH_CLI,
      {"agent", "--listen", "unix://@monarch-agent-parent-" + std::to_string(::getpid())},
      /*die_with_parent=*/true);
  agent.listening();
  std::printf("PID %d\nREADY\n", agent.pid());
  std::fflush(stdout);
  while (true) ::pause();
}

// A client in a child process: spawns 3 workers, prints their pids, then ends as told.
int run_client(const std::string& mode) {
  if (mode.starts_with("keeper-")) return run_keeper_client(mode);
  if (mode == "agent-parent") return run_agent_parent();
  const char* agent = std::getenv("MONARCH_TEST_AGENT");  // attach to it instead of this_host()
  auto host = agent != nullptr ? monarch::mesh::attach_to_workers({agent}, fast())
                               : monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "client";
  so.fork_server = mode.starts_with("fork-");
  auto procs = host.spawn_procs(Extent{{"gpus", 3}}, so);
  for (size_t i = 0; i < procs.size(); ++i) std::printf("PID %d\n", procs.pid(i));
  for (pid_t server : monarch::mesh::process_detail::ProcessHost::instance().fork_servers())
    std::printf("SERVER %d\n", server);
  std::printf("READY\n");
  std::fflush(stdout);
  if (!mode.ends_with("sigkill") && !mode.ends_with("sigstop")) {
    char c;
    while (::read(0, &c, 1) > 0) {  // until the test closes our stdin
    }
  }
  if (mode.ends_with("exit")) return 0;
  if (mode == "throw") throw std::runtime_error("client threw");
  if (mode == "unhandled") {
    ::kill(procs.pid(1), SIGKILL);  // default fault hook: print and exit(1)
  }
  while (true) ::pause();  // "sigkill", "sigstop": the test kills or freezes us
}

std::string self_exe() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(self, static_cast<size_t>(n));
}

class NoOrphans : public ::testing::TestWithParam<std::string> {};

TEST_P(NoOrphans, NoWorkerSurvivesItsClient) {  // PH-1 (and PH-7: nor its fork server)
  if (GetParam().starts_with("fork-")) SKIP_WITHOUT_FORK_SERVER();
  std::optional<monarch::testing::Subprocess> agent;
  if (GetParam().starts_with("agent-")) {
    // Workers of a remote agent: the agent outlives the client; they must notice and exit.
    agent.emplace(MONARCH_CLI, std::vector<std::string>{
                                   "agent", "--listen",
                                   "unix://@monarch-orphan-agent-" + std::to_string(::getpid())});
    ::setenv("MONARCH_TEST_AGENT", agent->listening().c_str(), 1);
  }
  ::setenv("MONARCH_TEST_CLIENT", GetParam().c_str(), 1);
  monarch::testing::Subprocess client(self_exe(), {});
  ::unsetenv("MONARCH_TEST_CLIENT");
  ::unsetenv("MONARCH_TEST_AGENT");
  std::vector<int> pids, servers;
  while (true) {
    auto l = client.line(20s);
    ASSERT_TRUE(l.has_value()) << "client ended before READY";
    if (*l == "READY") break;
    if (l->starts_with("PID ")) pids.push_back(std::stoi(l->substr(4)));
    if (l->starts_with("SERVER ")) servers.push_back(std::stoi(l->substr(7)));
  }
  ASSERT_EQ(pids.size(), 3u);
  if (GetParam().starts_with("fork-")) {
    ASSERT_EQ(servers.size(), 1u) << "no fork server";
    pids.insert(pids.end(), servers.begin(), servers.end());
  }
  for (int p : pids) EXPECT_TRUE(monarch::testing::process_alive(p));
  if (GetParam().ends_with("sigkill")) {
    client.kill(SIGKILL);
  } else if (GetParam().ends_with("sigstop")) {
    // A frozen client acknowledges nothing: each worker's link to it closes after the
    // worker's delivery_timeout (its heartbeat_timeout), failing the heartbeats pending on it.
    client.kill(SIGSTOP);
  } else {
    client.close_stdin();
  }
  EXPECT_TRUE(all_dead(pids, 10s)) << "a worker outlived its client";
}

INSTANTIATE_TEST_SUITE_P(ClientEnds, NoOrphans,
                         ::testing::Values("exit", "throw", "sigkill", "sigstop", "unhandled",
                                           "agent-sigkill", "agent-sigstop", "fork-sigkill",
                                           "fork-exit"),
                         [](const auto& p) {
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A run_client child in `mode`, and the pids it printed once it printed READY (none when it ended
// before).
std::pair<std::unique_ptr<monarch::testing::Subprocess>, std::vector<int>> start_client(
    const std::string& mode) {
  ::setenv("MONARCH_TEST_CLIENT", mode.c_str(), 1);
  auto client =
      std::make_unique<monarch::testing::Subprocess>(self_exe(), std::vector<std::string>{});
  ::unsetenv("MONARCH_TEST_CLIENT");
  std::vector<int> pids;
  std::optional<std::string> l;
  while ((l = client->line(20s)) && *l != "READY") {
    if (l->starts_with("PID ")) pids.push_back(std::stoi(l->substr(4)));
  }
  if (!l) pids.clear();
  return {std::move(client), std::move(pids)};
}

// A HostMesh that only an actor of its own client holds (a cycle) is stopped at exit, before the
// static destructors: the actor's cleanup runs, the program exits 0, and its workers are gone. It
// used to stay up: its I/O thread ran into the static destructors and, in one CI run, crashed
// there (getting_started under ASan, whose Controller holds its HostMesh).
TEST(ClientEnds, AHostMeshKeptByItsOwnActorIsStoppedAtExit) {
  auto [client, pids] = start_client("keeper-exit");
  ASSERT_EQ(pids.size(), 2u) << "client ended before READY";
  EXPECT_EQ(client->line(20s).value_or("<no line: the Keeper was not stopped>"), "CLEANUP 2 procs");
  auto status = client->wait(20s);
  ASSERT_TRUE(status.has_value()) << "the client did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_TRUE(all_dead(pids, 10s));
}

// The same with the Keeper frozen in a handler: the exit waits the client Proc's stop_timeout
// (actor.stop_timeout, 5 s) for it, then goes on; it neither hangs nor fails.
TEST(ClientEnds, AHostMeshWhoseActorIsFrozenAtExitDoesNotHoldTheExit) {
  auto [client, pids] = start_client("keeper-stuck-exit");
  ASSERT_EQ(pids.size(), 2u) << "client ended before READY";
  auto status = client->wait(20s);
  ASSERT_TRUE(status.has_value()) << "the client did not exit";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_TRUE(all_dead(pids, 10s));
}

// testing::Subprocess's die_with_parent, as the chaos harness starts its agents: a parent killed
// takes its agent along (an interrupted bench_chaos used to leave its 4 agents running).
TEST(ClientEnds, AnAgentStartedToDieWithItsParentGoesWhenTheParentIsKilled) {
  auto [parent, pids] = start_client("agent-parent");
  ASSERT_EQ(pids.size(), 1u) << "the parent ended before READY";
  EXPECT_TRUE(monarch::testing::process_alive(pids[0]));
  parent->kill(SIGKILL);
  EXPECT_TRUE(all_dead(pids, 10s)) << "the agent outlived its parent";
}

// mesh.cast_fanout shapes the tree of a process mesh (issue 16 item 1). 4 procs: with fan-out 2
// the path to proc 2 is 0 -> 1 -> 2, so a cast to proc 2 waits while proc 1 is frozen; with the
// default 16 it goes 0 -> 2 and does not.
TEST(ProcessMesh, CastFanoutFromTheConfigShapesTheTree) {
  auto host = monarch::mesh::this_host(fast());
  for (int fanout : {2, 16}) {
    SCOPED_TRACE("fanout " + std::to_string(fanout));
    monarch::testing::IntConfigOverride c("mesh.cast_fanout", std::to_string(fanout));
    SpawnOptions so;
    so.name = "fanout" + std::to_string(fanout);
    EXPECT_EQ(so.cast.fanout, static_cast<size_t>(fanout));
    auto procs = host.spawn_procs(Extent{{"gpus", 4}}, so);
    auto workers = procs.lookup<Worker>("worker");
    ASSERT_EQ(workers.slice("gpus", 2).call(&Worker::rank).get(10s)[0], 2u);  // warm links
    ASSERT_TRUE(monarch::testing::freeze(procs.pid(1)));
    auto f = workers.slice("gpus", 2).call(&Worker::rank);
    if (fanout == 2) {
      // It cannot complete before proc 1 runs again (well within the heartbeat timeout).
      EXPECT_FALSE(f.wait_for(300ms)) << "the cast did not go through proc 1";
    } else {
      EXPECT_TRUE(f.wait_for(10s)) << "the cast waited on proc 1";
    }
    ::kill(procs.pid(1), SIGCONT);
    EXPECT_EQ(f.get(10s)[0], 2u);
    EXPECT_TRUE(procs.stop());
  }
}

// CAST-12: the cast tree routes around procs known dead, whether they were leaves, interior
// nodes or proc 0, and nothing waits out a failure already known (issue 16 items 2 and 3).
// 8 procs, fan-out 2: 0 -> {1, 5}; 1 -> {2, 4}; 2 -> {3}; 5 -> {6, 7}.
TEST(ProcessMesh, CAST12_CastsRouteAroundADeadRootAndADeadInteriorNode) {
  auto o = fast();
  auto host = monarch::mesh::this_host(o);
  Failures failures;
  SpawnOptions so;
  so.name = "cast12";
  so.on_failure = failures.handler();
  so.cast.fanout = 2;
  auto procs = host.spawn_procs(Extent{{"gpus", 8}}, so);
  auto workers = procs.lookup<Worker>("worker");
  auto pids = pids_of(procs);
  ASSERT_EQ(monarch::mesh::detail::cast_path(8, 2, 3), (std::vector<uint32_t>{0, 1, 2, 3}));
  // Well under the delivery timeout: a known failure is never waited out.
  const auto quick = o.channel.delivery_timeout / 2;

  ::kill(pids[0], SIGKILL);
  ASSERT_THAT(failures.wait_one().ranks, ElementsAre(0u));
  // The slice 1:8 holds only live procs: its cast is rooted at its own live members.
  auto live = workers.slice("gpus", Range(1, 8)).call(&Worker::rank).get(quick);
  EXPECT_TRUE(live.all_ok());
  for (size_t r = 0; r < 7; ++r) EXPECT_EQ(live[r], r + 1);
  // The whole mesh: rank 0 holds its SupervisionError at once, the others answer.
  auto all = workers.call(&Worker::rank).get(quick);
  EXPECT_THAT(all.failed_ranks(), ElementsAre(0u));
  EXPECT_EQ(all[7], 7u);
  try {
    (void)all[0];
    ADD_FAILURE() << "rank 0 answered";
  } catch (const monarch::SupervisionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("mesh cast12: rank [0] failed"));
  }
  // reduce and broadcast cannot leave a member out: they refuse at once, naming it.
  try {
    (void)workers.reduce(monarch::mesh::Sum{}, &Worker::rank).get(quick);
    ADD_FAILURE() << "the reduce succeeded";
  } catch (const monarch::SupervisionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0"));
    EXPECT_THAT(e.what(), HasSubstr("survivors()"));
  }
  EXPECT_THROW(workers.broadcast(&Worker::where), monarch::SupervisionError);
  // survivors(): exactly the live members, with message ranks in that view.
  auto alive = workers.survivors();
  EXPECT_EQ(alive.size(), 7u);
  EXPECT_EQ(alive.reduce(monarch::mesh::Sum{}, &Worker::rank).get(quick), 28u);
  EXPECT_EQ(alive.reduce(monarch::mesh::Sum{}, &Worker::where).get(quick), 21u);
  EXPECT_EQ(alive.parent_point(0).rank(), 1u);
  alive.broadcast(&Worker::where);

  // An interior node: proc 1 relays for 2, 3 and 4.
  ::kill(pids[1], SIGKILL);
  ASSERT_TRUE(failures.wait(2, 10s));
  ASSERT_THAT(failures.snapshot().back().ranks, ElementsAre(1u));
  auto rest = workers.survivors().call(&Worker::rank).get(quick);
  EXPECT_TRUE(rest.all_ok());
  EXPECT_EQ(rest.size(), 6u);
  for (size_t r = 0; r < 6; ++r) EXPECT_EQ(rest[r], r + 2);
  auto below = workers.slice("gpus", Range(2, 5)).call(&Worker::rank).get(quick);
  EXPECT_TRUE(below.all_ok());
  // select(): a selection in text form over the view's dims.
  auto odd = workers.survivors().select("3:6");
  EXPECT_EQ(odd.size(), 3u);
  EXPECT_EQ(odd.reduce(monarch::mesh::Sum{}, &Worker::rank).get(quick), 5u + 6u + 7u);
  EXPECT_EQ(workers.select("0:2").size(), 2u);              // a selection says nothing of liveness
  EXPECT_THROW(workers.select("9:"), monarch::UsageError);  // picks no member

  // In flight: proc 3 freezes under a cast that proc 2 relays to it. Once the freeze is detected,
  // the cast resolves: proc 3's member holds a named error, the others answered (CAST-7, CAST-12).
  ASSERT_TRUE(monarch::testing::freeze(pids[3]));  // every thread: none answers after this
  auto frozen = workers.slice("gpus", Range(2, 8)).call(&Worker::rank);
  ASSERT_TRUE(failures.wait(3, 10s));
  auto got = frozen.get(o.channel.delivery_timeout);
  ASSERT_THAT(got.failed_ranks(), ElementsAre(1u));  // error(1) below must hold an error
  for (size_t r : {0u, 2u, 3u, 4u, 5u}) EXPECT_EQ(got[r], r + 2);
  try {
    std::rethrow_exception(got.error(1));
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(procs.address(3)));
  }

  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(procs.stop());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, o.timeouts.stop_timeout);
  EXPECT_TRUE(all_dead(pids, 5s));
}

// spawn_procs of `n` procs of a program that does not exist fails, naming the mesh and the exec
// failure (exit 127).
void expect_missing_program_fails(const monarch::mesh::HostMesh& host, SpawnOptions so, size_t n,
                                  bool exec_line = false) {
  so.program = "/nonexistent/worker";
  struct Lines {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> got;
  };
  auto lines = std::make_shared<Lines>();
  so.log_sink = [lines](const LogRecord& r) {
    std::lock_guard lock(lines->mu);
    lines->got.push_back(r.text);
    lines->cv.notify_all();
  };
  try {
    host.spawn_procs(Extent{{"gpus", n}}, so);
    FAIL() << "spawn_procs succeeded with a missing program";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("mesh " + so.name + ": rank ["));
    EXPECT_THAT(e.what(), HasSubstr("exited with code 127"));
    // The failure carries the child's own last line, which names the program and why.
    if (exec_line) {
      EXPECT_THAT(
          e.what(),
          HasSubstr("(its last line on stderr: monarch host agent: cannot execute /nonexistent/"));
    }
  }
  if (!exec_line) return;
  // The child's own line names the program and why (it said only "exec failed").
  const std::string want = "cannot execute /nonexistent/worker: no such file (errno 2)";
  std::unique_lock lock(lines->mu);
  EXPECT_TRUE(lines->cv.wait_for(lock, 10s,
                                 [&] {
                                   return std::any_of(lines->got.begin(), lines->got.end(),
                                                      [&](const std::string& l) {
                                                        return l.find(want) != std::string::npos;
                                                      });
                                 }))
      << "no forwarded line says: " << want;
}

TEST(ProcessMesh, AWorkerThatCannotStartFailsSpawnProcs) {
  auto host = monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "nostart";
  expect_missing_program_fails(host, so, 2, true);
}

// A worker that exits at start because of a bad setting in SpawnOptions::env: the failure says
// which setting (the ConfigError was only in the forwarded log; the failure said "exited with
// code 1").
TEST(ProcessMesh, AWorkerWithABadSettingFailsSpawnProcsNamingIt) {
  auto host = monarch::mesh::this_host(fast());
  SpawnOptions so;
  so.name = "badenv";
  so.env = {"MONARCH_ACTOR_WORKERS=lots"};
  so.log_sink = [](const LogRecord&) {};
  try {
    host.spawn_procs(Extent{{"gpus", 1}}, so);
    FAIL() << "spawn_procs succeeded with a bad setting";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("exited with code 1 (its last line on stderr: "));
    EXPECT_THAT(e.what(), HasSubstr("MONARCH_ACTOR_WORKERS"));
  }
}

// --- PH-7: fork servers (SpawnOptions::fork_server) ---

using monarch::mesh::process_detail::ProcessHost;

// The parent pid of `pid` (field 4 of /proc/PID/stat), or -1.
int parent_of(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return -1;
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string state;
  int ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// The fork servers started since `before` (a snapshot of ProcessHost::fork_servers()).
std::vector<pid_t> new_servers(const std::vector<pid_t>& before) {
  std::vector<pid_t> out;
  for (pid_t p : ProcessHost::instance().fork_servers()) {
    if (std::find(before.begin(), before.end(), p) == before.end()) out.push_back(p);
  }
  return out;
}

// Workers forked from a fork server are workers like exec'd ones: their ranks, environment,
// output, exits and signals reach the mesh; the next spawn of the same program forks from the
// same server.
TEST(ForkServer, WorkersForkedFromItBehaveAsExecdOnes) {  // PH-7, PH-2, PH-4
  SKIP_WITHOUT_FORK_SERVER();
  auto host = monarch::mesh::this_host(fast());
  auto before = ProcessHost::instance().fork_servers();
  std::mutex mu;
  std::vector<std::string> lines;
  std::condition_variable cv;
  Failures failures;
  SpawnOptions so;
  so.name = "logs-forked";  // worker_setup prints for "logs*" meshes
  so.env = {"MONARCH_TEST_FORK=behave"};
  so.fork_server = true;
  so.on_failure = failures.handler();
  so.log_sink = [&](const LogRecord& r) {
    std::lock_guard lock(mu);
    lines.push_back((r.stream == 2 ? "E " : "O ") + r.to_string());
    cv.notify_all();
  };
  auto procs = host.spawn_procs(Extent{{"gpus", 3}}, so);
  auto servers = new_servers(before);
  ASSERT_EQ(servers.size(), 1u);
  const pid_t server = servers[0];
  auto pids = pids_of(procs);
  for (int p : pids) {
    EXPECT_NE(p, server);
    EXPECT_EQ(parent_of(p), server) << "rank pid " << p << " was not forked by the server";
  }
  auto workers = procs.lookup<Worker>("worker");
  auto ranks = workers.call(&Worker::rank).get(10s);
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(ranks[r], r);
  EXPECT_EQ(workers.call(&Worker::pid).get(10s)[2], pids[2]);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return lines.size() >= 9; })) << lines.size();
    for (size_t r = 0; r < 3; ++r) {
      auto rs = std::to_string(r);
      EXPECT_THAT(lines, ::testing::Contains("O [logs-forked " + rs + "] hello from rank " + rs));
      EXPECT_THAT(lines, ::testing::Contains("E [logs-forked " + rs + "] warning from rank " + rs));
    }
  }
  ::kill(pids[1], SIGKILL);
  ASSERT_TRUE(failures.wait(1));
  (void)workers.slice("gpus", 2).at(0).call(&Worker::crash, std::string("exit3"));
  ASSERT_TRUE(failures.wait(2));
  {
    std::lock_guard lock(failures.mu);
    EXPECT_THAT(failures.got[0].ranks, ElementsAre(1u));
    EXPECT_THAT(failures.got[0].cause, HasSubstr("killed by signal 9 (SIGKILL)"));
    EXPECT_THAT(failures.got[1].ranks, ElementsAre(2u));
    EXPECT_THAT(failures.got[1].cause, HasSubstr("exited with code 3"));
  }
  EXPECT_EQ(workers.slice("gpus", 0).call_one(&Worker::rank).get(10s), 0u);
  // A respawn: the same server forks it.
  so.name = "forked-again";
  so.log_sink = [](const LogRecord&) {};
  auto again = host.spawn_procs(Extent{{"gpus", 2}}, so);
  EXPECT_EQ(new_servers(before), servers);
  for (int p : pids_of(again)) EXPECT_EQ(parent_of(p), server);
  EXPECT_EQ(again.lookup<Worker>("worker").call(&Worker::rank).get(10s)[1], 1u);
  EXPECT_TRUE(procs.stop());
  EXPECT_TRUE(again.stop());
  EXPECT_TRUE(all_dead(pids, 5s));
  EXPECT_TRUE(all_dead(pids_of(again), 5s));
}

// A fork server that dies takes its workers with it (PDEATHSIG): they fail as killed, and the
// next spawn starts a new server.
TEST(ForkServer, AServerThatDiesTakesItsWorkersAndIsReplaced) {  // PH-7, PH-1
  SKIP_WITHOUT_FORK_SERVER();
  auto host = monarch::mesh::this_host(fast());
  auto before = ProcessHost::instance().fork_servers();
  Failures failures;
  SpawnOptions so;
  so.name = "server-dies";
  so.env = {"MONARCH_TEST_FORK=dies"};
  so.fork_server = true;
  so.on_failure = failures.handler();
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  auto servers = new_servers(before);
  ASSERT_EQ(servers.size(), 1u);
  auto pids = pids_of(procs);
  ::kill(servers[0], SIGKILL);
  EXPECT_TRUE(all_dead(pids, 10s)) << "a worker outlived its fork server";
  ASSERT_TRUE(failures.wait(2));
  for (const auto& f : failures.snapshot()) {
    EXPECT_THAT(f.cause, HasSubstr("killed by signal 9 (SIGKILL)")) << f.to_string();
  }
  so.name = "server-replaced";
  so.on_failure = {};
  auto again = host.spawn_procs(Extent{{"gpus", 2}}, so);
  auto replaced = new_servers(before);
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_NE(replaced[0], servers[0]);
  for (int p : pids_of(again)) EXPECT_EQ(parent_of(p), replaced[0]);
  EXPECT_EQ(again.lookup<Worker>("worker").call(&Worker::rank).get(10s)[1], 1u);
  EXPECT_TRUE(again.stop());
}

// A program that cannot serve forks still gets its workers, exec'd, with one warning naming why:
// one that runs a thread before bootstrap() (this binary, told by MONARCH_TEST_THREAD_FIRST), and
// one that does not exist.
TEST(ForkServer, AProgramThatCannotServeForksIsExecdWithAWarning) {  // PH-7
  auto host = monarch::mesh::this_host(fast());
  auto before = ProcessHost::instance().fork_servers();
  (void)g_warnings->take_warnings();
  SpawnOptions so;
  so.name = "threaded";
  so.env = {"MONARCH_TEST_THREAD_FIRST=1"};
  so.fork_server = true;
  auto procs = host.spawn_procs(Extent{{"gpus", 2}}, so);
  EXPECT_TRUE(new_servers(before).empty());
  for (int p : pids_of(procs)) EXPECT_EQ(parent_of(p), ::getpid());
  EXPECT_EQ(procs.lookup<Worker>("worker").call(&Worker::rank).get(10s)[1], 1u);
  auto warnings = g_warnings->take_warnings();
  EXPECT_THAT(warnings,
              ::testing::Contains(HasSubstr("threads were running when bootstrap() started")));
  EXPECT_TRUE(procs.stop());

  so.name = "missing";
  so.env = {};
  expect_missing_program_fails(host, so, 1);
  EXPECT_THAT(g_warnings->take_warnings(),
              ::testing::Contains(HasSubstr("exited before bootstrap()")));
}

// MONARCH_FORK_SERVER set by hand (no agent's socket behind it) is refused with a message, and
// the program runs on: no hang waiting on a descriptor that is not the agent's.
TEST(ForkServer, AHandSetVariableIsRefusedAndTheProgramRunsOn) {  // PH-7
  for (const char* value : {"junk", "0"}) {
    std::string cmd = std::string("MONARCH_FORK_SERVER=") + value + " '" + self_exe() +
                      "' --gtest_filter=NoSuchTest 2>&1 </dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (size_t got = std::fread(buf, 1, sizeof buf, p)) out.append(buf, got);
    int status = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << value << ": " << out;
    EXPECT_THAT(out, HasSubstr(std::string("MONARCH_FORK_SERVER=") + value +
                               " names no fork server socket"));
    EXPECT_THAT(out, HasSubstr("0 tests"));  // gtest ran: the program went on
  }
}

TEST(ProcTimeouts, ValidateNamesTheKey) {
  monarch::mesh::ProcTimeouts t;
  EXPECT_NO_THROW(t.validate());
  t.heartbeat_timeout = t.heartbeat_interval;
  try {
    t.validate();
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("heartbeat_timeout"));
  }
  t = {};
  t.spawn_timeout = t.heartbeat_timeout;
  EXPECT_THROW(t.validate(), monarch::UsageError);
  HostOptions o;
  o.timeouts.stop_timeout = 0ms;
  EXPECT_THROW(monarch::mesh::this_host(o), monarch::UsageError);
  // max() made spawn_procs time out at once (now + timeout overflowed).
  t = {};
  t.spawn_timeout = std::chrono::milliseconds::max();
  try {
    t.validate();
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("spawn_timeout"));
    EXPECT_THAT(e.what(), HasSubstr("kMaxDuration"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("MONARCH_TEST_THREAD_FIRST") != nullptr) {
    // A thread before bootstrap(): this program cannot serve forks (ForkServer tests).
    std::thread([] {
      while (true) ::pause();
    }).detach();
  }
  monarch::mesh::bootstrap(argc, argv, worker_setup);  // a worker never returns from here
  if (const char* mode = std::getenv("MONARCH_TEST_CLIENT")) return run_client(mode);
  g_warnings = monarch::testing::LogCapture::install();  // before any thread logs
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
