// ActorRefs to actors in other Procs: two listening Procs in this process, and a real peer process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "remote_actors.hpp"
#include "testing/log_capture.hpp"
#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::ActorRef;
using monarch::Proc;
using monarch::ProcOptions;
using monarch::testing::Counter;
using monarch::testing::Sink;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

std::string unique_addr(const char* stem) {
  static std::atomic<int> n{0};
  return "unix://@monarch-remote-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" +
         stem;
}

ProcOptions listening(const char* stem) {
  ProcOptions o;
  o.listen = unique_addr(stem);
  o.channel.secret = "remote-test";
  return o;
}

TEST(Remote, CallSendAndErrorsAcrossProcs) {  // REM-1, REM-3
  Proc server(listening("server"));
  Proc client(listening("client"));
  auto local = server.spawn<Counter>("counter");
  server.register_name("counter", local);
  EXPECT_EQ(server.name(), server.address());
  EXPECT_EQ(local.id().proc, server.address());

  auto c = client.lookup_remote<Counter>(server.address(), "counter").get(5s);
  EXPECT_TRUE(c.is_remote());
  EXPECT_EQ(c.id(), local.id());
  EXPECT_EQ(c.call(&Counter::incr, 5).get(5s), 5);
  for (int i = 0; i < 100; ++i) c.send(&Counter::add, 1);
  EXPECT_EQ(c.call(&Counter::get).get(5s), 105);  // sends before the call, in order
  EXPECT_EQ(c.call(&Counter::where).get(5s), local.id().to_string());
  try {
    c.call(&Counter::boom, std::string("remote boom")).get(5s);
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_EQ(e.actor(), local.id());
    EXPECT_THAT(e.endpoint(), HasSubstr("Counter::boom"));
    EXPECT_THAT(e.remote_message(), HasSubstr("remote boom"));
  }
  EXPECT_EQ(c.call(&Counter::get).get(5s), 105);  // the actor lived on
}

TEST(Remote, LookupErrorsNameWhatIsWrong) {
  Proc server(listening("server"));
  Proc client(listening("client"));
  server.register_name("sink", server.spawn<Sink>("sink"));
  try {
    client.lookup_remote<Counter>(server.address(), "nobody").get(5s);
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no actor registered as 'nobody'"));
  }
  try {
    client.lookup_remote<Counter>(server.address(), "sink").get(5s);
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("Sink, not a monarch::testing::Counter"));
  }
  try {
    client.lookup_remote<Counter>("garbage", "sink").get(5s);
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad channel address 'garbage'"));
  }
  Proc deaf;  // not listening
  EXPECT_THROW(deaf.lookup_remote<Counter>(server.address(), "sink"), monarch::UsageError);
}

TEST(Remote, RefsTravelInsideMessagesBothWays) {
  Proc server(listening("server"));
  Proc client(listening("client"));
  server.register_name("counter", server.spawn<Counter>("counter"));
  auto c = client.lookup_remote<Counter>(server.address(), "counter").get(5s);
  auto sink = client.spawn<Sink>("sink");
  c.send(&Counter::forward, sink, 5);                      // the server sends to our sink
  EXPECT_EQ(c.call(&Counter::ask_back, sink).get(5s), 5);  // ...and calls it from a coroutine
  EXPECT_THAT(sink.call(&Sink::all).get(5s), ElementsAre(0, 1, 2, 3, 4));
}

TEST(Remote, PortsAndOncePortsTravelAcrossProcs) {
  Proc server(listening("server"));
  Proc client(listening("client"));
  server.register_name("counter", server.spawn<Counter>("counter"));
  auto c = client.lookup_remote<Counter>(server.address(), "counter").get(5s);
  c.call(&Counter::incr, 10).get(5s);
  auto [port, rx] = client.open_port<int>();
  c.send(&Counter::stream_to, port, 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(rx.recv(5s), 10 + i);
  auto [once, answer] = client.open_once_port<std::string>();
  c.send(&Counter::answer, once);
  EXPECT_THAT(answer.get(5s), HasSubstr("from " + server.address()));
}

// A stopped actor that its own (listening) Proc spawned leaves a tombstone, as a remotely spawned
// one does: a call from another process says it stopped, not "unknown actor" (that is for a uid
// the Proc never had, or whose tombstone was dropped).
TEST(Remote, StoppedOrUnknownRemoteActorIsADeliveryFailure) {
  Proc server(listening("server"));
  Proc client(listening("client"));
  auto local = server.spawn<Counter>("counter");
  server.register_name("counter", local);
  auto c = client.lookup_remote<Counter>(server.address(), "counter").get(5s);
  EXPECT_EQ(c.call(&Counter::incr, 1).get(5s), 1);
  local.stop().get(5s);
  try {
    c.call(&Counter::get).get(5s);
    FAIL();
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.reason(), "actor monarch::testing::Counter 'counter' was stopped");
    EXPECT_EQ(e.destination(), local.id());
  }
}

// The same reason when the ref is resolved inside the actor's own Proc after it stopped (as a
// relay across processes resolves a cast's members): the Proc's tombstone, not "unknown actor".
TEST(Remote, ALocallyResolvedRefToAStoppedActorSaysWhy) {
  Proc server(listening("server"));
  auto local = server.spawn<Counter>("counter");
  const monarch::ActorId id = local.id();
  local.stop().get(5s);
  try {
    server.resolve<Counter>(id).call(&Counter::get).get(5s);
    FAIL();
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.reason(), "actor monarch::testing::Counter 'counter' was stopped");
  }
  auto ghost = server.resolve<Counter>(monarch::ActorId{server.name(), "ghost", 99999});
  try {
    ghost.call(&Counter::get).get(5s);
    FAIL();
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.reason(), "unknown actor");  // a uid it never had: no tombstone
  }
}

// Sends to a remote actor from inside an actor and hands on what comes back undeliverable.
struct RemoteSender : monarch::Actor {
  using Returned = std::pair<monarch::ActorId, std::string>;
  explicit RemoteSender(std::shared_ptr<std::promise<Returned>> p) : probe(std::move(p)) {}
  void fire(ActorRef<Counter> to) { to.send(&Counter::add, 1); }
  int ping() { return 1; }
  void undeliverable(const monarch::DeliveryFailure& f) override {
    if (!reported.exchange(true)) probe->set_value({f.destination(), f.reason()});
  }
  MONARCH_ENDPOINTS(RemoteSender, fire, ping)
  std::shared_ptr<std::promise<Returned>> probe;
  std::atomic<bool> reported{false};
};

// REM-2: a remote send that cannot be delivered comes back to the sending actor's
// undeliverable(), as a local one does (the actor handles it and lives on); from outside actors
// it goes to the sending Proc's fault hook.
TEST(Remote, UndeliverableRemoteSendComesBackToTheSender) {
  Proc server(listening("server"));
  Proc client(listening("client"));
  auto local = server.spawn<Counter>("counter");
  server.register_name("counter", local);
  auto c = client.lookup_remote<Counter>(server.address(), "counter").get(5s);
  local.stop().get(5s);  // the ref now names an actor the server no longer has

  std::promise<std::string> hooked;
  std::atomic<int> hook_calls{0};
  client.set_fault_hook([&](const monarch::ActorSupervisionEvent& e) {
    if (hook_calls.fetch_add(1) == 0) hooked.set_value(e.cause);
  });
  auto probe = std::make_shared<std::promise<RemoteSender::Returned>>();
  auto returned = probe->get_future();
  auto sender = client.spawn<RemoteSender>("sender", probe);
  sender.send(&RemoteSender::fire, c);
  ASSERT_EQ(returned.wait_for(10s), std::future_status::ready) << "the send never came back";
  auto [dest, reason] = returned.get();
  EXPECT_EQ(dest, local.id());
  EXPECT_EQ(reason, "actor monarch::testing::Counter 'counter' was stopped");
  EXPECT_EQ(sender.call(&RemoteSender::ping).get(5s), 1);  // handled: the sender lives on
  EXPECT_EQ(hook_calls.load(), 0);

  c.send(&Counter::add, 1);  // from outside any actor
  auto cause = hooked.get_future();
  ASSERT_EQ(cause.wait_for(10s), std::future_status::ready);
  EXPECT_THAT(cause.get(), HasSubstr("undeliverable"));
}

TEST(Remote, RealPeerProcessAndItsDeath) {
  monarch::testing::Subprocess peer(MONARCH_REMOTE_PEER, {unique_addr("peer")});
  std::string addr = peer.listening();
  ProcOptions o = listening("client");
  o.channel.delivery_timeout = 500ms;
  Proc client(o);
  auto c = client.lookup_remote<Counter>(addr, "counter").get(5s);
  EXPECT_EQ(c.call(&Counter::incr, 2).get(5s), 2);
  auto sink = client.spawn<Sink>("sink");
  c.send(&Counter::forward, sink, 3);
  EXPECT_EQ(c.call(&Counter::ask_back, sink).get(5s), 3);

  // Messages not yet acknowledged when the peer dies come back as undeliverable (delivery
  // unknown, CH-4); from outside any actor they reach the fault hook instead of exiting here.
  std::atomic<int> reports{0};
  client.set_fault_hook([&](const monarch::ActorSupervisionEvent& e) {
    EXPECT_THAT(e.cause, HasSubstr("undeliverable"));
    ++reports;
  });
  auto stuck = c.call(&Counter::freeze);  // delivered, and will never be answered
  EXPECT_FALSE(stuck.wait_for(50ms));
  peer.kill(SIGKILL);  // fault injection: the peer dies; pending and later calls must not hang
  try {
    stuck.get(10s);  // REM-1 via CH-7: the link to the dead process closes, the call fails
    FAIL() << "a call pending on a dead process succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_THAT(e.what(), HasSubstr("link to proc closed"));
  }
  try {
    c.call(&Counter::get).get(10s);
    FAIL() << "call to a dead process succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.destination(), c.id());
  }
}

// Replies of a chosen size.
struct Blob : monarch::Actor {
  std::string make(uint64_t n) { return std::string(n, 'x'); }
  MONARCH_ENDPOINTS(Blob, make)
};

// A reply larger than max_frame_bytes (of the replying proc, or of the caller when it has the
// smaller limit) comes back as a DeliveryFailure naming the actor, the endpoint and the limit
// (REM-1), instead of being logged on the replier while the caller waits forever. The link is
// unaffected: the next call is answered.
TEST(Remote, OversizeReplyFailsTheCallNamingTheEndpointAndTheLimit) {
  for (bool callers_limit : {false, true}) {
    SCOPED_TRACE(callers_limit ? "the caller's limit" : "the replier's limit");
    ProcOptions so = listening("server");
    ProcOptions co = listening("client");
    (callers_limit ? co : so).channel.max_frame_bytes = 1 << 20;
    Proc server(so);
    Proc client(co);
    auto local = server.spawn<Blob>("blob");
    server.register_name("blob", local);
    auto b = client.lookup_remote<Blob>(server.address(), "blob").get(5s);
    EXPECT_EQ(b.call(&Blob::make, uint64_t{1000}).get(5s).size(), 1000u);
    try {
      b.call(&Blob::make, uint64_t{3} << 20).get(10s);  // without the fix: TimeoutError
      FAIL() << "an oversize reply arrived";
    } catch (const monarch::DeliveryFailure& e) {
      EXPECT_EQ(e.destination(), local.id());
      EXPECT_THAT(e.endpoint(), HasSubstr("Blob::make"));
      EXPECT_THAT(e.reason(), ::testing::ContainsRegex("^reply of 3145[0-9]{3} bytes exceeds"));
      EXPECT_THAT(e.reason(), HasSubstr("max_frame_bytes (1048576"));
      EXPECT_THAT(e.reason(), HasSubstr(callers_limit ? client.address() : server.address()));
      EXPECT_THAT(e.what(), HasSubstr("Blob::make to " + local.id().to_string()));
    }
    EXPECT_EQ(b.call(&Blob::make, uint64_t{10}).get(5s), std::string(10, 'x'));
  }
}

// Calls pending when the caller's Proc shuts down fail with a DeliveryFailure that names the
// actor and the endpoint called (it used to name neither: "message  to ...").
struct Gate : monarch::Actor {
  explicit Gate(std::shared_future<void> open) : open_(std::move(open)) {}
  int pass() {
    open_.wait();
    return 1;
  }
  MONARCH_ENDPOINTS(Gate, pass)
  std::shared_future<void> open_;
};

TEST(Remote, ACallPendingAtShutdownNamesItsEndpoint) {
  std::promise<void> open;
  ProcOptions so = listening("server");
  so.stop_timeout = 100ms;  // bounds the flush of the reply to the caller that is gone
  Proc server(so);
  auto gate = server.spawn<Gate>("gate", open.get_future().share());
  server.register_name("gate", gate);
  monarch::Future<int> pending;
  {
    ProcOptions o = listening("client");
    o.stop_timeout = 100ms;  // bounds the flush of the unanswered call
    Proc client(o);
    auto g = client.lookup_remote<Gate>(server.address(), "gate").get(5s);
    pending = g.call(&Gate::pass);
    EXPECT_FALSE(pending.wait_for(10ms));
  }
  try {
    pending.get(1s);
    FAIL() << "a call pending at shutdown succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.destination(), gate.id());
    EXPECT_EQ(e.endpoint(), "pass");
    EXPECT_THAT(e.what(), HasSubstr("message pass to " + gate.id().to_string()));
    EXPECT_THAT(e.reason(), HasSubstr("shut down"));
  }
  open.set_value();
}

// What the default logger logs, with its level; installed before any thread logs.
std::shared_ptr<monarch::testing::LogCapture> g_log = monarch::testing::LogCapture::install();

// A reply to a proc this Proc was told is gone by design (forget_proc: stopped with it, or by the
// owner) is dropped with a debug log: it is not "lost" (no warning), and no link is opened to wait
// out the delivery timeout. A request from that address again (it may be reused) is answered.
TEST(Remote, AReplyToAForgottenProcIsDroppedQuietly) {
  auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::debug);
  std::promise<void> open;
  ProcOptions so = listening("server");
  so.channel.delivery_timeout = 300ms;  // before the fix: the reply's new link gave up and warned
  Proc server(so);
  auto gate = server.spawn<Gate>("gate", open.get_future().share());
  server.register_name("gate", gate);
  std::string caller;
  {
    ProcOptions o = listening("client");
    o.stop_timeout = 100ms;
    Proc client(o);
    caller = client.address();
    auto g = client.lookup_remote<Gate>(server.address(), "gate").get(5s);
    auto pending = g.call(&Gate::pass);
    EXPECT_FALSE(pending.wait_for(10ms));
    server.forget_proc(caller, "test: caller stopped");
  }
  open.set_value();  // the gate answers the stopped caller
  auto line = g_log->wait_for({"reply (request", caller}, 5s);
  ASSERT_TRUE(line.has_value()) << "nothing logged about the reply to " << caller;
  EXPECT_EQ(line->level, spdlog::level::debug) << line->text;
  EXPECT_THAT(line->text, HasSubstr("dropped"));
  spdlog::set_level(level);

  // forget_proc does not bar the address: a caller there is answered.
  Proc other(listening("other"));
  server.forget_proc(other.address(), "test: forgotten before it calls");
  auto g = other.lookup_remote<Gate>(server.address(), "gate").get(5s);
  EXPECT_EQ(g.call(&Gate::pass).get(5s), 1);
}

}  // namespace
