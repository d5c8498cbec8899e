// The deterministic scheduler: a test steps one message at a time and asserts exact interleavings.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "monarch/actor/runtime.hpp"

using monarch::ActorRef;
using monarch::Proc;
using monarch::ProcOptions;
using ::testing::ElementsAre;

namespace {

struct Recorder : monarch::Actor {
  void hit(int v) { seen.push_back(v); }
  std::vector<int> all() const { return seen; }
  MONARCH_ENDPOINTS(Recorder, hit, all)
  std::vector<int> seen;
};

struct Forwarder : monarch::Actor {
  explicit Forwarder(ActorRef<Recorder> r) : rec(std::move(r)) {}
  void relay(int v) { rec.send(&Recorder::hit, v * 100); }
  MONARCH_ENDPOINTS(Forwarder, relay)
  ActorRef<Recorder> rec;
};

std::string describe(const std::optional<monarch::DeterministicScheduler::Step>& s) {
  return s ? s->actor.name + ":" + s->endpoint : "<none>";
}

TEST(Deterministic, StepsRunExactlyOneMessageInReadyOrder) {
  Proc proc(ProcOptions{.deterministic = true});
  auto& sched = proc.test_scheduler();
  auto rec = proc.spawn<Recorder>("rec");
  auto fwd = proc.spawn<Forwarder>("fwd", rec);
  EXPECT_EQ(sched.ready(), 2u);  // both waiting for init
  EXPECT_EQ(describe(sched.step()), "rec:init");
  EXPECT_EQ(describe(sched.step()), "fwd:init");
  EXPECT_EQ(sched.ready(), 0u);

  fwd.send(&Forwarder::relay, 1);
  rec.send(&Recorder::hit, 2);
  fwd.send(&Forwarder::relay, 3);
  // fwd became ready first, then rec. One message per step, round-robin between ready actors.
  EXPECT_EQ(describe(sched.step()), "fwd:relay");  // sends 100 to rec (queued behind 2)
  EXPECT_EQ(describe(sched.step()), "rec:hit");    // 2
  EXPECT_EQ(describe(sched.step()), "fwd:relay");  // sends 300
  EXPECT_EQ(describe(sched.step()), "rec:hit");    // 100
  EXPECT_EQ(describe(sched.step()), "rec:hit");    // 300
  EXPECT_FALSE(sched.step().has_value());

  // get() on the test thread drives the scheduler until the reply is there.
  EXPECT_THAT(rec.call(&Recorder::all).get(), ElementsAre(2, 100, 300));
}

TEST(Deterministic, NothingRunsUntilStepped) {
  Proc proc(ProcOptions{.deterministic = true});
  auto& sched = proc.test_scheduler();
  auto rec = proc.spawn<Recorder>("rec");
  auto f = rec.call(&Recorder::all);
  EXPECT_FALSE(f.ready());
  EXPECT_EQ(sched.run(), 2u);  // init, all
  EXPECT_TRUE(f.ready());
  EXPECT_TRUE(f.get().empty());
}

TEST(Deterministic, GetThatCanNeverCompleteThrowsInsteadOfHanging) {
  Proc proc(ProcOptions{.deterministic = true});
  auto [port, fut] = proc.open_once_port<int>();
  EXPECT_THROW(fut.get(), monarch::DeadlockError);
  auto [p2, rx] = proc.open_port<int>();
  EXPECT_THROW(rx.recv(), monarch::DeadlockError);
  port.send(1);
  EXPECT_EQ(fut.get(), 1);
}

TEST(Deterministic, UsingTestSchedulerOnAThreadedProcIsAnError) {
  Proc proc(ProcOptions{.workers = 1});
  EXPECT_THROW(proc.test_scheduler(), monarch::UsageError);
}

}  // namespace
