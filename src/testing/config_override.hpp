// Test helper: sets an integer key of config::global() for one scope, then puts the old value back
// (also when an assertion ends the test early).
#pragma once

#include <string>
#include <utility>

#include "monarch/config/config.hpp"

namespace monarch::testing {

class IntConfigOverride {
 public:
  /// Throws config::ConfigError for an unknown or non-integer key, or a rejected value.
  IntConfigOverride(std::string key, const std::string& value)
      : key_(std::move(key)), old_(std::to_string(config::global().integer(key_))) {
    config::global().set(key_, value);
  }
  ~IntConfigOverride() { config::global().set(key_, old_); }
  IntConfigOverride(const IntConfigOverride&) = delete;
  IntConfigOverride& operator=(const IntConfigOverride&) = delete;

 private:
  std::string key_;
  std::string old_;
};

}  // namespace monarch::testing
