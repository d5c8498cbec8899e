// Every timeout of the process layer, in one place. Defaults come from the config layer
// (docs/config.md: defaults < file < MONARCH_MESH_* env < runtime), read when the struct is
// constructed; setting a field in code is the runtime override. Keys: mesh.heartbeat_interval,
// mesh.heartbeat_timeout, mesh.spawn_timeout, mesh.stop_timeout, mesh.log_aggregate_window.
//
// Order (docs/config.md, "Timeouts, in order"; docs/design.md, "Timeouts"): heartbeat_interval <
// heartbeat_timeout < spawn_timeout, checked by the config layer's one rule
// (config::check_timeout_order), and a stop never waits longer than stop_timeout before it kills.
// validate() enforces it.
#pragma once

#include <chrono>
#include <string>

#include "monarch/actor/errors.hpp"
#include "monarch/config/config.hpp"

namespace monarch::mesh {

struct ProcTimeouts {
  using ms = std::chrono::milliseconds;
  /// A worker proc heartbeats its owner this often (ms).
  ms heartbeat_interval = config::global().duration("mesh.heartbeat_interval");
  /// No heartbeat for this long: the proc is frozen (or its link is gone). The owner declares it
  /// failed and kills it; the worker, unable to reach its owner for this long, exits (ms).
  ms heartbeat_timeout = config::global().duration("mesh.heartbeat_timeout");
  /// From spawn until every proc reported ready (ms). Also bounds calls to a host agent.
  ms spawn_timeout = config::global().duration("mesh.spawn_timeout");
  /// stop(): how long procs get to exit after the stop request before they are killed (ms).
  ms stop_timeout = config::global().duration("mesh.stop_timeout");
  /// Log aggregation: identical lines from several procs within this window print once with the
  /// ranks that wrote them (ms). 0: every line prints at once.
  ms log_window = config::global().duration("mesh.log_aggregate_window");

  /// Throws config::ConfigError (a UsageError) naming the offending key when a value is out of
  /// range or out of order. The order is the config layer's one rule,
  /// config::check_timeout_order(): heartbeat_interval < heartbeat_timeout < spawn_timeout.
  void validate() const {
    auto fail = [](const std::string& why) { throw config::ConfigError("ProcTimeouts: " + why); };
    if (heartbeat_interval.count() <= 0) fail("heartbeat_interval must be > 0 ms");
    for (auto [v, field] : {std::pair{heartbeat_interval, "heartbeat_interval"},
                            {heartbeat_timeout, "heartbeat_timeout"},
                            {spawn_timeout, "spawn_timeout"},
                            {stop_timeout, "stop_timeout"},
                            {log_window, "log_window"}}) {
      if (v > config::kMaxDuration) {
        fail(std::string(field) + " = " + std::to_string(v.count()) + " ms is above " +
             std::to_string(config::kMaxDuration.count()) + " ms (config::kMaxDuration)");
      }
    }
    auto shown = [](ms v, const char* field) {
      return std::to_string(v.count()) + "ms (ProcTimeouts::" + field + ")";
    };
    config::check_timeout_order({
        {"mesh.heartbeat_interval", heartbeat_interval,
         shown(heartbeat_interval, "heartbeat_interval")},
        {"mesh.heartbeat_timeout", heartbeat_timeout,
         shown(heartbeat_timeout, "heartbeat_timeout")},
        {"mesh.spawn_timeout", spawn_timeout, shown(spawn_timeout, "spawn_timeout")},
    });
    if (stop_timeout.count() <= 0) fail("stop_timeout must be > 0 ms");
    if (log_window.count() < 0) fail("log_window must be >= 0 ms");
  }
};

}  // namespace monarch::mesh
