// A short tour of the actor runtime: spawn, call, send, coroutines, ports, supervision.
#include <cstdio>

#include "monarch/actor/runtime.hpp"
#include "monarch/run_main.hpp"

using namespace std::chrono_literals;

struct Counter : monarch::Actor {
  int incr(int n) { return value += n; }
  int get() const { return value; }
  void crash() { throw std::runtime_error("counter crashed on purpose"); }
  MONARCH_ENDPOINTS(Counter, incr, get, crash)
  int value = 0;
};

// Owns a Counter, awaits it from a coroutine endpoint, and handles its failure.
struct Supervisor : monarch::Actor {
  void init() override { counter = spawn<Counter>("counter"); }
  monarch::Task<int> add_twice(int n) {
    int a = co_await counter.call(&Counter::incr, n);
    int b = co_await counter.call(&Counter::incr, n);
    co_return a + b;
  }
  // Replies once the failure was supervised (a deferred reply: the endpoint returns a Future).
  monarch::Future<void> break_child() {
    counter.send(&Counter::crash);
    respawned = monarch::Promise<void>();
    return respawned.get_future();
  }
  bool supervise(const monarch::ActorSupervisionEvent& ev) override {
    std::printf("supervise(): %s -> handled, respawning\n", ev.to_string().c_str());
    counter = spawn<Counter>("counter");
    respawned.set_value();
    return true;
  }
  int child_value() { return counter.call(&Counter::get).get(); }
  MONARCH_ENDPOINTS(Supervisor, add_twice, break_child, child_value)
  monarch::ActorRef<Counter> counter;
  monarch::Promise<void> respawned;
};

static int run() {
  monarch::Proc proc;
  auto c = proc.spawn<Counter>("counter");
  std::printf("call incr(5)            -> %d\n", c.call(&Counter::incr, 5).get());
  c.send(&Counter::incr, 10);
  std::printf("after send incr(10)     -> %d\n", c.call(&Counter::get).get());
  try {
    c.call(&Counter::crash).get();
  } catch (const monarch::ActorError& e) {
    std::printf("call crash()            -> ActorError: %s\n", e.what());
  }
  std::printf("counter still serving   -> %d\n", c.call(&Counter::get).get(1s));

  auto sup = proc.spawn<Supervisor>("supervisor");
  std::printf("coroutine add_twice(3)  -> %d\n", sup.call(&Supervisor::add_twice, 3).get());
  sup.call(&Supervisor::break_child).get(5s);
  std::printf("respawned child value   -> %d\n", sup.call(&Supervisor::child_value).get(5s));

  auto [port, rx] = proc.open_port<std::string>();
  port.send("hello through a port");
  std::printf("port recv               -> %s\n", rx.recv(1s).c_str());

  c.stop().get();
  try {
    c.call(&Counter::get).get();
  } catch (const monarch::DeliveryFailure& e) {
    std::printf("call after stop         -> DeliveryFailure: %s\n", e.what());
  }
  return 0;
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int, char** argv) {
  return monarch::run_main(argv[0], [] { return run(); });
}
