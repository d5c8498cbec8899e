// MeshFailure: what the owner of a ProcMesh receives when some of its procs fail.
#pragma once

#include <string>
#include <vector>

namespace monarch::mesh {

/// One failure of one or more ranks of a mesh. Causes name what happened to the proc: its exit
/// ("exited with code 3", "killed by signal 9 (SIGKILL)"), a missed heartbeat ("no heartbeat for
/// 1500 ms"), or an actor's unhandled failure (the supervision report, with the exception's message).
struct MeshFailure {
  std::string mesh;           ///< the mesh's name (SpawnOptions::name)
  std::vector<size_t> ranks;  ///< failed global ranks of the mesh
  std::string cause;

  /// "mesh trainers: ranks [2] failed: killed by signal 9 (SIGKILL)"
  std::string to_string() const {
    std::string r;
    for (size_t i = 0; i < ranks.size(); ++i) r += (i ? ", " : "") + std::to_string(ranks[i]);
    return "mesh " + mesh + ": rank" + (ranks.size() == 1 ? "" : "s") + " [" + r + "] failed: " + cause;
  }
};

}  // namespace monarch::mesh
