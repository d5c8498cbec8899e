// ActorRef<A>: a typed, copyable, sendable handle to one actor.
//
//   Future<int> f = counter.call(&Counter::incr, 5);   // request/reply
//   counter.send(&Counter::incr, 1);                     // fire-and-forget
//
// call(): the handler's return value (R, Task<R> or Future<R>) becomes Future<R>. If the handler
// throws, the Future fails with ActorError (actor id, endpoint, message) and the actor lives on.
// If the actor is stopped, failed or unknown, the Future fails with DeliveryFailure.
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
#include "monarch/actor/task.hpp"

namespace monarch {

class Actor;
class Proc;

namespace detail {

/// Sends `f` back to the sender of an undeliverable fire-and-forget message: the sending actor's
/// undeliverable(), or the Proc's fault hook when the sender is outside any actor.
void route_undeliverable(Cell* sender, Proc* proc, const DeliveryFailure& f) noexcept;

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

  void invoke(Cell& c) override {
    A& self = static_cast<A&>(*c.actor());
    try {
      if constexpr (is_task<Ret>::value) {
        auto id = c.id();
        auto label = endpoint_label(c.type_name(), endpoint_name<A>(method));
        apply_method(self, method, args)
            .detach([p = std::make_shared<Promise<R>>(std::move(promise)), id = std::move(id),
                     label = std::move(label)](auto& done) {
              if (done.error) return p->set_error(ActorError(id, label, describe_exception(done.error)));
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

  template <class... Args>
  SendEnvelope(Proc* p, M m, Args&&... a)
      : method(m), args(std::forward<Args>(a)...), sender(CellPtr::share(current_cell())), proc(p) {}

  void invoke(Cell& c) override {
    A& self = static_cast<A&>(*c.actor());
    if constexpr (is_task<typename traits::ret>::value) {
      Cell* cell = &c;
      auto label = endpoint_label(c.type_name(), endpoint_name<A>(method));
      apply_method(self, method, args).detach([cell, label = std::move(label)](auto& done) {
        // Runs on the actor's own thread (the coroutine resumes inside the actor).
        if (done.error) cell->fail("send handler " + label + " threw: " + describe_exception(done.error));
      });
    } else {
      (void)apply_method(self, method, args);  // a throw fails the actor (see Cell::dispatch)
    }
  }
  void bounce(const DeliveryFailure& f) noexcept override {
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

}  // namespace detail

template <class A>
class ActorRef {
 public:
  ActorRef() = default;
  /// Internal: wraps a cell (shares the reference).
  explicit ActorRef(detail::CellPtr cell) : cell_(std::move(cell)) {}
  /// Internal: a ref to an actor id that is not (or no longer) known: every message bounces.
  ActorRef(Proc* proc, ActorId unknown)
      : unknown_(std::make_shared<const ActorId>(std::move(unknown))), proc_(proc) {}

  /// Upcast: ActorRef<Derived> converts to ActorRef<Base>.
  template <class B, class = std::enable_if_t<std::is_base_of_v<A, B> && !std::is_same_v<A, B>>>
  ActorRef(const ActorRef<B>& o) : cell_(o.cell_), unknown_(o.unknown_), proc_(o.proc_) {}

  bool valid() const noexcept { return cell_ || unknown_; }
  const ActorId& id() const {
    if (cell_) return cell_->id();
    if (unknown_) return *unknown_;
    throw UsageError("ActorRef is empty (default-constructed)");
  }
  /// Current lifecycle state (Stopped for an unknown actor).
  Lifecycle state() const { return cell_ ? cell_->state() : Lifecycle::Stopped; }

  /// Request/reply: see the file comment. Returns Future<R>.
  template <class M, class... Args>
  auto call(M method, Args&&... args) const {
    detail::check_endpoint<A, M, Args...>();
    auto* e = new detail::CallEnvelope<A, M>(method, std::forward<Args>(args)...);
    auto f = e->promise.get_future();
    if (!cell_) {
      bounce_unknown(e);
      return f;
    }
    e->promise.set_completer(cell_.get());
    cell_->post(e);
    return f;
  }

  /// Fire-and-forget: see the file comment.
  template <class M, class... Args>
  void send(M method, Args&&... args) const {
    detail::check_endpoint<A, M, Args...>();
    Proc* p = cell_ ? &cell_->proc() : proc_;
    auto* e = new detail::SendEnvelope<A, M>(p, method, std::forward<Args>(args)...);
    if (!cell_) return bounce_unknown(e);
    cell_->post(e);
  }

  /// Stops the actor after the messages already queued (drain); children stop first, then
  /// cleanup() runs. The future completes once the actor is Stopped or Failed.
  Future<void> stop() const { return cell_ ? cell_->request_stop(false) : Future<void>::ready_value(); }
  /// Like stop(), but pending messages are not run: they bounce to their senders as
  /// DeliveryFailure ("actor killed").
  Future<void> kill() const { return cell_ ? cell_->request_stop(true) : Future<void>::ready_value(); }

  bool operator==(const ActorRef& o) const { return id() == o.id(); }

  /// Internal.
  detail::Cell* cell() const noexcept { return cell_.get(); }

 private:
  template <class B>
  friend class ActorRef;

  void bounce_unknown(detail::Envelope* e) const {
    std::unique_ptr<detail::Envelope> owned(e);
    e->bounce(DeliveryFailure(id(), std::string(e->endpoint()), "unknown actor"));
  }

  detail::CellPtr cell_;
  std::shared_ptr<const ActorId> unknown_;
  Proc* proc_ = nullptr;
};

}  // namespace monarch
