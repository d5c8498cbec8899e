// ActorMesh<A>: actors of type A on the procs of a ProcMesh (one per proc, or several as an extra
// trailing dim, ProcMesh::spawn), addressed as a whole or through slices.
//
//   auto procs = monarch::mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 4}});
//   auto workers = procs.spawn<Worker>("worker");             // does not block
//   auto all = workers.call(&Worker::step, 3).get();          // ValueMesh<int> over {hosts, gpus}
//   int one = workers.slice("hosts", 0).slice("gpus", 1).call_one(&Worker::step, 3).get();
//   workers.slice("gpus", ndslice::Range(0, 2)).broadcast(&Worker::reset);
//
// Adverbs (docs/design.md, "Vocabulary"):
//   call      every member; Future<ValueMesh<R>> indexed by the view's points. If any member fails,
//             the future fails with that member's error (ActorError / DeliveryFailure).
//   call_one  the view must hold exactly one member (UsageError otherwise).
//   choose    one member picked at random.
//   stream    every member; replies in arrival order, as (local rank, value) pairs.
//   broadcast every member, fire and forget (a failing handler fails that actor: supervision).
//   reduce    every member; replies combined with an associative reducer (Sum, Min, Max, any
//             R(R, R)); the caller receives one value.
// A cast behaves exactly like one message per member from the caller (same per-pair FIFO, even
// across different slices; no atomicity across members). Inside a handler, Context::message_rank()
// is the receiver's local rank in the view the message was cast to.
//
// Cast tree (docs/cast-tree.md, CAST-1..11): call, reduce, stream and broadcast go as ONE message
// to the comm actor of base proc 0, which relays it down a fixed tree of per-proc comm actors of
// bounded fan-out; replies are folded at every node, so the caller receives one message. call_one
// and choose message their member directly (not ordered with casts, CAST-4). Results complete on
// runtime threads (never the caller's); Future continuations follow future.hpp's rules.
//
// Status: in-process meshes (ProcMesh::local) and meshes of remote refs (attach / from_ids) whose
// comm actors relay over channels; process meshes (process.hpp) use the latter. Across processes
// stream calls each member directly instead of going through the tree.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/cast.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

/// Reducers for ActorMesh::reduce: associative combines of two replies.
struct Sum {
  template <class T>
  T operator()(T a, const T& b) const {
    return a += b;
  }
};
struct Min {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return a < b ? b : a;
  }
};

template <class A>
class ActorMesh {
 public:
  ActorMesh() = default;
  /// Internal: members by global rank of the actor base space (`per_proc` consecutive ranks per
  /// base proc), the view, and the comm actors of the ProcMesh (null: members are reached
  /// directly from the caller).
  ActorMesh(std::shared_ptr<const std::vector<ActorRef<A>>> members, ndslice::Shape view,
            std::shared_ptr<const detail::CastTopology> topo = nullptr, size_t per_proc = 1)
      : members_(std::move(members)),
        view_(std::move(view)),
        topo_(std::move(topo)),
        per_proc_(per_proc) {}

  const ndslice::Shape& shape() const { return view_; }
  const ndslice::Extent& extent() const { return view_.extent(); }
  size_t size() const { return view_.num_ranks(); }
  /// Members per proc (the product of the per-proc dims given to ProcMesh::spawn; 1 without).
  size_t per_proc() const { return per_proc_; }

  /// Views (see ndslice::Shape::slice): the dim is dropped (index) or restricted (range).
  ActorMesh slice(std::string_view dim, size_t index) const {
    return {members_, view_.slice(dim, index), topo_, per_proc_};
  }
  ActorMesh slice(std::string_view dim, const ndslice::Range& r) const {
    return {members_, view_.slice(dim, r), topo_, per_proc_};
  }

  /// The member at local rank `local` of this view.
  const ActorRef<A>& at(size_t local) const { return (*members_)[view_.global_rank(local)]; }

  /// Every member; Future<ValueMesh<R>> (ValueMesh<Unit> for void endpoints) indexed by the
  /// view's points. Fails with the first member error (ActorError naming the member, or
  /// DeliveryFailure naming the member or comm actor that could not be reached).
  template <class M, class... Args>
  auto call(M method, const Args&... args) const {
    detail::check_endpoint<A, M, const Args&...>();
    if (topo_ && topo_->remote && size() > 0) return remote_call(method, args...);
    auto job = make_job<detail::CastMode::Collect>(method, detail::NoReducer{}, args...);
    auto f = job->collect_future();
    job->start();
    return f;
  }

  /// Every member; the replies are combined with `reducer` (any associative R(R, R), e.g. Sum,
  /// Min, Max) inside the cast tree, so the caller receives one value. Fails with the first
  /// member error; UsageError on an empty view. Combination order is unspecified: the reducer
  /// must be associative and commutative, and callable as const from several threads at once.
  template <class Reducer, class M, class... Args>
  auto reduce(Reducer reducer, M method, const Args&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    static_assert(!std::is_void_v<R>, "reduce: the endpoint must return a value");
    static_assert(std::is_invocable_r_v<R, const Reducer&, R, const R&>,
                  "reduce: the reducer must be callable as const with (R, const R&) and return R "
                  "(no mutable lambdas: tree nodes call it concurrently)");
    detail::check_endpoint<A, M, const Args&...>();
    if (size() == 0)
      throw UsageError("reduce: the mesh view " + extent().to_string() + " is empty");
    if (topo_ && topo_->remote) return remote_reduce(std::move(reducer), method, args...);
    auto job = make_job<detail::CastMode::Reduce>(method, std::move(reducer), args...);
    auto f = job->reduce_future();
    job->start();
    return f;
  }

  template <class M, class... Args>
  auto call_one(M method, Args&&... args) const {
    if (size() != 1) {
      throw UsageError(
          "call_one: mesh " +
          (size() > 0 ? "'" + at(0).id().name + "' "
                      : (members_ && !members_->empty() ? "'" + members_->front().id().name + "' "
                                                        : std::string())) +
          "view " + extent().to_string() + " has " + std::to_string(size()) +
          " members; slice it down to exactly one");
    }
    return at(0).call_ranked(0, method, std::forward<Args>(args)...);
  }

  template <class M, class... Args>
  auto choose(M method, Args&&... args) const {
    if (size() == 0)
      throw UsageError("choose: mesh " +
                       (members_ && !members_->empty() ? "'" + members_->front().id().name + "' "
                                                       : std::string()) +
                       "view " + extent().to_string() + " is empty");
    thread_local std::mt19937_64 rng{std::random_device{}()};
    size_t i = std::uniform_int_distribution<size_t>(0, size() - 1)(rng);
    return at(i).call_ranked(i, method, std::forward<Args>(args)...);
  }

  /// Every member; Stream::next() hands out each member's (already completed) reply future in
  /// the order the replies arrive, with the member's local rank. A comm actor that cannot be
  /// reached gives each member below it a DeliveryFailure reply (CAST-7). On a mesh of procs in
  /// other processes the members are called directly (not through the tree; see CAST-4).
  template <class M, class... Args>
  auto stream(M method, const Args&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    detail::check_endpoint<A, M, const Args&...>();
    Stream<R> out(size());
    if (topo_ && topo_->remote) {
      // Across processes each member replies straight to the caller (its rank travels with the
      // call), so a stream is not ordered with tree casts to the same member (CAST-4).
      for (size_t i = 0; i < size(); ++i) out.add(i, at(i).call_ranked(i, method, args...));
      return out;
    }
    auto job = make_job<detail::CastMode::Stream>(method, detail::NoReducer{}, args...);
    job->set_stream(out);
    job->start();
    return out;
  }

  /// Every member, fire and forget (a failing handler fails that actor: supervision). A member
  /// or comm actor that cannot be reached is reported to the caster's undeliverable() (or the
  /// fault hook of the caster's Proc outside actors), as for ActorRef::send.
  template <class M, class... Args>
  void broadcast(M method, const Args&... args) const {
    detail::check_endpoint<A, M, const Args&...>();
    if (topo_ && topo_->remote && size() > 0) {
      using RC = detail::RemoteCast<A, M, detail::CastMode::Broadcast, detail::NoReducer>;
      if constexpr (!RC::castable) {
        detail::throw_not_castable("broadcast", "the endpoint's arguments are");
      } else {
        auto plan = detail::CastPlan::make(view_, per_proc_);
        topo_->when_ready(
            [comm = topo_->comm[0], w = RC::root(*members_, *topo_, plan, method,
                                                 detail::NoReducer{}, args...)]() mutable {
              comm.send(&CommActor::cast_send, std::move(w));
            });
        return;
      }
    }
    make_job<detail::CastMode::Broadcast>(method, detail::NoReducer{}, args...)->start();
  }

  /// This mesh as seen from `client`, a listening Proc in another process (or in this one, for
  /// tests): members and comm actors become remote refs, and casts travel as CastWire between
  /// comm actors (CAST-10). Reducers must then be stateless or serialisable.
  ActorMesh attach(Proc& client) const {
    std::vector<ActorId> members, comm;
    members.reserve(members_->size());
    for (const auto& m : *members_) members.push_back(m.valid() ? m.id() : ActorId{});
    if (!topo_) throw UsageError("ActorMesh::attach: this mesh has no cast tree");
    for (const auto& c : topo_->comm) comm.push_back(c.id());
    return from_ids(client, members, view_, comm, topo_->fanout, per_proc_);
  }

  /// A mesh of actors in other processes, for a process allocator: `members` by global rank of
  /// the actor base space (`per_proc` consecutive ranks per base proc), `comm` the comm actor of
  /// each base proc (detail::install_comm), `view` over the actor base space.
  /// `fence`: casts wait for it (CAST-11; set by ProcMesh::spawn).
  static ActorMesh from_ids(Proc& client, const std::vector<ActorId>& members, ndslice::Shape view,
                            const std::vector<ActorId>& comm, size_t fanout, size_t per_proc,
                            std::shared_ptr<detail::CastFence> fence = nullptr) {
    auto refs = std::make_shared<std::vector<ActorRef<A>>>();
    refs->reserve(members.size());
    for (const auto& id : members) refs->emplace_back(&client, id, true);
    auto topo = std::make_shared<detail::CastTopology>();
    topo->fanout = fanout;
    topo->remote = true;
    topo->fence = std::move(fence);
    for (const auto& id : comm) topo->comm.emplace_back(&client, id, true);
    return ActorMesh(std::move(refs), std::move(view), std::move(topo), per_proc);
  }

 private:
  template <class M, class... Args>
  auto remote_call(M method, const Args&... args) const
      -> Future<ndslice::ValueMesh<std::conditional_t<
          std::is_void_v<typename detail::reply_type<typename detail::method_traits<M>::ret>::type>,
          Unit, typename detail::reply_type<typename detail::method_traits<M>::ret>::type>>> {
    using RC = detail::RemoteCast<A, M, detail::CastMode::Collect, detail::NoReducer>;
    using R = typename RC::R;
    using Out = std::conditional_t<std::is_void_v<R>, Unit, R>;
    if constexpr (!RC::castable) {
      detail::throw_not_castable("call", "the endpoint's arguments or reply are");
    } else {
      auto plan = detail::CastPlan::make(view_, per_proc_);
      Promise<ndslice::ValueMesh<Out>> p;
      auto f = p.get_future();
      auto on_reply = [p = std::move(p), ext = extent()](detail::State<std::string>& s) mutable {
        if (s.error) return p.set_error(s.error);
        try {
          auto parts = detail::decode_string<typename RC::Partial>(*s.value);
          std::vector<std::optional<Out>> slots(ext.num_ranks());
          for (auto& [r, v] : parts) {
            if constexpr (std::is_void_v<R>) {
              slots.at(r).emplace();
            } else {
              slots.at(r).emplace(std::move(v));
            }
          }
          std::vector<Out> out;
          out.reserve(slots.size());
          for (size_t r = 0; r < slots.size(); ++r) {
            if (!slots[r])
              throw Error("cast: no reply from member " + std::to_string(r) + " of " +
                          ext.to_string());
            out.push_back(std::move(*slots[r]));
          }
          p.set_value(ndslice::ValueMesh<Out>::from_vector(ext, out));
        } catch (...) {
          p.set_error(std::current_exception());
        }
      };
      send_cast(RC::root(*members_, *topo_, plan, method, detail::NoReducer{}, args...),
                std::move(on_reply));
      return f;
    }
  }

  template <class Reducer, class M, class... Args>
  auto remote_reduce(Reducer reducer, M method, const Args&... args) const
      -> Future<typename detail::reply_type<typename detail::method_traits<M>::ret>::type> {
    using RC = detail::RemoteCast<A, M, detail::CastMode::Reduce, Reducer>;
    using R = typename RC::R;
    if constexpr (!RC::castable) {
      detail::throw_not_castable("reduce", "the endpoint's arguments, reply or the reducer are");
    } else {
      auto plan = detail::CastPlan::make(view_, per_proc_);
      Promise<R> p;
      auto f = p.get_future();
      auto on_reply = [p = std::move(p), ext = extent()](detail::State<std::string>& s) mutable {
        if (s.error) return p.set_error(s.error);
        try {
          auto v = detail::decode_string<typename RC::Partial>(*s.value);
          if (!v) throw Error("reduce: no reply from the members of " + ext.to_string());
          p.set_value(std::move(*v));
        } catch (...) {
          p.set_error(std::current_exception());
        }
      };
      send_cast(RC::root(*members_, *topo_, plan, method, reducer, args...), std::move(on_reply));
      return f;
    }
  }

  // The root hop of a remote call/reduce; on_reply gets the root's reply (CAST-10, CAST-11).
  template <class OnReply>
  void send_cast(CastWire w, OnReply on_reply) const {
    topo_->when_ready(
        [comm = topo_->comm[0], w = std::move(w), on_reply = std::move(on_reply)]() mutable {
          comm.call(&CommActor::cast, std::move(w)).on_complete(std::move(on_reply));
        });
  }

  template <detail::CastMode Mode, class M, class Reducer, class... Args>
  auto make_job(M method, Reducer reducer, const Args&... args) const {
    if (!topo_)
      throw UsageError("ActorMesh: this mesh has no cast tree (it was not spawned by a ProcMesh)");
    using Job = detail::CastJob<A, M, Mode, Reducer, std::decay_t<Args>...>;
    return std::make_shared<Job>(members_, topo_, detail::CastPlan::make(view_, per_proc_),
                                 extent(), method, std::move(reducer), args...);
  }

  std::shared_ptr<const std::vector<ActorRef<A>>> members_;
  ndslice::Shape view_;
  std::shared_ptr<const detail::CastTopology> topo_;
  size_t per_proc_ = 1;
};

}  // namespace monarch::mesh
