// Internal: a move-only `void()` / `R()` callable wrapper (std::function requires copyable targets;
// continuations own move-only things such as Promises and coroutine handles).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace monarch::detail {

template <class Sig>
class UniqueFunction;

template <class R, class... A>
class UniqueFunction<R(A...)> {
 public:
  UniqueFunction() = default;
  UniqueFunction(std::nullptr_t) {}  // NOLINT: like std::function
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, UniqueFunction>>>
  UniqueFunction(F&& f)  // NOLINT: implicit like std::function
      : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}
  UniqueFunction(UniqueFunction&&) noexcept = default;
  UniqueFunction& operator=(UniqueFunction&&) noexcept = default;

  R operator()(A... a) { return impl_->call(std::forward<A>(a)...); }
  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual R call(A... a) = 0;
  };
  template <class F>
  struct Impl final : Base {
    explicit Impl(F&& f) : fn(std::move(f)) {}
    explicit Impl(const F& f) : fn(f) {}
    R call(A... a) override { return fn(std::forward<A>(a)...); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

}  // namespace monarch::detail
