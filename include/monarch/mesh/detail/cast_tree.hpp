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
#include <string>
#include <utility>
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

/// Procs of the tree known to be dead (declared failed), ascending, with why (CAST-12).
struct DeadProcs {
  std::vector<uint32_t> procs;
  std::vector<std::string> causes;  // causes[i] is why procs[i] is dead
  bool empty() const noexcept { return procs.empty(); }
  /// Whether proc `p` is dead (binary search).
  bool has(uint32_t p) const noexcept { return std::binary_search(procs.begin(), procs.end(), p); }
  /// Why `p` is dead ("" when it is not).
  const std::string& cause(uint32_t p) const {
    static const std::string none;
    auto it = std::lower_bound(procs.begin(), procs.end(), p);
    return it != procs.end() && *it == p ? causes[static_cast<size_t>(it - procs.begin())] : none;
  }
  /// Adds `p` (kept sorted; a proc already there keeps its first cause).
  void add(uint32_t p, std::string why) {
    auto it = std::lower_bound(procs.begin(), procs.end(), p);
    if (it != procs.end() && *it == p) return;
    causes.insert(causes.begin() + (it - procs.begin()), std::move(why));
    procs.insert(it, p);
  }
};

/// The subtree `s` as a live node sees it (CAST-12): when its root proc s.lo is alive, `child(s)`;
/// when it is dead, its destination (if s.lo is one) goes to `lost(index into procs)` and its own
/// children take its place, recursively, so a dead proc never cuts off the procs below it. The
/// paths to the other procs do not change.
template <class Child, class Lost>
void plan_live_span(const CastSpan& s, size_t fanout, const std::vector<uint32_t>& procs,
                    const DeadProcs& dead, Child& child, Lost& lost) {
  if (!dead.has(s.lo)) return child(s);
  auto grandchild = [&](const CastSpan& c) { plan_live_span(c, fanout, procs, dead, child, lost); };
  if (plan_cast_node(s, fanout, procs, grandchild)) lost(s.db);
}

/// plan_cast_node for a live node that knows `dead` procs: children whose root is dead are
/// replaced by their own live descendants (plan_live_span). Returns whether node.lo is itself a
/// destination.
template <class Child, class Lost>
bool plan_live_node(const CastSpan& node, size_t fanout, const std::vector<uint32_t>& procs,
                    const DeadProcs& dead, Child&& child, Lost&& lost) {
  if (dead.empty()) return plan_cast_node(node, fanout, procs, child);
  auto sub = [&](const CastSpan& c) { plan_live_span(c, fanout, procs, dead, child, lost); };
  return plan_cast_node(node, fanout, procs, sub);
}

/// The comm actors a cast to base proc `p` passes through, root (proc 0) first and `p` last, in
/// a tree over `procs` procs (plan_cast_node's children, followed down to `p`). Depends only on
/// (procs, fanout, p): CAST-2. Throws UsageError when p >= procs.
/// With `dead` procs (CAST-12) the path skips them: it is the live procs of the path above.
/// Throws UsageError when p >= procs or p is dead.
std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p);
std::vector<uint32_t> cast_path(uint32_t procs, size_t fanout, uint32_t p, const DeadProcs& dead);

}  // namespace monarch::mesh::detail
