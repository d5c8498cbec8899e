#include "monarch/ft/lighthouse.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <random>

#include "monarch/actor/errors.hpp"
#include "monarch/actor/proc.hpp"
#include "monarch/config/config.hpp"
#include "monarch/ft/controller.hpp"

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
  r.recovery_wait = o.recovery_wait;
  return r;
}

uint64_t random_nonzero() {
  std::random_device rd;
  uint64_t e = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return e == 0 ? 1 : e;
}

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A heartbeat reply said kill_replica() doomed this group: end its process as a crash would.
[[noreturn]] void die_on_request(const std::string& replica_id) {
  spdlog::warn("manager {}: the lighthouse asked this group to die: SIGKILL to pid {}", replica_id,
               ::getpid());
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
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

Lighthouse::Lighthouse(LighthouseOptions options)
    : state_(rules_from(options)), epoch_(random_nonzero()) {}

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

HeartbeatReply Lighthouse::heartbeat(std::string replica_id, uint64_t incarnation) {
  auto now = Clock::now();
  HeartbeatReply r{.epoch = epoch_, .kill = false};
  if (const auto& prev = state_.previous()) r.quorum_id = prev->quorum_id;
  r.silent = state_.silent(now, replica_id);  // Q-9, before this beat refreshes the view
  state_.heartbeat(replica_id, now);
  Doomed* doomed = find_doomed(replica_id, incarnation);
  if (doomed == nullptr) {
    incarnation_[replica_id] = incarnation;  // a doomed one that still beats is not the current
    return r;
  }
  r.kill = true;
  if (!doomed->told) {
    doomed->told = true;
    spdlog::warn("lighthouse: told {} to kill itself (kill_replica)", replica_id);
  }
  return r;
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
  last_step_[id] = member.step;
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

LighthouseStatus Lighthouse::status() const {
  LighthouseStatus s;
  auto now = Clock::now();
  s.epoch = epoch_;
  s.heartbeat_timeout_ms = state_.rules().heartbeat_timeout.count();
  const auto& prev = state_.previous();
  if (prev) {
    s.quorum_id = prev->quorum_id;
    s.max_step = prev->max_step;
    for (const auto& p : prev->participants) s.members.push_back(p.replica_id);
  }
  for (const auto& [id, m] : state_.pending_members()) s.pending.push_back(id);
  for (const auto& [id, t] : state_.heartbeats()) {
    ReplicaStatus r;
    r.replica_id = id;
    if (auto it = last_step_.find(id); it != last_step_.end()) r.step = it->second;
    r.heartbeat_age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
    r.healthy = now - t <= state_.rules().heartbeat_timeout;
    r.pending = state_.pending_members().count(id) > 0;
    r.in_quorum = std::find(s.members.begin(), s.members.end(), id) != s.members.end();
    s.replicas.push_back(std::move(r));
  }
  s.changes.assign(changes_.begin(), changes_.end());
  if (state_.pending() > 0) {
    QuorumState probe = state_;  // poll() consumes requests: ask a copy why none formed
    std::string why;
    if (!probe.poll(now, &why)) s.waiting_for = why;
  }
  return s;
}

Lighthouse::Doomed* Lighthouse::find_doomed(const std::string& replica_id, uint64_t incarnation) {
  auto it = std::find_if(doomed_.begin(), doomed_.end(), [&](const Doomed& d) {
    return d.replica_id == replica_id && d.incarnation == incarnation;
  });
  return it == doomed_.end() ? nullptr : &*it;
}

bool Lighthouse::kill_replica(std::string replica_id) {
  auto current = incarnation_.find(replica_id);
  if (current == incarnation_.end()) return false;
  if (find_doomed(replica_id, current->second) != nullptr) return true;  // the same kill
  doomed_.push_back(Doomed{.replica_id = replica_id, .incarnation = current->second});
  while (doomed_.size() > kMaxDoomed) doomed_.pop_front();
  return true;
}

void Lighthouse::try_form() {
  if (state_.pending() == 0) return;
  auto q = state_.poll(Clock::now());
  // Requests the state dropped (Q-10: of a job that is over) get their answer now.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    bool answered_now = q && q->rank_of(it->first) >= 0;
    if (answered_now || state_.pending_members().count(it->first) > 0) {
      ++it;
      continue;
    }
    it->second.set_error(
        QuorumError("quorum request of " + it->first +
                    " dropped: its job is over and the lighthouse serves another"));
    it = waiting_.erase(it);
  }
  if (!q) return;
  if (changes_.empty() || changes_.back().quorum_id != q->quorum_id) {
    QuorumChange c{.quorum_id = q->quorum_id, .unix_ms = unix_ms_now(), .max_step = q->max_step};
    for (const auto& p : q->participants) {
      c.participants.push_back(p.replica_id);
      if (p.step < q->max_step) c.healing.push_back(p.replica_id);
    }
    c.reason = q->reason;
    changes_.push_back(std::move(c));
    while (changes_.size() > kMaxChanges) changes_.pop_front();
  }
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
                 std::chrono::milliseconds heartbeat_interval, std::string job)
    : lighthouse_(std::move(lighthouse)),
      replica_id_(std::move(replica_id)),
      job_(std::move(job)),
      world_size_(world_size),
      heartbeat_interval_(heartbeat_interval.count() > 0
                              ? heartbeat_interval
                              : config::global().duration("ft.heartbeat_interval")),
      incarnation_(random_nonzero()) {
  if (world_size_ < 1)
    throw UsageError(
        fmt::format("Manager {}: world_size must be >= 1, got {}", replica_id_, world_size_));
  if (replica_id_.empty()) throw UsageError("Manager: empty replica_id");
}

void Manager::init() {
  heartbeat_.start(heartbeat_interval_, [this] { beat(); });
}

void Manager::cleanup(const std::optional<ActorSupervisionEvent>&) {
  heartbeat_.stop();
  // A request still in flight ends here: the group is stopping, so its ranks get this error at
  // once, and the request's later failure (this proc's shutdown returns it as undeliverable) is
  // not reported as a lost lighthouse.
  if (auto in = inflight_) {
    std::lock_guard lock(in->mu);
    if (!in->done) {
      in->done = true;
      auto stopped = std::make_exception_ptr(
          QuorumError("manager " + replica_id_ + " stopped with its quorum request in flight"));
      for (auto& [rank, ask] : in->asks) ask.reply.set_error(stopped);
    }
  }
}

ActorRef<Lighthouse> Manager::lighthouse() const {
  std::lock_guard lock(lh_mu_);
  return lighthouse_;
}

// The heartbeat thread. A frozen lighthouse leaves the reply pending (the next beats queue behind
// it, which is what a thawed lighthouse should see); a restarted one answers with a new epoch, or
// (a new actor uid) fails the beat with DeliveryFailure: then look it up again by address and the
// actor's name, and re-send the pending quorum request.
void Manager::beat() {
  auto lh = lighthouse();
  auto f = lh.call(&Lighthouse::heartbeat, replica_id_, incarnation_);
  auto wait = std::max(heartbeat_interval_ * 5, std::chrono::milliseconds(500));
  if (!f.wait_for(wait)) {
    // Late, not lost: a kill in this reply still counts when it comes (the lighthouse repeats it
    // in every reply to this incarnation, but a lighthouse that is always this slow would not
    // deliver it otherwise). The rest of a late reply is stale.
    (void)std::move(f).then([id = replica_id_](const HeartbeatReply& r) {
      if (r.kill) die_on_request(id);
    });
    return;
  }
  bool moved = false, back = false;
  try {
    HeartbeatReply r = f.get(wait);
    if (r.kill) die_on_request(replica_id_);
    moved = epoch_ != 0 && r.epoch != epoch_;
    epoch_ = r.epoch;
    {
      std::lock_guard lock(health_->mu);
      health_->quorum_id = r.quorum_id;
      health_->silent = std::move(r.silent);
      health_->at = Clock::now();
    }
    if (unreachable_->exchange(false)) {
      spdlog::info("manager {}: the lighthouse answers again", replica_id_);
      back = true;
    }
  } catch (const DeliveryFailure& e) {
    const auto& id = lh.id();
    // Once per outage at warning level (a run cut short stops its lighthouse before its managers).
    spdlog::log(unreachable_->exchange(true) ? spdlog::level::debug : spdlog::level::warn,
                "manager {}: heartbeat to the lighthouse failed ({}); looking it up again",
                replica_id_, e.what());
    try {
      auto fresh = proc().lookup_remote<Lighthouse>(id.proc, id.name).get(wait);
      std::lock_guard lock(lh_mu_);
      moved = !(fresh.id() == lighthouse_.id());
      lighthouse_ = std::move(fresh);
    } catch (const std::exception& e2) {
      spdlog::debug("manager {}: lighthouse {} not found yet: {}", replica_id_, id.proc, e2.what());
    }
  } catch (const std::exception& e) {
    spdlog::debug("manager {}: heartbeat: {}", replica_id_, e.what());
  }
  if (moved) {
    spdlog::warn("manager {}: the lighthouse restarted; re-sending the pending quorum request",
                 replica_id_);
    self<Manager>().send(&Manager::resend);
  } else if (back) {
    // The same lighthouse, thawed or reachable again: a request the channel gave up on while it
    // was away is lost, and the ranks would wait out ft.step_timeout for it. Re-sending one that
    // is still pending there only replaces it (the latest send answers).
    self<Manager>().send(&Manager::resend);
  }
}

void Manager::undeliverable(const DeliveryFailure& failure) {
  spdlog::warn("manager {}: {}", replica_id_, failure.what());
}

void Manager::resend() {
  if (!inflight_) return;
  {
    std::lock_guard lock(inflight_->mu);
    if (inflight_->done) return;
  }
  spdlog::info("manager {}: re-sending the pending quorum request", replica_id_);
  send_inflight();
}

// Sends the group's request (again): only the latest send may answer the ranks. A DeliveryFailure
// leaves them waiting (the heartbeat thread re-sends once the lighthouse is back, or the ranks'
// own deadline fails their wait and they ask again); a QuorumError reaches them.
void Manager::send_inflight() {
  auto in = inflight_;
  uint64_t seq;
  QuorumMember m;
  {
    std::lock_guard lock(in->mu);
    if (in->done) return;
    seq = ++in->seq;
    m = in->member;
  }
  const int64_t step = m.step;
  auto lh = lighthouse();
  lh.call(&Lighthouse::quorum, std::move(m))
      .on_complete([in, seq, last = last_quorum_id_, down = unreachable_,
                    id = replica_id_](monarch::detail::State<Quorum>& s) {
        std::lock_guard lock(in->mu);
        if (in->done || in->seq != seq) return;  // superseded by a re-send
        if (s.error) {
          try {
            std::rethrow_exception(s.error);
          } catch (const DeliveryFailure& e) {
            spdlog::log(down->exchange(true) ? spdlog::level::debug : spdlog::level::warn,
                        "manager {}: quorum request not delivered ({}); waiting for a re-send", id,
                        e.what());
            return;
          } catch (...) {
          }
        }
        in->done = true;
        if (!s.error) last->store(s.value->quorum_id);
        for (auto& [r, a] : in->asks) {
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
  fault_point_quorum_request(lh, replica_id_, step);  // chaos: killed with the request pending
}

std::string Manager::claim(int64_t rank, uint64_t client) {
  check_rank(rank, "claim");
  auto [it, fresh] = claims_.emplace(rank, client);
  if (fresh || it->second == client) return {};
  return fmt::format(
      "{} rank {} is already used by another trainer of this group: two trainers were given "
      "the same rank; give each trainer of a group its own rank, 0..{} "
      "(ReplicaClientOptions::rank)",
      replica_id_, rank, world_size_ - 1);
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
  m.job = job_;
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
  m.last_quorum_id = last_quorum_id_->load();
  auto in = std::make_shared<Inflight>();
  in->member = std::move(m);
  in->asks = std::move(asks_);
  asks_.clear();
  inflight_ = std::move(in);
  send_inflight();
  return f;
}

std::string Manager::quorum_health(int64_t quorum_id) const {
  std::lock_guard lock(health_->mu);
  if (health_->silent.empty() || health_->quorum_id != quorum_id) return {};
  std::string who;
  for (const auto& id : health_->silent) who += (who.empty() ? "" : ", ") + id;
  auto age = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - health_->at);
  return fmt::format(
      "the lighthouse has not heard from {} of quorum {} within its heartbeat "
      "timeout (Q-9; reply {} ms old)",
      who, quorum_id, age.count());
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

namespace monarch::ft {

ActorRef<Lighthouse> connect_lighthouse(Proc& proc, const std::string& addr,
                                        std::chrono::milliseconds timeout) {
  if (proc.address().empty())
    throw UsageError("connect_lighthouse(" + addr +
                     "): this Proc does not listen (set ProcOptions::listen)");
  try {
    // The lighthouse may start after the job (the link retries), so this waits; but a wait with
    // nothing to show looks like a hang. Once a connection attempt has failed, say so, and why,
    // while waiting on.
    auto f = proc.lookup_remote<Lighthouse>(addr, kLighthouseName);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    constexpr auto kSlice = std::chrono::milliseconds(500);
    bool warned = false;
    while (!f.wait_for(kSlice) && std::chrono::steady_clock::now() < deadline) {
      if (warned) continue;
      const std::string why = proc.link_error(addr);
      if (why.empty()) continue;
      warned = true;
      spdlog::warn(
          "no lighthouse at {} yet ({}): waiting up to {} ms for one (is `monarch lighthouse "
          "--listen {}` running?)",
          addr, why, timeout.count(), addr);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    return f.get(std::max(left, std::chrono::milliseconds(1)));
  } catch (const TimeoutError& e) {
    // Why the link got nowhere ("Connection refused") says more than the wait that ran out.
    const std::string why = proc.link_error(addr);
    throw TimeoutError(fmt::format("no lighthouse answered at {} within {} ms{}", addr,
                                   timeout.count(),
                                   why.empty() ? "" : " (last connection error: " + why + ")"));
  } catch (const Error& e) {
    // A malformed address or a missing secret fails at once: no "within N ms" here. Keeps the code
    // (ChannelError for those two, DeliveryFailure when the proc serves no lighthouse).
    throw Error(e.code(), fmt::format("cannot reach the lighthouse at {}: {}", addr, e.what()),
                e.origin());
  }
}

}  // namespace monarch::ft
