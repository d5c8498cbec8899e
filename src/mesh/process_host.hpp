// Internal: the process side of a host agent. Forks worker processes from one long-lived thread,
// watches each with a pidfd, reaps it with waitid(P_PIDFD), and streams its stdout/stderr lines.
// With ChildSpec::fork_server, a fork server (fork_server.hpp) forks the worker instead, and
// reports its exit.
//
// It implements PH-1 (no orphans: PR_SET_PDEATHSIG bound to a spawner thread that lives as long
// as the process) and PH-2 (exits seen at once through the pidfd, after the lines written before
// the exit; signals go through the pidfd, so a reused pid is never signalled) of
// docs/processes.md, where the PH family is stated (index: docs/design.md).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace monarch::mesh::process_detail {

/// How a process ended: exit code, or the signal that killed it.
struct ExitStatus {
  int code = -1;   ///< exit code when it exited; -1 when killed by a signal
  int signal = 0;  ///< the signal that killed it, or 0
  bool core = false;
  /// "exited with code 3", "killed by signal 9 (SIGKILL)", "killed by signal 11 (SIGSEGV), core
  /// dumped".
  std::string to_string() const;
};

struct ChildSpec {
  std::string program;            ///< path of the executable
  std::vector<std::string> args;  ///< argv[1..]
  std::vector<std::string> env;   ///< "KEY=VALUE" added to (and overriding) our environment
  /// More "KEY=VALUE", this child's own (its rank...): added after `env`; unlike `env`, not
  /// part of what selects its fork server.
  std::vector<std::string> own_env;
  /// Fork it from a fork server of this program, arguments and env (started on first use;
  /// fork_server.hpp, PH-7) instead of exec'ing it. A program that cannot serve forks (it exits
  /// before bootstrap(), or runs threads there) is exec'd instead, with one warning.
  bool fork_server = false;
};

class ProcessHost {
 public:
  /// stream: 1 stdout, 2 stderr. Runs on the reaper thread; must not block for long.
  using OnLine = std::function<void(int stream, std::string line)>;
  /// Runs on the reaper thread, once, after the last OnLine.
  using OnExit = std::function<void(const ExitStatus&)>;

  /// The process-wide host (its threads live until the process exits: PH-1).
  static ProcessHost& instance();

  /// Starts `spec` and returns its pid. Throws monarch::Error naming the program when fork or
  /// pipe fails; an exec failure shows up as an exit with code 127 and a stderr line.
  /// Any thread; the fork itself runs on the spawner thread.
  pid_t spawn(const ChildSpec& spec, OnLine on_line, OnExit on_exit);
  /// Sends `sig` to the child `pid` if it was not reaped yet (PH-2). Returns false otherwise.
  bool signal(pid_t pid, int sig);
  /// Children not yet reaped (fork servers included).
  size_t live() const;
  /// The pids of the live fork servers (tests).
  std::vector<pid_t> fork_servers() const;

  struct Impl;

 private:
  ProcessHost();
  std::unique_ptr<Impl> impl_;
};

}  // namespace monarch::mesh::process_detail
