// channel_peer: a small process used by the channel tests (and handy for manual checks).
//
//   channel_peer recv ADDR   listen on ADDR; print "LISTENING <addr>", then "MSG <text>" per
//                            message (first part as text), flushing each line
//   channel_peer echo ADDR   listen on ADDR; each message is [reply-addr, payload]: send
//                            [payload] back to reply-addr
// TCP needs MONARCH_SECRET (or MONARCH_SECRET_FILE) in the environment.
#include <cstdio>
#include <future>
#include <map>
#include <string>
#include <thread>

#include "monarch/channel/channel.hpp"

using namespace monarch::channel;

namespace {
std::string text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "recv" && std::string(argv[1]) != "echo")) {
    std::fprintf(stderr, "usage: channel_peer recv|echo ADDR\n");
    return 2;
  }
  std::string mode = argv[1];
  try {
    IoRuntime io;
    ChannelOptions opts;
    std::map<std::string, std::shared_ptr<Sender>> replies;  // io thread only
    // Messages may arrive as soon as we listen; hold them until LISTENING is printed, so that
    // line always comes first.
    std::promise<void> announced;
    std::shared_future<void> ready = announced.get_future().share();
    auto listener = Listener::serve(io, ChannelAddr::parse(argv[2]), opts, [&](Message&& m) {
      ready.wait();
      if (mode == "recv") {
        std::printf("MSG %s\n", m.parts.empty() ? "" : text(m.parts[0]).c_str());
        std::fflush(stdout);
        return;
      }
      if (m.parts.size() != 2) return;
      auto to = text(m.parts[0]);
      auto& s = replies[to];
      if (!s) s = Sender::connect(io, ChannelAddr::parse(to), opts, nullptr);
      s->send(Message{{std::move(m.parts[1])}});
    });
    std::printf("LISTENING %s\n", listener->bound_addr().to_string().c_str());
    std::fflush(stdout);
    announced.set_value();
    // Runs until killed, or until stdin closes (the test's end of the pipe).
    char c;
    while (std::fread(&c, 1, 1, stdin) == 1) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "channel_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
