// bench_channel: cross-process channel benchmarks.
//
//   xproc_rtt     64 B round trip (p50/p99, us) to an echo process, over unix and tcp:
//                 monarch (channel Sender/Listener), monarch_actor (a remote actor's call().get(),
//                 64 B in and out) vs raw_socket (blocking ping-pong) vs caf_io (remote actor,
//                 tcp). raw_thread / raw_epoll_thread / raw_epoll_both: raw sockets shaped like the
//                 channel (reply read by a second thread; with epoll loops), to show where the
//                 time between raw_socket and monarch goes. Wherever a reply arrives on another
//                 thread, the caller waits in monarch's Future::get(), as an actor call does
//                 (spins up to actor.spin_us, then sleeps; MONARCH_ACTOR_SPIN_US=0
//                 shows the cost of sleeping at once).
//   xproc_stream  one link streaming to a counting receiver process: msgs/s at 64 B, GB/s at 1 MiB;
//                 monarch channel vs raw_socket (length-prefixed frames, buffered writes).
//
// Every peer is this same binary re-executed with a role argument (`--role NAME ...`); the child
// prints "READY <addr>" on stdout once listening, and "DONE <count> <bytes>" when a stream ends.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/report.hpp"
#include "monarch/actor/runtime.hpp"
#include "monarch/channel/channel.hpp"

extern char** environ;

// caf_io_bench.cpp
int caf_io_echo_role();
std::vector<double> caf_io_rtt_samples(uint16_t port, int warmup, int rounds, size_t size);

namespace {

using namespace monarch::channel;
using monarch::bench::Clock;
using monarch::bench::percentile;
using monarch::bench::report;

constexpr int kRttWarmup = 2000;
constexpr int kRttRounds = 20000;
constexpr size_t kRttSize = 64;
constexpr double kStreamBudgetS = 2.0;        // per 64 B stream run
constexpr uint64_t kSmallMsgs = 1'000'000;    // upper bound at 64 B
constexpr uint64_t kLargeBytes = 2ull << 30;  // 2 GiB at 1 MiB
constexpr uint32_t kEndMarker = 0xFFFFFFFFu;  // raw stream: end-of-stream length prefix

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_channel: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

ChannelOptions opts() {
  ChannelOptions o;
  o.secret = "bench";
  return o;
}

std::string text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
Bytes bytes(const std::string& s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Failure handler for the measuring side. Messages still unacknowledged when a Sender is
// destroyed come back here with "sender destroyed" (documented behaviour), so only count them.
std::atomic<uint64_t> g_failed{0};
void on_failure(Message&&, const std::string& why) {
  if (g_failed.fetch_add(1) == 0 && why.find("sender destroyed") == std::string::npos)
    std::fprintf(stderr, "bench_channel: send failed: %s\n", why.c_str());
}

// Lets the last acknowledgement (ack_interval) arrive before tearing a Sender down.
void drain(const Sender& s) {
  auto t0 = Clock::now();
  while (s.pending() > 0 && secs(t0, Clock::now()) < 1.0)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// ---------------------------------------------------------------------------------------------
// Child processes

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;  // child's stdout

  static Child spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) die("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<char*> argv;
    static std::string self = [] {
      char buf[4096];
      ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
      if (n <= 0) die("readlink /proc/self/exe");
      return std::string(buf, static_cast<size_t>(n));
    }();
    argv.push_back(const_cast<char*>(self.c_str()));
    std::string role = "--role";
    argv.push_back(role.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    Child c;
    if (posix_spawn(&c.pid, self.c_str(), &fa, nullptr, argv.data(), environ) != 0)
      die("posix_spawn");
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    c.out = fdopen(fds[0], "r");
    return c;
  }

  // Next line from the child that starts with `tag`; returns the rest of the line.
  std::string expect(const std::string& tag) {
    char line[1024];
    while (std::fgets(line, sizeof line, out) != nullptr) {
      std::string s(line);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      if (s.rfind(tag, 0) == 0) return s.size() > tag.size() ? s.substr(tag.size() + 1) : "";
    }
    std::fprintf(stderr, "bench_channel: child exited before printing %s\n", tag.c_str());
    std::exit(1);
  }

  ~Child() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    if (out != nullptr) std::fclose(out);
  }
  Child() = default;
  Child(Child&& o) noexcept : pid(o.pid), out(o.out) {
    o.pid = -1;
    o.out = nullptr;
  }
  Child& operator=(Child&&) = delete;
};

void say(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Raw sockets

std::string unix_name(const std::string& what) {
  return "monarch-bench-" + what + "-" + std::to_string(getpid());
}

sockaddr_un abstract_addr(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// Listens; returns the fd and the address text ("@name" or the port).
int raw_listen(const std::string& transport, std::string& where) {
  if (transport == "unix") {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    where = unix_name("raw");
    socklen_t len;
    auto a = abstract_addr(where, len);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) die("bind unix");
    if (listen(fd, 4) != 0) die("listen");
    return fd;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind tcp");
  if (listen(fd, 4) != 0) die("listen");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  where = std::to_string(ntohs(a.sin_port));
  return fd;
}

void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int raw_accept(int lfd, const std::string& transport) {
  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) die("accept");
  if (transport == "tcp") nodelay(fd);
  return fd;
}

int raw_connect(const std::string& transport, const std::string& where) {
  if (transport == "unix") {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    socklen_t len;
    auto a = abstract_addr(where, len);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) die("connect unix");
    return fd;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(where)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect tcp");
  nodelay(fd);
  return fd;
}

bool read_full(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void write_full(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      die("write");
    }
    c += r;
    n -= static_cast<size_t>(r);
  }
}

int role_raw_echo(const std::string& transport) {
  std::string where;
  int lfd = raw_listen(transport, where);
  say("READY " + where);
  int fd = raw_accept(lfd, transport);
  char buf[kRttSize];
  while (read_full(fd, buf, sizeof buf)) write_full(fd, buf, sizeof buf);
  return 0;
}

// The raw echo as an event loop would run it (like the channel's asio loop): epoll_wait
// (edge-triggered), then non-blocking reads until EAGAIN, echoing each 64 B message.
int role_raw_epoll_echo(const std::string& transport) {
  std::string where;
  int lfd = raw_listen(transport, where);
  say("READY " + where);
  int fd = raw_accept(lfd, transport);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  char buf[4096];
  size_t have = 0;
  for (;;) {
    epoll_event out[4];
    if (epoll_wait(ep, out, 4, -1) < 0 && errno != EINTR) return 1;
    for (;;) {
      ssize_t r = read(fd, buf + have, sizeof buf - have);
      if (r == 0) return 0;
      if (r < 0) break;  // EAGAIN: wait for the next edge
      have += static_cast<size_t>(r);
      size_t off = 0;
      for (; have - off >= kRttSize; off += kRttSize) write_full(fd, buf + off, kRttSize);
      std::memmove(buf, buf + off, have - off);
      have -= off;
    }
  }
}

// Receives length-prefixed frames until the end marker; prints "DONE count bytes". A large
// frame is read straight into a reusable buffer (one copy, as a receiver must); small frames
// are parsed out of a 256 KiB read buffer.
int role_raw_sink(const std::string& transport) {
  std::string where;
  int lfd = raw_listen(transport, where);
  say("READY " + where);
  int fd = raw_accept(lfd, transport);
  std::vector<char> buf(256 << 10);
  std::vector<char> big;
  size_t have = 0, off = 0;
  uint64_t count = 0, total = 0;
  for (;;) {
    if (have - off < 4) {
      std::memmove(buf.data(), buf.data() + off, have - off);
      have -= off;
      off = 0;
      while (have < 4) {
        ssize_t r = read(fd, buf.data() + have, buf.size() - have);
        if (r <= 0) return 1;
        have += static_cast<size_t>(r);
      }
    }
    uint32_t len;
    std::memcpy(&len, buf.data() + off, 4);
    off += 4;
    if (len == kEndMarker) break;
    size_t avail = have - off;
    if (len <= buf.size() / 2) {
      if (avail < len) {
        std::memmove(buf.data(), buf.data() + off, avail);
        have = avail;
        off = 0;
        while (have < len) {
          ssize_t r = read(fd, buf.data() + have, buf.size() - have);
          if (r <= 0) return 1;
          have += static_cast<size_t>(r);
        }
      }
      off += len;
    } else {
      if (big.size() < len) big.resize(len);
      size_t take = std::min<size_t>(avail, len);
      std::memcpy(big.data(), buf.data() + off, take);
      off += take;
      if (!read_full(fd, big.data() + take, len - take)) return 1;
    }
    ++count;
    total += len;
  }
  say("DONE " + std::to_string(count) + " " + std::to_string(total));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Monarch channel roles

ChannelAddr listen_addr(const std::string& transport, const std::string& what) {
  if (transport == "unix") return ChannelAddr::parse("unix://@" + unix_name(what));
  return ChannelAddr::parse("tcp://127.0.0.1:0");
}

// [reply-addr, payload] -> [payload] to reply-addr (like channel_peer echo).
int role_monarch_echo(const std::string& transport) {
  IoRuntime io;
  std::map<std::string, std::shared_ptr<Sender>> replies;  // io thread only
  auto l = Listener::serve(io, listen_addr(transport, "echo"), opts(), [&](Message&& m) {
    if (m.parts.size() != 2) return;
    auto& s = replies[text(m.parts[0])];
    if (!s) s = Sender::connect(io, ChannelAddr::parse(text(m.parts[0])), opts(), nullptr);
    s->send(Message{{std::move(m.parts[1])}});
  });
  say("READY " + l->bound_addr().to_string());
  pause();
  return 0;
}

// Remote actor echo: a Proc listening on `transport`, serving EchoActor as "echo".
struct EchoActor : monarch::Actor {
  std::vector<std::byte> echo(std::vector<std::byte> b) { return b; }
  MONARCH_ENDPOINTS(EchoActor, echo)
};

monarch::ProcOptions proc_opts(const std::string& transport, const std::string& what) {
  monarch::ProcOptions o;
  o.listen = listen_addr(transport, what).to_string();
  o.channel = opts();
  return o;
}

int role_actor_echo(const std::string& transport) {
  monarch::Proc proc(proc_opts(transport, "actor_echo"));
  proc.register_name("echo", proc.spawn<EchoActor>("echo"));
  say("READY " + proc.address());
  pause();
  return 0;
}

// Counts messages until a 2-part end marker; prints "DONE count bytes".
int role_monarch_sink(const std::string& transport) {
  IoRuntime io;
  uint64_t count = 0, total = 0;
  auto l = Listener::serve(io, listen_addr(transport, "sink"), opts(), [&](Message&& m) {
    if (m.parts.size() == 2) {
      say("DONE " + std::to_string(count) + " " + std::to_string(total));
      return;
    }
    ++count;
    total += m.size_bytes();
  });
  say("READY " + l->bound_addr().to_string());
  pause();
  return 0;
}

int run_role(int argc, char** argv) {
  std::string role = argv[2];
  std::string arg = argc > 3 ? argv[3] : "";
  if (role == "raw_echo") return role_raw_echo(arg);
  if (role == "raw_epoll_echo") return role_raw_epoll_echo(arg);
  if (role == "raw_sink") return role_raw_sink(arg);
  if (role == "monarch_echo") return role_monarch_echo(arg);
  if (role == "monarch_sink") return role_monarch_sink(arg);
  if (role == "actor_echo") return role_actor_echo(arg);
  if (role == "caf_echo") return caf_io_echo_role();
  std::fprintf(stderr, "bench_channel: unknown role %s\n", role.c_str());
  return 2;
}

// ---------------------------------------------------------------------------------------------
// xproc_rtt

void report_rtt(const std::string& impl, const std::string& transport,
                const std::vector<double>& v) {
  nlohmann::json p = {{"transport", transport}, {"size", kRttSize}};
  report("xproc_rtt", impl, "p50", percentile(v, 0.50), "us", "lower", p);
  report("xproc_rtt", impl, "p99", percentile(v, 0.99), "us", "lower", p);
}

void rtt_raw(const std::string& transport) {
  Child c = Child::spawn({"raw_echo", transport});
  int fd = raw_connect(transport, c.expect("READY"));
  char buf[kRttSize] = {};
  std::vector<double> v;
  v.reserve(kRttRounds);
  for (int i = 0; i < kRttWarmup + kRttRounds; ++i) {
    auto t0 = Clock::now();
    write_full(fd, buf, sizeof buf);
    if (!read_full(fd, buf, sizeof buf)) die("raw echo closed");
    if (i >= kRttWarmup) v.push_back(monarch::bench::us_since(t0));
  }
  close(fd);
  report_rtt("raw_socket", transport, v);
}

// The caller's side of a round trip whose reply arrives on another thread (the IoRuntime's, or a
// raw reader's): arm() before sending, then get() the future; notify() completes it. The wait is
// monarch's own Future::get(), the one a remote actor call() ends in.
struct ReplyWait {
  std::mutex mu;
  std::optional<monarch::Promise<void>> pending;
  monarch::Future<void> arm() {
    monarch::Promise<void> p;
    auto f = p.get_future();
    std::lock_guard lock(mu);
    pending.emplace(std::move(p));
    return f;
  }
  void notify() {
    std::optional<monarch::Promise<void>> p;
    {
      std::lock_guard lock(mu);
      p.swap(pending);
    }
    if (p) p->set_value();
  }
};

void rtt_monarch(const std::string& transport) {
  Child c = Child::spawn({"monarch_echo", transport});
  auto echo_addr = ChannelAddr::parse(c.expect("READY"));
  IoRuntime io;
  ReplyWait got;
  auto l = Listener::serve(io, listen_addr(transport, "reply"), opts(),
                           [&](Message&&) { got.notify(); });
  const std::string reply = l->bound_addr().to_string();
  auto s = Sender::connect(io, echo_addr, opts(), on_failure);
  std::vector<double> v;
  v.reserve(kRttRounds);
  for (int i = 0; i < kRttWarmup + kRttRounds; ++i) {
    auto t0 = Clock::now();
    auto f = got.arm();
    s->send(Message{{bytes(reply), Bytes(kRttSize)}});
    f.get();
    if (i >= kRttWarmup) v.push_back(monarch::bench::us_since(t0));
  }
  drain(*s);
  report_rtt("monarch", transport, v);
}

// The user-facing round trip: call() on a remote actor's endpoint, 64 B in and 64 B out, get().
void rtt_monarch_actor(const std::string& transport) {
  Child c = Child::spawn({"actor_echo", transport});
  const std::string echo_addr = c.expect("READY");
  monarch::Proc client(proc_opts(transport, "actor_client"));
  auto echo = client.lookup_remote<EchoActor>(echo_addr, "echo").get(std::chrono::seconds(10));
  std::vector<std::byte> payload(kRttSize);
  std::vector<double> v;
  v.reserve(kRttRounds);
  for (int i = 0; i < kRttWarmup + kRttRounds; ++i) {
    auto t0 = Clock::now();
    payload = echo.call(&EchoActor::echo, std::move(payload)).get();
    if (i >= kRttWarmup) v.push_back(monarch::bench::us_since(t0));
  }
  if (payload.size() != kRttSize)
    die("actor echo returned " + std::to_string(payload.size()) + " bytes");
  report_rtt("monarch_actor", transport, v);
}

// The floor for any design that delivers replies on an I/O thread (as the channel's Listener
// does): the raw echo, but a second thread receives the reply and wakes the caller through
// ReplyWait. With `epoll`, that thread waits like the channel's asio loop does: epoll_wait,
// then non-blocking reads until EAGAIN. The difference to raw_socket is the cost of the extra
// thread hop (and of the epoll pattern), not of anything in the channel.
// With `epoll_echo` the echo process runs that loop too: the floor for the channel's whole
// structure (event loops on both sides, replies delivered on an I/O thread).
void rtt_raw_thread(const std::string& transport, bool epoll, bool epoll_echo = false) {
  Child c = Child::spawn({epoll_echo ? "raw_epoll_echo" : "raw_echo", transport});
  int fd = raw_connect(transport, c.expect("READY"));
  ReplyWait got;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    char buf[4096];
    size_t have = 0;
    if (!epoll) {
      while (read_full(fd, buf, kRttSize)) got.notify();
      return;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    while (!stop.load()) {
      epoll_event out[4];
      if (epoll_wait(ep, out, 4, 100) <= 0) continue;
      for (;;) {
        ssize_t r = read(fd, buf + have, sizeof buf - have);
        if (r <= 0) break;
        have += static_cast<size_t>(r);
        while (have >= kRttSize) {
          std::memmove(buf, buf + kRttSize, have - kRttSize);
          have -= kRttSize;
          got.notify();
        }
      }
    }
    close(ep);
  });
  char buf[kRttSize] = {};
  std::vector<double> v;
  v.reserve(kRttRounds);
  for (int i = 0; i < kRttWarmup + kRttRounds; ++i) {
    auto t0 = Clock::now();
    auto f = got.arm();
    write_full(fd, buf, sizeof buf);
    f.get();
    if (i >= kRttWarmup) v.push_back(monarch::bench::us_since(t0));
  }
  stop = true;
  shutdown(fd, SHUT_RDWR);
  reader.join();
  close(fd);
  report_rtt(epoll_echo ? "raw_epoll_both"
             : epoll    ? "raw_epoll_thread"
                        : "raw_thread",
             transport, v);
}

void rtt_caf() {
  Child c = Child::spawn({"caf_echo"});
  auto port = static_cast<uint16_t>(std::stoi(c.expect("READY")));
  auto v = caf_io_rtt_samples(port, kRttWarmup, kRttRounds, kRttSize);
  if (v.empty()) return;
  report_rtt("caf_io", "tcp", v);
}

// ---------------------------------------------------------------------------------------------
// xproc_stream

uint64_t stream_limit(size_t size) {
  return size <= 4096 ? kSmallMsgs : kLargeBytes / size;
}
double stream_budget(size_t size) {
  return size <= 4096 ? kStreamBudgetS : 2 * kStreamBudgetS;
}

void report_stream(const std::string& impl, const std::string& transport, size_t size, uint64_t n,
                   double s, const std::string& done) {
  uint64_t rc = 0, rb = 0;
  std::sscanf(done.c_str(), "%lu %lu", &rc, &rb);
  if (rc != n || rb != n * size) {
    std::fprintf(stderr, "bench_channel: %s %s: receiver counted %lu msgs / %lu bytes, sent %lu\n",
                 impl.c_str(), transport.c_str(), rc, rb, n);
  }
  nlohmann::json p = {{"transport", transport}, {"size", size}};
  std::printf("xproc_stream %s %s size=%zu: %lu msgs in %.3f s\n", impl.c_str(), transport.c_str(),
              size, n, s);
  if (size <= 4096) {
    report("xproc_stream", impl, "rate", static_cast<double>(n) / s, "msgs/s", "higher", p);
  } else {
    report("xproc_stream", impl, "bandwidth", static_cast<double>(n * size) / s / 1e9, "GB/s",
           "higher", p);
  }
}

void stream_raw(const std::string& transport, size_t size) {
  Child c = Child::spawn({"raw_sink", transport});
  int fd = raw_connect(transport, c.expect("READY"));
  std::vector<char> payload(size, 'x');
  const uint64_t limit = stream_limit(size);
  const double budget = stream_budget(size);
  uint64_t n = 0;
  auto t0 = Clock::now();
  if (size <= 4096) {
    // Buffered: frames appended to a 64 KiB buffer, one write() per full buffer.
    std::vector<char> out(64 << 10);
    size_t used = 0;
    auto len = static_cast<uint32_t>(size);
    while (n < limit) {
      if (used + 4 + size > out.size()) {
        write_full(fd, out.data(), used);
        used = 0;
        if ((n & 1023) == 0 && secs(t0, Clock::now()) > budget) break;
      }
      std::memcpy(out.data() + used, &len, 4);
      std::memcpy(out.data() + used + 4, payload.data(), size);
      used += 4 + size;
      ++n;
    }
    write_full(fd, out.data(), used);
  } else {
    // Large: header + payload with one writev per message (no copy).
    auto len = static_cast<uint32_t>(size);
    while (n < limit && secs(t0, Clock::now()) < budget) {
      iovec iov[2] = {{&len, 4}, {payload.data(), size}};
      size_t left = 4 + size;
      ssize_t r = writev(fd, iov, 2);
      if (r < 0) die("writev");
      left -= static_cast<size_t>(r);
      if (left > 0) {
        size_t done = static_cast<size_t>(r);
        if (done < 4) {
          write_full(fd, reinterpret_cast<char*>(&len) + done, 4 - done);
          write_full(fd, payload.data(), size);
        } else {
          write_full(fd, payload.data() + (done - 4), left);
        }
      }
      ++n;
    }
  }
  uint32_t end = kEndMarker;
  write_full(fd, &end, 4);
  auto done = c.expect("DONE");
  double s = secs(t0, Clock::now());
  close(fd);
  report_stream("raw_socket", transport, size, n, s, done);
}

void stream_monarch(const std::string& transport, size_t size) {
  Child c = Child::spawn({"monarch_sink", transport});
  auto addr = ChannelAddr::parse(c.expect("READY"));
  IoRuntime io;
  auto s = Sender::connect(io, addr, opts(), on_failure);
  // Connect and warm up outside the timed region.
  s->send(Message{{Bytes(size)}});
  while (s->pending() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  std::vector<std::byte> payload(size, std::byte{'x'});
  // Large payloads go as a shared part (no user-space copy, like the raw socket's writev); small
  // ones are copied into the message as a caller building a message would.
  const bool share = size >= (64u << 10);
  auto shared = std::make_shared<const Bytes>(payload);
  const uint64_t limit = stream_limit(size);
  const double budget = stream_budget(size);
  // Bounded in-flight window (the channel queue is unbounded): 64 MiB or 64k messages.
  const size_t window = std::max<size_t>(8, std::min<size_t>(65536, (64u << 20) / size));
  uint64_t n = 0;
  auto t0 = Clock::now();
  while (n < limit) {
    if ((n & 1023) == 0 && secs(t0, Clock::now()) > budget) break;
    while (s->pending() >= window) std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (share) {
      s->send(Message{{}, {shared}});
    } else {
      s->send(Message{{Bytes(payload.begin(), payload.end())}});
    }
    ++n;
  }
  s->send(Message{{Bytes(1), Bytes(1)}});  // end marker
  auto done = c.expect("DONE");
  double secs_taken = secs(t0, Clock::now());
  drain(*s);
  // The warm-up message counts at the receiver.
  uint64_t rc = 0, rb = 0;
  std::sscanf(done.c_str(), "%lu %lu", &rc, &rb);
  std::string adj = std::to_string(rc - 1) + " " + std::to_string(rb - size);
  report_stream("monarch", transport, size, n, secs_taken, adj);
}

bool enabled(const char* name) {
  const char* f = std::getenv("BENCH_CHANNEL_ONLY");  // e.g. "rtt", "stream", "raw", "caf"
  return f == nullptr || std::string(name).find(f) != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--role") return run_role(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  for (std::string t : {"unix", "tcp"}) {
    if (enabled(("rtt raw " + t).c_str())) rtt_raw(t);
    if (enabled(("rtt raw_thread " + t).c_str())) rtt_raw_thread(t, false);
    if (enabled(("rtt raw_epoll_thread " + t).c_str())) rtt_raw_thread(t, true);
    if (enabled(("rtt raw_epoll_both " + t).c_str())) rtt_raw_thread(t, true, true);
    if (enabled(("rtt monarch " + t).c_str())) rtt_monarch(t);
    if (enabled(("rtt monarch_actor " + t).c_str())) rtt_monarch_actor(t);
  }
  if (enabled("rtt caf tcp")) rtt_caf();
  for (size_t size : {size_t{64}, size_t{1} << 20}) {
    for (std::string t : {"unix", "tcp"}) {
      if (enabled(("stream raw " + t + " " + std::to_string(size)).c_str())) stream_raw(t, size);
      if (enabled(("stream monarch " + t + " " + std::to_string(size)).c_str()))
        stream_monarch(t, size);
    }
  }
  std::printf(
      "targets: rtt <= 1.5x raw_socket; >= 1M msgs/s at 64 B; 1 MiB >= 70%% of raw_socket GB/s\n");
  return 0;
}
