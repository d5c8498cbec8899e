// Task<T>: the return type of a coroutine endpoint. An endpoint declared as
//
//   monarch::Task<int> fetch(int key) { int v = co_await other.call(&Store::get, key); co_return v;
//   }
//
// is called like any other endpoint (`ref.call(&A::fetch, 1)` gives Future<int>). The coroutine
// starts at once, inside the actor, and runs until its first co_await on a pending Future; the
// actor then goes on handling other messages, and the coroutine resumes later inside the same
// actor, serially with its handlers. The reply is sent when the coroutine finishes. An exception
// escaping the coroutine is an ActorError to a caller, or a failure of the actor for a send.
//
// A Task can also be co_awaited from another Task (it then runs inline, on the same actor).
#pragma once

#include <coroutine>
#include <exception>
#include <functional>
#include <optional>
#include <utility>

#include "monarch/actor/future.hpp"

namespace monarch {

template <class T>
class Task;

namespace detail {

template <class T>
struct TaskPromiseBase {
  std::optional<stored_t<T>> value;
  std::exception_ptr error;
  UniqueFunction<void(TaskPromiseBase&)> on_done;  // set when the runtime takes the task over
  bool finished = false;

  std::suspend_never initial_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }

  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) noexcept {
      auto& p = h.promise();
      p.finished = true;
      if (p.on_done) {
        auto done = std::move(p.on_done);
        done(p);
        h.destroy();
      }
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
};

template <class T>
struct TaskPromise : TaskPromiseBase<T> {
  Task<T> get_return_object();
  template <class V>
  void return_value(V&& v) {
    this->value.emplace(std::forward<V>(v));
  }
};

template <>
struct TaskPromise<void> : TaskPromiseBase<void> {
  Task<void> get_return_object();
  void return_void() { this->value.emplace(); }
};

}  // namespace detail

template <class T = void>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  using handle = std::coroutine_handle<promise_type>;
  using value_type = T;

  explicit Task(handle h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  /// Hands the coroutine to `done`, called once with the promise (value or error) when it
  /// finishes (immediately if it already has). The coroutine frame then frees itself.
  void detach(detail::UniqueFunction<void(detail::TaskPromiseBase<T>&)> done) && {
    auto h = std::exchange(h_, nullptr);
    auto& p = h.promise();
    if (p.finished) {
      done(p);
      h.destroy();
      return;
    }
    p.on_done = std::move(done);
  }

  /// Converts to a Future<T> completed when the coroutine finishes.
  Future<T> to_future() && {
    Promise<T> pr;
    auto f = pr.get_future();
    std::move(*this).detach([pr = std::make_shared<Promise<T>>(std::move(pr))](auto& p) {
      if (p.error) return pr->set_error(p.error);
      if constexpr (std::is_void_v<T>) {
        pr->set_value();
      } else {
        pr->set_value(std::move(*p.value));
      }
    });
    return f;
  }

  // co_await one Task from another: resumes the awaiting coroutine when this one finishes.
  bool await_ready() const noexcept { return h_.promise().finished; }
  void await_suspend(std::coroutine_handle<> awaiting) {
    h_.promise().on_done = [awaiting](detail::TaskPromiseBase<T>&) { awaiting.resume(); };
    done_by_runtime_ = true;
  }
  T await_resume() {
    auto& p = h_.promise();
    if (p.error) std::rethrow_exception(p.error);
    if constexpr (!std::is_void_v<T>) return std::move(*p.value);
  }

 private:
  void reset() noexcept {
    // When awaited, the finished frame destroyed itself in final_suspend.
    if (h_ && !done_by_runtime_) h_.destroy();
    h_ = nullptr;
  }
  handle h_;
  bool done_by_runtime_ = false;
};

namespace detail {
template <class T>
Task<T> TaskPromise<T>::get_return_object() {
  return Task<T>(std::coroutine_handle<TaskPromise<T>>::from_promise(*this));
}
inline Task<void> TaskPromise<void>::get_return_object() {
  return Task<void>(std::coroutine_handle<TaskPromise<void>>::from_promise(*this));
}
}  // namespace detail

}  // namespace monarch
