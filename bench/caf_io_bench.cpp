// CAF 0.17 half of bench_channel's xproc_rtt (see channel_bench.cpp): an echo actor published
// over TCP with caf::io::middleman in a child process, pinged from a scoped_actor via
// remote_actor + request/receive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#pragma GCC diagnostic pop

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/report.hpp"

namespace {

caf::behavior echo_fun(caf::event_based_actor*) {
  return {[](const std::string& s) { return s; }};
}

void configure(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  cfg.set("scheduler.max-threads", 2);
}

}  // namespace

int caf_io_echo_role() {
  caf::actor_system_config cfg;
  configure(cfg);
  caf::actor_system sys{cfg};
  auto echo = sys.spawn(echo_fun);
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1");
  if (!port) {
    std::fprintf(stderr, "caf publish failed: %s\n", sys.render(port.error()).c_str());
    return 1;
  }
  std::printf("READY %u\n", static_cast<unsigned>(*port));
  std::fflush(stdout);
  pause();
  return 0;
}

std::vector<double> caf_io_rtt_samples(uint16_t port, int warmup, int rounds, size_t size) {
  std::vector<double> v;
  caf::actor_system_config cfg;
  configure(cfg);
  caf::actor_system sys{cfg};
  auto remote = sys.middleman().remote_actor("127.0.0.1", port);
  if (!remote) {
    std::fprintf(stderr, "caf remote_actor failed: %s\n", sys.render(remote.error()).c_str());
    return v;
  }
  caf::scoped_actor self{sys};
  std::string payload(size, 'x');
  v.reserve(static_cast<size_t>(rounds));
  bool ok = true;
  for (int i = 0; i < warmup + rounds && ok; ++i) {
    auto t0 = monarch::bench::Clock::now();
    self->request(*remote, caf::infinite, payload)
        .receive([&](const std::string&) {},
                 [&](caf::error& e) {
                   std::fprintf(stderr, "caf request failed: %s\n", sys.render(e).c_str());
                   ok = false;
                 });
    if (i >= warmup) v.push_back(monarch::bench::us_since(t0));
  }
  self->send_exit(*remote, caf::exit_reason::user_shutdown);
  if (!ok) v.clear();
  return v;
}
