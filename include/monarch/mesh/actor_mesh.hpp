// ActorMesh<A>: one actor of type A per proc of a ProcMesh, addressed as a whole or through slices.
//
//   auto procs = monarch::mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 4}});
//   auto workers = procs.spawn<Worker>("worker");             // does not block
//   auto all = workers.call(&Worker::step, 3).get();          // ValueMesh<int> over {hosts, gpus}
//   int one = workers.slice("hosts", 0).slice("gpus", 1).call_one(&Worker::step, 3).get();
//   workers.slice("gpus", ndslice::Range(0, 2)).broadcast(&Worker::reset);
//
// Adverbs (DESIGN.md vocabulary):
//   call      every member; Future<ValueMesh<R>> indexed by the view's points. If any member fails,
//             the future fails with that member's error (ActorError / DeliveryFailure).
//   call_one  the view must hold exactly one member (UsageError otherwise).
//   choose    one member picked at random.
//   stream    every member; replies in arrival order, as (local rank, value) pairs.
//   broadcast every member, fire and forget (a failing handler fails that actor: supervision).
//   reduce    every member; replies combined with an associative reducer (Sum, Min, Max, any
//             R(R, R)); the caller receives one value.
// A cast behaves exactly like one message per member from the caller (same per-pair FIFO, no
// atomicity across members). Inside a handler, Context::message_rank() is the receiver's local
// rank in the view the message was cast to.
//
// Status: members are reached directly from the caller. The tree overlay with in-tree reduction,
// the process allocator and supervision across processes are the next steps (issue 5).
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
#include "monarch/ndslice/ndslice.hpp"

namespace monarch::mesh {

/// Inside a handler reached through a mesh adverb.
struct Context {
  /// The receiver's local rank within the (sliced) view the message was cast to. Valid until the
  /// handler returns or first suspends. Throws UsageError outside a cast message.
  static size_t message_rank();
};

/// Reducers for ActorMesh::reduce: associative combines of two replies.
struct Sum {
  template <class T>
  T operator()(T a, const T& b) const { return a += b; }
};
struct Min {
  template <class T>
  T operator()(const T& a, const T& b) const { return b < a ? b : a; }
};
struct Max {
  template <class T>
  T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};

/// Replies of a stream() cast, in arrival order. Thread-safe.
template <class R>
class Stream {
 public:
  explicit Stream(size_t total) : q_(std::make_shared<Queue>()) { q_->total = total; }

  /// Replies not yet handed out by next().
  size_t remaining() const {
    std::lock_guard lock(q_->mu);
    return q_->total - q_->taken;
  }

  /// The next reply to arrive: (local rank, a ready Future<R> holding the value or the member's
  /// error). Throws TimeoutError after `timeout` (nothing is lost; call again), UsageError when
  /// every reply was already handed out.
  std::pair<size_t, Future<R>> next(std::chrono::milliseconds timeout) {
    std::unique_lock lock(q_->mu);
    if (q_->taken == q_->total) throw UsageError("Stream::next: all replies were already taken");
    if (!q_->cv.wait_for(lock, timeout, [&] { return !q_->ready.empty(); })) {
      throw TimeoutError("Stream::next: no reply within " + std::to_string(timeout.count()) +
                         " ms (" + std::to_string(q_->total - q_->taken) + " outstanding)");
    }
    auto item = std::move(q_->ready.front());
    q_->ready.pop_front();
    ++q_->taken;
    return item;
  }

  /// Internal: registers member `rank`'s reply.
  void add(size_t rank, Future<R> f) {
    auto q = q_;
    f.on_complete([q, rank](detail::State<R>& st) {
      Promise<R> p;
      if (st.error) {
        p.set_error(st.error);
      } else if constexpr (std::is_void_v<R>) {
        p.set_value();
      } else {
        p.set_value(std::move(*st.value));
      }
      std::lock_guard lock(q->mu);
      q->ready.emplace_back(rank, p.get_future());
      q->cv.notify_all();
    });
  }

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<size_t, Future<R>>> ready;
    size_t total = 0;
    size_t taken = 0;
  };
  std::shared_ptr<Queue> q_;
};

template <class A>
class ActorMesh {
 public:
  ActorMesh() = default;
  /// Internal: members by global rank of the proc mesh's base space, and the view.
  ActorMesh(std::shared_ptr<const std::vector<ActorRef<A>>> members, ndslice::Shape view)
      : members_(std::move(members)), view_(std::move(view)) {}

  const ndslice::Shape& shape() const { return view_; }
  const ndslice::Extent& extent() const { return view_.extent(); }
  size_t size() const { return view_.num_ranks(); }

  /// Views (see ndslice::Shape::slice): the dim is dropped (index) or restricted (range).
  ActorMesh slice(std::string_view dim, size_t index) const { return {members_, view_.slice(dim, index)}; }
  ActorMesh slice(std::string_view dim, const ndslice::Range& r) const {
    return {members_, view_.slice(dim, r)};
  }

  /// The member at local rank `local` of this view.
  const ActorRef<A>& at(size_t local) const { return (*members_)[view_.global_rank(local)]; }

  template <class M, class... Args>
  auto call(M method, Args&&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    using Out = std::conditional_t<std::is_void_v<R>, Unit, R>;
    struct Gather {
      std::mutex mu;
      std::vector<std::optional<Out>> values;
      size_t left = 0;
      bool failed = false;
      Promise<ndslice::ValueMesh<Out>> promise;
    };
    auto g = std::make_shared<Gather>();
    g->values.resize(size());
    g->left = size();
    auto result = g->promise.get_future();
    if (size() == 0) {
      g->promise.set_value(ndslice::ValueMesh<Out>::from_vector(extent(), {}));
      return result;
    }
    ndslice::Extent ext = extent();
    for (size_t i = 0; i < size(); ++i) {
      at(i).call_ranked(i, method, args...).on_complete([g, i, ext](auto& st) {
        std::unique_lock lock(g->mu);
        if (g->failed) return;
        if (st.error) {
          g->failed = true;
          lock.unlock();
          g->promise.set_error(st.error);
          return;
        }
        if constexpr (std::is_void_v<R>) {
          g->values[i].emplace();
        } else {
          g->values[i].emplace(std::move(*st.value));
        }
        if (--g->left != 0) return;
        std::vector<Out> out;
        out.reserve(g->values.size());
        for (auto& v : g->values) out.push_back(std::move(*v));
        lock.unlock();
        g->promise.set_value(ndslice::ValueMesh<Out>::from_vector(ext, out));
      });
    }
    return result;
  }

  /// Every member; the replies are combined with `reducer` (any associative R(R, R), e.g. Sum,
  /// Min, Max) as they arrive, so the caller receives one value. Fails with the first member
  /// error; UsageError on an empty view. Combination order is unspecified: the reducer must be
  /// associative and commutative.
  template <class Reducer, class M, class... Args>
  auto reduce(Reducer reducer, M method, Args&&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    static_assert(!std::is_void_v<R>, "reduce: the endpoint must return a value");
    if (size() == 0) throw UsageError("reduce: the mesh view " + extent().to_string() + " is empty");
    struct Acc {
      explicit Acc(Reducer r) : reducer(std::move(r)) {}
      std::mutex mu;
      std::optional<R> value;
      size_t left = 0;
      bool failed = false;
      Reducer reducer;
      Promise<R> promise;
    };
    auto acc = std::make_shared<Acc>(std::move(reducer));
    acc->left = size();
    auto result = acc->promise.get_future();
    for (size_t i = 0; i < size(); ++i) {
      at(i).call_ranked(i, method, args...).on_complete([acc](detail::State<R>& st) {
        std::unique_lock lock(acc->mu);
        if (acc->failed) return;
        if (st.error) {
          acc->failed = true;
          lock.unlock();
          return acc->promise.set_error(st.error);
        }
        try {
          acc->value = acc->value ? acc->reducer(std::move(*acc->value), *st.value) : std::move(*st.value);
        } catch (...) {
          acc->failed = true;
          lock.unlock();
          return acc->promise.set_error(std::current_exception());
        }
        if (--acc->left != 0) return;
        R out = std::move(*acc->value);
        lock.unlock();
        acc->promise.set_value(std::move(out));
      });
    }
    return result;
  }

  template <class M, class... Args>
  auto call_one(M method, Args&&... args) const {
    if (size() != 1) {
      throw UsageError("call_one: the mesh view " + extent().to_string() + " has " +
                       std::to_string(size()) + " members; slice it down to exactly one");
    }
    return at(0).call_ranked(0, method, std::forward<Args>(args)...);
  }

  template <class M, class... Args>
  auto choose(M method, Args&&... args) const {
    if (size() == 0) throw UsageError("choose: the mesh view " + extent().to_string() + " is empty");
    thread_local std::mt19937_64 rng{std::random_device{}()};
    size_t i = std::uniform_int_distribution<size_t>(0, size() - 1)(rng);
    return at(i).call_ranked(i, method, std::forward<Args>(args)...);
  }

  /// Every member; Stream::next() hands out each member's (already completed) reply future in
  /// the order the replies arrive, with the member's local rank.
  template <class M, class... Args>
  auto stream(M method, Args&&... args) const {
    using R = typename detail::reply_type<typename detail::method_traits<M>::ret>::type;
    Stream<R> out(size());
    for (size_t i = 0; i < size(); ++i) out.add(i, at(i).call_ranked(i, method, args...));
    return out;
  }

  template <class M, class... Args>
  void broadcast(M method, Args&&... args) const {
    for (size_t i = 0; i < size(); ++i) at(i).send_ranked(i, method, args...);
  }

 private:
  std::shared_ptr<const std::vector<ActorRef<A>>> members_;
  ndslice::Shape view_;
};

}  // namespace monarch::mesh
