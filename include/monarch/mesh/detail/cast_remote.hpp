// The cast tree across processes (CAST-10 in monarch/mesh/cast.hpp): when the comm actors are
// remote refs, a hop is a CommActor::cast(CastWire) call and partial results travel
// cereal-encoded. RemoteCast<A, M, Mode, Reducer> is the typed handler a comm actor runs for one
// (endpoint, adverb, reducer); handlers are registered by key in a per-process registry.
//
// Include monarch/mesh/cast.hpp rather than this. cast.hpp includes this header at its end; the
// include of cast.hpp below puts its public types (CastWire, CommActor, Stream) first whichever
// of the two a file includes, hence an include guard after it rather than #pragma once.
#include "monarch/mesh/cast.hpp"

#ifndef MONARCH_MESH_DETAIL_CAST_REMOTE_HPP
#define MONARCH_MESH_DETAIL_CAST_REMOTE_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "monarch/actor/runtime.hpp"
#include "monarch/mesh/detail/cast_job.hpp"
#include "monarch/mesh/detail/cast_tree.hpp"
#include "monarch/mesh/detail/member_call.hpp"

namespace monarch::mesh::detail {

using RemoteCastFn = UniqueFunction<Future<std::string>(Proc&, CastWire&&)>;
/// Adds the handler for `key` unless one is there. Any thread.
void add_remote_cast(const std::string& key, std::shared_ptr<RemoteCastFn> fn);
std::shared_ptr<RemoteCastFn> find_remote_cast(const std::string& key);

/// wire::encode output held in a string (CastWire's payloads).
std::string to_string_bytes(const std::vector<std::byte>& b);
template <class T>
T decode_string(const std::string& s) {
  return wire::decode<T>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
}

/// The hop for child subtree `s` of the node that received `w` (CAST-10): its comm actors,
/// destination procs and member runs, cut out of `w`, and the `dead` procs within it (CAST-12).
CastWire cast_subtree_wire(const CastWire& w, const CastSpan& s, const DeadProcs& dead);

/// A reducer travels as bytes, or as nothing when it is stateless (Sum, Min, Max, a lambda
/// without captures).
template <class Reducer>
inline constexpr bool reducer_stateless_v =
    std::is_empty_v<Reducer>&& std::is_default_constructible_v<Reducer>;
template <class Reducer>
inline constexpr bool reducer_wireable_v =
    reducer_stateless_v<Reducer> || wire::is_serializable_v<Reducer>;

/// A subtree's replies to a remote call() (CAST-6, CAST-10): values and per-member failures,
/// by message rank.
template <class V>
struct CastReplies {
  std::vector<std::pair<uint32_t, V>> values;
  std::vector<std::pair<uint32_t, monarch::detail::WireError>> errors;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(values, errors);
  }
};

/// The message ranks of the members a hop carries.
std::vector<uint32_t> cast_ranks(const CastWire& w);
/// What a relay knows of dead procs in [w.lo, w.hi): the wire's, plus those its own Proc was told
/// of (WorkerControl::proc_failed) (CAST-12).
DeadProcs relay_dead(Proc& proc, const CastWire& w);
/// The members of `w` on procs.. of destination index `di` (w.procs[di]): (message rank, id).
std::vector<std::pair<uint32_t, ActorId>> cast_members_of(const CastWire& w, uint32_t di);
/// A member left out of a cast because its proc is dead (CAST-12).
struct LostMember {
  uint32_t rank;      // its message rank
  ActorId id;         // the member
  std::string cause;  // why its proc is dead
};
/// `w` (a whole-tree wire from RemoteCast::root) without its destinations on `dead` procs, whose
/// members are appended to `lost` (CAST-12).
CastWire cast_wire_without(const CastWire& w, const DeadProcs& dead, std::vector<LostMember>& lost);
/// The endpoint of a cast hop, as named in its DeliveryFailures ("Type::method").
std::string cast_endpoint(const CastWire& w);
/// Where a broadcast's undeliverable reports go: its caster (CastWire::caster, CAST-9).
monarch::detail::ReportTo broadcast_caster(const CastWire& w);
/// CAST-9: a broadcast that `here` (a relay, or the caster's Proc past its fence) cannot deliver
/// is reported to its caster `to` as `f` (return_to_sender). When the loss is a proc declared
/// failed (`proc_failed`) and the caster is outside actors, the caster's Proc reports that
/// failure itself (REM-6), so this only logs. Never throws.
void return_broadcast(Proc& here, const monarch::detail::ReportTo& to, const DeliveryFailure& f,
                      bool proc_failed);
/// return_broadcast for destination `di` of `w` (an index into w.procs) on a proc declared failed
/// for `cause`: one report, naming its first member and how many more were there.
void return_broadcast_on_dead_proc(Proc& here, const CastWire& w, uint32_t di,
                                   const std::string& cause);
/// Sends broadcast hop `hop` from `here` to the comm actor `comm` of another process, on behalf
/// of the caster `to`: a hop the channel returns later is reported to the caster too. A hop that
/// cannot be sent (its proc was declared failed since the plan) is reported at once.
void send_broadcast_hop(Proc& here, const monarch::detail::ReportTo& to, const ActorId& comm,
                        CastWire&& hop);
/// Refuses, at the caster, a cast whose encoded arguments (`bytes`) would not fit in one hop
/// under the caster's ChannelOptions::max_frame_bytes (less 64 KiB for the cast's own header):
/// the hop would be refused by the channel later, failing every member of a call and returning a
/// broadcast to its caster only after the link gave up. Throws UsageError naming the endpoint, the
/// size and the limit.
void check_cast_size(Proc& caster, size_t bytes, const std::string& endpoint);
/// The caster's hops for the whole-tree wire `w` (CAST-12): `w` itself (with `dead` in it) when
/// base proc 0 is alive, else the subtrees of proc 0's live descendants, each rooted at its own
/// live node. `w`'s plan must hold no destination on a dead proc (CastPlan::without).
std::vector<CastWire> cast_root_hops(CastWire w, const DeadProcs& dead);

template <class A, class M, CastMode Mode, class Reducer>
struct RemoteCast {
  using Stored = typename method_traits<M>::stored;
  using R = typename reply_type<typename method_traits<M>::ret>::type;
  using WireOut = std::conditional_t<std::is_void_v<R>, bool, R>;
  using Partial =
      std::conditional_t<Mode == CastMode::Reduce, std::optional<WireOut>, CastReplies<WireOut>>;

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
  /// call(): a member or subtree that fails leaves its error in its ranks (CAST-6) and the rest
  /// still answer; reduce(): the first error fails the node.
  struct NodeState {
    explicit NodeState(Reducer r) : reducer(std::move(r)) {}
    std::mutex mu;
    Partial acc{};        // guarded by mu
    bool failed = false;  // guarded by mu; also set once the result is out
    std::atomic<size_t> pending{0};
    Promise<std::string> promise;
    Reducer reducer;
    // Collect: the local members' message ranks, replies and errors, by local index; each slot is
    // written once, by its member, before that member counts down.
    std::vector<uint32_t> local_ranks;
    std::vector<std::optional<WireOut>> local_slots;
    std::vector<std::exception_ptr> local_errors;

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
    /// One input (a child hop, or a dead destination proc) failed as a whole: call() records `e`
    /// for each of its `ranks`; reduce() fails.
    void fail_ranks(const std::vector<uint32_t>& ranks, const std::exception_ptr& e) {
      if constexpr (Mode == CastMode::Reduce) {
        (void)ranks;
        fail(e);
      } else {
        {
          std::lock_guard lock(mu);
          if (failed) return;
          auto w = monarch::detail::WireError::from(e);
          for (uint32_t r : ranks) acc.errors.emplace_back(r, w);
        }
        count_down();
      }
    }
    /// One input (a dead destination proc) failed member by member: call() records each
    /// (rank, error); reduce() fails with the first.
    void fail_each(const std::vector<std::pair<uint32_t, std::exception_ptr>>& errs) {
      if constexpr (Mode == CastMode::Reduce) {
        fail(errs.empty() ? std::make_exception_ptr(Error("cast: lost members")) : errs[0].second);
      } else {
        {
          std::lock_guard lock(mu);
          if (failed) return;
          for (auto& [r, e] : errs) acc.errors.emplace_back(r, monarch::detail::WireError::from(e));
        }
        count_down();
      }
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
    /// Local member `slot` failed (its ActorError, or a DeliveryFailure naming it).
    void member_failed(uint32_t slot, std::exception_ptr e) {
      if constexpr (Mode == CastMode::Reduce) {
        fail(std::move(e));
      } else {
        local_errors[slot] = std::move(e);
        count_down();
      }
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
          acc.values.insert(acc.values.end(), std::make_move_iterator(p.values.begin()),
                            std::make_move_iterator(p.values.end()));
          acc.errors.insert(acc.errors.end(), std::make_move_iterator(p.errors.begin()),
                            std::make_move_iterator(p.errors.end()));
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
          acc.values.reserve(acc.values.size() + local_slots.size());
          for (size_t i = 0; i < local_slots.size(); ++i) {
            if (local_slots[i]) {
              acc.values.emplace_back(local_ranks[i], std::move(*local_slots[i]));
            } else if (local_errors[i]) {
              acc.errors.emplace_back(local_ranks[i],
                                      monarch::detail::WireError::from(local_errors[i]));
            }
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

  // Where a plain-value handler's reply goes: local slot `slot` of the node.
  struct Reply {
    std::shared_ptr<NodeState> st;
    std::shared_ptr<const Stored> a;
    uint32_t slot;
    const Stored& args() const { return *a; }
    void done() { st->member_done(slot, true); }
    template <class V>
    void done(V&& v) {
      st->member_done(slot, std::forward<V>(v));
    }
    void fail(std::exception_ptr e) const { st->member_failed(slot, std::move(e)); }
  };
  using Call = MemberCall<A, M, Reply>;

  /// Runs one hop on the comm actor of `proc` (its thread): forwards to the child subtrees that
  /// hold destinations (past dead procs, CAST-12), delivers to the members on this proc, and
  /// folds their replies.
  static Future<std::string> run(Proc& proc, M method, CastWire&& w) {
    if (w.starts.size() != w.procs.size() + 1 || w.comm.size() != size_t{w.hi} - w.lo ||
        (w.starts.empty() ? false : w.starts.back() != w.runs.size()) ||
        w.dead.size() != w.dead_causes.size()) {
      return Future<std::string>::ready_error(std::make_exception_ptr(
          UsageError("comm actor of " + proc.name() + ": malformed cast hop [" +
                     std::to_string(w.lo) + ", " + std::to_string(w.hi) + ")")));
    }
    auto args = std::make_shared<const Stored>(decode_string<Stored>(w.args));
    auto st = std::make_shared<NodeState>(decode_reducer(w.reducer));
    auto result = st->promise.get_future();
    const DeadProcs dead = relay_dead(proc, w);
    std::vector<std::pair<ActorId, CastWire>> kids;
    std::vector<uint32_t> lost;  // destination indices (into w.procs) on procs known dead here
    const CastSpan node{w.lo, w.hi, 0, static_cast<uint32_t>(w.procs.size())};
    const bool here = plan_live_node(
        node, w.fanout, w.procs, dead,
        [&](const CastSpan& s) {
          kids.emplace_back(w.comm[s.lo - w.lo], cast_subtree_wire(w, s, dead));
        },
        [&](uint32_t di) { lost.push_back(di); });
    const uint32_t lb = here ? w.starts[0] : 0, le = here ? w.starts[1] : 0;  // this proc's runs
    size_t local = 0;
    for (uint32_t i = lb; i < le; ++i) local += w.runs[i].count;
    if constexpr (Mode != CastMode::Reduce && Mode != CastMode::Broadcast) {
      st->local_ranks.reserve(local);
      for (uint32_t i = lb; i < le; ++i) {
        for (uint32_t k = 0; k < w.runs[i].count; ++k)
          st->local_ranks.push_back(w.runs[i].rank + k);
      }
      st->local_slots.resize(local);
      st->local_errors.resize(local);
    }
    // Set before anything is sent: replies may land (on other threads) while we still send.
    const size_t pending = local + kids.size() + lost.size();
    st->pending.store(pending, std::memory_order_relaxed);
    for (uint32_t di : lost) {
      const uint32_t p = w.procs[di];
      if constexpr (Mode == CastMode::Broadcast) {
        return_broadcast_on_dead_proc(proc, w, di, dead.cause(p));
      } else {
        // Each member holds a SupervisionError naming it (CAST-12), as when the caster knew.
        std::vector<std::pair<uint32_t, std::exception_ptr>> errs;
        for (auto& [rank, id] : cast_members_of(w, di))
          errs.emplace_back(rank, std::make_exception_ptr(SupervisionError(id, dead.cause(p))));
        st->fail_each(errs);
      }
    }
    // Broadcast: what this hop cannot deliver is reported to the caster (CAST-9).
    std::shared_ptr<const monarch::detail::ReportTo> report;
    if constexpr (Mode == CastMode::Broadcast)
      report = std::make_shared<const monarch::detail::ReportTo>(broadcast_caster(w));
    for (auto& [id, sub] : kids) {
      if constexpr (Mode == CastMode::Broadcast) {
        send_broadcast_hop(proc, *report, id, std::move(sub));
      } else {
        ActorRef<CommActor> child(&proc, id, true);
        std::vector<uint32_t> ranks;
        if constexpr (Mode == CastMode::Collect) ranks = cast_ranks(sub);
        Future<std::string> hop;
        try {
          hop = child.call(&CommActor::cast, std::move(sub));
        } catch (...) {
          hop = Future<std::string>::ready_error(std::current_exception());
        }
        hop.on_complete([st, ranks = std::move(ranks)](State<std::string>& s) {
          // A lost subtree (its comm actor died, CAST-7) fails its own members only.
          if (s.error) return st->fail_ranks(ranks, s.error);
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
          auto* e = new Call(Reply{st, args, slot}, method);
          e->message_rank = rank;
          ActorRef<A> ref = proc.resolve<A>(id);
          post_or_bounce(ref.cell(), e, &id, &proc);
          continue;
        }
        ActorRef<A> ref = proc.resolve<A>(id);
        if constexpr (Mode == CastMode::Broadcast) {
          // Built here rather than by ref.send_ranked so that an undeliverable report goes to
          // the caster, not to this comm actor (CAST-9).
          auto* e = std::apply(
              [&](const auto&... a) {
                return new monarch::detail::SendEnvelope<A, M>(&proc, method, a...);
              },
              *args);
          e->message_rank = rank;
          e->remote_bounce = [&proc, report](const DeliveryFailure& f) {
            monarch::detail::return_to_sender(proc, *report, f);
          };
          post_or_bounce(ref.cell(), e, &id, &proc);
        } else {
          auto f = std::apply([&](const auto&... a) { return ref.call_ranked(rank, method, a...); },
                              *args);
          f.on_complete([st, slot](State<R>& s) {
            if (s.error) return st->member_failed(slot, s.error);
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
    if (topo.client != nullptr)
      check_cast_size(*topo.client, w.args.size(),
                      monarch::detail::remote_endpoint_name<A>(method));
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

}  // namespace monarch::mesh::detail

namespace monarch::mesh {

// Declared, with its contract, in monarch/mesh/cast.hpp.
template <class A, class M, class Reducer>
void register_cast(M method, Reducer) {
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

#endif  // MONARCH_MESH_DETAIL_CAST_REMOTE_HPP
