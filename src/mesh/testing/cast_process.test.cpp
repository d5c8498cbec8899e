// CAST-10 with real processes: three mesh_peer workers, each a Proc with its comm actor and four
// members; the test process casts to them through remote refs only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "cast_actors.hpp"
#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::ActorId;
using monarch::testing::CastMember;
using ::testing::HasSubstr;

namespace {

ActorId parse_id(const std::string& line, const std::string& tag) {
  std::istringstream in(line);
  std::string what;
  ActorId id;
  in >> what >> id.proc >> id.name >> id.uid;
  if (what != tag) throw std::runtime_error("mesh_peer: expected " + tag + ", got: " + line);
  return id;
}

struct Peers {
  static constexpr size_t kProcs = 3, kPerProc = 4;
  std::vector<std::unique_ptr<monarch::testing::Subprocess>> procs;
  std::vector<ActorId> comm, members;

  explicit Peers(const std::string& prefix) {
    for (size_t p = 0; p < kProcs; ++p) {
      procs.push_back(std::make_unique<monarch::testing::Subprocess>(
          MONARCH_MESH_PEER, std::vector<std::string>{prefix + "/p" + std::to_string(p),
                                                      std::to_string(kPerProc), "7"}));
    }
    for (auto& sp : procs) {
      auto line = [&] {
        auto l = sp->line(20s);
        if (!l) throw std::runtime_error("mesh_peer did not start");
        return *l;
      };
      comm.push_back(parse_id(line(), "COMM"));
      for (size_t i = 0; i < kPerProc; ++i) members.push_back(parse_id(line(), "MEMBER"));
      if (line() != "READY") throw std::runtime_error("mesh_peer: no READY");
    }
  }
};

TEST(CastProcesses, CAST10_CastAndReduceAcrossWorkerProcesses) {
  const std::string prefix = "unix://@monarch-cast-proc-" + std::to_string(::getpid());
  Peers peers(prefix);
  monarch::ProcOptions co;
  co.listen = prefix + "/client";
  monarch::Proc client(co);
  monarch::ndslice::Shape view(
      monarch::ndslice::Extent{{"procs", Peers::kProcs}, {"actors", Peers::kPerProc}});
  auto m = monarch::mesh::ActorMesh<CastMember>::from_ids(client, peers.members, view, peers.comm,
                                                          2, Peers::kPerProc);

  auto vals = m.call(&CastMember::value, 5L).get(30s);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_EQ(vals[r], 12 + static_cast<long>(r));
  auto where = m.call(&CastMember::where).get(30s);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_EQ(where[r], peers.comm[r / Peers::kPerProc].proc);
  EXPECT_EQ(m.slice("actors", 3).reduce(monarch::mesh::Sum{}, &CastMember::value, 0L).get(30s),
            3 * 7 + 3);

  // CAST-3 across processes: broadcasts and calls to different slices, in send order.
  std::vector<monarch::mesh::ActorMesh<CastMember>> slices{
      m, m.slice("procs", 2), m.slice("actors", monarch::ndslice::Range(1, 4, 2))};
  std::vector<std::vector<int>> expected(m.size());
  for (int seq = 0; seq < 30; ++seq) {
    auto& v = slices[static_cast<size_t>(seq) % slices.size()];
    for (size_t i = 0; i < v.size(); ++i) expected[v.shape().global_rank(i)].push_back(seq);
    v.broadcast(&CastMember::record, seq);
  }
  auto logs = m.call(&CastMember::log).get(30s);
  for (size_t r = 0; r < m.size(); ++r) EXPECT_EQ(logs[r], expected[r]) << "member " << r;

  // CAST-6: the member's error crosses two hops and still names it.
  try {
    m.reduce(monarch::mesh::Sum{}, &CastMember::fail_on, size_t{9}).get(30s);
    FAIL() << "the cast succeeded";
  } catch (const monarch::ActorError& e) {
    EXPECT_EQ(e.actor(), peers.members[9]);
    EXPECT_THAT(e.remote_message(), HasSubstr("rank 9 failed"));
  }
}

}  // namespace
