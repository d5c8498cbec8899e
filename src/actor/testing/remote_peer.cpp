// remote_peer: a process serving a Counter registered as "counter" on the address in argv[1].
// Prints "LISTENING <proc address>" and runs until stdin closes or it is killed.
#include <cstdio>

#include "remote_actors.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: remote_peer LISTEN_ADDR\n");
    return 2;
  }
  try {
    monarch::ProcOptions o;
    o.listen = argv[1];
    o.channel.secret = "remote-test";
    monarch::Proc proc(o);
    proc.register_name("counter", proc.spawn<monarch::testing::Counter>("counter"));
    std::printf("LISTENING %s\n", proc.address().c_str());
    std::fflush(stdout);
    char c;
    while (std::fread(&c, 1, 1, stdin) == 1) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remote_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
