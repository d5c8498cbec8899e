// Test support: freezing a process for fault injection.
//
// SIGSTOP is asynchronous: kill() returns before the target's threads have stopped. The kernel
// hands the signal to one thread, which stops the others when it next runs; under CPU contention
// the other threads can go on for milliseconds meanwhile, long enough to answer a message sent
// after the kill(). A test that asserts what a frozen process cannot do freezes it with freeze().
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace monarch::testing {

/// Whether every thread of `pid` is stopped: state 'T' (or 't', traced) in
/// /proc/PID/task/*/stat. False when the process does not exist.
inline bool all_threads_stopped(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool stopped = true;
  bool any = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::FILE* f = std::fopen((dir + "/" + e->d_name + "/stat").c_str(), "r");
    if (f == nullptr) continue;  // the thread exited
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const std::string stat(buf, n);
    const auto close = stat.rfind(')');  // the name in parentheses may hold spaces
    const char state =
        close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
    any = true;
    if (state != 'T' && state != 't') stopped = false;
  }
  ::closedir(d);
  return any && stopped;
}

/// Sends SIGSTOP to `pid`, then polls until every one of its threads has stopped or `deadline`
/// passed; returns whether they all stopped. Called from the test's thread.
inline bool freeze(pid_t pid, std::chrono::milliseconds deadline = std::chrono::seconds(5)) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!all_threads_stopped(pid)) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a poll interval
  }
  return true;
}

}  // namespace monarch::testing
