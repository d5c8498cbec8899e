// Cell: one actor's mailbox processing and lifecycle. How its failures become supervision events
// and reach its owner: supervision.cpp.
//
// Invariants (cited by tests as CELL-n):
//  CELL-1 At most one activation of a cell runs at a time: `scheduled_` is set by whoever
//         schedules it and cleared only by the activation itself, before its final emptiness check.
//  CELL-2 Construction and init() run before any message (the first activation does them).
//  CELL-3 Messages run in mailbox order; a Stop envelope therefore drains what was sent before it.
//  CELL-4 A cell reaches Stopped/Failed only after all its children did (children stop first).
//  CELL-5 Every envelope is either invoked or bounced exactly once; nothing is dropped silently.
#include "monarch/actor/detail/cell.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "monarch/actor/actor.hpp"
#include "monarch/actor/proc.hpp"
#include "remote_state.hpp"
#include "runtime_internal.hpp"

namespace monarch::detail {

namespace {
std::atomic<size_t> g_live_cells{0};
thread_local size_t tls_message_rank = static_cast<size_t>(-1);

struct MessageRankScope {
  size_t prev;
  explicit MessageRankScope(size_t r) : prev(tls_message_rank) { tls_message_rank = r; }
  ~MessageRankScope() { tls_message_rank = prev; }
  MessageRankScope(const MessageRankScope&) = delete;
  MessageRankScope& operator=(const MessageRankScope&) = delete;
};

struct StopEnvelope final : Envelope {
  bool kill;
  explicit StopEnvelope(bool k) : kill(k) { system = true; }
  void invoke(Cell& c) override { c.on_stop_message(kill); }
  void bounce(const DeliveryFailure&) noexcept override {}  // already stopped: nothing to do
  std::string_view endpoint() const noexcept override { return "<stop>"; }
};

struct ChildStoppedEnvelope final : Envelope {
  Cell* child;  // reference held
  explicit ChildStoppedEnvelope(Cell* c) : child(c) { system = true; }
  ~ChildStoppedEnvelope() override {
    if (child != nullptr) child->release();
  }
  void invoke(Cell& c) override { c.on_child_stopped(std::exchange(child, nullptr)); }
  void bounce(const DeliveryFailure&) noexcept override {}
  std::string_view endpoint() const noexcept override { return "<child stopped>"; }
};

}  // namespace

size_t live_cells() noexcept {
  return g_live_cells.load();
}

size_t current_message_rank() noexcept {
  return tls_message_rank;
}

Cell::Cell(Proc& proc, ActorId id, Cell* parent, std::type_index type, Factory factory)
    : proc_(&proc),
      id_(std::move(id)),
      parent_(parent),
      type_(type),
      record_steps_(proc.options().deterministic),
      factory_(std::move(factory)) {
  g_live_cells.fetch_add(1, std::memory_order_relaxed);
  if (parent_ != nullptr) parent_->add_ref();
}

Cell::~Cell() {
  // Never-run envelopes (the scheduler shut down before this actor ran them) still bounce (CELL-5).
  bounce_all("proc shut down");
  for (Cell* c : children_) c->release();
  if (parent_ != nullptr) parent_->release();
  g_live_cells.fetch_sub(1, std::memory_order_relaxed);
  delete type_label_.load(std::memory_order_relaxed);
}

std::string Cell::type_name() const {
  if (const std::string* label = type_label_.load(std::memory_order_acquire)) return *label;
  return cpp_type_name();
}

std::string Cell::cpp_type_name() const {
  return demangle(type_.name());
}

void Cell::set_type_label(std::string label) {
  auto owned = std::make_unique<const std::string>(std::move(label));
  const std::string* none = nullptr;
  if (!type_label_.compare_exchange_strong(none, owned.get(), std::memory_order_release,
                                           std::memory_order_relaxed)) {
    throw UsageError("Actor::set_type_label: actor " + id_.to_string() +
                     " already has the label '" + *none + "'");
  }
  (void)owned.release();
}

void Cell::schedule() {
  add_ref();
  proc_->scheduler().schedule(this);
}

void Cell::start() {
  scheduled_.store(true, std::memory_order_relaxed);
  schedule();
}

void Cell::post(Envelope* e) {
  if (terminal()) {
    std::unique_ptr<Envelope> owned(e);
    e->bounce(failure_for(*e, nullptr));
    return;
  }
  mailbox_.push(e);
  if (!scheduled_.exchange(true, std::memory_order_seq_cst)) schedule();
}

Future<void> Cell::request_stop(bool kill) {
  Promise<void> p;
  auto f = p.get_future();
  bool already = false;
  {
    std::lock_guard lock(stop_mu_);
    already = terminal();
    if (!already) stop_waiters_.push_back(std::move(p));
  }
  if (already) {
    p.set_value();
    return f;
  }
  request_stop_nowait(kill);
  return f;
}

void Cell::request_stop_nowait(bool kill) {
  if (terminal()) return;
  if (current_cell() == this && state() != Lifecycle::Created) {
    // From inside this actor: stop after what is already queued (drain) or now (kill).
    if (kill) {
      begin_stop(true);
      return;
    }
  }
  if (kill) killed_.store(true, std::memory_order_release);
  post(new StopEnvelope(kill));
}

void Cell::resume(size_t max_messages) {
  CurrentCell current(this);
  size_t n = 0;
  if (state() == Lifecycle::Created) {
    if (killed_.load(std::memory_order_acquire)) {
      begin_stop(true);
    } else {
      run_init();
    }
    n = 1;
  }
  while (n < max_messages) {
    Envelope* e = mailbox_.pop();
    if (e == nullptr) break;
    ++n;
    dispatch(e);
  }
  if (n >= max_messages &&
      mailbox_.consumer_nonempty()) {  // more queued: yield the worker, stay scheduled (CELL-1)
    schedule();
    return;
  }
  scheduled_.store(false, std::memory_order_seq_cst);
  if (mailbox_.pushed_since_empty() && !scheduled_.exchange(true, std::memory_order_seq_cst)) {
    schedule();
  }
}

void Cell::run_init() {
  state_.store(Lifecycle::Initializing, std::memory_order_release);
  if (record_steps_) last_endpoint_ = "init";
  try {
    actor_ = factory_();
    factory_ = nullptr;
  } catch (...) {
    factory_ = nullptr;
    fail("constructor threw: " + describe_exception(std::current_exception()));
    return;
  }
  actor_->cell_ = this;
  try {
    actor_->init();
  } catch (...) {
    fail("init threw: " + describe_exception(std::current_exception()));
    return;
  }
  if (state() == Lifecycle::Initializing) state_.store(Lifecycle::Idle, std::memory_order_release);
}

DeliveryFailure Cell::failure_for(const Envelope& e, const char* reason) const {
  std::string why;
  if (reason != nullptr) {
    why = reason;
  } else if (state() == Lifecycle::Failed) {
    // failure_ is set before the release store of Failed and never changes after it.
    why = failure_ ? "actor failed: " + failure_->cause : "actor failed";
  } else if (state() == Lifecycle::Stopping) {
    why = killed_.load() ? "actor killed" : "actor stopping";
  } else if (killed_.load()) {
    why = "actor killed";
  } else {
    why = "actor stopped";
  }
  return DeliveryFailure(id_, type_name() + "::" + std::string(e.endpoint()), why,
                         reason == nullptr && state() == Lifecycle::Failed);
}

void Cell::dispatch(Envelope* e) {
  std::unique_ptr<Envelope> owned(e);
  if (record_steps_) last_endpoint_ = std::string(e->endpoint());
  Lifecycle st = state();
  bool dead = st == Lifecycle::Stopped || st == Lifecycle::Failed;
  bool refuse =
      !e->system && (st == Lifecycle::Stopping || killed_.load(std::memory_order_relaxed));
  if (dead || refuse) {
    e->bounce(failure_for(*e, nullptr));
    return;
  }
  if (e->system) {
    try {
      e->invoke(*this);
    } catch (...) {
      fail(std::string(e->endpoint()) + " threw: " + describe_exception(std::current_exception()));
    }
    return;
  }
  state_.store(Lifecycle::Processing, std::memory_order_relaxed);
  MessageRankScope rank(e->message_rank);
  try {
    e->invoke(*this);
  } catch (...) {
    fail("send handler " + type_name() + "::" + std::string(e->endpoint()) +
         " threw: " + describe_exception(std::current_exception()));
  }
  if (state() == Lifecycle::Processing) state_.store(Lifecycle::Idle, std::memory_order_release);
}

void Cell::begin_stop(bool kill) {
  Lifecycle st = state();
  if (st == Lifecycle::Stopping || terminal()) return;
  state_.store(Lifecycle::Stopping, std::memory_order_release);
  if (kill) killed_.store(true, std::memory_order_release);
  // Children in other processes are asked to stop but not waited for: a dead or frozen Proc must
  // not hold this actor's stop (CELL-4 covers local children only).
  for (const ActorId& rc : std::exchange(remote_children_, {})) proc_->stop_remote_child(rc, kill);
  if (children_.empty()) {
    finish_stop();
    return;
  }
  for (Cell* c : children_) c->request_stop_nowait(kill);
}

void Cell::adopt(Cell* child) {
  child->add_ref();
  children_.push_back(child);
}

void Cell::on_child_stopped(Cell* child) {
  auto it = std::find(children_.begin(), children_.end(), child);
  if (it != children_.end()) {
    children_.erase(it);
    child->release();
  }
  child->release();  // the envelope's reference
  if (state() == Lifecycle::Stopping && children_.empty()) finish_stop();
}

void Cell::finish_stop() {
  std::optional<ActorSupervisionEvent> reason = failure_;
  if (!reason && killed_.load())
    reason = ActorSupervisionEvent{id_, type_name(), "killed", nullptr};
  if (actor_ != nullptr) {
    try {
      actor_->cleanup(reason);
    } catch (...) {
      spdlog::warn("monarch: cleanup of {} threw: {}", id_.to_string(),
                   describe_exception(std::current_exception()));
    }
  }
  // Destroying the actor releases what it holds (refs, ports, suspended coroutines).
  actor_.reset();
  factory_ = nullptr;

  std::vector<Promise<void>> waiters;
  {
    std::lock_guard lock(stop_mu_);
    state_.store(failure_ ? Lifecycle::Failed : Lifecycle::Stopped, std::memory_order_release);
    waiters.swap(stop_waiters_);
  }
  if (failure_) {
    proc_->remember_failed_actor(*failure_);
  } else if (remote_owner_ || !proc_->options().listen.empty()) {
    // A later message from another process (its owner's, or one holding a ref to an actor
    // spawned here, as a comm actor) says why, not "unknown actor" (as in process).
    proc_->remote().add_tombstone(id_.uid,
                                  "actor " + type_name() + " '" + id_.name + "' was stopped");
  }
  proc_->unregister_cell(this);
  bounce_all(nullptr);

  std::shared_ptr<const ActorSupervisionEvent> ev;
  if (failure_) ev = std::make_shared<const ActorSupervisionEvent>(*failure_);
  if (parent_ != nullptr) {
    Cell* parent = std::exchange(parent_, nullptr);
    if (ev) post_child_event(parent, ev);
    add_ref();
    parent->post(new ChildStoppedEnvelope(this));
    parent->release();
  } else {
    if (ev && remote_owner_) {
      proc_->forward_supervision(*remote_owner_, ev);  // the owner lives in another process
    } else if (ev) {
      proc_->on_root_event(*ev);
    }
    proc_->on_root_child_stopped(this);
  }
  for (auto& w : waiters) w.set_value();
}

void Cell::bounce_all(const char* reason) {
  while (Envelope* e = mailbox_.pop()) {
    std::unique_ptr<Envelope> owned(e);
    e->bounce(failure_for(*e, reason));
  }
}

// ---------------------------------------------------------------------------------------------

namespace {
thread_local Cell* tls_current = nullptr;
}

Cell* current_cell() noexcept {
  return tls_current;
}

CurrentCell::CurrentCell(Cell* c) noexcept : prev_(tls_current) {
  tls_current = c;
}
CurrentCell::~CurrentCell() {
  tls_current = prev_;
}

void cell_add_ref(Cell* c) noexcept {
  c->add_ref();
}
void cell_release(Cell* c) noexcept {
  c->release();
}

namespace {
struct ClosureEnvelope final : Envelope {
  UniqueFunction<void()> fn;
  explicit ClosureEnvelope(UniqueFunction<void()> f) : fn(std::move(f)) {}
  void invoke(Cell&) override { fn(); }
  void bounce(const DeliveryFailure&) noexcept override {}  // dropped: its captures are released
  std::string_view endpoint() const noexcept override { return "<continuation>"; }
};

struct UndeliverableEnvelope final : Envelope {
  DeliveryFailure failure;
  ActorId sender;  // the actor whose mailbox this goes to
  Proc* proc;
  UndeliverableEnvelope(DeliveryFailure f, ActorId s, Proc* p)
      : failure(std::move(f)), sender(std::move(s)), proc(p) {}
  void invoke(Cell& c) override {
    try {
      c.actor()->undeliverable(failure);
    } catch (...) {
      c.fail("undeliverable message not handled: " + describe_exception(std::current_exception()));
    }
  }
  void bounce(const DeliveryFailure&) noexcept override {
    log_report_for_stopped_sender(sender, failure);
  }
  std::string_view endpoint() const noexcept override { return "<undeliverable>"; }
};
}  // namespace

void log_report_for_stopped_sender(const ActorId& sender, const DeliveryFailure& f) noexcept {
  // The senders warned about last (a sender's later reports come in a burst after it stops).
  // Never destroyed: a runtime thread may still report while the process exits.
  struct Warned {
    std::mutex mu;
    std::deque<ActorId> senders;
  };
  static auto* warned = new Warned;
  bool first = true;
  try {
    std::lock_guard lock(warned->mu);
    auto& v = warned->senders;
    first = std::find(v.begin(), v.end(), sender) == v.end();
    if (first) {
      v.push_back(sender);
      if (v.size() > 64) v.pop_front();
    }
  } catch (...) {
    // out of memory: warn
  }
  if (first) {
    spdlog::warn(
        "monarch: {} (its sender {} has stopped too; its further such reports are logged at "
        "debug level)",
        f.what(), sender.to_string());
  } else {
    spdlog::debug("monarch: {} (its sender {} has stopped too)", f.what(), sender.to_string());
  }
}

void post_closure(Cell* c, UniqueFunction<void()> fn) {
  c->post(new ClosureEnvelope(std::move(fn)));
}

void route_undeliverable(Cell* sender, Proc* proc, const DeliveryFailure& f) noexcept {
  try {
    if (sender != nullptr) {
      sender->post(new UndeliverableEnvelope(f, sender->id(), proc));
      return;
    }
    if (proc != nullptr) {
      proc->report_undeliverable(f);
      return;
    }
    spdlog::error("monarch: {}", f.what());
  } catch (...) {
    spdlog::error("monarch: lost undeliverable report: {}", f.what());
  }
}

}  // namespace monarch::detail
