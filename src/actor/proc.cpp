#include "monarch/actor/proc.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "registry.hpp"
#include "remote_state.hpp"
#include "runtime_internal.hpp"

namespace monarch {

namespace {
void default_fault_hook(const ActorSupervisionEvent& ev) {
  std::fprintf(stderr, "monarch: unhandled actor failure; exiting (fail fast)\n%s\n",
               ev.to_string().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
}  // namespace

Proc::Proc(ProcOptions options)
    : options_(std::move(options)),
      registry_(std::make_unique<detail::Registry>()),
      fault_hook_(default_fault_hook) {
  if (options_.deterministic) {
    scheduler_ = std::make_unique<DeterministicScheduler>();
  } else if (options_.scheduler) {
    scheduler_ = options_.scheduler;
    owns_scheduler_ = false;
  } else {
    scheduler_ = std::make_unique<ThreadPoolScheduler>(options_.workers, options_.batch);
  }
  start_remote();
}

Proc::~Proc() {
  shutdown(options_.stop_timeout);
  stop_remote();
  if (owns_scheduler_) scheduler_->shutdown();
  std::unordered_map<std::string, detail::CellPtr> names;
  detail::Cell* roots = nullptr;
  {
    std::lock_guard lock(mu_);
    names.swap(names_);
    roots = std::exchange(root_head_, nullptr);
    root_count_ = 0;
  }
  while (roots != nullptr) {  // actors that did not stop in time
    detail::Cell* next = std::exchange(roots->root_next, nullptr);
    roots->root_prev = nullptr;
    roots->release();
    roots = next;
  }
}

DeterministicScheduler& Proc::test_scheduler() {
  auto* d = dynamic_cast<DeterministicScheduler*>(scheduler_.get());
  if (d == nullptr)
    throw UsageError("Proc::test_scheduler: this Proc was not created with deterministic = true");
  return *d;
}

void Proc::set_fault_hook(FaultHook hook) {
  std::lock_guard lock(mu_);
  fault_hook_ = hook ? std::move(hook) : FaultHook(default_fault_hook);
}

void Proc::on_root_event(const ActorSupervisionEvent& ev) {
  FaultHook hook;
  {
    std::lock_guard lock(mu_);
    hook = fault_hook_;
  }
  hook(ev);
}

void Proc::report_undeliverable(const DeliveryFailure& f) {
  on_root_event(ActorSupervisionEvent{
      ActorId{options_.name, "client", 0}, "client",
      std::string("undeliverable message sent from outside any actor: ") + f.what(), nullptr});
}

void Proc::add_root_child(detail::Cell* c) {
  c->add_ref();
  std::lock_guard lock(mu_);
  c->root_next = root_head_;
  if (root_head_ != nullptr) root_head_->root_prev = c;
  root_head_ = c;
  ++root_count_;
}

void Proc::on_root_child_stopped(detail::Cell* c) {
  {
    std::lock_guard lock(mu_);
    if (c->root_prev == nullptr && root_head_ != c) return;  // not in the list (already removed)
    if (c->root_prev != nullptr) c->root_prev->root_next = c->root_next;
    if (c->root_next != nullptr) c->root_next->root_prev = c->root_prev;
    if (root_head_ == c) root_head_ = c->root_next;
    c->root_prev = c->root_next = nullptr;
  }
  c->release();
  // Count down last, under the lock: shutdown() may destroy this Proc as soon as it sees zero,
  // so nothing here may touch the Proc after the lock is released.
  std::lock_guard lock(mu_);
  if (--root_count_ == 0) root_cv_.notify_all();
}

bool Proc::register_cell_uid(detail::Cell* c) {
  if (!registry_->insert(c->id().uid, c)) return false;
  live_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Proc::unregister_cell(detail::Cell* c) {
  if (!registry_->erase(c->id().uid)) return;
  live_.fetch_sub(1, std::memory_order_relaxed);
  detail::CellPtr named;  // released outside the lock
  std::lock_guard lock(mu_);
  if (names_.empty()) return;
  for (auto it = names_.begin(); it != names_.end(); ++it) {
    if (it->second.get() == c) {
      named = std::move(it->second);
      names_.erase(it);
      break;
    }
  }
}

size_t Proc::num_actors() const {
  return live_.load(std::memory_order_relaxed);
}

void Proc::register_cell(const std::string& name, detail::Cell* c) {
  if (c == nullptr)
    throw UsageError("Proc::register_name('" + name + "'): empty or unknown ActorRef");
  std::lock_guard lock(mu_);
  if (names_.count(name) != 0) {
    throw UsageError("Proc::register_name: name '" + name + "' is already taken by " +
                     names_[name]->id().to_string());
  }
  names_.emplace(name, detail::CellPtr::share(c));
}

detail::CellPtr Proc::lookup_cell(const std::string& name, std::type_index type) {
  std::lock_guard lock(mu_);
  auto it = names_.find(name);
  if (it == names_.end()) return {};
  if (it->second->type() != type) {
    throw UsageError("Proc::lookup('" + name + "'): actor " + it->second->id().to_string() +
                     " is a " + it->second->cpp_type_name() + ", not a " +
                     detail::demangle(type.name()));
  }
  return it->second;
}

detail::CellPtr Proc::find(const ActorId& id) {
  if (id.proc != options_.name) return {};
  // Under the registry lock a found cell is still registered, hence alive (it unregisters itself
  // before its last reference can go); share() takes our reference.
  return registry_->find_shared(id);
}

bool Proc::shutdown(std::chrono::milliseconds timeout) {
  begin_shutdown();
  auto done = [&] {
    std::lock_guard lock(mu_);
    return root_count_ == 0;
  };
  if (options_.deterministic) {
    test_scheduler().run_until(done);
  } else {
    std::unique_lock lock(mu_);
    root_cv_.wait_for(lock, timeout, [&] { return root_count_ == 0; });
  }
  std::lock_guard lock(mu_);
  if (root_count_ == 0) return true;
  for (auto* c = root_head_; c != nullptr; c = c->root_next) {
    spdlog::error("monarch: {} did not stop within {} ms (state {})", c->id().to_string(),
                  timeout.count(), to_string(c->state()));
  }
  return false;
}

void Proc::begin_shutdown() {
  std::vector<detail::CellPtr> roots;
  {
    std::lock_guard lock(mu_);
    shutting_down_ = true;
    roots.reserve(root_count_);
    for (auto* c = root_head_; c != nullptr; c = c->root_next)
      roots.push_back(detail::CellPtr::share(c));
  }
  for (auto& c : roots) c->request_stop_nowait(false);
}

namespace detail {

Cell* spawn_cell(Proc& proc, Cell* parent, std::string name, std::type_index type,
                 Cell::Factory factory, std::shared_ptr<const ndslice::Point> mesh_point) {
  // The name is part of the actor's id ("proc.name[uid]"): it must read back as one.
  if (name.empty() || std::any_of(name.begin(), name.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u < 0x20 || u == 0x7f || ch == '[' || ch == ']';
      })) {
    throw UsageError("spawn: actor name '" + name +
                     "' must be non-empty, without control characters or brackets");
  }
  if (parent == nullptr && proc.shutting_down()) {
    throw UsageError("spawn('" + name + "'): proc " + proc.name() + " is shutting down");
  }
  if (parent != nullptr && parent->state() == Lifecycle::Stopping) {
    throw UsageError("spawn('" + name + "'): owner " + parent->id().to_string() + " is stopping");
  }
  auto* c = new Cell(proc, ActorId{proc.name(), std::move(name), proc.next_uid()}, parent, type,
                     std::move(factory));
  c->set_mesh_point(std::move(mesh_point));  // before start(): init() may read it
  proc.register_cell_uid(c);
  if (parent != nullptr) {
    parent->adopt(c);
  } else {
    proc.add_root_child(c);
  }
  c->start();
  return c;
}

Cell* spawn_remote_cell(Proc& proc, ActorId id, std::type_index type, Cell::Factory factory,
                        ActorId owner, std::shared_ptr<const ndslice::Point> mesh_point) {
  std::string what = id.to_string();
  auto* c = new Cell(proc, std::move(id), nullptr, type, std::move(factory));
  if (!proc.register_cell_uid(c)) {
    c->release();
    throw UsageError("actor id " + what + " is already taken in this proc");
  }
  c->set_remote_owner(std::move(owner));
  c->set_mesh_point(std::move(mesh_point));
  proc.add_root_child(c);
  c->start();
  return c;
}

const std::string& proc_name(Proc& p) {
  return p.name();
}

PortId next_port_id(Proc& proc, Cell* cell) {
  ActorId owner = cell != nullptr ? cell->id() : ActorId{proc.name(), "client", 0};
  return PortId{std::move(owner), proc.next_uid()};
}

}  // namespace detail

}  // namespace monarch
