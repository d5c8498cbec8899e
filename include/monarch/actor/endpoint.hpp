// Endpoints: an actor's handlers are plain member functions. Register their names once,
//
//   struct Counter : monarch::Actor {
//     int incr(int n) { return value += n; }
//     int get() const { return value; }
//     MONARCH_ENDPOINTS(Counter, incr, get)
//     int value = 0;
//   };
//
// and reports (ActorError, DeliveryFailure, the deterministic scheduler's steps) name them as
// "Counter::incr". Registration is optional in one process (any member function can be called);
// it names the endpoints that will cross process boundaries. Overloaded endpoints are not allowed.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace monarch {
template <class T>
class Task;
template <class T>
class Future;
}  // namespace monarch

namespace monarch::detail {

/// Decomposes a pointer to member function: class, return type, parameter types.
template <class M>
struct method_traits;

#define MONARCH_DETAIL_METHOD_TRAITS(QUALS)            \
  template <class C, class R, class... P>              \
  struct method_traits<R (C::*)(P...) QUALS> {         \
    using cls = C;                                     \
    using ret = R;                                     \
    using params = std::tuple<P...>;                   \
    using stored = std::tuple<std::decay_t<P>...>;     \
    static constexpr std::size_t arity = sizeof...(P); \
  };
MONARCH_DETAIL_METHOD_TRAITS()
MONARCH_DETAIL_METHOD_TRAITS(const)
MONARCH_DETAIL_METHOD_TRAITS(noexcept)
MONARCH_DETAIL_METHOD_TRAITS(const noexcept)
#undef MONARCH_DETAIL_METHOD_TRAITS

/// The value a caller receives: R for `R f()`, `Task<R> f()` and `Future<R> f()`.
template <class R>
struct reply_type {
  using type = R;
};
template <class R>
struct reply_type<Task<R>> {
  using type = R;
};
template <class R>
struct reply_type<Future<R>> {
  using type = R;
};

template <class M>
struct EndpointEntry {
  const char* name;
  M method;
};
template <class M>
constexpr EndpointEntry<M> endpoint_entry(const char* name, M m) {
  return {name, m};
}

template <class A, class = void>
struct has_endpoints : std::false_type {};
template <class A>
struct has_endpoints<A, std::void_t<decltype(A::monarch_endpoints())>> : std::true_type {};

/// Registered name of `m` on actor type A ("incr"), or nullptr when not registered.
template <class A, class M>
const char* endpoint_name(M m) {
  if constexpr (has_endpoints<A>::value) {
    const char* found = nullptr;
    std::apply(
        [&](const auto&... e) {
          (
              [&] {
                if constexpr (std::is_same_v<std::decay_t<decltype(e.method)>, M>) {
                  if (found == nullptr && e.method == m) found = e.name;
                }
              }(),
              ...);
        },
        A::monarch_endpoints());
    return found;
  } else {
    (void)m;
    return nullptr;
  }
}

/// Passes a stored argument to a parameter of type P: by lvalue for `T&`, by rvalue otherwise.
template <class P, class S>
decltype(auto) pass(S& s) {
  if constexpr (std::is_lvalue_reference_v<P> && !std::is_const_v<std::remove_reference_t<P>>) {
    return (s);
  } else {
    return std::move(s);
  }
}

/// Calls `(obj.*m)(args...)` with arguments from the stored tuple.
template <class Obj, class M, class Stored, std::size_t... I>
decltype(auto) apply_method(Obj& obj, M m, Stored& args, std::index_sequence<I...>) {
  using params = typename method_traits<M>::params;
  return (obj.*m)(pass<std::tuple_element_t<I, params>>(std::get<I>(args))...);
}
template <class Obj, class M, class Stored>
decltype(auto) apply_method(Obj& obj, M m, Stored& args) {
  return apply_method(obj, m, args, std::make_index_sequence<std::tuple_size_v<Stored>>{});
}

}  // namespace monarch::detail

// MONARCH_ENDPOINTS(Class, ep1, ep2, ...): up to 16 endpoints.
#define MONARCH_DETAIL_EXPAND(x) x
#define MONARCH_DETAIL_FE_1(m, C, x) m(C, x)
#define MONARCH_DETAIL_FE_2(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_1(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_3(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_2(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_4(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_3(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_5(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_4(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_6(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_5(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_7(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_6(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_8(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_7(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_9(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_8(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_10(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_9(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_11(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_10(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_12(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_11(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_13(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_12(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_14(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_13(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_15(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_14(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_FE_16(m, C, x, ...) \
  m(C, x), MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_FE_15(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                            N, ...)                                                                \
  N
#define MONARCH_DETAIL_FOR_EACH(m, C, ...)                                                    \
  MONARCH_DETAIL_EXPAND(MONARCH_DETAIL_PICK(                                                  \
      __VA_ARGS__, MONARCH_DETAIL_FE_16, MONARCH_DETAIL_FE_15, MONARCH_DETAIL_FE_14,          \
      MONARCH_DETAIL_FE_13, MONARCH_DETAIL_FE_12, MONARCH_DETAIL_FE_11, MONARCH_DETAIL_FE_10, \
      MONARCH_DETAIL_FE_9, MONARCH_DETAIL_FE_8, MONARCH_DETAIL_FE_7, MONARCH_DETAIL_FE_6,     \
      MONARCH_DETAIL_FE_5, MONARCH_DETAIL_FE_4, MONARCH_DETAIL_FE_3, MONARCH_DETAIL_FE_2,     \
      MONARCH_DETAIL_FE_1)(m, C, __VA_ARGS__))
#define MONARCH_DETAIL_ENTRY(C, x) ::monarch::detail::endpoint_entry(#x, &C::x)

#define MONARCH_ENDPOINTS(C, ...)                                                          \
  static auto monarch_endpoints() {                                                        \
    return std::make_tuple(MONARCH_DETAIL_FOR_EACH(MONARCH_DETAIL_ENTRY, C, __VA_ARGS__)); \
  }
