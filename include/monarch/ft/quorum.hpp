// Quorum rules of fault-tolerant training (docs/design.md, "Vocabulary"; docs/ft.md), as plain
// data and a pure state machine. The Lighthouse actor (lighthouse.hpp) drives a QuorumState with
// real time; tests drive it with made-up time points.
//
// Vocabulary: a *replica group* (one model replica, `world_size` ranks) joins a *quorum* each
// step. The quorum lists the participating groups, their steps and `max_step`; groups behind
// `max_step` heal from an up-to-date donor before the step. `quorum_id` goes up whenever the
// membership changes or a member reports that its previous step failed to commit, so every
// member rebuilds its collective group (a fresh store prefix) on a new id.
//
// Rules, numbered (tests cite them):
//  Q-1 Only replica groups with a fresh heartbeat (within QuorumRules::heartbeat_timeout; a quorum
//      request counts as one) are *healthy*, and only healthy requesters are candidates.
//  Q-2 Fast path: when every participant of the previous quorum is a candidate, the quorum forms
//      at once from all candidates.
//  Q-3 Otherwise a quorum needs at least `min_replicas` candidates AND more than half of the
//  healthy
//      groups (split-brain guard) AND either every healthy group has asked, or `join_timeout` has
//      passed since the first pending request.
//  Q-4 quorum_id starts at 1 and goes up by one when the participant set differs from the previous
//      quorum's, or when any participant reports a commit failure; otherwise it stays.
//  Q-5 max_step is the largest participant step. Participants behind it heal; each healer gets a
//      donor round-robin (by healer order, offset by quorum_id) among participants at max_step.
//  Q-6 An evicted group (declared dead by supervision) is not healthy until it heartbeats again,
//      and its pending request is dropped.
//  Q-7 A lighthouse that may not have heard from every live group yet (it just started, e.g.
//      restarted on the same address, or it resumes after more than heartbeat_timeout without any
//      event: it was frozen) forms no quorum by Q-3 for QuorumRules::recovery_wait (0: off), so
//      that a quorum of the first few groups heard from cannot leave the others out while they
//      train on at the same step (split brain). Q-2 still applies. Quorum ids stay increasing
//      across a restart: a quorum's id is above the largest `last_quorum_id` its participants
//      report, so a fresh lighthouse never reuses an id (and a store prefix).
//  Q-8 No quorum goes back: one whose max_step is below the previous quorum's (none of its
//      candidates holds the state the job last had, e.g. two fresh replacements while the one
//      up-to-date group is frozen or between requests) does not form; the lighthouse waits for a
//      group that holds it. Such a quorum would retrain from an old step and diverge from what
//      was committed (found by ft_train --chaos). If every such group is dead, no quorum forms
//      (there is no checkpoint): the controller's progress watchdog (ft.progress_timeout) ends
//      the run with an error that quotes this rule's waiting_for.
//  Q-9 A participant of the previous quorum that is not healthy (Q-1: no heartbeat within
//      heartbeat_timeout, or evicted) is *silent*. Every heartbeat reply names the silent members
//      of the previous quorum, so that the others stop waiting for them inside a collective (a
//      frozen group never closes its sockets: without this they wait out the collective
//      timeout) and ask again; by the next quorum leaves the silent ones out at once.
//      A lighthouse whose own view may be stale (it observed nothing for more than half the
//      heartbeat timeout: it was frozen or starved, so heartbeats are queued, not missing) names
//      none. Naming a live group silent costs a failed step and a heal, never correctness.
//  Q-10 One job at a time: every request names its job (QuorumMember::job; the controller draws
//      one per run, so two runs of one program are two jobs). Requests of another job than the
//      previous quorum's are not candidates until that job is over: each participant of its
//      previous quorum is unhealthy, evicted, or has asked for the new job. Then the lighthouse
//      forgets the old job's quorum (so judge the new job by its own steps, not the
//      old job's max_step) and serves the new one; quorum ids keep increasing across jobs.
#pragma once

#include <cereal/types/chrono.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"

namespace monarch::ft {

using Clock = std::chrono::steady_clock;

/// One replica group's request to join the next quorum.
struct QuorumMember {
  std::string replica_id;      ///< unique per group, e.g. "replica2"; restarts keep the id
  int64_t step = 0;            ///< steps this group has committed
  int64_t world_size = 1;      ///< ranks in the group
  bool commit_failed = false;  ///< its previous step did not commit (Q-4)
  /// Where each rank's committed state can be read (index = local rank); empty when the group has
  /// nothing to offer (e.g. it is healing).
  std::vector<rdma::RdmaHandle> state{};
  std::string address{};       ///< free-form: where the group can be reached (for reports)
  int64_t last_quorum_id = 0;  ///< the last quorum id this group was given (0: none) (Q-7)
  std::string job{};           ///< the job this group belongs to (Q-10); "" is a job too

  template <class A>
  void serialize(A& ar) {
    ar(replica_id, step, world_size, commit_failed, state, address, last_quorum_id, job);
  }
};

/// A formed quorum: the same value goes to every participant.
struct Quorum {
  int64_t quorum_id = 0;
  std::vector<QuorumMember> participants{};  ///< sorted by replica_id
  int64_t max_step = 0;
  std::string reason{};  ///< why it formed: "fast path", "all healthy joined", "join timeout"

  /// Index of `replica_id` among participants; -1 if absent.
  int64_t rank_of(const std::string& replica_id) const;
  /// The donor of participant `replica_id` if it must heal; nullopt when it is up to date.
  /// Throws UsageError if replica_id is not a participant.
  std::optional<QuorumMember> donor_for(const std::string& replica_id) const;
  /// Participants at max_step (not healing), in order.
  std::vector<std::string> up_to_date() const;
  /// "quorum 3 (fast path): replica0@12 replica1@12 replica2@9(heal<-replica0)".
  std::string to_string() const;

  template <class A>
  void serialize(A& ar) {
    ar(quorum_id, participants, max_step, reason);
  }
};

struct QuorumRules {
  int64_t min_replicas = 1;
  std::chrono::milliseconds join_timeout{500};
  std::chrono::milliseconds heartbeat_timeout{1000};
  std::chrono::milliseconds recovery_wait{0};  ///< Q-7; 0: off
};

/// The lighthouse's bookkeeping. Not thread-safe (the Lighthouse actor owns it).
class QuorumState {
 public:
  explicit QuorumState(QuorumRules rules);

  /// A heartbeat from `replica_id` at `now`.
  void heartbeat(const std::string& replica_id, Clock::time_point now);
  /// `m` asks to join the next quorum (replaces its earlier pending request). Counts as a
  /// heartbeat.
  void request(QuorumMember m, Clock::time_point now);
  /// Supervision declared the group dead.
  void evict(const std::string& replica_id);
  /// Forms a quorum if the rules allow one at `now` (Q-1..Q-5); the pending requests it answers
  /// are consumed. When none forms, `why_not` (if given) says what is missing.
  std::optional<Quorum> poll(Clock::time_point now, std::string* why_not = nullptr);

  const std::optional<Quorum>& previous() const { return previous_; }
  /// Last heartbeat (or request) of every group heard from, by replica id.
  const std::map<std::string, Clock::time_point>& heartbeats() const { return last_heartbeat_; }
  /// Requests waiting for a quorum, by replica id.
  const std::map<std::string, QuorumMember>& pending_members() const { return pending_; }
  /// Until when Q-7 holds back Q-3 quorums (nullopt: not now).
  std::optional<Clock::time_point> recovering_until() const { return recovering_until_; }
  /// Groups with a fresh heartbeat at `now`, sorted.
  std::vector<std::string> healthy(Clock::time_point now) const;
  /// the previous quorum's participants that are not healthy at `now`, sorted, leaving out
  /// `asking` (the group whose heartbeat is being answered: it is alive). Empty when there is no
  /// previous quorum, or when nothing was observed for more than heartbeat_timeout / 2 before
  /// `now` (this state's view may be stale). Call it before recording the heartbeat at `now`.
  std::vector<std::string> silent(Clock::time_point now, const std::string& asking = {}) const;
  size_t pending() const { return pending_.size(); }
  const QuorumRules& rules() const { return rules_; }

 private:
  QuorumRules rules_;
  std::map<std::string, Clock::time_point> last_heartbeat_;
  std::map<std::string, QuorumMember> pending_;
  std::optional<Clock::time_point> first_pending_;
  std::optional<Quorum> previous_;
  std::optional<std::string> job_;      // the job served (none before its first quorum)
  int64_t id_floor_ = 0;                // the last quorum id of the jobs before
  void observe(Clock::time_point now);  // a start or a gap begins a recovery wait
  std::optional<Clock::time_point> last_event_;
  std::optional<Clock::time_point> recovering_until_;
};

}  // namespace monarch::ft
