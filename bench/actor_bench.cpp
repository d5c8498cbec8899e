// In-process actor runtime benchmarks: monarch vs CAF 0.17 (the CAF half is caf_actor_bench.cpp).
//
// Both implementations do the same work in one run, with 2 worker threads each:
//   inproc_rtt    actor-to-actor request/reply round trip, one in flight (p50/p99 in us over 200k
//                 round trips after a 20k warm-up; monarch: co_await in a Task endpoint, CAF:
//                 request(...).then(...) chain)
//   inproc_rate   request/reply throughput with in_flight = 1 and 64 (msgs/s; each reply's
//                 continuation issues the next request)
//   spawn_rate    100k trivial actors spawned from main: "rate" (actors/s until the last spawn
//                 returns), "all_ready" (ms from the first spawn until every actor has handled one
//                 fire-and-forget message), "stop_all" (ms to stop them all)
//   fanout_gather one actor sends one request to each of those 100k actors and counts the replies
//                 (ms from first send to last reply, and msgs/s). "style": "bulk" is the cheapest
//                 idiom of each runtime (monarch: keep the futures and co_await them in order;
//                 CAF: plain send(), replies arrive as ordinary messages).
// Environment: ACTOR_BENCH_IMPL=monarch|caf runs one side only; ACTOR_BENCH_CAF_POLICY=sharing
// switches CAF to its central-queue scheduler (default: work stealing).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"
#include "monarch/actor/runtime.hpp"

namespace actor_bench {
// Defined in caf_actor_bench.cpp (kept in its own TU: CAF headers are not -Wpedantic clean).
void run_caf(int workers, int rtt_warmup, int rtt_n, int rate_n, int n_actors);
}  // namespace actor_bench

namespace {

using monarch::bench::Clock;
using monarch::bench::report;

constexpr int kWorkers = 2;
constexpr int kRttWarmup = 20'000;
constexpr int kRttN = 200'000;
constexpr int kRateN = 200'000;
constexpr int kActors = 100'000;

double secs_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::atomic<int> g_hits{0};

struct Pong : monarch::Actor {
  int ping(int x) { return x + 1; }
  MONARCH_ENDPOINTS(Pong, ping)
};

struct Ping : monarch::Actor {
  // Round-trip latency samples (us), one call in flight, via co_await.
  monarch::Task<std::vector<double>> rtt(monarch::ActorRef<Pong> pong, int warmup, int n) {
    long sink = 0;
    for (int i = 0; i < warmup; ++i) sink += co_await pong.call(&Pong::ping, i);
    std::vector<double> samples;
    samples.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      sink += co_await pong.call(&Pong::ping, i);
      samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (sink == 42) std::printf(" ");  // keep the replies observable
    co_return samples;
  }

  // `total` calls with `in_flight` outstanding (then() continuations issue the next one).
  // Returns the elapsed seconds from the first call to the last reply.
  monarch::Task<double> rate(monarch::ActorRef<Pong> pong, int total, int in_flight) {
    pong_ = pong;
    total_ = total;
    issued_ = 0;
    done_ = 0;
    done_promise_ = monarch::Promise<void>();
    auto all_done = done_promise_.get_future();
    auto t0 = Clock::now();
    for (int k = 0; k < in_flight && issued_ < total_; ++k) issue();
    co_await all_done;
    co_return secs_between(t0, Clock::now());
  }

  MONARCH_ENDPOINTS(Ping, rtt, rate)

 private:
  // then() registered inside the actor runs inside it: count the reply, issue the next call.
  void issue() {
    int i = issued_++;
    (void)pong_.call(&Pong::ping, i).then([this](int) {
      ++done_;
      if (issued_ < total_) {
        issue();
      } else if (done_ == total_) {
        done_promise_.set_value();
      }
    });
  }

  monarch::ActorRef<Pong> pong_;
  int total_ = 0, issued_ = 0, done_ = 0;
  monarch::Promise<void> done_promise_;
};

struct Leaf : monarch::Actor {
  int echo(int x) { return x; }
  void hit() { g_hits.fetch_add(1, std::memory_order_relaxed); }
  MONARCH_ENDPOINTS(Leaf, echo, hit)
};

using Leaves = std::shared_ptr<const std::vector<monarch::ActorRef<Leaf>>>;

struct Gather : monarch::Actor {
  // One call to every leaf, each reply counted by a then() continuation (runs in this actor, like
  // CAF's request(...).then(...)); returns the seconds from the first send to the last reply.
  monarch::Task<double> fanout(Leaves leaves) {
    expected_ = static_cast<int>(leaves->size());
    got_ = 0;
    done_promise_ = monarch::Promise<void>();
    auto all_done = done_promise_.get_future();
    auto t0 = Clock::now();
    int i = 0;
    for (const auto& leaf : *leaves) {
      (void)leaf.call(&Leaf::echo, i++).then([this](int) {
        if (++got_ == expected_) done_promise_.set_value();
      });
    }
    co_await all_done;
    co_return secs_between(t0, Clock::now());
  }

  // Variant ("style": "bulk"): issue every call, keep the futures, then co_await them in order
  // (no per-reply continuation; CAF's counterpart is plain send() with replies counted).
  monarch::Task<double> fanout_futures(Leaves leaves) {
    auto t0 = Clock::now();
    std::vector<monarch::Future<int>> replies;
    replies.reserve(leaves->size());
    int i = 0;
    for (const auto& leaf : *leaves) replies.push_back(leaf.call(&Leaf::echo, i++));
    long sink = 0;
    for (auto& f : replies) sink += co_await f;
    if (sink == 42) std::printf(" ");
    co_return secs_between(t0, Clock::now());
  }
  MONARCH_ENDPOINTS(Gather, fanout, fanout_futures)

 private:
  int expected_ = 0, got_ = 0;
  monarch::Promise<void> done_promise_;
};

void run_monarch() {
  monarch::ProcOptions options;
  options.workers = kWorkers;
  monarch::Proc proc(options);

  // --- inproc_rtt / inproc_rate ---
  {
    auto pong = proc.spawn<Pong>("pong");
    auto ping = proc.spawn<Ping>("ping");
    auto samples = ping.call(&Ping::rtt, pong, kRttWarmup, kRttN).get();
    report("inproc_rtt", "monarch", "p50", monarch::bench::percentile(samples, 0.50), "us",
           "lower");
    report("inproc_rtt", "monarch", "p99", monarch::bench::percentile(samples, 0.99), "us",
           "lower");
    for (int in_flight : {1, 64}) {
      (void)ping.call(&Ping::rate, pong, kRttWarmup, in_flight).get();  // warm-up
      double s = ping.call(&Ping::rate, pong, kRateN, in_flight).get();
      report("inproc_rate", "monarch", "rate", kRateN / s, "msgs/s", "higher",
             {{"in_flight", in_flight}});
    }
    ping.stop().get();
    pong.stop().get();
  }

  // --- spawn_rate / fanout_gather (the same 100k actors) ---
  {
    g_hits.store(0);
    auto leaves = std::make_shared<std::vector<monarch::ActorRef<Leaf>>>();
    leaves->reserve(kActors);
    auto t0 = Clock::now();
    for (int i = 0; i < kActors; ++i) leaves->push_back(proc.spawn<Leaf>("leaf"));
    auto t_spawned = Clock::now();
    for (const auto& l : *leaves) l.send(&Leaf::hit);
    while (g_hits.load(std::memory_order_relaxed) < kActors) std::this_thread::yield();
    auto t_handled = Clock::now();
    report("spawn_rate", "monarch", "rate", kActors / secs_between(t0, t_spawned), "actors/s",
           "higher", {{"actors", kActors}});
    report("spawn_rate", "monarch", "all_ready", secs_between(t0, t_handled) * 1e3, "ms", "lower",
           {{"actors", kActors}});

    auto gather = proc.spawn<Gather>("gather");
    double s = gather.call(&Gather::fanout, Leaves(leaves)).get();
    report("fanout_gather", "monarch", "time", s * 1e3, "ms", "lower", {{"actors", kActors}});
    report("fanout_gather", "monarch", "rate", kActors / s, "msgs/s", "higher",
           {{"actors", kActors}});
    s = gather.call(&Gather::fanout_futures, Leaves(leaves)).get();
    report("fanout_gather", "monarch", "time", s * 1e3, "ms", "lower",
           {{"actors", kActors}, {"style", "bulk"}});
    gather.stop().get();

    auto t_stop0 = Clock::now();
    std::vector<monarch::Future<void>> stops;
    stops.reserve(kActors);
    for (const auto& l : *leaves) stops.push_back(l.stop());
    for (auto& f : stops) f.get();
    report("spawn_rate", "monarch", "stop_all", secs_between(t_stop0, Clock::now()) * 1e3, "ms",
           "lower", {{"actors", kActors}});
    if (proc.num_actors() != 0)
      std::fprintf(stderr, "monarch: %zu actors left\n", proc.num_actors());
  }
}

}  // namespace

int main() {
  // ACTOR_BENCH_IMPL=monarch|caf runs one side only (default: both).
  const char* only = std::getenv("ACTOR_BENCH_IMPL");
  std::string which = only != nullptr ? only : "";
  auto t0 = Clock::now();
  if (which.empty() || which == "monarch") run_monarch();
  auto t1 = Clock::now();
  if (which.empty() || which == "caf")
    actor_bench::run_caf(kWorkers, kRttWarmup, kRttN, kRateN, kActors);
  std::fprintf(stderr, "actor_bench: monarch %.1f s, caf %.1f s\n", secs_between(t0, t1),
               secs_between(t1, Clock::now()));
  return 0;
}
