// Lifecycle: the states an actor moves through.
//
//   Created --(scheduled)--> Initializing --(init ok)--> Idle <--> Processing
//   Idle/Processing --(stop/kill, or a failure)--> Stopping --(children stopped, cleanup)-->
//   Stopped (clean stop) | Failed (init threw, a send handler threw, or supervision escalated)
#pragma once

#include <cstdint>

namespace monarch {

enum class Lifecycle : uint8_t {
  Created,
  Initializing,
  Idle,
  Processing,
  Stopping,
  Stopped,
  Failed
};

constexpr const char* to_string(Lifecycle s) noexcept {
  switch (s) {
    case Lifecycle::Created:
      return "Created";
    case Lifecycle::Initializing:
      return "Initializing";
    case Lifecycle::Idle:
      return "Idle";
    case Lifecycle::Processing:
      return "Processing";
    case Lifecycle::Stopping:
      return "Stopping";
    case Lifecycle::Stopped:
      return "Stopped";
    case Lifecycle::Failed:
      return "Failed";
  }
  return "?";
}

}  // namespace monarch
