// One member's request of a cast whose handler returns a plain value (not a Task or a Future):
// the member's envelope folds its reply straight into the tree node that delivered it, without a
// Future per member (CAST-8). Shared by the in-process relay (cast_job.hpp) and the relay across
// processes (cast_remote.hpp); each supplies the Sink that knows its node.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "monarch/actor/runtime.hpp"

namespace monarch::mesh::detail {

/// Posts `e` to `c`, or, when there is no such actor (`c` null), bounces it with a
/// DeliveryFailure naming `to` (an empty id when null) and deletes it. The reason is
/// that of `proc->gone_actor_failure` when `proc` (the member's own Proc, as a relay across
/// processes has it) is given: "actor T 'name' was stopped", as a direct message would say;
/// else "unknown actor".
void bounce_unknown_actor(monarch::detail::Envelope* e, const ActorId* to, Proc* proc = nullptr);
inline void post_or_bounce(monarch::detail::Cell* c, monarch::detail::Envelope* e,
                           const ActorId* to, Proc* proc = nullptr) {
  if (c != nullptr) return c->post(e);
  bounce_unknown_actor(e, to, proc);
}

/// The handler's reply type of endpoint M (void for void handlers).
template <class M>
using cast_reply_t =
    typename monarch::detail::reply_type<typename monarch::detail::method_traits<M>::ret>::type;

/// Whether a member's reply to endpoint M can be folded by its envelope (a plain value).
template <class M>
inline constexpr bool member_replies_directly_v =
    !monarch::detail::is_task<typename monarch::detail::method_traits<M>::ret>::value &&
    !monarch::detail::is_future<typename monarch::detail::method_traits<M>::ret>::value;

/// The envelope of one member's request. Sink is where the reply goes:
///   const Stored& args() const      the converted argument tuple (copied here, once per member)
///   void done()  / void done(R&&)   the handler returned (void / a value); on the member's thread,
///                                   outside the handler's try (only the handler's own throw is
///                                   the member's error)
///   void fail(std::exception_ptr)   the handler threw (an ActorError naming the member) or the
///                                   member cannot be reached (its DeliveryFailure, from bounce)
template <class A, class M, class Sink>
struct MemberCall final : monarch::detail::Envelope {
  using Stored = typename monarch::detail::method_traits<M>::stored;
  using R = cast_reply_t<M>;

  MemberCall(Sink s, M m) : sink(std::move(s)), method(m) {}
  Sink sink;
  M method;

  void invoke(monarch::detail::Cell& c) override {
    A& self = static_cast<A&>(*c.actor());
    Stored a = sink.args();  // the handler may move from its own copy
    if constexpr (std::is_void_v<R>) {
      try {
        monarch::detail::apply_method(self, method, a);
      } catch (...) {
        return failed(c);
      }
      sink.done();
    } else {
      std::optional<R> v;
      try {
        v.emplace(monarch::detail::apply_method(self, method, a));
      } catch (...) {
        return failed(c);
      }
      sink.done(std::move(*v));
    }
  }
  void bounce(const DeliveryFailure& f) noexcept override { sink.fail(std::make_exception_ptr(f)); }
  std::string_view endpoint() const noexcept override {
    const char* n = monarch::detail::endpoint_name<A>(method);
    return n != nullptr ? n : "<endpoint>";
  }

 private:
  // The handler threw (called from its catch block): an ActorError naming the member.
  void failed(monarch::detail::Cell& c) {
    sink.fail(std::make_exception_ptr(ActorError(
        c.id(),
        monarch::detail::endpoint_label(c.type_name(), monarch::detail::endpoint_name<A>(method)),
        monarch::detail::describe_exception(std::current_exception()))));
  }
};

}  // namespace monarch::mesh::detail
