// Cast tree: how a mesh adverb reaches its members (invariants CAST-1..CAST-10 in
// docs/cast-tree.md).
//
// Every Proc of a ProcMesh runs one comm actor (CommActor, registered as "monarch.comm"). A cast
// is posted to the comm actor of base proc 0, which relays it down a fixed tree over the base
// proc ranks: the node for the proc range [lo, hi) is proc lo; it splits [lo+1, hi) into at most
// `fanout` contiguous chunks and forwards the cast to the first proc of each chunk that holds a
// destination (CAST-1, CAST-2). Each node delivers the cast to the members on its own proc and
// accumulates their replies with those of its children, then hands one partial result to its
// parent (CAST-5): collect for call(), the user reducer for reduce().
//
// Threading: a node runs on its comm actor's thread (one cast message at a time, which is what
// keeps per-pair FIFO, CAST-3); replies are accumulated on whichever thread completes them, under
// the node's own mutex, so one cast never funnels all replies through one lock.
//
// In process, the relay hands shared C++ objects from node to node (no serialisation). When the
// comm actors are remote refs (ActorMesh::attach / from_ids), a hop is a CommActor::cast(CastWire)
// call over the channel and partial results travel cereal-encoded (CAST-10, RemoteCast below).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

/// Settings of the cast tree of a ProcMesh.
struct CastOptions {
  /// Most children one comm actor forwards a cast to (>= 1; 1 makes a chain). Default 16.
  size_t fanout = 16;
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
  template <class Ar>
  void serialize(Ar& ar) {
    ar(handler, args, reducer, lo, hi, fanout, comm, procs, starts, names, runs);
  }
};

/// The per-proc system actor that relays casts. In process, casts reach it as internal envelopes
/// (detail::CastEnvelope); from other processes through its endpoints below.
class CommActor final : public Actor {
 public:
  /// A cast hop from another process (its parent node or the caster); replies with the
  /// subtree's serialised partial result, or fails with the first error (CAST-6, CAST-7).
  /// Fails with UsageError when this process has no handler for `w.handler` (see
  /// mesh::register_cast).
  Future<std::string> cast(CastWire w);
  /// The same for broadcast (no reply).
  void cast_send(CastWire w);
  /// Never fails the relay (CAST-9): undeliverable reports are routed to casters, so one that
  /// lands here is only logged.
  void undeliverable(const DeliveryFailure& failure) override;
  MONARCH_ENDPOINTS(CommActor, cast, cast_send)
};

/// Name the comm actor is registered under in its Proc (Proc::lookup<CommActor>).
inline constexpr const char* kCommActorName = "monarch.comm";

/// Inside a handler reached through a mesh adverb.
struct Context {
  /// The receiver's local rank within the (sliced) view the message was cast to. Valid until the
  /// handler returns or first suspends. Throws UsageError outside a cast message.
  static size_t message_rank();
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

  /// Internal: registers member `rank`'s reply.
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

namespace detail {

using monarch::detail::Cell;
using monarch::detail::CellPtr;
using monarch::detail::check_endpoint;
using monarch::detail::current_cell;
using monarch::detail::Envelope;
using monarch::detail::method_traits;
using monarch::detail::reply_type;
using monarch::detail::State;
using monarch::detail::UniqueFunction;

/// Spawns the comm actor of `proc` and registers it as kCommActorName (the process allocator
/// calls this in each freshly started worker Proc). Throws UsageError if one is already there.
ActorRef<CommActor> install_comm(Proc& proc);

/// Holds back the casts to a freshly spawned process mesh until every proc of it has read its
/// Spawn messages (CAST-11). A Spawn travels on the caster's own link to each proc, a cast through
/// comm actors: without the fence a cast could reach a proc before the actors it names exist.
/// Opened by one arrival per proc (the reply to a request sent after the Spawns on that link,
/// successful or not). Thread-safe.
class CastFence {
 public:
  explicit CastFence(size_t arrivals) : left_(arrivals) {}
  void arrive() {
    std::vector<UniqueFunction<void()>> run;
    {
      std::lock_guard lock(mu_);
      if (left_ == 0 || --left_ != 0) return;
      run.swap(waiting_);
    }
    for (auto& f : run) f();
  }
  /// Runs `f` now when open, else on the thread of the last arrival (a channel I/O thread).
  void then(UniqueFunction<void()> f) {
    {
      std::lock_guard lock(mu_);
      if (left_ != 0) {
        waiting_.push_back(std::move(f));
        return;
      }
    }
    f();
  }

 private:
  std::mutex mu_;
  size_t left_;
  std::vector<UniqueFunction<void()>> waiting_;
};

/// The comm actors of a ProcMesh by base proc rank, and the tree's fan-out. Shared, immutable.
struct CastTopology {
  std::vector<ActorRef<CommActor>> comm;
  size_t fanout = 16;
  /// The comm actors are in other processes (remote refs, from `client`): casts go as CastWire.
  bool remote = false;
  /// Remote casts wait for it when set (a mesh made by ProcMesh::spawn, CAST-11).
  std::shared_ptr<CastFence> fence;
  /// Runs `send` once casts may go (at once without a fence).
  void when_ready(UniqueFunction<void()> send) const {
    if (fence) return fence->then(std::move(send));
    send();
  }
};

/// Which members one cast reaches: (global rank in the actor base space, message rank) sorted
/// by global rank, grouped by proc (`per_proc` consecutive global ranks per proc).
struct CastPlan {
  std::vector<std::pair<size_t, uint32_t>> members;
  std::vector<uint32_t> procs;   // distinct destination procs, ascending
  std::vector<uint32_t> starts;  // procs[i]'s members: members[starts[i] .. starts[i+1])
  static CastPlan make(const ndslice::Shape& view, size_t per_proc);
};

/// Children of the tree node for procs [lo, hi): [lo+1, hi) cut into chunks of this many procs
/// (the last one may be shorter), so a node has at most `fanout` children (CAST-1).
inline uint32_t cast_chunk(uint32_t lo, uint32_t hi, size_t fanout) {
  const uint32_t n = hi - lo - 1;
  const auto f = static_cast<uint32_t>(std::min<size_t>(fanout, n == 0 ? 1 : n));
  return (n + f - 1) / f;
}

/// The comm actors a cast to base proc `p` passes through, root (proc 0) first and `p` last, in
/// a tree over `procs` procs. Depends only on (procs, fanout, p): CAST-2.
std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p);

/// One hop of a cast: the subtree of procs [lo, hi) rooted at proc lo; its destination procs are
/// plan.procs[db .. de). `parent` is the sender node's accumulator (null at the root).
struct CastHop {
  uint32_t lo = 0, hi = 0, db = 0, de = 0;
  std::shared_ptr<void> parent;
};

struct CastJobBase {
  virtual ~CastJobBase() = default;
  /// Runs hop `h` on the comm actor `comm` (its thread).
  virtual void run_node(const CastHop& h) = 0;
  /// The comm actor of `h` cannot take the cast (stopped, failed, unknown).
  virtual void fail_hop(const CastHop& h, const DeliveryFailure& f) noexcept = 0;
};

struct CastEnvelope final : Envelope {
  CastEnvelope(std::shared_ptr<CastJobBase> j, CastHop h) : job(std::move(j)), hop(std::move(h)) {}
  std::shared_ptr<CastJobBase> job;
  CastHop hop;
  void invoke(Cell&) override { job->run_node(hop); }
  void bounce(const DeliveryFailure& f) noexcept override { job->fail_hop(hop, f); }
  std::string_view endpoint() const noexcept override { return "monarch.comm::cast"; }
};

enum class CastMode { Collect, Reduce, Stream, Broadcast };

/// Accumulator of one tree node: the partial result of its own members and finished children.
template <class Partial>
struct CastNode {
  std::mutex mu;
  Partial acc{};
  size_t pending = 0;
  std::shared_ptr<CastNode> parent;
};

struct NoReducer {};

template <class A, class M, CastMode Mode, class Reducer, class... Args>
class CastJob final : public CastJobBase,
                      public std::enable_shared_from_this<CastJob<A, M, Mode, Reducer, Args...>> {
 public:
  using R = typename reply_type<typename method_traits<M>::ret>::type;
  using Out = std::conditional_t<std::is_void_v<R>, Unit, R>;
  using Partial = std::conditional_t<Mode == CastMode::Reduce, std::optional<Out>, Unit>;
  using Node = CastNode<Partial>;
  using Stored = typename method_traits<M>::stored;

  CastJob(std::shared_ptr<const std::vector<ActorRef<A>>> members,
          std::shared_ptr<const CastTopology> topo, CastPlan plan, ndslice::Extent ext, M method,
          Reducer reducer, const Args&... args)
      : members_(std::move(members)),
        topo_(std::move(topo)),
        plan_(std::move(plan)),
        ext_(std::move(ext)),
        method_(method),
        reducer_(std::move(reducer)),
        args_(Stored(args...)) {
    if constexpr (Mode == CastMode::Collect) {
      slots_.resize(plan_.members.size());
      collect_.emplace();
    }
    if constexpr (Mode == CastMode::Reduce) reduce_.emplace();
    if constexpr (Mode == CastMode::Broadcast) sender_ = CellPtr::share(current_cell());
  }

  Future<ndslice::ValueMesh<Out>> collect_future() { return collect_->get_future(); }
  Future<Out> reduce_future() { return reduce_->get_future(); }
  void set_stream(Stream<R> s) { stream_.emplace(std::move(s)); }

  /// Posts the root hop to base proc 0's comm actor (caller's thread).
  void start() {
    if (plan_.procs.empty()) {
      if constexpr (Mode == CastMode::Collect) finish(Unit{});
      return;
    }
    std::shared_ptr<void> none;
    post_hop(CastHop{0, static_cast<uint32_t>(topo_->comm.size()), 0,
                     static_cast<uint32_t>(plan_.procs.size()), none});
  }

  void run_node(const CastHop& h) override {
    if (failed_.load(std::memory_order_relaxed)) return;  // CAST-6: a failed cast stops fanning out
    std::shared_ptr<Node> node;
    if constexpr (Mode == CastMode::Collect || Mode == CastMode::Reduce) {
      node = std::make_shared<Node>();
      node->parent = std::static_pointer_cast<Node>(h.parent);
    }
    uint32_t db = h.db;
    uint32_t local_b = 0, local_e = 0;
    if (db < h.de && plan_.procs[db] == h.lo) {
      local_b = plan_.starts[db];
      local_e = plan_.starts[db + 1];
      ++db;
    }
    // CAST-1: chunk boundaries depend only on (lo, hi, fanout), never on the destinations.
    std::vector<CastHop> kids;
    const uint32_t first = h.lo + 1;
    if (first < h.hi && db < h.de) {
      const uint32_t chunk = cast_chunk(h.lo, h.hi, topo_->fanout);
      for (uint32_t clo = first; clo < h.hi && db < h.de; clo += chunk) {
        uint32_t chi = std::min(clo + chunk, h.hi);
        uint32_t x = db;
        while (x < h.de && plan_.procs[x] < chi) ++x;
        if (x > db) kids.push_back(CastHop{clo, chi, db, x, node});
        db = x;
      }
    }
    if (node) node->pending = (local_e - local_b) + kids.size();
    for (auto& k : kids) post_hop(std::move(k));
    for (uint32_t i = local_b; i < local_e; ++i) deliver(node, plan_.members[i]);
  }

  void fail_hop(const CastHop& h, const DeliveryFailure& f) noexcept override {
    if constexpr (Mode == CastMode::Stream) {
      // CAST-7: every member below the lost comm actor gets the failure as its reply.
      for (uint32_t i = plan_.starts[h.db]; i < plan_.starts[h.de]; ++i) {
        stream_add(plan_.members[i].second, Future<R>::ready_error(std::make_exception_ptr(f)));
      }
    } else if constexpr (Mode == CastMode::Broadcast) {
      Proc* p = sender_ ? &sender_->proc() : nullptr;
      if (p == nullptr && topo_->comm[h.lo].cell() != nullptr)
        p = &topo_->comm[h.lo].cell()->proc();
      monarch::detail::route_undeliverable(sender_.get(), p, f);
    } else {
      fail(std::make_exception_ptr(f));
    }
  }

 private:
  void post_hop(CastHop h) {
    const auto& comm = topo_->comm[h.lo];
    auto* e = new CastEnvelope(this->shared_from_this(), std::move(h));
    Cell* c = comm.cell();
    if (c == nullptr) {
      std::unique_ptr<Envelope> owned(e);
      e->bounce(DeliveryFailure(comm.valid() ? comm.id() : ActorId{}, "monarch.comm::cast",
                                "no comm actor for this proc"));
      return;
    }
    c->post(e);
  }

  void stream_add(size_t rank, Future<R> f) noexcept { stream_->add(rank, std::move(f)); }

  using Ret = typename method_traits<M>::ret;
  static constexpr bool kDirectReply = (Mode == CastMode::Collect || Mode == CastMode::Reduce) &&
                                       !monarch::detail::is_task<Ret>::value &&
                                       !monarch::detail::is_future<Ret>::value;

  // One member's request of a Collect/Reduce cast whose handler returns a plain value.
  struct MemberCall final : Envelope {
    MemberCall(std::shared_ptr<CastJob> j, std::shared_ptr<Node> n, const Stored& a)
        : job(std::move(j)), node(std::move(n)), args(a) {}
    std::shared_ptr<CastJob> job;
    std::shared_ptr<Node> node;
    Stored args;  // the handler may move from its own copy
    void invoke(Cell& c) override {
      A& self = static_cast<A&>(*c.actor());
      Partial p{};
      try {
        if constexpr (std::is_void_v<R>) {
          monarch::detail::apply_method(self, job->method_, args);
          if constexpr (Mode == CastMode::Collect) job->slots_[message_rank].emplace();
        } else if constexpr (Mode == CastMode::Collect) {
          job->slots_[message_rank].emplace(
              monarch::detail::apply_method(self, job->method_, args));
        } else {
          p.emplace(monarch::detail::apply_method(self, job->method_, args));
        }
      } catch (...) {
        return job->fail(std::make_exception_ptr(
            ActorError(c.id(),
                       monarch::detail::endpoint_label(
                           c.type_name(), monarch::detail::endpoint_name<A>(job->method_)),
                       monarch::detail::describe_exception(std::current_exception()))));
      }
      job->complete_one(std::move(node), std::move(p));
    }
    void bounce(const DeliveryFailure& f) noexcept override {
      job->fail(std::make_exception_ptr(f));
    }
    std::string_view endpoint() const noexcept override {
      const char* n = monarch::detail::endpoint_name<A>(job->method_);
      return n != nullptr ? n : "<endpoint>";
    }
  };

  void deliver(const std::shared_ptr<Node>& node, const std::pair<size_t, uint32_t>& m) {
    const ActorRef<A>& ref = (*members_)[m.first];
    const size_t rank = m.second;
    if constexpr (Mode == CastMode::Broadcast) {
      // Built here rather than by ref.send_ranked so that an undeliverable report goes to the
      // caster, not to this comm actor (CAST-9: the relay never fails).
      Cell* c = ref.cell();
      Proc* p = c != nullptr ? &c->proc() : (sender_ ? &sender_->proc() : nullptr);
      auto* e = std::apply(
          [&](const auto&... a) {
            return new monarch::detail::SendEnvelope<A, M>(p, method_, a...);
          },
          args_);
      e->sender = sender_;
      e->message_rank = rank;
      if (c != nullptr) return c->post(e);
      std::unique_ptr<Envelope> owned(e);
      e->bounce(DeliveryFailure(ref.valid() ? ref.id() : ActorId{}, std::string(e->endpoint()),
                                "unknown actor"));
    } else if constexpr (kDirectReply) {
      // Fast path (plain-value handlers): the member's envelope folds its reply straight into
      // the node, without a Future per member.
      auto* e = new MemberCall(this->shared_from_this(), node, args_);
      e->message_rank = rank;
      Cell* c = ref.cell();
      if (c != nullptr) return c->post(e);
      std::unique_ptr<Envelope> owned(e);
      e->bounce(DeliveryFailure(ref.valid() ? ref.id() : ActorId{}, std::string(e->endpoint()),
                                "unknown actor"));
    } else {
      auto f =
          std::apply([&](const auto&... a) { return ref.call_ranked(rank, method_, a...); }, args_);
      if constexpr (Mode == CastMode::Stream) {
        stream_add(rank, std::move(f));
      } else {
        f.on_complete([self = this->shared_from_this(), node, rank](monarch::detail::State<R>& st) {
          if (st.error) return self->fail(st.error);
          Partial p{};
          if constexpr (Mode == CastMode::Collect) {
            if constexpr (std::is_void_v<R>) {
              self->slots_[rank].emplace();
            } else {
              self->slots_[rank].emplace(std::move(*st.value));
            }
          } else {
            p.emplace(std::move(*st.value));
          }
          self->complete_one(node, std::move(p));
        });
      }
    }
  }

  // One member or child finished with partial `p`: fold it in; a node whose last input arrived
  // passes its partial to its parent (CAST-5), the root completes the caller's future.
  void complete_one(std::shared_ptr<Node> node, Partial p) {
    while (node) {
      std::unique_lock lock(node->mu);
      if constexpr (Mode == CastMode::Reduce) {
        if (p) {
          try {
            node->acc = node->acc
                            ? std::optional<Out>(std::as_const(reducer_)(std::move(*node->acc), *p))
                            : std::move(p);
          } catch (...) {
            lock.unlock();
            return fail(std::current_exception());
          }
        }
      }
      if (--node->pending != 0) return;
      p = std::move(node->acc);
      auto parent = std::move(node->parent);
      lock.unlock();
      if (!parent) return finish(std::move(p));
      node = std::move(parent);
    }
  }

  void finish(Partial p) {
    if (failed_.exchange(true)) return;
    if constexpr (Mode == CastMode::Collect) {
      std::vector<Out> out;
      out.reserve(slots_.size());
      for (auto& v : slots_) out.push_back(std::move(*v));
      collect_->set_value(ndslice::ValueMesh<Out>::from_vector(ext_, out));
    } else if constexpr (Mode == CastMode::Reduce) {
      reduce_->set_value(std::move(*p));
    }
  }

  void fail(std::exception_ptr e) noexcept {
    if (failed_.exchange(true)) return;
    if constexpr (Mode == CastMode::Collect) collect_->set_error(std::move(e));
    if constexpr (Mode == CastMode::Reduce) reduce_->set_error(std::move(e));
  }

  std::shared_ptr<const std::vector<ActorRef<A>>> members_;
  std::shared_ptr<const CastTopology> topo_;
  CastPlan plan_;
  ndslice::Extent ext_;
  M method_;
  Reducer reducer_;
  Stored args_;  // converted once to the endpoint's parameter types; copied per member
  std::atomic<bool> failed_{false};
  std::vector<std::optional<Out>> slots_;  // Collect: by message rank; each written once
  std::optional<Promise<ndslice::ValueMesh<Out>>> collect_;
  std::optional<Promise<Out>> reduce_;
  std::optional<Stream<R>> stream_;
  CellPtr sender_;  // Broadcast: undeliverable reports go to the caster
};

// ---------------------------------------------------------------------------------------------
// Casts to comm actors in other processes (CAST-10).

using RemoteCastFn = UniqueFunction<Future<std::string>(Proc&, CastWire&&)>;
/// Adds the handler for `key` unless one is there. Any thread.
void add_remote_cast(const std::string& key, std::shared_ptr<RemoteCastFn> fn);
std::shared_ptr<RemoteCastFn> find_remote_cast(const std::string& key);

inline std::string to_string_bytes(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
template <class T>
T decode_string(const std::string& s) {
  return wire::decode<T>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
}

/// A reducer travels as bytes, or as nothing when it is stateless (Sum, Min, Max, a lambda
/// without captures).
template <class Reducer>
inline constexpr bool reducer_stateless_v =
    std::is_empty_v<Reducer>&& std::is_default_constructible_v<Reducer>;
template <class Reducer>
inline constexpr bool reducer_wireable_v =
    reducer_stateless_v<Reducer> || wire::is_serializable_v<Reducer>;

template <class A, class M, CastMode Mode, class Reducer>
struct RemoteCast {
  using Stored = typename method_traits<M>::stored;
  using R = typename reply_type<typename method_traits<M>::ret>::type;
  using WireOut = std::conditional_t<std::is_void_v<R>, bool, R>;
  using Partial = std::conditional_t<Mode == CastMode::Reduce, std::optional<WireOut>,
                                     std::vector<std::pair<uint32_t, WireOut>>>;

  static constexpr bool castable = wire::is_serializable_v<Stored> &&
                                   (std::is_void_v<R> || wire::is_serializable_v<R>)&&(
                                       Mode != CastMode::Reduce || reducer_wireable_v<Reducer>);

  static std::string key(M method) {
    return wire::type_name<RemoteCast>() + "/" + monarch::detail::remote_endpoint_name<A>(method);
  }

  static std::string encode_reducer(const Reducer& r) {
    if constexpr (reducer_stateless_v<Reducer>) {
      return {};
    } else {
      return to_string_bytes(wire::encode(r));
    }
  }
  static Reducer decode_reducer(const std::string& s) {
    if constexpr (reducer_stateless_v<Reducer>) {
      return Reducer{};
    } else {
      return decode_string<Reducer>(s);
    }
  }

  /// Registers, at static initialisation, the handler of every endpoint of A (MONARCH_ENDPOINTS)
  /// whose member-function type is M. The caster's root() odr-uses it, so every process running
  /// the caster's binary (worker processes started from the client's executable) can relay and
  /// run these casts without calling register_cast itself.
  static bool register_all_of_type() {
    if constexpr (castable && monarch::detail::has_endpoints<A>::value) {
      std::apply(
          [](const auto&... e) {
            (
                [&] {
                  if constexpr (std::is_same_v<std::decay_t<decltype(e.method)>, M>) {
                    register_for(e.method);
                  }
                }(),
                ...);
          },
          A::monarch_endpoints());
    }
    return true;
  }
  inline static const bool auto_registered = register_all_of_type();

  /// Registers the handler of (A, method, Mode, Reducer) in this process (once per key).
  static std::string register_for(M method) {
    std::string k = key(method);
    if (!find_remote_cast(k)) {
      add_remote_cast(k, std::make_shared<RemoteCastFn>([method](Proc& p, CastWire&& w) {
                        return run(p, method, std::move(w));
                      }));
    }
    return k;
  }

  using Ret = typename method_traits<M>::ret;
  /// Plain-value handlers reply by folding straight into the node (no Future per member).
  static constexpr bool kDirectReply = Mode != CastMode::Broadcast &&
                                       !monarch::detail::is_task<Ret>::value &&
                                       !monarch::detail::is_future<Ret>::value;

  /// The accumulator of one node: the members on this proc and the partials of its children.
  struct NodeState {
    explicit NodeState(Reducer r) : reducer(std::move(r)) {}
    std::mutex mu;
    Partial acc{};        // guarded by mu
    bool failed = false;  // guarded by mu; also set once the result is out
    std::atomic<size_t> pending{0};
    Promise<std::string> promise;
    Reducer reducer;
    // Collect: the local members' message ranks and replies, by local index; each slot is written
    // once, by its member, before that member counts down.
    std::vector<uint32_t> local_ranks;
    std::vector<std::optional<WireOut>> local_slots;

    void fail(std::exception_ptr e) {
      std::unique_lock lock(mu);
      if (failed) return;
      failed = true;
      lock.unlock();
      promise.set_error(std::move(e));
    }
    /// A child's partial result.
    void add(Partial p) {
      {
        std::unique_lock lock(mu);
        if (failed) return;
        if (!fold(p, lock)) return;
      }
      count_down();
    }
    /// Local member `slot` replied `v`.
    void member_done(uint32_t slot, WireOut v) {
      if constexpr (Mode == CastMode::Reduce) {
        Partial p{std::move(v)};
        std::unique_lock lock(mu);
        if (failed) return;
        if (!fold(p, lock)) return;
      } else {
        local_slots[slot].emplace(std::move(v));
      }
      count_down();
    }

   private:
    // Folds p into acc under `lock`; false (lock released, cast failed) if the reducer threw.
    bool fold(Partial& p, std::unique_lock<std::mutex>& lock) {
      try {
        if constexpr (Mode == CastMode::Reduce) {
          if (p)
            acc = acc ? std::optional<WireOut>(std::as_const(reducer)(std::move(*acc), *p))
                      : std::move(p);
        } else {
          acc.insert(acc.end(), std::make_move_iterator(p.begin()),
                     std::make_move_iterator(p.end()));
        }
      } catch (...) {
        failed = true;
        lock.unlock();
        promise.set_error(std::current_exception());
        return false;
      }
      return true;
    }
    void count_down() {
      if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      std::unique_lock lock(mu);
      if (failed) return;
      failed = true;  // done: nothing more may land
      std::string out;
      try {
        if constexpr (Mode != CastMode::Reduce) {
          acc.reserve(acc.size() + local_slots.size());
          for (size_t i = 0; i < local_slots.size(); ++i) {
            if (local_slots[i]) acc.emplace_back(local_ranks[i], std::move(*local_slots[i]));
          }
        }
        out = to_string_bytes(wire::encode(acc));
      } catch (...) {
        lock.unlock();
        return promise.set_error(std::current_exception());
      }
      lock.unlock();
      promise.set_value(std::move(out));
    }
  };

  // One local member's request, for plain-value handlers: the reply goes straight into the node.
  struct MemberCall final : monarch::detail::Envelope {
    MemberCall(std::shared_ptr<NodeState> s, std::shared_ptr<const Stored> a, M m, uint32_t i)
        : st(std::move(s)), args(std::move(a)), method(m), slot(i) {}
    std::shared_ptr<NodeState> st;
    std::shared_ptr<const Stored> args;
    M method;
    uint32_t slot;
    void invoke(Cell& c) override {
      A& self = static_cast<A&>(*c.actor());
      Stored a = *args;  // the handler may move from its own copy
      try {
        if constexpr (std::is_void_v<R>) {
          monarch::detail::apply_method(self, method, a);
          st->member_done(slot, true);
        } else {
          st->member_done(slot, monarch::detail::apply_method(self, method, a));
        }
      } catch (...) {
        st->fail(std::make_exception_ptr(
            ActorError(c.id(),
                       monarch::detail::endpoint_label(c.type_name(),
                                                       monarch::detail::endpoint_name<A>(method)),
                       monarch::detail::describe_exception(std::current_exception()))));
      }
    }
    void bounce(const DeliveryFailure& f) noexcept override {
      st->fail(std::make_exception_ptr(f));
    }
    std::string_view endpoint() const noexcept override {
      const char* n = monarch::detail::endpoint_name<A>(method);
      return n != nullptr ? n : "<endpoint>";
    }
  };

  /// Runs one hop on the comm actor of `proc` (its thread): forwards to the child subtrees that
  /// hold destinations, delivers to the members on this proc, and folds their replies.
  static Future<std::string> run(Proc& proc, M method, CastWire&& w) {
    if (w.starts.size() != w.procs.size() + 1 || w.comm.size() != size_t{w.hi} - w.lo ||
        (w.starts.empty() ? false : w.starts.back() != w.runs.size())) {
      return Future<std::string>::ready_error(std::make_exception_ptr(
          UsageError("comm actor of " + proc.name() + ": malformed cast hop [" +
                     std::to_string(w.lo) + ", " + std::to_string(w.hi) + ")")));
    }
    auto args = std::make_shared<const Stored>(decode_string<Stored>(w.args));
    auto st = std::make_shared<NodeState>(decode_reducer(w.reducer));
    auto result = st->promise.get_future();
    const uint32_t de = static_cast<uint32_t>(w.procs.size());
    uint32_t db = 0;
    uint32_t lb = 0, le = 0;  // this proc's runs
    if (db < de && w.procs[0] == w.lo) {
      lb = w.starts[0];
      le = w.starts[1];
      db = 1;
    }
    std::vector<std::pair<ActorId, CastWire>> kids;
    if (w.lo + 1 < w.hi && db < de) {
      const uint32_t chunk = cast_chunk(w.lo, w.hi, w.fanout);
      for (uint32_t clo = w.lo + 1; clo < w.hi && db < de; clo += chunk) {
        const uint32_t chi = std::min(clo + chunk, w.hi);
        uint32_t x = db;
        while (x < de && w.procs[x] < chi) ++x;
        if (x > db) {
          CastWire sub;
          sub.handler = w.handler;
          sub.args = w.args;
          sub.reducer = w.reducer;
          sub.lo = clo;
          sub.hi = chi;
          sub.fanout = w.fanout;
          sub.comm.assign(w.comm.begin() + (clo - w.lo), w.comm.begin() + (chi - w.lo));
          sub.procs.assign(w.procs.begin() + db, w.procs.begin() + x);
          for (uint32_t i = db; i <= x; ++i) sub.starts.push_back(w.starts[i] - w.starts[db]);
          sub.names = w.names;
          sub.runs.assign(w.runs.begin() + w.starts[db], w.runs.begin() + w.starts[x]);
          kids.emplace_back(w.comm[clo - w.lo], std::move(sub));
        }
        db = x;
      }
    }
    size_t local = 0;
    for (uint32_t i = lb; i < le; ++i) local += w.runs[i].count;
    if constexpr (Mode != CastMode::Reduce && Mode != CastMode::Broadcast) {
      st->local_ranks.reserve(local);
      for (uint32_t i = lb; i < le; ++i) {
        for (uint32_t k = 0; k < w.runs[i].count; ++k)
          st->local_ranks.push_back(w.runs[i].rank + k);
      }
      st->local_slots.resize(local);
    }
    // Set before anything is sent: replies may land (on other threads) while we still send.
    const size_t pending = local + kids.size();
    st->pending.store(pending, std::memory_order_relaxed);
    for (auto& [id, sub] : kids) {
      ActorRef<CommActor> child(&proc, id, true);
      if constexpr (Mode == CastMode::Broadcast) {
        child.send(&CommActor::cast_send, std::move(sub));
      } else {
        child.call(&CommActor::cast, std::move(sub)).on_complete([st](State<std::string>& s) {
          if (s.error) return st->fail(s.error);
          try {
            st->add(decode_string<Partial>(*s.value));
          } catch (...) {
            st->fail(std::current_exception());
          }
        });
      }
    }
    ActorId id{proc.name(), {}, 0};  // reused: no allocation per member
    uint32_t slot = 0;
    for (uint32_t i = lb; i < le; ++i) {
      const MemberRun& run = w.runs[i];
      if (run.name >= w.names.size()) {
        st->fail(std::make_exception_ptr(
            UsageError("comm actor of " + proc.name() + ": malformed cast hop (name index)")));
        break;
      }
      id.name = w.names[run.name];
      for (uint32_t k = 0; k < run.count; ++k, ++slot) {
        id.uid = run.uid + k;
        const uint32_t rank = run.rank + k;
        if constexpr (kDirectReply) {
          auto* e = new MemberCall(st, args, method, slot);
          e->message_rank = rank;
          ActorRef<A> ref = proc.resolve<A>(id);
          if (Cell* c = ref.cell()) {
            c->post(e);
          } else {
            std::unique_ptr<monarch::detail::Envelope> owned(e);
            e->bounce(DeliveryFailure(id, std::string(e->endpoint()), "unknown actor"));
          }
          continue;
        }
        ActorRef<A> ref = proc.resolve<A>(id);
        if constexpr (Mode == CastMode::Broadcast) {
          std::apply([&](const auto&... a) { ref.send_ranked(rank, method, a...); }, *args);
        } else {
          auto f = std::apply([&](const auto&... a) { return ref.call_ranked(rank, method, a...); },
                              *args);
          f.on_complete([st, slot](State<R>& s) {
            if (s.error) return st->fail(s.error);
            if constexpr (std::is_void_v<R>) {
              st->member_done(slot, true);
            } else {
              st->member_done(slot, std::move(*s.value));
            }
          });
        }
      }
    }
    if (pending == 0 || Mode == CastMode::Broadcast) {
      return Future<std::string>::ready_value(std::string());
    }
    return result;
  }

  /// The root hop, from the caster: one message to base proc 0's comm actor (CAST-1).
  /// Throws UsageError when a member is not on the proc of the comm actor that serves it.
  template <class... Args>
  static CastWire root(const std::vector<ActorRef<A>>& members, const CastTopology& topo,
                       const CastPlan& plan, M method, const Reducer& reducer,
                       const Args&... args) {
    CastWire w;
    (void)auto_registered;  // static registration in every process of this binary
    w.handler = register_for(method);
    w.args = to_string_bytes(wire::encode(Stored(args...)));
    w.reducer = encode_reducer(reducer);
    w.lo = 0;
    w.hi = static_cast<uint32_t>(topo.comm.size());
    w.fanout = topo.fanout;
    w.comm.reserve(topo.comm.size());
    for (const auto& c : topo.comm) w.comm.push_back(c.id());
    w.procs = plan.procs;
    w.starts.reserve(plan.starts.size());
    w.starts.push_back(0);
    for (size_t pi = 0; pi < plan.procs.size(); ++pi) {
      const std::string& proc = w.comm[plan.procs[pi]].proc;
      for (uint32_t i = plan.starts[pi]; i < plan.starts[pi + 1]; ++i) {
        const auto& [g, r] = plan.members[i];
        const ActorId& id = members[g].id();
        if (id.proc != proc) {
          throw UsageError("cast: member " + id.to_string() + " is not on proc " + proc +
                           " whose comm actor serves it");
        }
        uint32_t name = 0;
        while (name < w.names.size() && w.names[name] != id.name) ++name;
        if (name == w.names.size()) w.names.push_back(id.name);
        if (w.runs.size() > w.starts.back()) {
          MemberRun& last = w.runs.back();
          if (last.name == name && last.uid + last.count == id.uid && last.rank + last.count == r) {
            ++last.count;
            continue;
          }
        }
        w.runs.push_back(MemberRun{name, 1, id.uid, r});
      }
      w.starts.push_back(static_cast<uint32_t>(w.runs.size()));
    }
    return w;
  }
};

/// UsageError for an adverb whose endpoint, reply or reducer cannot cross processes.
[[noreturn]] void throw_not_castable(const char* adverb, const std::string& what);

}  // namespace detail

/// Makes casts of (A, method, reducer) runnable by the comm actors of THIS process. Casters
/// register what they send automatically; a worker process started from another binary calls
/// this for each endpoint (and reducer) it is cast, e.g. register_cast<Worker>(&Worker::step,
/// Sum{}). Static errors name what cannot be serialised.
template <class A, class M, class Reducer = detail::NoReducer>
void register_cast(M method, Reducer = {}) {
  using Call = detail::RemoteCast<A, M, detail::CastMode::Collect, detail::NoReducer>;
  static_assert(wire::is_serializable_v<typename Call::Stored>,
                "register_cast: the endpoint's argument types must be serialisable with cereal");
  static_assert(std::is_void_v<typename Call::R> || wire::is_serializable_v<typename Call::R>,
                "register_cast: the endpoint's reply type must be serialisable with cereal");
  static_assert(detail::reducer_wireable_v<Reducer>,
                "register_cast: the reducer must be stateless (Sum, Min, Max, a lambda without "
                "captures) or serialisable with cereal");
  Call::register_for(method);
  detail::RemoteCast<A, M, detail::CastMode::Broadcast, detail::NoReducer>::register_for(method);
  if constexpr (!std::is_same_v<Reducer, detail::NoReducer>) {
    detail::RemoteCast<A, M, detail::CastMode::Reduce, Reducer>::register_for(method);
  }
}

}  // namespace monarch::mesh
