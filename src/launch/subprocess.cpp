// Running the launchers' commands (see subprocess.hpp).
#include "subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "monarch/actor/errors.hpp"

extern char** environ;

namespace monarch::launch::detail {

using Clock = std::chrono::steady_clock;

std::string join_command(const std::vector<std::string>& argv) {
  std::string s;
  for (size_t i = 0; i < argv.size(); ++i) s += (i ? " " : "") + argv[i];
  return s;
}

namespace {

// Our environment with `extra` ("K=V") replacing the entries of the same keys, then `extra`.
std::vector<std::string> merged_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& x : extra) overridden = overridden || x.substr(0, x.find('=')) == key;
    if (!overridden) env.push_back(std::move(kv));
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace

CommandResult try_run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  if (argv.empty()) throw UsageError("run_command: empty argv");
  CommandResult r;
  const bool feed = options.input.has_value();
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  if ((feed && ::pipe2(in, O_CLOEXEC) != 0) || ::pipe2(out, O_CLOEXEC) != 0 ||
      ::pipe2(err, O_CLOEXEC) != 0) {
    r.failure = CommandFailure::pipe;
    r.error = errno;
    close_all({in[0], in[1], out[0], out[1], err[0], err[1]});
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (feed) {
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  } else {
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  }
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env;
  std::vector<char*> envp;
  if (!options.env.empty()) {
    env = merged_env(options.env);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(),
                          options.env.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close_all({in[0], out[1], err[1]});
  if (rc != 0) {
    close_all({in[1], out[0], err[0]});
    r.failure = CommandFailure::spawn;
    r.error = rc;
    return r;
  }

  static const std::string kNoInput;
  const std::string& input = feed ? *options.input : kNoInput;
  size_t written = 0;
  int in_fd = in[1];
  if (in_fd >= 0) {
    ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
    if (input.empty()) {
      ::close(in_fd);
      in_fd = -1;
    }
  }
  // SIGPIPE when the child exits before reading its input: blocked here, taken back below.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  if (feed) ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const auto deadline = Clock::now() + options.timeout;
  bool timed_out = false;
  int open_fds = 2;
  int fds[2] = {out[0], err[0]};
  std::string* bufs[2] = {&r.out, &r.err};
  while (open_fds > 0 || in_fd >= 0) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p[3];
    nfds_t n = 0;
    for (int fd : fds) p[n++] = {fd, POLLIN, 0};
    if (in_fd >= 0) p[n++] = {in_fd, POLLOUT, 0};
    if (::poll(p, n, static_cast<int>(std::min<long>(left, 1000))) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || p[i].revents == 0) continue;
      char buf[8192];
      ssize_t k = ::read(fds[i], buf, sizeof buf);
      if (k > 0) {
        bufs[i]->append(buf, static_cast<size_t>(k));
      } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i]);
        fds[i] = -1;
        p[i].fd = -1;
        --open_fds;
      }
    }
    if (in_fd >= 0 && p[2].revents != 0) {
      ssize_t k = ::write(in_fd, input.data() + written, input.size() - written);
      if (k > 0) written += static_cast<size_t>(k);
      if (written == input.size() || (k < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(in_fd);
        in_fd = -1;
      }
    }
  }
  close_all({in_fd, fds[0], fds[1]});
  if (feed) {
    timespec zero{0, 0};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
    }
    ::pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    r.failure = CommandFailure::timeout;
    return r;
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  CommandResult r = try_run_command(argv, options);
  const std::string what = join_command(argv);
  switch (r.failure) {
    case CommandFailure::none:
      return r;
    case CommandFailure::pipe:
      throw Error(what + ": pipe failed");
    case CommandFailure::spawn:
      throw Error(what + ": cannot start " + argv[0] + ": " + std::strerror(r.error));
    case CommandFailure::timeout:
      throw Error(what + ": no answer within " + std::to_string(options.timeout.count()) +
                  " ms (killed)");
  }
  return r;
}

}  // namespace monarch::launch::detail
