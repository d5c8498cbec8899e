// Endpoints, futures, coroutines, ports, ordering.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "testing/config_override.hpp"

using namespace std::chrono_literals;
using monarch::ActorRef;
using monarch::Future;
using monarch::Proc;
using monarch::ProcOptions;
using monarch::Task;
using ::testing::HasSubstr;

namespace {

struct Counter : monarch::Actor {
  int incr(int n) { return value += n; }
  int get() const { return value; }
  void add(int n) { value += n; }
  std::string echo(const std::string& s) { return s; }
  std::unique_ptr<int> boxed(std::unique_ptr<int> p) {
    *p += 1;
    return p;
  }
  int boom(int) { throw std::runtime_error("boom!"); }
  int throw_int() { throw 42; }
  Task<int> twice(int n) { co_return n * 2; }
  MONARCH_ENDPOINTS(Counter, incr, get, add, echo, boxed, boom, throw_int, twice)
  int value = 0;
};

// Calls another actor from a coroutine endpoint and from a then() continuation.
struct Relay : monarch::Actor {
  explicit Relay(ActorRef<Counter> c) : counter(std::move(c)) {}
  Task<int> via_await(int n) {
    int a = co_await counter.call(&Counter::incr, n);
    int b = co_await counter.call(&Counter::incr, n);
    co_return a + b;
  }
  Future<int> via_then(int n) {
    return counter.call(&Counter::incr, n).then([this](int v) {
      touched_in_actor = monarch::detail::current_cell() != nullptr;
      return v * 10;
    });
  }
  Task<int> failing_await() { co_return co_await counter.call(&Counter::boom, 1); }
  bool touched() const { return touched_in_actor; }
  MONARCH_ENDPOINTS(Relay, via_await, via_then, failing_await, touched)
  ActorRef<Counter> counter;
  bool touched_in_actor = false;
};

TEST(Messaging, CallReturnsTypedFuture) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  Future<int> f = c.call(&Counter::incr, 5);
  EXPECT_EQ(f.get(), 5);
  EXPECT_EQ(c.call(&Counter::incr, 2).get(), 7);
  EXPECT_EQ(c.call(&Counter::get).get(), 7);
  EXPECT_EQ(c.call(&Counter::echo, std::string("hi")).get(), "hi");
  EXPECT_EQ(*c.call(&Counter::boxed, std::make_unique<int>(41)).get(), 42);
}

TEST(Messaging, SendIsFireAndForgetAndOrderedBeforeLaterCall) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  for (int i = 0; i < 100; ++i) c.send(&Counter::add, 1);
  EXPECT_EQ(c.call(&Counter::get).get(), 100);
}

TEST(Messaging, HandlerExceptionBecomesActorErrorAndActorLives) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  try {
    c.call(&Counter::boom, 1).get();
    FAIL() << "expected ActorError";
  } catch (const monarch::ActorError& e) {
    EXPECT_EQ(e.actor(), c.id());
    EXPECT_THAT(e.endpoint(), HasSubstr("Counter::boom"));
    EXPECT_THAT(e.remote_message(), HasSubstr("boom!"));
  }
  EXPECT_EQ(c.call(&Counter::incr, 1).get(), 1);  // still alive
  // The reply is sent from inside the handler, so the state may still read Processing.
  EXPECT_THAT(c.state(),
              ::testing::AnyOf(monarch::Lifecycle::Idle, monarch::Lifecycle::Processing));
}

TEST(Messaging, EmptyRefsAndNonStdExceptionsAreReportedClearly) {
  Proc proc;
  ActorRef<Counter> empty;
  EXPECT_THROW(empty.call(&Counter::get), monarch::UsageError);
  EXPECT_THROW(empty.stop().get(), monarch::UsageError);
  auto c = proc.spawn<Counter>("counter");
  try {
    c.call(&Counter::throw_int).get();
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_THAT(e.remote_message(), HasSubstr("exception of type int"));
  }
}

TEST(Messaging, GetWithTimeoutDoesNotConsume) {
  Proc proc;
  auto [port, fut] = proc.open_once_port<int>();
  EXPECT_THROW(fut.get(10ms), monarch::TimeoutError);
  EXPECT_TRUE(fut.valid());
  port.send(3);
  EXPECT_EQ(fut.get(1s), 3);
  EXPECT_FALSE(fut.valid());
  EXPECT_THROW(fut.get(), monarch::UsageError);
}

// WAIT-1: the spin before sleeping never outlasts the caller's deadline. SCHED-5: nor does an
// idle worker's spin hold up the Proc's shutdown.
TEST(Messaging, GetTimesOutOnTimeEvenWhenTheSpinIsLonger) {
  monarch::testing::IntConfigOverride spin("actor.spin_us", "1000000");  // 1 s
  auto started = std::chrono::steady_clock::now();
  {
    Proc proc;  // its workers spin up to 1 s whenever idle
    auto [port, fut] = proc.open_once_port<int>();
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(fut.get(20ms), monarch::TimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
    std::thread later([p = std::move(port)]() mutable { p.send(7); });
    EXPECT_EQ(fut.get(10s), 7);  // completed while the waiter spins
    later.join();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 500ms);  // shutdown did not wait out a spin
}

TEST(Messaging, ThenChainsAndPropagatesErrors) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  auto f = c.call(&Counter::incr, 4).then([](int v) { return v + 1; }).then([](int v) {
    return std::to_string(v);
  });
  EXPECT_EQ(f.get(), "5");
  bool ran = false;
  auto g = c.call(&Counter::boom, 0).then([&](int) {
    ran = true;
    return 0;
  });
  EXPECT_THROW(g.get(), monarch::ActorError);
  EXPECT_FALSE(ran);
  auto h = c.call(&Counter::get).then([](int) -> int { throw std::logic_error("in then"); });
  EXPECT_THROW(h.get(), std::logic_error);
}

TEST(Messaging, CoroutineEndpointsAwaitOtherActors) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  auto r = proc.spawn<Relay>("relay", c);
  EXPECT_EQ(c.call(&Counter::twice, 21).get(), 42);
  EXPECT_EQ(r.call(&Relay::via_await, 3).get(), 3 + 6);
  EXPECT_EQ(r.call(&Relay::via_then, 1).get(), 70);
  EXPECT_TRUE(r.call(&Relay::touched).get());  // then() registered in an actor ran in it
  try {
    r.call(&Relay::failing_await).get();
    FAIL();
  } catch (const monarch::ActorError& e) {
    // The relay's coroutine rethrew the counter's ActorError; the relay reports it.
    EXPECT_EQ(e.actor(), r.id());
    EXPECT_THAT(e.remote_message(), HasSubstr("boom!"));
  }
}

// FIFO per sender->receiver pair: several threads each send an increasing sequence.
struct SeqChecker : monarch::Actor {
  void push(int sender, int seq) {
    if (last.size() <= static_cast<size_t>(sender)) last.resize(sender + 1, -1);
    if (seq != last[sender] + 1) ++violations;
    last[sender] = seq;
    ++total;
  }
  std::pair<int, int> result() const { return {total, violations}; }
  MONARCH_ENDPOINTS(SeqChecker, push, result)
  std::vector<int> last;
  int total = 0;
  int violations = 0;
};

struct SeqSender : monarch::Actor {
  void run(ActorRef<SeqChecker> to, int me, int n) {
    for (int i = 0; i < n; ++i) to.send(&SeqChecker::push, me, i);
  }
  MONARCH_ENDPOINTS(SeqSender, run)
};

TEST(Messaging, FifoPerSenderReceiverPairAcrossThreadsAndActors) {
  Proc proc(ProcOptions{.workers = 2});
  auto checker = proc.spawn<SeqChecker>("checker");
  constexpr int kThreads = 3, kActors = 3, kN = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kN; ++i) checker.send(&SeqChecker::push, t, i);
    });
  }
  std::vector<Future<void>> done;
  for (int a = 0; a < kActors; ++a) {
    auto s = proc.spawn<SeqSender>("sender");
    done.push_back(s.call(&SeqSender::run, checker, kThreads + a, kN));
  }
  for (auto& t : threads) t.join();
  for (auto& d : done) d.get();
  auto [total, violations] = checker.call(&SeqChecker::result).get();
  EXPECT_EQ(total, (kThreads + kActors) * kN);  // nothing lost or duplicated
  EXPECT_EQ(violations, 0);                     // nothing reordered
}

TEST(Ports, PortAndReceiverCarryMessagesAndTimeOut) {
  Proc proc;
  auto [port, rx] = proc.open_port<int>();
  EXPECT_THROW(rx.recv(5ms), monarch::TimeoutError);
  port.send(1);
  port.send(2);
  EXPECT_EQ(rx.recv(), 1);
  EXPECT_EQ(rx.recv(1s), 2);
  EXPECT_FALSE(rx.try_recv().has_value());
}

struct Producer : monarch::Actor {
  void produce(monarch::Port<int> out, int n) {
    for (int i = 0; i < n; ++i) out.send(i);
  }
  void answer(monarch::OncePort<std::string> reply) { reply.send("answer from " + id().name); }
  MONARCH_ENDPOINTS(Producer, produce, answer)
};

TEST(Ports, PortsTravelInsideMessages) {
  Proc proc;
  auto p = proc.spawn<Producer>("producer");
  auto [port, rx] = proc.open_port<int>();
  p.send(&Producer::produce, port, 50);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(rx.recv(5s), i);
  auto [once, fut] = proc.open_once_port<std::string>();
  p.send(&Producer::answer, once);
  EXPECT_EQ(fut.get(5s), "answer from producer");
}

TEST(Ports, OncePortUsedTwiceIsAnError) {
  Proc proc;
  auto [once, fut] = proc.open_once_port<int>();
  once.send(1);
  EXPECT_THROW(once.send(2), monarch::UsageError);
  EXPECT_EQ(fut.get(), 1);
}

TEST(Ports, DroppedOncePortFailsItsFuture) {
  Proc proc;
  Future<int> fut;
  {
    auto [once, f] = proc.open_once_port<int>();
    fut = std::move(f);
  }
  EXPECT_THROW(fut.get(1s), monarch::UsageError);
}

struct PortOwner : monarch::Actor {
  void init() override {
    port = open_port<int>([this](int v) { sum += v; });
  }
  monarch::Port<int> get_port() const { return port; }
  int total() const { return sum; }
  MONARCH_ENDPOINTS(PortOwner, get_port, total)
  monarch::Port<int> port;
  int sum = 0;
};

TEST(Ports, ActorPortRunsHandlerInsideActor) {
  Proc proc;
  auto o = proc.spawn<PortOwner>("owner");
  auto port = o.call(&PortOwner::get_port).get();
  for (int i = 1; i <= 10; ++i) port.send(i);
  EXPECT_EQ(o.call(&PortOwner::total).get(), 55);
}

TEST(Registry, WellKnownNamesAndUnknownIds) {
  Proc proc;
  auto c = proc.spawn<Counter>("counter");
  proc.register_name("the-counter", c);
  EXPECT_THROW(proc.register_name("the-counter", c), monarch::UsageError);
  auto found = proc.lookup<Counter>("the-counter");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->call(&Counter::incr, 2).get(), 2);
  EXPECT_FALSE(proc.lookup<Counter>("nobody").has_value());
  EXPECT_THROW(proc.lookup<Relay>("the-counter"), monarch::UsageError);

  auto same = proc.resolve<Counter>(c.id());
  EXPECT_EQ(same.call(&Counter::get).get(), 2);
  auto ghost = proc.resolve<Counter>(monarch::ActorId{proc.name(), "ghost", 99999});
  try {
    ghost.call(&Counter::get).get();
    FAIL();
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.reason(), "unknown actor");
    EXPECT_THAT(e.what(), HasSubstr("ghost[99999]"));
  }
}

}  // namespace
