// ProcMesh (LocalAllocator) and ActorMesh adverbs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "monarch/mesh/proc_mesh.hpp"

using namespace std::chrono_literals;
using monarch::mesh::Context;
using monarch::mesh::ProcMesh;
using monarch::ndslice::Extent;
using monarch::ndslice::Range;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

struct Worker : monarch::Actor {
  explicit Worker(int base) : base_(base) {}
  // Where am I: proc name, and my position in the cast that reached me.
  std::string where() const { return id().proc; }
  size_t rank() const { return Context::message_rank(); }
  int add(int x) { return base_ + x + static_cast<int>(Context::message_rank()); }
  void bump() { ++bumps_; }
  int bumps() const { return bumps_; }
  int fail_on(size_t r) {
    if (Context::message_rank() == r)
      throw std::runtime_error("rank " + std::to_string(r) + " failed");
    return 0;
  }
  MONARCH_ENDPOINTS(Worker, where, rank, add, bump, bumps, fail_on)
  int base_;
  int bumps_ = 0;
};

TEST(ProcMesh, LocalMeshSpawnsOneActorPerProc) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}}, monarch::ProcOptions{});
  EXPECT_EQ(procs.size(), 8u);
  auto workers = procs.spawn<Worker>("worker", 100);
  auto where = workers.call(&Worker::where).get(10s);
  EXPECT_EQ(where.size(), 8u);
  std::set<std::string> procs_seen;
  for (size_t r = 0; r < 8; ++r) procs_seen.insert(where[r]);
  EXPECT_EQ(procs_seen.size(), 8u);  // one actor in each proc
  EXPECT_EQ(where[0], "local[0]");
  EXPECT_EQ(where[7], "local[7]");
}

// A default-constructed mesh has no members: every adverb refuses (choose() used to crash).
TEST(ActorMesh, AnEmptyMeshRefusesEveryAdverb) {
  monarch::mesh::ActorMesh<Worker> none;
  EXPECT_EQ(none.size(), 0u);
  EXPECT_THROW((void)none.at(0), monarch::UsageError);
  EXPECT_THROW((void)none.choose(&Worker::rank), monarch::UsageError);
  EXPECT_THROW((void)none.call_one(&Worker::rank), monarch::UsageError);
  EXPECT_THROW((void)none.call(&Worker::rank), monarch::UsageError);
  EXPECT_THROW((void)none.reduce(monarch::mesh::Sum{}, &Worker::rank), monarch::UsageError);
  EXPECT_THROW(none.broadcast(&Worker::bump), monarch::UsageError);
}

// An actor mesh that outlives its ProcMesh::local refuses instead of reaching freed procs.
TEST(ActorMesh, AMeshThatOutlivesItsLocalProcsRefuses) {
  monarch::mesh::ActorMesh<Worker> kept;
  {
    auto procs = ProcMesh::local(Extent{{"procs", 2}});
    kept = procs.spawn<Worker>("w", 10);
    ASSERT_EQ(kept.call(&Worker::add, 1).get(5s)[1], 12);
  }
  try {
    (void)kept.call(&Worker::add, 1);
    ADD_FAILURE() << "a call reached freed procs";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ProcMesh::local"));
  }
  EXPECT_THROW((void)kept.at(0), monarch::UsageError);
  EXPECT_THROW((void)kept.reduce(monarch::mesh::Sum{}, &Worker::add, 1), monarch::UsageError);
}

TEST(ActorMesh, CallGathersAValueMeshOverTheView) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}});
  auto workers = procs.spawn<Worker>("worker", 100);
  auto all = workers.call(&Worker::add, 10).get(10s);
  ASSERT_EQ(all.size(), 8u);
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(all[r], 110 + static_cast<int>(r));

  // A slice keeps its own extent, and message_rank is the position within the slice.
  auto host1 = workers.slice("hosts", 1);
  EXPECT_EQ(host1.extent().to_string(), "{gpus=4}");
  auto ranks = host1.call(&Worker::rank).get(10s);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r], r);
  auto where = host1.call(&Worker::where).get(10s);
  EXPECT_EQ(where[0], "local[4]");

  auto odd = workers.slice("gpus", Range(1, 4, 2));
  EXPECT_EQ(odd.extent().to_string(), "{hosts=2, gpus=2}");
  auto w = odd.call(&Worker::where).get(10s);
  EXPECT_EQ(w[0], "local[1]");
  EXPECT_EQ(w[3], "local[7]");
}

// with_view: the front ends' mesh algebra (Python's split/flatten/rename) reaches the same members
// through any view derived from shape(); a view outside the mesh is refused, naming the rank.
TEST(ActorMesh, WithViewReachesTheMembersOfADerivedView) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}});
  auto workers = procs.spawn<Worker>("worker", 0);
  auto split = workers.with_view(workers.shape().split("gpus", {"dp", "tp"}, {2, 2}));
  EXPECT_EQ(split.extent().to_string(), "{hosts=2, dp=2, tp=2}");
  auto where = split.slice("tp", 1).call(&Worker::where).get(10s);
  ASSERT_EQ(where.size(), 4u);
  EXPECT_EQ(where[0], "local[1]");
  EXPECT_EQ(where[3], "local[7]");
  auto flat = workers.slice("hosts", 1).with_view(workers.slice("hosts", 1).shape().flatten("all"));
  EXPECT_EQ(flat.extent().to_string(), "{all=4}");
  EXPECT_EQ(flat.call(&Worker::where).get(10s)[0], "local[4]");
  // A view of a bigger space holds ranks that are not members.
  monarch::ndslice::Shape outside(Extent{{"x", 16}});
  try {
    (void)workers.with_view(outside);
    FAIL() << "expected UsageError";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds rank 8"));
  }
  EXPECT_THROW((void)workers.select("0:2").with_view(workers.shape()), monarch::UsageError);
  // A ProcMesh view spawns over exactly its procs.
  auto renamed = procs.with_view(procs.shape().rename("gpus", "devices"));
  auto w2 = renamed.slice("devices", 3).spawn<Worker>("w2", 0);
  EXPECT_EQ(w2.call(&Worker::where).get(10s)[1], "local[7]");
  EXPECT_THROW((void)procs.with_view(outside), monarch::UsageError);
}

TEST(ActorMesh, CallOneChooseStreamBroadcast) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}});
  auto workers = procs.spawn<Worker>("worker", 0);
  EXPECT_EQ(workers.slice("hosts", 1).slice("gpus", 2).call_one(&Worker::where).get(10s),
            "local[6]");
  try {
    (void)workers.slice("hosts", 1).call_one(&Worker::where);
    FAIL();
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("{gpus=4} has 4 members"));
  }
  auto chosen = workers.choose(&Worker::where).get(10s);
  EXPECT_THAT(chosen, ::testing::StartsWith("local["));

  auto stream = workers.stream(&Worker::rank);
  std::set<size_t> seen;
  while (stream.remaining() > 0) {
    auto [rank, f] = stream.next(10s);
    EXPECT_EQ(f.get(), rank);
    EXPECT_TRUE(seen.insert(rank).second);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_THROW(stream.next(1ms), monarch::UsageError);

  workers.slice("hosts", 0).broadcast(&Worker::bump);
  workers.slice("hosts", 0).broadcast(&Worker::bump);  // per-pair FIFO: both land before the call
  auto bumps = workers.call(&Worker::bumps).get(10s);
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(bumps[r], r < 4 ? 2 : 0);
}

TEST(ActorMesh, ReduceCombinesRepliesIntoOneValue) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}});
  auto workers = procs.spawn<Worker>("worker", 100);
  EXPECT_EQ(workers.reduce(monarch::mesh::Sum{}, &Worker::add, 1).get(10s), 8 * 101 + 28);
  EXPECT_EQ(workers.reduce(monarch::mesh::Min{}, &Worker::add, 1).get(10s), 101);
  EXPECT_EQ(workers.reduce(monarch::mesh::Max{}, &Worker::add, 1).get(10s), 108);
  auto concat = [](std::string a, const std::string& b) {
    return a < b ? a + "," + b : b + "," + a;
  };
  auto joined =
      workers.slice("hosts", 1).slice("gpus", Range(0, 2)).reduce(concat, &Worker::where).get(10s);
  EXPECT_EQ(joined, "local[4],local[5]");
  EXPECT_THROW(workers.reduce(monarch::mesh::Sum{}, &Worker::fail_on, size_t{3}).get(10s),
               monarch::ActorError);
  int offset = 1000;  // a reducer that captures state
  auto shifted = [offset](int a, int b) { return a + b + offset; };
  // message_rank is the position within the slice {hosts=2}: 0 and 1.
  EXPECT_EQ(workers.slice("gpus", 0).reduce(shifted, &Worker::add, 0).get(10s), 100 + 101 + 1000);
}

TEST(ActorMesh, AMemberFailureLeavesThatMembersErrorInItsRank) {
  auto procs = ProcMesh::local(Extent{{"gpus", 4}});
  auto workers = procs.spawn<Worker>("worker", 0);
  try {
    auto vm = workers.call(&Worker::fail_on, size_t{2}).get(10s);
    EXPECT_EQ(vm.failed_ranks(), (std::vector<size_t>{2}));  // CAST-6: the others answered
    EXPECT_EQ(vm[3], 0);
    vm.throw_if_failed();
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_THAT(e.remote_message(), HasSubstr("rank 2 failed"));
    EXPECT_EQ(e.actor().proc, "local[2]");
  }
  EXPECT_EQ(workers.call(&Worker::bumps).get(10s).size(), 4u);  // members live on
}

TEST(ActorMesh, ThousandProcsTenThousandActors) {
  auto procs = ProcMesh::local(Extent{{"hosts", 10}, {"procs", 100}});
  std::vector<monarch::mesh::ActorMesh<Worker>> meshes;
  for (int i = 0; i < 10; ++i) meshes.push_back(procs.spawn<Worker>("w" + std::to_string(i), i));
  long total = 0;
  for (auto& m : meshes) {
    auto v = m.call(&Worker::add, 0).get(60s);
    for (size_t r = 0; r < v.size(); ++r) total += v[r];
  }
  // sum over meshes i of (1000*i + sum of ranks 0..999)
  EXPECT_EQ(total, 1000L * 45 + 10L * 999 * 1000 / 2);
}

TEST(Context, MessageRankOutsideACastIsAUsageError) {
  auto procs = ProcMesh::local(Extent{{"gpus", 1}});
  auto workers = procs.spawn<Worker>("worker", 0);
  try {
    workers.at(0).call(&Worker::rank).get(10s);
    FAIL();
  } catch (const monarch::ActorError& e) {
    EXPECT_THAT(e.remote_message(), HasSubstr("not reached through a mesh cast"));
  }
}

// Context::actor_rank(): "<point> in <extent>" of the calling actor, or "UsageError: <what>".
std::string describe_actor_rank() {
  try {
    auto p = Context::actor_rank();
    return p.to_string() + " in " + p.extent().to_string();
  } catch (const monarch::UsageError& e) {
    return std::string("UsageError: ") + e.what();
  }
}
std::string point_in(const Extent& e, size_t rank) {
  return e.point(rank).to_string() + " in " + e.to_string();
}

struct RankProbe : monarch::Actor {
  void init() override { at_init_ = describe_actor_rank(); }
  std::string now() const { return describe_actor_rank(); }
  std::string at_init() const { return at_init_; }
  // A child this actor spawns (Actor::spawn) is not a mesh member.
  std::string child() {
    auto c = spawn<RankProbe>("child");
    return c.call(&RankProbe::now).get(10s);
  }
  MONARCH_ENDPOINTS(RankProbe, now, at_init, child)
  std::string at_init_;
};

// Issue 16 item 7: an actor's point in the whole ActorMesh it was spawned into, whatever view or
// message reached it; also in init(), before any message.
TEST(Context, ActorRankIsThePointInTheWholeSpawnedMesh) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 3}});
  auto probes = procs.spawn<RankProbe>("probe", Extent{{"actors", 2}});
  const Extent full{{"hosts", 2}, {"gpus", 3}, {"actors", 2}};
  ASSERT_EQ(probes.extent(), full);
  for (size_t r = 0; r < full.num_ranks(); ++r) {  // direct calls: no message rank at all
    EXPECT_EQ(probes.at(r).call(&RankProbe::now).get(10s), point_in(full, r));
    EXPECT_EQ(probes.at(r).call(&RankProbe::at_init).get(10s), point_in(full, r));
  }
  auto cast = probes.call(&RankProbe::now).get(10s);
  ASSERT_EQ(cast.size(), full.num_ranks());
  for (size_t r = 0; r < full.num_ranks(); ++r) EXPECT_EQ(cast[r], point_in(full, r));
  // Through a slice, message ranks restart at 0; actor_rank stays the point in the whole mesh.
  auto gpu2 = probes.slice("gpus", 2);
  ASSERT_EQ(gpu2.extent().to_string(), "{hosts=2, actors=2}");
  auto sliced = gpu2.call(&RankProbe::now).get(10s);
  for (size_t h = 0; h < 2; ++h) {
    for (size_t a = 0; a < 2; ++a) {
      EXPECT_EQ(sliced[h * 2 + a], point_in(full, h * 6 + 2 * 2 + a));
    }
  }
  // Spawned from a sliced ProcMesh: the point in that (smaller) ActorMesh.
  auto sub = procs.slice("hosts", 1).spawn<RankProbe>("sub");
  const Extent sub_extent{{"gpus", 3}};
  ASSERT_EQ(sub.extent(), sub_extent);
  auto in_sub = sub.call(&RankProbe::now).get(10s);
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(in_sub[r], point_in(sub_extent, r));
  // A member's own child is not a member.
  EXPECT_THAT(probes.at(3).call(&RankProbe::child).get(10s),
              HasSubstr("was not spawned by ProcMesh::spawn"));
}

TEST(Context, ActorRankOfAnActorNotSpawnedByAProcMeshIsAUsageError) {
  monarch::Proc proc;
  auto plain = proc.spawn<RankProbe>("plain");
  const std::string got = plain.call(&RankProbe::now).get(10s);
  EXPECT_THAT(got, HasSubstr("UsageError: Context::actor_rank(): actor "));
  EXPECT_THAT(got, HasSubstr(plain.id().to_string()));
  EXPECT_THAT(got, HasSubstr("RankProbe) was not spawned by ProcMesh::spawn"));
  EXPECT_EQ(plain.call(&RankProbe::at_init).get(10s), got);
  try {
    (void)Context::actor_rank();  // the test thread is no actor
    FAIL() << "actor_rank() outside an actor must throw";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("outside an actor's handler"));
  }
}

// call_one's error names the mesh (its members' actor name) as well as the view.
TEST(ActorMesh, CallOneErrorNamesTheMesh) {
  auto procs = ProcMesh::local(Extent{{"hosts", 2}, {"gpus", 4}});
  auto workers = procs.spawn<Worker>("trainer", 0);
  try {
    (void)workers.slice("gpus", 1).call_one(&Worker::where);
    FAIL() << "call_one on a view of 2 members succeeded";
  } catch (const monarch::UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("call_one: mesh 'trainer' view {hosts=2} has 2 members; "
                                    "slice it down to exactly one"));
  }
}

}  // namespace
