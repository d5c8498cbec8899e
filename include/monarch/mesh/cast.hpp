// Cast tree: how a mesh adverb (ActorMesh::call, reduce, stream, broadcast; actor_mesh.hpp)
// reaches its members. Background, diagrams and benchmarks: docs/cast-tree.md; where the cast tree
// sits among the layers: docs/design.md.
//
// Every Proc of a ProcMesh runs one comm actor (CommActor, registered as "monarch.comm"). A cast
// is posted to the comm actor of base proc 0, which relays it down a fixed tree over the base
// proc ranks: the node for the proc range [lo, hi) is proc lo; it splits [lo+1, hi) into at most
// `fanout` contiguous chunks and forwards the cast to the first proc of each chunk that holds a
// destination (CAST-1, CAST-2). Each node delivers the cast to the members on its own proc and
// accumulates their replies with those of its children, then hands one partial result to its
// parent (CAST-5): collect for call(), the user reducer for reduce().
//
// Threads: a node runs on its comm actor's thread (one cast message at a time, which is what
// keeps per-pair FIFO, CAST-3); replies are accumulated on whichever thread completes them, under
// the node's own mutex, so one cast never funnels all replies through one lock. The caster's
// futures complete on runtime threads, never the caller's.
//
// In process, the relay hands shared C++ objects from node to node (no serialisation). When the
// comm actors are remote refs (ActorMesh::attach / from_ids), a hop is a CommActor::cast(CastWire)
// call over the channel and partial results travel cereal-encoded (CAST-10).
//
// Dead procs (declared failed, as the caster's Proc and each relay's Proc know them) are routed
// around: a node forwards past a dead child to its children, and when proc 0 is dead the caster
// sends to its live descendants itself (CAST-12).
//
// Invariants CAST-1..CAST-12 (fan-out, fixed paths, per-pair FIFO, no atomicity, one accumulated
// reply, per-member failures, nothing hangs, scale, the relay never fails, the same tree across
// processes, a cast right after spawn, dead procs routed around) are stated once, in
// docs/cast-tree.md, "Invariants"; tests cite them by number (index: docs/design.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/ndslice/ndslice.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch::mesh {

namespace detail {
struct NoReducer;  // detail/cast_job.hpp
}  // namespace detail

/// Settings of the cast tree of a ProcMesh.
struct CastOptions {
  /// Most children one comm actor forwards a cast to (>= 1; 1 makes a chain). Default: config
  /// key mesh.cast_fanout (16). ProcMesh::local and HostMesh::spawn_procs throw UsageError for 0.
  size_t fanout = static_cast<size_t>(config::global().integer("mesh.cast_fanout"));
};

/// Consecutive members of one destination proc: `count` actors named names[name] with uids
/// uid, uid+1, ... and message ranks rank, rank+1, ... (their proc is the destination proc's).
struct MemberRun {
  uint32_t name = 0;
  uint32_t count = 0;
  uint64_t uid = 0;
  uint32_t rank = 0;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(name, count, uid, rank);
  }
};

/// One hop of a cast to comm actors in other processes (CAST-10): everything the subtree of procs
/// [lo, hi) needs, serialised with cereal. Payloads are wire::encode output held in strings.
/// Members travel as runs without their proc address (a member lives on the proc of the comm
/// actor it is delivered by), so a cast to 256 consecutive actors per proc costs a few bytes per
/// proc rather than an ActorId per member.
struct CastWire {
  std::string handler;      // registry key of the typed handler (detail::RemoteCast)
  std::string args;         // the endpoint's argument tuple
  std::string reducer;      // the reducer (empty when stateless)
  uint32_t lo = 0, hi = 0;  // the subtree: base procs [lo, hi), rooted at lo
  uint64_t fanout = 16;
  std::vector<ActorId> comm;       // comm actors of procs lo .. hi-1
  std::vector<uint32_t> procs;     // destination procs in the subtree, ascending
  std::vector<uint32_t> starts;    // procs[i]'s members: runs[starts[i] .. starts[i+1])
  std::vector<std::string> names;  // distinct member actor names
  std::vector<MemberRun> runs;     // destination members, grouped by proc
  // Procs of [lo, hi) known dead when the hop was sent (ascending) and why (CAST-12): a node
  // forwards past them to their children. Dead destinations were already taken out by the caster.
  std::vector<uint32_t> dead;
  std::vector<std::string> dead_causes;
  // Broadcast (CAST-9): where a member or hop that cannot be reached is reported. The caster
  // (uid 0: code outside actors) and the address of the listening Proc it cast through.
  std::string caster_proc;
  ActorId caster;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(handler, args, reducer, lo, hi, fanout, comm, procs, starts, names, runs, dead, dead_causes,
       caster_proc, caster);
  }
};

/// The per-proc system actor that relays casts; it runs on its Proc's scheduler like any actor,
/// one cast at a time. In process, casts reach it as internal envelopes (detail::CastEnvelope);
/// from other processes through its endpoints below, which casters and other comm actors call.
class CommActor final : public Actor {
 public:
  /// A cast hop from another process (its parent node or the caster); replies with the
  /// subtree's serialised partial result, or fails with the first error (CAST-6, CAST-7).
  /// Fails with UsageError when this process has no handler for `w.handler` (see
  /// mesh::register_cast).
  Future<std::string> cast(CastWire w);
  /// The same for broadcast (no reply). A member or child hop it cannot reach, or a hop it cannot
  /// run (no handler, malformed), is reported to the caster (`w.caster`, CAST-9).
  void cast_send(CastWire w);
  /// Never fails the relay (CAST-9): undeliverable reports are routed to casters, so one that
  /// lands here is only logged.
  void undeliverable(const DeliveryFailure& failure) override;
  MONARCH_ENDPOINTS(CommActor, cast, cast_send)
};

/// Name the comm actor is registered under in its Proc (Proc::lookup<CommActor>).
inline constexpr const char* kCommActorName = "monarch.comm";

/// What a handler may ask about the message it runs for and the actor it runs in.
struct Context {
  /// The receiver's local rank within the (sliced) view the message was cast to. Valid until the
  /// handler returns or first suspends. Throws UsageError outside a cast message.
  static size_t message_rank();
  /// The calling actor's point in the whole ActorMesh that ProcMesh::spawn made it a member of,
  /// whatever view or message reached it (Monarch: context().actor_instance.rank). Its extent is
  /// that mesh's, e.g. {hosts, gpus, actors} for procs.spawn<W>("w", {{"actors", 2}}) on
  /// {hosts, gpus}; spawned from a sliced ProcMesh, the slice's dims. Works in any handler of the
  /// actor (direct calls and sends, casts, init()), in-process and in process meshes alike, on
  /// the actor's own thread.
  /// Throws UsageError naming the actor when it was not spawned by ProcMesh::spawn (e.g. by
  /// Proc::spawn or Actor::spawn), or when called outside any actor's handler.
  static ndslice::Point actor_rank();
};

/// Replies of a stream() cast, in arrival order. Thread-safe.
template <class R>
class Stream {
 public:
  explicit Stream(size_t total) : q_(std::make_shared<Queue>()) { q_->total = total; }

  /// Replies not yet handed out by next().
  size_t remaining() const {
    std::lock_guard lock(q_->mu);
    return q_->total - q_->taken;
  }

  /// The next reply to arrive: (local rank, a ready Future<R> holding the value or the member's
  /// error). Throws TimeoutError after `timeout` (nothing is lost; call again), UsageError when
  /// every reply was already handed out.
  std::pair<size_t, Future<R>> next(std::chrono::milliseconds timeout) {
    std::unique_lock lock(q_->mu);
    if (q_->taken == q_->total) throw UsageError("Stream::next: all replies were already taken");
    if (!q_->cv.wait_for(lock, timeout, [&] { return !q_->ready.empty(); })) {
      throw TimeoutError("Stream::next: no reply within " + std::to_string(timeout.count()) +
                         " ms (" + std::to_string(q_->total - q_->taken) + " outstanding)");
    }
    auto item = std::move(q_->ready.front());
    q_->ready.pop_front();
    ++q_->taken;
    return item;
  }

  /// Internal: registers member `rank`'s reply (any thread; `f` completes on a runtime thread).
  void add(size_t rank, Future<R> f) {
    auto q = q_;
    f.on_complete([q, rank](monarch::detail::State<R>& st) {
      Promise<R> p;
      if (st.error) {
        p.set_error(st.error);
      } else if constexpr (std::is_void_v<R>) {
        p.set_value();
      } else {
        p.set_value(std::move(*st.value));
      }
      std::lock_guard lock(q->mu);
      q->ready.emplace_back(rank, p.get_future());
      q->cv.notify_all();
    });
  }

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<size_t, Future<R>>> ready;
    size_t total = 0;
    size_t taken = 0;
  };
  std::shared_ptr<Queue> q_;
};

/// Makes casts of (A, method, reducer) runnable by the comm actors of THIS process. Casters
/// register what they send automatically; a worker process started from another binary calls
/// this for each endpoint (and reducer) it is cast, e.g. register_cast<Worker>(&Worker::step,
/// Sum{}). Any thread; registering twice is harmless. Static errors (static_assert) name what
/// cannot be serialised. Defined in detail/cast_remote.hpp.
template <class A, class M, class Reducer = detail::NoReducer>
void register_cast(M method, Reducer reducer = {});

}  // namespace monarch::mesh

// The templates behind the adverbs and register_cast.
#include "monarch/mesh/detail/cast_job.hpp"     // IWYU pragma: export
#include "monarch/mesh/detail/cast_remote.hpp"  // IWYU pragma: export
