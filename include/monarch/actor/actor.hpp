// Actor: the base class of every actor. An actor owns its state and handles one message at a time;
// its endpoints are ordinary member functions (see endpoint.hpp, actor_ref.hpp).
//
//   struct Counter : monarch::Actor {
//     void init() override { /* runs before the first message */ }
//     int incr(int n) { return value += n; }
//     MONARCH_ENDPOINTS(Counter, incr)
//     int value = 0;
//   };
//   monarch::Proc proc;
//   auto c = proc.spawn<Counter>("counter");
//   int v = c.call(&Counter::incr, 5).get();  // 5
//
// Construction and init() run on a worker, before any message; if either throws, the actor is
// Failed and its owner's supervise() is called. Everything in this class that is not virtual is
// for use inside the actor's own handlers (it is not thread-safe to call from elsewhere).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>

#include "monarch/actor/actor_ref.hpp"
#include "monarch/actor/detail/cell.hpp"
#include "monarch/actor/detail/remote_factory.hpp"
#include "monarch/actor/port.hpp"
#include "monarch/actor/supervision.hpp"

namespace monarch {

class Proc;

namespace detail {
/// Creates and registers the cell of a new actor whose owner is `parent` (nullptr: the Proc).
/// `mesh_point` (may be null) is set on the cell before its first activation (Cell::mesh_point).
Cell* spawn_cell(Proc& proc, Cell* parent, std::string name, std::type_index type,
                 Cell::Factory factory, std::shared_ptr<const ndslice::Point> mesh_point = nullptr);
/// Internal: a new port id owned by `cell` (or by the Proc's client when cell is null).
PortId next_port_id(Proc& proc, Cell* cell);
}  // namespace detail

class Actor {
 public:
  Actor() = default;
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;
  virtual ~Actor() = default;

  /// Runs once, before the first message. A throw fails the actor (supervision event).
  virtual void init() {}

  /// Runs once when the actor stops, after its children stopped. `error` is set when the actor
  /// failed (or was killed). Exceptions are logged, not propagated. Keep it short: stop() callers
  /// wait for it, up to their own deadline (Proc::shutdown's `timeout`).
  virtual void cleanup(const std::optional<ActorSupervisionEvent>& error) { (void)error; }

  /// A child failed. Return true if handled (the child stays stopped, this actor goes on);
  /// false (the default) fails this actor too, and the event climbs to its own owner.
  virtual bool supervise(const ActorSupervisionEvent& event) {
    (void)event;
    return false;
  }

  /// Procs of a ProcMesh this actor spawned (HostMesh::spawn_procs called inside one of its
  /// handlers, without SpawnOptions::on_failure) failed: crashed, exited, froze past the heartbeat
  /// timeout, or one of their actors failed unhandled. Runs on this actor's thread, like any
  /// message. Return true if handled (slices without the failed ranks keep working); false (the
  /// default) fails this actor, and the failure climbs to its own owner (fail fast).
  virtual bool supervise(const MeshFailure& failure) {
    (void)failure;
    return false;
  }

  /// A fire-and-forget message this actor sent (or a Port message) could not be delivered.
  /// The default escalates: it rethrows, which fails this actor.
  virtual void undeliverable(const DeliveryFailure& failure) { throw failure; }

 protected:
  /// This actor's id. Not available in the constructor (use init()).
  const ActorId& id() const { return cell()->id(); }
  Proc& proc() const { return cell()->proc(); }

  /// A ref to this actor, typed as Self (which must be this actor's type or a base).
  template <class Self>
  ActorRef<Self> self() const {
    static_assert(std::is_base_of_v<Actor, Self>, "self<Self>(): Self must derive from Actor");
    return ActorRef<Self>(detail::CellPtr::share(cell()));
  }

  /// Spawns a child actor owned by this one: it stops before this actor, and its failures come
  /// to this actor's supervise(). Does not block; the child's init runs before its first message.
  template <class C, class... Args>
  ActorRef<C> spawn(std::string name, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, C>, "spawn<C>: C must derive from monarch::Actor");
    detail::register_endpoints<C>();
    auto factory = [... a = std::forward<Args>(args)]() mutable -> std::unique_ptr<Actor> {
      return std::make_unique<C>(std::move(a)...);
    };
    return ActorRef<C>(detail::CellPtr::adopt(
        detail::spawn_cell(proc(), cell(), std::move(name), typeid(C), std::move(factory))));
  }

  /// Spawns a child actor in the Proc serving `proc_addr` (another process): like spawn(), but
  /// across processes (see Proc::spawn_remote for ordering, arguments and errors). The child's
  /// failures come back to this actor's supervise() with the full chain, exactly like a local
  /// child's; when this actor stops, the remote child is asked to stop too (fire-and-forget: the
  /// stop does not wait for a child in a dead or frozen process). Needs a listening Proc.
  template <class C, class... Args>
  ActorRef<C> spawn_remote(const std::string& proc_addr, std::string name, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, C>,
                  "spawn_remote<C>: C must derive from monarch::Actor");
    return ActorRef<C>(&proc(),
                       detail::spawn_remote_id<C>(proc(), cell(), nullptr, proc_addr,
                                                  std::move(name), std::forward<Args>(args)...),
                       true);
  }

  /// Names this actor's type `label` in reports (supervision events and MeshFailure text,
  /// DeliveryFailure and ActorError endpoint labels) instead of its C++ type: for an actor that
  /// stands for a class of another language (the Python front end's actors report their Python
  /// class). Lookups by type still compare the C++ type. Call it at most once, from init() or a
  /// handler (UsageError on a second call); reports made before it name the C++ type.
  void set_type_label(std::string label) { cell()->set_type_label(std::move(label)); }

  /// Stops this actor once the messages already queued have run (like ref.stop()).
  void stop() { (void)cell()->request_stop(false); }

  /// A port whose messages run `handler(T)` inside this actor. The port closes when the actor
  /// stops.
  template <class T, class F>
  Port<T> open_port(F handler) {
    auto sink = std::make_shared<detail::ActorSink<T, F>>();
    sink->id = detail::next_port_id(proc(), cell());
    sink->proc = &proc();
    sink->cell = detail::CellPtr::share(cell());
    sink->handler = std::make_shared<F>(std::move(handler));
    return Port<T>(std::move(sink));
  }

 private:
  friend class detail::Cell;
  detail::Cell* cell() const {
    if (cell_ == nullptr) throw UsageError("Actor: id()/self()/spawn() used before init()");
    return cell_;
  }
  detail::Cell* cell_ = nullptr;
};

}  // namespace monarch
