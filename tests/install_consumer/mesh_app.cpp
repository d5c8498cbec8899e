// A local proc mesh and a reduced cast, linked against the installed monarch::mesh.
#include <chrono>
#include <cstdio>

#include "monarch/mesh/proc_mesh.hpp"

namespace mesh = monarch::mesh;

struct Worker : monarch::Actor {
  int plus_rank(int x) { return x + static_cast<int>(mesh::Context::message_rank()); }
  MONARCH_ENDPOINTS(Worker, plus_rank)
};

int main() {
  auto procs = mesh::ProcMesh::local({{"hosts", 2}, {"gpus", 2}});
  auto workers = procs.spawn<Worker>("worker");
  int sum = workers.reduce(mesh::Sum{}, &Worker::plus_rank, 10).get(std::chrono::seconds(10));
  std::printf("mesh_app: %s sum=%d\n", procs.extent().to_string().c_str(), sum);  // 40+0+1+2+3
}
