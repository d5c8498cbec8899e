// `monarch lighthouse` (tools/monarch.cpp): a standalone ft::Lighthouse with an HTTP status page.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace monarch::tools {

struct LighthouseFlags {
  std::string listen;        ///< channel address of the lighthouse's Proc (--listen)
  std::string http;          ///< HOST:PORT of the HTTP server; empty: 127.0.0.1, any free port
  std::string secret_file;   ///< job secret (TCP channels and the kill endpoint); empty: env
  int64_t min_replicas = 0;  ///< 0: ft.min_replicas
  std::chrono::milliseconds join_timeout{0};       ///< 0: ft.quorum_join_timeout
  std::chrono::milliseconds heartbeat_timeout{0};  ///< 0: ft.heartbeat_timeout
  std::chrono::milliseconds recovery_wait{-1};     ///< Q-7; negative: the heartbeat timeout
};

/// Serves until SIGTERM or SIGINT, then returns 0. Prints "LISTENING <channel address>" and
/// "HTTP http://HOST:PORT/" on stdout once both serve. Throws on bad flags or a failed bind.
int run_lighthouse(const LighthouseFlags& flags);

}  // namespace monarch::tools
