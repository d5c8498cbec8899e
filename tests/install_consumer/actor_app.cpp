// The README's "Actors in 20 lines", linked against the installed monarch::actor.
#include <chrono>
#include <cstdio>

#include "monarch/actor/runtime.hpp"

struct Counter : monarch::Actor {
  int incr(int n) { return value += n; }
  monarch::Task<int> twice(int n) { co_return 2 * n; }
  MONARCH_ENDPOINTS(Counter, incr, twice)
  int value = 0;
};

int main() {
  monarch::Proc proc;
  auto c = proc.spawn<Counter>("counter");
  monarch::Future<int> f = c.call(&Counter::incr, 5);
  c.send(&Counter::incr, 1);
  int v = f.get(std::chrono::seconds(10));
  std::printf("actor_app: %d %d\n", v, c.call(&Counter::twice, v).get(std::chrono::seconds(10)));
  c.stop().get();
}
