// Blocking waits (Future::get), deadlock detection, and small runtime utilities.
//
// Blocking in a handler: Future::get() inside an actor blocks that worker thread. Other actors keep
// running on the other workers, and when every worker is blocked the pool starts a spare one, so a
// chain "A waits on B" always makes progress. What can never make progress is detected and thrown
// as DeadlockError instead of hanging: an actor waiting on a reply from itself, or a cycle of
// actors each blocked in get() on the next (A waits on B while B waits on A).
#include <cxxabi.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "monarch/actor/actor_ref.hpp"
#include "monarch/actor/detail/cell.hpp"
#include "monarch/actor/port.hpp"
#include "monarch/actor/proc.hpp"
#include "monarch/actor/scheduler.hpp"
#include "monarch/config/config.hpp"
#include "runtime_internal.hpp"

namespace monarch::detail {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(mangled);
}

std::string describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const monarch::Error& err) {
    return err.what();
  } catch (const std::exception& err) {
    return demangle(typeid(err).name()) + ": " + err.what();
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    return "exception of type " + (t != nullptr ? demangle(t->name()) : std::string("?")) +
           " (not derived from std::exception)";
  }
}

std::string endpoint_label(const std::string& type_name, const char* registered) {
  return type_name + "::" + (registered != nullptr ? registered : "<endpoint>");
}

std::string timeout_message(const StateBase& s) {
  if (s.completer != nullptr) {
    return "Future::get: timed out waiting for a reply from actor " +
           s.completer->id().to_string() + " (the future is still valid)";
  }
  return "Future::get: timed out waiting for the result (the future is still valid)";
}

std::chrono::microseconds configured_spin() {
  return std::chrono::microseconds(config::global().integer("actor.spin_us"));
}

void futex_wake_all(std::atomic<uint32_t>* addr) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, long long timeout_ns) noexcept {
  timespec ts{};
  timespec* pts = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000LL);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000LL);
    pts = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT_PRIVATE, expected, pts, nullptr,
          0);
}

namespace {

// Wait-for graph of actors blocked in get(): waiter -> the actor expected to complete its future.
// Only touched on the (slow) blocking path; pointers are keys, dereferenced only under g_wait_mu
// while both ends are alive (the waiter is running; the completer is referenced by the future).
std::mutex g_wait_mu;
std::unordered_map<Cell*, Cell*> g_waits;

class WaitRegistration {
 public:
  WaitRegistration(Cell* self, Cell* completer) : self_(self) {
    if (self_ == nullptr || completer == nullptr) {
      self_ = nullptr;
      return;
    }
    std::lock_guard lock(g_wait_mu);
    std::string chain = self->id().to_string();
    Cell* x = completer;
    for (int hops = 0; hops < 10000 && x != nullptr; ++hops) {
      chain += " -> " + x->id().to_string();
      if (x == self) {
        throw DeadlockError("deadlock: actor " + self->id().to_string() +
                            " blocked in Future::get() on a reply it must produce itself (" +
                            chain + "); use co_await or then() instead of get() inside actors");
      }
      auto it = g_waits.find(x);
      x = it == g_waits.end() ? nullptr : it->second;
    }
    g_waits[self] = completer;
  }
  ~WaitRegistration() {
    if (self_ == nullptr) return;
    std::lock_guard lock(g_wait_mu);
    g_waits.erase(self_);
  }
  WaitRegistration(const WaitRegistration&) = delete;
  WaitRegistration& operator=(const WaitRegistration&) = delete;

 private:
  Cell* self_;
};

class BlockingScope {
 public:
  explicit BlockingScope(Cell* self) : sched_(self ? &self->proc().scheduler() : nullptr) {
    if (sched_ != nullptr) sched_->begin_blocking();
  }
  ~BlockingScope() {
    if (sched_ != nullptr) sched_->end_blocking();
  }
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;

 private:
  Scheduler* sched_;
};

}  // namespace

bool drive_deterministic(const std::function<bool()>& pred) {
  auto* det = DeterministicScheduler::current();
  if (det == nullptr) return false;
  det->run_until(pred);
  return true;
}

bool wait_ready(StateBase& s, const Deadline& deadline) {
  if (s.ready()) return true;
  if (drive_deterministic([&] { return s.ready(); })) {
    if (s.ready()) return true;
    if (!deadline) {
      throw DeadlockError(
          "Future::get: the deterministic scheduler has nothing left to run, so this result can "
          "never arrive");
    }
    return false;
  }
  Cell* self = current_cell();
  WaitRegistration reg(self, s.completer);
  BlockingScope scope(self);
  for (int i = 0; i < 256; ++i) {
    if (s.ready()) return true;
    cpu_relax();
  }
  using clock = std::chrono::steady_clock;
  // WAIT-1: before sleeping, spin for up to `actor.spin_us`, never past the deadline.
  if (auto spin = configured_spin(); spin.count() > 0) {
    auto until = clock::now() + spin;
    if (deadline && *deadline < until) until = *deadline;
    if (spin_yield_until([&] { return s.ready(); }, until)) return true;
  }
  while (true) {
    uint32_t w = s.word.load(std::memory_order_acquire);
    if ((w & StateBase::kReady) != 0) return true;
    if ((w & StateBase::kWaiters) == 0) {
      if (!s.word.compare_exchange_weak(w, w | StateBase::kWaiters)) continue;
      w |= StateBase::kWaiters;
    }
    long long timeout_ns = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - clock::now());
      if (left.count() <= 0) return s.ready();
      timeout_ns = left.count();
    }
    futex_wait(&s.word, w, timeout_ns);
  }
}

}  // namespace monarch::detail
