// mesh_peer: a worker process for the cross-process cast tests. Serves argv[1], installs its comm
// actor, spawns argv[2] CastMembers (base argv[3]) and prints one line per actor id:
//   COMM <proc> <name> <uid>
//   MEMBER <proc> <name> <uid>      (argv[2] of them, in local index order)
//   READY
// then runs until stdin closes or it is killed.
#include <cstdio>
#include <cstdlib>

#include "cast_actors.hpp"

namespace {
void print_id(const char* what, const monarch::ActorId& id) {
  std::printf("%s %s %s %llu\n", what, id.proc.c_str(), id.name.c_str(),
              static_cast<unsigned long long>(id.uid));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mesh_peer LISTEN_ADDR MEMBERS BASE\n");
    return 2;
  }
  try {
    monarch::testing::register_cast_member_handlers();
    monarch::ProcOptions o;
    o.listen = argv[1];
    monarch::Proc proc(o);
    print_id("COMM", monarch::mesh::detail::install_comm(proc).id());
    const long n = std::atol(argv[2]);
    const long base = std::atol(argv[3]);
    for (long i = 0; i < n; ++i)
      print_id("MEMBER", proc.spawn<monarch::testing::CastMember>("member", base).id());
    std::printf("READY\n");
    std::fflush(stdout);
    char c;
    while (std::fread(&c, 1, 1, stdin) == 1) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mesh_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
