// ActorId: the global name of one actor, `proc.name[uid]`, e.g. `local[0].counter[3]`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace monarch {

/// Identifies one actor for its whole life. `proc` names the owning Proc (e.g. "local[0]"),
/// `name` is the spawn name (not necessarily unique), `uid` is unique within the Proc and never
/// reused, so an id names exactly one actor incarnation. Cheap to copy; sendable in messages.
/// uid 0 is the Proc's client (code outside any actor, name "client"); uids with bit 63 set are
/// actors spawned from another process (Proc::spawn_remote picks them).
struct ActorId {
  std::string proc;
  std::string name;
  uint64_t uid = 0;

  /// "proc.name[uid]".
  std::string to_string() const { return proc + "." + name + "[" + std::to_string(uid) + "]"; }
  bool operator==(const ActorId&) const = default;
};

}  // namespace monarch

template <>
struct std::hash<monarch::ActorId> {
  size_t operator()(const monarch::ActorId& id) const noexcept {
    return std::hash<std::string>()(id.proc) ^ (id.uid * 0x9E3779B97F4A7C15ULL);
  }
};
