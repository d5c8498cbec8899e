// Future<T> / Promise<T>: the result of an endpoint call, a OncePort, or a continuation.
//
// A Future is single-consumer and move-only. Its value is retrieved once, by get(), then(), or
// co_await. Errors travel as exceptions: a failed future rethrows the original typed exception
// (ActorError, DeliveryFailure, SupervisionError, ...) from get() / co_await, and passes it on
// untouched through then().
//
// Threads: a Future may be completed on any thread. get() may be called on any thread, including
// inside an actor handler (which then blocks that worker; see docs/actor-runtime.md, "Blocking").
// Continuations registered by then() or co_await from inside an actor run inside that same actor,
// serially with its handlers; registered from outside any actor they run on the completing thread.
#pragma once

#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "monarch/actor/detail/hooks.hpp"
#include "monarch/actor/errors.hpp"

namespace monarch {

/// Stand-in value type for Future<void>.
struct Unit {
  bool operator==(const Unit&) const = default;
};

template <class T>
class Future;
template <class T>
class Promise;

namespace detail {

template <class T>
using stored_t = std::conditional_t<std::is_void_v<T>, Unit, T>;

/// Shared completion state. `word` bit 0: ready; bit 1: a thread sleeps in wait (futex).
struct StateBase {
  static constexpr uint32_t kReady = 1;
  static constexpr uint32_t kWaiters = 2;

  std::atomic<uint32_t> word{0};
  std::mutex mu;
  UniqueFunction<void()> continuation;  // guarded by mu; runs once when ready
  std::exception_ptr error;             // set before ready
  Cell* completer = nullptr;            // actor expected to complete this (ref held), for deadlocks
  bool retrieved = false;               // value already taken by the consumer

  StateBase() = default;
  StateBase(const StateBase&) = delete;
  StateBase& operator=(const StateBase&) = delete;
  ~StateBase() {
    if (completer != nullptr) cell_release(completer);
  }

  bool ready() const noexcept { return (word.load(std::memory_order_acquire) & kReady) != 0; }

  /// Marks ready (value or error already stored under mu by the caller), wakes waiters and runs
  /// the continuation. Call with `lock` held; releases it.
  void publish(std::unique_lock<std::mutex>& lock);

  /// Registers `fn` to run once ready (immediately, on this thread, if already ready).
  void on_ready(UniqueFunction<void()> fn) {
    std::unique_lock lock(mu);
    if (ready()) {
      lock.unlock();
      fn();
      return;
    }
    continuation = std::move(fn);
  }
};

void futex_wake_all(std::atomic<uint32_t>* addr) noexcept;

inline void StateBase::publish(std::unique_lock<std::mutex>& lock) {
  auto cont = std::move(continuation);
  continuation = nullptr;
  uint32_t old = word.fetch_or(kReady, std::memory_order_acq_rel);
  lock.unlock();
  if ((old & kWaiters) != 0) futex_wake_all(&word);
  if (cont) cont();
}

template <class T>
struct State final : StateBase {
  std::optional<stored_t<T>> value;
};

/// Wraps a continuation so that, when registered from inside an actor, it runs in that actor.
inline UniqueFunction<void()> in_current_actor(UniqueFunction<void()> fn) {
  Cell* c = current_cell();
  if (c == nullptr) return fn;
  cell_add_ref(c);
  struct Guard {  // releases the cell ref whether or not the continuation ever runs
    Cell* c;
    ~Guard() { cell_release(c); }
  };
  auto g = std::make_shared<Guard>(c);
  return [g, fn = std::move(fn)]() mutable { post_closure(g->c, std::move(fn)); };
}

/// Result type of a then() continuation: f(T), or f() for Future<void>.
template <class F, class T>
struct then_result {
  using type = std::invoke_result_t<F, T>;
};
template <class F>
struct then_result<F, void> {
  using type = std::invoke_result_t<F>;
};

template <class T>
struct is_future : std::false_type {};
template <class T>
struct is_future<Future<T>> : std::true_type {};

}  // namespace detail

/// The producing side of a Future. Move-only. Setting a second result throws UsageError.
/// Destroying a Promise that was never completed fails its Future with DeliveryFailure-like
/// UsageError("promise dropped"), so that no waiter hangs forever.
template <class T>
class Promise {
 public:
  Promise() : state_(std::make_shared<detail::State<T>>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&& o) noexcept {
    if (this != &o) {
      abandon();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  ~Promise() { abandon(); }

  Future<T> get_future() { return Future<T>(state_); }

  // Both setters hold their own reference to the state: once publish() wakes the waiter, the
  // waiter may destroy this Promise (and drop its reference) while we are still unlocking.
  template <class... V>
  void set_value(V&&... v) {
    auto keep = state_;
    auto& s = *keep;
    std::unique_lock lock(s.mu);
    if (s.ready()) throw UsageError("promise already satisfied");
    s.value.emplace(std::forward<V>(v)...);
    s.publish(lock);
  }

  void set_error(std::exception_ptr e) {
    auto keep = state_;
    auto& s = *keep;
    std::unique_lock lock(s.mu);
    if (s.ready()) throw UsageError("promise already satisfied");
    s.error = std::move(e);
    s.publish(lock);
  }
  template <class E>
  void set_error(E e) {
    set_error(std::make_exception_ptr(std::move(e)));
  }

  bool valid() const noexcept { return state_ != nullptr; }
  bool satisfied() const noexcept { return state_ && state_->ready(); }

  /// Internal: records the actor expected to complete this promise (deadlock detection).
  void set_completer(detail::Cell* c) noexcept {
    detail::cell_add_ref(c);
    state_->completer = c;
  }

 private:
  void abandon() noexcept {
    if (!state_ || state_->ready()) return;
    try {
      set_error(UsageError("promise dropped without a result (its message was discarded)"));
    } catch (...) {  // raced with a concurrent completion: nothing to do
    }
  }
  std::shared_ptr<detail::State<T>> state_;
};

/// The consuming side of an asynchronous result. See the file comment for threading rules.
template <class T>
class Future {
 public:
  using value_type = T;

  Future() = default;
  explicit Future(std::shared_ptr<detail::State<T>> s) : state_(std::move(s)) {}
  Future(Future&&) noexcept = default;
  Future& operator=(Future&&) noexcept = default;
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  /// A future already holding `v` (or Unit for Future<void>).
  template <class... V>
  static Future ready_value(V&&... v) {
    Promise<T> p;
    p.set_value(std::forward<V>(v)...);
    return p.get_future();
  }
  static Future ready_error(std::exception_ptr e) {
    Promise<T> p;
    p.set_error(std::move(e));
    return p.get_future();
  }

  bool valid() const noexcept { return state_ != nullptr; }
  /// True once a value or error is available (never blocks).
  bool ready() const noexcept { return state_ && state_->ready(); }

  /// Blocks until the result is available, then returns it (consuming the future) or rethrows
  /// its error. Throws DeadlockError when called by an actor on a reply only it can produce.
  T get() { return take(std::nullopt); }

  /// Like get(), but throws TimeoutError after `timeout` (any std::chrono duration); the future is
  /// then left intact and may be waited on again.
  template <class Rep, class Period>
  T get(std::chrono::duration<Rep, Period> timeout) {
    return take(std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  }

  /// Waits (without consuming) up to `timeout`; returns whether the result is ready.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) {
    check_valid();
    return detail::wait_ready(*state_, std::chrono::steady_clock::now() + timeout);
  }

  /// Chains `f(T)` (or `f()` for Future<void>); returns Future of its result. An error in this
  /// future skips `f` and is passed on; an exception thrown by `f` fails the returned future.
  /// Consumes this future. Inside an actor, `f` runs in that actor (serially with its handlers).
  template <class F>
  auto then(F f) {
    check_valid();
    using U = typename detail::then_result<F, T>::type;
    Promise<U> next;
    Future<U> out = next.get_future();
    auto s = std::move(state_);
    auto* raw = s.get();
    raw->on_ready(detail::in_current_actor(
        [s = std::move(s), next = std::move(next), f = std::move(f)]() mutable {
          if (s->error) return next.set_error(s->error);
          try {
            if constexpr (std::is_void_v<T>) {
              if constexpr (std::is_void_v<U>) {
                f();
                next.set_value();
              } else {
                next.set_value(f());
              }
            } else if constexpr (std::is_void_v<U>) {
              f(std::move(*s->value));
              next.set_value();
            } else {
              next.set_value(f(std::move(*s->value)));
            }
          } catch (...) {
            next.set_error(std::current_exception());
          }
        }));
    return out;
  }

  /// Internal: calls `fn(state)` once ready, on the completing thread. Consumes the future.
  void on_complete(detail::UniqueFunction<void(detail::State<T>&)> fn) {
    check_valid();
    auto s = std::move(state_);
    auto* raw = s.get();
    raw->on_ready([s = std::move(s), fn = std::move(fn)]() mutable { fn(*s); });
  }

  // co_await support (inside actors: resumes in the same actor; see file comment).
  bool await_ready() const noexcept { return ready(); }
  void await_suspend(std::coroutine_handle<> h) {
    check_valid();
    // If the actor can no longer run it, the suspended coroutine is destroyed (not leaked): its
    // locals are released and a pending reply fails as "promise dropped".
    struct Resume {
      std::coroutine_handle<> h;
      ~Resume() {
        if (h) h.destroy();
      }
    };
    auto r = std::make_shared<Resume>(h);
    state_->on_ready(detail::in_current_actor([r] { std::exchange(r->h, nullptr).resume(); }));
  }
  T await_resume() {
    if constexpr (std::is_void_v<T>) {
      consume();
    } else {
      return consume();
    }
  }

 private:
  void check_valid() const {
    if (!state_) throw UsageError("Future has no state (moved from or already consumed)");
  }

  T take(const detail::Deadline& deadline) {
    check_valid();
    if (!state_->ready() && !detail::wait_ready(*state_, deadline)) {
      throw TimeoutError(detail::timeout_message(*state_));
    }
    return consume();
  }

  T consume() {
    check_valid();
    auto s = std::move(state_);
    if (s->retrieved) throw UsageError("Future value already retrieved");
    s->retrieved = true;
    if (s->error) std::rethrow_exception(s->error);
    if constexpr (!std::is_void_v<T>) return std::move(*s->value);
  }

  std::shared_ptr<detail::State<T>> state_;
};

}  // namespace monarch
