// ActorRef<A>: a typed, copyable, sendable handle to one actor.
//
//   Future<int> f = counter.call(&Counter::incr, 5);   // request/reply
//   counter.send(&Counter::incr, 1);                     // fire-and-forget
//
// call(): the handler's return value (R, Task<R> or Future<R>) becomes Future<R>. If the handler
// throws, the Future fails with ActorError (actor id, endpoint, message) and the actor lives on.
// If the actor is stopped, failed or unknown, the Future fails with DeliveryFailure (its
// actor_failed() says whether the actor had failed).
// send(): if the handler throws, the actor fails and its owner's supervise() is called. If the
// message cannot be delivered, the sending actor's undeliverable() runs (from outside any actor:
// the Proc's fault hook).
// Arguments are copied or moved into the message when call/send is made (never referenced later).
// Both may be used from any thread; messages from one sender to one actor arrive in send order.
#pragma once

#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "monarch/actor/detail/cell.hpp"
#include "monarch/actor/endpoint.hpp"
#include "monarch/actor/errors.hpp"
#include "monarch/actor/future.hpp"
#include "monarch/actor/remote.hpp"
#include "monarch/actor/task.hpp"

namespace monarch {

class Actor;
class Proc;

namespace detail {

/// Sends `f` back to the sender of an undeliverable fire-and-forget message: the sending actor's
/// undeliverable(), or the Proc's fault hook when the sender is outside any actor.
void route_undeliverable(Cell* sender, Proc* proc, const DeliveryFailure& f) noexcept;
/// The DeliveryFailure of a message for `endpoint` to `proc`'s actor `id`, which is not
/// registered: proc->gone_actor_failure (its tombstone, when `proc` listens), else "unknown
/// actor" (also for a null `proc`). Any thread.
DeliveryFailure gone_actor_failure(Proc* proc, const ActorId& id, std::string endpoint);

/// Asks the actor `dest` in another Proc to stop (drain) or be killed; the Future completes once
/// it is Stopped or Failed there, or fails (DeliveryFailure, SupervisionError). Never blocks.
Future<void> remote_stop(Proc& proc, const ActorId& dest, bool kill);

/// Text of an exception for reports: "what()" (with the type for non-monarch exceptions).
std::string describe_exception(const std::exception_ptr& e);

/// "Counter::incr" (registered) or "Counter::<endpoint>".
std::string endpoint_label(const std::string& type_name, const char* registered);

template <class T>
struct is_task : std::false_type {};
template <class T>
struct is_task<Task<T>> : std::true_type {};

template <class A, class M>
struct CallEnvelope final : Envelope {
  using traits = method_traits<M>;
  using R = typename reply_type<typename traits::ret>::type;
  using Ret = typename traits::ret;

  M method;
  typename traits::stored args;
  Promise<R> promise;

  template <class... Args>
  CallEnvelope(M m, Args&&... a) : method(m), args(std::forward<Args>(a)...) {}
  CallEnvelope(M m, typename traits::stored&& a) : method(m), args(std::move(a)) {}

  void invoke(Cell& c) override {
    A& self = static_cast<A&>(*c.actor());
    try {
      if constexpr (is_task<Ret>::value) {
        auto id = c.id();
        auto label = endpoint_label(c.type_name(), endpoint_name<A>(method));
        apply_method(self, method, args)
            .detach([p = std::make_shared<Promise<R>>(std::move(promise)), id = std::move(id),
                     label = std::move(label)](auto& done) {
              if (done.error)
                return p->set_error(ActorError(id, label, describe_exception(done.error)));
              if constexpr (std::is_void_v<R>) {
                p->set_value();
              } else {
                p->set_value(std::move(*done.value));
              }
            });
      } else if constexpr (is_future<Ret>::value) {
        apply_method(self, method, args)
            .on_complete([p = std::make_shared<Promise<R>>(std::move(promise))](auto& s) {
              if (s.error) return p->set_error(s.error);
              if constexpr (std::is_void_v<R>) {
                p->set_value();
              } else {
                p->set_value(std::move(*s.value));
              }
            });
      } else if constexpr (std::is_void_v<R>) {
        apply_method(self, method, args);
        promise.set_value();
      } else {
        promise.set_value(apply_method(self, method, args));
      }
    } catch (...) {
      promise.set_error(ActorError(c.id(), endpoint_label(c.type_name(), endpoint_name<A>(method)),
                                   describe_exception(std::current_exception())));
    }
  }
  void bounce(const DeliveryFailure& f) noexcept override { promise.set_error(f); }
  std::string_view endpoint() const noexcept override {
    const char* n = endpoint_name<A>(method);
    return n != nullptr ? n : "<endpoint>";
  }
};

template <class A, class M>
struct SendEnvelope final : Envelope {
  using traits = method_traits<M>;
  M method;
  typename traits::stored args;
  CellPtr sender;  // for undeliverable reports; null outside actors
  Proc* proc;
  UniqueFunction<void(const DeliveryFailure&)> remote_bounce;  // set when sent from another Proc

  template <class... Args>
  SendEnvelope(Proc* p, M m, Args&&... a)
      : method(m),
        args(std::forward<Args>(a)...),
        sender(CellPtr::share(current_cell())),
        proc(p) {}
  SendEnvelope(Proc* p, M m, typename traits::stored&& a)
      : method(m), args(std::move(a)), proc(p) {}

  void invoke(Cell& c) override {
    A& self = static_cast<A&>(*c.actor());
    if constexpr (is_task<typename traits::ret>::value) {
      Cell* cell = &c;
      auto label = endpoint_label(c.type_name(), endpoint_name<A>(method));
      apply_method(self, method, args).detach([cell, label = std::move(label)](auto& done) {
        // Runs on the actor's own thread (the coroutine resumes inside the actor).
        if (done.error)
          cell->fail("send handler " + label + " threw: " + describe_exception(done.error));
      });
    } else {
      (void)apply_method(self, method, args);  // a throw fails the actor (see Cell::dispatch)
    }
  }
  void bounce(const DeliveryFailure& f) noexcept override {
    if (remote_bounce) return remote_bounce(f);
    route_undeliverable(sender.get(), proc, f);
  }
  std::string_view endpoint() const noexcept override {
    const char* n = endpoint_name<A>(method);
    return n != nullptr ? n : "<endpoint>";
  }
};

template <class A, class M, class... Args>
constexpr void check_endpoint() {
  using traits = method_traits<M>;
  static_assert(std::is_base_of_v<typename traits::cls, A>,
                "monarch: this member function is not an endpoint of the actor type of this ref");
  static_assert(traits::arity == sizeof...(Args),
                "monarch: wrong number of arguments for this endpoint");
  static_assert(std::is_constructible_v<typename traits::stored, Args&&...>,
                "monarch: argument types do not convert to the endpoint's parameter types");
}

template <class M>
constexpr bool remotable() {
  using traits = method_traits<M>;
  using R = typename reply_type<typename traits::ret>::type;
  return wire::is_serializable_v<typename traits::stored> &&
         (std::is_void_v<R> || wire::is_serializable_v<R>);
}

template <class A, class M>
const char* remote_endpoint_name(M method) {
  const char* name = endpoint_name<A>(method);
  if (name == nullptr) {
    throw UsageError("this endpoint of " + demangle(typeid(A).name()) +
                     " is not registered with MONARCH_ENDPOINTS(" + demangle(typeid(A).name()) +
                     ", ...), so it cannot be called in another process");
  }
  return name;
}

/// Sends a call to an actor in another Proc; the reply completes the returned Future.
template <class A, class M, class... Args>
auto remote_call(Proc& proc, const ActorId& dest, size_t message_rank, M method, Args&&... args) {
  using traits = method_traits<M>;
  using R = typename reply_type<typename traits::ret>::type;
  Promise<R> p;
  auto f = p.get_future();
  if constexpr (remotable<M>()) {
    const char* name = remote_endpoint_name<A>(method);
    typename traits::stored stored(std::forward<Args>(args)...);
    remote_dispatch(
        proc, dest, RemoteKind::Call, name, wire::encode(stored),
        [p = std::move(p)](RemoteResult&& r) mutable {
          if (r.error) return p.set_error(r.error);
          try {
            if constexpr (std::is_void_v<R>) {
              p.set_value();
            } else {
              p.set_value(wire::decode<R>(r.payload));
            }
          } catch (...) {
            p.set_error(std::current_exception());
          }
        },
        message_rank);
  } else {
    (void)message_rank;
    p.set_error(UsageError(endpoint_label(demangle(typeid(A).name()), endpoint_name<A>(method)) +
                           ": its arguments or result are not serialisable, so it cannot be "
                           "called on actor " +
                           dest.to_string() + " in another process"));
  }
  return f;
}

/// A Send to `dest` (in another Proc). Its undeliverable report goes to the actor running on this
/// thread, or to `report_to` when not null (ReportTo: a relay sending on a caster's behalf).
/// Throws as remote_dispatch does, and UsageError when the endpoint's arguments are not
/// serialisable.
template <class A, class M, class... Args>
void remote_send_as(Proc& proc, const ReportTo* report_to, const ActorId& dest, size_t message_rank,
                    M method, Args&&... args) {
  using traits = method_traits<M>;
  if constexpr (remotable<M>()) {
    const char* name = remote_endpoint_name<A>(method);
    typename traits::stored stored(std::forward<Args>(args)...);
    remote_dispatch(proc, dest, RemoteKind::Send, name, wire::encode(stored), nullptr, message_rank,
                    report_to);
  } else {
    (void)message_rank;
    (void)report_to;
    throw UsageError(endpoint_label(demangle(typeid(A).name()), endpoint_name<A>(method)) +
                     ": its arguments are not serialisable, so it cannot be sent to actor " +
                     dest.to_string() + " in another process");
  }
}

template <class A, class M, class... Args>
void remote_send(Proc& proc, const ActorId& dest, size_t message_rank, M method, Args&&... args) {
  remote_send_as<A>(proc, nullptr, dest, message_rank, method, std::forward<Args>(args)...);
}

/// Makes A's registered endpoints callable from other processes (once per type).
template <class A>
void register_endpoints() {
  if constexpr (has_endpoints<A>::value) {
    static const bool once = [] {
      std::apply(
          [](const auto&... e) {
            (
                [&] {
                  using M = std::decay_t<decltype(e.method)>;
                  M m = e.method;
                  add_remote_invoker(typeid(A), e.name, [m](Cell& c, RemoteRequest&& req) {
                    if constexpr (!remotable<M>()) {
                      throw UsageError(
                          "endpoint has arguments or a result that are not "
                          "serialisable; it can only be called in-process");
                    } else {
                      using traits = method_traits<M>;
                      using R = typename reply_type<typename traits::ret>::type;
                      auto args = wire::decode<typename traits::stored>(req.payload);
                      if (!req.is_call) {
                        auto* env = new SendEnvelope<A, M>(&c.proc(), m, std::move(args));
                        env->message_rank = req.message_rank;
                        env->remote_bounce = std::move(req.bounce_send);
                        return c.post(env);
                      }
                      auto* env = new CallEnvelope<A, M>(m, std::move(args));
                      env->message_rank = req.message_rank;
                      env->promise.get_future().on_complete(
                          [reply = std::move(req.reply)](State<R>& st) mutable {
                            RemoteResult r;
                            if (st.error) {
                              r.error = st.error;
                            } else if constexpr (!std::is_void_v<R>) {
                              try {
                                r.payload = wire::encode(*st.value);
                              } catch (...) {
                                r.error = std::current_exception();
                              }
                            }
                            reply(std::move(r));
                          });
                      c.post(env);
                    }
                  });
                }(),
                ...);
          },
          A::monarch_endpoints());
      return true;
    }();
    (void)once;
  }
}

}  // namespace detail

template <class A>
class ActorRef {
 public:
  ActorRef() = default;
  /// Internal: wraps a cell (shares the reference).
  explicit ActorRef(detail::CellPtr cell) : cell_(std::move(cell)) {}
  /// Internal: a ref to an actor id that is not (or no longer) known here: every message bounces;
  /// or, with remote = true, to an actor in another Proc (messages go through `proc`'s channel).
  ActorRef(Proc* proc, ActorId id, bool remote = false)
      : unknown_(std::make_shared<const ActorId>(std::move(id))), proc_(proc), remote_(remote) {}

  /// Upcast: ActorRef<Derived> converts to ActorRef<Base>.
  template <class B, class = std::enable_if_t<std::is_base_of_v<A, B> && !std::is_same_v<A, B>>>
  ActorRef(const ActorRef<B>& o)
      : cell_(o.cell_), unknown_(o.unknown_), proc_(o.proc_), remote_(o.remote_) {}

  /// True when the actor lives in another process.
  bool is_remote() const noexcept { return remote_; }

  /// Message rank of a message not sent through a mesh cast.
  static constexpr size_t kNoRank = static_cast<size_t>(-1);

  bool valid() const noexcept { return cell_ || unknown_; }
  const ActorId& id() const {
    if (cell_) return cell_->id();
    if (unknown_) return *unknown_;
    throw UsageError("ActorRef is empty (default-constructed)");
  }
  /// Current lifecycle state (Stopped for an unknown actor; Idle, meaning "unknown here", for a
  /// remote one).
  Lifecycle state() const {
    if (cell_) return cell_->state();
    return remote_ ? Lifecycle::Idle : Lifecycle::Stopped;
  }

  /// Request/reply: see the file comment. Returns Future<R>.
  template <class M, class... Args>
  auto call(M method, Args&&... args) const {
    return call_ranked(kNoRank, method, std::forward<Args>(args)...);
  }

  /// Internal (mesh casts): call()/send() whose handler sees Context::message_rank() == rank.
  /// The rank travels with the message to actors in other processes too.
  template <class M, class... Args>
  auto call_ranked(size_t rank, M method, Args&&... args) const {
    detail::check_endpoint<A, M, Args...>();
    if (remote_)
      return detail::remote_call<A>(*proc_, *unknown_, rank, method, std::forward<Args>(args)...);
    auto* e = new detail::CallEnvelope<A, M>(method, std::forward<Args>(args)...);
    e->message_rank = rank;
    auto f = e->promise.get_future();
    if (!cell_) {
      bounce_unknown(e);
      return f;
    }
    e->promise.set_completer(cell_.get());
    cell_->post(e);
    return f;
  }
  template <class M, class... Args>
  void send_ranked(size_t rank, M method, Args&&... args) const {
    detail::check_endpoint<A, M, Args...>();
    if (remote_)
      return detail::remote_send<A>(*proc_, *unknown_, rank, method, std::forward<Args>(args)...);
    Proc* p = cell_ ? &cell_->proc() : proc_;
    auto* e = new detail::SendEnvelope<A, M>(p, method, std::forward<Args>(args)...);
    e->message_rank = rank;
    if (!cell_) return bounce_unknown(e);
    cell_->post(e);
  }

  /// Fire-and-forget: see the file comment.
  template <class M, class... Args>
  void send(M method, Args&&... args) const {
    send_ranked(kNoRank, method, std::forward<Args>(args)...);
  }

  /// Stops the actor after the messages already queued (drain); children stop first, then
  /// cleanup() runs. The future completes once the actor is Stopped or Failed.
  /// Remote actor: returns at once without blocking, whatever the state of the other process;
  /// the Future completes when the actor stopped there, or fails with DeliveryFailure (link lost)
  /// or SupervisionError (its Proc declared failed). Wait with a deadline (`get(timeout)`,
  /// `wait_for`): a frozen process answers nothing until it is declared failed.
  Future<void> stop() const {
    if (!valid()) return empty_ref("stop");
    if (remote_) return detail::remote_stop(*proc_, *unknown_, false);
    return cell_ ? cell_->request_stop(false) : Future<void>::ready_value();
  }
  /// Like stop(), but pending messages are not run: they bounce to their senders as
  /// DeliveryFailure ("actor killed").
  Future<void> kill() const {
    if (!valid()) return empty_ref("kill");
    if (remote_) return detail::remote_stop(*proc_, *unknown_, true);
    return cell_ ? cell_->request_stop(true) : Future<void>::ready_value();
  }

  bool operator==(const ActorRef& o) const { return id() == o.id(); }

  /// Internal.
  detail::Cell* cell() const noexcept { return cell_.get(); }

 private:
  template <class B>
  friend class ActorRef;

  static Future<void> empty_ref(const char* what) {
    return Future<void>::ready_error(std::make_exception_ptr(
        UsageError(std::string(what) + "() on an empty ActorRef (default-constructed)")));
  }

  void bounce_unknown(detail::Envelope* e) const {
    std::unique_ptr<detail::Envelope> owned(e);
    e->bounce(detail::gone_actor_failure(proc_, id(), std::string(e->endpoint())));
  }

  detail::CellPtr cell_;
  std::shared_ptr<const ActorId> unknown_;
  Proc* proc_ = nullptr;
  bool remote_ = false;
};

namespace detail {
/// Resolves an ActorId arriving in a remote message: local actor, or a remote ref.
template <class A>
ActorRef<A> resolve_incoming(const ActorId& id);
}  // namespace detail

// ActorRefs travel inside messages to other processes as their ActorId.
template <class Archive, class A>
void save(Archive& ar, const ActorRef<A>& ref) {
  ar(ref.id());
}
template <class Archive, class A>
void load(Archive& ar, ActorRef<A>& ref) {
  ActorId id;
  ar(id);
  ref = detail::resolve_incoming<A>(id);
}

}  // namespace monarch
