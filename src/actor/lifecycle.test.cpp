// Lifecycle, stop/kill, supervision, undeliverable messages, deadlock detection, scale.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "testing/config_override.hpp"

using namespace std::chrono_literals;
using monarch::ActorRef;
using monarch::ActorSupervisionEvent;
using monarch::Future;
using monarch::Lifecycle;
using monarch::Proc;
using monarch::ProcOptions;
using monarch::Promise;
using monarch::Task;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

// A thread-safe event log shared by the actors of one test.
struct Log {
  std::mutex mu;
  std::vector<std::string> lines;
  void add(std::string s) {
    std::lock_guard lock(mu);
    lines.push_back(std::move(s));
  }
  std::vector<std::string> get() {
    std::lock_guard lock(mu);
    return lines;
  }
};

// Captures the first event reaching the Proc's fault hook.
struct HookCatcher {
  Promise<ActorSupervisionEvent> promise;
  Future<ActorSupervisionEvent> future = promise.get_future();
  std::atomic<int> calls{0};
  void install(Proc& proc) {
    proc.set_fault_hook([this](const ActorSupervisionEvent& e) {
      if (calls.fetch_add(1) == 0) promise.set_value(e);
    });
  }
};

struct Tracked : monarch::Actor {
  Tracked(Log* l, std::string n) : log(l), name(std::move(n)) { log->add(name + ":construct"); }
  void init() override { log->add(name + ":init"); }
  void cleanup(const std::optional<ActorSupervisionEvent>& err) override {
    log->add(name + ":cleanup" + (err ? "(" + err->cause + ")" : ""));
  }
  void note(std::string s) { log->add(name + ":" + s); }
  ActorRef<Tracked> child(std::string n) { return spawn<Tracked>(n, log, n); }
  void fail_now() { throw std::runtime_error("send failure in " + name); }
  int ping() { return 1; }
  MONARCH_ENDPOINTS(Tracked, note, child, fail_now, ping)
  Log* log;
  std::string name;
};

TEST(Lifecycle, InitRunsBeforeFirstMessageAndCleanupOnStop) {  // CELL-2
  Log log;
  Proc proc;
  auto a = proc.spawn<Tracked>("a", &log, std::string("a"));
  a.send(&Tracked::note, std::string("m1"));
  EXPECT_EQ(a.call(&Tracked::ping).get(), 1);
  EXPECT_THAT(a.state(), ::testing::AnyOf(Lifecycle::Idle, Lifecycle::Processing));
  a.stop().get(5s);
  EXPECT_EQ(a.state(), Lifecycle::Stopped);
  EXPECT_THAT(log.get(), ElementsAre("a:construct", "a:init", "a:m1", "a:cleanup"));
  EXPECT_EQ(proc.num_actors(), 0u);
}

// A name that would not read back from the id ("proc.name[uid]"), and a spawn into a Proc that is
// shutting down, are refused (both used to give a working actor: `local[0].[1]`, or one that no
// shutdown would stop).
TEST(Lifecycle, SpawnRefusesABadNameAndAProcThatIsShuttingDown) {
  Log log;
  Proc proc;
  for (std::string bad : {std::string(), std::string("a\nb"), std::string("x[3]")}) {
    try {
      (void)proc.spawn<Tracked>(bad, &log, bad);
      ADD_FAILURE() << "spawned an actor named '" << bad << "'";
    } catch (const monarch::UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("actor name"));
    }
  }
  auto ok = proc.spawn<Tracked>("dotted.name with space", &log, std::string("ok"));
  EXPECT_EQ(ok.call(&Tracked::ping).get(5s), 1);
  EXPECT_TRUE(proc.shutdown(5s));
  EXPECT_TRUE(proc.shutting_down());
  try {
    (void)proc.spawn<Tracked>("late", &log, std::string("late"));
    ADD_FAILURE() << "spawned into a shut-down proc";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is shutting down"));
  }
  EXPECT_EQ(proc.num_actors(), 0u);
}

// More workers than the cap is a UsageError naming the count: the pool used to call
// start_worker() once per worker asked, each returning at once past the cap (10^11: a hang).
TEST(Lifecycle, APoolOfMoreThanTheCapIsRefused) {
  using monarch::ThreadPoolScheduler;
  try {
    ThreadPoolScheduler pool(99999999999);
    ADD_FAILURE() << "made a pool of 99999999999 workers";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("99999999999 workers requested; at most 256"));
  }
  ThreadPoolScheduler full(ThreadPoolScheduler::kMaxWorkers);
  EXPECT_EQ(full.num_workers(), ThreadPoolScheduler::kMaxWorkers);
}

TEST(Lifecycle, ChildrenStopBeforeTheirParent) {  // CELL-4
  Log log;
  Proc proc;
  auto p = proc.spawn<Tracked>("p", &log, std::string("p"));
  auto c1 = p.call(&Tracked::child, std::string("c1")).get();
  auto g = c1.call(&Tracked::child, std::string("g")).get();
  EXPECT_EQ(g.call(&Tracked::ping).get(), 1);
  p.stop().get(5s);
  EXPECT_EQ(g.state(), Lifecycle::Stopped);
  EXPECT_EQ(c1.state(), Lifecycle::Stopped);
  auto lines = log.get();
  auto pos = [&](const std::string& s) {
    return std::find(lines.begin(), lines.end(), s) - lines.begin();
  };
  EXPECT_LT(pos("g:cleanup"), pos("c1:cleanup"));
  EXPECT_LT(pos("c1:cleanup"), pos("p:cleanup"));
  EXPECT_EQ(pos("p:cleanup"), static_cast<long>(lines.size()) - 1);
}

// Stop drains queued messages; kill does not (they bounce as DeliveryFailure).
struct Slow : monarch::Actor {
  void wait_for(std::shared_ptr<Promise<void>> started, std::shared_ptr<std::atomic<bool>> go) {
    started->set_value();
    while (!go->load()) std::this_thread::yield();  // the test releases it once messages queued
  }
  int bump() { return ++count; }
  void cleanup(const std::optional<ActorSupervisionEvent>& e) override {
    if (seen) seen->set_value(count);
    if (e) cleanup_cause = e->cause;
  }
  MONARCH_ENDPOINTS(Slow, wait_for, bump)
  int count = 0;
  std::shared_ptr<Promise<int>> seen;
  std::string cleanup_cause;
};

TEST(Lifecycle, StopDrainsPendingMessages) {  // CELL-3
  Proc proc;
  auto s = proc.spawn<Slow>("slow");
  auto started = std::make_shared<Promise<void>>();
  auto go = std::make_shared<std::atomic<bool>>(false);
  auto started_f = started->get_future();
  s.send(&Slow::wait_for, started, go);
  started_f.get(5s);  // the actor is busy: what follows queues up behind it
  std::vector<Future<int>> replies;
  for (int i = 0; i < 100; ++i) replies.push_back(s.call(&Slow::bump));
  auto stopped = s.stop();
  auto late = s.call(&Slow::bump);  // after the stop request: refused
  go->store(true);
  stopped.get(5s);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(replies[i].get(5s), i + 1);
  try {
    late.get(5s);
    FAIL();
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_THAT(e.reason(), HasSubstr("actor st"));  // "actor stopping" or "actor stopped"
  }
}

TEST(Lifecycle, KillDiscardsPendingMessages) {  // CELL-5
  Proc proc;
  auto s = proc.spawn<Slow>("slow");
  auto started = std::make_shared<Promise<void>>();
  auto go = std::make_shared<std::atomic<bool>>(false);
  auto started_f = started->get_future();
  s.send(&Slow::wait_for, started, go);
  started_f.get(5s);
  std::vector<Future<int>> replies;
  for (int i = 0; i < 100; ++i) replies.push_back(s.call(&Slow::bump));
  auto killed = s.kill();
  go->store(true);
  killed.get(5s);
  EXPECT_EQ(s.state(), Lifecycle::Stopped);
  for (auto& r : replies) {
    try {
      r.get(5s);
      FAIL() << "a pending message ran after kill";
    } catch (const monarch::DeliveryFailure& e) {
      EXPECT_EQ(e.reason(), "actor killed");
    }
  }
}

// --- supervision -------------------------------------------------------------------------------

struct Child : monarch::Actor {
  void explode() { throw std::runtime_error("child exploded"); }
  int ping() { return 7; }
  MONARCH_ENDPOINTS(Child, explode, ping)
};

struct BadInit : monarch::Actor {
  void init() override { throw std::runtime_error("cannot init"); }
};

struct BadCtor : monarch::Actor {
  BadCtor() { throw std::runtime_error("cannot construct"); }
};

struct Parent : monarch::Actor {
  explicit Parent(bool h) : handle(h) {}
  ActorRef<Child> make_child() { return spawn<Child>("child"); }
  void make_bad_init() { (void)spawn<BadInit>("bad-init"); }
  bool supervise(const ActorSupervisionEvent& ev) override {
    events.push_back(ev.cause);
    if (got) got->set_value(ev);
    return handle;
  }
  std::vector<std::string> seen() const { return events; }
  void set_probe(std::shared_ptr<Promise<ActorSupervisionEvent>> p) { got = std::move(p); }
  MONARCH_ENDPOINTS(Parent, make_child, make_bad_init, seen, set_probe)
  bool handle;
  std::vector<std::string> events;
  std::shared_ptr<Promise<ActorSupervisionEvent>> got;
};

TEST(Supervision, SendFailureGoesToParentWhichHandlesIt) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto p = proc.spawn<Parent>("parent", true);
  auto probe = std::make_shared<Promise<ActorSupervisionEvent>>();
  auto probe_f = probe->get_future();
  p.call(&Parent::set_probe, probe).get();
  auto c = p.call(&Parent::make_child).get();
  c.send(&Child::explode);
  auto ev = probe_f.get(5s);
  EXPECT_EQ(ev.actor, c.id());
  EXPECT_EQ(ev.actor_type, "(anonymous namespace)::Child");
  EXPECT_THAT(ev.cause, HasSubstr("Child::explode"));
  EXPECT_THAT(ev.cause, HasSubstr("child exploded"));
  c.stop().get(5s);  // completes at once: the child is already down
  EXPECT_EQ(c.state(), Lifecycle::Failed);
  EXPECT_EQ(p.call(&Parent::seen).get().size(), 1u);  // parent lives on
  EXPECT_THAT(p.state(), ::testing::AnyOf(Lifecycle::Idle, Lifecycle::Processing));
  EXPECT_THROW(c.call(&Child::ping).get(5s), monarch::DeliveryFailure);
  EXPECT_EQ(hook.calls.load(), 0);
}

TEST(Supervision, UnhandledFailureClimbsToTheFaultHookWithTheWholeChain) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto p = proc.spawn<Parent>("parent", false);
  auto c = p.call(&Parent::make_child).get();
  c.send(&Child::explode);
  auto ev = hook.future.get(5s);
  EXPECT_EQ(ev.actor, p.id());
  EXPECT_THAT(ev.cause, HasSubstr("unhandled failure of child"));
  ASSERT_NE(ev.caused_by, nullptr);
  EXPECT_EQ(ev.caused_by->actor, c.id());
  EXPECT_THAT(ev.to_string(), HasSubstr("caused by: actor " + c.id().to_string()));
  p.stop().get(5s);
  EXPECT_EQ(p.state(), Lifecycle::Failed);
}

TEST(Supervision, InitAndConstructorFailuresAreSupervisionEvents) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto b = proc.spawn<BadInit>("bad");
  auto ev = hook.future.get(5s);
  EXPECT_EQ(ev.actor, b.id());
  EXPECT_THAT(ev.cause, HasSubstr("init threw"));
  EXPECT_THAT(ev.cause, HasSubstr("cannot init"));

  Proc proc2;
  HookCatcher hook2;
  hook2.install(proc2);
  auto c = proc2.spawn<BadCtor>("bad-ctor");
  auto ev2 = hook2.future.get(5s);
  EXPECT_THAT(ev2.cause, HasSubstr("constructor threw"));
  c.stop().get(5s);
  EXPECT_EQ(c.state(), Lifecycle::Failed);
}

// An actor that stands for another language's class (the Python front end's) names that class in
// reports, once it set the label in init(); lookups by type still compare the C++ type.
struct Labelled : monarch::Actor {
  void init() override {
    set_type_label("python Trainer");
    try {
      set_type_label("again");
    } catch (const monarch::UsageError& e) {
      second = e.what();
    }
  }
  std::string second_label() { return second; }
  int ping() { return 1; }
  void boom() { throw std::runtime_error("boom"); }
  MONARCH_ENDPOINTS(Labelled, second_label, ping, boom)
  std::string second;
};

TEST(Supervision, ATypeLabelNamesTheActorInReportsButNotInLookups) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto a = proc.spawn<Labelled>("labelled");
  EXPECT_THAT(a.call(&Labelled::second_label).get(5s),
              HasSubstr("already has the label 'python Trainer'"));
  proc.register_name("trainer", a);
  auto found = proc.lookup<Labelled>("trainer");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->call(&Labelled::ping).get(5s), 1);
  try {
    (void)proc.lookup<Tracked>("trainer");
    ADD_FAILURE() << "a Labelled was found as a Tracked";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("Labelled, not a "));  // the C++ type
  }
  a.send(&Labelled::boom);
  auto ev = hook.future.get(5s);
  EXPECT_EQ(ev.actor_type, "python Trainer");
  EXPECT_THAT(ev.to_string(),
              HasSubstr("(python Trainer) failed: send handler python Trainer::boom"));
  try {
    a.call(&Labelled::ping).get(5s);
    ADD_FAILURE() << "a failed actor answered";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.endpoint(), "python Trainer::ping");
  }
}

TEST(Supervision, ChildInitFailureReachesParentSupervise) {
  Proc proc;
  auto p = proc.spawn<Parent>("parent", true);
  auto probe = std::make_shared<Promise<ActorSupervisionEvent>>();
  auto probe_f = probe->get_future();
  p.call(&Parent::set_probe, probe).get();
  p.send(&Parent::make_bad_init);
  EXPECT_THAT(probe_f.get(5s).cause, HasSubstr("cannot init"));
}

TEST(Supervision, DefaultFaultHookExitsNonZeroWithTheChain) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Proc proc;
        auto c = proc.spawn<Child>("doomed");
        c.send(&Child::explode);
        c.stop().get(5s);
        // The hook runs before the stop completes, so this process must already be gone.
        std::exit(0);
      },
      ::testing::ExitedWithCode(1), "unhandled actor failure(.|\n)*doomed(.|\n)*child exploded");
}

// --- undeliverable messages ----------------------------------------------------------------------

struct Sender : monarch::Actor {
  explicit Sender(bool h) : handle(h) {}
  void fire(ActorRef<Child> to) { to.send(&Child::explode); }
  void undeliverable(const monarch::DeliveryFailure& f) override {
    if (probe) probe->set_value(f.what());
    if (!handle) throw f;
  }
  void set_probe(std::shared_ptr<Promise<std::string>> p) { probe = std::move(p); }
  MONARCH_ENDPOINTS(Sender, fire, set_probe)
  bool handle;
  std::shared_ptr<Promise<std::string>> probe;
};

TEST(Undeliverable, SendToStoppedActorReturnsToSendersHandler) {  // CELL-5
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto target = proc.spawn<Child>("target");
  target.stop().get(5s);
  auto s = proc.spawn<Sender>("sender", true);
  auto probe = std::make_shared<Promise<std::string>>();
  auto probe_f = probe->get_future();
  s.call(&Sender::set_probe, probe).get();
  s.send(&Sender::fire, target);
  EXPECT_THAT(probe_f.get(5s), HasSubstr("actor stopped"));
  EXPECT_THAT(s.state(), ::testing::AnyOf(Lifecycle::Idle, Lifecycle::Processing));  // handled
  EXPECT_EQ(hook.calls.load(), 0);
}

TEST(Undeliverable, DefaultHandlerEscalates) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto target = proc.spawn<Child>("target");
  target.stop().get(5s);
  auto s = proc.spawn<Sender>("sender", false);
  s.send(&Sender::fire, target);
  auto ev = hook.future.get(5s);
  EXPECT_EQ(ev.actor, s.id());
  EXPECT_THAT(ev.cause, HasSubstr("undeliverable"));
}

TEST(Undeliverable, FromOutsideActorsGoesToFaultHook) {
  Proc proc;
  HookCatcher hook;
  hook.install(proc);
  auto target = proc.spawn<Child>("target");
  target.stop().get(5s);
  target.send(&Child::ping);
  EXPECT_THAT(hook.future.get(5s).cause, HasSubstr("undeliverable message"));
}

// --- blocking and deadlock ---------------------------------------------------------------------

struct SelfCaller : monarch::Actor {
  int value() { return 1; }
  int call_self_blocking() { return self<SelfCaller>().call(&SelfCaller::value).get(); }
  Task<int> call_self_await() { co_return co_await self<SelfCaller>().call(&SelfCaller::value); }
  MONARCH_ENDPOINTS(SelfCaller, value, call_self_blocking, call_self_await)
};

TEST(Blocking, ActorWaitingOnItselfIsDetected) {
  Proc proc;
  auto a = proc.spawn<SelfCaller>("selfish");
  try {
    a.call(&SelfCaller::call_self_blocking).get(5s);
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_THAT(e.remote_message(), HasSubstr("deadlock"));
    EXPECT_THAT(e.remote_message(), HasSubstr("selfish"));
  }
  EXPECT_EQ(a.call(&SelfCaller::call_self_await).get(5s), 1);  // co_await is fine
}

struct CycleA;
struct CycleB : monarch::Actor {
  int ask(ActorRef<monarch::Actor> a);
  MONARCH_ENDPOINTS(CycleB, ask)
};
struct CycleA : monarch::Actor {
  int leaf() { return 1; }
  int start(ActorRef<CycleB> b) { return b.call(&CycleB::ask, self<monarch::Actor>()).get(); }
  MONARCH_ENDPOINTS(CycleA, leaf, start)
};
int CycleB::ask(ActorRef<monarch::Actor> a) {
  auto typed = proc().resolve<CycleA>(a.id());
  return typed.call(&CycleA::leaf).get();
}

TEST(Blocking, CycleOfBlockedActorsIsDetected) {
  Proc proc(ProcOptions{.workers = 2});
  auto a = proc.spawn<CycleA>("a");
  auto b = proc.spawn<CycleB>("b");
  try {
    a.call(&CycleA::start, b).get(5s);
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_THAT(e.remote_message(), HasSubstr("deadlock"));
  }
}

struct Waiter : monarch::Actor {
  int wait_on(ActorRef<Child> c) { return c.call(&Child::ping).get(); }
  MONARCH_ENDPOINTS(Waiter, wait_on)
};

TEST(Blocking, BlockedWorkerGetsASpareSoOthersProgress) {
  Proc proc(ProcOptions{.workers = 1});
  auto w = proc.spawn<Waiter>("waiter");
  auto c = proc.spawn<Child>("child");
  // With one worker, the waiter blocks it; the child's reply needs a spare worker.
  EXPECT_EQ(w.call(&Waiter::wait_on, c).get(10s), 7);
}

// Holds its worker until the test opens the gate. Not through Future::get, so the pool starts no
// spare worker for it (a handler blocked in a library or a syscall looks the same).
struct Holder : monarch::Actor {
  void hold(std::shared_future<void> gate) { gate.wait(); }
  MONARCH_ENDPOINTS(Holder, hold)
};

// SCHED-6: the spinning worker takes the first of two queued cells and blocks in its handler; the
// second must not wait for it. Both arrive while a worker spins, so neither push woke the
// sleeping worker; the pop that left the second behind must.
TEST(Blocking, WorkQueuedBehindABlockingHandlerWakesTheSleepingWorker) {
  // An idle worker spins up to 1 s (read by the pool below).
  monarch::testing::IntConfigOverride spin("actor.spin_us", "1000000");
  auto pool = std::make_shared<monarch::ThreadPoolScheduler>(2);
  {
    Proc proc(ProcOptions{.scheduler = pool});
    auto holder = proc.spawn<Holder>("holder");
    auto child = proc.spawn<Child>("child");
    ASSERT_EQ(child.call(&Child::ping).get(10s), 7);
    for (int round = 0; round < 50; ++round) {
      // Idle pool: one worker spins, the other sleeps (SCHED-4).
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!(pool->sleeping_workers() == 1 && pool->worker_spinning())) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline)
            << "pool never went idle, round " << round;
        std::this_thread::yield();
      }
      std::promise<void> gate;
      holder.send(&Holder::hold, gate.get_future().share());
      auto reply = child.call(&Child::ping);
      bool answered = reply.wait_for(5s);
      gate.set_value();
      ASSERT_TRUE(answered) << "round " << round << ": the call waited behind the blocked handler";
      EXPECT_EQ(reply.get(), 7);
    }
  }
  pool->shutdown();
}

// --- scheduling ----------------------------------------------------------------------------------

// Counts handlers that found another activation of the same actor still running.
struct Exclusive : monarch::Actor {
  void enter() {
    if (inside.fetch_add(1, std::memory_order_acq_rel) != 0) overlaps.fetch_add(1);
    // Widen the window for an overlap. A few yields are enough: each gives the other workers a
    // turn. With 20 per handler (160k in all) the test ran past its 30 s deadline on a starved
    // 2-core box (ASan beside a build).
    for (int i = 0; i < 4; ++i) std::this_thread::yield();
    inside.fetch_sub(1, std::memory_order_acq_rel);
    ++runs;  // plain int: only ever touched by one activation at a time
  }
  std::pair<int, int> result() const { return {runs, overlaps.load()}; }
  MONARCH_ENDPOINTS(Exclusive, enter, result)
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  int runs = 0;
};

struct ExclusivePoster : monarch::Actor {
  void run(ActorRef<Exclusive> to, int n) {
    for (int i = 0; i < n; ++i) to.send(&Exclusive::enter);
  }
  MONARCH_ENDPOINTS(ExclusivePoster, run)
};

// CELL-1, SCHED-1: one actor never runs on two workers at once, while threads outside actors
// (global queue) and actors on other workers (their LIFO slots) post to it concurrently.
TEST(Scheduling, AnActorNeverRunsOnTwoWorkersAtOnce) {
  Proc proc(ProcOptions{.workers = 4});
  auto target = proc.spawn<Exclusive>("exclusive");
  constexpr int kThreads = 2, kActors = 2, kN = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kN; ++i) target.send(&Exclusive::enter);
    });
  }
  std::vector<Future<void>> done;
  for (int a = 0; a < kActors; ++a) {
    done.push_back(proc.spawn<ExclusivePoster>("poster").call(&ExclusivePoster::run, target, kN));
  }
  for (auto& t : threads) t.join();
  for (auto& d : done) d.get(30s);
  auto [runs, overlaps] = target.call(&Exclusive::result).get(30s);
  EXPECT_EQ(overlaps, 0);                      // never two activations at once
  EXPECT_EQ(runs, (kThreads + kActors) * kN);  // each message ran once
}

// Two actors hitting a ball back and forth: each send goes to the idle peer, so it lands in the
// LIFO slot of the worker that runs the sender.
struct Volley : monarch::Actor {
  void ball(ActorRef<Volley> peer, std::shared_ptr<std::atomic<bool>> stop,
            std::shared_ptr<std::atomic<long>> volleys) {
    if (stop->load()) return;
    volleys->fetch_add(1);
    peer.send(&Volley::ball, self<Volley>(), stop, volleys);
  }
  MONARCH_ENDPOINTS(Volley, ball)
};

// SCHED-2: with one worker and a ping-pong pair that never stops on its own, a message from
// outside (global queue) still runs: the LIFO slot is taken at most kLifoStreak times in a row.
TEST(Scheduling, APingPongPairDoesNotStarveOtherActors) {
  Proc proc(ProcOptions{.workers = 1});
  auto a = proc.spawn<Volley>("a");
  auto b = proc.spawn<Volley>("b");
  auto child = proc.spawn<Child>("child");
  ASSERT_EQ(child.call(&Child::ping).get(10s), 7);
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto volleys = std::make_shared<std::atomic<long>>(0);
  a.send(&Volley::ball, b, stop, volleys);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (volleys->load() < 1000 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  const long before = volleys->load();
  auto reply = child.call(&Child::ping);
  bool answered = reply.wait_for(10s);
  // The rally goes on after the answer: the call ran beside it, not after it ended. (Comparing
  // with `before` instead is racy: the worker may take the call before the next volley.)
  const long at_answer = volleys->load();
  deadline = std::chrono::steady_clock::now() + 10s;
  while (volleys->load() <= at_answer && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  const bool still_going = volleys->load() > at_answer;
  stop->store(true);  // end the rally whatever happened, so the Proc can stop
  ASSERT_GE(before, 1000) << "the rally never got going";
  ASSERT_TRUE(answered) << "the call starved behind the ping-pong pair";
  EXPECT_EQ(reply.get(), 7);
  EXPECT_TRUE(still_going) << "the rally stopped while the call ran";
}

// SCHED-3: a message queued while the only worker spins before sleeping runs at once. Nobody
// wakes the worker for it (push_global wakes no sleeper while a worker spins, SCHED-4), so the
// spinner must find it before it sleeps.
TEST(Scheduling, WorkQueuedDuringTheIdleSpinIsNotSleptOn) {
  monarch::testing::IntConfigOverride spin("actor.spin_us", "200000");  // idle spin: 200 ms
  auto pool = std::make_shared<monarch::ThreadPoolScheduler>(1);
  {
    Proc proc(ProcOptions{.scheduler = pool});
    auto child = proc.spawn<Child>("child");
    ASSERT_EQ(child.call(&Child::ping).get(10s), 7);
    for (int round = 0; round < 20; ++round) {
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!pool->worker_spinning()) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no idle spin, round " << round;
        std::this_thread::yield();
      }
      auto reply = child.call(&Child::ping);
      ASSERT_TRUE(reply.wait_for(5s)) << "round " << round << ": the worker slept on queued work";
      EXPECT_EQ(reply.get(), 7);
    }
  }
  pool->shutdown();
}

// --- scale ---------------------------------------------------------------------------------------

struct Tiny : monarch::Actor {
  int id_plus(int x) { return x + 1; }
  MONARCH_ENDPOINTS(Tiny, id_plus)
};

TEST(Scale, SpawnAndStopManyActorsWithoutLeaks) {
  const size_t baseline = monarch::detail::live_cells();
  {
    Proc proc(ProcOptions{.workers = 2});
    constexpr int kN = 100000;
    std::vector<ActorRef<Tiny>> refs;
    refs.reserve(kN);
    for (int i = 0; i < kN; ++i) refs.push_back(proc.spawn<Tiny>("t"));
    EXPECT_EQ(refs[kN - 1].call(&Tiny::id_plus, 1).get(30s), 2);
    std::vector<Future<void>> stops;
    stops.reserve(kN);
    for (auto& r : refs) stops.push_back(r.stop());
    for (auto& s : stops) s.get(30s);
    EXPECT_EQ(proc.num_actors(), 0u);
  }
  EXPECT_EQ(monarch::detail::live_cells(), baseline);
}

}  // namespace
