#include "process_host.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "fork_server.hpp"
#include "monarch/actor/errors.hpp"

extern char** environ;

namespace monarch::mesh::process_detail {

std::string ExitStatus::to_string() const {
  if (signal == 0) return "exited with code " + std::to_string(code);
  const char* abbrev = ::sigabbrev_np(signal);
  std::string s = "killed by signal " + std::to_string(signal);
  if (abbrev != nullptr) s += std::string(" (SIG") + abbrev + ")";
  if (core) s += ", core dumped";
  return s;
}

namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut into pieces of this size

using namespace std::chrono_literals;
// A fork server must reach bootstrap() within this (it loads the program's libraries)...
constexpr auto kServerHelloTimeout = 60s;
// ... and answer a fork request within this (a fork takes milliseconds).
constexpr auto kServerForkTimeout = 10s;

struct Server;

struct Child {
  pid_t pid = -1;
  int pidfd = -1;
  int out[3] = {-1, -1, -1};  // [1] stdout, [2] stderr read ends (non-blocking)
  std::string partial[3];
  ProcessHost::OnLine on_line;
  ProcessHost::OnExit on_exit;
  // Forked by a fork server (its parent, which reports the exit), or null: our own child.
  std::shared_ptr<Server> server;
  // Its fork server died first: the exit shows on the pidfd, its status is lost (PDEATHSIG).
  bool orphaned = false;
};

// A fork server (fork_server.hpp): one per program, arguments and extra environment.
struct Server {
  std::string key, program;
  pid_t pid = -1;
  int sock = -1;                // our end of the socket pair; -1 once it is lost
  std::promise<int64_t> hello;  // its thread count, or -1: it died before hello
  bool said_hello = false;
  struct Pending {
    std::shared_ptr<Child> child;
    std::shared_ptr<std::promise<int64_t>> pid;  // the pid, -errno, or -ECONNRESET: it died
  };
  std::unordered_map<uint64_t, Pending> pending;  // fork requests by seq
};

// glibc 2.36's <sys/pidfd.h> lacks extern "C" for C++; the raw system calls are simpler.
int pidfd_open_(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U));
}
int pidfd_signal_(int fd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0U));
}

void set_nonblock(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// A child's stdout and stderr pipes (close-on-exec); throws naming `program` when out of fds.
void output_pipes(const std::string& program, int out[2], int err[2]) {
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error("spawning " + program + ": pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw Error("spawning " + program + ": pipe failed");
  }
}

}  // namespace

struct ProcessHost::Impl {
  // Spawner thread: runs fork jobs. It never exits (PH-1), so it is detached with the Impl leaked.
  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::deque<std::function<void()>> jobs;

  // Reaper: one poll loop over an eventfd (wake-up), every pidfd and every output pipe.
  mutable std::mutex mu;
  std::unordered_map<pid_t, std::shared_ptr<Child>> children;
  std::unordered_map<std::string, std::shared_ptr<Server>> servers;  // by Server::key
  int wake = -1;

  // Spawner thread only.
  std::set<std::string> refused;  // keys whose program cannot serve forks (warned once)
  uint64_t next_seq = 0;

  Impl() {
    wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake < 0) throw Error("host agent: eventfd failed: " + std::string(::strerror(errno)));
    std::thread([this] { spawner_loop(); }).detach();
    std::thread([this] { reaper_loop(); }).detach();
  }

  void spawner_loop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(jobs_mu);
        jobs_cv.wait(lock, [&] { return !jobs.empty(); });
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();
    }
  }

  void poke() {
    uint64_t one = 1;
    (void)!::write(wake, &one, sizeof one);
  }

  // Delivers complete lines in `c.partial[s]`; `flush` also delivers an unterminated tail.
  static void emit_lines(Child& c, int s, bool flush) {
    std::string& buf = c.partial[s];
    size_t start = 0;
    while (true) {
      size_t nl = buf.find('\n', start);
      if (nl == std::string::npos) break;
      if (c.on_line) c.on_line(s, buf.substr(start, nl - start));
      start = nl + 1;
    }
    buf.erase(0, start);
    while (buf.size() >= kMaxLine || (flush && !buf.empty())) {
      size_t n = std::min(buf.size(), kMaxLine);
      if (c.on_line) c.on_line(s, buf.substr(0, n));
      buf.erase(0, n);
    }
  }

  // Reads what is available on stream `s`; closes it at EOF. Returns false at EOF.
  static bool drain(Child& c, int s) {
    char tmp[16384];
    while (true) {
      ssize_t n = ::read(c.out[s], tmp, sizeof tmp);
      if (n > 0) {
        c.partial[s].append(tmp, static_cast<size_t>(n));
        emit_lines(c, s, false);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      ::close(c.out[s]);
      c.out[s] = -1;
      emit_lines(c, s, true);
      return false;
    }
  }

  // How our own child `c` ended (its pidfd is readable). A fork server's orphan was reaped by
  // init: its status is gone, and it died of the PDEATHSIG that its server's death sent.
  static ExitStatus wait_status(const Child& c) {
    ExitStatus st;
    if (c.orphaned) {
      st.signal = SIGKILL;
      return st;
    }
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(c.pidfd), &info, WEXITED) !=
               0 &&
           errno == EINTR) {
    }
    if (info.si_code == CLD_EXITED) {
      st.code = info.si_status;
    } else {
      st.signal = info.si_status;
      st.core = info.si_code == CLD_DUMPED;
    }
    return st;
  }

  void finish(const std::shared_ptr<Child>& c, const ExitStatus& st) {
    // PH-2: what the child wrote before it exited is in the pipes now.
    for (int s = 1; s <= 2; ++s) {
      if (c->out[s] < 0) continue;
      drain(*c, s);
      if (c->out[s] >= 0) {
        ::close(c->out[s]);
        c->out[s] = -1;
        emit_lines(*c, s, true);
      }
    }
    {
      std::lock_guard lock(mu);
      if (c->pidfd >= 0) ::close(c->pidfd);
      c->pidfd = -1;
      children.erase(c->pid);
    }
    if (c->on_exit) c->on_exit(st);
  }

  static void close_reads(Child& c) {
    for (int s = 1; s <= 2; ++s) {
      if (c.out[s] >= 0) ::close(c.out[s]);
      c.out[s] = -1;
    }
  }

  // Reaper thread: the server's socket closed (it died, or sent something that is not ours).
  // Its pending forks fail; its children, which die of PDEATHSIG, are watched by pidfd alone.
  void server_lost(const std::shared_ptr<Server>& s) {
    std::vector<Server::Pending> pending;
    {
      std::lock_guard lock(mu);
      ::close(s->sock);
      s->sock = -1;
      if (auto it = servers.find(s->key); it != servers.end() && it->second == s) servers.erase(it);
      for (auto& [seq, p] : s->pending) pending.push_back(std::move(p));
      s->pending.clear();
      for (auto& [pid, c] : children) c->orphaned |= c->server == s;
    }
    if (!s->said_hello) s->hello.set_value(-1);
    s->said_hello = true;
    for (auto& p : pending) {
      close_reads(*p.child);
      p.pid->set_value(-ECONNRESET);
    }
    std::vector<std::shared_ptr<Child>> gone;  // orphans whose pidfd could not be opened
    {
      std::lock_guard lock(mu);
      for (auto& [pid, c] : children) {
        if (c->server == s && c->pidfd < 0) gone.push_back(c);
      }
    }
    for (auto& c : gone) finish(c, wait_status(*c));
  }

  // Reaper thread: the messages the server `s` sent (fork_server.hpp).
  void server_readable(const std::shared_ptr<Server>& s) {
    while (true) {
      ForkMsg m;
      int passed = -1;  // the pidfd an 'S' carries
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      iovec iov{&m, sizeof m};
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = control;
      mh.msg_controllen = sizeof control;
      ssize_t n = ::recvmsg(s->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (cmsghdr* cm = CMSG_FIRSTHDR(&mh);
          cm != nullptr && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int))) {
        std::memcpy(&passed, CMSG_DATA(cm), sizeof passed);
      }
      if (n != static_cast<ssize_t>(sizeof m)) {
        if (passed >= 0) ::close(passed);
        server_lost(s);
        return;
      }
      if (m.type == 'H' && !s->said_hello) {
        s->said_hello = true;
        s->hello.set_value(m.threads);
      } else if (m.type == 'S') {
        Server::Pending p;
        {
          std::lock_guard lock(mu);
          if (auto it = s->pending.find(m.seq); it != s->pending.end()) {
            p = std::move(it->second);
            s->pending.erase(it);
          }
          if (p.child && m.pid > 0) {
            // Not our child: its pidfd (opened by the server before it could reap the pid) is
            // for signals, so that a reused pid is never signalled (PH-2); the exit comes as 'X'.
            p.child->pid = static_cast<pid_t>(m.pid);
            p.child->pidfd = std::exchange(passed, -1);
            children.emplace(p.child->pid, p.child);
          }
        }
        if (passed >= 0) ::close(passed);
        if (!p.child) {
          // Nobody waits for it any more (the spawner gave up): it must not live on.
          if (m.pid > 0) ::kill(static_cast<pid_t>(m.pid), SIGKILL);
          continue;
        }
        if (m.pid <= 0) close_reads(*p.child);
        p.pid->set_value(m.pid);
      } else if (m.type == 'X') {
        std::shared_ptr<Child> c;
        {
          std::lock_guard lock(mu);
          if (auto it = children.find(static_cast<pid_t>(m.pid));
              it != children.end() && it->second->server == s)
            c = it->second;
        }
        if (!c) continue;  // one the spawner gave up on
        ExitStatus st;
        st.code = m.code;
        st.signal = m.signal;
        st.core = m.core != 0;
        finish(c, st);
      } else if (passed >= 0) {
        ::close(passed);
      }
    }
  }

  void reaper_loop() {
    struct Watched {
      std::shared_ptr<Child> child;
      std::shared_ptr<Server> server;
      int what = 0;  // 0: the child's pidfd, 1/2: its pipe, 3: the server's socket
    };
    std::vector<pollfd> fds;
    std::vector<Watched> who;
    while (true) {
      fds.clear();
      who.clear();
      fds.push_back({wake, POLLIN, 0});
      who.push_back({});
      {
        std::lock_guard lock(mu);
        for (auto& [pid, c] : children) {
          if (c->pidfd >= 0 && (!c->server || c->orphaned)) {
            fds.push_back({c->pidfd, POLLIN, 0});
            who.push_back({c, nullptr, 0});
          }
          for (int s = 1; s <= 2; ++s) {
            if (c->out[s] < 0) continue;
            fds.push_back({c->out[s], POLLIN, 0});
            who.push_back({c, nullptr, s});
          }
        }
        for (auto& [key, s] : servers) {
          fds.push_back({s->sock, POLLIN, 0});
          who.push_back({nullptr, s, 3});
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents != 0) {
        uint64_t v;
        (void)!::read(wake, &v, sizeof v);
      }
      // Pipes before exits, so a child's last lines come before its exit report (PH-2).
      for (size_t i = 1; i < fds.size(); ++i) {
        auto& w = who[i];
        if ((w.what == 1 || w.what == 2) && fds[i].revents != 0 && w.child->out[w.what] >= 0) {
          drain(*w.child, w.what);
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        auto& w = who[i];
        if (fds[i].revents == 0) continue;
        if (w.what == 3 && w.server->sock >= 0) server_readable(w.server);
        if (w.what == 0 && w.child->pidfd >= 0) finish(w.child, wait_status(*w.child));
      }
    }
  }

  // The environment of a child: ours, with spec.env and spec.own_env added and overriding.
  static std::vector<std::string> child_env(const ChildSpec& spec) {
    std::vector<std::string> adds = spec.env;
    adds.insert(adds.end(), spec.own_env.begin(), spec.own_env.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      auto key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const auto& add : adds) overridden |= add.compare(0, key.size() + 1, key + "=") == 0;
      if (!overridden) env.push_back(std::move(kv));
    }
    env.insert(env.end(), adds.begin(), adds.end());
    return env;
  }

  pid_t do_spawn(const ChildSpec& spec, OnLine on_line, OnExit on_exit) {
    if (spec.fork_server) {
      if (auto s = server_for(spec)) {
        pid_t pid = fork_from(s, spec, on_line, on_exit);
        if (pid > 0) return pid;
      }
    }
    return exec_child(spec, std::move(on_line), std::move(on_exit), -1);
  }

  // In a forked child whose execve failed: "monarch host agent: cannot execute PROGRAM: WHY
  // (errno N)" on stderr (forwarded with the rank prefix), with write() only.
  static void write_exec_failure(const char* program, int err) {
    auto put = [](const char* s) { (void)!::write(2, s, std::strlen(s)); };
    const char* why = err == ENOENT    ? "no such file"
                      : err == EACCES  ? "permission denied"
                      : err == ENOEXEC ? "not an executable format"
                      : err == ENOTDIR ? "a path component is not a directory"
                                       : "execve failed";
    char num[12];  // the decimal errno, written backwards from the end
    char* p = num + sizeof num;
    *--p = '\0';
    unsigned v = err < 0 ? 0u : static_cast<unsigned>(err);
    do {
      *--p = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    for (const char* s : {"monarch host agent: cannot execute ", program, ": ", why, " (errno ",
                          static_cast<const char*>(p), ")\n"})
      put(s);
  }

  // fork + exec of spec.program. `extra_fd` >= 0 becomes the child's fd 3 (a fork server's).
  pid_t exec_child(const ChildSpec& spec, OnLine on_line, OnExit on_exit, int extra_fd) {
    // Everything the child needs is built before fork: after it only async-signal-safe calls.
    std::vector<std::string> env_store = child_env(spec);
    std::vector<char*> envp;
    for (auto& s : env_store) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_store{spec.program};
    arg_store.insert(arg_store.end(), spec.args.begin(), spec.args.end());
    std::vector<char*> argv;
    for (auto& s : arg_store) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out[2], err[2];
    output_pipes(spec.program, out, err);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = ::getpid();
    const char* program = spec.program.c_str();
    pid_t pid = ::fork();
    if (pid == 0) {
      // Child. PDEATHSIG is bound to this (the spawner) thread; if the parent died between fork
      // and prctl, getppid() no longer names it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::setpgid(0, 0);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      unsigned first_closed = 3;
      if (extra_fd >= 0) {
        // dup2 onto itself would keep O_CLOEXEC; the fd is never 0-2 (those are open here).
        if (extra_fd == kForkServerFd) {
          ::fcntl(extra_fd, F_SETFD, 0);
        } else {
          ::dup2(extra_fd, kForkServerFd);
        }
        first_closed = kForkServerFd + 1;
      }
      ::syscall(SYS_close_range, first_closed, ~0U, 0U);
      ::execve(program, argv.data(), envp.data());
      write_exec_failure(program, errno);  // async-signal-safe: no strerror, no allocation
      ::_exit(127);
    }
    int fork_errno = errno;
    ::close(out[1]);
    ::close(err[1]);
    if (devnull >= 0) ::close(devnull);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      throw Error("spawning " + spec.program + ": fork failed: " + ::strerror(fork_errno));
    }
    auto c = std::make_shared<Child>();
    c->pid = pid;
    c->pidfd = pidfd_open_(pid);
    if (c->pidfd < 0) {  // cannot happen for our own unreaped child; keep it killable anyway
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ::close(out[0]);
      ::close(err[0]);
      throw Error("spawning " + spec.program + ": pidfd_open failed: " + ::strerror(errno));
    }
    ::fcntl(c->pidfd, F_SETFD, FD_CLOEXEC);
    c->out[1] = out[0];
    c->out[2] = err[0];
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    c->on_line = std::move(on_line);
    c->on_exit = std::move(on_exit);
    {
      std::lock_guard lock(mu);
      children.emplace(pid, std::move(c));
    }
    poke();
    return pid;
  }

  // Spawner thread: the live fork server of spec's program, arguments and environment, started
  // (and waited for) if there is none; null when that program cannot serve forks (warned once
  // per key; its workers are exec'd as without fork_server).
  std::shared_ptr<Server> server_for(const ChildSpec& spec) {
    std::string key = spec.program;
    for (const auto& a : spec.args) key += '\0' + a;
    key += '\n';
    std::vector<std::string> env = spec.env;
    std::sort(env.begin(), env.end());
    for (const auto& e : env) key += '\0' + e;
    if (refused.count(key) != 0) return nullptr;
    {
      std::lock_guard lock(mu);
      if (auto it = servers.find(key); it != servers.end()) return it->second;
    }
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      throw Error("spawning " + spec.program + ": socketpair failed: " + ::strerror(errno));
    }
    auto s = std::make_shared<Server>();
    s->key = key;
    s->program = spec.program;
    s->sock = sv[0];
    auto hello = s->hello.get_future();
    ChildSpec zs = spec;
    zs.own_env = {};
    zs.env.push_back(std::string(kForkServerEnv) + "=" + std::to_string(kForkServerFd));
    auto on_line = [program = spec.program](int, std::string line) {
      spdlog::warn("fork server of {}: {}", program, line);
    };
    try {
      s->pid = exec_child(zs, on_line, {}, sv[1]);
    } catch (...) {
      ::close(sv[0]);
      ::close(sv[1]);
      throw;
    }
    ::close(sv[1]);
    {
      std::lock_guard lock(mu);
      servers[key] = s;
    }
    poke();
    auto refuse = [&](const std::string& why) -> std::shared_ptr<Server> {
      spdlog::warn("fork server of {}: {}; its workers are exec'd instead", spec.program, why);
      refused.insert(key);  // checked first: the server stays listed until its socket closes
      signal_child(s->pid, SIGKILL);
      return nullptr;
    };
    if (hello.wait_for(kServerHelloTimeout) != std::future_status::ready) {
      return refuse("it did not reach bootstrap() within " +
                    std::to_string(kServerHelloTimeout.count()) + " s");
    }
    int64_t threads = hello.get();
    if (threads < 0) {
      return refuse("it exited before bootstrap() (does main() call it first?)");
    }
    if (threads != 1) {
      return refuse(std::to_string(threads) +
                    " threads were running when bootstrap() started, and a fork copies only "
                    "one (start no thread before bootstrap())");
    }
    return s;
  }

  // Spawner thread: a worker forked by server `s`. Returns its pid, or -1 when the server is
  // gone or stuck (warned; the caller execs the worker instead). Throws when its fork failed.
  pid_t fork_from(const std::shared_ptr<Server>& s, const ChildSpec& spec, const OnLine& on_line,
                  const OnExit& on_exit) {
    std::string msg(sizeof(ForkMsg), '\0');
    ForkMsg req;
    req.type = 'R';
    req.seq = ++next_seq;
    std::memcpy(msg.data(), &req, sizeof req);
    for (const auto& kv : child_env(spec)) {
      msg += kv;
      msg += '\0';
    }
    int out[2], err[2];
    output_pipes(spec.program, out, err);
    auto c = std::make_shared<Child>();
    c->out[1] = out[0];
    c->out[2] = err[0];
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    c->on_line = on_line;
    c->on_exit = on_exit;
    c->server = s;
    auto answer = std::make_shared<std::promise<int64_t>>();
    auto pid_future = answer->get_future();
    bool sent = false;
    {
      std::lock_guard lock(mu);
      if (s->sock >= 0) {
        s->pending[req.seq] = {c, answer};
        alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
        iovec iov{msg.data(), msg.size()};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        cmsghdr* cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
        int pass[2] = {out[1], err[1]};
        std::memcpy(CMSG_DATA(cm), pass, sizeof pass);
        sent = ::sendmsg(s->sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) ==
               static_cast<ssize_t>(msg.size());
        if (!sent) s->pending.erase(req.seq);
      }
    }
    ::close(out[1]);
    ::close(err[1]);
    auto give_up = [&](const std::string& why) -> pid_t {
      spdlog::warn("fork server of {} (pid {}): {}; exec'ing the worker instead", spec.program,
                   s->pid, why);
      return -1;
    };
    if (!sent) {
      close_reads(*c);
      return give_up("it does not take requests");
    }
    if (pid_future.wait_for(kServerForkTimeout) != std::future_status::ready) {
      bool withdrawn = false;
      {
        std::lock_guard lock(mu);
        withdrawn = s->pending.erase(req.seq) != 0;
      }
      if (withdrawn) {  // else the answer came meanwhile, and is used
        close_reads(*c);
        signal_child(s->pid, SIGKILL);  // stuck: the next spawn starts a new one
        return give_up("no answer within " + std::to_string(kServerForkTimeout.count()) + " s");
      }
    }
    int64_t pid = pid_future.get();
    if (pid == -ECONNRESET) return give_up("it died");  // server_lost closed the pipes
    if (pid <= 0) {
      throw Error("spawning " + spec.program +
                  ": fork (in its fork server) failed: " + ::strerror(static_cast<int>(-pid)));
    }
    poke();  // watch its pipes
    return static_cast<pid_t>(pid);
  }

  bool signal_child(pid_t pid, int sig) {
    std::lock_guard lock(mu);
    auto it = children.find(pid);
    if (it == children.end() || it->second->pidfd < 0) return false;
    if (sig == SIGKILL) ::kill(-pid, SIGKILL);  // the child's process group: its own children too
    return pidfd_signal_(it->second->pidfd, sig) == 0;
  }
};

ProcessHost::ProcessHost() : impl_(std::make_unique<Impl>()) {}

ProcessHost& ProcessHost::instance() {
  // Leaked on purpose: its threads run until the process exits (PH-1).
  static ProcessHost* host = new ProcessHost();
  return *host;
}

pid_t ProcessHost::spawn(const ChildSpec& spec, OnLine on_line, OnExit on_exit) {
  auto task = std::make_shared<std::packaged_task<pid_t()>>(
      [this, &spec, l = std::move(on_line), e = std::move(on_exit)]() mutable {
        return impl_->do_spawn(spec, std::move(l), std::move(e));
      });
  auto result = task->get_future();
  {
    std::lock_guard lock(impl_->jobs_mu);
    impl_->jobs.emplace_back([task] { (*task)(); });
  }
  impl_->jobs_cv.notify_one();
  return result.get();
}

bool ProcessHost::signal(pid_t pid, int sig) {
  return impl_->signal_child(pid, sig);
}

size_t ProcessHost::live() const {
  std::lock_guard lock(impl_->mu);
  return impl_->children.size();
}

std::vector<pid_t> ProcessHost::fork_servers() const {
  std::lock_guard lock(impl_->mu);
  std::vector<pid_t> pids;
  for (const auto& [key, s] : impl_->servers) pids.push_back(s->pid);
  return pids;
}

}  // namespace monarch::mesh::process_detail
