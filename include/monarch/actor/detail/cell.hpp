// Internal: Cell, the runtime record of one actor: mailbox, lifecycle, parent/children, and the
// actor object itself. Reference-counted; ActorRefs, the scheduler and children hold references.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeindex>
#include <vector>

#include "monarch/actor/actor_id.hpp"
#include "monarch/actor/detail/mailbox.hpp"
#include "monarch/actor/detail/unique_function.hpp"
#include "monarch/actor/future.hpp"
#include "monarch/actor/lifecycle.hpp"
#include "monarch/actor/supervision.hpp"

namespace monarch {
class Actor;
class Proc;
}  // namespace monarch
namespace monarch::ndslice {
class Point;
}  // namespace monarch::ndslice

namespace monarch::detail {

/// Number of Cells alive in this process (leak checks in tests).
size_t live_cells() noexcept;

class Cell {
 public:
  using Factory = UniqueFunction<std::unique_ptr<Actor>()>;

  /// A new cell with one reference (the caller's). `parent` (may be null) gets a reference held
  /// until this cell reports its stop.
  Cell(Proc& proc, ActorId id, Cell* parent, std::type_index type, Factory factory);
  Cell(const Cell&) = delete;
  Cell& operator=(const Cell&) = delete;

  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  /// Enqueues `e` (taking ownership) and schedules the actor if it was idle. Any thread.
  void post(Envelope* e);

  /// Asks the actor to stop: drain (kill=false) or discard pending messages (kill=true). The
  /// future completes when the actor (and all its children) reached Stopped or Failed. Any thread.
  Future<void> request_stop(bool kill);
  void request_stop_nowait(bool kill);
  /// A Stop envelope reached the head of the mailbox (actor thread).
  void on_stop_message(bool kill) { begin_stop(kill); }

  /// Schedules the first activation (construction + init). Called once by spawn.
  void start();

  /// Runs init (first activation) and then up to `max_messages` envelopes. Scheduler threads only;
  /// never concurrently with itself.
  void resume(size_t max_messages);

  Lifecycle state() const noexcept { return state_.load(std::memory_order_acquire); }
  bool terminal() const noexcept {
    auto s = state();
    return s == Lifecycle::Stopped || s == Lifecycle::Failed;
  }
  const ActorId& id() const noexcept { return id_; }
  Proc& proc() const noexcept { return *proc_; }
  std::type_index type() const noexcept { return type_; }
  /// The actor's type as reports name it (supervision events, DeliveryFailure and ActorError
  /// labels): the label set_type_label() gave, else the demangled C++ type name, e.g. "Counter".
  /// Any thread.
  std::string type_name() const;
  /// The demangled C++ type name, always: what lookups by type compare. Any thread.
  std::string cpp_type_name() const;
  /// Actor thread, once (Actor::set_type_label): a label for type_name(). Throws UsageError when
  /// one was set before.
  void set_type_label(std::string label);
  /// The actor object; valid only on the actor's own thread while it is initialized and running.
  Actor* actor() const noexcept { return actor_.get(); }

  /// Called on the actor's thread by a handler that failed (send handler, init, continuation).
  void fail(std::string cause, std::shared_ptr<const ActorSupervisionEvent> caused_by = nullptr);

  // Children bookkeeping, on this actor's thread.
  void adopt(Cell* child);  // takes a reference
  void on_child_stopped(Cell* child);
  void on_child_event(std::shared_ptr<const ActorSupervisionEvent> ev);

  /// This actor was spawned from another process: its failure goes to `owner` there (through
  /// Proc::forward_supervision) instead of this Proc's fault hook. Set before start().
  void set_remote_owner(ActorId owner) {
    remote_owner_ = std::make_unique<ActorId>(std::move(owner));
  }
  /// The actor's point in the ActorMesh that ProcMesh::spawn made it a member of (the mesh
  /// layer's Context::actor_rank()). Set before start(), then read-only: any thread may read it.
  void set_mesh_point(std::shared_ptr<const ndslice::Point> point) {
    mesh_point_ = std::move(point);
  }
  /// Null when the actor is not a member of an ActorMesh (a plain Proc::spawn or Actor::spawn).
  const std::shared_ptr<const ndslice::Point>& mesh_point() const noexcept { return mesh_point_; }

  /// Actor thread: a child this actor spawned in another process; asked to stop when this actor
  /// stops (without waiting for it).
  void add_remote_child(ActorId child) { remote_children_.push_back(std::move(child)); }

  /// Links in the Proc's list of top-level actors (guarded by the Proc's mutex): an intrusive
  /// list, so spawning and stopping a top-level actor never allocates.
  Cell* root_prev = nullptr;
  Cell* root_next = nullptr;

  /// The endpoint name of the envelope being processed (deterministic stepping reports).
  const std::string& last_endpoint() const noexcept { return last_endpoint_; }

 private:
  ~Cell();
  void run_init();
  void dispatch(Envelope* e);
  void begin_stop(bool kill);
  void finish_stop();
  void bounce_all(const char* reason);
  DeliveryFailure failure_for(const Envelope& e, const char* reason) const;
  void schedule();

  std::atomic<int> refs_{1};
  std::atomic<bool> scheduled_{false};
  std::atomic<Lifecycle> state_{Lifecycle::Created};
  std::atomic<bool> killed_{false};
  Mailbox mailbox_;

  Proc* proc_;
  ActorId id_;
  Cell* parent_;  // reference held until we report our stop; nullptr = the Proc's root
  std::type_index type_;
  std::atomic<const std::string*> type_label_{nullptr};  // set once, freed by ~Cell
  bool record_steps_;  // deterministic scheduler: remember last_endpoint_
  Factory factory_;
  std::unique_ptr<Actor> actor_;

  // Actor-thread state.
  std::vector<Cell*> children_;  // references held
  std::vector<ActorId> remote_children_;
  std::unique_ptr<ActorId> remote_owner_;             // set before start(), then read-only
  std::shared_ptr<const ndslice::Point> mesh_point_;  // set before start(), then read-only
  size_t children_pending_ = 0;
  std::optional<ActorSupervisionEvent> failure_;
  std::string last_endpoint_;

  std::mutex stop_mu_;  // guards stop_waiters_ and the transition to a terminal state
  std::vector<Promise<void>> stop_waiters_;
};

/// Delivers a child's failure event to `owner` (its supervise() runs on its own thread).
void post_child_event(Cell* owner, std::shared_ptr<const ActorSupervisionEvent> ev);
/// Delivers a mesh failure to `owner`: its supervise(const MeshFailure&) runs on its own thread;
/// false (or a throw) fails the owner with the failure as cause.
void post_mesh_failure(Cell* owner, std::shared_ptr<const MeshFailure> failure);

/// RAII: sets current_cell() for the duration of an activation.
class CurrentCell {
 public:
  explicit CurrentCell(Cell* c) noexcept;
  ~CurrentCell();
  CurrentCell(const CurrentCell&) = delete;
  CurrentCell& operator=(const CurrentCell&) = delete;

 private:
  Cell* prev_;
};

/// Intrusive owning pointer to a Cell.
class CellPtr {
 public:
  CellPtr() = default;
  /// Adopts an existing reference (does not add one).
  static CellPtr adopt(Cell* c) noexcept {
    CellPtr p;
    p.c_ = c;
    return p;
  }
  /// Shares `c`, adding a reference.
  static CellPtr share(Cell* c) noexcept {
    if (c != nullptr) c->add_ref();
    return adopt(c);
  }
  CellPtr(const CellPtr& o) noexcept : c_(o.c_) {
    if (c_ != nullptr) c_->add_ref();
  }
  CellPtr(CellPtr&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  CellPtr& operator=(CellPtr o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~CellPtr() {
    if (c_ != nullptr) c_->release();
  }
  Cell* get() const noexcept { return c_; }
  Cell* operator->() const noexcept { return c_; }
  explicit operator bool() const noexcept { return c_ != nullptr; }
  Cell* detach() noexcept { return std::exchange(c_, nullptr); }

 private:
  Cell* c_ = nullptr;
};

}  // namespace monarch::detail
