// Lighthouse and Manager: the control side of fault-tolerant training (docs/ft.md; terms in
// docs/design.md, "Vocabulary").
//
//   // client (controller) process
//   auto lighthouse = client.spawn<ft::Lighthouse>("lighthouse", ft::LighthouseOptions{});
//   // one Manager per replica group, on the group's rank-0 proc:
//   auto manager = group_procs.slice("ranks", 0).spawn<ft::Manager>("manager", lighthouse,
//   "replica2", 1);
//   // every rank of the group, every step (from its training thread):
//   ft::QuorumResult q = manager.call(&ft::Manager::quorum, rank, step, failed,
//   my_state).get(timeout);
//   ... heal if q.heal, reconfigure the allreduce if q.quorum_id changed, allreduce ...
//   bool commit = manager.call(&ft::Manager::should_commit, rank, step, ok).get(timeout);
//
// Lighthouse: one per job, in the controller's process or standalone (`monarch lighthouse`, found
// with connect_lighthouse). Replica groups heartbeat it (the
// Manager's heartbeat thread, every ft.heartbeat_interval) and ask it for a quorum each step; the
// rules are QuorumState's (quorum.hpp, Q-1..Q-10). The controller evicts a group it knows is dead
// (its MeshFailure), so survivors need not wait for its heartbeat to go stale.
//
// Manager: one per replica group. It gathers the quorum requests of the group's ranks into one
// QuorumMember, asks the lighthouse, and gives each rank its QuorumResult: whether to heal and from
// whom, its rank and world size in the allreduce, and the store prefix of this quorum's group.
// should_commit gathers one vote per rank and answers true only if every rank voted ok.
//
// The Manager survives its lighthouse: it is never failed by a DeliveryFailure of a heartbeat or
// quorum call. A frozen lighthouse simply answers late (its heartbeats queue; the ranks' quorum
// waits are bounded by their own deadline and retried); a quorum request that the channel gave up
// on meanwhile (delivery timeout) is re-sent when a heartbeat is answered again, so a thaw does
// not cost the rest of ft.step_timeout. A lighthouse restarted on the same address
// is a new incarnation (LighthouseStatus::epoch, returned by every heartbeat): the Manager then
// looks it up again by address and name and re-sends its pending quorum request there.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "monarch/actor/actor.hpp"
#include "monarch/actor/future.hpp"
#include "monarch/ft/quorum.hpp"

namespace monarch::ft {

namespace detail {
/// Runs a function every period on its own thread until stop() (which returns at once, without
/// waiting out the period). Used for the lighthouse's ticker and the managers' heartbeats.
class Periodic {
 public:
  Periodic() = default;
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;
  ~Periodic() { stop(); }
  void start(std::chrono::milliseconds period, std::function<void()> fn);
  void stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};
}  // namespace detail

/// Defaults come from the ft.* config keys (docs/config.md).
struct LighthouseOptions {
  int64_t min_replicas = 0;                        ///< 0: ft.min_replicas
  std::chrono::milliseconds join_timeout{0};       ///< 0: ft.quorum_join_timeout
  std::chrono::milliseconds heartbeat_timeout{0};  ///< 0: ft.heartbeat_timeout
  /// Q-7 (quorum.hpp): after a start or a freeze, wait this long before leaving any group out of
  /// a quorum. 0: off (a lighthouse in the job's own process neither restarts nor freezes alone);
  /// `monarch lighthouse` uses the heartbeat timeout.
  std::chrono::milliseconds recovery_wait{0};
  template <class A>
  void serialize(A& ar) {
    ar(min_replicas, join_timeout, heartbeat_timeout, recovery_wait);
  }
};

/// The name a standalone lighthouse (`monarch lighthouse`) registers its Lighthouse actor under.
inline constexpr const char* kLighthouseName = "lighthouse";

/// What a heartbeat learns from the lighthouse.
struct HeartbeatReply {
  uint64_t epoch = 0;     ///< the lighthouse's incarnation (random per Lighthouse actor)
  bool kill = false;      ///< kill_replica() asked for this group: its Manager SIGKILLs its process
  int64_t quorum_id = 0;  ///< the last quorum formed (0: none yet)
  /// Q-9 (quorum.hpp): participants of that quorum the lighthouse has not heard from within the
  /// heartbeat timeout (or evicted), sorted; never the asking group.
  std::vector<std::string> silent{};
  template <class A>
  void serialize(A& ar) {
    ar(epoch, kill, quorum_id, silent);
  }
};

/// One group as the lighthouse sees it (LighthouseStatus).
struct ReplicaStatus {
  std::string replica_id;
  int64_t step = -1;             ///< step of its last quorum request (-1: none yet)
  int64_t heartbeat_age_ms = 0;  ///< since its last heartbeat or request
  bool healthy = false;          ///< heartbeat within heartbeat_timeout (Q-1)
  bool pending = false;          ///< waiting for a quorum now
  bool in_quorum = false;        ///< a participant of the last quorum
  template <class A>
  void serialize(A& ar) {
    ar(replica_id, step, heartbeat_age_ms, healthy, pending, in_quorum);
  }
};

/// A change of quorum id (LighthouseStatus::changes).
struct QuorumChange {
  int64_t quorum_id = 0;
  int64_t unix_ms = 0;  ///< wall-clock time it formed, ms since the Unix epoch
  int64_t max_step = 0;
  std::vector<std::string> participants{};
  /// Participants behind max_step, which heal in this quorum (a replaced group rejoins this way,
  /// so a kill can show here rather than as a quorum without the victim).
  std::vector<std::string> healing{};
  std::string reason{};
  template <class A>
  void serialize(A& ar) {
    ar(quorum_id, unix_ms, max_step, participants, healing, reason);
  }
};

/// Lighthouse::status: a snapshot for the HTTP page and tools.
struct LighthouseStatus {
  uint64_t epoch = 0;
  int64_t quorum_id = 0;  ///< the last quorum's (0: none yet)
  int64_t max_step = 0;
  std::vector<std::string> members{};     ///< the last quorum's participants
  std::vector<ReplicaStatus> replicas{};  ///< every group heard from, sorted by id
  std::vector<std::string> pending{};     ///< groups waiting for a quorum
  std::vector<QuorumChange> changes{};    ///< the most recent quorum id changes, oldest first
  std::string waiting_for{};              ///< why no quorum formed yet ("" when none pending)
  int64_t heartbeat_timeout_ms = 0;
  template <class A>
  void serialize(A& ar) {
    ar(epoch, quorum_id, max_step, members, replicas, pending, changes, waiting_for,
       heartbeat_timeout_ms);
  }
};

/// Raised through a pending quorum Future when the lighthouse gives up on the request (the group
/// was evicted, or a newer request from the same group replaced it).
class QuorumError : public Error {
 public:
  explicit QuorumError(const std::string& message) : Error(ErrorCode::Quorum, message) {}
};

class Lighthouse : public Actor {
 public:
  explicit Lighthouse(LighthouseOptions options = {});

  void init() override;
  void cleanup(const std::optional<ActorSupervisionEvent>& error) override;

  /// A group is alive. Called (or sent) from the group's heartbeat thread. `incarnation` names the
  /// group's current Manager (a random number drawn per Manager actor, never 0: a respawned group
  /// has a new one). The reply carries the lighthouse's epoch, whether this incarnation was
  /// asked to die (kill_replica), and the last quorum's silent participants.
  HeartbeatReply heartbeat(std::string replica_id, uint64_t incarnation);
  /// Joins the next quorum; completes when one forms (Q-1..Q-5). A newer request from the same
  /// group fails the older one with QuorumError. The caller bounds the wait (ft.step_timeout).
  Future<Quorum> quorum(QuorumMember member);
  /// Supervision says the group is dead: its pending request fails with QuorumError(reason).
  void evict(std::string replica_id, std::string reason);
  /// The last quorum formed (quorum_id 0 and no participants before the first).
  Quorum last_quorum() const;
  /// Requests waiting for a quorum.
  size_t pending() const { return state_.pending(); }
  /// Groups with a fresh heartbeat now, sorted (the controller waits for all before the first
  /// step).
  std::vector<std::string> healthy() const;
  /// Re-evaluates the rules; the lighthouse's own ticker calls it every join_timeout / 5.
  void tick();
  /// A snapshot of the lighthouse's view (the HTTP /status page reads it through this call).
  LighthouseStatus status() const;
  /// Chaos drills: dooms the incarnation of `replica_id` that the lighthouse heard from last.
  /// Every heartbeat reply to that incarnation, from now on, tells its Manager to SIGKILL its own
  /// process (so the job's supervision sees a real failure). Every reply, not only the next one:
  /// a reply its Manager stopped waiting for (a slow lighthouse) must not lose the kill. Replies to
  /// a later incarnation (the group's replacement) never carry it. So a repeated request that
  /// comes before the replacement's first heartbeat is the same kill, and does not kill the
  /// replacement too. False when the lighthouse never heard a heartbeat from that group.
  bool kill_replica(std::string replica_id);

  MONARCH_ENDPOINTS(Lighthouse, heartbeat, quorum, evict, last_quorum, healthy, pending, tick,
                    status, kill_replica)

  /// How many quorum changes status() keeps.
  static constexpr size_t kMaxChanges = 32;

 private:
  void try_form();

  QuorumState state_;
  uint64_t epoch_;
  std::map<std::string, Promise<Quorum>> waiting_;
  std::map<std::string, int64_t> last_step_;
  std::deque<QuorumChange> changes_;
  std::map<std::string, uint64_t> incarnation_;  // replica id -> the incarnation heard from last
  /// Incarnations told to die (kill_replica), oldest first, at most kMaxDoomed; `told`: a reply
  /// carried the kill (logged once).
  struct Doomed {
    std::string replica_id;
    uint64_t incarnation;
    bool told = false;
  };
  std::deque<Doomed> doomed_;
  Doomed* find_doomed(const std::string& replica_id, uint64_t incarnation);
  static constexpr size_t kMaxDoomed = 256;
  detail::Periodic ticker_;
};

/// Looks up the standalone lighthouse serving `addr` (e.g. "tcp://10.0.0.5:29500", the address
/// `monarch lighthouse` prints) from `proc`, which must listen (ProcOptions::listen) and share the
/// job secret for TCP. Blocks up to `timeout` (the lighthouse may start after the job); once a
/// connection attempt has failed it logs one warning with the cause (e.g. "Connection refused")
/// and waits on. Every error names `addr`: TimeoutError when nothing
/// answered within `timeout`; otherwise an Error with the cause's code, at once for a malformed
/// address or a TCP address without the job secret (code Channel). Any thread outside an actor
/// handler.
ActorRef<Lighthouse> connect_lighthouse(Proc& proc, const std::string& addr,
                                        std::chrono::milliseconds timeout);

/// What one rank of a replica group learns from Manager::quorum.
struct QuorumResult {
  int64_t quorum_id = 0;
  std::string store_prefix{};      ///< "quorum/<quorum_id>/": fresh per quorum id
  int64_t replica_rank = 0;        ///< this group's index among participants
  int64_t replica_world_size = 0;  ///< participating groups
  int64_t global_rank = 0;         ///< this rank in the allreduce: ranks of earlier groups + rank
  int64_t global_world_size = 0;   ///< ranks in the allreduce (sum over participating groups)
  int64_t max_step = 0;
  int64_t up_to_date_groups = 0;  ///< participants at max_step (they contribute gradients)
  bool heal = false;              ///< this group is behind max_step: read the donor's state first
  std::string donor_id{};         ///< when heal: the donor group
  std::optional<rdma::RdmaHandle> donor_state{};  ///< when heal: the donor rank's committed state
  std::vector<std::string> participants{};        ///< replica ids, in rank order
  std::vector<std::string> healing{};             ///< replica ids healing this step
  std::string reason{};                           ///< why the quorum formed

  template <class A>
  void serialize(A& ar) {
    ar(quorum_id, store_prefix, replica_rank, replica_world_size, global_rank, global_world_size,
       max_step, up_to_date_groups, heal, donor_id, donor_state, participants, healing, reason);
  }
};

class Manager : public Actor {
 public:
  /// `world_size`: ranks in this group; each calls quorum() and should_commit() every step.
  /// `heartbeat_interval` 0: ft.heartbeat_interval. `job`: names the job in every quorum request
  /// (Q-10, quorum.hpp): the same for all groups of one run, different for each run that uses
  /// the same lighthouse (ReplicaController draws one).
  Manager(ActorRef<Lighthouse> lighthouse, std::string replica_id, int64_t world_size,
          std::chrono::milliseconds heartbeat_interval = std::chrono::milliseconds{0},
          std::string job = {});

  /// Starts heartbeating the lighthouse.
  void init() override;
  void cleanup(const std::optional<ActorSupervisionEvent>& error) override;

  /// Rank `rank` (0 <= rank < world_size) of this group asks for the quorum of step `step` (its
  /// committed steps). `commit_failed`: its previous step did not commit. `state`: where its
  /// committed state can be read, when it has one. Completes once every rank asked and the
  /// lighthouse answered; fails with UsageError on a bad rank, QuorumError from the lighthouse
  /// (called from another actor or thread, as ReplicaClient does, these arrive as the cause of
  /// an ActorError, like any handler's exception).
  Future<QuorumResult> quorum(int64_t rank, int64_t step, bool commit_failed,
                              std::optional<rdma::RdmaHandle> state);
  /// One vote per rank for step `step`; completes with true only if every rank voted ok.
  Future<bool> should_commit(int64_t rank, int64_t step, bool ok);
  /// Rank `rank` is used by the ReplicaClient `client` (a random id it drew). "" when the rank
  /// was free or is already this client's; else why not (another client of this Manager uses it:
  /// two trainers of one group were given the same rank). A rank stays claimed for the
  /// Manager's life (one per group incarnation). UsageError on a bad rank.
  std::string claim(int64_t rank, uint64_t client);
  /// Whether quorum `quorum_id` lost a member, as the lighthouse's latest heartbeat reply says
  /// "" when it did not, or when that reply was about another quorum; else a sentence
  /// naming the silent groups and the reply's age. Answers from memory (no lighthouse round
  /// trip, microseconds), so a rank may poll it while its allreduce waits
  /// (ReplicaClient::allreduce does, every ReplicaClientOptions::silent_probe).
  std::string quorum_health(int64_t quorum_id) const;

  /// Internal (the heartbeat thread): the lighthouse restarted, was re-resolved, or answers again
  /// after an outage; re-send the pending quorum request to it (no-op when none is pending).
  void resend();
  /// A DeliveryFailure of a send is logged, never fatal (the lighthouse may be down for a while).
  void undeliverable(const DeliveryFailure& failure) override;

  MONARCH_ENDPOINTS(Manager, quorum, should_commit, quorum_health, resend, claim)

 private:
  struct QuorumAsk {
    int64_t step;
    bool commit_failed;
    std::optional<rdma::RdmaHandle> state;
    Promise<QuorumResult> reply;
  };
  /// The group's request in flight to the lighthouse: answered once, by the latest send.
  struct Inflight {
    std::mutex mu;
    uint64_t seq = 0;
    bool done = false;
    QuorumMember member;
    std::map<int64_t, QuorumAsk> asks;
  };
  void send_inflight();
  void beat();
  ActorRef<Lighthouse> lighthouse() const;
  struct Vote {
    int64_t step;
    bool ok;
    Promise<bool> reply;
  };
  void check_rank(int64_t rank, const char* what) const;
  std::map<int64_t, uint64_t> claims_;  // rank -> the ReplicaClient that uses it (claim)

  mutable std::mutex lh_mu_;  // lighthouse_ (re-resolved by the heartbeat thread)
  ActorRef<Lighthouse> lighthouse_;
  std::string replica_id_;
  std::string job_;
  int64_t world_size_;
  std::chrono::milliseconds heartbeat_interval_;
  uint64_t epoch_ = 0;    // heartbeat thread only: the lighthouse incarnation last heard
  uint64_t incarnation_;  // this Manager's, sent with every heartbeat (random, never 0)
  // the latest heartbeat reply's quorum id and silent members (heartbeat thread writes,
  // quorum_health reads).
  struct Health {
    std::mutex mu;
    int64_t quorum_id = 0;
    std::vector<std::string> silent;
    Clock::time_point at{};
  };
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  std::shared_ptr<std::atomic<int64_t>> last_quorum_id_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<bool>> unreachable_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<Inflight> inflight_;
  std::map<int64_t, QuorumAsk> asks_;
  std::map<int64_t, Vote> votes_;
  detail::Periodic heartbeat_;
};

/// Per-rank view of `q` for rank `rank` of group `replica_id` (what Manager::quorum returns).
/// Throws UsageError if the group is not a participant.
QuorumResult result_for(const Quorum& q, const std::string& replica_id, int64_t rank);

}  // namespace monarch::ft
