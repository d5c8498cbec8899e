#include "monarch/config/config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using monarch::config::Config;
using monarch::config::ConfigError;
using namespace std::chrono_literals;

namespace {

// Runs f and returns the ConfigError text (fails the test if nothing is thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return {};
}

struct Env {
  std::vector<std::string> vars;
  std::vector<const char*> ptrs;
  explicit Env(std::vector<std::string> v) : vars(std::move(v)) {
    for (auto& s : vars) ptrs.push_back(s.c_str());
    ptrs.push_back(nullptr);
  }
  const char* const* envp() const { return ptrs.data(); }
};

std::filesystem::path write_temp(const std::string& text) {
  auto p = std::filesystem::temp_directory_path() /
           ("monarch-config-test-" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(Config, DefaultsAreValidAndOrdered) {
  Config c;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.duration("channel.delivery_timeout"), 30s);
  EXPECT_EQ(c.bytes("channel.max_frame_bytes"), 64u << 20);
  EXPECT_EQ(c.integer("mesh.cast_fanout"), 16);
  EXPECT_TRUE(c.flag("mesh.log_forwarding"));
  EXPECT_LT(c.duration("ft.collective_timeout"), c.duration("mesh.heartbeat_timeout"));
  EXPECT_LT(c.duration("mesh.heartbeat_timeout"), c.duration("ft.step_timeout"));
  EXPECT_LT(c.duration("ft.step_timeout"), c.duration("mesh.spawn_timeout"));
  EXPECT_EQ(c.source("mesh.cast_fanout"), "default");
}

TEST(Config, LayersApplyInOrderDefaultsFileEnvRuntime) {
  auto path = write_temp(R"({"mesh": {"heartbeat_timeout": "3s", "cast_fanout": 8},
                             "channel.ack_every": 100})");
  Env env({"MONARCH_MESH_CAST_FANOUT=4", "PATH=/bin", "MONARCH_SECRET=not-a-config-key"});
  Config c = Config::load(path, env.envp());
  std::filesystem::remove(path);
  EXPECT_EQ(c.duration("mesh.heartbeat_timeout"), 3s);  // file
  EXPECT_EQ(c.source("mesh.heartbeat_timeout"), "file " + path.string());
  EXPECT_EQ(c.integer("channel.ack_every"), 100);  // file, flat form
  EXPECT_EQ(c.integer("mesh.cast_fanout"), 4);     // env beats file
  EXPECT_EQ(c.source("mesh.cast_fanout"), "env MONARCH_MESH_CAST_FANOUT");
  c.set("mesh.cast_fanout", "32");  // runtime beats env
  EXPECT_EQ(c.integer("mesh.cast_fanout"), 32);
  EXPECT_EQ(c.source("mesh.cast_fanout"), "runtime");
}

TEST(Config, UnknownKeysAreErrorsThatNameThem) {
  Config c;
  auto e = error_of([&] { c.set("mesh.heartbeat_timout", "1s"); });
  EXPECT_NE(e.find("'mesh.heartbeat_timout'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'mesh.heartbeat_timeout'"), std::string::npos) << e;

  e = error_of([&] { c.merge_json_text(R"({"mesh": {"fanout": 3}})", "file x.json"); });
  EXPECT_NE(e.find("'mesh.fanout'"), std::string::npos) << e;
  EXPECT_NE(e.find("file x.json"), std::string::npos) << e;

  Env env({"MONARCH_MESH_HEARTBEAT_TIMOUT=1s"});
  e = error_of([&] { c.merge_env(env.envp()); });
  EXPECT_NE(e.find("MONARCH_MESH_HEARTBEAT_TIMOUT"), std::string::npos) << e;
  EXPECT_NE(e.find("names no config key"), std::string::npos) << e;
  EXPECT_EQ(c.integer("mesh.cast_fanout"), 16);  // failed layers change nothing

  e = error_of([&] { (void)c.duration("no.such.key"); });
  EXPECT_NE(e.find("'no.such.key'"), std::string::npos) << e;
}

// A MONARCH_* variable outside the setting sections that looks like a setting is ignored with one
// warning naming the closest key; the variables that are not settings are ignored quietly.
TEST(Config, LookalikeVariablesOutsideTheSectionsWarnOnceNamingTheClosestKey) {
  Config c;
  Env env({"MONARCH_SPAWN_TIMEOUT=1s", "MONARCH_SECRET=s3cret", "MONARCH_WORKER_RANK=3",
           "MONARCH_RANK=0", "MONARCH_SLURM_DIR=/tmp/x", "MONARCH_NOTHING_LIKE_A_SETTING=1",
           "OTHER_MESH_SPAWN_TIMEOUT=1s"});
  testing::internal::CaptureStderr();
  c.merge_env(env.envp());
  c.merge_env(env.envp());  // warned once per process and variable, not per load
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("MONARCH_SPAWN_TIMEOUT is not a setting"), std::string::npos) << err;
  EXPECT_NE(err.find("did you mean MONARCH_MESH_SPAWN_TIMEOUT (mesh.spawn_timeout)"),
            std::string::npos)
      << err;
  size_t warnings = 0;
  for (size_t at = err.find("is not a setting"); at != std::string::npos;
       at = err.find("is not a setting", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << err;
  for (const char* quiet : {"MONARCH_SECRET", "MONARCH_WORKER_RANK",
                            "MONARCH_RANK=", "MONARCH_SLURM_DIR", "MONARCH_NOTHING", "OTHER_"}) {
    EXPECT_EQ(err.find(quiet), std::string::npos) << quiet << " warned: " << err;
  }
  EXPECT_EQ(c.duration("mesh.spawn_timeout"), Config().duration("mesh.spawn_timeout"));
}

TEST(Config, BadValuesAreErrorsThatNameKeyAndSource) {
  Config c;
  auto e = error_of([&] { c.set("mesh.heartbeat_timeout", "soon"); });
  EXPECT_NE(e.find("'mesh.heartbeat_timeout'"), std::string::npos) << e;
  EXPECT_NE(e.find("soon"), std::string::npos) << e;
  e = error_of([&] { c.set("mesh.heartbeat_timeout", "2 fortnights"); });
  EXPECT_NE(e.find("unknown unit"), std::string::npos) << e;
  e = error_of([&] { c.set("mesh.cast_fanout", "-3"); });
  EXPECT_NE(e.find("'mesh.cast_fanout'"), std::string::npos) << e;
  e = error_of([&] { c.set("mesh.log_forwarding", "maybe"); });
  EXPECT_NE(e.find("boolean"), std::string::npos) << e;
  e = error_of([&] { c.set("channel.max_frame_bytes", "99999999999999999999"); });
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  e = error_of([&] { c.set("channel.max_frame_bytes", "1000000000000GiB"); });
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  Env env({"MONARCH_CHANNEL_ACK_EVERY=lots"});
  e = error_of([&] { c.merge_env(env.envp()); });
  EXPECT_NE(e.find("env MONARCH_CHANNEL_ACK_EVERY"), std::string::npos) << e;
  e = error_of([&] { c.merge_json_text("{not json", "file bad.json"); });
  EXPECT_NE(e.find("bad.json is not valid JSON"), std::string::npos) << e;
  // Both forms of one key in one file: which one wins would depend on the order.
  e = error_of([&] {
    c.merge_json_text(R"({"actor.workers": 2, "actor": {"workers": 3}})", "file twice.json");
  });
  EXPECT_NE(e.find("'actor.workers' is set twice in file twice.json"), std::string::npos) << e;
  EXPECT_EQ(c.source("actor.workers"), "default");  // rejected whole
  // The same spelling twice, at the top or nested: JSON parsers keep the last one silently.
  e = error_of(
      [&] { c.merge_json_text(R"({"actor.workers": 2, "actor.workers": 3})", "file same.json"); });
  EXPECT_NE(e.find("'actor.workers' is set twice in file same.json"), std::string::npos) << e;
  e = error_of([&] {
    c.merge_json_text(R"({"mesh": {"cast_fanout": 2}, "actor": {"spin_us": 1, "spin_us": 2}})",
                      "file nested.json");
  });
  EXPECT_NE(e.find("'actor.spin_us' is set twice in file nested.json"), std::string::npos) << e;
  EXPECT_EQ(c.source("actor.spin_us"), "default");
  // One name in two sibling objects is two keys.
  c.merge_json_text(
      R"({"mesh": {"heartbeat_timeout": "3s"}, "ft": {"heartbeat_timeout": "400ms"}})",
      "file ok.json");
  EXPECT_EQ(c.duration("mesh.heartbeat_timeout"), 3s);
  EXPECT_EQ(c.duration("ft.heartbeat_timeout"), 400ms);
  e = error_of([&] { c.merge_json_text(R"({"mesh.cast_fanout": 1.5})", "file f.json"); });
  EXPECT_NE(e.find("'mesh.cast_fanout'"), std::string::npos) << e;
  e = error_of([&] { c.set("actor.spin_us", "2000000"); });
  EXPECT_NE(e.find("actor.spin_us = 2000000"), std::string::npos) << e;
  EXPECT_NE(e.find("at most 1000000"), std::string::npos) << e;
  e = error_of([&] { c.merge_file("/nonexistent/monarch.json"); });
  EXPECT_NE(e.find("/nonexistent/monarch.json"), std::string::npos) << e;
  // A directory read as "not valid JSON ... unexpected end of input".
  e = error_of([&] { c.merge_file(::testing::TempDir()); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  // Past the scheduler's 256 the actor layer refused nothing and looped once per worker asked.
  e = error_of([&] { c.set("actor.workers", "99999999999"); });
  EXPECT_NE(e.find("actor.workers = 99999999999 (runtime) must be at most 256"), std::string::npos)
      << e;
  c.set("actor.workers", "256");
  // A number no integer holds is nlohmann's out_of_range, not a parse_error: it said neither
  // "config" nor the file. Quoted user text is cut to 200 bytes.
  e = error_of([&] {
    c.merge_json_text("{\"actor.workers\": " + std::string(5000, '9') + "}", "file big.json");
  });
  EXPECT_NE(e.find("config: file big.json is not valid JSON"), std::string::npos) << e;
  EXPECT_LT(e.size(), 400u) << e;
  e = error_of([&] { c.set("actor.workers", std::string(100000, 'x')); });
  EXPECT_NE(e.find("... (100000 bytes)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 400u) << e;
  e = error_of([&] { c.set("mesh.spawn_timeout", "5" + std::string(100000, 'q')); });
  EXPECT_NE(e.find("... (100000 bytes)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 800u) << e;
  e = error_of([&] { c.set("actor.workers", "abc"); });
  EXPECT_NE(e.find("(an integer"), std::string::npos) << e;
}

TEST(Config, TimeoutOrderIsEnforcedAndNamesBothKeys) {
  Config c;
  auto e = error_of([&] { c.set("mesh.heartbeat_timeout", "20s"); });  // > ft.step_timeout (10s)
  EXPECT_NE(e.find("mesh.heartbeat_timeout = 20s (runtime)"), std::string::npos) << e;
  EXPECT_NE(e.find("ft.step_timeout = 10s (default)"), std::string::npos) << e;
  EXPECT_EQ(c.duration("mesh.heartbeat_timeout"), 2s);  // rejected: old value kept
  // Raising the larger bound first makes the same change legal.
  c.set("mesh.spawn_timeout", "60s");
  c.set("ft.step_timeout", "40s");
  c.set("mesh.heartbeat_timeout", "20s");
  EXPECT_EQ(c.duration("mesh.heartbeat_timeout"), 20s);
  e = error_of([&] { c.set("mesh.cast_fanout", "1"); });
  EXPECT_NE(e.find("at least 2"), std::string::npos) << e;
  e = error_of([&] { c.set("channel.reconnect_initial", "5s"); });
  EXPECT_NE(e.find("channel.reconnect_max"), std::string::npos) << e;
  // A bare number is milliseconds, and the error says so: "= 5" read as 5 s beside "250ms".
  e = error_of([&] { c.set("mesh.heartbeat_timeout", "5"); });
  EXPECT_NE(e.find("mesh.heartbeat_timeout = 5ms (runtime)"), std::string::npos) << e;
}

TEST(Config, ValueSyntax) {
  using monarch::config::parse_bytes;
  using monarch::config::parse_duration;
  EXPECT_EQ(parse_duration("250"), 250ms);
  EXPECT_EQ(parse_duration(" 250ms "), 250ms);
  EXPECT_EQ(parse_duration("2s"), 2000ms);
  EXPECT_EQ(parse_duration("1m"), 60000ms);
  EXPECT_EQ(parse_duration("1h"), 3600000ms);
  EXPECT_EQ(parse_bytes("64KiB"), 65536u);
  EXPECT_EQ(parse_bytes("1MB"), 1000000u);
  EXPECT_THROW(parse_duration(""), ConfigError);
  EXPECT_THROW(parse_duration("ms"), ConfigError);
  // A deadline of now + this would overflow the clock and fire at once (it did, for 99999999999h).
  EXPECT_EQ(parse_duration("10000000s"), monarch::config::kMaxDuration);
  EXPECT_THROW(parse_duration("10000001s"), ConfigError);
  EXPECT_THROW(parse_duration("99999999999h"), ConfigError);
  EXPECT_THROW(parse_bytes("12 parsecs"), ConfigError);
  EXPECT_EQ(monarch::config::env_name("mesh.heartbeat_timeout"), "MONARCH_MESH_HEARTBEAT_TIMEOUT");
}

TEST(Config, EveryKeyHasAnEnvVariableAndDocLine) {
  Config c;
  for (const auto& k : monarch::config::keys()) {
    EXPECT_FALSE(k.doc.empty()) << k.name;
    Env env({monarch::config::env_name(k.name) + "=" + std::string(k.default_value)});
    EXPECT_NO_THROW(c.merge_env(env.envp())) << k.name;
    EXPECT_EQ(c.source(k.name), "env " + monarch::config::env_name(k.name));
  }
  EXPECT_NE(c.dump().find("mesh.cast_fanout = 16"), std::string::npos);
}

TEST(Config, DocsListEveryKeyWithItsDefault) {
  std::ifstream in(MONARCH_CONFIG_DOC);
  ASSERT_TRUE(in) << MONARCH_CONFIG_DOC;
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& k : monarch::config::keys()) {
    std::string row = "| " + std::string(k.name) + " | ";
    auto at = doc.find(row);
    ASSERT_NE(at, std::string::npos) << k.name << " is missing from docs/config.md";
    auto line = doc.substr(at, doc.find('\n', at) - at);
    EXPECT_NE(line.find("| " + std::string(k.default_value) + " |"), std::string::npos)
        << "docs/config.md gives another default for " << k.name << ": " << line;
  }
}

TEST(Config, FileNamedByMonarchConfigFile) {
  auto path = write_temp(R"({"mesh.cast_fanout": 9})");
  ::setenv("MONARCH_CONFIG_FILE", path.c_str(), 1);
  Env env({});
  Config c = Config::load(std::nullopt, env.envp());
  ::unsetenv("MONARCH_CONFIG_FILE");
  std::filesystem::remove(path);
  EXPECT_EQ(c.integer("mesh.cast_fanout"), 9);
  EXPECT_EQ(c.source("mesh.cast_fanout"), "file " + path.string());
}
