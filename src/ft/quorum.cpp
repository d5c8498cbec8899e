#include "monarch/ft/quorum.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace monarch::ft {

int64_t Quorum::rank_of(const std::string& replica_id) const {
  for (size_t i = 0; i < participants.size(); ++i) {
    if (participants[i].replica_id == replica_id) return static_cast<int64_t>(i);
  }
  return -1;
}

std::vector<std::string> Quorum::up_to_date() const {
  std::vector<std::string> out;
  for (const auto& p : participants) {
    if (p.step == max_step) out.push_back(p.replica_id);
  }
  return out;
}

std::optional<QuorumMember> Quorum::donor_for(const std::string& replica_id) const {
  int64_t me = rank_of(replica_id);
  if (me < 0) throw UsageError("Quorum::donor_for: " + replica_id + " is not in " + to_string());
  if (participants[static_cast<size_t>(me)].step == max_step) return std::nullopt;
  std::vector<const QuorumMember*> donors, healers;
  for (const auto& p : participants) (p.step == max_step ? donors : healers).push_back(&p);
  size_t healer_index = 0;
  while (healers[healer_index]->replica_id != replica_id) ++healer_index;
  // round-robin, shifted by the quorum id so that a retry after a failed heal (a new quorum)
  // tends to pick another donor.
  size_t pick = (healer_index + static_cast<size_t>(quorum_id)) % donors.size();
  return *donors[pick];
}

std::string Quorum::to_string() const {
  std::string s = fmt::format("quorum {} ({}):", quorum_id, reason);
  for (const auto& p : participants) {
    s += fmt::format(" {}@{}", p.replica_id, p.step);
    if (p.step != max_step) {
      auto d = donor_for(p.replica_id);
      s += fmt::format("(heal<-{})", d->replica_id);
    }
  }
  return s;
}

QuorumState::QuorumState(QuorumRules rules) : rules_(rules) {
  if (rules_.min_replicas < 1) {
    throw UsageError(
        fmt::format("QuorumRules: min_replicas must be >= 1, got {}", rules_.min_replicas));
  }
}

void QuorumState::observe(Clock::time_point now) {
  if (rules_.recovery_wait.count() > 0 &&
      (!last_event_ || now - *last_event_ > rules_.heartbeat_timeout)) {
    recovering_until_ = now + rules_.recovery_wait;
  }
  if (!last_event_ || now > *last_event_) last_event_ = now;
}

void QuorumState::heartbeat(const std::string& replica_id, Clock::time_point now) {
  observe(now);
  auto& t = last_heartbeat_[replica_id];
  t = std::max(t, now);
}

void QuorumState::request(QuorumMember m, Clock::time_point now) {
  heartbeat(m.replica_id, now);  // observes `now`
  if (!first_pending_) first_pending_ = now;
  std::string id = m.replica_id;
  pending_[id] = std::move(m);
}

void QuorumState::evict(const std::string& replica_id) {
  last_heartbeat_.erase(replica_id);
  pending_.erase(replica_id);
  if (pending_.empty()) first_pending_.reset();
}

std::vector<std::string> QuorumState::healthy(Clock::time_point now) const {
  std::vector<std::string> out;
  for (const auto& [id, t] : last_heartbeat_) {
    if (now - t <= rules_.heartbeat_timeout) out.push_back(id);
  }
  return out;
}

std::vector<std::string> QuorumState::silent(Clock::time_point now,
                                             const std::string& asking) const {
  std::vector<std::string> out;
  if (!previous_ || !last_event_ || now - *last_event_ > rules_.heartbeat_timeout / 2) return out;
  for (const auto& p : previous_->participants) {
    if (p.replica_id == asking) continue;
    auto it = last_heartbeat_.find(p.replica_id);
    if (it == last_heartbeat_.end() || now - it->second > rules_.heartbeat_timeout)
      out.push_back(p.replica_id);  // participants are sorted by replica_id
  }
  return out;
}

std::optional<Quorum> QuorumState::poll(Clock::time_point now, std::string* why_not) {
  auto fail = [&](std::string why) -> std::optional<Quorum> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  observe(now);
  std::vector<std::string> live = healthy(now);
  auto is_live = [&](const std::string& id) {
    return std::binary_search(live.begin(), live.end(), id);
  };
  // a request of another job takes over once the served job is over.
  auto served_live = [&] {  // the served job's groups that may still be alive
    std::vector<std::string> out;
    if (previous_) {
      for (const auto& p : previous_->participants) {
        auto it = pending_.find(p.replica_id);
        bool moved = it != pending_.end() && it->second.job != *job_;
        if (is_live(p.replica_id) && !moved) out.push_back(p.replica_id);
      }
    } else {  // no quorum yet: its live requesters
      for (const auto& [id, m] : pending_)
        if (m.job == *job_ && is_live(id)) out.push_back(id);
    }
    return out;
  };
  bool other_job_waits = false;
  for (const auto& [id, m] : pending_) {
    if (job_ && m.job == *job_) continue;
    if (job_ && !served_live().empty()) {
      other_job_waits = true;
      break;
    }
    if (previous_) id_floor_ = std::max(id_floor_, previous_->quorum_id);
    previous_.reset();
    job_ = m.job;
    for (auto it = pending_.begin(); it != pending_.end();)
      it = it->second.job == *job_ ? std::next(it) : pending_.erase(it);
    break;
  }
  std::vector<const QuorumMember*> candidates;  // Q-1 (pending_ is ordered by replica_id)
  for (const auto& [id, m] : pending_) {
    if (is_live(id) && m.job == *job_) candidates.push_back(&m);
  }
  if (candidates.empty()) {
    if (other_job_waits) {
      std::string live_members;
      for (const auto& id : served_live()) live_members += " " + id;
      return fail(fmt::format(
          "a new job's groups wait (Q-10): the job served still has live groups:{}", live_members));
    }
    return fail("no healthy group has asked");
  }
  auto is_candidate = [&](const std::string& id) {
    return std::any_of(candidates.begin(), candidates.end(),
                       [&](auto* c) { return c->replica_id == id; });
  };

  std::string reason;
  if (previous_ && std::all_of(previous_->participants.begin(), previous_->participants.end(),
                               [&](const QuorumMember& p) { return is_candidate(p.replica_id); })) {
    reason = "fast path";
  } else {
    auto n = static_cast<int64_t>(candidates.size());
    if (recovering_until_ && now < *recovering_until_) {
      return fail(fmt::format(
          "recovering (Q-7): waiting {} ms to hear from every live group",
          std::chrono::duration_cast<std::chrono::milliseconds>(*recovering_until_ - now).count()));
    }
    if (n < rules_.min_replicas) {
      return fail(fmt::format("{} candidate(s), min_replicas is {}", n, rules_.min_replicas));
    }
    if (2 * candidates.size() <= live.size()) {
      return fail(fmt::format("{} candidate(s) of {} healthy: not more than half", n, live.size()));
    }
    bool all_joined = std::all_of(live.begin(), live.end(), is_candidate);
    bool timed_out = first_pending_ && now - *first_pending_ >= rules_.join_timeout;
    if (!all_joined && !timed_out) {
      return fail(
          fmt::format("waiting for {} healthy group(s) to join", live.size() - candidates.size()));
    }
    reason = all_joined ? "all healthy joined" : "join timeout";
  }

  Quorum q;
  q.reason = reason;
  bool failed_commit = false;
  for (const auto* c : candidates) {
    q.participants.push_back(*c);
    q.max_step = std::max(q.max_step, c->step);
    failed_commit = failed_commit || c->commit_failed;
  }
  if (previous_ && q.max_step < previous_->max_step) {
    return fail(
        fmt::format("no candidate holds step {} (the last quorum's max_step; theirs is at "
                    "most {}): waiting for a group that does (Q-8)",
                    previous_->max_step, q.max_step));
  }
  //
  bool same_members =
      previous_ && previous_->participants.size() == q.participants.size() &&
      std::equal(q.participants.begin(), q.participants.end(), previous_->participants.begin(),
                 [](const QuorumMember& a, const QuorumMember& b) {
                   return a.replica_id == b.replica_id;
                 });
  int64_t prev_id = previous_ ? previous_->quorum_id : id_floor_;
  int64_t seen = prev_id;  // after a restart, above every id the participants were given
  for (const auto* c : candidates) seen = std::max(seen, c->last_quorum_id);
  q.quorum_id = (same_members && !failed_commit && seen == prev_id) ? prev_id : seen + 1;

  for (const auto* c : candidates) pending_.erase(c->replica_id);
  first_pending_.reset();
  if (!pending_.empty()) first_pending_ = now;  // stale requesters (unhealthy) stay pending
  previous_ = q;
  return q;
}

}  // namespace monarch::ft
