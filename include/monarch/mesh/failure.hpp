// MeshFailure: what the owner of a ProcMesh receives when some of its procs fail.
//
// The type is defined in the actor layer (monarch/actor/supervision.hpp, which says why): it is
// the argument of Actor::supervise(const MeshFailure&), which the actor layer delivers and
// formats, and the actor layer may not include the mesh layer. This header is its name in the
// mesh layer. Where the mesh makes one: src/mesh/proc_failure.cpp.
#pragma once

#include "monarch/actor/supervision.hpp"

namespace monarch::mesh {

using monarch::MeshFailure;  // defined with the other supervision types (actor/supervision.hpp)

}  // namespace monarch::mesh
