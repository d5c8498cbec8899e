// Cast tree overlay with in-tree reduction. Test names cite the invariants of docs/cast-tree.md.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "monarch/mesh/proc_mesh.hpp"

using namespace std::chrono_literals;
using monarch::mesh::CastOptions;
using monarch::mesh::CommActor;
using monarch::mesh::Context;
using monarch::mesh::ProcMesh;
using monarch::ndslice::Extent;
using monarch::ndslice::Range;
using ::testing::HasSubstr;

namespace {

struct Member : monarch::Actor {
  explicit Member(long base) : base_(base) {}
  std::string where() const { return id().proc; }
  long value(long x) const { return base_ + x + static_cast<long>(Context::message_rank()); }
  void record(int seq) { log_.push_back(seq); }
  void record_bytes(std::string b) { log_.push_back(static_cast<int>(b.size())); }
  std::vector<int> log() const { return log_; }
  long fail_on(size_t r) const {
    if (Context::message_rank() == r)
      throw std::runtime_error("rank " + std::to_string(r) + " failed");
    return 1;
  }
  MONARCH_ENDPOINTS(Member, where, value, record, record_bytes, log, fail_on)
  long base_;
  std::vector<int> log_;
};

std::string proc_name(size_t p) {
  return "local[" + std::to_string(p) + "]";
}

// CAST-1, CAST-2: every proc has one path from proc 0; a node has at most `fanout` children; the
// tree is shallow.
TEST(CastTree, CAST1_CAST2_PathsAreFixedAndFanOutIsBounded) {
  for (uint32_t procs : {1u, 2u, 15u, 16u, 17u, 257u, 1000u}) {
    for (size_t fanout : {1u, 2u, 3u, 16u}) {
      std::map<uint32_t, std::set<uint32_t>> children;
      size_t deepest = 0;
      for (uint32_t p = 0; p < procs; ++p) {
        auto path = monarch::mesh::detail::cast_path(procs, fanout, p);
        ASSERT_EQ(path.front(), 0u);
        ASSERT_EQ(path.back(), p);
        for (size_t i = 1; i < path.size(); ++i) {
          ASSERT_LT(path[i - 1], path[i]);
          children[path[i - 1]].insert(path[i]);
        }
        deepest = std::max(deepest, path.size());
      }
      for (auto& [node, kids] : children) {
        EXPECT_LE(kids.size(), fanout) << "node " << node << " of " << procs << " procs";
      }
      if (fanout == 16 && procs == 1000) {
        EXPECT_LE(deepest, 4u);
      }
      if (fanout == 2 && procs == 1000) {
        EXPECT_LE(deepest, 11u);
      }
    }
  }
  EXPECT_THROW(ProcMesh::local(Extent{{"procs", 2}}, {}, CastOptions{0}), monarch::UsageError);
}

// CAST-5: call() collects and reduce() reduces exactly once per member, over irregular slices of
// meshes of 1, 15, 16, 17 and 257 procs with three actors each (and a deep tree of fan-out 2).
TEST(CastTree, CAST5_ReductionIsExactOnIrregularSlicesAndSizes) {
  for (auto [procs_n, fanout] : std::vector<std::pair<size_t, size_t>>{
           {1, 16}, {15, 16}, {16, 16}, {17, 16}, {257, 16}, {257, 2}}) {
    SCOPED_TRACE("procs=" + std::to_string(procs_n) + " fanout=" + std::to_string(fanout));
    auto procs = ProcMesh::local(Extent{{"procs", procs_n}}, {}, CastOptions{fanout});
    auto m = procs.spawn<Member>("m", Extent{{"actors", 3}}, 7L);
    ASSERT_EQ(m.extent().to_string(), "{procs=" + std::to_string(procs_n) + ", actors=3}");
    std::vector<monarch::mesh::ActorMesh<Member>> views{
        m, m.slice("actors", 1), m.slice("procs", Range(procs_n > 1 ? 1 : 0, std::nullopt, 3)),
        m.slice("procs", procs_n - 1).slice("actors", Range(1, 3))};
    for (auto& v : views) {
      const long n = static_cast<long>(v.size());
      auto vals = v.call(&Member::value, 5L).get(30s);
      ASSERT_EQ(vals.size(), v.size());
      for (size_t r = 0; r < v.size(); ++r) ASSERT_EQ(vals[r], 12 + static_cast<long>(r));
      auto where = v.call(&Member::where).get(30s);
      for (size_t r = 0; r < v.size(); ++r)
        ASSERT_EQ(where[r], proc_name(v.shape().global_rank(r) / 3));
      EXPECT_EQ(v.reduce(monarch::mesh::Sum{}, &Member::value, 5L).get(30s),
                n * 12 + n * (n - 1) / 2);
      EXPECT_EQ(v.reduce(monarch::mesh::Min{}, &Member::value, 5L).get(30s), 12);
      EXPECT_EQ(v.reduce(monarch::mesh::Max{}, &Member::value, 5L).get(30s), 12 + n - 1);
      // Any associative combine: the set of procs that hold members of the view.
      auto procs_of = [](std::string a, const std::string& b) {
        std::set<std::string> s;
        for (const std::string* x : {static_cast<const std::string*>(&a), &b}) {
          size_t i = 0;
          while (i < x->size()) {
            size_t j = x->find(' ', i);
            if (j == std::string::npos) j = x->size();
            s.insert(x->substr(i, j - i));
            i = j + 1;
          }
        }
        std::string out;
        for (auto& e : s) out += (out.empty() ? "" : " ") + e;
        return out;
      };
      std::set<std::string> expect;
      for (size_t r = 0; r < v.size(); ++r) expect.insert(where[r]);
      std::string joined;
      for (auto& e : expect) joined += (joined.empty() ? "" : " ") + e;
      EXPECT_EQ(v.reduce(procs_of, &Member::where).get(30s), joined);
    }
  }
}

// CAST-3: casts from one sender reach every member in send order, whatever slices they were
// cast to; CAST-4: no atomicity, each member sees exactly the casts that included it.
TEST(CastTree, CAST3_PerPairFifoHoldsAcrossDifferentSlices) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}}, {}, CastOptions{2});
  auto m = procs.spawn<Member>("m", Extent{{"actors", 4}}, 0L);
  std::vector<monarch::mesh::ActorMesh<Member>> slices{
      m,
      m.slice("hosts", 1),
      m.slice("gpus", Range(1, 4, 2)),
      m.slice("actors", 2),
      m.slice("hosts", 0).slice("gpus", 3),
      m.slice("gpus", 2).slice("actors", Range(0, 4, 3))};
  std::vector<std::vector<int>> expected(m.size());
  std::vector<monarch::Future<monarch::ndslice::ValueMesh<monarch::Unit>>> calls;
  for (int seq = 0; seq < 600; ++seq) {
    auto& v = slices[static_cast<size_t>(seq * 7 + seq / 5) % slices.size()];
    for (size_t i = 0; i < v.size(); ++i) expected[v.shape().global_rank(i)].push_back(seq);
    if (seq % 3 == 0) {
      calls.push_back(v.call(&Member::record, seq));
    } else {
      v.broadcast(&Member::record, seq);
    }
  }
  for (auto& c : calls) c.get(30s).throw_if_failed();
  auto logs = m.call(&Member::log).get(30s);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_EQ(logs[r], expected[r]) << "member " << r;
}

// CAST-3, CAST-11: a cast made while the spawn fence is letting the held casts go (on the thread
// of its last arrival) waits behind them. It once went at once and overtook them: a Python test
// saw casts 12-14 of one sender arrive after 15-26.
TEST(CastTree, CAST11_ACastMadeWhileTheFenceOpensQueuesBehindTheHeldOnes) {
  monarch::mesh::detail::CastFence fence(1);
  std::mutex mu;
  std::vector<int> order;
  auto note = [&](int i) {
    std::lock_guard lock(mu);
    order.push_back(i);
  };
  std::promise<void> first_started, release;
  auto released = release.get_future().share();
  fence.then([&] {  // a slow first send: the fence is open while it runs
    first_started.set_value();
    released.wait();
    note(0);
  });
  for (int i = 1; i < 5; ++i) fence.then([&note, i] { note(i); });
  std::thread opener([&] { fence.arrive(); });
  first_started.get_future().wait();
  fence.then([&] { note(5); });  // the same sender, later: must not run before 0..4
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(order.empty()) << "cast 5 ran before the held casts, first " << order.front();
  }
  release.set_value();
  opener.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  fence.then([&] { note(6); });  // drained: at once, on this thread
  EXPECT_EQ(order.back(), 6);
}

// CAST-6: a member error deep in the tree names the member: call() holds it in that member's
// rank while the others answer; reduce() fails with it.
TEST(CastTree, CAST6_AMemberErrorDeepInTheTreeFailsTheCastNamingTheMember) {
  auto procs = ProcMesh::local(Extent{{"procs", 257}}, {}, CastOptions{4});
  auto m = procs.spawn<Member>("m", Extent{{"actors", 2}}, 0L);
  const size_t bad = 200 * 2 + 1;
  for (int round = 0; round < 2; ++round) {
    try {
      if (round == 0) {
        auto vm = m.call(&Member::fail_on, bad).get(30s);
        EXPECT_EQ(vm.failed_ranks(), (std::vector<size_t>{bad}));
        EXPECT_EQ(vm[bad - 1], 1);  // the others answered
        vm.throw_if_failed();
      } else {
        (void)m.reduce(monarch::mesh::Sum{}, &Member::fail_on, bad).get(30s);
      }
      FAIL() << "the cast succeeded";
    } catch (const monarch::ActorError& e) {
      EXPECT_EQ(e.actor().proc, proc_name(200));
      EXPECT_EQ(e.actor(), m.at(bad).id());
      EXPECT_THAT(e.remote_message(), HasSubstr("rank 401 failed"));
    }
  }
  // Members live on (an error in a request/reply handler does not fail the actor).
  EXPECT_EQ(m.reduce(monarch::mesh::Sum{}, &Member::fail_on, size_t{9999}).get(30s), 514);
}

// CAST-7: a member that is gone yields DeliveryFailure naming it; nothing hangs.
TEST(CastTree, CAST7_AGoneMemberIsADeliveryFailureNamingIt) {
  auto procs = ProcMesh::local(Extent{{"procs", 17}});
  auto m = procs.spawn<Member>("m", Extent{{"actors", 2}}, 0L);
  const auto gone = m.at(20).id();  // on proc 10
  m.at(20).kill().get(10s);
  try {
    auto vm = m.call(&Member::value, 0L).get(30s);
    EXPECT_EQ(vm.failed_ranks(), (std::vector<size_t>{20}));
    EXPECT_EQ(vm[21], 21);
    (void)vm[20];
    FAIL() << "the cast succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.destination(), gone);
  }
  EXPECT_THROW(m.reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(30s),
               monarch::DeliveryFailure);
  // A broadcast from outside any actor reports the lost message to the member's Proc fault hook.
  monarch::Promise<std::string> hooked;
  auto hook_future = hooked.get_future();
  auto hp = std::make_shared<monarch::Promise<std::string>>(std::move(hooked));
  procs.proc(10).set_fault_hook([hp](const monarch::ActorSupervisionEvent& ev) {
    if (!hp->satisfied()) hp->set_value(ev.cause);
  });
  m.slice("procs", Range(8, 12)).broadcast(&Member::record, 1);
  EXPECT_THAT(hook_future.get(30s), HasSubstr(gone.to_string()));
  // The rest of the mesh is reachable through slices that leave the gone member out.
  EXPECT_EQ(m.slice("actors", 1).reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(30s),
            17 * 16 / 2);
}

// CAST-7: a comm actor that is gone fails the cast with a DeliveryFailure naming it; a stream
// gives that failure to exactly the members below it and the others' replies as usual.
TEST(CastTree, CAST7_AGoneCommActorIsADeliveryFailureForItsSubtree) {
  // 8 procs, fan-out 2: 0 -> {1, 5}; 1 -> {2, 4}; 2 -> {3}; 5 -> {6, 7}.
  auto procs = ProcMesh::local(Extent{{"procs", 8}}, {}, CastOptions{2});
  ASSERT_EQ(monarch::mesh::detail::cast_path(8, 2, 3), (std::vector<uint32_t>{0, 1, 2, 3}));
  auto m = procs.spawn<Member>("m", 0L);
  auto comm = procs.proc(1).lookup<CommActor>(monarch::mesh::kCommActorName);
  ASSERT_TRUE(comm.has_value());
  comm->kill().get(10s);
  try {
    auto vm = m.call(&Member::value, 0L).get(30s);
    EXPECT_EQ(vm.failed_ranks(), (std::vector<size_t>{1, 2, 3, 4}));  // exactly its subtree
    EXPECT_EQ(vm[5], 5);
    vm.throw_if_failed();
    FAIL() << "the cast succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.destination().name, "monarch.comm");
    EXPECT_EQ(e.destination().proc, proc_name(1));
  }
  auto s = m.stream(&Member::value, 0L);
  std::set<size_t> failed, replied;
  while (s.remaining() > 0) {
    auto [rank, f] = s.next(30s);
    try {
      EXPECT_EQ(f.get(), static_cast<long>(rank));
      replied.insert(rank);
    } catch (const monarch::DeliveryFailure&) {
      failed.insert(rank);
    }
  }
  EXPECT_EQ(failed, (std::set<size_t>{1, 2, 3, 4}));
  EXPECT_EQ(replied, (std::set<size_t>{0, 5, 6, 7}));
  // Slices whose paths avoid proc 1 still work.
  EXPECT_EQ(m.slice("procs", Range(5, 8)).reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(30s),
            3);
}

// A member that only counts what it was sent.
struct Tally : monarch::Actor {
  void record(int) { ++count_; }
  long count() const { return count_; }
  MONARCH_ENDPOINTS(Tally, record, count)
  long count_ = 0;
};

// What came back undeliverable to a caster, by destination.
struct Returned {
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> destinations;          // ActorId::to_string()
  std::map<std::string, std::string> reasons;  // destination -> DeliveryFailure::reason()
  bool wait_for(const std::set<std::string>& want, std::chrono::seconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] {
      return std::includes(destinations.begin(), destinations.end(), want.begin(), want.end());
    });
  }
};

// Broadcasts from inside an actor, then counts through the tree what reached the reachable part.
struct Caster : monarch::Actor {
  Caster(monarch::mesh::ActorMesh<Tally> m, std::shared_ptr<Returned> r)
      : mesh(std::move(m)), returned(std::move(r)) {}
  monarch::Task<long> broadcast_then_count() {
    mesh.broadcast(&Tally::record, 1);
    // Same sender, so these casts reach each member after the broadcast (CAST-3).
    long n = co_await mesh.slice("procs", Range(0, 2)).reduce(monarch::mesh::Sum{}, &Tally::count);
    co_return n +
        co_await mesh.slice("procs", Range(4, 6)).reduce(monarch::mesh::Sum{}, &Tally::count);
  }
  int ping() { return 1; }
  void undeliverable(const monarch::DeliveryFailure& f) override {
    {
      std::lock_guard lock(returned->mu);
      returned->destinations.insert(f.destination().to_string());
      returned->reasons[f.destination().to_string()] = f.reason();
    }
    returned->cv.notify_all();
  }
  MONARCH_ENDPOINTS(Caster, broadcast_then_count, ping)
  monarch::mesh::ActorMesh<Tally> mesh;
  std::shared_ptr<Returned> returned;
};

// Kills member 6 of `m` and the comm actor of proc 2 (so proc 3 loses its path): the two losses
// the CAST-9 tests expect a broadcast to report, by id.
struct LostParts {
  monarch::ActorId member, comm;
};
LostParts kill_member6_and_comm2(ProcMesh& procs, const monarch::mesh::ActorMesh<Tally>& m) {
  LostParts lost{m.at(6).id(), {}};
  m.at(6).kill().get(10s);
  auto comm2 = procs.proc(2).lookup<CommActor>(monarch::mesh::kCommActorName);
  EXPECT_TRUE(comm2.has_value());
  if (!comm2) return lost;
  lost.comm = comm2->id();
  comm2->kill().get(10s);
  return lost;
}

// CAST-9: the relay never fails. A broadcast from an actor that reaches a gone member and a gone
// comm actor reports both to that actor's undeliverable(), not to a comm actor; every other comm
// actor lives on and relays the next casts, and no Proc's fault hook hears of it.
TEST(CastTree, CAST9_LostBroadcastsGoToTheCasterAndTheRelayLivesOn) {
  // 8 procs, fan-out 2: 0 -> {1, 5}; 1 -> {2, 4}; 2 -> {3}; 5 -> {6, 7}.
  auto procs = ProcMesh::local(Extent{{"procs", 8}}, {}, CastOptions{2});
  ASSERT_EQ(monarch::mesh::detail::cast_path(8, 2, 3), (std::vector<uint32_t>{0, 1, 2, 3}));
  monarch::Proc home;
  std::atomic<int> hooked{0};
  auto count_hook = [&](const monarch::ActorSupervisionEvent& ev) {
    ADD_FAILURE() << "fault hook: " << ev.cause;
    ++hooked;
  };
  home.set_fault_hook(count_hook);
  for (size_t p = 0; p < 8; ++p) procs.proc(p).set_fault_hook(count_hook);
  auto m = procs.spawn<Tally>("t");
  const LostParts lost = kill_member6_and_comm2(procs, m);
  ASSERT_FALSE(lost.comm.name.empty());
  const monarch::ActorId& gone_member = lost.member;
  const monarch::ActorId& gone_comm = lost.comm;

  auto returned = std::make_shared<Returned>();
  auto caster = home.spawn<Caster>("caster", m, returned);
  EXPECT_EQ(caster.call(&Caster::broadcast_then_count).get(30s), 4);  // members 0, 1, 4, 5
  EXPECT_TRUE(returned->wait_for({gone_member.to_string(), gone_comm.to_string()}, 30s))
      << "the lost broadcast was not reported to the caster";
  EXPECT_EQ(caster.call(&Caster::ping).get(10s), 1);  // it handled the reports
  for (size_t p : {0, 1, 3, 4, 5, 6, 7}) {
    auto comm = procs.proc(p).lookup<CommActor>(monarch::mesh::kCommActorName);
    ASSERT_TRUE(comm.has_value());
    EXPECT_NE(comm->state(), monarch::Lifecycle::Failed) << "comm actor of proc " << p;
    EXPECT_NE(comm->state(), monarch::Lifecycle::Stopped) << "comm actor of proc " << p;
  }
  // The relay still serves a cast that passes every surviving comm actor but the lost subtree.
  EXPECT_EQ(m.slice("procs", 7).reduce(monarch::mesh::Sum{}, &Tally::count).get(30s), 1);
  EXPECT_EQ(hooked.load(), 0);
}

// CAST-9 across processes: each relay is a listening Proc and the caster reaches it only through
// the channel. What a relay cannot deliver (a gone member, a hop to a gone comm actor, the members
// of a proc the relay knows failed) comes back to the caster: to an actor's undeliverable(), or
// from outside actors to the fault hook of the Proc it cast through. No relay's hook hears of it.
TEST(CastTree, CAST9_AcrossProcessesLostBroadcastsGoBackToTheCaster) {
  const std::string prefix = "unix://@monarch-cast-lost-" + std::to_string(::getpid());
  monarch::ProcOptions o;
  o.listen = prefix + "/p{rank}";
  // 8 procs, fan-out 2: 0 -> {1, 5}; 1 -> {2, 4}; 2 -> {3}; 5 -> {6, 7}.
  auto procs = ProcMesh::local(Extent{{"procs", 8}}, o, CastOptions{2});
  std::atomic<int> relay_hooked{0};
  for (size_t p = 0; p < 8; ++p) {
    procs.proc(p).set_fault_hook([&](const monarch::ActorSupervisionEvent& ev) {
      ADD_FAILURE() << "a relay's fault hook: " << ev.cause;
      ++relay_hooked;
    });
  }
  auto local = procs.spawn<Tally>("t");
  const LostParts lost = kill_member6_and_comm2(procs, local);
  ASSERT_FALSE(lost.comm.name.empty());
  const monarch::ActorId& gone_member = lost.member;
  const monarch::ActorId& gone_comm = lost.comm;

  monarch::ProcOptions co;
  co.listen = prefix + "/client";
  monarch::Proc client(co);
  Returned hooked;  // what the client's fault hook heard, by the actor its cause names
  client.set_fault_hook([&](const monarch::ActorSupervisionEvent& ev) {
    {
      std::lock_guard lock(hooked.mu);
      for (const auto& id : {gone_member.to_string(), gone_comm.to_string()}) {
        if (ev.cause.find(id) != std::string::npos) hooked.destinations.insert(id);
      }
    }
    hooked.cv.notify_all();
  });
  auto m = local.attach(client);
  ASSERT_TRUE(m.at(0).is_remote());

  // From an actor: both losses reach its undeliverable(), with the relays' reasons.
  auto returned = std::make_shared<Returned>();
  auto caster = client.spawn<Caster>("caster", m, returned);
  EXPECT_EQ(caster.call(&Caster::broadcast_then_count).get(30s), 4);  // members 0, 1, 4, 5
  ASSERT_TRUE(returned->wait_for({gone_member.to_string(), gone_comm.to_string()}, 30s))
      << "the lost broadcast was not reported to the caster";
  {
    std::lock_guard lock(returned->mu);
    // The member's relay reads its Proc's tombstone, as a direct message would.
    EXPECT_THAT(returned->reasons[gone_member.to_string()], HasSubstr("Tally 't' was stopped"));
    EXPECT_THAT(returned->reasons[gone_comm.to_string()], HasSubstr("was stopped"));
  }
  EXPECT_EQ(caster.call(&Caster::ping).get(10s), 1);  // it handled the reports and lives on

  // From outside actors: the same losses reach the client's fault hook.
  m.broadcast(&Tally::record, 2);
  EXPECT_TRUE(hooked.wait_for({gone_member.to_string(), gone_comm.to_string()}, 30s))
      << "a broadcast from outside actors was lost without a report";

  // A proc the root relay (proc 0) knows failed, and the caster does not: the relay that would
  // deliver there reports the members it could not reach, naming the failure.
  const auto on_failed = m.at(7).id().to_string();
  procs.proc(0).declare_proc_failed(procs.proc(7).name(), "frozen in this test");
  // Members 0, 1, 4 and 5 have now had three broadcasts each (CAST-3: one path per proc).
  EXPECT_EQ(caster.call(&Caster::broadcast_then_count).get(30s), 4 * 3);
  ASSERT_TRUE(returned->wait_for({on_failed}, 30s)) << "a relay dropped members of a failed proc";
  {
    std::lock_guard lock(returned->mu);
    EXPECT_THAT(returned->reasons[on_failed],
                HasSubstr("its proc was declared failed: frozen in this test"));
  }
  // The relays live on: a cast over every live member but the lost subtree still completes.
  EXPECT_EQ(m.slice("procs", Range(4, 6)).reduce(monarch::mesh::Sum{}, &Tally::count).get(30s),
            3 * 2);
  EXPECT_EQ(relay_hooked.load(), 0);
}

// A cast whose arguments cannot fit in one hop under the caster's max_frame_bytes is refused at
// the caster, naming the endpoint: a broadcast was dropped with only a log line, a call failed
// every member late. Nothing is sent: the members' logs stay empty.
TEST(CastTree, AnOversizeCastIsRefusedAtTheCaster) {
  const std::string prefix = "unix://@monarch-cast-big-" + std::to_string(::getpid());
  monarch::ProcOptions o;
  o.listen = prefix + "/p{rank}";
  auto procs = ProcMesh::local(Extent{{"procs", 2}}, o);
  auto local = procs.spawn<Member>("m", 0L);
  monarch::ProcOptions co;
  co.listen = prefix + "/client";
  co.channel.max_frame_bytes = 1 << 20;
  monarch::Proc client(co);
  auto m = local.attach(client);
  const std::string big(1 << 20, 'x');
  for (int adverb = 0; adverb < 2; ++adverb) {
    try {
      if (adverb == 0) {
        m.broadcast(&Member::record_bytes, big);
      } else {
        (void)m.call(&Member::record_bytes, big);
      }
      FAIL() << "an oversize cast was accepted";
    } catch (const monarch::UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("record_bytes"));
      EXPECT_THAT(e.what(), HasSubstr("max_frame_bytes (1048576 bytes)"));
    }
  }
  (void)m.call(&Member::record_bytes, std::string(1000, 'y')).get(30s);
  auto logs = m.call(&Member::log).get(30s);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(logs[r], (std::vector<int>{1000}));
}

// CAST-10: the same casts when the comm actors are in other processes: the procs serve abstract
// unix addresses and the caster talks to them only through remote refs from its own Proc, so every
// hop (caster -> comm, comm -> comm) is a channel message with cereal-encoded payloads.
TEST(CastTree, CAST10_CastsCrossProcessesBetweenCommActors) {
  const std::string prefix = "unix://@monarch-cast-test-" + std::to_string(::getpid());
  monarch::ProcOptions o;
  o.listen = prefix + "/p{rank}";
  auto procs = ProcMesh::local(Extent{{"procs", 6}}, o, CastOptions{2});
  auto local = procs.spawn<Member>("m", Extent{{"actors", 3}}, 7L);
  monarch::ProcOptions co;
  co.listen = prefix + "/client";
  monarch::Proc client(co);
  auto m = local.attach(client);
  ASSERT_TRUE(m.at(0).is_remote());
  ASSERT_EQ(m.size(), 18u);

  // CAST-5 over the wire: collect, reduce, message ranks, irregular slices.
  auto vals = m.call(&Member::value, 5L).get(30s);
  for (size_t r = 0; r < 18; ++r) EXPECT_EQ(vals[r], 12 + static_cast<long>(r));
  auto where = m.call(&Member::where).get(30s);
  for (size_t r = 0; r < 18; ++r) EXPECT_EQ(where[r], procs.proc(r / 3).name());
  auto odd = m.slice("procs", Range(1, 6, 2)).slice("actors", 2);
  EXPECT_EQ(odd.reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(30s), 3 * 7 + 3);
  EXPECT_EQ(m.reduce([](long a, long b) { return a < b ? b : a; }, &Member::value, 0L).get(30s),
            7 + 17);
  long offset = 1;
  EXPECT_THROW(
      (void)m.reduce([offset](long a, long b) { return a + b + offset; }, &Member::value, 0L),
      monarch::UsageError);  // a capturing lambda cannot be sent
  // stream across processes: each member replies directly, with its rank in the streamed view.
  auto s = odd.stream(&Member::value, 0L);
  std::vector<long> got(3, -1);
  for (int i = 0; i < 3; ++i) {
    auto [rank, value] = s.next(30s);
    got[rank] = value.get(1s);
  }
  EXPECT_EQ(got, (std::vector<long>{7, 8, 9}));

  // CAST-6: a member error names the member, in its own rank.
  try {
    auto vm = m.call(&Member::fail_on, size_t{10}).get(30s);
    EXPECT_EQ(vm.failed_ranks(), (std::vector<size_t>{10}));
    EXPECT_EQ(vm[11], 1);
    vm.throw_if_failed();
    FAIL() << "the cast succeeded";
  } catch (const monarch::ActorError& e) {
    EXPECT_EQ(e.actor(), local.at(10).id());
    EXPECT_THAT(e.remote_message(), HasSubstr("rank 10 failed"));
  }

  // CAST-3: FIFO across slices, with broadcasts and calls mixed.
  std::vector<monarch::mesh::ActorMesh<Member>> slices{m, m.slice("procs", Range(2, 6)),
                                                       m.slice("actors", 1), m.slice("procs", 5)};
  std::vector<std::vector<int>> expected(m.size());
  std::vector<monarch::Future<monarch::ndslice::ValueMesh<monarch::Unit>>> calls;
  for (int seq = 0; seq < 60; ++seq) {
    auto& v = slices[static_cast<size_t>(seq * 3 + seq / 4) % slices.size()];
    for (size_t i = 0; i < v.size(); ++i) expected[v.shape().global_rank(i)].push_back(seq);
    if (seq % 2 == 0) {
      calls.push_back(v.call(&Member::record, seq));
    } else {
      v.broadcast(&Member::record, seq);
    }
  }
  for (auto& c : calls) c.get(30s).throw_if_failed();
  auto logs = m.call(&Member::log).get(30s);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_EQ(logs[r], expected[r]) << "member " << r;

  // CAST-7: a comm actor that is gone fails its subtree's members with a DeliveryFailure naming
  // it; the other members answer (CAST-6).
  procs.proc(1).lookup<CommActor>(monarch::mesh::kCommActorName)->kill().get(10s);
  try {
    auto vm = m.call(&Member::value, 0L).get(30s);
    EXPECT_FALSE(vm.failed_ranks().empty());
    EXPECT_TRUE(vm.ok(0));
    vm.throw_if_failed();
    FAIL() << "the cast succeeded";
  } catch (const monarch::DeliveryFailure& e) {
    EXPECT_EQ(e.destination().name, "monarch.comm");
    EXPECT_EQ(e.destination().proc, procs.proc(1).name());
  }
  EXPECT_EQ(m.slice("procs", Range(4, 6)).reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(30s),
            6 * 7 + 15);
}

struct AsyncMember : monarch::Actor {
  monarch::Task<long> twice(long x) {
    const long r = static_cast<long>(Context::message_rank());  // before any suspension
    co_return 2 * x + r;
  }
  MONARCH_ENDPOINTS(AsyncMember, twice)
};

// CAST-5 for handlers that return Task<R> (they take the Future path, not the direct fold).
TEST(CastTree, CAST5_TaskHandlersAreCollectedAndReducedToo) {
  auto procs = ProcMesh::local(Extent{{"procs", 5}}, {}, CastOptions{2});
  auto m = procs.spawn<AsyncMember>("a", Extent{{"actors", 2}});
  auto v = m.call(&AsyncMember::twice, 3L).get(30s);
  for (size_t r = 0; r < 10; ++r) EXPECT_EQ(v[r], 6 + static_cast<long>(r));
  EXPECT_EQ(m.reduce(monarch::mesh::Sum{}, &AsyncMember::twice, 3L).get(30s), 10 * 6 + 45);
}

TEST(CastTree, PerProcDimsMustNotRepeatProcDims) {
  auto procs = ProcMesh::local(Extent{{"procs", 2}});
  EXPECT_THROW(procs.spawn<Member>("m", Extent{{"procs", 2}}, 0L), monarch::UsageError);
  auto m = procs.slice("procs", 1).spawn<Member>("m", Extent{{"a", 2}, {"b", 3}}, 0L);
  EXPECT_EQ(m.extent().to_string(), "{a=2, b=3}");
  auto where = m.call(&Member::where).get(10s);
  for (size_t r = 0; r < 6; ++r) EXPECT_EQ(where[r], proc_name(1));
  EXPECT_EQ(m.slice("b", 2).reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(10s), 1);
}

// CAST-8: scale. >= 100k actors over >= 1k in-process procs complete a cast with reduction.
TEST(CastTree, CAST8_HundredThousandActorsOnAThousandProcs) {
#ifdef MONARCH_SANITIZED
  const size_t per_proc = 10;  // sanitizers: 10k actors keep the test well under 20 s
#else
  const size_t per_proc = 100;
#endif
  auto procs = ProcMesh::local(Extent{{"hosts", 10}, {"procs", 100}});
  auto m = procs.spawn<Member>("m", Extent{{"actors", per_proc}}, 1L);
  const long n = static_cast<long>(m.size());
  ASSERT_EQ(m.size(), 1000 * per_proc);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(m.reduce(monarch::mesh::Sum{}, &Member::value, 0L).get(60s), n + n * (n - 1) / 2);
  auto ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("cast+reduce to %ld actors on 1000 procs: %.1f ms\n", n, ms);
  auto all = m.call(&Member::value, 0L).get(60s);
  ASSERT_EQ(all.size(), m.size());
  EXPECT_EQ(all[m.size() - 1], n);
}

}  // namespace
