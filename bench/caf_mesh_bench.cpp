// CAF 0.17 half of bench_mesh (see mesh_bench.cpp): a gather actor sends one message to each of
// N leaves and counts their replies; the caller (a scoped_actor outside the workers) times the
// request to the gather actor until its answer. CAF has no meshes or trees: this is the flat
// fan-out that monarch's cast tree competes with.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <caf/all.hpp>
#pragma GCC diagnostic pop

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/report.hpp"

namespace mesh_bench {

namespace {

using monarch::bench::Clock;
using monarch::bench::report;
using go_atom = caf::atom_constant<caf::atom("go")>;
using Leaves = std::shared_ptr<const std::vector<caf::actor>>;

double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

caf::behavior leaf_fun(caf::event_based_actor*) {
  return {[](long x) { return x + 1; }};
}

// go_atom: send x to every leaf (plain send: replies come back as ordinary messages, CAF's
// cheapest gather idiom) and answer with the sum once all replies are in.
class Gather : public caf::event_based_actor {
 public:
  Gather(caf::actor_config& cfg, Leaves leaves)
      : caf::event_based_actor(cfg), leaves_(std::move(leaves)) {}

  caf::behavior make_behavior() override {
    return {[this](go_atom, long x) {
              rp_ = make_response_promise();
              got_ = 0;
              sum_ = 0;
              for (const auto& leaf : *leaves_) send(leaf, x);
              return rp_;
            },
            [this](long r) {
              sum_ += r;
              if (++got_ == leaves_->size()) rp_.deliver(sum_);
            }};
  }

 private:
  Leaves leaves_;
  caf::response_promise rp_;
  size_t got_ = 0;
  long sum_ = 0;
};

Leaves spawn_leaves(caf::actor_system& sys, int n) {
  auto leaves = std::make_shared<std::vector<caf::actor>>();
  leaves->reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) leaves->push_back(sys.spawn(leaf_fun));
  return leaves;
}

double timed_gather(caf::scoped_actor& self, const caf::actor& gather) {
  auto t0 = Clock::now();
  self->request(gather, std::chrono::seconds(60), go_atom::value, 1L)
      .receive([](long) {},
               [&](caf::error& e) {
                 std::fprintf(stderr, "caf: gather failed: %s\n", self->system().render(e).c_str());
                 std::exit(1);
               });
  return monarch::bench::us_since(t0);
}

}  // namespace

void run_caf(int workers, const std::vector<int>& sizes, int warmup, int samples, int big) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", workers);
  // MESH_BENCH_CAF_POLICY=stealing keeps CAF's default work-stealing scheduler, whose 0.17 deque
  // steals in O(queue length) (thousands of ready leaves make it quadratic); the default here is
  // its central-queue "sharing" policy, CAF's best for this fan-out.
  const char* pol = std::getenv("MESH_BENCH_CAF_POLICY");
  const bool stealing = pol != nullptr && std::string(pol) == "stealing";
  if (!stealing) cfg.set("scheduler.policy", caf::atom("sharing"));
  const std::string impl = stealing ? "caf_stealing" : "caf";
  caf::actor_system sys{cfg};
  {
    caf::scoped_actor self{sys};
    for (int n : sizes) {
      auto leaves = spawn_leaves(sys, n);
      auto gather = sys.spawn<Gather>(leaves);
      std::vector<double> us;
      for (int i = 0; i < warmup + samples; ++i) {
        double t = timed_gather(self, gather);
        if (i >= warmup) us.push_back(t);
      }
      nlohmann::json params = {{"procs", 16}, {"per_proc", n / 16}, {"actors", n}};
      report("cast_gather", impl, "p50", monarch::bench::percentile(us, 0.5), "us", "lower",
             params);
      report("cast_gather", impl, "p99", monarch::bench::percentile(us, 0.99), "us", "lower",
             params);
      caf::anon_send_exit(gather, caf::exit_reason::user_shutdown);
      for (const auto& l : *leaves) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
    }
    double before = rss_bytes();
    auto leaves = spawn_leaves(sys, big);
    auto gather = sys.spawn<Gather>(leaves);
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      ms.push_back(timed_gather(self, gather) / 1e3);
      if (i == 0) {
        report("idle_actor", impl, "memory", (rss_bytes() - before) / big, "bytes", "lower",
               {{"actors", big}});
      }
    }
    report("cast_100k", impl, "time", monarch::bench::percentile(ms, 0.5), "ms", "lower",
           {{"actors", big}});
    report("cast_100k", impl, "first", ms[0], "ms", "lower", {{"actors", big}});
    caf::anon_send_exit(gather, caf::exit_reason::user_shutdown);
    for (const auto& l : *leaves) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  }
  sys.await_all_actors_done();
}

}  // namespace mesh_bench
