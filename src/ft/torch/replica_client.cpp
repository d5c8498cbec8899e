#include "monarch/ft/torch/replica_client.hpp"

#include <algorithm>
#include <optional>
#include <random>
#include <thread>

#include "monarch/config/config.hpp"
#include "monarch/rdma/rdma.hpp"

namespace monarch::ft {
namespace {
using Clock = std::chrono::steady_clock;
}

struct ReplicaClient::Impl {
  ActorRef<Manager> manager;
  FlatState& state;
  ReplicaClientOptions o;
  std::optional<rdma::RdmaBuffer> own;  // the exposure of a heap FlatState (cma route)
  rdma::RdmaBuffer& exposed;            // what healers read: the state's own shm buffer, else `own`
  AllreduceGroup group;
  int64_t qid = -1;  // the quorum the gloo group is configured for (-1: none / aborted)
  bool commit_failed = false;
  StepPlan plan;
  int64_t step0 = -1;  // the step start_quorum() planned
  bool committed = false;
  bool must_vote = false;  // planned a step: the group's other ranks wait for this rank's vote
  const bool async_quorum;
  const int64_t quorum_every;
  // Async quorum: the answer said to heal, but the caller read its data position (and trained)
  // before it came: this step contributes zeros and does not commit; the next one heals.
  bool deferred_heal = false;
  std::optional<Future<QuorumResult>> pending;  // async quorum: the answer for this step
  std::string error;
  std::string fatal;  // a program error (a UsageError of allreduce or start_quorum): every report
                      // carries it, and start_quorum() throws it again
  const uint64_t client_id = std::random_device{}() * 0x100000000ULL + std::random_device{}();
  bool claimed = false;             // the Manager knows this client uses o.rank (claim_rank)
  std::vector<StepReport> reports;  // plain commits not sent yet (report())
  // A healer's route to its donor, set up on a helper thread while something else runs (see
  // apply()); joined before the heal. Last member: joined before the others go.
  double route_setup_ms = 0;  // written by route_setup, read after joining it
  std::optional<std::jthread> route_setup;

  Impl(ActorRef<Manager> m, FlatState& s, ReplicaClientOptions opts)
      : manager(std::move(m)),
        state(s),
        o(std::move(opts)),
        exposed(s.rdma_buffer() ? *s.rdma_buffer()
                                : own.emplace(s.bytes(), o.replica_id + ".r" +
                                                             std::to_string(o.rank) + ".state")),
        async_quorum(o.async_quorum < 0 ? config::global().flag("ft.async_quorum")
                                        : o.async_quorum > 0),
        quorum_every(std::max<int64_t>(
            1, o.quorum_every > 0 ? o.quorum_every : config::global().integer("ft.quorum_every"))) {
  }

  // Once per client, at its first start_quorum(): tells the Manager which client uses this rank,
  // so that two trainers given the same rank are named at once (they would replace each other's
  // quorum requests forever). A Manager that does not answer is asked again next step.
  void claim_rank() {
    std::string why;
    try {
      why = manager.call(&Manager::claim, o.rank, client_id).get(o.step_timeout);
    } catch (const std::exception&) {
      return;  // the quorum request that follows fails too, and says why
    }
    if (!why.empty()) {
      fatal = "start_quorum of " + where() + ": " + why;
      error = fatal;
      throw UsageError(fatal);
    }
    claimed = true;
  }

  std::string where() const {
    return o.replica_id + " rank " + std::to_string(o.rank) + " step " +
           std::to_string(state.step() + 1) + " (quorum " + std::to_string(plan.quorum_id) + ")";
  }
  void fail(const std::string& why) {
    error = why;
    commit_failed = true;
    group.abort();  // peers blocked on this group fail now, not at their timeout
    qid = -1;
  }
  Future<QuorumResult> ask_async() {
    return manager.call(&Manager::quorum, o.rank, state.step(), commit_failed,
                        std::optional<rdma::RdmaHandle>(exposed.handle()));
  }
  // Votes no at once, so the group's other ranks do not wait out step_timeout for this rank.
  void vote_no() {
    must_vote = false;
    if (o.ranks == 1) return;  // a group of one: nobody waits for the vote
    try {
      (void)manager.call(&Manager::should_commit, o.rank, step0, false).get(o.step_timeout);
    } catch (const std::exception&) {
      // the Manager is gone too: the group's MeshFailure follows
    }
  }
  // The quorum's answer, waited for up to step_timeout. A timeout says what was waited for (the
  // Future's own text names only the Manager's actor id).
  QuorumResult await_quorum(Future<QuorumResult>& f) {
    try {
      return f.get(o.step_timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError("no quorum within ft.step_timeout (" +
                         std::to_string(o.step_timeout.count()) + " ms): this group's Manager (" +
                         manager.id().to_string() +
                         ") has no answer from the lighthouse (is it running? not frozen?)");
    }
  }
  void heal(const QuorumResult& q);
  void apply(const QuorumResult& q, bool may_heal = true);
  void resolve();
};

void ReplicaClient::Impl::heal(const QuorumResult& q) {
  auto bad = [&](const std::string& what) {
    return std::runtime_error("heal of " + o.replica_id + " rank " + std::to_string(o.rank) +
                              " from " + q.donor_id + " (quorum " + std::to_string(q.quorum_id) +
                              "): " + what);
  };
  if (!q.donor_state) throw bad("the donor offered no state");
  const rdma::RdmaHandle& h = *q.donor_state;
  if (h.length != state.bytes().size()) {
    throw bad("the donor's state is " + std::to_string(h.length) + " B, ours " +
              std::to_string(state.bytes().size()) + " B");
  }
  // Straight into our own state (no staging copy; with FlatStateOptions::shared_memory on both
  // sides, the shm route: one memcpy from a mapping of the donor). A heal that fails part-way
  // leaves a mixed state: it is marked step -1, so that it heals again before it trains or
  // donates.
  std::span<std::byte> buf = state.bytes();
  auto t = Clock::now();
  Clock::duration injected{0};  // in the fault point below
  rdma::TransferOptions topts{o.step_timeout};
  // One read of the whole state (same host: one memcpy; the remote routes split it into their
  // own chunks and streams). With fault point "heal.after_first_chunk" armed: the first chunk
  // alone (the whole state if it is smaller), the point, then the rest.
  const bool point = fault_armed(kFaultHealAfterFirstChunk);
  const uint64_t chunk =
      point ? std::min<uint64_t>(std::max<uint64_t>(o.heal_chunk_bytes, 64), h.length) : h.length;
  try {
    h.read_into(buf.first(chunk), 0, topts).get(o.step_timeout);
    if (point) {
      // Test machinery, not heal work: a blocking call to the controller, which kills the donor
      // (1-3 ms, most of those heals' time in ft_train): kept out of heal_ms.
      auto f0 = Clock::now();
      fault_point_kill_donor(o.replica_id, q.donor_id);
      injected = Clock::now() - f0;
    }
    if (chunk < h.length) h.read_into(buf.subspan(chunk), chunk, topts).get(o.step_timeout);
    state.check_header();
  } catch (...) {
    state.set_step(-1);
    throw;
  }
  if (state.step() != q.max_step) {
    throw bad("the state read is at step " + std::to_string(state.step()) +
              ", the quorum's max_step is " + std::to_string(q.max_step));
  }
  exposed.sync();
  plan.healed = true;
  plan.donor = q.donor_id;
  plan.heal_bytes = h.length;
  plan.heal_ms = std::chrono::duration<double, std::milli>(Clock::now() - t - injected).count();
}

ReplicaClient::ReplicaClient(ActorRef<Manager> manager, FlatState& state,
                             ReplicaClientOptions options) {
  if (options.replica_id.empty()) throw UsageError("ReplicaClient: empty replica id");
  if (options.ranks < 1 || options.rank < 0 || options.rank >= options.ranks) {
    throw UsageError("ReplicaClient " + options.replica_id + ": rank " +
                     std::to_string(options.rank) + " is not in [0, " +
                     std::to_string(options.ranks) + ")");
  }
  auto& cfg = config::global();
  if (options.collective_timeout.count() <= 0)
    options.collective_timeout = cfg.duration("ft.collective_timeout");
  if (options.step_timeout.count() <= 0) options.step_timeout = cfg.duration("ft.step_timeout");
  if (options.silent_probe.count() == 0)
    options.silent_probe =
        std::max(std::chrono::milliseconds(1), cfg.duration("ft.heartbeat_interval") / 2);
  impl_ = std::make_unique<Impl>(std::move(manager), state, std::move(options));
}

ReplicaClient::~ReplicaClient() = default;

rdma::RdmaHandle ReplicaClient::state_handle() const {
  return impl_->exposed.handle();
}

const std::string& ReplicaClient::last_error() const noexcept {
  return impl_->error;
}

// The quorum's answer for this step: what the synchronous path does at once and the async path
// when the step's allreduce (or vote) needs it. Reconfigures the gloo group on a new quorum id,
// heals when behind and fills in the plan. A failure throws; the caller fails the step.
void ReplicaClient::Impl::apply(const QuorumResult& q, bool may_heal) {
  const bool heal_now = q.heal && may_heal;
  deferred_heal = q.heal && !may_heal;
  plan.quorum_id = q.quorum_id;
  plan.max_step = q.max_step;
  plan.participants = q.participants;
  plan.healing = q.healing;
  plan.step = false;
  plan.train = false;
  plan.slot = -1;
  plan.slots = 0;
  if (o.max_steps > 0 && q.max_step >= o.max_steps) {
    // The others finished and hold: catch up by healing only (they run no allreduce).
    if (heal_now) heal(q);
    commit_failed = false;
    return;
  }
  must_vote = true;
  // A healer sets its route to the donor up (same host: opens, maps and touches the donor's
  // shared memory, 0.3-3.5 ms cold) on a helper thread while something else runs, so that the
  // heal is only the copy: the new gloo group forming, or, for a deferred heal (async quorum),
  // the rest of this step, which contributes zeros. The mapping is cached per donor
  // incarnation; the heal's reads still check, read by read, that the donor lives and has not
  // dropped the state (a donor that dies meanwhile fails the heal, which is retried as before).
  // With nothing to overlap with, the heal's first read sets the route up, inside heal_ms.
  if (q.heal && q.donor_state && (deferred_heal || q.quorum_id != qid)) {
    route_setup.reset();  // one at a time: joins an earlier one (a superseded donor's)
    route_setup_ms = 0;
    route_setup.emplace([this, h = *q.donor_state] {
      auto t = Clock::now();
      try {
        (void)rdma::route_for(h);
      } catch (const std::exception&) {
        // the heal's first read meets the same failure and names it
      }
      route_setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    });
  }
  if (q.quorum_id != qid) {
    qid = -1;
    group.configure(o.store_host, o.store_port, o.store_namespace + "/" + q.store_prefix,
                    static_cast<int>(q.global_rank), static_cast<int>(q.global_world_size),
                    o.collective_timeout, AllreduceBackend::gloo, o.local_host);
    qid = q.quorum_id;
  } else if (!group.configured()) {
    throw std::runtime_error("the allreduce group of quorum " + std::to_string(qid) + " is closed");
  }
  // Heal after joining the group (see the header).
  if (heal_now) {
    if (route_setup) {
      route_setup.reset();  // joins: the route is set up (or failed; the heal tells)
      plan.heal_setup_ms = route_setup_ms;
    }
    heal(q);
  }
  step0 = state.step();
  // Up-to-date groups share the global batch; healers contribute zeros this step.
  plan.step = true;
  plan.slots = static_cast<int>(q.up_to_date_groups * o.ranks);
  if (!q.heal) {
    int64_t i = 0;
    for (const auto& p : q.participants) {
      if (std::find(q.healing.begin(), q.healing.end(), p) != q.healing.end()) continue;
      if (p == o.replica_id) plan.slot = static_cast<int>(i * o.ranks + o.rank);
      ++i;
    }
  }
  plan.train = plan.slot >= 0;
}

// Async quorum: the pending answer arrives; a plan that differs from the predicted one in what
// this rank's gradients were computed for (train, slot, slots) fails the step: the gradients
// are of another share of the batch. Throws (the caller fails the step).
void ReplicaClient::Impl::resolve() {
  if (!pending) return;
  auto f = std::move(*pending);
  pending.reset();
  const StepPlan predicted = plan;
  // No heal here: the caller's step already read the data position it will commit from.
  apply(await_quorum(f), /*may_heal=*/false);
  if (!plan.step) {
    throw std::runtime_error("the quorum (" + std::to_string(plan.quorum_id) +
                             ") has no step to run: every participant is at max_steps");
  }
  if (plan.train != predicted.train || plan.slot != predicted.slot ||
      plan.slots != predicted.slots) {
    if (!plan.train) return;  // a healer: contributes zeros, whatever it computed
    throw std::runtime_error("the quorum (" + std::to_string(plan.quorum_id) + ") assigned share " +
                             std::to_string(plan.slot) + " of " + std::to_string(plan.slots) +
                             ", the step computed share " + std::to_string(predicted.slot) +
                             " of " + std::to_string(predicted.slots) +
                             " (async quorum); the next step asks first");
  }
}

StepPlan ReplicaClient::start_quorum() {
  auto& m = *impl_;
  if (!m.fatal.empty()) throw UsageError(m.fatal);  // a program error: no step can succeed
  if (!m.claimed) m.claim_rank();
  // An answer nobody consumed (the caller skipped allreduce() and should_commit()) is dropped,
  // and this step asks and waits.
  const bool unconsumed = m.pending.has_value();
  m.pending.reset();
  // Intact: the last step committed in a quorum (its final plan, after any async answer) that had
  // nobody healing, and this rank's group is still the one of that quorum.
  const bool intact = m.committed && m.plan.step && m.plan.healing.empty() && !unconsumed &&
                      m.group.configured() && m.qid == m.plan.quorum_id &&
                      (m.o.max_steps <= 0 || m.state.step() < m.o.max_steps);
  const bool skip = intact && m.state.step() % m.quorum_every != 0;  // no request this step
  const bool predict = intact && (skip || m.async_quorum);
  const StepPlan last = m.plan;
  m.plan = StepPlan{};
  m.committed = false;
  m.error.clear();
  m.step0 = m.state.step();
  m.must_vote = false;  // the group's other ranks wait for this rank's vote once it planned
  m.deferred_heal = false;
  try {
    m.exposed.sync();  // the committed state (of the last commit or heal) is what healers read
    if (predict) {
      // The last quorum was intact and this rank committed in it: the fast path will most likely
      // answer the same plan. Train on it now; allreduce() waits for the answer and checks.
      if (!skip) m.pending.emplace(m.ask_async());
      m.plan.quorum_id = last.quorum_id;
      m.plan.max_step = m.state.step();
      m.plan.participants = last.participants;
      m.plan.step = true;
      m.plan.train = last.train;
      m.plan.slot = last.slot;
      m.plan.slots = last.slots;
      m.plan.predicted = true;
      m.must_vote = true;
      return m.plan;
    }
    auto answer = m.ask_async();
    m.apply(m.await_quorum(answer));
    return m.plan;
  } catch (const std::exception& e) {
    m.pending.reset();
    m.fail(std::string("start_quorum of ") + m.where() + ": " + e.what());
    if (m.must_vote) m.vote_no();
    throw std::runtime_error(m.error);
  }
}

void ReplicaClient::allreduce(std::span<float> data) {
  auto& m = *impl_;
  try {
    if (!m.plan.step) throw UsageError("allreduce without a planned step (start_quorum)");
    m.resolve();  // async quorum: the answer this step's gradients were computed for
    if (!m.plan.train) std::fill(data.begin(), data.end(), 0.0f);
    if (take_fault(kFaultAllreduceEnter))
      throw std::runtime_error("injected exception at fault point allreduce.enter");
    // a frozen member never closes its sockets; the lighthouse names it once its
    // heartbeats stop, and the Manager keeps what the last heartbeat reply said.
    AllreduceGroup::Watch watch;
    if (m.o.silent_probe.count() > 0) {
      watch.after = watch.every = m.o.silent_probe;
      watch.probe = [&m, qid = m.plan.quorum_id]() -> std::string {
        try {
          return m.manager.call(&Manager::quorum_health, qid).get(m.o.silent_probe * 4);
        } catch (const std::exception&) {
          return {};  // the Manager is busy or gone: its group's failure shows otherwise
        }
      };
    }
    m.group.allreduce_sum(data, watch.probe ? &watch : nullptr);
    const float inv = 1.0f / static_cast<float>(std::max(1, m.plan.slots));
    for (float& x : data) x *= inv;
  } catch (const UsageError& e) {
    m.fatal = std::string("allreduce of ") + m.where() + ": " + e.what();
    m.fail(m.fatal);
    throw;
  } catch (const std::exception& e) {
    m.fail(std::string("allreduce of ") + m.where() + ": " + e.what());
    throw;
  }
}

bool ReplicaClient::should_commit(bool ok) {
  auto& m = *impl_;
  if (m.step0 < 0) {  // (plan.step is no test: a failed step may have reset it)
    throw UsageError("should_commit of " + m.where() +
                     " before any start_quorum() (vote on the step start_quorum() planned)");
  }
  if (m.pending) {  // no allreduce this step (it failed before): the answer still sets the group
    try {
      m.resolve();
    } catch (const std::exception& e) {
      ok = false;
      m.fail(std::string("should_commit of ") + m.where() + ": " + e.what());
    }
  }
  m.must_vote = false;
  if (m.deferred_heal) ok = false;  // zeros were contributed; the state is not the quorum's
  bool commit = false;
  if (m.o.ranks == 1) {
    commit = ok;  // a group of one: its vote is its own
  } else {
    try {
      commit = m.manager.call(&Manager::should_commit, m.o.rank, m.step0, ok).get(m.o.step_timeout);
    } catch (const std::exception& e) {
      m.fail(std::string("should_commit of ") + m.where() + ": " + e.what());
      throw std::runtime_error(m.error);
    }
  }
  if (!commit && m.deferred_heal && m.error.empty()) {
    // Not a failure: the others commit; this group heals next step, in the same quorum.
    m.deferred_heal = false;
    m.error = "the quorum (" + std::to_string(m.plan.quorum_id) + ") said to heal after " +
              m.where() + " was planned (async quorum): healing next step";
  } else if (!commit) {
    std::string why = m.error.empty() ? (ok ? "another rank of the group voted not to commit"
                                            : "this rank voted not to commit")
                                      : m.error;
    m.fail(why);
  } else {
    m.commit_failed = false;
    m.committed = true;
  }
  return commit;
}

void ReplicaClient::hold(const std::atomic<bool>* stop) {
  auto& m = *impl_;
  constexpr auto kSlice = std::chrono::milliseconds(50);  // also the pacing of the hold loop
  auto stopped = [stop] { return stop != nullptr && stop->load(); };
  try {
    m.exposed.sync();
    auto answer = m.ask_async();
    // A stopping job's quorum may never form (its groups stop one by one): the caller's stop
    // flag, not step_timeout, ends the wait then.
    const auto deadline = Clock::now() + m.o.step_timeout;
    bool ready = false;
    while (!(ready = answer.wait_for(kSlice)) && !stopped() && Clock::now() < deadline) {
    }
    if (ready) (void)answer.get(m.o.step_timeout);
  } catch (const std::exception&) {
    // a hold round that found no quorum (the job is ending, a group is being evicted): again
  }
  if (!stopped()) std::this_thread::sleep_for(kSlice);
}

void ReplicaClient::report(double loss, double metric, bool final) {
  auto& m = *impl_;
  if (!m.o.controller) return;
  StepReport r;
  r.replica_id = m.o.replica_id;
  r.incarnation = m.o.incarnation;
  r.rank = m.o.rank;
  r.step = m.state.step();
  r.committed = m.committed && !final;
  r.loss = loss;
  r.quorum_id = m.plan.quorum_id;
  r.participants = static_cast<int64_t>(m.plan.participants.size());
  r.healing = static_cast<int64_t>(m.plan.healing.size());
  r.healed = m.plan.healed && !final;
  r.donor = m.plan.donor;
  r.heal_ms = m.plan.heal_ms;
  r.heal_bytes = m.plan.heal_bytes;
  r.hashed = final || (r.committed && m.state.step() % std::max<int64_t>(1, m.o.hash_every) == 0);
  if (r.hashed) r.hash = m.state.hash();
  r.t_ns = Clock::now().time_since_epoch().count();
  r.error = final ? "" : m.error;
  if (!m.fatal.empty()) {
    r.error = m.fatal;
    r.fatal = true;
  }
  r.metric = metric;
  r.final = final;
  if (final) r.state_bytes = m.state.bytes().size();
  const bool plain =
      r.committed && r.error.empty() && !r.healed && r.metric < 0 && !final && !r.fatal;
  m.reports.push_back(std::move(r));
  if (!plain || static_cast<int64_t>(m.reports.size()) >= m.o.report_batch) {
    // A lost report is only a lost metric.
    (void)m.o.controller->call(&ReplicaController::report, std::move(m.reports));
    m.reports.clear();
  }
  if (final) m.plan.healed = false;
}

}  // namespace monarch::ft
