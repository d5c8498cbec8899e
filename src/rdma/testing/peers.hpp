// Test support: rdma_peer processes (an owner serving stdin commands, one-shot requesters).
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/pattern.hpp"
#include "testing/subprocess.hpp"

namespace monarch::rdma::testing {

using namespace std::chrono_literals;
using monarch::testing::Subprocess;

inline const bool kIgnoreSigpipe = [] {  // writing to a killed peer's stdin must not kill the test
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

/// An rdma_peer owner: a registered buffer filled with pattern(seed), served until destroyed.
struct Owner {
  static std::vector<std::string> owner_args(size_t size, uint64_t seed, const std::string& flags) {
    std::vector<std::string> a = {"owner", std::to_string(size), std::to_string(seed)};
    if (!flags.empty()) a.push_back(flags);
    return a;
  }
  Subprocess proc;
  RdmaHandle handle;
  /// flags: "" (registers a vector), or rdma_peer's owner FLAGS ("alloc", "nodump", ...).
  Owner(size_t size, uint64_t seed, const std::string& flags = "")
      : proc(MONARCH_RDMA_PEER, owner_args(size, seed, flags)) {
    auto l = proc.line(20s);
    while (l && !l->starts_with("HANDLE ")) l = proc.line(20s);  // skip log lines (spdlog: stdout)
    if (!l) throw std::runtime_error("owner peer did not start");
    handle = from_hex(l->substr(7));
  }
  std::string ask(const std::string& cmd) {
    proc.write_line(cmd);
    return proc.line(20s).value_or("<no answer>");
  }
  uint64_t sum(size_t off, size_t len) {
    auto l = ask("sum " + std::to_string(off) + " " + std::to_string(len));
    return std::stoull(l.substr(4));
  }
};

/// Runs a one-shot rdma_peer and returns its first line that is not a log line.
inline std::string peer_line(const std::vector<std::string>& args) {
  Subprocess p(MONARCH_RDMA_PEER, args);
  auto l = p.line(60s);
  while (l && l->starts_with("[")) l = p.line(60s);  // skip log lines (spdlog: stdout)
  return l.value_or("<no output>");
}

inline std::string sum_line(uint64_t v) {
  return "SUM " + std::to_string(v);
}

/// Sets an environment variable (inherited by peers started meanwhile); restores it on exit.
struct EnvFor {
  std::string name;
  std::optional<std::string> old;
  EnvFor(std::string n, const std::string& v) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    ::setenv(name.c_str(), v.c_str(), 1);
  }
  ~EnvFor() {
    if (old) {
      ::setenv(name.c_str(), old->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

}  // namespace monarch::rdma::testing
