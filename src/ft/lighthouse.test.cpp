// Lighthouse + Manager actors in one Proc: quorum per rank, commit votes, eviction, healing
// assignment, heartbeat expiry. The rules themselves are tested in quorum.test.cpp (Q-1..Q-6).
#include "monarch/ft/lighthouse.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "monarch/actor/runtime.hpp"

using namespace std::chrono_literals;
using monarch::ActorRef;
using monarch::Future;
using monarch::Proc;
using monarch::ft::Lighthouse;
using monarch::ft::LighthouseOptions;
using monarch::ft::Manager;
using monarch::ft::QuorumError;
using monarch::ft::QuorumResult;
using ::testing::HasSubstr;

namespace {

monarch::rdma::RdmaHandle fake_state(const std::string& name) {
  monarch::rdma::RdmaHandle h;  // plain data: the managers only pass it along
  h.name = name;
  h.length = 64;
  return h;
}

struct LighthouseTest : ::testing::Test {
  Proc proc;
  ActorRef<Lighthouse> lh = proc.spawn<Lighthouse>(
      "lighthouse",
      LighthouseOptions{.min_replicas = 1, .join_timeout = 200ms, .heartbeat_timeout = 600ms});

  ActorRef<Manager> manager(const std::string& id, int64_t world = 1) {
    auto m = proc.spawn<Manager>("manager." + id, lh, id, world, 50ms);
    // The manager heartbeats on its own thread; this one makes sure the lighthouse knows the group
    // before any quorum request from this thread (FIFO per sender), so the first quorum has all.
    lh.send(&Lighthouse::heartbeat, id, uint64_t{0});  // the Manager's own beats follow
    return m;
  }
  Future<QuorumResult> ask(ActorRef<Manager>& m, int64_t rank, int64_t step, bool failed = false,
                           std::optional<monarch::rdma::RdmaHandle> state = std::nullopt) {
    return m.call(&Manager::quorum, rank, step, failed, std::move(state));
  }
};

TEST_F(LighthouseTest, EveryRankOfEveryGroupGetsItsPlaceInOneQuorum) {
  auto a = manager("a"), b = manager("b", 2);
  auto fa = ask(a, 0, 0);
  auto fb1 = ask(b, 1, 0);
  auto fb0 = ask(b, 0, 0);
  QuorumResult ra = fa.get(5s), rb0 = fb0.get(5s), rb1 = fb1.get(5s);
  for (auto* r : {&ra, &rb0, &rb1}) {
    EXPECT_EQ(r->quorum_id, 1);
    EXPECT_EQ(r->replica_world_size, 2);
    EXPECT_EQ(r->global_world_size, 3);  // a has 1 rank, b has 2
    EXPECT_EQ(r->store_prefix, "quorum/1/");
    EXPECT_FALSE(r->heal);
    EXPECT_EQ(r->participants, (std::vector<std::string>{"a", "b"}));
  }
  EXPECT_EQ(ra.global_rank, 0);
  EXPECT_EQ(rb0.global_rank, 1);
  EXPECT_EQ(rb1.global_rank, 2);
}

// Two trainers of one group given the same rank replaced each other's quorum requests for a
// minute (newcomer report, stop 51). Each ReplicaClient claims its rank once; a second client
// on a claimed rank is told why, naming the group and the ranks it may use.
TEST_F(LighthouseTest, ARankIsClaimedByOneClientOnly) {
  auto b = manager("b", 2);
  EXPECT_EQ(b.call(&Manager::claim, int64_t{0}, uint64_t{11}).get(5s), "");
  EXPECT_EQ(b.call(&Manager::claim, int64_t{0}, uint64_t{11}).get(5s), "");  // the same client
  EXPECT_EQ(b.call(&Manager::claim, int64_t{1}, uint64_t{12}).get(5s), "");
  const std::string why = b.call(&Manager::claim, int64_t{0}, uint64_t{13}).get(5s);
  EXPECT_THAT(why, HasSubstr("b rank 0 is already used by another trainer of this group"));
  EXPECT_THAT(why, HasSubstr("its own rank, 0..1"));
  EXPECT_THROW(b.call(&Manager::claim, int64_t{2}, uint64_t{14}).get(5s), monarch::Error);
}

TEST_F(LighthouseTest, OneBadVoteFailsTheCommitForTheWholeGroup) {
  auto g = manager("g", 3);
  auto v0 = g.call(&Manager::should_commit, int64_t{0}, int64_t{5}, true);
  auto v1 = g.call(&Manager::should_commit, int64_t{1}, int64_t{5}, false);
  EXPECT_FALSE(v0.wait_for(50ms)) << "must wait for every rank";
  auto v2 = g.call(&Manager::should_commit, int64_t{2}, int64_t{5}, true);
  EXPECT_FALSE(v0.get(5s));
  EXPECT_FALSE(v1.get(5s));
  EXPECT_FALSE(v2.get(5s));
  // Next step, all ok.
  std::vector<Future<bool>> ok;
  for (int64_t r = 0; r < 3; ++r)
    ok.push_back(g.call(&Manager::should_commit, r, int64_t{6}, true));
  for (auto& f : ok) EXPECT_TRUE(f.get(5s));
  EXPECT_THAT([&] { g.call(&Manager::should_commit, int64_t{3}, int64_t{6}, true).get(5s); },
              ::testing::ThrowsMessage<monarch::ActorError>(HasSubstr("rank 3 is outside [0, 3)")));
}

TEST_F(LighthouseTest, ABehindGroupHealsFromTheDonorsStateAndCommitFailureBumpsTheId) {
  auto a = manager("a"), b = manager("b"), c = manager("c");
  std::vector<Future<QuorumResult>> f;
  f.push_back(ask(a, 0, 4, false, fake_state("a.state")));
  f.push_back(ask(b, 0, 4, false, fake_state("b.state")));
  f.push_back(ask(c, 0, 0, false, std::nullopt));  // a restarted replica: nothing to offer
  auto ra = f[0].get(5s), rb = f[1].get(5s), rc = f[2].get(5s);
  EXPECT_EQ(rc.max_step, 4);
  EXPECT_TRUE(rc.heal);
  ASSERT_TRUE(rc.donor_state.has_value());
  EXPECT_EQ(rc.donor_state->name, rc.donor_id + ".state");
  EXPECT_EQ(rc.up_to_date_groups, 2);
  EXPECT_EQ(rc.healing, (std::vector<std::string>{"c"}));
  EXPECT_FALSE(ra.heal);
  EXPECT_FALSE(rb.heal);

  // The step failed to commit somewhere: the next quorum, same members, has a new id.
  auto f2a = ask(a, 0, 4, true), f2b = ask(b, 0, 4), f2c = ask(c, 0, 4);
  EXPECT_EQ(f2a.get(5s).quorum_id, ra.quorum_id + 1);
  EXPECT_EQ(f2b.get(5s).quorum_id, ra.quorum_id + 1);
  EXPECT_EQ(f2c.get(5s).quorum_id, ra.quorum_id + 1);
}

TEST_F(LighthouseTest, EvictionFailsThePendingRequestAndLetsTheOthersGoOn) {
  auto a = manager("a"), b = manager("b");
  auto fa = ask(a, 0, 0), fb = ask(b, 0, 0);
  ASSERT_EQ(fa.get(5s).quorum_id, 1);
  ASSERT_EQ(fb.get(5s).quorum_id, 1);
  // b asks again, then is declared dead before a asks: its request fails with the reason.
  auto fb2 = ask(b, 0, 1);
  // The request travels test -> manager -> lighthouse; wait until it is there (with a deadline).
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (lh.call(&Lighthouse::pending).get(5s) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "b's request never reached the lighthouse";
    std::this_thread::yield();
  }
  lh.call(&Lighthouse::evict, std::string("b"), std::string("proc exited with code 3")).get(5s);
  EXPECT_THAT([&] { fb2.get(5s); },
              ::testing::ThrowsMessage<QuorumError>(HasSubstr("proc exited with code 3")));
  // b's manager still heartbeats; stop it so that it is not healthy any more.
  b.stop().get(5s);
  lh.call(&Lighthouse::evict, std::string("b"), std::string("stopped")).get(5s);
  auto ra = ask(a, 0, 1).get(5s);
  EXPECT_EQ(ra.participants, (std::vector<std::string>{"a"}));
  EXPECT_EQ(ra.quorum_id, 2);
  EXPECT_EQ(lh.call(&Lighthouse::healthy).get(5s), (std::vector<std::string>{"a"}));
}

TEST_F(LighthouseTest, AGroupWhoseHeartbeatsStopIsLeftOutAfterTheHeartbeatTimeout) {
  auto a = manager("a"), b = manager("b");
  auto fa = ask(a, 0, 0), fb = ask(b, 0, 0);
  ASSERT_EQ(fa.get(5s).quorum_id, 1);
  fb.get(5s);
  b.stop().get(5s);  // silent from now on, never evicted
  auto start = std::chrono::steady_clock::now();
  auto ra = ask(a, 0, 1).get(5s);
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ra.participants, (std::vector<std::string>{"a"}));
  EXPECT_GE(waited, 150ms)
      << "a had to wait: join timeout (200 ms) or b's heartbeat timeout (600 ms)";
}

TEST_F(LighthouseTest, StatusShowsTheQuorumItsMembersAndTheirStepsAndAKillIsDeliveredByHeartbeat) {
  auto a = manager("a"), b = manager("b");
  auto fa = ask(a, 0, 3), fb = ask(b, 0, 1);  // b is behind: it heals in this quorum
  ASSERT_EQ(fa.get(5s).quorum_id, 1);
  fb.get(5s);
  auto s = lh.call(&Lighthouse::status).get(5s);
  EXPECT_NE(s.epoch, 0u);
  EXPECT_EQ(s.quorum_id, 1);
  EXPECT_EQ(s.max_step, 3);
  EXPECT_EQ(s.members, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(s.replicas.size(), 2u);
  for (const auto& r : s.replicas) {
    EXPECT_EQ(r.step, r.replica_id == "a" ? 3 : 1) << r.replica_id;
    EXPECT_TRUE(r.healthy) << r.replica_id;
    EXPECT_TRUE(r.in_quorum) << r.replica_id;
    EXPECT_GE(r.heartbeat_age_ms, 0) << r.replica_id;
  }
  ASSERT_EQ(s.changes.size(), 1u);
  EXPECT_EQ(s.changes[0].participants, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.changes[0].healing, (std::vector<std::string>{"b"}));
  EXPECT_GT(s.changes[0].unix_ms, 0);

  EXPECT_FALSE(lh.call(&Lighthouse::kill_replica, std::string("nobody")).get(5s));
  // The kill travels on heartbeat replies (a Manager would SIGKILL its process; here the test
  // plays the heartbeats of incarnation 7 of b, so that this process survives).
  b.stop().get(5s);
  auto beat = [&](uint64_t incarnation) {
    return lh.call(&Lighthouse::heartbeat, std::string("b"), incarnation).get(5s);
  };
  EXPECT_FALSE(beat(7).kill);
  EXPECT_TRUE(lh.call(&Lighthouse::kill_replica, std::string("b")).get(5s));
  auto r1 = beat(7);
  EXPECT_TRUE(r1.kill);
  EXPECT_EQ(r1.epoch, s.epoch);
  // Every reply to the doomed incarnation carries the kill: its Manager may have stopped waiting
  // for the first (the CI failure this guards against: a slow lighthouse, a lost kill).
  EXPECT_TRUE(beat(7).kill) << "a reply the Manager gave up on must not take the kill with it";
  // A repeated request (a retry, a double click) is the same kill.
  EXPECT_TRUE(lh.call(&Lighthouse::kill_replica, std::string("b")).get(5s));
  EXPECT_TRUE(beat(7).kill);
  // b's replacement (incarnation 8) is never told to die by that kill, not even when the request
  // is repeated after the victim died but before the replacement's first heartbeat...
  EXPECT_FALSE(beat(8).kill);
  EXPECT_TRUE(beat(7).kill) << "the doomed one, still beating, is still doomed";
  EXPECT_FALSE(beat(8).kill) << "and its late beat did not make it the current one again";
  // ...while a request after the replacement's first heartbeat is a new kill, of the replacement.
  EXPECT_TRUE(lh.call(&Lighthouse::kill_replica, std::string("b")).get(5s));
  EXPECT_TRUE(beat(8).kill);
  EXPECT_FALSE(beat(9).kill);
}

}  // namespace
