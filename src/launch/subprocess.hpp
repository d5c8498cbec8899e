// The launchers' one way to run a command (sbatch, squeue, scancel, kubectl) and collect what it
// printed. Private to monarch_launch (tests include it through src/ on their include path).
//
// The child gets the argv (argv[0] searched on PATH), our environment plus CommandOptions::env,
// stdin from CommandOptions::input (or /dev/null), and pipes for stdout and stderr, which are read
// while it runs (so output larger than a pipe does not block it). At the deadline the child is
// killed with SIGKILL and reaped. The call blocks the calling thread; SIGPIPE is blocked on that
// thread while it feeds the child's stdin, so a child that exits without reading does not kill us.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace monarch::launch::detail {

struct CommandOptions {
  /// Written to the child's stdin through a pipe, which is closed afterwards (an empty string:
  /// closed at once). nullopt: stdin is /dev/null.
  std::optional<std::string> input{};
  /// "KEY=VALUE" entries added to our environment for the child; they replace our value of KEY.
  std::vector<std::string> env{};
  /// From the start until the child is killed.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// Why a command did not run to its end.
enum class CommandFailure {
  none,     ///< it ran and exited (any status)
  pipe,     ///< a pipe for its stdin/stdout/stderr could not be made (CommandResult::error)
  spawn,    ///< posix_spawnp failed, e.g. no such program (CommandResult::error)
  timeout,  ///< it ran past CommandOptions::timeout and was killed; out/err hold what it wrote
};

struct CommandResult {
  int status = -1;  ///< exit code; 128 + signal when a signal ended it; -1 unless failure is none
  std::string out;  ///< everything it wrote to stdout
  std::string err;  ///< everything it wrote to stderr
  CommandFailure failure = CommandFailure::none;
  int error = 0;  ///< errno of a pipe or spawn failure, else 0
};

/// argv joined with single spaces (as the error messages quote a command).
std::string join_command(const std::vector<std::string>& argv);

/// Runs the command and reports every outcome in the result; throws only UsageError (empty argv).
CommandResult try_run_command(const std::vector<std::string>& argv, const CommandOptions& options);

/// try_run_command, but a command that did not run to its end throws monarch::Error naming it:
/// "CMD: pipe failed", "CMD: cannot start PROG: <strerror>", "CMD: no answer within N ms
/// (killed)" (CMD = join_command(argv)). A non-zero exit status is not an error: see status.
CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options);

}  // namespace monarch::launch::detail
