// CAF 0.17 half of bench_actor (see actor_bench.cpp): the same workloads with event-based actors,
// request(...).then(...) chains, and a scheduler limited to the same number of worker threads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <caf/all.hpp>
#pragma GCC diagnostic pop

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"

namespace actor_bench {

namespace {

using monarch::bench::Clock;
using monarch::bench::report;

using rtt_atom = caf::atom_constant<caf::atom("rtt")>;
using rate_atom = caf::atom_constant<caf::atom("rate")>;
using hit_atom = caf::atom_constant<caf::atom("hit")>;
using go_atom = caf::atom_constant<caf::atom("go")>;
using bulk_atom = caf::atom_constant<caf::atom("bulk")>;

std::atomic<int> g_hits{0};

double secs_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

caf::behavior pong_fun(caf::event_based_actor*) {
  return {[](int x) { return x + 1; }};
}

// Latency (rtt_atom: one request in flight, samples written to *samples) and throughput
// (rate_atom: `total` requests with `in_flight` outstanding; replies the elapsed seconds).
class Ping : public caf::event_based_actor {
 public:
  Ping(caf::actor_config& cfg, caf::actor pong, std::vector<double>* samples)
      : caf::event_based_actor(cfg), pong_(std::move(pong)), samples_(samples) {}

  caf::behavior make_behavior() override {
    return {
        [this](rtt_atom, int warmup, int n) {
          rp_ = make_response_promise();
          warmup_ = warmup;
          total_ = warmup + n;
          issued_ = 0;
          samples_->clear();
          samples_->reserve(static_cast<size_t>(n));
          rtt_step();
          return rp_;
        },
        [this](rate_atom, int total, int in_flight) {
          rp_ = make_response_promise();
          total_ = total;
          issued_ = 0;
          done_ = 0;
          t0_ = Clock::now();
          for (int k = 0; k < in_flight && issued_ < total_; ++k) rate_issue();
          return rp_;
        },
    };
  }

 private:
  void rtt_step() {
    if (issued_ == total_) {
      rp_.deliver(0.0);
      return;
    }
    int i = issued_++;
    t0_ = Clock::now();
    request(pong_, caf::infinite, i).then([this, i](int) {
      if (i >= warmup_) {
        samples_->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0_).count());
      }
      rtt_step();
    });
  }

  void rate_issue() {
    int i = issued_++;
    request(pong_, caf::infinite, i).then([this](int) {
      ++done_;
      if (issued_ < total_) {
        rate_issue();
      } else if (done_ == total_) {
        rp_.deliver(secs_between(t0_, Clock::now()));
      }
    });
  }

  caf::actor pong_;
  std::vector<double>* samples_;
  caf::response_promise rp_;
  int warmup_ = 0, total_ = 0, issued_ = 0, done_ = 0;
  Clock::time_point t0_;
};

caf::behavior leaf_fun(caf::event_based_actor*) {
  return {
      [](int x) { return x; },
      [](hit_atom) { g_hits.fetch_add(1, std::memory_order_relaxed); },
  };
}

using Leaves = std::shared_ptr<const std::vector<caf::actor>>;

// go_atom: one request(...).then(...) to every leaf; replies the seconds from the first send to
// the last reply. Note: CAF 0.17 keeps pending .then() handlers in a vector-backed
// unordered_flat_map (linear find + erase), so 100k outstanding requests cost O(n^2).
// bulk_atom: the same with plain send(); a leaf's return value comes back as an ordinary
// message, counted by the int handler (no pending-response bookkeeping).
class Gather : public caf::event_based_actor {
 public:
  Gather(caf::actor_config& cfg, Leaves leaves)
      : caf::event_based_actor(cfg), leaves_(std::move(leaves)) {}

  caf::behavior make_behavior() override {
    return {[this](go_atom) {
              rp_ = make_response_promise();
              expected_ = static_cast<int>(leaves_->size());
              got_ = 0;
              t0_ = Clock::now();
              int i = 0;
              for (const auto& leaf : *leaves_) {
                request(leaf, caf::infinite, i++).then([this](int) {
                  if (++got_ == expected_) rp_.deliver(secs_between(t0_, Clock::now()));
                });
              }
              return rp_;
            },
            [this](bulk_atom) {
              rp_ = make_response_promise();
              expected_ = static_cast<int>(leaves_->size());
              got_ = 0;
              t0_ = Clock::now();
              int i = 0;
              for (const auto& leaf : *leaves_) send(leaf, i++);
              return rp_;
            },
            [this](int) {
              if (++got_ == expected_) rp_.deliver(secs_between(t0_, Clock::now()));
            }};
  }

 private:
  Leaves leaves_;
  caf::response_promise rp_;
  int expected_ = 0, got_ = 0;
  Clock::time_point t0_;
};

// Sends a request from outside the actor system and waits for its reply.
template <class R, class... Ts>
R ask(caf::actor_system& sys, const caf::actor& dest, Ts... xs) {
  caf::scoped_actor self{sys};
  R out{};
  self->request(dest, std::chrono::seconds(50), xs...)
      .receive([&](R r) { out = r; },
               [&](caf::error& e) {
                 std::fprintf(stderr, "caf: request failed: %s\n", sys.render(e).c_str());
                 std::exit(1);
               });
  return out;
}

}  // namespace

void run_caf(int workers, int rtt_warmup, int rtt_n, int rate_n, int n_actors) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", workers);
  // ACTOR_BENCH_CAF_POLICY=sharing: CAF's central-queue scheduler instead of work stealing (whose
  // 0.17 deque steals in O(queue length): 100k ready actors make fanout_gather quadratic).
  if (const char* pol = std::getenv("ACTOR_BENCH_CAF_POLICY");
      pol != nullptr && std::string(pol) == "sharing") {
    cfg.set("scheduler.policy", caf::atom("sharing"));
  }
  caf::actor_system sys{cfg};
  if (sys.scheduler().num_workers() != static_cast<size_t>(workers)) {
    std::fprintf(stderr, "caf: scheduler has %zu workers (wanted %d)\n",
                 sys.scheduler().num_workers(), workers);
  }

  // --- inproc_rtt / inproc_rate ---
  {
    std::vector<double> samples;
    auto pong = sys.spawn(pong_fun);
    auto ping = sys.spawn<Ping>(pong, &samples);
    (void)ask<double>(sys, ping, rtt_atom::value, rtt_warmup, rtt_n);
    report("inproc_rtt", "caf", "p50", monarch::bench::percentile(samples, 0.50), "us", "lower");
    report("inproc_rtt", "caf", "p99", monarch::bench::percentile(samples, 0.99), "us", "lower");
    for (int in_flight : {1, 64}) {
      (void)ask<double>(sys, ping, rate_atom::value, rtt_warmup, in_flight);  // warm-up
      double s = ask<double>(sys, ping, rate_atom::value, rate_n, in_flight);
      report("inproc_rate", "caf", "rate", rate_n / s, "msgs/s", "higher",
             {{"in_flight", in_flight}});
    }
    caf::anon_send_exit(ping, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(pong, caf::exit_reason::user_shutdown);
    sys.await_all_actors_done();
  }

  // --- spawn_rate / fanout_gather (the same actors) ---
  {
    g_hits.store(0);
    auto leaves = std::make_shared<std::vector<caf::actor>>();
    leaves->reserve(static_cast<size_t>(n_actors));
    auto t0 = Clock::now();
    for (int i = 0; i < n_actors; ++i) leaves->push_back(sys.spawn(leaf_fun));
    auto t_spawned = Clock::now();
    for (const auto& l : *leaves) caf::anon_send(l, hit_atom::value);
    while (g_hits.load(std::memory_order_relaxed) < n_actors) std::this_thread::yield();
    auto t_handled = Clock::now();
    report("spawn_rate", "caf", "rate", n_actors / secs_between(t0, t_spawned), "actors/s",
           "higher", {{"actors", n_actors}});
    report("spawn_rate", "caf", "all_ready", secs_between(t0, t_handled) * 1e3, "ms", "lower",
           {{"actors", n_actors}});

    auto gather = sys.spawn<Gather>(Leaves(leaves));
    double s = ask<double>(sys, gather, go_atom::value);
    report("fanout_gather", "caf", "time", s * 1e3, "ms", "lower", {{"actors", n_actors}});
    report("fanout_gather", "caf", "rate", n_actors / s, "msgs/s", "higher",
           {{"actors", n_actors}});
    s = ask<double>(sys, gather, bulk_atom::value);
    report("fanout_gather", "caf", "time", s * 1e3, "ms", "lower",
           {{"actors", n_actors}, {"style", "bulk"}});
    caf::anon_send_exit(gather, caf::exit_reason::user_shutdown);

    auto t_stop0 = Clock::now();
    for (const auto& l : *leaves) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
    sys.await_all_actors_done();
    report("spawn_rate", "caf", "stop_all", secs_between(t_stop0, Clock::now()) * 1e3, "ms",
           "lower", {{"actors", n_actors}});
  }
}

}  // namespace actor_bench
