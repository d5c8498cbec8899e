#include "monarch/actor/scheduler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "monarch/actor/detail/cell.hpp"
#include "monarch/channel/channel.hpp"
#include "monarch/error.hpp"
#include "runtime_internal.hpp"

namespace monarch {

// ---------------------------------------------------------------------------------------------
// ThreadPoolScheduler
//
// SCHED-1 A cell is in at most one place (a LIFO slot or the global queue) at a time; it was put
//         there by whoever won its `scheduled_` flag (see Cell, CELL-1).
// SCHED-2 A worker takes its LIFO slot at most kLifoStreak times in a row, then serves the global
//         queue, so a ping-pong pair cannot starve other actors.
// SCHED-3 A worker never sleeps while the global queue is non-empty (checked under mu_).
// SCHED-4 At most one worker of a pool spins while idle; the others sleep at once.
// SCHED-5 That worker first spins kSpinRounds pause rounds, then up to `actor.spin_us` yielding
//         the CPU each round (spin_yield_until), then sleeps.
// SCHED-6 A worker that takes a cell from the global queue and leaves more there wakes a sleeper
//         when no worker spins.

namespace {
constexpr int kLifoStreak = 32;
// A worker with nothing to do spins this many pause rounds (~10-20 us), then yields for up to
// actor.spin_us (SCHED-5), and only while no other worker of its pool spins (SCHED-4). Longer
// pause-only spins (2000 rounds) made cross-process casts slower on an oversubscribed host: 16
// worker processes spinning on 2 cores took the CPU from the ones with work (16 procs x 1 actor
// cast+gather p50 1.06 ms, against 0.67 ms). Yielding does not: with 50 us of it, the same casts
// took 0.57-0.61 ms against 0.60-0.74 without (bench_procs), and a remote actor's round trip
// fell from ~40 to ~25-30 us, because the worker is still awake when the next request comes.
constexpr int kSpinRounds = 200;
thread_local ThreadPoolScheduler* tls_pool = nullptr;
thread_local void* tls_worker = nullptr;
}  // namespace

struct ThreadPoolScheduler::Worker {
  std::thread thread;
  detail::Cell* next = nullptr;  // LIFO slot: owner thread only
  int streak = 0;
};

ThreadPoolScheduler::ThreadPoolScheduler(size_t workers, size_t batch)
    : batch_(std::max<size_t>(1, batch)), spin_(detail::configured_spin()) {
  channel::log_to_stderr_by_default();  // also builds the logging registry before any worker runs
  if (workers > kMaxWorkers) {
    // start_worker() would return at once past the cap: 10^11 of those calls is a hang.
    throw UsageError("ThreadPoolScheduler: " + std::to_string(workers) +
                     " workers requested; at most " + std::to_string(kMaxWorkers) +
                     " (0: one per core)");
  }
  size_t n = workers != 0 ? workers : std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, kMaxWorkers);
  for (size_t i = 0; i < n; ++i) start_worker();
}

ThreadPoolScheduler::~ThreadPoolScheduler() {
  shutdown();
}

size_t ThreadPoolScheduler::num_workers() const {
  std::lock_guard lock(mu_);
  return workers_.size();
}

size_t ThreadPoolScheduler::sleeping_workers() const {
  std::lock_guard lock(mu_);
  return sleepers_;
}

void ThreadPoolScheduler::start_worker() {
  std::lock_guard lock(mu_);
  if (stopping_ || workers_.size() >= kMaxWorkers) return;
  auto w = std::make_unique<Worker>();
  Worker* raw = w.get();
  workers_.push_back(std::move(w));
  unblocked_.fetch_add(1);
  raw->thread = std::thread([this, raw] { run(raw); });
}

void ThreadPoolScheduler::schedule(detail::Cell* c) {
  if (tls_pool == this) {
    auto* w = static_cast<Worker*>(tls_worker);
    detail::Cell* old = std::exchange(w->next, c);
    if (old == nullptr) return;
    c = old;
  }
  push_global(c);
}

void ThreadPoolScheduler::push_global(detail::Cell* c) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(c);
    queued_.fetch_add(1, std::memory_order_release);
    // A spinning worker will see it; waking a sleeper too would only cost a futex call. (No lost
    // wake-up: a spinner re-checks the queue under mu_ before it sleeps, SCHED-3.)
    wake = sleepers_ > 0 && spinning_.load(std::memory_order_acquire) == 0;
  }
  if (wake) cv_.notify_one();
}

detail::Cell* ThreadPoolScheduler::pop_global() {
  if (queued_.load(std::memory_order_acquire) == 0) return nullptr;
  detail::Cell* c = nullptr;
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (queue_.empty()) return nullptr;
    c = queue_.front();
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
    // SCHED-6: push_global woke nobody while a worker spun (SCHED-4), counting on the spinner.
    // But the spinner takes one cell, and its handler may block for good; what is still queued
    // must not wait for it. So whoever takes a cell and leaves more behind wakes a sleeper,
    // unless another worker spins (it will see the rest).
    wake = !queue_.empty() && sleepers_ > 0 && spinning_.load(std::memory_order_acquire) == 0;
  }
  if (wake) cv_.notify_one();
  return c;
}

void ThreadPoolScheduler::run(Worker* w) {
  tls_pool = this;
  tls_worker = w;
  while (true) {
    detail::Cell* c = nullptr;
    if (w->next != nullptr && w->streak < kLifoStreak) {
      c = std::exchange(w->next, nullptr);
      ++w->streak;
    } else {
      if (w->next != nullptr) push_global(std::exchange(w->next, nullptr));
      w->streak = 0;
      c = pop_global();
    }
    if (c == nullptr) {
      if (spinning_.fetch_add(1, std::memory_order_acq_rel) == 0) {
        for (int i = 0; i < kSpinRounds && queued_.load(std::memory_order_relaxed) == 0; ++i) {
          detail::cpu_relax();
        }
        if (spin_.count() > 0) {
          detail::spin_yield_until(
              [&] {
                return queued_.load(std::memory_order_relaxed) != 0 ||
                       stop_requested_.load(std::memory_order_relaxed);
              },
              std::chrono::steady_clock::now() + spin_);
        }
      }
      spinning_.fetch_sub(1, std::memory_order_acq_rel);
      if (queued_.load(std::memory_order_acquire) != 0) continue;
      std::unique_lock lock(mu_);
      if (queue_.empty() && stopping_) break;
      if (!queue_.empty()) continue;
      ++sleepers_;
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      --sleepers_;
      continue;
    }
    c->resume(batch_);
    c->release();
  }
  tls_pool = nullptr;
  tls_worker = nullptr;
}

void ThreadPoolScheduler::begin_blocking() {
  if (tls_pool != this) return;
  auto* w = static_cast<Worker*>(tls_worker);
  // The slot would otherwise wait for this blocked worker.
  if (w->next != nullptr) push_global(std::exchange(w->next, nullptr));
  if (unblocked_.fetch_sub(1) == 1) start_worker();
}

void ThreadPoolScheduler::end_blocking() {
  if (tls_pool != this) return;
  unblocked_.fetch_add(1);
}

void ThreadPoolScheduler::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    stop_requested_.store(true, std::memory_order_release);  // ends a spinning worker's spin
  }
  cv_.notify_all();
  // Workers may still be added by begin_blocking() while we join; loop until none is left.
  while (true) {
    std::unique_ptr<Worker> w;
    {
      std::lock_guard lock(mu_);
      if (workers_.empty()) break;
      w = std::move(workers_.back());
      workers_.pop_back();
    }
    if (w->thread.joinable()) w->thread.join();
    if (w->next != nullptr) w->next->release();
  }
  std::deque<detail::Cell*> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    queued_.store(0);
  }
  for (auto* c : left) c->release();
}

// ---------------------------------------------------------------------------------------------
// DeterministicScheduler

namespace {
thread_local DeterministicScheduler* tls_det = nullptr;
}

DeterministicScheduler::DeterministicScheduler() : prev_(tls_det) {
  tls_det = this;
}

DeterministicScheduler::~DeterministicScheduler() {
  shutdown();
  if (tls_det == this) tls_det = prev_;
}

DeterministicScheduler* DeterministicScheduler::current() noexcept {
  return tls_det;
}

void DeterministicScheduler::schedule(detail::Cell* c) {
  ready_.push_back(c);
}

void DeterministicScheduler::shutdown() {
  while (!ready_.empty()) {
    auto* c = ready_.front();
    ready_.pop_front();
    c->release();
  }
}

std::optional<DeterministicScheduler::Step> DeterministicScheduler::step() {
  if (ready_.empty()) return std::nullopt;
  detail::Cell* c = ready_.front();
  ready_.pop_front();
  c->resume(1);
  Step s{c->id(), c->last_endpoint()};
  c->release();
  return s;
}

size_t DeterministicScheduler::run() {
  size_t n = 0;
  while (step()) ++n;
  return n;
}

bool DeterministicScheduler::run_until(const std::function<bool()>& pred) {
  while (!pred()) {
    if (!step()) return pred();
  }
  return true;
}

}  // namespace monarch
