// Schedulers run actors. An actor is scheduled when a message arrives while it is idle; a worker
// then runs up to `batch` of its messages (one at a time: actors are serial) before yielding.
//
// ThreadPoolScheduler (default): one worker per core. A message sent by an actor to an idle actor
// runs next on the same worker (a LIFO slot), so a request/reply ping-pong never crosses threads;
// other work goes to a shared FIFO queue that idle workers poll briefly, then sleep on.
//
// DeterministicScheduler (tests): no threads at all. The test thread calls step() to run exactly
// one message (or one init) of the actor at the head of the ready queue, and can assert the exact
// interleaving. Future::get() and PortReceiver::recv() on the test thread run steps until their
// result is available (or throw DeadlockError when nothing is left to run).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "monarch/actor/actor_id.hpp"

namespace monarch {

namespace detail {
class Cell;
}

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  /// Queues `c` to run; takes one reference to it (released after it ran). Any thread.
  virtual void schedule(detail::Cell* c) = 0;
  /// Joins workers; cells still queued are released without running. Called by ~Proc.
  virtual void shutdown() = 0;
  /// A worker is about to block in Future::get(); see ThreadPoolScheduler.
  virtual void begin_blocking() {}
  virtual void end_blocking() {}
};

class ThreadPoolScheduler final : public Scheduler {
 public:
  /// `workers` = 0 means std::thread::hardware_concurrency() (capped at kMaxWorkers); more than
  /// kMaxWorkers throws UsageError. `batch`: messages per activation. An idle worker spins up to
  /// `actor.spin_us` (config, read here) before it sleeps; throws config::ConfigError on a bad
  /// config layer.
  explicit ThreadPoolScheduler(size_t workers = 0, size_t batch = 64);
  ~ThreadPoolScheduler() override;

  void schedule(detail::Cell* c) override;
  void shutdown() override;
  /// When every worker is blocked in get(), a spare worker starts so other actors keep running
  /// (at most kMaxWorkers in all).
  void begin_blocking() override;
  void end_blocking() override;

  size_t num_workers() const;
  /// Idle workers asleep, and whether one spins (SCHED-4..6 in scheduler.cpp). A snapshot, for
  /// tests and diagnostics; callable from any thread.
  size_t sleeping_workers() const;
  bool worker_spinning() const { return spinning_.load(std::memory_order_acquire) != 0; }
  static constexpr size_t kMaxWorkers = 256;

 private:
  struct Worker;
  void run(Worker* w);
  void push_global(detail::Cell* c);
  detail::Cell* pop_global();
  void start_worker();

  size_t batch_;
  std::chrono::microseconds spin_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<detail::Cell*> queue_;
  std::atomic<size_t> queued_{0};
  std::atomic<int> spinning_{0};  // workers polling the queue before they sleep
  size_t sleepers_ = 0;
  bool stopping_ = false;
  std::atomic<bool> stop_requested_{false};  // stopping_, readable without mu_ (spinning worker)
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<int> unblocked_{0};
};

class DeterministicScheduler final : public Scheduler {
 public:
  /// What one step ran.
  struct Step {
    ActorId actor;
    std::string endpoint;  ///< "init", a registered endpoint name, or "<endpoint>"/"<system>"
  };

  DeterministicScheduler();
  ~DeterministicScheduler() override;

  void schedule(detail::Cell* c) override;
  void shutdown() override;

  /// Runs one message (or one init) of the actor at the head of the ready queue.
  std::optional<Step> step();
  /// Steps until nothing is ready; returns the number of steps.
  size_t run();
  /// Steps until `pred()` holds or nothing is ready; returns pred().
  bool run_until(const std::function<bool()>& pred);
  /// Actors waiting to run.
  size_t ready() const { return ready_.size(); }

  /// The deterministic scheduler driving the calling thread, if any (internal).
  static DeterministicScheduler* current() noexcept;

 private:
  std::deque<detail::Cell*> ready_;
  DeterministicScheduler* prev_;
};

}  // namespace monarch
