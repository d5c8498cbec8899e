// The shape of the cast tree (CAST-1, CAST-2 in monarch/mesh/cast.hpp): the one place that decides
// which child subtrees a node forwards a cast to. Used by the in-process relay (cast_job.hpp), the
// relay across processes (cast_remote.hpp) and cast_path().
//
// Vocabulary: the tree is over the base proc ranks 0..P-1 of a ProcMesh. A subtree is a proc range
// [lo, hi) rooted at proc lo; its node cuts [lo+1, hi) into chunks of cast_chunk() procs and the
// first proc of each chunk is a child. A cast carries its destination procs (those holding members
// of the view) as one ascending list; a subtree's destinations are a contiguous index range of it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace monarch::mesh::detail {

/// A subtree of the cast tree: base procs [lo, hi), rooted at proc lo, whose destination procs are
/// procs[db .. de) of the cast's ascending destination list.
struct CastSpan {
  uint32_t lo = 0, hi = 0, db = 0, de = 0;
};

/// Children of the tree node for procs [lo, hi): [lo+1, hi) cut into chunks of this many procs
/// (the last one may be shorter), so a node has at most `fanout` children (CAST-1).
inline uint32_t cast_chunk(uint32_t lo, uint32_t hi, size_t fanout) {
  const uint32_t n = hi - lo - 1;
  const auto f = static_cast<uint32_t>(std::min<size_t>(fanout, n == 0 ? 1 : n));
  return (n + f - 1) / f;
}

/// Plans one node of a cast: the subtree `node`, whose destinations are procs[node.db .. node.de)
/// (ascending, within [node.lo, node.hi)). Calls `child(CastSpan)` for each child subtree that
/// holds destinations, in proc order, and returns whether proc node.lo is itself a destination
/// (then it is procs[node.db], and the children's destinations start at node.db + 1). Children
/// without destinations are skipped: a cast visits only the subtrees that hold its members. The
/// chunk boundaries depend only on (lo, hi, fanout), never on the destinations (CAST-1).
template <class Child>
bool plan_cast_node(const CastSpan& node, size_t fanout, const std::vector<uint32_t>& procs,
                    Child&& child) {
  uint32_t db = node.db;
  const bool local = db < node.de && procs[db] == node.lo;
  if (local) ++db;
  const uint32_t first = node.lo + 1;
  if (first < node.hi && db < node.de) {
    const uint32_t chunk = cast_chunk(node.lo, node.hi, fanout);
    for (uint32_t clo = first; clo < node.hi && db < node.de; clo += chunk) {
      const uint32_t chi = std::min(clo + chunk, node.hi);
      uint32_t x = db;
      while (x < node.de && procs[x] < chi) ++x;
      if (x > db) child(CastSpan{clo, chi, db, x});
      db = x;
    }
  }
  return local;
}

/// The comm actors a cast to base proc `p` passes through, root (proc 0) first and `p` last, in
/// a tree over `procs` procs (plan_cast_node's children, followed down to `p`). Depends only on
/// (procs, fanout, p): CAST-2. Throws UsageError when p >= procs.
std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p);

}  // namespace monarch::mesh::detail
