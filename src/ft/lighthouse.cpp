#include "monarch/ft/lighthouse.hpp"

#include <fmt/format.h>

#include "monarch/config/config.hpp"

namespace monarch::ft {
namespace {

QuorumRules rules_from(const LighthouseOptions& o) {
  auto& cfg = config::global();
  QuorumRules r;
  r.min_replicas = o.min_replicas > 0 ? o.min_replicas : cfg.integer("ft.min_replicas");
  r.join_timeout =
      o.join_timeout.count() > 0 ? o.join_timeout : cfg.duration("ft.quorum_join_timeout");
  r.heartbeat_timeout =
      o.heartbeat_timeout.count() > 0 ? o.heartbeat_timeout : cfg.duration("ft.heartbeat_timeout");
  return r;
}

}  // namespace

void detail::Periodic::start(std::chrono::milliseconds period, std::function<void()> fn) {
  thread_ = std::thread([this, period, fn = std::move(fn)] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      lock.unlock();
      fn();
      lock.lock();
      cv_.wait_for(lock, period, [&] { return stopping_; });
    }
  });
}

void detail::Periodic::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Lighthouse::Lighthouse(LighthouseOptions options) : state_(rules_from(options)) {}

void Lighthouse::init() {
  auto period = std::max(std::chrono::milliseconds(10), state_.rules().join_timeout / 5);
  // call(), not send(): a tick that reaches a stopped lighthouse just fails its (dropped) future.
  ticker_.start(period, [self = self<Lighthouse>()] { (void)self.call(&Lighthouse::tick); });
}

void Lighthouse::cleanup(const std::optional<ActorSupervisionEvent>&) {
  ticker_.stop();
  for (auto& [id, p] : waiting_)
    p.set_error(QuorumError("lighthouse stopped before a quorum formed for " + id));
  waiting_.clear();
}

void Lighthouse::heartbeat(std::string replica_id) {
  state_.heartbeat(replica_id, Clock::now());
}

Future<Quorum> Lighthouse::quorum(QuorumMember member) {
  std::string id = member.replica_id;
  if (id.empty()) throw UsageError("Lighthouse::quorum: empty replica_id");
  if (auto it = waiting_.find(id); it != waiting_.end()) {
    it->second.set_error(QuorumError("quorum request of " + id + " replaced by a newer one"));
    waiting_.erase(it);
  }
  Promise<Quorum> p;
  auto f = p.get_future();
  waiting_.emplace(id, std::move(p));
  state_.request(std::move(member), Clock::now());
  try_form();
  return f;
}

void Lighthouse::evict(std::string replica_id, std::string reason) {
  state_.evict(replica_id);
  if (auto it = waiting_.find(replica_id); it != waiting_.end()) {
    it->second.set_error(
        QuorumError(fmt::format("{} evicted from the quorum: {}", replica_id, reason)));
    waiting_.erase(it);
  }
  try_form();
}

Quorum Lighthouse::last_quorum() const {
  return state_.previous().value_or(Quorum{});
}

std::vector<std::string> Lighthouse::healthy() const {
  return state_.healthy(Clock::now());
}

void Lighthouse::tick() {
  try_form();
}

void Lighthouse::try_form() {
  if (state_.pending() == 0) return;
  auto q = state_.poll(Clock::now());
  if (!q) return;
  for (const auto& m : q->participants) {
    auto it = waiting_.find(m.replica_id);
    if (it == waiting_.end()) continue;
    it->second.set_value(*q);
    waiting_.erase(it);
  }
}

QuorumResult result_for(const Quorum& q, const std::string& replica_id, int64_t rank) {
  int64_t me = q.rank_of(replica_id);
  if (me < 0) throw UsageError(replica_id + " is not a participant of " + q.to_string());
  QuorumResult r;
  r.quorum_id = q.quorum_id;
  r.store_prefix = fmt::format("quorum/{}/", q.quorum_id);
  r.replica_rank = me;
  r.replica_world_size = static_cast<int64_t>(q.participants.size());
  // Groups may differ in size: ranks are numbered group after group, in participant order.
  for (int64_t i = 0; i < r.replica_world_size; ++i) {
    int64_t n = q.participants[static_cast<size_t>(i)].world_size;
    if (i < me) r.global_rank += n;
    r.global_world_size += n;
  }
  r.global_rank += rank;
  r.max_step = q.max_step;
  r.reason = q.reason;
  for (const auto& p : q.participants) {
    r.participants.push_back(p.replica_id);
    if (p.step == q.max_step) {
      ++r.up_to_date_groups;
    } else {
      r.healing.push_back(p.replica_id);
    }
  }
  if (auto donor = q.donor_for(replica_id)) {
    r.heal = true;
    r.donor_id = donor->replica_id;
    if (static_cast<size_t>(rank) < donor->state.size())
      r.donor_state = donor->state[static_cast<size_t>(rank)];
  }
  return r;
}

Manager::Manager(ActorRef<Lighthouse> lighthouse, std::string replica_id, int64_t world_size,
                 std::chrono::milliseconds heartbeat_interval)
    : lighthouse_(std::move(lighthouse)),
      replica_id_(std::move(replica_id)),
      world_size_(world_size),
      heartbeat_interval_(heartbeat_interval.count() > 0
                              ? heartbeat_interval
                              : config::global().duration("ft.heartbeat_interval")) {
  if (world_size_ < 1)
    throw UsageError(
        fmt::format("Manager {}: world_size must be >= 1, got {}", replica_id_, world_size_));
  if (replica_id_.empty()) throw UsageError("Manager: empty replica_id");
}

void Manager::init() {
  heartbeat_.start(heartbeat_interval_, [lh = lighthouse_, id = replica_id_] {
    (void)lh.call(&Lighthouse::heartbeat, id);
  });
}

void Manager::cleanup(const std::optional<ActorSupervisionEvent>&) {
  heartbeat_.stop();
}

void Manager::check_rank(int64_t rank, const char* what) const {
  if (rank < 0 || rank >= world_size_) {
    throw UsageError(fmt::format("Manager {}::{}: rank {} is outside [0, {})", replica_id_, what,
                                 rank, world_size_));
  }
}

Future<QuorumResult> Manager::quorum(int64_t rank, int64_t step, bool commit_failed,
                                     std::optional<rdma::RdmaHandle> state) {
  check_rank(rank, "quorum");
  if (auto it = asks_.find(rank); it != asks_.end()) {
    it->second.reply.set_error(
        QuorumError(fmt::format("{} rank {}: quorum request replaced", replica_id_, rank)));
    asks_.erase(it);
  }
  QuorumAsk ask{step, commit_failed, std::move(state), Promise<QuorumResult>()};
  auto f = ask.reply.get_future();
  asks_.emplace(rank, std::move(ask));
  if (static_cast<int64_t>(asks_.size()) < world_size_) return f;

  // Every rank asked: one request for the group. Its step is the smallest of its ranks' (a rank
  // behind the others makes the whole group heal), and one failed commit counts for the group.
  QuorumMember m;
  m.replica_id = replica_id_;
  m.world_size = world_size_;
  m.step = asks_.begin()->second.step;
  int64_t max_step = m.step;
  bool complete_state = true;
  for (auto& [r, a] : asks_) {
    m.step = std::min(m.step, a.step);
    max_step = std::max(max_step, a.step);
    m.commit_failed = m.commit_failed || a.commit_failed;
    complete_state = complete_state && a.state.has_value();
  }
  if (complete_state && max_step == m.step) {  // a donor only when every rank is at the same step
    for (auto& [r, a] : asks_) m.state.push_back(*a.state);
  }
  auto asks = std::make_shared<std::map<int64_t, QuorumAsk>>(std::move(asks_));
  asks_.clear();
  lighthouse_.call(&Lighthouse::quorum, std::move(m))
      .on_complete([asks, id = replica_id_](monarch::detail::State<Quorum>& s) {
        for (auto& [r, a] : *asks) {
          if (s.error) {
            a.reply.set_error(s.error);
            continue;
          }
          try {
            a.reply.set_value(result_for(*s.value, id, r));
          } catch (...) {
            a.reply.set_error(std::current_exception());
          }
        }
      });
  return f;
}

Future<bool> Manager::should_commit(int64_t rank, int64_t step, bool ok) {
  check_rank(rank, "should_commit");
  if (auto it = votes_.find(rank); it != votes_.end()) {
    it->second.reply.set_error(
        QuorumError(fmt::format("{} rank {}: commit vote replaced", replica_id_, rank)));
    votes_.erase(it);
  }
  Vote v{step, ok, Promise<bool>()};
  auto f = v.reply.get_future();
  votes_.emplace(rank, std::move(v));
  if (static_cast<int64_t>(votes_.size()) < world_size_) return f;
  bool all_ok = true;
  for (auto& [r, vote] : votes_) all_ok = all_ok && vote.ok && vote.step == step;
  for (auto& [r, vote] : votes_) vote.reply.set_value(all_ok);
  votes_.clear();
  return f;
}

}  // namespace monarch::ft
