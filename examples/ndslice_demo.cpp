// ndslice demo: extents, strided views, selections, reshaping, and a caught error.
#include <cstdio>
#include <string>

#include "monarch/ndslice/ndslice.hpp"

using namespace monarch::ndslice;

int main() {
  const Extent extent{{"hosts", 2}, {"gpus", 4}};
  std::printf("extent:          %s (%zu ranks)\n", extent.to_string().c_str(), extent.num_ranks());

  const Shape mesh(extent);
  const Shape odd = mesh.slice("gpus", Range{1, 4, 2});
  std::printf("gpus 1:4:2:      %s\n", odd.extent().to_string().c_str());
  for (const Point& p : odd) {
    std::printf("  %-18s -> global rank %zu\n", p.to_string().c_str(), odd.rank_of(p));
  }

  const Selection sel = parse("*,1:3");
  std::printf("select %-9s ranks %s\n", to_string(sel).c_str(),
              eval(sel, mesh).to_string().c_str());
  const Selection u = parse("0,(0|3) | 1,?");
  std::printf("select %-9s ranks %s\n", to_string(u).c_str(), eval(u, mesh).to_string().c_str());

  const Shape split = mesh.split("gpus", {"pairs", "gpu"}, {2, 2});
  std::printf("split gpus:      %s\n", split.extent().to_string().c_str());
  const Shape host1 = split.slice("hosts", 1).flatten("local").rename("local", "worker");
  std::printf("host 1 flat:     %s, ranks %s\n", host1.extent().to_string().c_str(),
              Region(host1).to_string().c_str());

  auto replies = ValueMesh<std::string>::from_vector(
      extent, {"ok", "ok", "ok", "ok", "ok", "oom", "ok", "ok"});
  std::printf("value mesh:      %zu values in %zu runs; rank 5 = %s\n", replies.size(),
              replies.runs(), replies[5].c_str());

  try {
    (void)mesh.slice("gpus", 7);
  } catch (const SliceError& e) {
    std::printf("caught error:    %s\n", e.what());
  }
  try {
    (void)parse("*,1:x");
  } catch (const ParseError& e) {
    std::printf("caught error:    %s\n", e.what());
  }
  return 0;
}
