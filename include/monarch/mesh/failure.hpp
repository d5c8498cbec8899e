// MeshFailure: what the owner of a ProcMesh receives when some of its procs fail.
#pragma once

#include "monarch/actor/supervision.hpp"

namespace monarch::mesh {

using monarch::MeshFailure;  // defined with the other supervision types (actor/supervision.hpp)

}  // namespace monarch::mesh
