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
//   call      every member; Future<ValueMesh<R>> indexed by the view's points. A member that
//             fails holds its error in its rank (ActorError, DeliveryFailure, SupervisionError for
//             a proc known dead: at once, without sending); the others hold their values
//             (ValueMesh::ok / error / throw_if_failed; reading a failed rank rethrows its error).
//   call_one  the view must hold exactly one member (UsageError otherwise).
//   choose    one member picked at random among those whose proc is not known dead (a
//             SupervisionError when every proc is).
//   stream    every member; replies in arrival order, as (local rank, value) pairs.
//   broadcast every member, fire and forget (a failing handler fails that actor: supervision).
//   reduce    every member; replies combined with an associative reducer (Sum, Min, Max, any
//             R(R, R)); the caller receives one value. Fails with the first member error, and at
//             once (SupervisionError naming the rank) when the view holds a proc known dead.
// A broadcast to a view holding a proc known dead throws SupervisionError at once (nothing sent),
// like ActorRef::send to a failed proc. survivors() and select() give views of the live members.
// A cast behaves exactly like one message per member from the caller (same per-pair FIFO, even
// across different slices; no atomicity across members). Inside a handler, Context::message_rank()
// is the receiver's local rank in the view the message was cast to.
//
// Cast tree (docs/cast-tree.md, CAST-1..12): call, reduce, stream and broadcast go as ONE message
// to the comm actor of base proc 0 (to its live descendants when proc 0 is dead, CAST-12), which
// relays it down a fixed tree of per-proc comm actors of bounded fan-out; replies are folded at
// every node, so the caller receives one message. call_one and choose message their member directly
// (not ordered with casts, CAST-4). Results complete on runtime threads (never the caller's);
// Future continuations follow future.hpp's rules.
//
// Status: in-process meshes (ProcMesh::local) and meshes of remote refs (attach / from_ids) whose
// comm actors relay over channels; process meshes (process.hpp) use the latter. Across processes
// stream calls each member directly instead of going through the tree.
#pragma once

#include <atomic>
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
#include "monarch/ndslice/selection.hpp"

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

  /// The view's shape. For a view made by select() or survivors() (not rectangular in general):
  /// a dense shape over extent() = {"ranks": size()}; parent_point(i) says where member i sits.
  const ndslice::Shape& shape() const { return pick_ ? pick_->shape : view_; }
  const ndslice::Extent& extent() const { return shape().extent(); }
  /// Members in this view; 0 for a default-constructed mesh.
  size_t size() const {
    if (!members_) return 0;
    return pick_ ? pick_->globals.size() : view_.num_ranks();
  }
  /// Members per proc (the product of the per-proc dims given to ProcMesh::spawn; 1 without).
  size_t per_proc() const { return per_proc_; }

  /// Views (see ndslice::Shape::slice): the dim is dropped (index) or restricted (range).
  /// Throws UsageError on a select()/survivors() view (slice first, then select).
  ActorMesh slice(std::string_view dim, size_t index) const {
    check_rectangular("slice");
    return {members_, view_.slice(dim, index), topo_, per_proc_};
  }
  ActorMesh slice(std::string_view dim, const ndslice::Range& r) const {
    check_rectangular("slice");
    return {members_, view_.slice(dim, r), topo_, per_proc_};
  }

  /// This mesh under another view of the same members: `v` must come from shape() by Shape
  /// operations (slice, split, flatten, rename), so that its global ranks are members of this
  /// mesh. The front ends' mesh algebra (Python's split/flatten/rename) goes through it. Throws
  /// UsageError on a select()/survivors() view, or when `v` holds a rank outside the mesh.
  ActorMesh with_view(ndslice::Shape v) const {
    check_rectangular("with_view");
    const size_t n = members_ ? members_->size() / per_proc_ : 0;
    for (size_t i = 0; i < v.num_ranks(); ++i) {
      if (v.global_rank(i) >= n * per_proc_) {
        throw UsageError("with_view: view " + v.to_string() + " holds rank " +
                         std::to_string(v.global_rank(i)) + ", outside the mesh's " +
                         std::to_string(n * per_proc_) + " members");
      }
    }
    return {members_, std::move(v), topo_, per_proc_};
  }

  /// The members of this view that `sel` picks (evaluated over shape(), ndslice::eval), in rank
  /// order, as a view with extent {"ranks": n} (parent_point maps back). Throws UsageError when
  /// it picks no member, SelectionParse's ParseError for bad text ("*, 0:2", selection.hpp).
  ActorMesh select(const ndslice::Selection& sel) const {
    auto region = ndslice::eval(sel, shape());
    std::vector<size_t> locals;
    locals.reserve(region.size());
    if (pick_) {
      for (size_t r : region) locals.push_back(r);  // dense shape: its ranks are local ranks
    } else {
      for (size_t g : region) locals.push_back(view_.point_of_rank(g).rank());
    }
    if (locals.empty()) {
      throw UsageError("select: " + ndslice::to_string(sel) + " picks no member of the mesh view " +
                       extent().to_string());
    }
    return pick(std::move(locals));
  }
  ActorMesh select(std::string_view text) const { return select(ndslice::parse(text)); }

  /// The members whose procs the caster's Proc has not declared failed (on a process mesh: the
  /// ranks its supervision has not failed, ProcMesh::failed_ranks), as a select() view; this same
  /// view when all are alive (in-process meshes always are). Casts to it skip the dead procs and
  /// route around them (CAST-12), so they succeed as soon as the failure is known. Throws
  /// SupervisionError (naming a member and why) when every member is dead.
  ActorMesh survivors() const {
    const auto dead = topo_ ? topo_->dead() : detail::DeadProcs{};
    if (dead.empty()) return *this;
    const std::string* why = nullptr;
    std::vector<size_t> locals = live_members(dead, &why);
    if (locals.empty()) {
      throw SupervisionError(at(0).id(), "every member of the mesh view " + extent().to_string() +
                                             " is on a failed proc (first: " + *why + ")");
    }
    if (locals.size() == size()) return *this;
    return pick(std::move(locals));
  }

  /// Where member `local` of this view sits in the rectangular view the first select() or
  /// survivors() was applied to (for survivors().select(...) too); this view's own point for a
  /// sliced view.
  ndslice::Point parent_point(size_t local) const {
    if (!pick_) return extent().point(local);
    return pick_->parent.extent().point(pick_->locals.at(local));
  }

  /// Internal, for front ends that ship meshes between processes (the Python bindings): every
  /// member by global rank of the actor base space, the view, and the cast tree (null for a mesh
  /// without one). Rebuild elsewhere with from_ids(client, ids, view, comm ids, fanout,
  /// per_proc()).
  const std::vector<ActorRef<A>>& members() const { return *members_; }
  const ndslice::Shape& view() const { return view_; }
  const detail::CastTopology* topology() const { return topo_.get(); }

  /// The member at local rank `local` of this view. Throws UsageError on an empty
  /// (default-constructed) mesh, or once the procs its references point into are gone (see
  /// detail::MeshLifetime::gone).
  const ActorRef<A>& at(size_t local) const {
    if (!members_) throw UsageError("ActorMesh::at: this mesh is empty (default-constructed)");
    check_procs("at", false);
    return (*members_)[global(local)];
  }

  /// Every member; Future<ValueMesh<R>> (ValueMesh<Unit> for void endpoints) indexed by the
  /// view's points. Each member that fails holds its error in its rank (ActorError naming the
  /// member; DeliveryFailure naming the member or the comm actor that could not be reached;
  /// SupervisionError naming the member for a member on a proc known dead (at once) or found
  /// dead during the call, or naming the comm actor of a relay proc that died on the way to a
  /// member on a live proc); the others their values (CAST-6). The future itself fails only for
  /// a UsageError.
  template <class M, class... Args>
  auto call(M method, const Args&... args) const {
    detail::check_endpoint<A, M, const Args&...>();
    check_procs("call");
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
    check_procs("reduce");
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
    check_procs("call_one");
    return at(0).call_ranked(0, method, std::forward<Args>(args)...);
  }

  /// The local rank choose() calls: one member at random among those whose proc is not known
  /// dead, or among all when every one is (its call then fails with the SupervisionError naming
  /// its proc). UsageError on an empty view. Any thread.
  size_t choose_rank() const {
    if (size() == 0) throw UsageError("choose_rank: view " + extent().to_string() + " is empty");
    thread_local std::mt19937_64 rng{std::random_device{}()};
    auto uniform = [](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    const auto dead = topo_ ? topo_->dead() : detail::DeadProcs{};
    if (!dead.empty()) {
      const std::vector<size_t> live = live_members(dead);
      if (!live.empty()) return live[uniform(live.size())];
    }
    return uniform(size());
  }

  template <class M, class... Args>
  auto choose(M method, Args&&... args) const {
    if (size() == 0)
      throw UsageError("choose: mesh " +
                       (members_ && !members_->empty() ? "'" + members_->front().id().name + "' "
                                                       : std::string()) +
                       "view " + extent().to_string() + " is empty");
    check_procs("choose");
    const size_t i = choose_rank();
    return at(i).call_ranked(i, method, std::forward<Args>(args)...);
  }

  /// Every member; Stream::next() hands out each member's (already completed) reply future in
  /// the order the replies arrive, with the member's local rank. A comm actor that cannot be
  /// reached gives each member below it a DeliveryFailure reply (CAST-7); a member on a proc known
  /// dead a SupervisionError reply at once. On a mesh of procs in other processes the members are
  /// called directly (not through the tree; see CAST-4).
  template <class M, class... Args>
  auto stream(M method, const Args&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    detail::check_endpoint<A, M, const Args&...>();
    check_procs("stream");
    Stream<R> out(size());
    if (topo_ && topo_->remote) {
      // Across processes each member replies straight to the caller (its rank travels with the
      // call), so a stream is not ordered with tree casts to the same member (CAST-4).
      const auto dead = topo_->dead();
      for (size_t i = 0; i < size(); ++i) {
        const auto proc = static_cast<uint32_t>(global(i) / per_proc_);
        if (dead.has(proc)) {
          out.add(i, Future<R>::ready_error(
                         std::make_exception_ptr(SupervisionError(at(i).id(), dead.cause(proc)))));
          continue;
        }
        out.add(i, at(i).call_ranked(i, method, args...));
      }
      return out;
    }
    auto job = make_job<detail::CastMode::Stream>(method, detail::NoReducer{}, args...);
    job->set_stream(out);
    job->start();
    return out;
  }

  /// Every member, fire and forget (a failing handler fails that actor: supervision). A member
  /// or comm actor that cannot be reached is reported to the caster's undeliverable() (or the
  /// fault hook of the caster's Proc outside actors), as for ActorRef::send, also when a relay in
  /// another process finds it (CAST-9; outside actors, a loss on a proc declared failed is
  /// reported once, as that proc's MeshFailure). Throws
  /// SupervisionError (naming the member and why) before sending anything when the view holds a
  /// member on a proc known dead: broadcast to survivors() instead; UsageError when the mesh's
  /// procs were stopped or are gone (check_procs).
  template <class M, class... Args>
  void broadcast(M method, const Args&... args) const {
    detail::check_endpoint<A, M, const Args&...>();
    check_procs("broadcast");
    if (topo_ && topo_->remote && size() > 0) {
      using RC = detail::RemoteCast<A, M, detail::CastMode::Broadcast, detail::NoReducer>;
      if constexpr (!RC::castable) {
        detail::throw_not_castable("broadcast", "the endpoint's arguments are");
      } else {
        auto full = RC::root(*members_, *topo_, checked_plan("broadcast", topo_->dead()), method,
                             detail::NoReducer{}, args...);
        // Whom the relays report what they cannot deliver to (CAST-9): the actor casting now, or
        // the client's fault hook (uid 0). Taken here: the fence may open on another thread.
        full.caster_proc = topo_->client->name();
        if (const monarch::detail::Cell* c = monarch::detail::current_cell()) full.caster = c->id();
        // Planned when it goes (after the spawn fence), against the procs dead by then (CAST-12).
        topo_->when_ready([topo = topo_, full = std::move(full)]() mutable {
          const auto dead = topo->dead();
          Proc& client = *topo->client;
          const auto caster = detail::broadcast_caster(full);
          std::vector<detail::LostMember> lost;
          if (!dead.empty()) {
            for (uint32_t di = 0; di < full.procs.size(); ++di) {
              if (dead.has(full.procs[di]))
                detail::return_broadcast_on_dead_proc(client, full, di, dead.cause(full.procs[di]));
            }
          }
          auto w = dead.empty() ? std::move(full) : detail::cast_wire_without(full, dead, lost);
          for (auto& hop : detail::cast_root_hops(std::move(w), dead)) {
            const ActorId comm = topo->comm[hop.lo].id();
            detail::send_broadcast_hop(client, caster, comm, std::move(hop));
          }
        });
        return;
      }
    }
    make_job<detail::CastMode::Broadcast>(method, detail::NoReducer{}, args...)->start();
  }

  /// This mesh as seen from `client`, a listening Proc in another process (or in this one, for
  /// tests): members and comm actors become remote refs, and casts travel as CastWire between
  /// comm actors (CAST-10). Reducers must then be stateless or serialisable. Throws UsageError on
  /// a select()/survivors() view.
  ActorMesh attach(Proc& client) const {
    check_rectangular("attach");
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
  /// `life`: the procs' lifetime flags, set by their owner (ProcMesh).
  static ActorMesh from_ids(Proc& client, const std::vector<ActorId>& members, ndslice::Shape view,
                            const std::vector<ActorId>& comm, size_t fanout, size_t per_proc,
                            std::shared_ptr<detail::CastFence> fence = nullptr,
                            detail::MeshLifetime life = {}) {
    auto refs = std::make_shared<std::vector<ActorRef<A>>>();
    refs->reserve(members.size());
    for (const auto& id : members) refs->emplace_back(&client, id, true);
    auto topo = std::make_shared<detail::CastTopology>();
    topo->fanout = fanout;
    topo->remote = true;
    topo->fence = std::move(fence);
    topo->client = &client;
    topo->life = std::move(life);
    for (const auto& id : comm) topo->comm.emplace_back(&client, id, true);
    return ActorMesh(std::move(refs), std::move(view), std::move(topo), per_proc);
  }

 private:
  // A select()/survivors() view: the picked members of the rectangular `parent` view.
  struct Pick {
    ndslice::Shape parent;        // the rectangular view they were picked from
    std::vector<size_t> locals;   // their local ranks in `parent`, ascending
    std::vector<size_t> globals;  // their global ranks (actor base space), ascending
    ndslice::Shape shape;         // dense over {"ranks": n}
  };

  // The local ranks of this view whose proc is not in `dead`, ascending; `first_cause`, when
  // given, gets why the first dead member's proc is dead (survivors(), choose_rank()).
  std::vector<size_t> live_members(const detail::DeadProcs& dead,
                                   const std::string** first_cause = nullptr) const {
    std::vector<size_t> locals;
    for (size_t i = 0; i < size(); ++i) {
      const auto proc = static_cast<uint32_t>(global(i) / per_proc_);
      if (!dead.has(proc)) {
        locals.push_back(i);
      } else if (first_cause != nullptr && *first_cause == nullptr) {
        *first_cause = &dead.cause(proc);
      }
    }
    return locals;
  }

  ActorMesh pick(std::vector<size_t> locals) const {
    auto p = std::make_shared<Pick>();
    p->parent = pick_ ? pick_->parent : view_;
    for (size_t l : locals) {
      p->locals.push_back(pick_ ? pick_->locals.at(l) : l);
      p->globals.push_back(global(l));
    }
    p->shape = ndslice::Shape(ndslice::Extent{{"ranks", p->globals.size()}});
    ActorMesh m(members_, view_, topo_, per_proc_);
    m.pick_ = std::move(p);
    return m;
  }

  void check_rectangular(const char* what) const {
    if (pick_) {
      throw UsageError(std::string(what) +
                       ": this view was made by select()/survivors() and is not rectangular; " +
                       what + " the mesh first, then select");
    }
  }

  // UsageError once the Procs this mesh's references point into were shut down by their owner
  // (using them would read freed memory), or, with `stopped`, once its proc mesh was stopped (a
  // message to a proc that exited would wait out channel.delivery_timeout).
  void check_procs(const char* what, bool stopped = true) const {
    if (!topo_) return;
    const auto& life = topo_->life;
    if (life.gone && life.gone->load(std::memory_order_acquire)) {
      throw UsageError(std::string("ActorMesh::") + what + ": mesh of proc mesh '" + life.mesh +
                       "': the procs this mesh's references point into are gone (its "
                       "ProcMesh::local, or every HostMesh and ProcMesh of its client Proc, was "
                       "destroyed); keep one alive while the mesh is used");
    }
    if (stopped && life.stopped && life.stopped->load(std::memory_order_acquire)) {
      throw UsageError(std::string("ActorMesh::") + what + ": proc mesh '" + life.mesh +
                       "' was stopped (ProcMesh::stop, or its last view was destroyed): its "
                       "actors are gone; spawn a new mesh");
    }
  }

  size_t global(size_t local) const {
    return pick_ ? pick_->globals.at(local) : view_.global_rank(local);
  }

  detail::CastPlan plan() const {
    return pick_ ? detail::CastPlan::make(pick_->globals, per_proc_)
                 : detail::CastPlan::make(view_, per_proc_);
  }

  // The plan of a reduce/broadcast: throws SupervisionError when a member is on a dead proc.
  detail::CastPlan checked_plan(const char* adverb, const detail::DeadProcs& dead) const {
    auto p = plan();
    if (dead.empty()) return p;
    std::string first;
    size_t n = 0, first_g = 0;
    p = p.without(dead, [&](uint32_t rank, size_t g, uint32_t proc) {
      if (n++ != 0) return;
      first_g = g;
      first = "rank " + std::to_string(rank) + ": " + dead.cause(proc);
    });
    if (n != 0) {
      throw SupervisionError((*members_)[first_g].id(),
                             std::string(adverb) + " to the mesh view " + extent().to_string() +
                                 ": " + std::to_string(n) + " member" + (n == 1 ? " is" : "s are") +
                                 " on failed procs (first " + first + "); cast to survivors()");
    }
    return p;
  }

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
      // The caster's accumulator: one slot per member; members on dead procs fail at once, the
      // others as their root hops reply (CAST-6, CAST-12).
      struct Acc {
        std::mutex mu;
        std::vector<std::optional<Out>> slots;
        std::vector<std::pair<size_t, std::exception_ptr>> errors;
        size_t pending = 0;
        Promise<ndslice::ValueMesh<Out>> promise;
        ndslice::Extent ext;
        ActorMesh mesh;  // the view called: names the members of a failed error (finish)
        // One root hop finished (its replies, or its error for `ranks`); the last one resolves.
        void hop(detail::State<std::string>& s, const std::vector<uint32_t>& ranks) {
          std::unique_lock lock(mu);
          if (s.error) {
            for (uint32_t r : ranks) errors.emplace_back(r, s.error);
          } else {
            try {
              auto parts = detail::decode_string<typename RC::Partial>(*s.value);
              for (auto& [r, v] : parts.values) {
                if constexpr (std::is_void_v<R>) {
                  slots.at(r).emplace();
                } else {
                  slots.at(r).emplace(std::move(v));
                }
              }
              for (auto& [r, e] : parts.errors) errors.emplace_back(r, e.to_exception_ptr());
            } catch (...) {
              auto e = std::current_exception();
              for (uint32_t r : ranks) errors.emplace_back(r, e);
            }
          }
          if (--pending == 0) finish(lock);
        }
        void finish(std::unique_lock<std::mutex>& lock) {
          // A rank neither answered nor failed is a relay's bug: say so rather than hang.
          std::vector<bool> failed(slots.size());
          for (auto& [r, e] : errors) failed.at(r) = true;
          for (size_t r = 0; r < slots.size(); ++r) {
            if (!slots[r] && !failed[r]) {
              errors.emplace_back(
                  r, std::make_exception_ptr(Error("cast: no reply from member " +
                                                   std::to_string(r) + " of " + ext.to_string())));
            }
            if (slots[r] && failed[r]) slots[r].reset();
          }
          if (!errors.empty()) name_members_on_failed_procs();
          auto sl = std::move(slots);
          auto er = std::move(errors);
          lock.unlock();
          try {
            promise.set_value(
                ndslice::ValueMesh<Out>::from_slots(std::move(ext), std::move(sl), std::move(er)));
          } catch (...) {
            promise.set_error(std::current_exception());
          }
        }
        // A hop whose comm actor's proc died fails every member below it with a SupervisionError
        // naming that comm actor. Members on that proc itself get one naming themselves, as when
        // the caster already knew the proc dead (CAST-12); members below it on live procs keep
        // the comm actor's (their relay died, not their proc), and its cause says which member
        // lost its reply there and that the member may have run the call.
        void name_members_on_failed_procs() {
          for (auto& [r, e] : errors) {
            try {
              std::rethrow_exception(e);
            } catch (const SupervisionError& x) {
              if (x.actor().name != kCommActorName || r >= mesh.size()) continue;
              // Not at(): this runs when the call ends, possibly after the procs are gone,
              // where at() throws (the error would escape the reply path).
              const ActorId& member = (*mesh.members_)[mesh.global(r)].id();
              if (member.proc == x.proc()) {
                e = std::make_exception_ptr(SupervisionError(member, x.cause()));
              } else {
                e = std::make_exception_ptr(SupervisionError(
                    x.actor(), x.cause() + " (this proc relayed the cast to " + member.to_string() +
                                   ", whose own proc is alive: its handler may have run, and its "
                                   "reply was lost with the relay)"));
              }
            } catch (...) {
            }
          }
        }
      };
      auto acc = std::make_shared<Acc>();
      acc->ext = extent();
      acc->mesh = *this;
      acc->slots.resize(size());
      auto f = acc->promise.get_future();
      auto full = RC::root(*members_, *topo_, plan(), method, detail::NoReducer{}, args...);
      // Planned when it goes (after the spawn fence), against the procs dead by then: their
      // members fail at once, the tree routes around them (CAST-12).
      topo_->when_ready([topo = topo_, acc, full = std::move(full)]() mutable {
        const auto dead = topo->dead();
        std::vector<detail::LostMember> lost;
        auto w = dead.empty() ? std::move(full) : detail::cast_wire_without(full, dead, lost);
        auto hops = detail::cast_root_hops(std::move(w), dead);
        {
          std::unique_lock lock(acc->mu);
          for (auto& m : lost)
            acc->errors.emplace_back(m.rank,
                                     std::make_exception_ptr(SupervisionError(m.id, m.cause)));
          acc->pending = hops.size();
          if (hops.empty()) return acc->finish(lock);
        }
        for (auto& h : hops) {
          auto ranks = detail::cast_ranks(h);
          const auto lo = h.lo;
          Future<std::string> hop;
          try {
            hop = topo->comm[lo].call(&CommActor::cast, std::move(h));
          } catch (...) {
            hop = Future<std::string>::ready_error(std::current_exception());
          }
          hop.on_complete([acc, ranks = std::move(ranks)](detail::State<std::string>& s) {
            acc->hop(s, ranks);
          });
        }
      });
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
      detail::CastPlan p;
      try {
        p = checked_plan("reduce", topo_->dead());
      } catch (...) {
        return Future<R>::ready_error(std::current_exception());
      }
      auto full = RC::root(*members_, *topo_, p, method, reducer, args...);
      // Several root hops only when base proc 0 is dead (CAST-12): their partials fold here.
      struct Acc {
        explicit Acc(Reducer r) : reducer(std::move(r)) {}
        std::mutex mu;
        std::optional<R> value;
        size_t pending = 0;
        bool done = false;
        Promise<R> promise;
        Reducer reducer;
        std::string ext;
        // One root hop's partial result, or its error (first error wins, CAST-6).
        void hop(detail::State<std::string>& s) {
          std::unique_lock lock(mu);
          if (done) return;
          try {
            if (s.error) std::rethrow_exception(s.error);
            auto v = detail::decode_string<typename RC::Partial>(*s.value);
            if (v) {
              value = value ? std::optional<R>(std::as_const(reducer)(std::move(*value), *v))
                            : std::move(v);
            }
            if (--pending != 0) return;
            done = true;
            if (!value) throw Error("reduce: no reply from the members of " + ext);
            auto out = std::move(*value);
            lock.unlock();
            promise.set_value(std::move(out));
          } catch (...) {
            done = true;
            lock.unlock();
            promise.set_error(std::current_exception());
          }
        }
      };
      auto acc = std::make_shared<Acc>(std::move(reducer));
      acc->ext = extent().to_string();
      auto f = acc->promise.get_future();
      // Planned when it goes (after the spawn fence): a member whose proc died meanwhile fails
      // the reduce at once, naming it (CAST-12).
      topo_->when_ready([topo = topo_, acc, full = std::move(full)]() mutable {
        const auto dead = topo->dead();
        std::vector<detail::LostMember> lost;
        auto w = dead.empty() ? std::move(full) : detail::cast_wire_without(full, dead, lost);
        if (!lost.empty()) {
          acc->done = true;
          return acc->promise.set_error(std::make_exception_ptr(SupervisionError(
              lost[0].id, "reduce to the mesh view " + acc->ext + ": rank " +
                              std::to_string(lost[0].rank) + " is on a failed proc (" +
                              lost[0].cause + "); cast to survivors()")));
        }
        auto hops = detail::cast_root_hops(std::move(w), dead);
        {
          std::lock_guard lock(acc->mu);
          acc->pending = hops.size();
        }
        for (auto& hop : hops) {
          const auto lo = hop.lo;
          Future<std::string> reply;
          try {
            reply = topo->comm[lo].call(&CommActor::cast, std::move(hop));
          } catch (...) {
            reply = Future<std::string>::ready_error(std::current_exception());
          }
          reply.on_complete([acc](detail::State<std::string>& s) { acc->hop(s); });
        }
      });
      return f;
    }
  }

  template <detail::CastMode Mode, class M, class Reducer, class... Args>
  auto make_job(M method, Reducer reducer, const Args&... args) const {
    if (!topo_)
      throw UsageError("ActorMesh: this mesh has no cast tree (it was not spawned by a ProcMesh)");
    using Job = detail::CastJob<A, M, Mode, Reducer, std::decay_t<Args>...>;
    return std::make_shared<Job>(members_, topo_, plan(), extent(), method, std::move(reducer),
                                 args...);
  }

  std::shared_ptr<const std::vector<ActorRef<A>>> members_;
  ndslice::Shape view_;
  std::shared_ptr<const detail::CastTopology> topo_;
  size_t per_proc_ = 1;
  std::shared_ptr<const Pick> pick_;  // set on select()/survivors() views
};

}  // namespace monarch::mesh
