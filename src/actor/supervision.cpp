// Where an actor's failure becomes a supervision event, and where the event goes.
//
// Cell::fail records the failure (a throwing constructor, init or handler: cell.cpp's run_init
// and dispatch call it) as the cell's ActorSupervisionEvent and stops the actor; when it has
// stopped, Cell::finish_stop (cell.cpp) sends the event to its owner: post_child_event to a local
// owner, Proc::forward_supervision to one in another process (remote.cpp), or the Proc's fault
// hook for a root actor (Proc::on_root_event, proc.cpp). Here the owner's supervise() runs
// (on_child_event); unhandled, the owner fails too, with the child's event as its cause.
// A mesh's failures reach the actor that owns the mesh as a MeshFailure (post_mesh_failure, its
// supervise(const MeshFailure&)); the mesh layer's side, where a proc's exit or silence becomes a
// MeshFailure: src/mesh/proc_failure.cpp.
#include <spdlog/spdlog.h>

#include "monarch/actor/actor.hpp"
#include "monarch/actor/detail/cell.hpp"
#include "runtime_internal.hpp"

namespace monarch::detail {

namespace {

struct ChildEventEnvelope final : Envelope {
  std::shared_ptr<const ActorSupervisionEvent> event;
  explicit ChildEventEnvelope(std::shared_ptr<const ActorSupervisionEvent> e)
      : event(std::move(e)) {
    system = true;
  }
  void invoke(Cell& c) override { c.on_child_event(event); }
  void bounce(const DeliveryFailure&) noexcept override {
    spdlog::error("monarch: supervision event lost (owner gone): {}", event->to_string());
  }
  std::string_view endpoint() const noexcept override { return "<supervise>"; }
};

struct MeshFailureEnvelope final : Envelope {
  std::shared_ptr<const MeshFailure> failure;
  explicit MeshFailureEnvelope(std::shared_ptr<const MeshFailure> f) : failure(std::move(f)) {
    system = true;
  }
  void invoke(Cell& c) override {
    if (c.actor() == nullptr)
      return bounce(DeliveryFailure(c.id(), "<supervise mesh>", "owner is gone"));
    bool handled = false;
    std::string why;
    try {
      handled = c.actor()->supervise(*failure);
    } catch (...) {
      why = " (supervise threw: " + describe_exception(std::current_exception()) + ")";
    }
    if (!handled) c.fail("unhandled " + failure->to_string() + why);
  }
  void bounce(const DeliveryFailure&) noexcept override {
    spdlog::error("monarch: mesh failure lost (owner gone): {}", failure->to_string());
  }
  std::string_view endpoint() const noexcept override { return "<supervise mesh>"; }
};

}  // namespace

void post_mesh_failure(Cell* owner, std::shared_ptr<const MeshFailure> failure) {
  owner->post(new MeshFailureEnvelope(std::move(failure)));
}

void post_child_event(Cell* owner, std::shared_ptr<const ActorSupervisionEvent> ev) {
  owner->post(new ChildEventEnvelope(std::move(ev)));
}

void Cell::fail(std::string cause, std::shared_ptr<const ActorSupervisionEvent> caused_by) {
  if (terminal() || failure_) return;
  failure_ = ActorSupervisionEvent{id_, type_name(), std::move(cause), std::move(caused_by)};
  if (state() == Lifecycle::Stopping) {
    // Already stopping (e.g. cleanup is pending on children): record the failure only.
    return;
  }
  begin_stop(true);
}

void Cell::on_child_event(std::shared_ptr<const ActorSupervisionEvent> ev) {
  Lifecycle st = state();
  if (st == Lifecycle::Stopping || terminal() || actor_ == nullptr) {
    spdlog::debug("monarch: {} is stopping; ignoring child failure {}", id_.to_string(),
                  ev->actor.to_string());
    return;
  }
  bool handled = false;
  std::string why = "unhandled failure of child " + ev->actor.to_string();
  try {
    handled = actor_->supervise(*ev);
  } catch (...) {
    why = "supervise() threw while handling child " + ev->actor.to_string() + ": " +
          describe_exception(std::current_exception());
  }
  if (!handled) fail(std::move(why), std::move(ev));
}

}  // namespace monarch::detail
