// Ports: first-class, typed message endpoints that can be sent inside messages.
//
//   auto [port, rx] = proc.open_port<int>();      // Port<int> + PortReceiver<int>
//   worker.send(&Worker::start, port);             // the worker sends results to `port`
//   int first = rx.recv(std::chrono::seconds(1));  // TimeoutError after 1 s; rx stays usable
//
//   auto [once, fut] = proc.open_once_port<std::string>();  // single reply -> Future
//
// Inside an actor, `open_port<T>(handler)` makes a port whose messages run `handler(T)` inside
// that actor, serially with its other handlers.
//
// Port::send from any thread; messages from one sender to one port arrive in send order. If the
// port is closed (its PortReceiver was destroyed, or its actor stopped) the message is returned
// as DeliveryFailure to the sending actor's undeliverable() (outside actors: the fault hook).
// OncePort::send a second time throws UsageError at the sender.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeindex>
#include <utility>

#include "monarch/actor/actor_ref.hpp"
#include "monarch/actor/detail/cell.hpp"
#include "monarch/actor/errors.hpp"
#include "monarch/actor/future.hpp"

namespace monarch {

/// Names a port: its owner (an actor, or the Proc's client "proc.client[0]") and an index.
struct PortId {
  ActorId owner;
  uint64_t index = 0;
  std::string to_string() const { return owner.to_string() + "." + label(index); }
  /// "port[N]": the endpoint label of a DeliveryFailure for a send to port N, on every path
  /// (the sender's own Proc, the receiving Proc's report, a channel's return).
  static std::string label(uint64_t index) { return "port[" + std::to_string(index) + "]"; }
  /// Whether a DeliveryFailure's endpoint label names a port (see label()).
  static bool is_label(std::string_view endpoint) { return endpoint.starts_with("port["); }
  bool operator==(const PortId&) const = default;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(owner, index);
  }
};

namespace detail {

/// The Proc's name (its address when it listens); defined in proc.cpp.
const std::string& proc_name(Proc& p);

/// Drives the deterministic scheduler on this thread until pred() holds; returns false when no
/// deterministic scheduler drives this thread (then the caller blocks normally).
bool drive_deterministic(const std::function<bool()>& pred);

template <class T>
struct PortSink {
  PortId id;
  Proc* proc = nullptr;
  virtual ~PortSink() = default;
  /// Delivers v; returns false when the port is closed.
  virtual bool deliver(T&& v) = 0;
};

template <class T>
struct QueueSink final : PortSink<T> {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<T> items;
  bool closed = false;

  bool deliver(T&& v) override {
    {
      std::lock_guard lock(mu);
      if (closed) return false;
      items.push_back(std::move(v));
    }
    cv.notify_one();
    return true;
  }
  std::optional<T> try_pop() {
    std::lock_guard lock(mu);
    if (items.empty()) return std::nullopt;
    T v = std::move(items.front());
    items.pop_front();
    return v;
  }
  bool has_items() {
    std::lock_guard lock(mu);
    return !items.empty();
  }
};

template <class T, class F>
struct ActorSink final : PortSink<T> {
  CellPtr cell;
  std::shared_ptr<F> handler;
  bool deliver(T&& v) override {
    if (cell->terminal()) return false;
    post_closure(cell.get(), [h = handler, v = std::move(v)]() mutable { (*h)(std::move(v)); });
    return true;
  }
};

template <class T>
struct OnceSink final : PortSink<T> {
  Promise<T> promise;
  std::atomic<bool> used{false};
  bool deliver(T&& v) override {
    if (used.exchange(true)) throw UsageError("OncePort " + this->id.to_string() + " used twice");
    promise.set_value(std::move(v));
    return true;
  }
};

// Ports crossing processes (implemented in remote.cpp). A port serialised into a message is
// exported by its Proc under its index; a port decoded in another Proc sends back through it.
using PortBytesDeliver = std::function<bool(std::span<const std::byte>)>;
void export_port(Proc& proc, uint64_t index, std::weak_ptr<void> sink, std::type_index type,
                 PortBytesDeliver deliver);
std::shared_ptr<void> find_exported_port(Proc& proc, uint64_t index, std::type_index type);
void remote_port_send(Proc& proc, const PortId& id, std::vector<std::byte> payload);

template <class T>
struct RemotePortSink final : PortSink<T> {
  bool once = false;
  std::atomic<bool> used{false};
  bool deliver(T&& v) override {
    if constexpr (wire::is_serializable_v<T>) {
      if (once && used.exchange(true))
        throw UsageError("OncePort " + this->id.to_string() + " used twice");
      remote_port_send(*this->proc, this->id, wire::encode(v));
      return true;
    } else {
      throw UsageError("port message type is not serialisable; cannot send to " +
                       this->id.to_string());
    }
  }
};

template <class Archive, class T>
void save_port(Archive& ar, const std::shared_ptr<PortSink<T>>& sink, bool once) {
  if (!sink) throw UsageError("cannot send an empty Port");
  if constexpr (wire::is_serializable_v<T>) {
    if (dynamic_cast<RemotePortSink<T>*>(sink.get()) == nullptr) {
      std::weak_ptr<PortSink<T>> weak = sink;
      export_port(*sink->proc, sink->id.index, std::static_pointer_cast<void>(sink), typeid(T),
                  [weak](std::span<const std::byte> b) {
                    auto s = weak.lock();
                    return s && s->deliver(wire::decode<T>(b));
                  });
    }
    ar(sink->id, once);
  } else {
    throw UsageError("port " + sink->id.to_string() +
                     " carries a type that is not serialisable; it cannot leave its process");
  }
}

template <class Archive, class T>
std::shared_ptr<PortSink<T>> load_port(Archive& ar) {
  PortId id;
  bool once = false;
  ar(id, once);
  Proc* p = decoding_proc();
  if (p == nullptr) throw UsageError("Port decoded outside a Proc's message handling");
  if (id.owner.proc == proc_name(*p)) {
    if (auto local = find_exported_port(*p, id.index, typeid(T))) {
      return std::static_pointer_cast<PortSink<T>>(local);
    }
  }
  auto r = std::make_shared<RemotePortSink<T>>();
  r->id = std::move(id);
  r->proc = p;
  r->once = once;
  return r;
}

template <class T>
void port_send(PortSink<T>& sink, T&& v) {
  if (!sink.deliver(std::move(v))) {
    route_undeliverable(
        current_cell(), sink.proc,
        DeliveryFailure(sink.id.owner, PortId::label(sink.id.index), "port closed"));
  }
}

}  // namespace detail

template <class T>
class Port {
 public:
  Port() = default;
  explicit Port(std::shared_ptr<detail::PortSink<T>> s) : sink_(std::move(s)) {}
  /// Sends v to the port. See the file comment for failures.
  void send(T v) const {
    check();
    detail::port_send(*sink_, std::move(v));
  }
  const PortId& id() const {
    check();
    return sink_->id;
  }
  bool valid() const noexcept { return sink_ != nullptr; }

  // Ports travel inside messages to other processes (as their PortId).
  template <class Archive>
  void save(Archive& ar) const {
    detail::save_port(ar, sink_, false);
  }
  template <class Archive>
  void load(Archive& ar) {
    sink_ = detail::load_port<Archive, T>(ar);
  }

 private:
  void check() const {
    if (!sink_) throw UsageError("Port is empty (default-constructed)");
  }
  std::shared_ptr<detail::PortSink<T>> sink_;
};

template <class T>
class OncePort {
 public:
  OncePort() = default;
  explicit OncePort(std::shared_ptr<detail::PortSink<T>> s) : sink_(std::move(s)) {}
  /// Completes the paired Future with v. Throws UsageError when used a second time.
  void send(T v) const {
    if (!sink_) throw UsageError("OncePort is empty (default-constructed)");
    detail::port_send<T>(*sink_, std::move(v));
  }
  const PortId& id() const { return sink_->id; }
  bool valid() const noexcept { return sink_ != nullptr; }

  template <class Archive>
  void save(Archive& ar) const {
    detail::save_port(ar, sink_, true);
  }
  template <class Archive>
  void load(Archive& ar) {
    sink_ = detail::load_port<Archive, T>(ar);
  }

 private:
  std::shared_ptr<detail::PortSink<T>> sink_;
};

/// Receiving end of a Port<T>. Move-only; destroying it closes the port.
template <class T>
class PortReceiver {
 public:
  PortReceiver() = default;
  explicit PortReceiver(std::shared_ptr<detail::QueueSink<T>> s) : sink_(std::move(s)) {}
  PortReceiver(PortReceiver&&) noexcept = default;
  PortReceiver& operator=(PortReceiver&& o) noexcept {
    close();
    sink_ = std::move(o.sink_);
    return *this;
  }
  ~PortReceiver() { close(); }

  /// Next message, blocking until one arrives.
  T recv() { return wait(std::nullopt); }
  /// Next message; throws TimeoutError if none arrives within `timeout` (nothing is lost).
  template <class Rep, class Period>
  T recv(std::chrono::duration<Rep, Period> timeout) {
    return wait(std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout));
  }
  /// Next message if one is queued.
  std::optional<T> try_recv() {
    check();
    return sink_->try_pop();
  }
  const PortId& id() const { return sink_->id; }

 private:
  void check() const {
    if (!sink_) throw UsageError("PortReceiver is empty (moved from)");
  }
  void close() {
    if (!sink_) return;
    std::lock_guard lock(sink_->mu);
    sink_->closed = true;
  }
  T wait(const std::optional<std::chrono::steady_clock::time_point>& deadline) {
    check();
    auto& s = *sink_;
    if (detail::drive_deterministic([&] { return s.has_items(); })) {
      if (auto v = s.try_pop()) return std::move(*v);
      if (!deadline)
        throw DeadlockError("PortReceiver::recv on " + s.id.to_string() +
                            ": no actor left to run and no message queued");
      throw TimeoutError("PortReceiver::recv on " + s.id.to_string() + ": timed out");
    }
    std::unique_lock lock(s.mu);
    auto has = [&] { return !s.items.empty(); };
    if (!deadline) {
      s.cv.wait(lock, has);
    } else if (!s.cv.wait_until(lock, *deadline, has)) {
      throw TimeoutError("PortReceiver::recv on " + s.id.to_string() + ": timed out");
    }
    T v = std::move(s.items.front());
    s.items.pop_front();
    return v;
  }
  std::shared_ptr<detail::QueueSink<T>> sink_;
};

}  // namespace monarch
