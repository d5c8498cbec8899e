#include "process_host.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

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

struct Child {
  pid_t pid = -1;
  int pidfd = -1;
  int out[3] = {-1, -1, -1};  // [1] stdout, [2] stderr read ends (non-blocking)
  std::string partial[3];
  ProcessHost::OnLine on_line;
  ProcessHost::OnExit on_exit;
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

}  // namespace

struct ProcessHost::Impl {
  // Spawner thread: runs fork jobs. It never exits (PH-1), so it is detached with the Impl leaked.
  std::mutex jobs_mu;
  std::condition_variable jobs_cv;
  std::deque<std::function<void()>> jobs;

  // Reaper: one poll loop over an eventfd (wake-up), every pidfd and every output pipe.
  mutable std::mutex mu;
  std::unordered_map<pid_t, std::shared_ptr<Child>> children;
  int wake = -1;

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

  void reaped(const std::shared_ptr<Child>& c) {
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(c->pidfd), &info, WEXITED) !=
               0 &&
           errno == EINTR) {
    }
    ExitStatus st;
    if (info.si_code == CLD_EXITED) {
      st.code = info.si_status;
    } else {
      st.signal = info.si_status;
      st.core = info.si_code == CLD_DUMPED;
    }
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
      ::close(c->pidfd);
      c->pidfd = -1;
      children.erase(c->pid);
    }
    if (c->on_exit) c->on_exit(st);
  }

  void reaper_loop() {
    std::vector<pollfd> fds;
    std::vector<std::pair<std::shared_ptr<Child>, int>> who;  // (child, 0 = pidfd, 1/2 = pipe)
    while (true) {
      fds.clear();
      who.clear();
      fds.push_back({wake, POLLIN, 0});
      who.emplace_back(nullptr, 0);
      {
        std::lock_guard lock(mu);
        for (auto& [pid, c] : children) {
          fds.push_back({c->pidfd, POLLIN, 0});
          who.emplace_back(c, 0);
          for (int s = 1; s <= 2; ++s) {
            if (c->out[s] < 0) continue;
            fds.push_back({c->out[s], POLLIN, 0});
            who.emplace_back(c, s);
          }
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents != 0) {
        uint64_t v;
        (void)!::read(wake, &v, sizeof v);
      }
      // Pipes before exits, so a child's last lines come before its exit report (PH-2).
      for (size_t i = 1; i < fds.size(); ++i) {
        if (who[i].second != 0 && fds[i].revents != 0 && who[i].first->out[who[i].second] >= 0) {
          drain(*who[i].first, who[i].second);
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (who[i].second == 0 && fds[i].revents != 0) reaped(who[i].first);
      }
    }
  }

  pid_t do_spawn(const ChildSpec& spec, OnLine on_line, OnExit on_exit) {
    // Everything the child needs is built before fork: after it only async-signal-safe calls.
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      auto key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const auto& add : spec.env) overridden |= add.compare(0, key.size() + 1, key + "=") == 0;
      if (!overridden) env_store.push_back(std::move(kv));
    }
    for (const auto& add : spec.env) env_store.push_back(add);
    std::vector<char*> envp;
    for (auto& s : env_store) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_store{spec.program};
    arg_store.insert(arg_store.end(), spec.args.begin(), spec.args.end());
    std::vector<char*> argv;
    for (auto& s : arg_store) argv.push_back(s.data());
    argv.push_back(nullptr);

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw Error("spawning " + spec.program + ": pipe failed");
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      throw Error("spawning " + spec.program + ": pipe failed");
    }
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
      ::syscall(SYS_close_range, 3U, ~0U, 0U);
      ::execve(program, argv.data(), envp.data());
      static const char msg[] = "monarch host agent: exec failed\n";
      (void)!::write(2, msg, sizeof msg - 1);
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
  std::lock_guard lock(impl_->mu);
  auto it = impl_->children.find(pid);
  if (it == impl_->children.end() || it->second->pidfd < 0) return false;
  if (sig == SIGKILL) ::kill(-pid, SIGKILL);  // the child's process group: its own children too
  return pidfd_signal_(it->second->pidfd, sig) == 0;
}

size_t ProcessHost::live() const {
  std::lock_guard lock(impl_->mu);
  return impl_->children.size();
}

}  // namespace monarch::mesh::process_detail
