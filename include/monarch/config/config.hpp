// Configuration: every tunable setting of monarch-cpp, with its layers.
//
//   defaults  <  config file  <  environment (MONARCH_*)  <  runtime overrides
//
//   auto& cfg = monarch::config::global();                  // loaded once, on first use
//   auto hb = cfg.duration("mesh.heartbeat_timeout");       // std::chrono::milliseconds
//   cfg.set("mesh.heartbeat_timeout", "500ms");             // runtime override (validated)
//
// Keys are "section.name" (sections: channel, actor, mesh, ft, rdma). The table of keys, with
// types, defaults and meaning, lives in src/config/config.cpp and is printed by docs/config.md;
// every timeout of the project is in that one table.
//
// Config file: JSON, named by $MONARCH_CONFIG_FILE (or passed to Config::load), either flat
// ({"mesh.heartbeat_timeout": "2s"}) or nested ({"mesh": {"heartbeat_timeout": "2s"}}).
// Environment: key "mesh.heartbeat_timeout" is $MONARCH_MESH_HEARTBEAT_TIMEOUT. A variable under a
// section prefix (MONARCH_CHANNEL_, MONARCH_ACTOR_, MONARCH_MESH_, MONARCH_FT_, MONARCH_RDMA_) that
// names no key is an error; other MONARCH_* variables (MONARCH_SECRET, launcher variables) are not
// config keys.
//
// Value syntax: durations "250ms", "2s", "1m", "1h" or a bare integer of milliseconds (JSON numbers
// too); sizes "4096", "64KiB", "64MiB", "1GiB" (bytes); integers; booleans true/false/1/0/yes/no;
// strings as is.
//
// Errors: ConfigError, whose message names the key (and the layer it came from: file path or
// environment variable) and what was wrong: unknown key (with the closest known key), bad value,
// or a violated ordering between timeouts (see Config::validate).
//
// Thread safety: all members may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/error.hpp"

namespace monarch::config {

/// A bad setting: an unknown key, a value that does not parse, a timeout out of order. The message
/// names the key, the value and where it came from (file, environment variable, code).
/// A ConfigError is a UsageError (bad input from the user) with its own code, Config.
class ConfigError : public monarch::UsageError {
 public:
  explicit ConfigError(const std::string& message)
      : monarch::UsageError(ErrorCode::Config, message) {}
};

enum class Kind : uint8_t { Duration, Bytes, Int, Bool, String };

/// One row of the key table.
struct KeyInfo {
  std::string_view name;  ///< "mesh.heartbeat_timeout"
  Kind kind;
  std::string_view default_value;  ///< in value syntax, e.g. "2s"
  std::string_view doc;            ///< one line: what it controls, units
};

/// Every key, in documentation order.
const std::vector<KeyInfo>& keys();

/// "MONARCH_MESH_HEARTBEAT_TIMEOUT" for "mesh.heartbeat_timeout".
std::string env_name(std::string_view key);

class Config {
 public:
  /// Defaults only.
  Config();
  Config(const Config& other);
  Config& operator=(const Config& other);

  /// Defaults, then `file` (if given, else $MONARCH_CONFIG_FILE if set), then the environment
  /// `envp` (null-terminated "NAME=value" array; nullptr = this process's environ), then
  /// validate(). Throws ConfigError naming the key and source on any bad layer.
  static Config load(const std::optional<std::filesystem::path>& file = std::nullopt,
                     const char* const* envp = nullptr);

  /// Layer operations (each validates the values it reads, and the timeout order afterwards).
  void merge_file(const std::filesystem::path& path);
  void merge_json_text(std::string_view json, const std::string& source);
  void merge_env(const char* const* envp);
  /// Runtime override. Throws ConfigError for an unknown key, a bad value, or a broken ordering
  /// (the previous value is kept then).
  void set(std::string_view key, std::string_view value);

  /// Typed reads. Throw ConfigError for an unknown key or a key of another kind.
  std::chrono::milliseconds duration(std::string_view key) const;
  uint64_t bytes(std::string_view key) const;
  int64_t integer(std::string_view key) const;
  bool flag(std::string_view key) const;
  std::string string(std::string_view key) const;

  /// Where the effective value came from: "default", "file PATH", "env NAME" or "runtime".
  std::string source(std::string_view key) const;

  /// Checks the documented order of timeouts (docs/config.md), e.g.
  ///   ft.collective_timeout < mesh.heartbeat_timeout < ft.step_timeout < mesh.spawn_timeout,
  /// and that each key's value is in range. Throws ConfigError naming both keys and values.
  void validate() const;

  /// "key = value  (source)" lines, in table order.
  std::string dump() const;

 private:
  struct Entry {
    std::string text;  // normalised value text
    int64_t number = 0;
    std::string source = "default";
  };
  void put(std::string_view key, std::string_view value, const std::string& source, bool check);
  const Entry& entry(std::string_view key, Kind kind) const;

  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> values_;
};

/// The process-wide configuration, loaded with Config::load() on first use. A bad file or
/// environment throws ConfigError from this first call (and from every later one).
Config& global();

/// One timeout, as check_timeout_order() sees it: a key of the table, its value, how to show it.
struct TimeoutValue {
  std::string_view key;               ///< "mesh.heartbeat_timeout"
  std::chrono::milliseconds value{};  ///< the value checked
  std::string shown{};                ///< how the message shows it: "2s (env MONARCH_MESH_...)"
};

/// THE timeout-order rule, in one place (docs/config.md, "Timeouts, in order"): for every ordered
/// pair of keys in the rule table (e.g. mesh.heartbeat_interval < mesh.heartbeat_timeout) whose two
/// keys are both in `values`, the first must be strictly less than the second. Pairs with a key not
/// in `values` are skipped. Config::validate() checks the whole table through it, and
/// mesh::ProcTimeouts::validate() checks a process mesh's own timeouts through it.
/// Throws ConfigError: "KEY = SHOWN must be less than KEY2 = SHOWN2 (timeout order: ...)".
void check_timeout_order(const std::vector<TimeoutValue>& values);

/// The longest duration any setting or timeout takes: 10^7 s (about 115 days). Deadlines are
/// computed as now + timeout; a longer one would overflow the clock and fire at once.
inline constexpr std::chrono::milliseconds kMaxDuration{10'000'000'000};

/// Parses a duration ("250ms", "2s", "1m", "1h", or bare milliseconds). Throws ConfigError, also
/// above kMaxDuration.
std::chrono::milliseconds parse_duration(std::string_view text);
/// Parses a size in bytes ("4096", "64KiB", "64MiB", "1GiB", "1KB"). Throws ConfigError.
uint64_t parse_bytes(std::string_view text);

}  // namespace monarch::config
