// Test support: a child process (fork/exec) with its stdin and stdout on pipes. Shared by the
// tests that need real processes (channels, remote actors).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace monarch::testing {

class Subprocess {
 public:
  /// Starts `path` with `args` (argv[1..]). The child exits when the pipe to its stdin closes
  /// (if it reads stdin) or is killed by the destructor. With `die_with_parent` it also gets
  /// SIGKILL when the thread that started it exits, which includes this process being killed
  /// (PR_SET_PDEATHSIG): nothing outlives a test or bench that was killed. Start such a child
  /// from a thread that lives as long as the child should.
  Subprocess(const std::string& path, const std::vector<std::string>& args,
             bool die_with_parent = false) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("Subprocess: pipe failed");
    }
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(path.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      if (die_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) {
        ::_exit(127);  // the parent is gone already (or the death signal cannot be set)
      }
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execv(path.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Subprocess() {
    close_stdin();
    if (!reaped_) kill(SIGKILL);
    ::close(stdout_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  /// Next stdout line, or nullopt at EOF or after the deadline.
  std::optional<std::string> line(std::chrono::milliseconds deadline) {
    auto end = std::chrono::steady_clock::now() + deadline;
    while (true) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(stdout_, tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  /// Waits for a "LISTENING <addr>" line and returns the address.
  std::string listening(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    auto l = line(deadline);
    if (!l || !l->starts_with("LISTENING ")) {
      throw std::runtime_error("child did not print LISTENING: " + l.value_or("<eof>"));
    }
    return l->substr(10);
  }

  /// Writes `text` and a newline to the child's stdin. Returns false if the child is gone.
  bool write_line(const std::string& text) {
    std::string l = text + "\n";
    size_t done = 0;
    while (done < l.size()) {
      ssize_t n = ::write(stdin_, l.data() + done, l.size() - done);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  pid_t pid() const { return pid_; }

  /// Waits for the child to end and reaps it: its wait status (WIFEXITED, WEXITSTATUS...), or
  /// nullopt if it is still running after `deadline`.
  std::optional<int> wait(std::chrono::milliseconds deadline) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (fd < 0) throw std::runtime_error("Subprocess: pidfd_open failed");
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(deadline.count()));
    ::close(fd);
    if (ready <= 0) return std::nullopt;
    int status = 0;
    if (::waitpid(pid_, &status, 0) != pid_) throw std::runtime_error("Subprocess: waitpid failed");
    reaped_ = true;
    return status;
  }

  /// Closes the child's stdin (a child waiting for EOF goes on).
  void close_stdin() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
  }

  /// Sends `sig`; SIGKILL also reaps the child.
  void kill(int sig) {
    ::kill(pid_, sig);
    if (sig == SIGKILL) {
      ::waitpid(pid_, nullptr, 0);
      reaped_ = true;
    }
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  bool reaped_ = false;
  std::string buf_;
};

}  // namespace monarch::testing
