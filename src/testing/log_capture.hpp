// Test support: what this process logs through spdlog's default logger, with each line's level.
// A test that uses it links the compiled spdlog (PkgConfig::SPDLOG), the one the runtime logs
// through: a header-only copy has a registry, and so a default logger, of its own.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#ifndef SPDLOG_COMPILED_LIB
#error "testing/log_capture.hpp: link the test with PkgConfig::SPDLOG (see the file comment)"
#endif

namespace monarch::testing {

struct LogCapture : spdlog::sinks::base_sink<std::mutex> {
  struct Line {
    spdlog::level::level_enum level;
    std::string text;
  };
  /// Adds a capture to the default logger. Call it before any thread logs (the logger's sink
  /// list is not guarded), e.g. from main() or a namespace-scope initialiser.
  static std::shared_ptr<LogCapture> install() {
    auto c = std::make_shared<LogCapture>();
    spdlog::default_logger()->sinks().push_back(c);
    return c;
  }
  /// Waits up to `d` until a line containing every one of `parts` was logged; returns it.
  std::optional<Line> wait_for(const std::vector<std::string>& parts, std::chrono::milliseconds d) {
    std::unique_lock lock(mutex_);
    std::optional<Line> found;
    cv_.wait_for(lock, d, [&] {
      for (const auto& l : lines_) {
        if (contains_all(l.text, parts)) found = l;
      }
      return found.has_value();
    });
    return found;
  }
  /// The lines logged so far that contain every one of `parts`.
  std::vector<Line> matching(const std::vector<std::string>& parts) {
    std::lock_guard lock(mutex_);
    std::vector<Line> out;
    for (const auto& l : lines_) {
      if (contains_all(l.text, parts)) out.push_back(l);
    }
    return out;
  }
  /// The warnings and errors logged since the last take(); forgets every line.
  std::vector<std::string> take_warnings() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (auto& l : lines_) {
      if (l.level >= spdlog::level::warn) out.push_back(std::move(l.text));
    }
    lines_.clear();
    return out;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& m) override {
    lines_.push_back(Line{m.level, std::string(m.payload.data(), m.payload.size())});
    cv_.notify_all();
  }
  void flush_() override {}

 private:
  static bool contains_all(const std::string& text, const std::vector<std::string>& parts) {
    for (const auto& p : parts) {
      if (text.find(p) == std::string::npos) return false;
    }
    return true;
  }
  std::condition_variable_any cv_;
  std::vector<Line> lines_;
};

}  // namespace monarch::testing
