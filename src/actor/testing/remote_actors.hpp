// Actor types shared by the remote-actor tests and their peer process (remote_peer).
#pragma once

#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "monarch/actor/runtime.hpp"

namespace monarch::testing {

struct Sink : monarch::Actor {
  void put(int v) { got.push_back(v); }
  std::vector<int> all() const { return got; }
  MONARCH_ENDPOINTS(Sink, put, all)
  std::vector<int> got;
};

struct Counter : monarch::Actor {
  int incr(int n) { return value += n; }
  void add(int n) { value += n; }
  int get() const { return value; }
  std::string where() const { return id().to_string(); }
  int boom(std::string why) { throw std::runtime_error(why); }
  // Sends to a ref it received inside the message (refs travel across processes).
  void forward(monarch::ActorRef<Sink> to, int n) {
    for (int i = 0; i < n; ++i) to.send(&Sink::put, i);
  }
  monarch::Task<int> ask_back(monarch::ActorRef<Sink> to) {
    auto all = co_await to.call(&Sink::all);
    co_return static_cast<int>(all.size());
  }
  // Ports travel across processes too.
  void stream_to(monarch::Port<int> out, int n) {
    for (int i = 0; i < n; ++i) out.send(value + i);
  }
  void answer(monarch::OncePort<std::string> reply) { reply.send("from " + id().to_string()); }
  // Fault injection: never returns (the test kills the process while this call is pending).
  int freeze() {
    std::promise<void> never;
    never.get_future().wait();
    return 0;
  }
  MONARCH_ENDPOINTS(Counter, incr, add, get, where, boom, forward, ask_back, stream_to, answer,
                    freeze)
  int value = 0;
};

}  // namespace monarch::testing
