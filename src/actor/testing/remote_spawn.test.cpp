// Spawning actors in other processes and supervising them across processes (SPAWN-n, SUP-Rn,
// REM-4/5 in src/actor/remote.cpp).
//
// This binary is also the worker: `remote_spawn_test --worker ADDR [MAX_FRAME_BYTES]` serves a
// Proc on ADDR, as the process layer starts the user's own binary. Its factories are the ones of
// the spawn_remote calls compiled into this file, exactly as in a real job. Tests of the
// supervision logic use in-process Procs on abstract unix addresses; crashes, freezes and "same
// binary" spawns use real processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "remote_actors.hpp"
#include "testing/freeze.hpp"
#include "testing/log_capture.hpp"
#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::ActorRef;
using monarch::ActorSupervisionEvent;
using monarch::Proc;
using monarch::ProcOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

// What this process logs; installed in main(), before any thread logs.
std::shared_ptr<monarch::testing::LogCapture> g_log;

struct Recorder : monarch::Actor {
  Recorder(std::string tag, int base) : tag_(std::move(tag)), base_(base) {}
  void init() override { log_.push_back("init:" + tag_ + "@" + id().to_string()); }
  void put(int v) { log_.push_back(std::to_string(base_ + v)); }
  std::vector<std::string> all() const { return log_; }
  int pid() const { return static_cast<int>(::getpid()); }
  void boom(std::string why) { throw std::runtime_error(why); }  // as a send: fails the actor
  int freeze() {                                                 // fault injection: never returns
    std::promise<void> never;
    never.get_future().wait();
    return 0;
  }
  MONARCH_ENDPOINTS(Recorder, put, all, pid, boom, freeze)
  std::string tag_;
  int base_;
  std::vector<std::string> log_;
};

struct Bomb : monarch::Actor {
  explicit Bomb(int mode) : mode_(mode) {
    if (mode_ == 1) throw std::runtime_error("constructor says no");
  }
  void init() override {
    if (mode_ == 2) throw std::runtime_error("init says no");
  }
  int get() const { return mode_; }
  MONARCH_ENDPOINTS(Bomb, get)
  int mode_;
};

struct Leaf : monarch::Actor {
  void boom(std::string why) { throw std::runtime_error(why); }
  MONARCH_ENDPOINTS(Leaf, boom)
};

// Lives in the worker; owns a local Leaf and does not handle its failure.
struct Mid : monarch::Actor {
  void init() override { leaf_ = spawn<Leaf>("leaf"); }
  void boom_leaf(std::string why) { leaf_.send(&Leaf::boom, why); }
  MONARCH_ENDPOINTS(Mid, boom_leaf)
  ActorRef<Leaf> leaf_;
};

// Lives in the client; owns children in the worker.
struct Parent : monarch::Actor {
  Parent(std::string worker, bool handle, monarch::Port<std::string> report)
      : worker_(std::move(worker)), handle_(handle), report_(std::move(report)) {}
  bool supervise(const ActorSupervisionEvent& e) override {
    report_.send(e.to_string());
    return handle_;
  }
  ActorRef<Recorder> start_recorder() {
    rec_ = spawn_remote<Recorder>(worker_, "child", "c", 0);
    return rec_;
  }
  void boom_child(std::string why) { rec_.send(&Recorder::boom, why); }
  ActorRef<Mid> start_mid() {
    mid_ = spawn_remote<Mid>(worker_, "mid");
    return mid_;
  }
  void boom_mid_leaf(std::string why) { mid_.send(&Mid::boom_leaf, why); }
  int ping() const { return 7; }
  MONARCH_ENDPOINTS(Parent, start_recorder, boom_child, start_mid, boom_mid_leaf, ping)
  std::string worker_;
  bool handle_;
  monarch::Port<std::string> report_;
  ActorRef<Recorder> rec_;
  ActorRef<Mid> mid_;
};

/// Collects fault-hook events (called on another thread); waits for them with a deadline.
struct Faults {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ActorSupervisionEvent> events;
  Proc::FaultHook hook() {
    return [this](const ActorSupervisionEvent& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  ActorSupervisionEvent wait(size_t i = 0, std::chrono::milliseconds d = 10s) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, d, [&] { return events.size() > i; })) {
      throw std::runtime_error("no fault event within the deadline");
    }
    return events[i];
  }
  size_t count() {
    std::lock_guard lock(mu);
    return events.size();
  }
};

std::string unique_addr(const char* stem) {
  static std::atomic<int> n{0};
  return "unix://@monarch-rspawn-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" +
         stem;
}

ProcOptions listening(const char* stem) {
  ProcOptions o;
  o.listen = unique_addr(stem);
  o.channel.secret = "remote-test";
  return o;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(buf, static_cast<size_t>(n));
}

/// A worker process running this very binary.
struct Worker {
  monarch::testing::Subprocess proc{self_exe(), {"--worker", unique_addr("worker")}};
  std::string addr = proc.listening();
};

template <class E, class F>
E expect_throws(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what();
    throw;
  }
  ADD_FAILURE() << "no exception";
  throw std::runtime_error("no exception");
}

// SPAWN-1: spawn returns at once; messages sent right away run after construction and init(), in
// order, in a real worker process running this same binary.
TEST(RemoteSpawn, SpawnThenSendRightAwayInAWorkerProcess) {
  Worker w;
  Proc client(listening("client"));
  auto ref = client.spawn_remote<Recorder>(w.addr, "rec", std::string("t"), 100);
  EXPECT_TRUE(ref.is_remote());
  EXPECT_EQ(ref.id().proc, w.addr);
  EXPECT_EQ(ref.id().name, "rec");
  EXPECT_NE(ref.id().uid & monarch::detail::kRemoteSpawnBit, 0u);
  for (int i = 0; i < 200; ++i) ref.send(&Recorder::put, i);
  auto log = ref.call(&Recorder::all).get(10s);
  ASSERT_EQ(log.size(), 201u);
  EXPECT_EQ(log[0], "init:t@" + ref.id().to_string());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(log[static_cast<size_t>(i) + 1], std::to_string(100 + i));
  EXPECT_NE(ref.call(&Recorder::pid).get(10s), ::getpid());  // it really is the other process

  // Two spawns with the same name are two actors (distinct uids).
  auto again = client.spawn_remote<Recorder>(w.addr, "rec", "u", 0);
  EXPECT_NE(again.id(), ref.id());
  EXPECT_THAT(again.call(&Recorder::all).get(10s), ElementsAre("init:u@" + again.id().to_string()));
}

// SPAWN-2: a Proc whose binary lacks the factory refuses; the owner hears it and calls say why.
TEST(RemoteSpawn, UnknownFactoryReachesOwnerAndCallsSayWhy) {
  monarch::testing::Subprocess peer(MONARCH_REMOTE_PEER,
                                    {unique_addr("peer")});  // no spawn_remote inside
  std::string addr = peer.listening();
  Faults faults;
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto ref = client.spawn_remote<monarch::testing::Counter>(addr, "counter2");
  auto f = ref.call(&monarch::testing::Counter::get);  // sent before the refusal comes back
  auto ev = faults.wait();
  EXPECT_EQ(ev.actor, ref.id());
  EXPECT_EQ(ev.actor_type, "monarch::testing::Counter");
  EXPECT_THAT(ev.cause, HasSubstr("no factory for monarch::testing::Counter()"));
  auto e = expect_throws<monarch::DeliveryFailure>([&] { f.get(10s); });
  EXPECT_EQ(e.destination(), ref.id());
  EXPECT_THAT(e.reason(),
              HasSubstr("spawn of monarch::testing::Counter 'counter2' in proc " + addr));
  EXPECT_THAT(e.reason(), HasSubstr("no factory"));
  auto counter = client.lookup_remote<monarch::testing::Counter>(addr, "counter").get(10s);
  EXPECT_EQ(counter.call(&monarch::testing::Counter::incr, 1).get(10s), 1);  // the peer lives on
}

// SUP-R1 in real processes: the failure reaches the client's hook; the worker process, whose
// default fault hook would exit, lives on because it forwarded the failure.
TEST(RemoteSpawn, WorkerProcessSurvivesAFailureItForwarded) {
  Worker w;
  Faults faults;
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  int pid = a.call(&Recorder::pid).get(10s);
  a.send(&Recorder::boom, std::string("worker-side boom"));
  auto ev = faults.wait();
  EXPECT_EQ(ev.actor, a.id());
  EXPECT_THAT(ev.cause, HasSubstr("worker-side boom"));
  auto b = client.spawn_remote<Recorder>(w.addr, "b", "b", 0);
  EXPECT_EQ(b.call(&Recorder::pid).get(10s), pid);
  EXPECT_EQ(faults.count(), 1u);
}

// SPAWN-2: throwing constructor / init(): the owner hears it; calls made right away fail, naming
// type, name and proc; the worker Proc lives on (its fault hook is not called).
TEST(RemoteSpawn, ThrowingConstructorOrInitReachesOwner) {
  Faults worker_faults, faults;
  Proc worker(listening("worker"));
  worker.set_fault_hook(worker_faults.hook());
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());

  auto ctor = client.spawn_remote<Bomb>(worker.address(), "bomb-ctor", 1);
  auto f = ctor.call(&Bomb::get);
  auto ev = faults.wait(0);
  EXPECT_EQ(ev.actor, ctor.id());
  EXPECT_EQ(ev.actor_type, "(anonymous namespace)::Bomb");
  EXPECT_THAT(ev.cause, HasSubstr("constructor threw"));
  EXPECT_THAT(ev.cause, HasSubstr("constructor says no"));
  auto e = expect_throws<monarch::DeliveryFailure>([&] { f.get(10s); });
  EXPECT_EQ(e.destination(), ctor.id());  // proc + name + uid
  EXPECT_THAT(e.what(), HasSubstr("Bomb"));
  EXPECT_TRUE(e.actor_failed());  // across the wire too: Python reports it as SupervisionError
  auto later = expect_throws<monarch::DeliveryFailure>([&] { ctor.call(&Bomb::get).get(10s); });
  EXPECT_THAT(later.reason(), HasSubstr("constructor says no"));  // the tombstone says why
  EXPECT_TRUE(later.actor_failed());

  auto init = client.spawn_remote<Bomb>(worker.address(), "bomb-init", 2);
  EXPECT_THAT(faults.wait(1).cause, HasSubstr("init threw"));
  auto ok = client.spawn_remote<Bomb>(worker.address(), "fine", 3);
  EXPECT_EQ(ok.call(&Bomb::get).get(10s), 3);  // the worker lives on
  ok.stop().get(10s);                          // a stopped actor did not fail
  auto stopped = expect_throws<monarch::DeliveryFailure>([&] { ok.call(&Bomb::get).get(10s); });
  EXPECT_THAT(stopped.reason(), HasSubstr("was stopped"));
  EXPECT_FALSE(stopped.actor_failed());
  EXPECT_EQ(worker_faults.count(), 0u);
  EXPECT_EQ(faults.count(), 2u);
}

// Caller mistakes throw at once, naming what is wrong.
TEST(RemoteSpawn, CallerMistakesThrow) {
  Proc deaf;  // does not listen
  auto e =
      expect_throws<monarch::UsageError>([&] { deaf.spawn_remote<Bomb>("unix://@x", "b", 3); });
  EXPECT_THAT(e.what(), HasSubstr("does not listen"));
  Proc client(listening("client"));
  auto bad =
      expect_throws<monarch::UsageError>([&] { client.spawn_remote<Bomb>("garbage", "b", 3); });
  EXPECT_THAT(bad.what(), HasSubstr("spawn_remote('b')"));
  EXPECT_THAT(bad.what(), HasSubstr("garbage"));
}

// SUP-R1: a remote child's send-handler failure reaches its owner's supervise(); handled -> the
// owner lives on and the worker is untouched.
TEST(RemoteSpawn, RemoteChildFailureHandledByOwner) {
  Faults worker_faults, faults;
  Proc worker(listening("worker"));
  worker.set_fault_hook(worker_faults.hook());
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto [report, reports] = client.open_port<std::string>();
  auto parent = client.spawn<Parent>("parent", worker.address(), true, report);
  auto child = parent.call(&Parent::start_recorder).get(10s);
  EXPECT_EQ(child.id().proc, worker.address());
  EXPECT_EQ(child.call(&Recorder::all).get(10s).size(), 1u);
  parent.send(&Parent::boom_child, std::string("child blew up"));
  std::string got = reports.recv(10s);
  EXPECT_THAT(got, HasSubstr("actor " + child.id().to_string() +
                             " ((anonymous namespace)::Recorder) failed"));
  EXPECT_THAT(got, HasSubstr("send handler (anonymous namespace)::Recorder::boom threw"));
  EXPECT_THAT(got, HasSubstr("child blew up"));
  EXPECT_EQ(parent.call(&Parent::ping).get(10s), 7);  // handled: the owner lives on
  auto e = expect_throws<monarch::DeliveryFailure>([&] { child.call(&Recorder::all).get(10s); });
  EXPECT_THAT(e.reason(), HasSubstr("child blew up"));
  EXPECT_EQ(worker_faults.count(), 0u);
  EXPECT_EQ(faults.count(), 0u);
}

// SUP-R1: unhandled -> the owner fails and escalates to the client's fault hook with the chain.
TEST(RemoteSpawn, RemoteChildFailureUnhandledEscalatesToClientHook) {
  Faults worker_faults, faults;
  Proc worker(listening("worker"));
  worker.set_fault_hook(worker_faults.hook());
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto [report, reports] = client.open_port<std::string>();
  auto parent = client.spawn<Parent>("parent", worker.address(), false, report);
  auto child = parent.call(&Parent::start_recorder).get(10s);
  parent.send(&Parent::boom_child, std::string("unhandled boom"));
  auto ev = faults.wait();
  EXPECT_EQ(ev.actor, parent.id());
  EXPECT_THAT(ev.cause, HasSubstr("unhandled failure of child " + child.id().to_string()));
  ASSERT_NE(ev.caused_by, nullptr);
  EXPECT_EQ(ev.caused_by->actor, child.id());
  EXPECT_THAT(ev.caused_by->cause, HasSubstr("unhandled boom"));
  EXPECT_EQ(ev.caused_by->caused_by, nullptr);
  parent.stop().get(10s);  // already failed: completes
  EXPECT_EQ(parent.state(), monarch::Lifecycle::Failed);
  EXPECT_EQ(worker_faults.count(), 0u);
}

// SUP-R1: the full chain crosses: leaf (worker, local child of mid) -> mid (worker, remote child
// of parent) -> parent (client) supervise().
TEST(RemoteSpawn, ChainThroughARemoteChild) {
  Faults worker_faults, faults;
  Proc worker(listening("worker"));
  worker.set_fault_hook(worker_faults.hook());
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto [report, reports] = client.open_port<std::string>();
  auto parent = client.spawn<Parent>("parent", worker.address(), true, report);
  auto mid = parent.call(&Parent::start_mid).get(10s);
  parent.send(&Parent::boom_mid_leaf, std::string("deep boom"));
  std::string got = reports.recv(10s);
  EXPECT_THAT(got, HasSubstr("actor " + mid.id().to_string() +
                             " ((anonymous namespace)::Mid) failed: "
                             "unhandled failure of child " +
                             worker.address() + ".leaf["));
  EXPECT_THAT(got, HasSubstr("\n  caused by: actor " + worker.address() + ".leaf["));
  EXPECT_THAT(got, HasSubstr("Leaf::boom threw: std::runtime_error: deep boom"));
  EXPECT_EQ(parent.call(&Parent::ping).get(10s), 7);
  EXPECT_EQ(worker_faults.count(), 0u);
  EXPECT_EQ(faults.count(), 0u);
}

// When the owner stops, its remote children are asked to stop too.
TEST(RemoteSpawn, OwnerStopStopsRemoteChildren) {
  Proc worker(listening("worker"));
  Proc client(listening("client"));
  auto [report, reports] = client.open_port<std::string>();
  auto parent = client.spawn<Parent>("parent", worker.address(), true, report);
  auto child = parent.call(&Parent::start_recorder).get(10s);
  EXPECT_EQ(child.call(&Recorder::all).get(10s).size(), 1u);
  EXPECT_EQ(worker.num_actors(), 1u);
  parent.stop().get(10s);
  // The Stop travels on the client->worker link ahead of this call (REM-3), so the call bounces.
  auto e = expect_throws<monarch::DeliveryFailure>([&] { child.call(&Recorder::all).get(10s); });
  EXPECT_EQ(e.destination(), child.id());
}

// REM-4: stop()/kill() of a remote actor; stop drains, kill does not.
TEST(RemoteSpawn, RemoteStopAndKill) {
  Proc worker(listening("worker"));
  Proc client(listening("client"));
  auto a = client.spawn_remote<Recorder>(worker.address(), "a", "a", 0);
  for (int i = 0; i < 50; ++i) a.send(&Recorder::put, i);
  auto before = a.call(&Recorder::all);
  a.stop().get(10s);
  EXPECT_EQ(before.get(10s).size(), 51u);  // drained
  try {
    (void)a.call(&Recorder::all).get(10s);
    ADD_FAILURE() << "a stopped actor answered";
  } catch (const monarch::DeliveryFailure& e) {  // it said "unknown actor"
    EXPECT_THAT(e.reason(), HasSubstr("'a' was stopped"));
  }
  a.stop().get(10s);  // stopping a stopped actor completes

  auto b = client.spawn_remote<Recorder>(worker.address(), "b", "b", 0);
  EXPECT_EQ(b.call(&Recorder::all).get(10s).size(), 1u);
  b.kill().get(10s);
  EXPECT_THROW(b.call(&Recorder::all).get(10s), monarch::DeliveryFailure);
  EXPECT_EQ(worker.num_actors(), 0u);
}

// SUP-R3: the owner cannot be told (its proc is failed for the worker): the worker logs and uses
// its own fault hook.
TEST(RemoteSpawn, UnreachableOwnerFallsBackToWorkerHook) {
  Faults worker_faults, faults;
  Proc worker(listening("worker"));
  worker.set_fault_hook(worker_faults.hook());
  Proc client(listening("client"));
  client.set_fault_hook(faults.hook());
  auto a = client.spawn_remote<Recorder>(worker.address(), "a", "a", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  worker.declare_proc_failed(client.address(), "test: client lost");
  a.send(&Recorder::boom, std::string("orphan boom"));
  auto ev = worker_faults.wait();
  EXPECT_EQ(ev.actor, a.id());
  EXPECT_THAT(ev.cause, HasSubstr("orphan boom"));
  EXPECT_EQ(faults.count(), 0u);
}

// REM-5: declare_proc_failed with calls pending on a frozen actor in a real worker: each fails
// at once with SupervisionError; later calls, sends, stops and spawns fail fast.
TEST(RemoteSpawn, DeclareProcFailedFailsPendingCalls) {
  Worker w;
  Proc client(listening("client"));
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  auto b = client.spawn_remote<Recorder>(w.addr, "b", "b", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  std::vector<monarch::Future<std::vector<std::string>>> pending;
  auto frozen = a.call(&Recorder::freeze);
  for (int i = 0; i < 10; ++i) pending.push_back(a.call(&Recorder::all));
  for (int i = 0; i < 10; ++i) pending.push_back(b.call(&Recorder::all));  // b answers, or fails
  EXPECT_FALSE(frozen.wait_for(20ms));
  auto t0 = std::chrono::steady_clock::now();
  client.declare_proc_failed(w.addr, "test: rank 0 froze");
  EXPECT_TRUE(client.proc_failed(w.addr));
  auto e = expect_throws<monarch::SupervisionError>([&] { frozen.get(1s); });
  EXPECT_EQ(e.actor(), a.id());
  EXPECT_EQ(e.proc(), w.addr);
  EXPECT_EQ(e.cause(), "test: rank 0 froze");
  for (size_t i = 0; i < 10; ++i) EXPECT_THROW(pending[i].get(1s), monarch::SupervisionError);
  for (size_t i = 10; i < pending.size(); ++i) {
    try {
      pending[i].get(1s);  // b may have answered before the declaration
    } catch (const monarch::SupervisionError& x) {
      EXPECT_EQ(x.actor(), b.id());
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_THROW(a.call(&Recorder::all).get(1s), monarch::SupervisionError);
  EXPECT_THROW(a.send(&Recorder::put, 1), monarch::SupervisionError);
  EXPECT_THROW(a.stop().get(1s), monarch::SupervisionError);
  EXPECT_THROW(client.spawn_remote<Recorder>(w.addr, "c", "c", 0), monarch::SupervisionError);
  EXPECT_THROW(client.lookup_remote<Recorder>(w.addr, "x").get(1s), monarch::SupervisionError);
}

// Proc::forget_proc: a proc gone by design. Calls pending on it fail with DeliveryFailure naming
// why (REM-1: one outcome each), nothing reaches the fault hook, and the address is not barred:
// a later call opens a new link.
TEST(RemoteSpawn, ForgetProcFailsPendingCallsAndDoesNotBarTheAddress) {
  Worker w;
  Proc client(listening("client"));
  std::atomic<int> hook_calls{0};
  client.set_fault_hook([&](const ActorSupervisionEvent&) { ++hook_calls; });
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  auto b = client.spawn_remote<Recorder>(w.addr, "b", "b", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  EXPECT_EQ(b.call(&Recorder::all).get(10s).size(), 1u);
  auto frozen = a.call(&Recorder::freeze);
  EXPECT_FALSE(frozen.wait_for(20ms));
  auto t0 = std::chrono::steady_clock::now();
  client.forget_proc(w.addr, "test: stopped by design");
  auto e = expect_throws<monarch::DeliveryFailure>([&] { frozen.get(5s); });
  EXPECT_THAT(e.what(), HasSubstr("test: stopped by design"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);  // not the channel's delivery_timeout
  EXPECT_FALSE(client.proc_failed(w.addr));
  client.forget_proc(w.addr, "again");                    // no link now: a no-op
  client.forget_proc("unix://@nobody", "x");              // never linked: a no-op
  EXPECT_EQ(b.call(&Recorder::all).get(10s).size(), 1u);  // a new link to the same proc
  EXPECT_EQ(hook_calls.load(), 0);
}

// kill -9 of the worker with calls pending: they fail (DeliveryFailure once the link gives up,
// or SupervisionError as soon as the proc is declared failed) -- none hangs.
TEST(RemoteSpawn, KilledWorkerFailsPendingCalls) {
  {
    Worker w;
    ProcOptions o = listening("client");
    o.channel.delivery_timeout = 500ms;
    Proc client(o);
    auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
    EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
    auto frozen = a.call(&Recorder::freeze);
    EXPECT_FALSE(frozen.wait_for(20ms));
    w.proc.kill(SIGKILL);
    EXPECT_THROW(frozen.get(10s), monarch::DeliveryFailure);
  }
  {
    Worker w;
    Proc client(
        listening("client"));  // default delivery timeout (30 s): the declaration is what ends it
    auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
    EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
    auto frozen = a.call(&Recorder::freeze);
    EXPECT_FALSE(frozen.wait_for(20ms));
    w.proc.kill(SIGKILL);
    client.declare_proc_failed(w.addr, "process exited with signal 9");
    auto e = expect_throws<monarch::SupervisionError>([&] { frozen.get(1s); });
    EXPECT_THAT(e.what(), HasSubstr("signal 9"));
  }
}

// REM-4: a stop to a frozen (SIGSTOP) worker returns at once; the caller waits with its own
// deadline; declaring the proc failed ends it.
TEST(RemoteSpawn, StopOfAFrozenWorkerHonoursTheCallersDeadline) {
  Worker w;
  Proc client(listening("client"));
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  ASSERT_TRUE(monarch::testing::freeze(w.proc.pid())) << "worker did not stop";
  auto t0 = std::chrono::steady_clock::now();
  auto stopped = a.stop();
  auto killed = a.kill();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 100ms);  // did not block
  if (stopped.wait_for(300ms)) {
    try {
      stopped.get();
      ADD_FAILURE() << "a frozen worker stopped the actor";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stop of a frozen worker failed early: " << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);  // the caller's deadline, not the peer's
  client.declare_proc_failed(w.addr, "test: heartbeat lost");
  EXPECT_THROW(stopped.get(1s), monarch::SupervisionError);
  EXPECT_THROW(killed.get(1s), monarch::SupervisionError);
  w.proc.kill(SIGCONT);
}

// REM-6: a send from an actor, still unacknowledged when its proc is declared failed, comes back
// to that actor's undeliverable() as a DeliveryFailure naming the failure (not a silent drop).
struct Bouncer : monarch::Actor {
  explicit Bouncer(std::shared_ptr<monarch::Promise<std::string>> p) : p_(std::move(p)) {}
  void fire(ActorRef<Recorder> to, int n) {
    for (int i = 0; i < n; ++i) to.send(&Recorder::put, i);
  }
  void undeliverable(const monarch::DeliveryFailure& f) override {
    if (!p_->satisfied()) p_->set_value(f.what());
  }
  MONARCH_ENDPOINTS(Bouncer, fire)
  std::shared_ptr<monarch::Promise<std::string>> p_;
};

TEST(RemoteSpawn, REM6_AnUnacknowledgedSendComesBackNamingTheDeclaredFailure) {
  Worker w;
  Proc client(listening("client"));
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  ASSERT_TRUE(monarch::testing::freeze(w.proc.pid())) << "worker did not stop";
  auto p = std::make_shared<monarch::Promise<std::string>>();
  auto bounced = p->get_future();
  auto bouncer = client.spawn<Bouncer>("bouncer", p);
  bouncer.call(&Bouncer::fire, a, 1)
      .get(10s);  // on the link, unacknowledged: the worker is stopped
  client.declare_proc_failed(w.addr, "test: rank 0 froze");
  const std::string what = bounced.get(5s);
  EXPECT_THAT(what, HasSubstr("declared failed: test: rank 0 froze"));
  EXPECT_THAT(what, HasSubstr(a.id().to_string()));
  w.proc.kill(SIGCONT);
}

// REM-2: a report that comes back after the actor that sent the message has stopped is logged and
// dropped: no one is left to tell. It used to go to the Proc's fault hook, as a failure of the
// Proc's client (which fails a whole worker proc, for an actor that is gone). A send from outside
// actors still reaches the fault hook.
TEST(RemoteSpawn, AReportForASenderThatHasStoppedIsDropped) {
  auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::debug);
  Worker w;
  Faults faults;
  ProcOptions o = listening("client");
  o.channel.delivery_timeout = 2s;  // bounds how long the dead link keeps trying
  Proc client(o);
  client.set_fault_hook(faults.hook());
  auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
  EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
  ASSERT_TRUE(monarch::testing::freeze(w.proc.pid())) << "worker did not stop";
  auto p = std::make_shared<monarch::Promise<std::string>>();
  auto bouncer = client.spawn<Bouncer>("bouncer", p);
  // Three sends on the link, unacknowledged: the worker is stopped.
  bouncer.call(&Bouncer::fire, a, 3).get(10s);
  const std::string bouncer_id = bouncer.id().to_string();
  bouncer.stop().get(10s);
  a.send(&Recorder::put, 2);  // from outside actors, after it on the same link
  w.proc.kill(SIGKILL);
  // The link returns what it holds in send order, so once the second send is reported the first
  // was handled. (What came before them may be returned too, its acknowledgement not yet in when
  // the worker froze: the spawn, reported as a delivery unknown.)
  size_t i = 0;
  while (faults.wait(i, 30s).cause.find("undeliverable message sent from outside any actor") ==
         std::string::npos) {
    ++i;
  }
  // One report of a send to `a`: the bouncer's is not among them.
  size_t sends = 0;
  for (size_t k = 0; k < faults.count(); ++k) {
    sends += faults.wait(k).cause.find("put to " + a.id().to_string()) != std::string::npos;
  }
  EXPECT_EQ(sends, 1u);
  EXPECT_FALSE(p->satisfied());
  // The bouncer's three reports are logged: the first as a warning, the others at debug level.
  auto logged = g_log->matching({"sender " + bouncer_id + " has stopped too"});
  spdlog::set_level(level);
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_EQ(logged[0].level, spdlog::level::warn);
  EXPECT_THAT(logged[0].text, HasSubstr("further such reports are logged at debug level"));
  EXPECT_EQ(logged[1].level, spdlog::level::debug);
  EXPECT_EQ(logged[2].level, spdlog::level::debug);
}

// Replies of a chosen size, from a worker process.
struct BlobMaker : monarch::Actor {
  std::string make(uint64_t n) { return std::string(n, 'x'); }
  MONARCH_ENDPOINTS(BlobMaker, make)
};

// REM-1 with real processes: a reply over the worker's max_frame_bytes, or over the client's when
// the client's is the smaller one (its listener would refuse the frame, and the worker would
// resend it until the link gave up), fails the call with a DeliveryFailure naming the actor, the
// endpoint and the limit. The call after it is answered.
TEST(RemoteSpawn, OversizeReplyFromAWorkerProcessFailsTheCall) {
  for (bool callers_limit : {false, true}) {
    SCOPED_TRACE(callers_limit ? "the client's limit" : "the worker's limit");
    monarch::testing::Subprocess worker{
        self_exe(), {"--worker", unique_addr("worker"), callers_limit ? "0" : "1048576"}};
    std::string addr = worker.listening();
    ProcOptions o = listening("client");
    if (callers_limit) o.channel.max_frame_bytes = 1 << 20;
    Proc client(o);
    auto b = client.spawn_remote<BlobMaker>(addr, "blobs");
    EXPECT_EQ(b.call(&BlobMaker::make, uint64_t{100}).get(10s).size(), 100u);
    auto e = expect_throws<monarch::DeliveryFailure>(
        [&] { b.call(&BlobMaker::make, uint64_t{2} << 20).get(10s); });
    EXPECT_EQ(e.destination(), b.id());
    EXPECT_THAT(e.what(), HasSubstr("BlobMaker::make to " + b.id().to_string()));
    EXPECT_THAT(e.reason(), HasSubstr("max_frame_bytes (1048576"));
    EXPECT_THAT(e.reason(), HasSubstr(callers_limit ? client.address() : addr));
    EXPECT_EQ(b.call(&BlobMaker::make, uint64_t{7} << 10).get(10s).size(), 7u << 10);
  }
}

// A call pending when its link closes (the worker was killed; or forgotten) fails with a
// DeliveryFailure naming the actor and the endpoint (it used to read "message  to ...").
TEST(RemoteSpawn, ACallPendingOnAClosedLinkNamesItsEndpoint) {
  for (bool forget : {false, true}) {
    SCOPED_TRACE(forget ? "forget_proc" : "SIGKILL");
    Worker w;
    ProcOptions o = listening("client");
    o.channel.delivery_timeout = 500ms;
    Proc client(o);
    auto a = client.spawn_remote<Recorder>(w.addr, "a", "a", 0);
    EXPECT_EQ(a.call(&Recorder::all).get(10s).size(), 1u);
    auto frozen = a.call(&Recorder::freeze);
    EXPECT_FALSE(frozen.wait_for(20ms));
    if (forget) {
      client.forget_proc(w.addr, "test: stopped by design");
    } else {
      w.proc.kill(SIGKILL);
    }
    auto e = expect_throws<monarch::DeliveryFailure>([&] { frozen.get(10s); });
    EXPECT_EQ(e.destination(), a.id());
    EXPECT_EQ(e.endpoint(), "freeze");
    EXPECT_THAT(e.what(), HasSubstr("message freeze to " + a.id().to_string()));
  }
}

int worker_main(const std::string& addr, size_t max_frame_bytes = 0) {
  try {
    ProcOptions o;
    o.listen = addr;
    o.channel.secret = "remote-test";
    if (max_frame_bytes != 0) o.channel.max_frame_bytes = max_frame_bytes;
    Proc proc(o);
    std::printf("LISTENING %s\n", proc.address().c_str());
    std::fflush(stdout);
    char c;
    while (std::fread(&c, 1, 1, stdin) == 1) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remote_spawn_test worker: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --worker ADDR [MAX_FRAME_BYTES]
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "--worker")
    return worker_main(argv[2], argc == 4 ? std::stoull(argv[3]) : 0);
  g_log = monarch::testing::LogCapture::install();  // before any thread logs
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
