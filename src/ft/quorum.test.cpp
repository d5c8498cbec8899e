// QuorumState rules Q-1..Q-10 (include/monarch/ft/quorum.hpp), driven with made-up time.
#include "monarch/ft/quorum.hpp"

#include <gtest/gtest.h>

using namespace std::chrono_literals;
using monarch::ft::Clock;
using monarch::ft::Quorum;
using monarch::ft::QuorumMember;
using monarch::ft::QuorumRules;
using monarch::ft::QuorumState;

namespace {

QuorumMember member(const std::string& id, int64_t step, bool failed = false,
                    const std::string& job = {}) {
  QuorumMember m;
  m.replica_id = id;
  m.step = step;
  m.commit_failed = failed;
  m.job = job;
  return m;
}

std::vector<std::string> ids(const Quorum& q) {
  std::vector<std::string> out;
  for (const auto& p : q.participants) out.push_back(p.replica_id);
  return out;
}

struct QuorumTest : ::testing::Test {
  Clock::time_point t0 = Clock::time_point{} + 1h;
  QuorumRules rules{.min_replicas = 2, .join_timeout = 500ms, .heartbeat_timeout = 1000ms};
  QuorumState s{rules};

  // Forms the first quorum {a, b, c} at step 0.
  Quorum first_quorum() {
    for (auto id : {"a", "b", "c"}) s.heartbeat(id, t0);
    for (auto id : {"a", "b", "c"}) s.request(member(id, 0), t0);
    auto q = s.poll(t0);
    EXPECT_TRUE(q.has_value());
    return *q;
  }
};

TEST_F(QuorumTest, FirstQuorumWaitsForEveryHealthyGroupThenFormsWithId1) {
  for (auto id : {"a", "b", "c"}) s.heartbeat(id, t0);
  s.request(member("a", 0), t0);
  s.request(member("b", 0), t0);
  std::string why;
  EXPECT_FALSE(s.poll(t0 + 10ms, &why).has_value());
  EXPECT_NE(why.find("waiting for 1"), std::string::npos) << why;
  s.request(member("c", 0), t0 + 20ms);
  auto q = s.poll(t0 + 20ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->quorum_id, 1);
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(q->reason, "all healthy joined");
  EXPECT_EQ(s.pending(), 0u);
}

// Two fresh replacements (step 0) are a majority of the healthy groups while the one group at
// step 5 is between requests: they must not form a quorum at step 0 and retrain from there.
TEST_F(QuorumTest, NoQuorumGoesBackBelowThePreviousMaxStep) {
  first_quorum();
  for (auto id : {"a", "b", "c"}) s.request(member(id, 5), t0 + 10ms);
  auto q5 = s.poll(t0 + 10ms);
  ASSERT_TRUE(q5.has_value());
  EXPECT_EQ(q5->max_step, 5);
  s.evict("a");
  s.evict("b");
  s.heartbeat("a", t0 + 20ms);  // replacements, fresh state
  s.heartbeat("b", t0 + 20ms);
  s.heartbeat("c", t0 + 20ms);
  s.request(member("a", 0), t0 + 20ms);
  s.request(member("b", 0), t0 + 20ms);
  std::string why;
  EXPECT_FALSE(s.poll(t0 + 20ms + rules.join_timeout, &why).has_value());
  EXPECT_NE(why.find("Q-8"), std::string::npos) << why;
  s.request(member("c", 5), t0 + 30ms + rules.join_timeout);  // the group with the state asks
  auto q = s.poll(t0 + 30ms + rules.join_timeout);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->max_step, 5);
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(q->donor_for("a")->replica_id, "c");
}

// A second job on the same lighthouse, with the same replica ids, starts at step 0: once the
// first job is over it trains from its own step 0 (not held back by the old max_step, Q-8, and
// not given the old job's groups as donors), with quorum ids above the old job's.
TEST_F(QuorumTest, ANewJobTakesOverOnceTheOldOneIsOver) {
  first_quorum();
  for (auto id : {"a", "b", "c"}) s.request(member(id, 30), t0 + 10ms);
  auto old = s.poll(t0 + 10ms);
  ASSERT_TRUE(old.has_value());
  // The old job ended; the new job's groups (same ids) heartbeat, and two of them ask. The
  // third one is live and has not asked yet: it may still be the old job's c.
  auto t1 = t0 + 10ms + rules.heartbeat_timeout + 1ms;
  for (auto id : {"a", "b", "c"}) s.heartbeat(id, t1);
  s.request(member("a", 0, false, "job2"), t1);
  s.request(member("b", 0, false, "job2"), t1);
  std::string why;
  EXPECT_FALSE(s.poll(t1 + rules.join_timeout, &why).has_value());
  EXPECT_NE(why.find("Q-10"), std::string::npos) << why;
  auto t2 = t1 + rules.join_timeout + 10ms;
  s.heartbeat("a", t2);
  s.heartbeat("b", t2);
  s.request(member("c", 0, false, "job2"), t2);
  auto q = s.poll(t2);
  ASSERT_TRUE(q.has_value()) << why;
  EXPECT_EQ(q->max_step, 0);
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_GT(q->quorum_id, old->quorum_id);
  EXPECT_FALSE(q->donor_for("a").has_value());  // nobody heals from the old job
}

TEST_F(QuorumTest, ANewJobWaitsWhileTheOldOneHasLiveGroups) {
  first_quorum();
  // The new job's "a" asks while the old job's b and c are alive and train on.
  s.request(member("a", 0, false, "job2"), t0 + 10ms);
  std::string why;
  EXPECT_FALSE(s.poll(t0 + 10ms + rules.join_timeout, &why).has_value());
  EXPECT_NE(why.find("Q-10"), std::string::npos) << why;
  s.request(member("b", 1), t0 + 20ms + rules.join_timeout);
  s.request(member("c", 1), t0 + 20ms + rules.join_timeout);
  auto q = s.poll(t0 + 20ms + rules.join_timeout);
  ASSERT_TRUE(q.has_value()) << "the old job's live groups go on";
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(q->max_step, 1);
}

TEST_F(QuorumTest, FastPathKeepsTheIdWhenMembershipIsIntact) {
  auto q1 = first_quorum();
  for (auto id : {"c", "a", "b"}) s.request(member(id, 1), t0 + 100ms);
  auto q2 = s.poll(t0 + 100ms);
  ASSERT_TRUE(q2.has_value());
  EXPECT_EQ(q2->reason, "fast path");
  EXPECT_EQ(q2->quorum_id, q1.quorum_id);
  EXPECT_EQ(q2->max_step, 1);
}

TEST_F(QuorumTest, ACommitFailureBumpsTheIdEvenWithTheSameMembers) {
  first_quorum();
  s.request(member("a", 0, /*failed=*/true), t0 + 100ms);
  s.request(member("b", 0), t0 + 100ms);
  s.request(member("c", 0), t0 + 100ms);
  auto q = s.poll(t0 + 100ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->quorum_id, 2);
}

TEST_F(QuorumTest, ADeadGroupDelaysTheQuorumUntilJoinTimeoutAndBumpsTheId) {
  first_quorum();
  // c died: a and b ask; c's heartbeat is still fresh, so they wait for it...
  s.request(member("a", 1), t0 + 100ms);
  s.request(member("b", 1), t0 + 100ms);
  EXPECT_FALSE(s.poll(t0 + 500ms).has_value());
  // ... until join_timeout after the first pending request.
  auto q = s.poll(t0 + 600ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->reason, "join timeout");
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(q->quorum_id, 2);
}

TEST_F(QuorumTest, EvictionFormsTheQuorumAtOnce) {
  first_quorum();
  s.request(member("a", 1), t0 + 100ms);
  s.request(member("b", 1), t0 + 100ms);
  s.evict("c");
  auto q = s.poll(t0 + 101ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->reason, "all healthy joined");
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b"}));
}

TEST_F(QuorumTest, AStaleHeartbeatIsNotHealthyAndItsRequestIsNoCandidate) {
  first_quorum();
  s.heartbeat("a", t0 + 1500ms);
  s.heartbeat("b", t0 + 1500ms);
  // c asked long ago and went silent (frozen): not a candidate, not healthy.
  s.request(member("c", 0), t0 + 100ms);
  s.request(member("a", 1), t0 + 1500ms);
  s.request(member("b", 1), t0 + 1500ms);
  auto q = s.poll(t0 + 1500ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.healthy(t0 + 1500ms), (std::vector<std::string>{"a", "b"}));
}

// A frozen participant: the others hear, with their heartbeat replies, that it is silent, and the
// quorum they ask for next forms at once without it.
TEST_F(QuorumTest, AParticipantWithoutAFreshHeartbeatIsNamedSilent) {
  EXPECT_TRUE(s.silent(t0).empty());                                   // no quorum yet
  first_quorum();
  // Everyone beats every 100 ms; c stops after t0 + 200 ms (SIGSTOP).
  for (auto t = 100ms; t <= 1300ms; t += 100ms) {
    for (auto id : {"a", "b", "c"}) {
      if (std::string(id) == "c" && t > 200ms) continue;
      auto now = t0 + t;
      auto silent = s.silent(now, id);
      // c's last beat was at 200 ms: fresh until 1200 ms (heartbeat_timeout 1000 ms)
      if (t <= 1200ms) {
        EXPECT_TRUE(silent.empty()) << "at " << t.count() << " ms for " << id;
      } else {
        EXPECT_EQ(silent, std::vector<std::string>{"c"}) << "at " << t.count() << " ms for " << id;
      }
      s.heartbeat(id, now);
    }
  }
  // The asking group is never named, even when its own last beat is old (it just thawed).
  EXPECT_TRUE(s.silent(t0 + 1300ms, "c").empty());
  s.request(member("a", 9, /*failed=*/true), t0 + 1300ms);
  s.request(member("b", 9, /*failed=*/true), t0 + 1300ms);
  auto q = s.poll(t0 + 1300ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(q->reason, "all healthy joined");
  EXPECT_TRUE(s.silent(t0 + 1300ms).empty());  // the new quorum has no silent member
  // An evicted participant is silent at once.
  s.evict("b");
  EXPECT_EQ(s.silent(t0 + 1301ms, "a"), std::vector<std::string>{"b"});
}

// A lighthouse that observed nothing for longer than half the heartbeat timeout (it was frozen
// or starved: the heartbeats are queued behind the one it answers) names nobody: its view is
// old, not the groups.
TEST_F(QuorumTest, AStaleViewNamesNobodySilent) {
  first_quorum();
  EXPECT_TRUE(s.silent(t0 + 1400ms, "a").empty());  // nothing observed since t0
  s.heartbeat("a", t0 + 1400ms);
  // Now the view is fresh again and b and c have not been heard from for 1.4 s.
  EXPECT_EQ(s.silent(t0 + 1401ms, "a"), (std::vector<std::string>{"b", "c"}));
}

TEST_F(QuorumTest, SplitBrainGuardNeedsMoreThanHalfOfTheHealthy) {
  QuorumState four(QuorumRules{.min_replicas = 1, .join_timeout = 100ms, .heartbeat_timeout = 1s});
  for (auto id : {"a", "b", "c", "d"}) four.heartbeat(id, t0);
  four.request(member("a", 0), t0);
  four.request(member("b", 0), t0);
  std::string why;
  EXPECT_FALSE(four.poll(t0 + 200ms, &why).has_value()) << "2 of 4 healthy is not a majority";
  EXPECT_NE(why.find("not more than half"), std::string::npos) << why;
  four.request(member("c", 0), t0 + 200ms);
  EXPECT_TRUE(four.poll(t0 + 200ms).has_value());
}

TEST_F(QuorumTest, MinReplicasIsEnforced) {
  s.heartbeat("a", t0);
  s.request(member("a", 0), t0);
  std::string why;
  EXPECT_FALSE(s.poll(t0 + 2s - 1500ms, &why).has_value());
  EXPECT_NE(why.find("min_replicas is 2"), std::string::npos) << why;
}

TEST_F(QuorumTest, HealersGetDonorsRoundRobinAmongUpToDateGroups) {
  QuorumState st(QuorumRules{.min_replicas = 1, .join_timeout = 100ms, .heartbeat_timeout = 1s});
  st.request(member("a", 7), t0);
  st.request(member("b", 7), t0);
  st.request(member("c", 3), t0);
  st.request(member("d", 0), t0);
  auto q = st.poll(t0);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->max_step, 7);
  EXPECT_EQ(q->up_to_date(), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(q->donor_for("a").has_value());
  auto dc = q->donor_for("c"), dd = q->donor_for("d");
  ASSERT_TRUE(dc && dd);
  EXPECT_NE(dc->replica_id, dd->replica_id) << "two healers, two donors: " << q->to_string();
  EXPECT_THROW(q->donor_for("zz"), monarch::UsageError);
}

TEST(QuorumRulesTest, BadMinReplicasIsRejected) {
  EXPECT_THROW(QuorumState(QuorumRules{.min_replicas = 0}), monarch::UsageError);
}

TEST(QuorumRecovery, Q7AFreshLighthouseHearsFromEveryGroupBeforeLeavingAnyOut) {
  Clock::time_point t0 = Clock::time_point{} + 1h;
  QuorumState s{QuorumRules{.min_replicas = 1,
                            .join_timeout = 100ms,
                            .heartbeat_timeout = 1000ms,
                            .recovery_wait = 1000ms}};
  // Restarted: only a has been heard from; alone it would be "all healthy joined".
  auto a = member("a", 7);
  a.last_quorum_id = 41;
  s.request(a, t0);
  std::string why;
  EXPECT_FALSE(s.poll(t0 + 10ms, &why).has_value());
  EXPECT_NE(why.find("Q-7"), std::string::npos) << why;
  auto b = member("b", 7);
  b.last_quorum_id = 41;
  s.request(b, t0 + 100ms);
  EXPECT_FALSE(s.poll(t0 + 999ms).has_value()) << "still within the recovery wait";
  auto q = s.poll(t0 + 1000ms);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(ids(*q), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(q->quorum_id, 42) << "a restarted lighthouse never reuses a quorum id (store prefix)";
}

TEST(QuorumRecovery, Q7AFrozenLighthouseWaitsAgainButTheFastPathStillApplies) {
  Clock::time_point t0 = Clock::time_point{} + 1h;
  QuorumState s{QuorumRules{.min_replicas = 1,
                            .join_timeout = 100ms,
                            .heartbeat_timeout = 1000ms,
                            .recovery_wait = 1000ms}};
  for (auto id : {"a", "b", "c"}) s.request(member(id, 0), t0);
  auto q1 = s.poll(t0 + 1000ms);  // after the start's recovery wait
  ASSERT_TRUE(q1.has_value());
  EXPECT_EQ(q1->quorum_id, 1);
  // Frozen for 3 s; on the thaw a's request is handled first. Without Q-7, {a} would be "all
  // healthy joined" (b's and c's heartbeats are stale) while b and c train on at the same step.
  auto t1 = t0 + 4s;
  s.request(member("a", 1), t1);
  EXPECT_FALSE(s.poll(t1).has_value());
  s.request(member("b", 1), t1 + 1ms);
  EXPECT_FALSE(s.poll(t1 + 1ms).has_value());
  s.request(member("c", 1), t1 + 2ms);
  auto q2 = s.poll(t1 + 2ms);  // the previous quorum is intact
  ASSERT_TRUE(q2.has_value());
  EXPECT_EQ(q2->reason, "fast path");
  EXPECT_EQ(q2->quorum_id, 1);
  EXPECT_EQ(ids(*q2), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(QuorumRecovery, WithoutARecoveryWaitTheOldRulesHold) {
  Clock::time_point t0 = Clock::time_point{} + 1h;
  QuorumState s{QuorumRules{.min_replicas = 1, .join_timeout = 100ms}};
  s.request(member("a", 0), t0);
  auto q = s.poll(t0);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->quorum_id, 1);
}

}  // namespace
