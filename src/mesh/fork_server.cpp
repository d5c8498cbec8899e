// The worker side of a fork server (protocol: fork_server.hpp). Single-threaded by construction:
// it runs before the worker has a Proc, and it refuses to fork when anything else started a
// thread (a fork copies only the calling thread; a lock another thread held stays locked).
#include "fork_server.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace monarch::mesh::process_detail {
namespace {

int64_t count_threads() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int64_t n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// Sends `m`, with `fd` attached when >= 0.
void send_msg(int sock, const ForkMsg& m, int fd = -1) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<ForkMsg*>(&m), sizeof m};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  while (::sendmsg(sock, &mh, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void leave() {
  ::_exit(0);  // the agent is gone or refused us: our children die with us (PDEATHSIG)
}

// In the new child: the requested stdio and environment, then back to bootstrap().
void become_child(pid_t server, int sock, int sigfd, int out, int err,
                  const std::vector<char*>& env) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // bound to the server's one thread
  if (::getppid() != server) ::_exit(127);
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::close(sock);
  ::close(sigfd);
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::close(devnull);
  }
  ::dup2(out, 1);
  ::dup2(err, 2);
  ::close(out);
  ::close(err);
  ::clearenv();
  for (char* kv : env) ::putenv(kv);  // the strings stay alive: this process never frees them
}

}  // namespace

void serve_forks(const char* fd) {
  char* end = nullptr;
  const long number = std::strtol(fd, &end, 10);
  int type = 0;
  socklen_t type_len = sizeof type;
  if (end == fd || *end != '\0' || number < 0 || number > INT32_MAX ||
      ::getsockopt(static_cast<int>(number), SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 ||
      type != SOCK_SEQPACKET) {
    std::fprintf(stderr,
                 "monarch: %s=%s names no fork server socket (only a host agent sets it); "
                 "ignored\n",
                 kForkServerEnv, fd);
    ::unsetenv(kForkServerEnv);
    return;
  }
  const int sock = static_cast<int>(number);
  const pid_t self = ::getpid();
  ForkMsg hello;
  hello.type = 'H';
  hello.threads = count_threads();
  send_msg(sock, hello);
  if (hello.threads != 1) leave();

  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) leave();

  std::vector<char> buf;
  while (true) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sigfd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents != 0) {
      signalfd_siginfo si;
      while (::read(sigfd, &si, sizeof si) > 0) {
      }
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        ForkMsg x;
        x.type = 'X';
        x.pid = pid;
        if (WIFEXITED(status)) {
          x.code = WEXITSTATUS(status);
        } else {
          x.signal = WTERMSIG(status);
          x.core = WCOREDUMP(status) ? 1 : 0;
        }
        send_msg(sock, x);
      }
    }
    if (fds[0].revents == 0) continue;
    // One request: its size first (SEQPACKET keeps records whole), then the record.
    ssize_t size = ::recv(sock, nullptr, 0, MSG_PEEK | MSG_TRUNC);
    if (size <= 0) {
      if (size < 0 && errno == EINTR) continue;
      leave();  // the agent closed its end
    }
    buf.assign(static_cast<size_t>(size) + 1, '\0');
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    iovec iov{buf.data(), static_cast<size_t>(size)};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n <= 0) leave();
    int fds_in[2] = {-1, -1};
    if (cmsghdr* c = CMSG_FIRSTHDR(&mh);
        c != nullptr && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(2 * sizeof(int))) {
      std::memcpy(fds_in, CMSG_DATA(c), sizeof fds_in);
    }
    ForkMsg req;
    if (static_cast<size_t>(n) < sizeof req || fds_in[0] < 0) leave();  // not our agent
    std::memcpy(&req, buf.data(), sizeof req);
    // The environment: NUL-terminated strings after the header. Copied onto the heap so that the
    // child can keep them as its environ.
    std::vector<char*> env;
    for (size_t at = sizeof req; at < static_cast<size_t>(n);) {
      size_t len = ::strnlen(buf.data() + at, static_cast<size_t>(n) - at);
      env.push_back(::strndup(buf.data() + at, len));
      at += len + 1;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
      become_child(self, sock, sigfd, fds_in[0], fds_in[1], env);
      return;
    }
    const int fork_errno = errno;
    for (char* kv : env) ::free(kv);
    ::close(fds_in[0]);
    ::close(fds_in[1]);
    ForkMsg s;
    s.type = 'S';
    s.seq = req.seq;
    s.pid = pid > 0 ? pid : -fork_errno;
    // Its pidfd, opened before this loop can reap it: the agent signals through it (PH-2).
    int pidfd = pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U)) : -1;
    send_msg(sock, s, pidfd);
    if (pidfd >= 0) ::close(pidfd);
  }
}

}  // namespace monarch::mesh::process_detail
