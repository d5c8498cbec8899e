// What an owner's supervise() receives: ActorSupervisionEvent when a child actor fails,
// MeshFailure when procs of a mesh it owns fail. Both are plain values of the actor layer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "monarch/actor/actor_id.hpp"

namespace monarch {

/// One failure report. `caused_by` links to the child's event when this actor failed because it
/// did not handle a child's failure, so a chain reads from the outermost owner to the root cause.
struct ActorSupervisionEvent {
  ActorId actor;           ///< the actor that failed
  std::string actor_type;  ///< its type: the C++ name ("Counter"), or Actor::set_type_label's
  std::string cause;       ///< e.g. "send handler Counter::boom threw: std::runtime_error: x"
  std::shared_ptr<const ActorSupervisionEvent> caused_by;  ///< child event, or null

  /// Multi-line report of the whole chain, outermost first:
  ///   actor local[0].parent[1] (Parent) failed: unhandled failure of child ...
  ///     caused by: actor local[0].child[2] (Child) failed: ...
  std::string to_string() const {
    std::string out = "actor " + actor.to_string() + " (" + actor_type + ") failed: " + cause;
    for (auto* e = caused_by.get(); e != nullptr; e = e->caused_by.get()) {
      out += "\n  caused by: actor " + e->actor.to_string() + " (" + e->actor_type +
             ") failed: " + e->cause;
    }
    return out;
  }
};

/// One failure of one or more ranks of a mesh. Causes name what happened to the proc: its exit
/// ("exited with code 3", "killed by signal 9 (SIGKILL)"), a missed heartbeat ("no heartbeat for
/// 1500 ms"), or an actor's unhandled failure (the supervision report, with the exception's
/// message). Failures of procs of a ProcMesh (mesh layer, monarch/mesh/process.hpp), delivered to
/// the owner's Actor::supervise(const MeshFailure&) when the mesh was spawned from inside an actor.
///
/// Why it is defined here, in the actor layer, though the mesh layer produces it: it is the
/// argument of Actor::supervise(const MeshFailure&), and the actor layer delivers it
/// (detail::post_mesh_failure, src/actor/supervision.cpp) and, when supervise() returns false,
/// fails the actor with its to_string(), so the actor layer needs the complete type. Layers
/// include only downwards (actor must not include mesh), and the type itself depends on nothing
/// of the mesh. monarch/mesh/failure.hpp re-exports it as monarch::mesh::MeshFailure; include
/// that one from mesh code.
struct MeshFailure {
  std::string mesh;           ///< the mesh's name (SpawnOptions::name)
  std::vector<size_t> ranks;  ///< failed global ranks of the mesh
  std::string cause;

  /// "mesh trainers: ranks [2] failed: killed by signal 9 (SIGKILL)"
  std::string to_string() const {
    std::string r;
    for (size_t i = 0; i < ranks.size(); ++i) r += (i ? ", " : "") + std::to_string(ranks[i]);
    return "mesh " + mesh + ": rank" + (ranks.size() == 1 ? "" : "s") + " [" + r +
           "] failed: " + cause;
  }
};

}  // namespace monarch
