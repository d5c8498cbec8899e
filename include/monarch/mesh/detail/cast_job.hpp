// The cast tree in process (monarch/mesh/cast.hpp, CAST-1..9): one CastJob per cast, its nodes run
// on the comm actors of the procs it passes through and hand shared C++ objects to each other (no
// serialisation). ActorMesh's adverbs (actor_mesh.hpp) make the jobs.
//
// Include monarch/mesh/cast.hpp rather than this. cast.hpp includes this header at its end; the
// include of cast.hpp below puts its public types (CastWire, CommActor, Stream) first whichever
// of the two a file includes, hence an include guard after it rather than #pragma once.
#include "monarch/mesh/cast.hpp"

#ifndef MONARCH_MESH_DETAIL_CAST_JOB_HPP
#define MONARCH_MESH_DETAIL_CAST_JOB_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/detail/cast_tree.hpp"
#include "monarch/mesh/detail/member_call.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh::detail {

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
  void arrive();
  /// Runs `f` now when open, else on the thread of the last arrival (a channel I/O thread),
  /// after every function given before it: also one given while the last arrival is still
  /// running the held ones (then it joins their queue), so no cast overtakes an earlier one.
  void then(UniqueFunction<void()> f);

 private:
  std::mutex mu_;
  size_t left_;
  bool draining_ = false;  // the last arrival is running waiting_: then() queues behind it
  std::deque<UniqueFunction<void()>> waiting_;
};

/// What an actor mesh knows of its procs' lifetime, shared with their owner, which sets the flags.
struct MeshLifetime {
  /// ProcMesh::stop() (or its last view's destructor) began: the procs were asked to exit.
  std::shared_ptr<const std::atomic<bool>> stopped;
  /// The Procs the mesh's refs point into (ProcMesh::local's procs, a process mesh's client
  /// Proc) were shut down and are freed next: nothing may use the refs any more.
  std::shared_ptr<const std::atomic<bool>> gone;
  std::string mesh;  ///< the proc mesh's name, for errors
};

/// The comm actors of a ProcMesh by base proc rank, and the tree's fan-out. Shared, immutable.
struct CastTopology {
  std::vector<ActorRef<CommActor>> comm;
  size_t fanout = 16;
  /// The comm actors are in other processes (remote refs, from `client`): casts go as CastWire.
  bool remote = false;
  /// Remote casts wait for it when set (a mesh made by ProcMesh::spawn, CAST-11).
  std::shared_ptr<CastFence> fence;
  /// The caster's Proc (remote meshes): what it knows of dead procs steers the tree (CAST-12).
  Proc* client = nullptr;
  /// Whether the procs are still there (null flags: not tracked, e.g. ActorMesh::attach).
  MeshLifetime life;
  /// Runs `send` once casts may go (at once without a fence).
  void when_ready(UniqueFunction<void()> send) const;
  /// The procs of this tree whose Proc the client declared failed (Proc::proc_failure), with
  /// their causes. Empty for in-process meshes. O(1) while the client knows of no failure at all.
  DeadProcs dead() const;
};

/// Which members one cast reaches: (global rank in the actor base space, message rank) sorted
/// by global rank, grouped by proc (`per_proc` consecutive global ranks per proc).
struct CastPlan {
  std::vector<std::pair<size_t, uint32_t>> members;
  std::vector<uint32_t> procs;   // distinct destination procs, ascending
  std::vector<uint32_t> starts;  // procs[i]'s members: members[starts[i] .. starts[i+1])
  static CastPlan make(const ndslice::Shape& view, size_t per_proc);
  /// The members at these global ranks (ascending), message rank = index.
  static CastPlan make(const std::vector<size_t>& globals, size_t per_proc);
  /// This plan without the members on `dead` procs; `lost` receives (message rank, global rank,
  /// dead proc) for each member taken out.
  template <class Lost>
  CastPlan without(const DeadProcs& dead, Lost&& lost) const {
    CastPlan out;
    for (size_t i = 0; i < procs.size(); ++i) {
      const bool gone = dead.has(procs[i]);
      if (!gone) {
        out.procs.push_back(procs[i]);
        out.starts.push_back(static_cast<uint32_t>(out.members.size()));
      }
      for (uint32_t m = starts[i]; m < starts[i + 1]; ++m) {
        if (gone) {
          lost(members[m].second, members[m].first, procs[i]);
        } else {
          out.members.push_back(members[m]);
        }
      }
    }
    out.starts.push_back(static_cast<uint32_t>(out.members.size()));
    return out;
  }
};

/// One hop of a cast: the subtree of procs [lo, hi) rooted at proc lo; its destination procs are
/// plan.procs[db .. de). `parent` is the sender node's accumulator (null at the root).
struct CastHop : CastSpan {
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
  using R = cast_reply_t<M>;
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
      errors_.resize(plan_.members.size());
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
    post_hop(CastHop{{0, static_cast<uint32_t>(topo_->comm.size()), 0,
                      static_cast<uint32_t>(plan_.procs.size())},
                     nullptr});
  }

  void run_node(const CastHop& h) override {
    if (failed_.load(std::memory_order_relaxed)) return;  // CAST-6: a failed cast stops fanning out
    std::shared_ptr<Node> node;
    if constexpr (Mode == CastMode::Collect || Mode == CastMode::Reduce) {
      node = std::make_shared<Node>();
      node->parent = std::static_pointer_cast<Node>(h.parent);
    }
    std::vector<CastHop> kids;
    const bool local = plan_cast_node(h, topo_->fanout, plan_.procs, [&](const CastSpan& s) {
      kids.push_back(CastHop{s, node});
    });
    uint32_t local_b = 0, local_e = 0;
    if (local) {
      local_b = plan_.starts[h.db];
      local_e = plan_.starts[h.db + 1];
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
    } else if constexpr (Mode == CastMode::Collect) {
      // CAST-6: each member below the lost comm actor holds the failure; the rest answer.
      auto e = std::make_exception_ptr(f);
      for (uint32_t i = plan_.starts[h.db]; i < plan_.starts[h.de]; ++i)
        errors_[plan_.members[i].second] = e;
      hop_done(h);
    } else {
      fail(std::make_exception_ptr(f));
    }
  }

 private:
  // Hop `h` is accounted for without running (its comm actor is gone): its parent node counts
  // it as one finished child.
  void hop_done(const CastHop& h) noexcept {
    if (!h.parent) return finish(Partial{});
    complete_one(std::static_pointer_cast<Node>(h.parent), Partial{});
  }

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

  static constexpr bool kDirectReply =
      (Mode == CastMode::Collect || Mode == CastMode::Reduce) && member_replies_directly_v<M>;

  // Where a Collect/Reduce member's reply goes: its slot (collect) or its node's partial.
  struct Reply {
    std::shared_ptr<CastJob> job;
    std::shared_ptr<Node> node;
    size_t rank;
    const Stored& args() const { return job->args_; }
    template <class... V>
    void done(V&&... v) {
      job->member_done(std::move(node), rank, std::forward<V>(v)...);
    }
    void fail(std::exception_ptr e) const noexcept {
      if constexpr (Mode == CastMode::Collect) {
        job->member_failed(node, rank, std::move(e));
      } else {
        job->fail(std::move(e));
      }
    }
  };
  using Call = MemberCall<A, M, Reply>;

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
      post_or_bounce(c, e, ref.valid() ? &ref.id() : nullptr);
    } else if constexpr (kDirectReply) {
      // Fast path (plain-value handlers): the member's envelope folds its reply straight into
      // the node, without a Future per member.
      auto* e = new Call(Reply{this->shared_from_this(), node, rank}, method_);
      e->message_rank = rank;
      post_or_bounce(ref.cell(), e, ref.valid() ? &ref.id() : nullptr);
    } else {
      auto f =
          std::apply([&](const auto&... a) { return ref.call_ranked(rank, method_, a...); }, args_);
      if constexpr (Mode == CastMode::Stream) {
        stream_add(rank, std::move(f));
      } else {
        f.on_complete([self = this->shared_from_this(), node, rank](State<R>& st) {
          if (st.error) {
            if constexpr (Mode == CastMode::Collect) {
              return self->member_failed(node, rank, st.error);
            } else {
              return self->fail(st.error);
            }
          }
          if constexpr (std::is_void_v<R>) {
            self->member_done(node, rank);
          } else {
            self->member_done(node, rank, std::move(*st.value));
          }
        });
      }
    }
  }

  // Member `rank` replied (v: nothing for a void handler, else its value).
  template <class... V>
  void member_done(std::shared_ptr<Node> node, size_t rank, V&&... v) {
    Partial p{};
    if constexpr (Mode == CastMode::Collect) {
      slots_[rank].emplace(std::forward<V>(v)...);
    } else if constexpr (sizeof...(V) != 0) {
      p.emplace(std::forward<V>(v)...);
    }
    complete_one(std::move(node), std::move(p));
  }

  // Member `rank` failed (Collect): its slot holds the error, the others still answer (CAST-6).
  void member_failed(std::shared_ptr<Node> node, size_t rank, std::exception_ptr e) noexcept {
    errors_[rank] = std::move(e);
    complete_one(std::move(node), Partial{});
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
      std::vector<std::pair<size_t, std::exception_ptr>> failures;
      for (size_t r = 0; r < errors_.size(); ++r) {
        if (errors_[r]) failures.emplace_back(r, std::move(errors_[r]));
      }
      try {
        collect_->set_value(
            ndslice::ValueMesh<Out>::from_slots(ext_, std::move(slots_), std::move(failures)));
      } catch (...) {
        collect_->set_error(std::current_exception());
      }
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
  std::vector<std::optional<Out>> slots_;   // Collect: by message rank; each written once
  std::vector<std::exception_ptr> errors_;  // Collect: a failed member's error, by message rank
  std::optional<Promise<ndslice::ValueMesh<Out>>> collect_;
  std::optional<Promise<Out>> reduce_;
  std::optional<Stream<R>> stream_;
  CellPtr sender_;  // Broadcast: undeliverable reports go to the caster
};

}  // namespace monarch::mesh::detail

#endif  // MONARCH_MESH_DETAIL_CAST_JOB_HPP
