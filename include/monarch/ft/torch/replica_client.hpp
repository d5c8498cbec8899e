// ReplicaClient: the training side of fault-tolerant training, one per rank of a replica group,
// in the spirit of torchft's Manager (docs/ft.md, "One step, on every rank"). Any training loop
// whose committed state is one FlatState uses it:
//
//   ft::ReplicaClient client(manager, state, options);      // state: FlatState& of the model
//   while (state.step() < steps) {
//     ft::StepPlan plan;
//     try { plan = client.start_quorum(); }
//     catch (const monarch::UsageError&) { throw; }         // a program error: no retry fixes it
//     catch (const std::exception&) { continue; }           // a fault: the next step retries
//     if (!plan.step) continue;                             // caught up by healing only
//     int64_t pos = state.data_position();
//     bool ok = true;
//     try {
//       if (plan.train) loss = model.forward_backward(pos, batch, plan.slot, plan.slots);
//       client.allreduce(state.grads());                    // healers contribute zeros
//     } catch (const std::exception& e) { ok = false; }
//     if (client.should_commit(ok)) { state.adam_step(adam); state.set_data_position(pos + batch);
//     }
//   }
//
// Protocol of one step (invariants the group relies on):
//  1. start_quorum(): publishes the committed state (RdmaBuffer::sync) and asks the group's
//     Manager for the quorum of step state.step(). A new quorum id reconfigures the gloo group
//     under "<namespace>/quorum/<id>/" BEFORE healing, so a failed heal aborts the group and the
//     peers fail at once. Behind max_step: heals from the donor (one RdmaBuffer read straight into
//     state.bytes(); the donor changes its state only at a commit, which needs this rank's
//     allreduce, so the read sees a committed state). Up-to-date groups train on disjoint shares
//     (slot of slots) of the global batch; healers do not train this step.
//  2. allreduce(): sums over the quorum's ranks and divides by the ranks that trained.
//  3. should_commit(ok): the group's vote; true only if every rank of the group voted ok. Apply
//     the optimizer step only then. A failed step aborts the gloo group (peers fail fast) and the
//     next start_quorum() says commit_failed, which makes the lighthouse form a new quorum.
// A failed step never poisons the next: every failure is an exception that names the quorum,
// step and peer, and the caller simply calls start_quorum() again.
//
// Threads: not thread-safe; one per rank, used only by that rank's training thread (it blocks
// on the Manager, the allreduce and RDMA reads). The Manager and the RDMA engine run elsewhere.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "monarch/ft/controller.hpp"
#include "monarch/ft/lighthouse.hpp"
#include "monarch/ft/torch/allreduce.hpp"
#include "monarch/ft/torch/flat_state.hpp"

namespace monarch::ft {

struct ReplicaClientOptions {
  std::string replica_id;   ///< this group's id at the lighthouse ("replica2")
  int64_t incarnation = 0;  ///< for reports (ReplicaController drops reports of old incarnations)
  int64_t rank = 0;         ///< this rank in its group, 0 <= rank < ranks
  int64_t ranks = 1;        ///< ranks per group (every group has the same number)
  std::string store_host = "127.0.0.1";  ///< the StoreServer (rendezvous of the gloo groups)
  uint16_t store_port = 0;
  std::string store_namespace = "run";  ///< each run of a job gets its own keys in the store
  /// The address this rank's gloo device binds and advertises to its peers: loopback when every
  /// group runs on one host; this host's address, reachable from the other groups' hosts,
  /// otherwise (set it in the rank's own process: it names that process's host).
  std::string local_host = "127.0.0.1";
  std::chrono::milliseconds collective_timeout{0};  ///< 0: ft.collective_timeout
  std::chrono::milliseconds step_timeout{0};        ///< 0: ft.step_timeout (quorum, vote, heal)
  uint64_t heal_chunk_bytes = 256 << 10;  ///< with heal.after_first_chunk armed: the first read
  int64_t max_steps = 0;                  ///< > 0: the run ends at this step (see StepPlan::step)
  std::optional<ActorRef<ReplicaController>> controller{};  ///< where report() sends; none: no-op
  /// Async quorum (torchft's use_async_quorum): 1 on, 0 off, -1 the config key ft.async_quorum
  /// (default on). See ReplicaClient::start_quorum().
  int async_quorum = -1;
  /// While the quorum is intact, ask the lighthouse only at steps that are multiples of this
  /// (0: the config key ft.quorum_every, default 8; 1: every step). See start_quorum().
  int64_t quorum_every = 0;
  /// report() hashes the state (FlatState::hash, ~0.15 ms for 2.4 MB) for the controller's
  /// bitwise-equality check at commits of steps that are multiples of this, and at the end.
  int64_t hash_every = 10;
  /// While an allreduce has waited this long, and then every this long, allreduce() asks the
  /// group's Manager whether the lighthouse reports a member of the quorum silent (Q-9: frozen,
  /// or dead and evicted) and gives up on the op if so, instead of waiting out
  /// collective_timeout. 0: half of ft.heartbeat_interval; negative: never.
  std::chrono::milliseconds silent_probe{0};
  /// report() sends plain commits (no error, heal, metric or final) to the controller in batches
  /// of this many, and anything else at once with the batch before it: one message per step per
  /// rank woke the controller's process 360 times a second in ft_train and cost ~15 % of the
  /// step time on 2 cores. 1: every report at once.
  int64_t report_batch = 8;
  template <class A>
  void serialize(A& ar) {
    ar(replica_id, incarnation, rank, ranks, store_host, store_port, store_namespace, local_host,
       collective_timeout, step_timeout, heal_chunk_bytes, max_steps, controller, async_quorum,
       quorum_every, hash_every, silent_probe, report_batch);
  }
};

/// What start_quorum() decided for this rank's step.
struct StepPlan {
  int64_t quorum_id = 0;
  int64_t max_step = 0;                   ///< the quorum's highest committed step
  std::vector<std::string> participants;  ///< replica ids in the quorum, in rank order
  std::vector<std::string> healing;       ///< those healing this step
  /// false: no step to run (every participant is at max_steps: this rank only healed to catch
  /// up, or it is done and holds). Do not call allreduce/should_commit then.
  bool step = false;
  bool train = false;  ///< this rank computes gradients on share `slot` of `slots`
  int slot = -1;
  int slots = 0;
  /// Async quorum: the plan is the last quorum's, repeated before the lighthouse answered
  /// (participants and max_step as predicted, healing empty); allreduce() checks it against the
  /// answer and updates these fields. false: the answer itself.
  bool predicted = false;
  bool healed = false;  ///< the state was read from `donor` this step
  std::string donor;
  uint64_t heal_bytes = 0;
  /// Wall time of the heal on this rank's thread: the reads of the donor's state straight into
  /// ours, the header and step checks and the sync; a heal.after_first_chunk fault point's call
  /// to the controller is left out. heal_bytes / heal_ms is heal_gbps.
  double heal_ms = 0;
  /// Route setup to the donor (same host: open, map and touch its shared memory), run on a
  /// helper thread ahead of the heal, while the new gloo group forms or (a deferred heal) while
  /// the step before contributes zeros; not part of heal_ms. 0 when nothing ran ahead: the
  /// heal's first read then sets the route up, inside heal_ms.
  double heal_setup_ms = 0;
};

class ReplicaClient {
 public:
  /// `manager`: the group's Manager (rank 0's proc). `state` must outlive the client; it is
  /// exposed to healers as the RdmaBuffer "<replica_id>.r<rank>.state". Throws UsageError for a
  /// bad rank or an empty replica id.
  ReplicaClient(ActorRef<Manager> manager, FlatState& state, ReplicaClientOptions options);
  ~ReplicaClient();
  ReplicaClient(const ReplicaClient&) = delete;
  ReplicaClient& operator=(const ReplicaClient&) = delete;

  /// Step 1 of the protocol (above). Throws std::runtime_error naming the replica, rank, step
  /// and quorum and the cause (no quorum within step_timeout, the new gloo group did not form,
  /// a failed heal naming the donor); the next start_quorum() then says commit_failed. A failure
  /// after the quorum answered also votes no for this step, so the group's other ranks do not
  /// wait out step_timeout.
  ///
  /// Async quorum (ReplicaClientOptions::async_quorum, default on): after a step that committed
  /// in an intact quorum (nobody healing), the request goes out and the last quorum's plan comes
  /// back at once (StepPlan::predicted), so the quorum round trip overlaps the forward/backward
  /// pass instead of preceding it. allreduce() (or should_commit(), if the step never reached the
  /// allreduce) waits for the answer and applies it as the synchronous path would (new gloo
  /// group) but for a heal: an answer that says to heal (a rank frozen mid-step fell behind)
  /// makes this step contribute zeros and not commit (should_commit() returns false, without
  /// aborting the group; last_error() says why), and the next start_quorum() heals, because the
  /// caller already read the data position it commits from. The step fails, with a runtime_error
  /// naming both shares, if the answer gives this rank another share of the batch (a group joined
  /// up to date); a step that fails is followed by a synchronous start_quorum(). Invariants are
  /// unchanged: the published state is the committed one, and the request is the one the
  /// synchronous path would send at this point.
  ///
  /// Quorum every K steps (ReplicaClientOptions::quorum_every): after a step that committed in an
  /// intact quorum, a step whose number (state.step()) is not a multiple of K sends no request
  /// at all: the plan is the last quorum's (predicted) and the allreduce needs no answer. Every
  /// member of a quorum is at the same step, so all of them ask at the same steps. A failure
  /// still shows at once (the allreduce fails, the next step asks); what waits is a group that
  /// asks to join: up to K - 1 steps of the others (the lighthouse holds its request, Q-3).
  ///
  /// Program errors are UsageError, and no retry fixes them: the first start_quorum() of a client
  /// tells the Manager which client uses this rank, and throws UsageError if another client of the
  /// group already does (two trainers given the same rank would otherwise replace each other's
  /// requests forever). After one (or allreduce()'s size mismatch) every start_quorum() throws it
  /// again and report() sends it as fatal, so the controller ends the run with it; a loop without
  /// a controller must stop on it (the loop above rethrows it).
  StepPlan start_quorum();
  /// Sums `data` over the quorum's ranks in place, then divides by plan.slots. A rank that did
  /// not train (plan.train false) contributes zeros. Fault point "allreduce.enter" throws here.
  /// A predicted plan first waits for the quorum (start_quorum()). On failure aborts the group
  /// (peers fail fast) and throws AllreduceError (naming the quorum and the peer) or
  /// std::runtime_error; call should_commit(false) next. UsageError for a program error: no
  /// planned step, or replicas whose states differ in size (AllreduceGroup::allreduce_sum checks
  /// it once per quorum); report() then sends it as fatal and the controller ends the run with it
  /// (RunStats::error) instead of retrying a step that can never succeed. A wait for a member the
  /// lighthouse names silent (Q-9; ReplicaClientOptions::silent_probe) ends with an AllreduceError
  /// "... abandoned: the lighthouse has not heard from <group> ...", about one heartbeat
  /// timeout after that member froze, instead of after collective_timeout.
  void allreduce(std::span<float> data);
  /// The group's commit vote for the step start_quorum() planned: true only if every rank of the
  /// group voted ok (a group of one rank votes locally, no Manager round trip). `false` or a vote
  /// timeout aborts the gloo group; a timeout throws. UsageError before any start_quorum().
  bool should_commit(bool ok);
  /// For a rank that finished (state.step() >= max_steps): one quorum round without training,
  /// so that groups still behind can heal from this one; errors are ignored. Paces itself (50 ms).
  /// A round waits up to step_timeout for its quorum; `stop` (the caller's stop flag, set by
  /// another thread) ends that wait within 50 ms, so that a finished group stops at once.
  void hold(const std::atomic<bool>* stop = nullptr);
  /// Sends this step's StepReport to the controller (no-op without one): quorum and heal facts
  /// of the last plan, whether it committed, the state's step, the last error, and the state's
  /// hash at steps that are multiples of hash_every and in the final report. Plain commits wait
  /// for a batch of ReplicaClientOptions::report_batch; the rest goes at once (with the batch).
  /// `loss` < 0: did not train; `metric` < 0: not evaluated. `final`: the rank is done.
  /// After a program error (a UsageError of allreduce()) every report carries it as `fatal`.
  void report(double loss, double metric = -1, bool final = false);

  /// The committed state's RdmaBuffer handle (what healers read).
  rdma::RdmaHandle state_handle() const;
  /// Why the last step failed ("" after a commit).
  const std::string& last_error() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace monarch::ft
