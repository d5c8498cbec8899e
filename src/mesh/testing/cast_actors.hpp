// Actors shared by the cast tests and mesh_peer (the same types in both binaries, so the cast
// handler keys match).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "monarch/mesh/proc_mesh.hpp"

namespace monarch::testing {

struct CastMember : monarch::Actor {
  explicit CastMember(long base) : base_(base) {}
  std::string where() const { return id().proc; }
  long value(long x) const { return base_ + x + static_cast<long>(mesh::Context::message_rank()); }
  void record(int seq) { log_.push_back(seq); }
  std::vector<int> log() const { return log_; }
  long fail_on(size_t r) const {
    if (mesh::Context::message_rank() == r)
      throw std::runtime_error("rank " + std::to_string(r) + " failed");
    return 1;
  }
  MONARCH_ENDPOINTS(CastMember, where, value, record, log, fail_on)
  long base_;
  std::vector<int> log_;
};

/// What mesh_peer can be cast (a worker binary registers its handlers explicitly).
inline void register_cast_member_handlers() {
  mesh::register_cast<CastMember>(&CastMember::where);
  mesh::register_cast<CastMember>(&CastMember::value, mesh::Sum{});
  mesh::register_cast<CastMember>(&CastMember::record);
  mesh::register_cast<CastMember>(&CastMember::log);
  mesh::register_cast<CastMember>(&CastMember::fail_on, mesh::Sum{});
}

}  // namespace monarch::testing
