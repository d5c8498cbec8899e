// Test helpers for process meshes: collecting MeshFailures and waiting for processes to exit.
#pragma once

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "monarch/actor/supervision.hpp"

namespace monarch::testing {

/// True while `pid` exists and is neither a zombie nor dead (reads /proc/PID/stat).
inline bool process_alive(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' &&
         line[close + 2] != 'X';
}

/// Waits on a pidfd per process (readable once it has exited, child of ours or not) until every
/// one has exited or `deadline` passed; returns whether all exited.
inline bool all_dead(const std::vector<int>& pids, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  for (int p : pids) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, p, 0));
    if (fd < 0) {
      if (errno == ESRCH) continue;  // already gone
      return !process_alive(p);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    pollfd pfd{fd, POLLIN, 0};
    int n = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    ::close(fd);
    if (n != 1) return false;
  }
  return true;
}

/// Collects MeshFailures from any thread; tests wait on them with a deadline.
struct FailureLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<MeshFailure> got;

  void add(const MeshFailure& f) {
    std::lock_guard lock(mu);
    got.push_back(f);
    cv.notify_all();
  }
  /// A failure handler that records and handles (returns true).
  std::function<bool(const MeshFailure&)> handler() {
    return [this](const MeshFailure& f) {
      add(f);
      return true;
    };
  }
  /// Whether `n` failures arrived within `deadline`.
  bool wait(size_t n, std::chrono::milliseconds deadline = std::chrono::seconds(15)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, deadline, [&] { return got.size() >= n; });
  }
  /// The first failure; throws if none arrives within `deadline`.
  MeshFailure wait_one(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    if (!wait(1, deadline)) throw std::runtime_error("no MeshFailure within deadline");
    std::lock_guard lock(mu);
    return got.front();
  }
  std::vector<MeshFailure> snapshot() {
    std::lock_guard lock(mu);
    return got;
  }
};

}  // namespace monarch::testing
