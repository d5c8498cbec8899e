#include "monarch/config/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

extern char** environ;

namespace monarch::config {
namespace {

// User text quoted in an error, cut to its first 200 bytes: a 100 kB value (or a 5000-digit
// number in a file) would otherwise be echoed whole.
std::string clip(std::string_view text) {
  constexpr size_t kMax = 200;
  if (text.size() <= kMax) return std::string(text);
  return std::string(text.substr(0, kMax)) + "... (" + std::to_string(text.size()) + " bytes)";
}

// THE table. Every tunable of the project, every timeout in one place. Keep docs/config.md in step.
// Timeout order (checked by validate(), see kOrder below):
//   channel.ack_interval < mesh.heartbeat_interval < mesh.heartbeat_timeout
//   ft.collective_timeout < mesh.heartbeat_timeout < ft.step_timeout < mesh.spawn_timeout
//   ft.heartbeat_interval < ft.heartbeat_timeout < mesh.heartbeat_timeout
//   mesh.heartbeat_timeout < channel.delivery_timeout
const std::vector<KeyInfo> kKeys = {
    // channel
    {"channel.max_frame_bytes", Kind::Bytes, "64MiB",
     "largest message, bytes (sum of parts); larger sends throw at the sender"},
    {"channel.unix_socket_buffer", Kind::Bytes, "1MiB",
     "SO_SNDBUF/SO_RCVBUF of unix-socket connections (0: system default; capped by "
     "net.core.*mem_max)"},
    {"channel.ack_every", Kind::Int, "256", "the receiver acknowledges after this many messages"},
    {"channel.ack_interval", Kind::Duration, "5ms", "... or after this long, whichever first"},
    {"channel.reconnect_initial", Kind::Duration, "1ms", "first reconnect backoff; doubles"},
    {"channel.reconnect_max", Kind::Duration, "1s", "largest reconnect backoff"},
    {"channel.handshake_timeout", Kind::Duration, "5s",
     "a connection's hello/auth must finish within this"},
    {"channel.delivery_timeout", Kind::Duration, "30s",
     "a link that cannot deliver for this long closes; its messages return as DeliveryFailure"},
    // actor
    {"actor.workers", Kind::Int, "0",
     "worker threads per Proc scheduler (0: one per core; at most 256)"},
    {"actor.batch", Kind::Int, "64", "messages an actor runs per activation before yielding"},
    {"actor.stop_timeout", Kind::Duration, "5s", "how long Proc shutdown waits for its actors"},
    {"actor.spin_us", Kind::Int, "50",
     "an idle worker, or a thread blocked in Future::get, spins this many microseconds "
     "(yielding the CPU) before it sleeps; 0: sleep at once"},
    // mesh
    {"mesh.cast_fanout", Kind::Int, "16", "children per node of the cast tree"},
    {"mesh.heartbeat_interval", Kind::Duration, "250ms",
     "procs heartbeat to their owner this often"},
    {"mesh.heartbeat_timeout", Kind::Duration, "2s",
     "no heartbeat for this long: the proc is declared frozen (MeshFailure)"},
    {"mesh.spawn_timeout", Kind::Duration, "30s",
     "a spawned proc must report ready within this, else the spawn fails"},
    {"mesh.stop_timeout", Kind::Duration, "5s",
     "mesh stop/shutdown deadline; ranks not stopped by then are killed"},
    {"mesh.log_forwarding", Kind::Bool, "true", "stream procs' stdout/stderr to the client"},
    {"mesh.log_aggregate_window", Kind::Duration, "0ms",
     "collapse repeated log lines over this window (0: off)"},
    // ft
    {"ft.collective_timeout", Kind::Duration, "1s", "an allreduce that takes longer fails"},
    {"ft.step_timeout", Kind::Duration, "10s", "a training step (quorum + allreduce) deadline"},
    {"ft.progress_timeout", Kind::Duration, "60s",
     "a run in which no replica group commits a step for this long fails, naming what the "
     "lighthouse waits for (0: off)"},
    {"ft.quorum_join_timeout", Kind::Duration, "500ms",
     "how long the lighthouse waits for stragglers before forming a quorum"},
    {"ft.min_replicas", Kind::Int, "1", "a quorum needs at least this many replica groups"},
    {"ft.async_quorum", Kind::Bool, "true",
     "after an intact step, train on the last quorum's plan while the next quorum forms"},
    {"ft.quorum_every", Kind::Int, "8",
     "while the quorum is intact, ask the lighthouse only at steps that are multiples of this"},
    {"ft.heartbeat_interval", Kind::Duration, "50ms",
     "replica groups heartbeat the lighthouse this often"},
    {"ft.heartbeat_timeout", Kind::Duration, "300ms",
     "a group without a heartbeat for this long is left out of the next quorum, and its quorum's "
     "other members stop waiting for it in the allreduce (Q-9)"},
    // rdma (data plane, docs/data-plane.md)
    {"rdma.backend", Kind::String, "auto",
     "data-plane backend: auto (ucx if it starts, else channel, with a warning), ucx, channel"},
    {"rdma.timeout", Kind::Duration, "30s", "a read_into/write_from not complete by then fails"},
    {"rdma.chunk_bytes", Kind::Bytes, "4MiB",
     "channel backend: bytes per chunk message (at most: a smaller transfer is cut evenly over the "
     "streams)"},
    {"rdma.streams", Kind::Int, "2", "channel backend: parallel links per owner"},
    {"rdma.ack_every", Kind::Int, "1",
     "channel backend: links acknowledge after this many messages (chunks are sent from the "
     "buffers, which are held until acknowledged)"},
    {"rdma.listen", Kind::String, "",
     "channel address the data plane serves on (empty: a private abstract unix socket)"},
    {"rdma.ucx_tls", Kind::String, "",
     "ucx backend: transports UCX may use, as UCX_TLS (empty: UCX_TLS or UCX's choice)"},
    {"rdma.local_routes", Kind::Bool, "true",
     "same-host owners: shm (allocate()d buffers) and cma (reads) routes instead of the backend's"},
};

struct Order {
  std::string_view smaller, larger;
};
const Order kOrder[] = {
    {"channel.ack_interval", "mesh.heartbeat_interval"},
    {"mesh.heartbeat_interval", "mesh.heartbeat_timeout"},
    {"ft.collective_timeout", "mesh.heartbeat_timeout"},
    {"ft.heartbeat_interval", "ft.heartbeat_timeout"},
    {"ft.heartbeat_timeout", "mesh.heartbeat_timeout"},
    {"mesh.heartbeat_timeout", "ft.step_timeout"},
    {"ft.step_timeout", "mesh.spawn_timeout"},
    // Implied by the two pairs above, but stated so that a process mesh's own timeouts
    // (mesh::ProcTimeouts, which has no ft.step_timeout) are checked for it too.
    {"mesh.heartbeat_timeout", "mesh.spawn_timeout"},
    {"mesh.heartbeat_timeout", "channel.delivery_timeout"},
};

// The kind with its article, as messages name it: "a duration", "an integer".
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Duration:
      return "a duration";
    case Kind::Bytes:
      return "a size";
    case Kind::Int:
      return "an integer";
    case Kind::Bool:
      return "a boolean";
    case Kind::String:
      return "a string";
  }
  return "?";
}

const KeyInfo* find_key(std::string_view name) {
  for (const auto& k : kKeys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(std::string_view key, const std::string& source) {
  std::string msg = "config: unknown key '" + clip(key) + "'";
  if (!source.empty()) msg += " (from " + source + ")";
  const KeyInfo* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& k : kKeys) {
    size_t d = edit_distance(key, k.name);
    if (d < best_d) best_d = d, best = &k;
  }
  if (best != nullptr && best_d <= 4) msg += "; did you mean '" + std::string(best->name) + "'?";
  msg += " (keys are listed in docs/config.md)";
  return msg;
}

// MONARCH_* variables that are not settings: read by the channel (secrets), the config loader, the
// worker bootstrap, the launchers, tests and benchmarks. Names or prefixes (ending in '_').
constexpr std::string_view kNotSettings[] = {
    "MONARCH_SECRET", "MONARCH_SECRET_FILE", "MONARCH_CONFIG_FILE", "MONARCH_WORKER_",
    "MONARCH_RANK",   "MONARCH_WORLD_SIZE",  "MONARCH_POD_IP",      "MONARCH_AGENT_PROGRAM",
    "MONARCH_SLURM_", "MONARCH_TEST_",       "MONARCH_BENCH_",      "MONARCH_UPDATE_GOLDEN",
};

bool is_known_non_setting(std::string_view name) {
  for (std::string_view n : kNotSettings) {
    if (n.ends_with('_') ? name.starts_with(n) : name == n) return true;
  }
  return false;
}

// The key whose variable `name` most likely misspells (used for the error on an unknown variable
// inside a setting section and for the warning on a lookalike outside them), comparing against both
// the full variable name and the name without its section (MONARCH_SPAWN_TIMEOUT for
// mesh.spawn_timeout); nullptr when none is within 4 edits.
const KeyInfo* closest_setting(std::string_view name) {
  const KeyInfo* best = nullptr;
  size_t best_d = 5;
  for (const auto& k : kKeys) {
    std::string full = env_name(k.name);
    std::string bare = "MONARCH_" + full.substr(full.find('_', 8) + 1);
    size_t d = std::min(edit_distance(name, full), edit_distance(name, bare));
    if (d < best_d) best_d = d, best = &k;
  }
  return best;
}

// Warns once per process and variable (stderr: the config layer has no logger) about a MONARCH_*
// variable outside the setting sections that looks like a setting: it is ignored.
void warn_lookalike(std::string_view name) {
  if (is_known_non_setting(name)) return;
  // Worker procs inherit the client's environment, and the client has warned already.
  if (std::getenv("MONARCH_WORKER_OWNER") != nullptr) return;
  const KeyInfo* k = closest_setting(name);
  if (k == nullptr) return;
  static std::mutex mu;
  static std::set<std::string, std::less<>> warned;
  std::lock_guard lock(mu);
  if (!warned.emplace(name).second) return;
  std::fprintf(stderr,
               "monarch config: warning: environment variable %.*s is not a setting and is "
               "ignored; did you mean %s (%.*s)? (keys are listed in docs/config.md)\n",
               static_cast<int>(name.size()), name.data(), env_name(k->name).c_str(),
               static_cast<int>(k->name.size()), k->name.data());
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Splits "250ms" into 250 and "ms". Throws on a missing or out-of-range number.
std::pair<uint64_t, std::string> number_and_unit(std::string_view text, const char* what) {
  std::string t = trim(text);
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  if (ec == std::errc::result_out_of_range)
    throw ConfigError(std::string(what) + " '" + clip(t) + "' is too large");
  if (ec != std::errc() || p == t.data()) {
    throw ConfigError(std::string(what) + " '" + clip(t) +
                      "' does not start with a non-negative integer");
  }
  std::string unit = trim(std::string_view(p, static_cast<size_t>(t.data() + t.size() - p)));
  return {n, unit};
}

uint64_t checked_mul(uint64_t n, uint64_t f, std::string_view text, const char* what) {
  if (f != 0 && n > std::numeric_limits<int64_t>::max() / f) {
    throw ConfigError(std::string(what) + " '" + clip(text) + "' is too large");
  }
  return n * f;
}

}  // namespace

const std::vector<KeyInfo>& keys() {
  return kKeys;
}

std::string env_name(std::string_view key) {
  std::string out = "MONARCH_";
  for (char c : key) {
    out += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

std::chrono::milliseconds parse_duration(std::string_view text) {
  auto [n, unit] = number_and_unit(text, "duration");
  uint64_t f = 0;
  if (unit.empty() || unit == "ms") {
    f = 1;
  } else if (unit == "s") {
    f = 1000;
  } else if (unit == "m" || unit == "min") {
    f = 60'000;
  } else if (unit == "h") {
    f = 3'600'000;
  } else {
    throw ConfigError("duration '" + clip(trim(text)) + "' has unknown unit '" + clip(unit) +
                      "' (use ms, s, m or h)");
  }
  std::chrono::milliseconds d(static_cast<int64_t>(checked_mul(n, f, text, "duration")));
  if (d > kMaxDuration) {
    throw ConfigError("duration '" + clip(trim(text)) + "' is too large: at most " +
                      std::to_string(kMaxDuration.count() / 1000) + " s (about 115 days)");
  }
  return d;
}

uint64_t parse_bytes(std::string_view text) {
  auto [n, unit] = number_and_unit(text, "size");
  static const std::pair<std::string_view, uint64_t> kUnits[] = {
      {"", 1},      {"B", 1},         {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
      {"KB", 1000}, {"MB", 1000'000}, {"GB", 1000'000'000}};
  for (const auto& [u, f] : kUnits) {
    if (unit == u) return checked_mul(n, f, text, "size");
  }
  throw ConfigError("size '" + clip(trim(text)) + "' has unknown unit '" + clip(unit) +
                    "' (use B, KiB, MiB, GiB, KB, MB or GB)");
}

Config::Config() {
  for (const auto& k : kKeys) put(k.name, k.default_value, "default", false);
}

Config::Config(const Config& other) {
  std::lock_guard lock(other.mu_);
  values_ = other.values_;
}

Config& Config::operator=(const Config& other) {
  if (this == &other) return *this;
  std::scoped_lock lock(mu_, other.mu_);
  values_ = other.values_;
  return *this;
}

void Config::put(std::string_view key, std::string_view value, const std::string& source,
                 bool check) {
  const KeyInfo* k = find_key(key);
  if (k == nullptr) throw ConfigError(unknown_key_message(key, source == "runtime" ? "" : source));
  Entry e;
  e.source = source;
  std::string v = trim(value);
  try {
    switch (k->kind) {
      case Kind::Duration:
        e.number = parse_duration(v).count();
        // A bare number is milliseconds: say so wherever the value is shown (errors, dump()),
        // so "5" does not read as 5 s next to "250ms".
        if (number_and_unit(v, "duration").second.empty()) v += "ms";
        break;
      case Kind::Bytes:
        e.number = static_cast<int64_t>(parse_bytes(v));
        break;
      case Kind::Int: {
        int64_t n = 0;
        auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || p != v.data() + v.size() || n < 0) {
          throw ConfigError("'" + clip(v) + "' is not a non-negative integer");
        }
        e.number = n;
        break;
      }
      case Kind::Bool: {
        std::string l = v;
        for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (l == "true" || l == "1" || l == "yes" || l == "on") {
          e.number = 1;
        } else if (l == "false" || l == "0" || l == "no" || l == "off") {
          e.number = 0;
        } else {
          throw ConfigError("'" + clip(v) + "' is not a boolean (true/false)");
        }
        break;
      }
      case Kind::String:
        break;
    }
  } catch (const ConfigError& err) {
    throw ConfigError("config: bad value for '" + clip(key) + "' (" + kind_name(k->kind) +
                      (source == "default" ? std::string() : ", from " + source) +
                      "): " + err.what());
  }
  e.text = v;
  if (!check) {
    values_[std::string(key)] = std::move(e);
    return;
  }
  auto it = values_.find(key);
  Entry old = it->second;
  it->second = std::move(e);
  try {
    // validate() locks; this runs with mu_ held, so check the copy through a temporary Config.
    Config tmp;
    tmp.values_ = values_;
    tmp.validate();
  } catch (...) {
    it->second = std::move(old);
    throw;
  }
}

const Config::Entry& Config::entry(std::string_view key, Kind kind) const {
  const KeyInfo* k = find_key(key);
  if (k == nullptr) throw ConfigError(unknown_key_message(key, ""));
  if (k->kind != kind) {
    throw ConfigError("config: key '" + std::string(key) + "' is " + kind_name(k->kind) + ", not " +
                      kind_name(kind));
  }
  return values_.find(key)->second;
}

std::chrono::milliseconds Config::duration(std::string_view key) const {
  std::lock_guard lock(mu_);
  return std::chrono::milliseconds(entry(key, Kind::Duration).number);
}
uint64_t Config::bytes(std::string_view key) const {
  std::lock_guard lock(mu_);
  return static_cast<uint64_t>(entry(key, Kind::Bytes).number);
}
int64_t Config::integer(std::string_view key) const {
  std::lock_guard lock(mu_);
  return entry(key, Kind::Int).number;
}
bool Config::flag(std::string_view key) const {
  std::lock_guard lock(mu_);
  return entry(key, Kind::Bool).number != 0;
}
std::string Config::string(std::string_view key) const {
  std::lock_guard lock(mu_);
  return entry(key, Kind::String).text;
}

std::string Config::source(std::string_view key) const {
  std::lock_guard lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) throw ConfigError(unknown_key_message(key, ""));
  return it->second.source;
}

void Config::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  put(key, value, "runtime", true);
}

void Config::merge_json_text(std::string_view text, const std::string& source) {
  // One key given twice in the file: repeated in one object (the parser keeps the last value
  // silently), or given both dotted and nested ("actor.workers" and {"actor": {"workers": ..}}).
  // The parse callback sees every key: each gets its dotted path, and a path seen before is the
  // first repeat. `open` holds the path prefix of each open object (arrays hold no keys; their
  // values are refused below).
  std::vector<std::string> open;
  std::set<std::string> seen;
  std::string last_key, repeated;
  auto on_event = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open.push_back(open.empty() ? "" : open.back() + last_key + ".");
    } else if (ev == E::object_end && !open.empty()) {
      open.pop_back();
    } else if (ev == E::key && !open.empty() && parsed.is_string()) {
      last_key = parsed.get<std::string>();
      std::string path = open.back() + last_key;
      if (!seen.insert(path).second && repeated.empty()) repeated = std::move(path);
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e5000
    throw ConfigError("config: " + source + " is not valid JSON: " + clip(e.what()));
  }
  if (!repeated.empty()) {
    throw ConfigError("config: '" + clip(repeated) + "' is set twice in " + source + ": keep one");
  }
  if (!j.is_object()) throw ConfigError("config: " + source + " must hold a JSON object of keys");
  std::vector<std::pair<std::string, std::string>> flat;
  std::function<void(const nlohmann::json&, const std::string&)> walk =
      [&](const nlohmann::json& node, const std::string& prefix) {
        for (auto it = node.begin(); it != node.end(); ++it) {
          std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
          const auto& v = it.value();
          if (v.is_object()) {
            walk(v, key);
          } else if (v.is_string()) {
            flat.emplace_back(key, v.get<std::string>());
          } else if (v.is_boolean()) {
            flat.emplace_back(key, v.get<bool>() ? "true" : "false");
          } else if (v.is_number_integer() || v.is_number_unsigned()) {
            flat.emplace_back(key, v.dump());
          } else {
            throw ConfigError("config: bad value for '" + key + "' (from " + source +
                              "): expected a string, integer or boolean, got " + v.dump());
          }
        }
      };
  walk(j, "");
  std::lock_guard lock(mu_);
  auto saved = values_;
  try {
    for (const auto& [k, v] : flat) put(k, v, source, false);
    Config tmp;
    tmp.values_ = values_;
    tmp.validate();
  } catch (...) {
    values_ = std::move(saved);
    throw;
  }
}

void Config::merge_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError("config: config file " + path.string() + " is a directory, not a JSON file");
  }
  std::ifstream in(path);
  if (!in) {
    throw ConfigError("config: cannot read config file " + path.string() + ": " +
                      std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  merge_json_text(ss.str(), "file " + path.string());
}

void Config::merge_env(const char* const* envp) {
  if (envp == nullptr) envp = environ;
  static const char* kSections[] = {"MONARCH_CHANNEL_", "MONARCH_ACTOR_", "MONARCH_MESH_",
                                    "MONARCH_FT_", "MONARCH_RDMA_"};
  std::lock_guard lock(mu_);
  auto saved = values_;
  try {
    for (const char* const* e = envp; *e != nullptr; ++e) {
      std::string_view kv(*e);
      size_t eq = kv.find('=');
      if (eq == std::string_view::npos) continue;
      std::string_view name = kv.substr(0, eq);
      bool ours = false;
      for (const char* s : kSections) ours = ours || name.starts_with(s);
      if (!ours) {
        if (name.starts_with("MONARCH_")) warn_lookalike(name);
        continue;
      }
      const KeyInfo* key = nullptr;
      for (const auto& k : kKeys) {
        if (env_name(k.name) == name) key = &k;
      }
      if (key == nullptr) {
        const KeyInfo* best = closest_setting(name);
        throw ConfigError(
            "config: environment variable " + std::string(name) + " names no config key" +
            (best != nullptr ? "; did you mean " + env_name(best->name) + "?" : std::string()) +
            " (keys are listed in docs/config.md)");
      }
      put(key->name, kv.substr(eq + 1), "env " + std::string(name), false);
    }
    Config tmp;
    tmp.values_ = values_;
    tmp.validate();
  } catch (...) {
    values_ = std::move(saved);
    throw;
  }
}

Config Config::load(const std::optional<std::filesystem::path>& file, const char* const* envp) {
  Config c;
  if (file) {
    c.merge_file(*file);
  } else if (const char* f = std::getenv("MONARCH_CONFIG_FILE"); f != nullptr && *f != '\0') {
    c.merge_file(f);
  }
  c.merge_env(envp);
  return c;
}

void Config::validate() const {
  std::lock_guard lock(mu_);
  auto value = [&](std::string_view k) -> const Entry& { return values_.find(k)->second; };
  auto show = [&](std::string_view k) {
    const Entry& e = value(k);
    return std::string(k) + " = " + e.text + " (" + e.source + ")";
  };
  std::vector<TimeoutValue> timeouts;  // each key of the order table once
  for (const auto& o : kOrder) {
    for (std::string_view k : {o.smaller, o.larger}) {
      if (std::any_of(timeouts.begin(), timeouts.end(), [&](auto& t) { return t.key == k; })) {
        continue;
      }
      const Entry& e = value(k);
      timeouts.push_back({k, std::chrono::milliseconds(e.number), e.text + " (" + e.source + ")"});
    }
  }
  check_timeout_order(timeouts);
  if (value("channel.reconnect_initial").number > value("channel.reconnect_max").number) {
    throw ConfigError("config: " + show("channel.reconnect_initial") + " must not exceed " +
                      show("channel.reconnect_max"));
  }
  for (std::string_view k :
       {"channel.ack_every", "mesh.cast_fanout", "actor.batch", "channel.max_frame_bytes",
        "channel.ack_interval", "mesh.heartbeat_interval", "channel.handshake_timeout",
        "rdma.timeout", "rdma.chunk_bytes", "rdma.streams", "rdma.ack_every"}) {
    if (value(k).number == 0) throw ConfigError("config: " + show(k) + " must be greater than 0");
  }
  if (std::string_view b = value("rdma.backend").text;
      b != "auto" && b != "ucx" && b != "channel") {
    throw ConfigError("config: " + show("rdma.backend") + " must be auto, ucx or channel");
  }
  // ThreadPoolScheduler::kMaxWorkers (the actor layer refuses more; config does not depend on it).
  if (value("actor.workers").number > 256) {
    throw ConfigError("config: " + show("actor.workers") +
                      " must be at most 256 (0: one per core)");
  }
  if (value("actor.spin_us").number > 1000000) {
    throw ConfigError("config: " + show("actor.spin_us") + " must be at most 1000000 (1 s)");
  }
  if (value("mesh.cast_fanout").number < 2) {
    throw ConfigError("config: " + show("mesh.cast_fanout") + " must be at least 2");
  }
}

void check_timeout_order(const std::vector<TimeoutValue>& values) {
  auto find = [&](std::string_view k) -> const TimeoutValue* {
    for (const auto& v : values) {
      if (v.key == k) return &v;
    }
    return nullptr;
  };
  for (const auto& o : kOrder) {
    const TimeoutValue* a = find(o.smaller);
    const TimeoutValue* b = find(o.larger);
    if (a == nullptr || b == nullptr || a->value < b->value) continue;
    throw ConfigError("config: " + std::string(a->key) + " = " + a->shown + " must be less than " +
                      std::string(b->key) + " = " + b->shown + " (timeout order: docs/config.md)");
  }
}

std::string Config::dump() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& k : kKeys) {
    const Entry& e = values_.find(k.name)->second;
    out += std::string(k.name) + " = " + e.text + "  (" + e.source + ")\n";
  }
  return out;
}

Config& global() {
  // Constructed on first use; a bad layer throws here, and every later call retries and throws
  // again (the process should not run on a half-read configuration).
  static std::mutex mu;
  static std::unique_ptr<Config> cfg;
  std::lock_guard lock(mu);
  if (!cfg) cfg = std::make_unique<Config>(Config::load());
  return *cfg;
}

}  // namespace monarch::config
