// Proc: the process-level container of actors: its scheduler, its mailbox router (actor registry),
// well-known named actors, and the root of its supervision tree.
//
//   monarch::Proc proc;                                    // one worker per core
//   auto c = proc.spawn<Counter>("counter");               // owned by the Proc
//   proc.set_fault_hook([](const monarch::ActorSupervisionEvent& e) { ... });
//
// Supervision: a top-level actor's failure that nobody handled reaches the Proc's fault hook. The
// default hook prints the whole chain to stderr and exits the process with status 1 (fail fast).
// Destroying the Proc stops every actor (children first), waiting up to ProcOptions::stop_timeout
// and logging the actors that did not stop in time; it then joins its worker threads, which
// finish the handlers still running (C++ cannot interrupt a running function: a handler that
// never returns keeps the destructor waiting).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "monarch/actor/actor.hpp"
#include "monarch/actor/actor_ref.hpp"
#include "monarch/actor/port.hpp"
#include "monarch/actor/scheduler.hpp"
#include "monarch/actor/supervision.hpp"
#include "monarch/channel/channel.hpp"

namespace monarch {

namespace detail {
class Registry;
}

/// Defaults of workers, batch and stop_timeout come from the config layer (actor.* keys,
/// docs/config.md); setting a field in code overrides them.
struct ProcOptions {
  /// Name used in ActorIds: actors are "<name>.<actor>[<uid>]".
  std::string name = "local[0]";
  /// Worker threads; 0 = one per core (std::thread::hardware_concurrency()).
  size_t workers = static_cast<size_t>(config::global().integer("actor.workers"));
  /// Messages one actor runs per activation before yielding its worker (fairness vs throughput).
  size_t batch = static_cast<size_t>(config::global().integer("actor.batch"));
  /// Use the DeterministicScheduler: no threads; the test steps messages (see scheduler.hpp).
  bool deterministic = false;
  /// How long ~Proc / shutdown() waits for actors to stop, in ms.
  std::chrono::milliseconds stop_timeout = config::global().duration("actor.stop_timeout");
  /// Channel address to serve, making this Proc's actors reachable from other processes (and
  /// letting it receive replies from them), e.g. "unix://@job-7/p0" or "tcp://0.0.0.0:0". When
  /// set, the Proc's name becomes the bound address, so every ActorId says where its actor lives.
  /// Empty: this Proc talks to other processes not at all.
  std::string listen{};
  /// Settings for the channels of `listen` (timeouts, max message size, TCP secret).
  channel::ChannelOptions channel{};
  /// Run on this scheduler instead of one of the Proc's own (many Procs sharing one pool, as the
  /// mesh LocalAllocator does). The Proc then does not shut it down; its owner does, after the
  /// Procs are gone. Ignored with `deterministic`.
  std::shared_ptr<Scheduler> scheduler{};
};

class Proc {
 public:
  using FaultHook = std::function<void(const ActorSupervisionEvent&)>;

  explicit Proc(ProcOptions options = {});
  ~Proc();
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  /// Spawns a top-level actor owned by this Proc. Does not block: construction and init() run on
  /// a worker before the first message. `args` are copied into the actor's constructor.
  /// Any thread (inside an actor, prefer Actor::spawn so the new actor is that actor's child).
  template <class A, class... Args>
  ActorRef<A> spawn(std::string name, Args&&... args) {
    return spawn_member<A>(nullptr, std::move(name), std::forward<Args>(args)...);
  }

  /// Internal API for the mesh layer (ProcMesh::spawn): spawn(), for a member of an ActorMesh.
  /// `mesh_point` (may be null: a plain spawn) is the actor's point in that mesh, which its
  /// handlers read as Context::actor_rank(); it is set before the actor's init() runs. Any thread.
  template <class A, class... Args>
  ActorRef<A> spawn_member(std::shared_ptr<const ndslice::Point> mesh_point, std::string name,
                           Args&&... args) {
    static_assert(std::is_base_of_v<Actor, A>, "spawn<A>: A must derive from monarch::Actor");
    detail::register_endpoints<A>();
    auto factory = [... a = std::forward<Args>(args)]() mutable -> std::unique_ptr<Actor> {
      return std::make_unique<A>(std::move(a)...);
    };
    return ActorRef<A>(detail::CellPtr::adopt(detail::spawn_cell(
        *this, nullptr, std::move(name), typeid(A), std::move(factory), std::move(mesh_point))));
  }

  /// Spawns an actor of type A in the Proc serving `proc_addr` (usually another process running
  /// this same binary as a worker) and returns its ref at once: it does not wait for a round trip.
  /// The actor is owned by this Proc's client (inside an actor, use Actor::spawn_remote to make it
  /// that actor's child).
  ///
  /// - Ordering: the Spawn message travels on the same FIFO link as every later message from this
  ///   Proc to that Proc, and the receiving Proc creates the actor as soon as it reads it, so
  ///   messages sent on the ref right away run after the actor's constructor and init(), in order.
  /// - Id: `{proc_addr, name, uid}`, the uid picked here without asking the other Proc: bit 63 set
  ///   (never a uid of a locally spawned actor) and the rest from a random per-Proc base plus a
  ///   counter. The receiving Proc refuses (spawn failure) a uid it already has.
  /// - Arguments: copied into the message with cereal (each must be serialisable; a string
  ///   literal travels as std::string). The factory is found on the other side by the key
  ///   "<A>(<argument types>)", registered in any binary that contains this call.
  /// - Failures (no factory for the key in that binary, arguments that do not decode, a constructor
  ///   or init() that throws, later failures of the actor, an unreachable Proc): an
  ///   ActorSupervisionEvent for the actor reaches the owner (here: this Proc's fault hook, which
  ///   by default exits; it runs on the channel I/O thread). Calls on the ref then fail with
  ///   DeliveryFailure naming the actor id and, when known, its type and the cause.
  /// Throws UsageError when this Proc does not listen or `proc_addr` is malformed, and
  /// SupervisionError when that Proc was declared failed (declare_proc_failed). Any thread.
  template <class A, class... Args>
  ActorRef<A> spawn_remote(const std::string& proc_addr, std::string name, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, A>,
                  "spawn_remote<A>: A must derive from monarch::Actor");
    return ActorRef<A>(this,
                       detail::spawn_remote_id<A>(*this, nullptr, nullptr, proc_addr,
                                                  std::move(name), std::forward<Args>(args)...),
                       true);
  }

  /// Internal API for the mesh layer (ProcMesh::spawn on a process mesh): spawn_remote(), for a
  /// member of an ActorMesh whose point there is `mesh_point`. The point travels in the Spawn
  /// message (no other message carries it) and is set before the actor's init() runs there; its
  /// handlers read it as Context::actor_rank(). Same errors as spawn_remote. Any thread.
  template <class A, class... Args>
  ActorRef<A> spawn_remote_member(const ndslice::Point& mesh_point, const std::string& proc_addr,
                                  std::string name, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, A>,
                  "spawn_remote<A>: A must derive from monarch::Actor");
    return ActorRef<A>(this,
                       detail::spawn_remote_id<A>(*this, nullptr, &mesh_point, proc_addr,
                                                  std::move(name), std::forward<Args>(args)...),
                       true);
  }

  /// Internal API for the mesh layer: the Proc at `proc_addr` crashed, froze or was lost (`cause`,
  /// e.g. "process exited with signal 9"). Every pending call (and remote stop/kill/lookup) to
  /// actors of that Proc fails at once with SupervisionError; later calls, sends, stops and spawns
  /// to it fail at once with SupervisionError too (sends throw it), even if something answers at
  /// that address again: a failed Proc is never reused. The link to it is closed. Idempotent (the
  /// first cause is kept). Any thread. No-op when this Proc does not listen.
  /// `owner`: the actor of this Proc that hears of the failure as a MeshFailure (its supervise(),
  /// when it owns the mesh); uid 0 when none does. What that actor sent to the failed Proc and
  /// comes back undelivered is not reported to its undeliverable() a second time (REM-6), as for
  /// code outside actors.
  void declare_proc_failed(const std::string& proc_addr, const std::string& cause,
                           const ActorId& owner = {});
  /// Whether declare_proc_failed(proc_addr, ...) was called.
  bool proc_failed(const std::string& proc_addr) const;
  /// The cause given to the first declare_proc_failed(proc_addr, ...), if any. Any thread.
  std::optional<std::string> proc_failure(const std::string& proc_addr) const;
  /// Why this Proc's link to the Proc at `proc_addr` last failed to connect (the channel's
  /// Sender::last_connection_error(), e.g. "Connection refused"); empty when there is no link,
  /// it is connected, or no attempt failed yet. For error reports (a peer that is down is
  /// retried quietly). Any thread.
  std::string link_error(const std::string& proc_addr) const;
  /// How many procs were declared failed so far (never decreases): a cheap check before asking
  /// proc_failure for each address of a mesh. Any thread.
  size_t failed_proc_count() const noexcept;
  /// The Proc at `proc_addr` is gone by design (it exited, or is exiting, because it was asked to
  /// stop): closes this Proc's link to it without warnings, so that neither a later shutdown nor
  /// the channel's delivery_timeout waits on messages it will never acknowledge. Messages to it
  /// not yet acknowledged are dropped with a debug log (sends and spawns are not bounced to their
  /// senders); calls, lookups and remote stops pending on it fail with DeliveryFailure ("link to
  /// proc closed: <why>"). Unlike declare_proc_failed the address is not barred: a later message
  /// opens a new link. While nothing answers there, that link closes at its first refused
  /// connection, so a later call (a stale reference) fails at once with DeliveryFailure ("peer
  /// <addr> has exited (Connection refused); <why>") and a later send comes back as undeliverable
  /// the same way, instead of after channel.delivery_timeout. Replies this Proc still owes to calls
  /// from `proc_addr` are dropped with a debug log (even when there is no link yet), until a
  /// request comes from that address again. For a proc that crashed or froze use
  /// declare_proc_failed. `why` appears in the debug log and in those DeliveryFailures. Any thread;
  /// never blocks on the network; throws nothing; no-op when this Proc does not listen.
  void forget_proc(const std::string& proc_addr, const std::string& why);

  /// A ref to the actor registered as `name` (register_name) in the Proc serving `proc_addr`.
  /// The future fails with DeliveryFailure if that Proc cannot be reached, or UsageError if it
  /// has no such name or the actor there is not an A. This Proc must listen (ProcOptions::listen).
  template <class A>
  Future<ActorRef<A>> lookup_remote(const std::string& proc_addr, const std::string& name) {
    return remote_lookup_id(proc_addr, name, detail::demangle(typeid(A).name()))
        .then([this](ActorId id) { return ActorRef<A>(this, std::move(id), true); });
  }

  /// The address other processes reach this Proc at (empty when it does not listen).
  std::string address() const;

  /// Makes `ref` findable by `name` through lookup(). Throws UsageError if the name is taken.
  template <class A>
  void register_name(const std::string& name, const ActorRef<A>& ref) {
    register_cell(name, ref.cell());
  }
  /// The actor registered under `name`, if any. Throws UsageError if its type is not A.
  template <class A>
  std::optional<ActorRef<A>> lookup(const std::string& name) {
    auto c = lookup_cell(name, typeid(A));
    if (!c) return std::nullopt;
    return ActorRef<A>(std::move(c));
  }
  /// A ref to the actor with this id. An id that is not (or no longer) live still gives a ref;
  /// its messages come back as DeliveryFailure("unknown actor").
  template <class A>
  ActorRef<A> resolve(const ActorId& id) {
    auto c = find(id);
    if (!c) return ActorRef<A>(this, id);
    return ActorRef<A>(std::move(c));
  }

  /// A port and its receiver, owned by this Proc's client (for code outside actors).
  template <class T>
  std::pair<Port<T>, PortReceiver<T>> open_port() {
    auto sink = std::make_shared<detail::QueueSink<T>>();
    sink->id = detail::next_port_id(*this, nullptr);
    sink->proc = this;
    return {Port<T>(sink), PortReceiver<T>(sink)};
  }
  /// A single-use port and the Future it completes.
  template <class T>
  std::pair<OncePort<T>, Future<T>> open_once_port() {
    auto sink = std::make_shared<detail::OnceSink<T>>();
    sink->id = detail::next_port_id(*this, nullptr);
    sink->proc = this;
    auto f = sink->promise.get_future();
    return {OncePort<T>(sink), std::move(f)};
  }

  /// Replaces the unhandled-fault hook (see the file comment). Called on a worker thread.
  void set_fault_hook(FaultHook hook);

  /// Stops every actor (children before parents, pending messages drained) and waits up to
  /// `timeout`. Returns true when all stopped in time; otherwise logs the ones still running.
  bool shutdown(std::chrono::milliseconds timeout);
  /// Asks every top-level actor to stop (drain) and returns at once; shutdown() waits.
  void begin_shutdown();

  /// Live actors (spawned and not yet Stopped/Failed).
  size_t num_actors() const;
  const std::string& name() const { return options_.name; }
  /// Whether begin_shutdown() (or shutdown(), or the destructor) ran: spawn() then throws
  /// UsageError. Any thread.
  bool shutting_down() const {
    std::lock_guard lock(mu_);
    return shutting_down_;
  }
  const ProcOptions& options() const { return options_; }
  Scheduler& scheduler() { return *scheduler_; }
  /// The deterministic scheduler; throws UsageError unless ProcOptions::deterministic.
  DeterministicScheduler& test_scheduler();

  // Internal (used by the runtime).
  struct Remote;
  Remote& remote();
  Future<ActorId> remote_lookup_id(const std::string& proc_addr, const std::string& name,
                                   const std::string& type_name);
  void on_root_event(const ActorSupervisionEvent& ev);
  /// An actor of this Proc failed: later messages to it (once it is unregistered) fail with its
  /// cause rather than "unknown actor". Called by the actor's cell before it unregisters.
  void remember_failed_actor(const ActorSupervisionEvent& ev);
  /// The DeliveryFailure of a message for `endpoint` to this Proc's actor `id`, which is not
  /// registered. Its reason is the actor's tombstone ("actor T 'name' was stopped", "actor T
  /// 'name' failed: cause", with actor_failed() set) while this Proc listens and remembers it,
  /// else "unknown actor". Any thread.
  DeliveryFailure gone_actor_failure(const ActorId& id, std::string endpoint);
  /// A remotely spawned actor failed: send the event to its owner in another Proc.
  void forward_supervision(const ActorId& owner, std::shared_ptr<const ActorSupervisionEvent> ev);
  /// Asks the remote actor `id` to stop, not waiting (an owner stopping its remote children).
  void stop_remote_child(const ActorId& id, bool kill);
  void on_root_child_stopped(detail::Cell* c);
  void report_undeliverable(const DeliveryFailure& f);
  bool register_cell_uid(detail::Cell* c);  // false: uid taken (remote spawn)
  void unregister_cell(detail::Cell* c);
  uint64_t next_uid() { return next_uid_.fetch_add(1, std::memory_order_relaxed); }
  void add_root_child(detail::Cell* c);

 private:
  void start_remote();
  void stop_remote();
  void register_cell(const std::string& name, detail::Cell* c);
  detail::CellPtr lookup_cell(const std::string& name, std::type_index type);
  detail::CellPtr find(const ActorId& id);

  ProcOptions options_;
  std::shared_ptr<Scheduler> scheduler_;
  bool owns_scheduler_ = true;
  std::atomic<uint64_t> next_uid_{1};  // uid 0 names the Proc's client (outside any actor)

  std::unique_ptr<detail::Registry> registry_;  // uid -> Cell (not owning)
  std::atomic<size_t> live_{0};

  mutable std::mutex mu_;  // names_, the root list, fault_hook_
  std::condition_variable root_cv_;
  std::unordered_map<std::string, detail::CellPtr> names_;
  detail::Cell* root_head_ = nullptr;  // top-level actors (intrusive list; references held)
  size_t root_count_ = 0;
  bool shutting_down_ = false;  // begin_shutdown() ran: no new top-level actors (guarded by mu_)
  FaultHook fault_hook_;
  std::unique_ptr<Remote> remote_;  // channel state when listening
};

namespace detail {
template <class A>
ActorRef<A> resolve_incoming(const ActorId& id) {
  Proc* p = decoding_proc();
  if (p == nullptr) throw UsageError("ActorRef decoded outside a Proc's message handling");
  if (id.proc == p->name()) return p->resolve<A>(id);
  return ActorRef<A>(p, id, true);
}
}  // namespace detail

}  // namespace monarch
