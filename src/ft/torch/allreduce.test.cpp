// AllreduceGroup across real processes (testing/allreduce_peer.cpp), with the store server in
// this process. Covers: bitwise-identical sums at world 3; SIGKILL of one member -> the others
// get AllreduceError fast, then reconfigure at world 2 and go on; abort() from one member makes
// the others fail fast; SIGSTOP of one member -> the others fail after the timeout; a member that
// never shows up -> configure fails within its timeout, and ends the wait of a member still
// configuring; world 1.
#include "monarch/ft/torch/allreduce.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::ft::AllreduceError;
using monarch::ft::AllreduceGroup;
using monarch::ft::StoreServer;
using monarch::testing::Subprocess;

namespace {

constexpr std::size_t kFloats = 4096;

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The next line starting with `prefix` (other lines skipped); fails the test at the deadline.
std::string expect(Subprocess& p, const std::string& prefix,
                   std::chrono::milliseconds deadline = 20s) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto l = p.line(left);
    if (!l) break;
    if (l->starts_with(prefix)) return *l;
  }
  ADD_FAILURE() << "no line starting with '" << prefix << "' from pid " << p.pid();
  return {};
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Hash (FNV-1a over bytes, as the peer) of the exact half of iteration `iter` summed over `world`.
std::uint64_t expected_exact_hash(int world, long iter) {
  std::vector<float> sum(kFloats / 2, 0.0f);
  for (int r = 0; r < world; ++r) {
    for (std::size_t j = 0; j < sum.size(); ++j) {
      sum[j] +=
          static_cast<float>((static_cast<long>(r) * 7 + iter * 3 + static_cast<long>(j)) % 100);
    }
  }
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(sum.data());
  for (std::size_t i = 0; i < sum.size() * sizeof(float); ++i) {
    h ^= b[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct Group {
  StoreServer store;
  std::vector<std::unique_ptr<Subprocess>> peers;

  explicit Group(int n) {
    for (int i = 0; i < n; ++i) {
      peers.push_back(
          std::make_unique<Subprocess>(MONARCH_FT_ALLREDUCE_PEER, std::vector<std::string>{}));
    }
  }
  void configure(const std::string& prefix, const std::vector<int>& members, long timeout_ms) {
    int world = static_cast<int>(members.size());
    for (int r = 0; r < world; ++r) {
      peers[members[r]]->write_line(
          "configure " + store.host() + " " + std::to_string(store.port()) + " " + prefix + " " +
          std::to_string(r) + " " + std::to_string(world) + " " + std::to_string(timeout_ms));
    }
    for (int m : members) ASSERT_EQ(expect(*peers[m], "CONFIGURED"), "CONFIGURED");
  }
  // Every member of `members` prints OK for iterations 0..n-1 with the same hashes.
  void expect_iterations(const std::vector<int>& members, long n) {
    int world = static_cast<int>(members.size());
    for (long i = 0; i < n; ++i) {
      std::string full;
      for (int m : members) {
        auto w = words(expect(*peers[m], "OK "));
        ASSERT_EQ(w.size(), 4u);
        ASSERT_EQ(w[1], std::to_string(i));
        EXPECT_EQ(w[2], std::to_string(expected_exact_hash(world, i))) << "iteration " << i;
        if (full.empty()) full = w[3];
        EXPECT_EQ(w[3], full) << "member " << m << " got different bits at iteration " << i;
      }
    }
  }
  // Waits for "ERROR <ns> <msg>" from peer m; returns seconds since `since_ns`. The message
  // must contain `must_name` (or `or_name`, when given); `*line` gets it.
  double error_after(int m, std::int64_t since_ns, const std::string& must_name,
                     std::chrono::milliseconds deadline = 20s, const std::string& or_name = {},
                     std::string* line = nullptr) {
    auto l = expect(*peers[m], "ERROR ", deadline);
    if (line) *line = l;
    auto w = words(l);
    if (w.size() < 2) return 1e9;
    bool named = l.find(must_name) != std::string::npos ||
                 (!or_name.empty() && l.find(or_name) != std::string::npos);
    EXPECT_TRUE(named) << l;
    std::printf("member %d: %s\n", m, l.c_str());
    return static_cast<double>(std::stoll(w[1]) - since_ns) / 1e9;
  }

  // Writes `flag` (the test standing in for the lighthouse's report that a member is silent)
  // and expects members 0 and 1 to give up well before the group timeout (3 s): each at its
  // probe (its error names `probed`), or, when the other gave up first and closed its
  // connections, on those; at least one of them probed.
  void report_silent_and_expect_give_up(const std::string& flag, const std::string& probed) {
    auto said_at = steady_ns();
    { std::ofstream(flag) << "silent\n"; }
    int probers = 0;
    for (int m : {0, 1}) {
      std::string l;
      double s = error_after(m, said_at, probed, 20s,
                             "(another member had already given up on this group and closed "
                             "its connections)",
                             &l);
      if (l.find(probed) != std::string::npos) ++probers;
      std::printf("member %d gave up %.3f s after the report\n", m, s);
      EXPECT_LT(s, 2.5) << "the group timeout (3 s) ended it, not the report";
    }
    EXPECT_GE(probers, 1);
  }
};

TEST(AllreduceGroup, ThreeProcessesGetBitwiseIdenticalSums) {
  Group g(3);
  g.configure("q1", {0, 1, 2}, 10000);
  for (auto& p : g.peers) p->write_line("loop 50 " + std::to_string(kFloats));
  g.expect_iterations({0, 1, 2}, 50);
  for (auto& p : g.peers) EXPECT_EQ(expect(*p, "DONE"), "DONE");
}

TEST(AllreduceGroup, KilledPeerFailsOthersFastThenWorldTwoReconfigures) {
  Group g(3);
  const long timeout_ms = 10000;
  g.configure("q1", {0, 1, 2}, timeout_ms);
  for (auto& p : g.peers) p->write_line("loop 0 " + std::to_string(kFloats));
  g.expect_iterations({0, 1, 2}, 20);
  auto killed_at = steady_ns();
  g.peers[2]->kill(SIGKILL);
  for (int m : {0, 1}) {
    double s =
        g.error_after(m, killed_at, "allreduce group 'q1' (rank " + std::to_string(m) + " of 3)");
    std::printf("detection after SIGKILL: member %d after %.3f s\n", m, s);
    EXPECT_LT(s, 3.0) << "a killed peer must be detected by its closed sockets, not the timeout";
  }
  g.configure("q2", {0, 1}, timeout_ms);
  for (int m : {0, 1}) g.peers[m]->write_line("loop 10 " + std::to_string(kFloats));
  g.expect_iterations({0, 1}, 10);
  for (int m : {0, 1}) EXPECT_EQ(expect(*g.peers[m], "DONE"), "DONE");
}

TEST(AllreduceGroup, AbortMakesPeersFailFast) {
  Group g(3);
  g.configure("q1", {0, 1, 2}, 10000);
  for (int m : {0, 1}) g.peers[m]->write_line("loop 0 " + std::to_string(kFloats));
  g.peers[2]->write_line("abort_after 20 " + std::to_string(kFloats));
  g.expect_iterations({0, 1, 2}, 20);
  auto w = words(expect(*g.peers[2], "ABORTED "));
  ASSERT_EQ(w.size(), 2u);
  auto aborted_at = std::stoll(w[1]);
  for (int m : {0, 1}) {
    // abort() sets the group's abort key before it closes its connections, so the others can
    // tell a socket error that names nobody from a dead peer.
    double s = g.error_after(m, aborted_at,
                             "(another member had already given up on this group and closed its "
                             "connections)");
    std::printf("detection after abort(): member %d after %.3f s\n", m, s);
    EXPECT_LT(s, 3.0) << "abort() must not leave peers waiting for their 10 s timeout";
  }
}

TEST(AllreduceGroup, StoppedPeerFailsOthersAtTheTimeout) {
  Group g(3);
  const long timeout_ms = 1500;
  g.configure("q1", {0, 1, 2}, timeout_ms);
  for (auto& p : g.peers) p->write_line("loop 0 " + std::to_string(kFloats));
  g.expect_iterations({0, 1, 2}, 20);
  auto stopped_at = steady_ns();
  g.peers[2]->kill(SIGSTOP);
  for (int m : {0, 1}) {
    double s = g.error_after(m, stopped_at, "'q1'");
    std::printf("detection after SIGSTOP (timeout %.1f s): member %d after %.3f s\n",
                static_cast<double>(timeout_ms) / 1000, m, s);
    EXPECT_LT(s, static_cast<double>(timeout_ms) / 1000 + 2.0);
  }
  g.peers[2]->kill(SIGCONT);
  // The woken member finds its group closed by the others and fails too, instead of hanging.
  auto woke = expect(*g.peers[2], "ERROR ");
  EXPECT_NE(woke.find("'q1' (rank 2 of 3)"), std::string::npos) << woke;
  std::printf("woken member: %s\n", woke.c_str());
}

// Q-9's mechanism: a stopped member never closes its sockets. Once something else says it is
// silent (here a flag file: the test stands in for the lighthouse's report), the others give up
// at their next probe, long before the group timeout (3 s; a timeout would name it instead of
// "abandoned"). They close their connections, so nothing writes into their buffers afterwards,
// not even when the stopped member wakes up and sends what it had; it fails on its own timeout.
TEST(AllreduceGroup, AWatchGivesUpOnAStoppedPeerAndNothingWritesIntoTheBufferAfterwards) {
  Group g(3);
  const std::string flag = ::testing::TempDir() + "silent." + std::to_string(::getpid());
  std::remove(flag.c_str());
  g.configure("q1", {0, 1, 2}, 3000);
  for (auto& p : g.peers) p->write_line("watched_loop 0 " + std::to_string(kFloats) + " 5 " + flag);
  g.expect_iterations({0, 1, 2}, 20);
  g.peers[2]->kill(SIGSTOP);
  // Both others wait in an op with the stopped member and probe (with nothing to report yet).
  for (int m : {0, 1}) {
    while (true) {
      auto w = words(expect(*g.peers[m], "PROBE "));
      ASSERT_EQ(w.size(), 3u);
      if (std::stol(w[2]) >= 3) break;
    }
  }
  g.report_silent_and_expect_give_up(flag, "abandoned: the test says a member is silent");
  std::vector<std::string> after(2);
  for (int m : {0, 1}) after[static_cast<size_t>(m)] = expect(*g.peers[m], "BUFFER ");
  std::remove(flag.c_str());
  g.peers[2]->kill(SIGCONT);  // it goes on with its op: sends, then waits for the others
  auto woke = expect(*g.peers[2], "ERROR ", 20s);
  EXPECT_NE(woke.find("'q1' (rank 2 of 3)"), std::string::npos) << woke;
  for (int m : {0, 1}) {
    g.peers[m]->write_line("rehash");
    EXPECT_EQ(expect(*g.peers[m], "BUFFER "), after[static_cast<size_t>(m)]) << "member " << m;
  }
  // The two reconfigure without it and go on.
  g.configure("q2", {0, 1}, 60000);
  for (int m : {0, 1}) g.peers[m]->write_line("loop 10 " + std::to_string(kFloats));
  g.expect_iterations({0, 1}, 10);
}

// The size check (the first collective of a group) is watched too: a member stopped right after
// the group formed holds the others in that 16-byte check, and the report ends their wait there,
// as in an allreduce, not the group timeout (3 s).
TEST(AllreduceGroup, AWatchAlsoEndsTheSizeCheckWaitingForAStoppedPeer) {
  Group g(3);
  const std::string flag = ::testing::TempDir() + "silent-check." + std::to_string(::getpid());
  std::remove(flag.c_str());
  g.configure("q1", {0, 1, 2}, 3000);
  g.peers[2]->kill(SIGSTOP);
  for (int m : {0, 1})
    g.peers[m]->write_line("watched_loop 0 " + std::to_string(kFloats) + " 5 " + flag);
  for (int m : {0, 1}) {
    while (true) {
      auto l = expect(*g.peers[m], "");
      ASSERT_FALSE(l.starts_with("OK ") || l.starts_with("ERROR ") || l.empty())
          << "member " << m << "'s wait ended before the report: " << l;
      if (l.starts_with("PROBE ") && std::stol(words(l)[2]) >= 3) break;
    }
  }
  g.report_silent_and_expect_give_up(flag,
                                     "size check abandoned: the test says a member is silent");
  std::remove(flag.c_str());
  g.peers[2]->kill(SIGCONT);
  // The two reconfigure without it and go on.
  g.configure("q2", {0, 1}, 60000);
  for (int m : {0, 1}) g.peers[m]->write_line("loop 10 " + std::to_string(kFloats));
  g.expect_iterations({0, 1}, 10);
}

// A probe with nothing to report changes nothing: a member stopped for a while (long enough for
// both others to probe several times) holds the op up, and after SIGCONT every member gets the
// exact sums and the same bits.
TEST(AllreduceGroup, AWatchWithNothingToReportWaitsForAStoppedPeer) {
  Group g(3);
  const std::string flag = ::testing::TempDir() + "never." + std::to_string(::getpid());
  std::remove(flag.c_str());
  g.configure("q1", {0, 1, 2}, 60000);
  const long n = 40;
  for (auto& p : g.peers)
    p->write_line("watched_loop " + std::to_string(n) + " " + std::to_string(kFloats) + " 5 " +
                  flag);
  g.expect_iterations({0, 1, 2}, 20);
  g.peers[2]->kill(SIGSTOP);
  std::vector<std::string> last(3);  // the last OK line each member printed
  for (int m : {0, 1}) {
    while (true) {
      auto l = expect(*g.peers[m], "");
      if (l.starts_with("OK ")) last[static_cast<size_t>(m)] = l;
      if (l.starts_with("ERROR ")) FAIL() << "member " << m << ": " << l;
      if (l.starts_with("PROBE ") && std::stol(words(l)[2]) >= 3) break;
    }
  }
  g.peers[2]->kill(SIGCONT);
  for (int m : {0, 1, 2}) {
    while (true) {
      auto l = expect(*g.peers[m], "");
      if (l.starts_with("ERROR ")) FAIL() << "member " << m << ": " << l;
      if (l.starts_with("OK ")) last[static_cast<size_t>(m)] = l;
      if (l == "DONE" || l.empty()) break;
    }
  }
  for (int m : {0, 1, 2}) {
    auto w = words(last[static_cast<size_t>(m)]);
    ASSERT_EQ(w.size(), 4u) << last[static_cast<size_t>(m)];
    EXPECT_EQ(w[1], std::to_string(n - 1));
    EXPECT_EQ(w[2], std::to_string(expected_exact_hash(3, n - 1)));
    EXPECT_EQ(w[3], words(last[0])[3]) << "member " << m << " got different bits";
  }
}

TEST(AllreduceGroup, ConfigureFailsWithinTimeoutWhenAPeerNeverShowsUp) {
  StoreServer store;
  AllreduceGroup group;
  auto start = std::chrono::steady_clock::now();
  try {
    group.configure(store.host(), store.port(), "lonely", 0, 2, 1000ms);
    FAIL() << "configure returned without its peer";
  } catch (const AllreduceError& e) {
    EXPECT_EQ(e.prefix(), "lonely");
    EXPECT_EQ(e.world_size(), 2);
    EXPECT_NE(std::string(e.what()).find("'lonely' (rank 0 of 2)"), std::string::npos) << e.what();
  }
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 4s);
  EXPECT_FALSE(group.configured());
  std::vector<float> buf(4, 1.0f);
  EXPECT_THROW(group.allreduce_sum(buf), AllreduceError);
}

// Two members of three configure; the third never comes. The member with the short timeout
// gives up, and its abort key must end the other's wait: without it, that one would fail only at
// its own 30 s timeout, with the timeout's message.
TEST(AllreduceGroup, ConfigureEndsWhenAnotherMemberGivesUp) {
  StoreServer store;
  AllreduceGroup patient, quitter;
  std::string patient_error;
  std::thread t([&] {
    try {
      patient.configure(store.host(), store.port(), "q9", 0, 3, 30000ms);
    } catch (const AllreduceError& e) {
      patient_error = e.what();
    }
  });
  try {
    quitter.configure(store.host(), store.port(), "q9", 1, 3, 300ms);
    FAIL() << "configure returned without its third member";
  } catch (const AllreduceError& e) {
    EXPECT_NE(std::string(e.what()).find("'q9' (rank 1 of 3)"), std::string::npos) << e.what();
  }
  t.join();
  EXPECT_NE(patient_error.find("'q9' (rank 0 of 3): configure: another member gave up"),
            std::string::npos)
      << patient_error;
  EXPECT_FALSE(patient.configured());
}

// Members passing different sizes: gloo's ring aborted the process of the member that received
// more than it expected (EnforceNotMet on its device thread, SIGABRT), and the member with the
// odd size went on alone (newcomer report, stop 51). Now every member throws UsageError naming
// the sizes, the processes live on, and the next group of equal sizes works.
TEST(AllreduceGroup, MembersPassingDifferentSizesAllGetAUsageError) {
  StoreServer store;
  AllreduceGroup a, b;
  auto run = [&](AllreduceGroup& g, const std::string& prefix, int rank, std::size_t n, float value,
                 std::string* error) {
    std::vector<float> buf(n, value);
    try {
      g.configure(store.host(), store.port(), prefix, rank, 2, 10000ms);
      g.allreduce_sum(buf);
    } catch (const monarch::UsageError& e) {
      *error = e.what();
    }
    return buf;
  };
  std::string ea, eb;
  std::thread t([&] { run(b, "sizes", 1, 1200, 1.0f, &eb); });
  run(a, "sizes", 0, 1000, 1.0f, &ea);
  t.join();
  for (const std::string* e : {&ea, &eb}) {
    EXPECT_NE(e->find("the members pass between 1000 and 1200"), std::string::npos) << *e;
    EXPECT_NE(e->find("same architecture"), std::string::npos) << *e;
  }
  EXPECT_NE(ea.find("this member passes 1000 floats"), std::string::npos) << ea;
  EXPECT_NE(eb.find("this member passes 1200 floats"), std::string::npos) << eb;
  EXPECT_FALSE(a.configured());
  EXPECT_FALSE(b.configured());
  std::vector<float> got_b;
  std::thread t2([&] { got_b = run(b, "sizes2", 1, 1000, 2.0f, &eb); });
  auto got_a = run(a, "sizes2", 0, 1000, 1.0f, &ea);
  t2.join();
  EXPECT_EQ(got_a, std::vector<float>(1000, 3.0f));
  EXPECT_EQ(got_b, std::vector<float>(1000, 3.0f));
}

TEST(AllreduceGroup, WorldOfOneIsTheIdentity) {
  StoreServer store;
  AllreduceGroup group;
  group.configure(store.host(), store.port(), "solo", 0, 1, 1000ms);
  std::vector<float> buf{1.5f, -2.0f, 3.25f};
  group.allreduce_sum(buf);
  EXPECT_EQ(buf, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  group.abort();
  EXPECT_THROW(group.allreduce_sum(buf), AllreduceError);
}

TEST(AllreduceGroup, NcclNeedsACudaBuild) {
#ifndef MONARCH_FT_HAVE_NCCL
  StoreServer store;
  AllreduceGroup group;
  try {
    group.configure(store.host(), store.port(), "gpu", 0, 1, 1000ms,
                    monarch::ft::AllreduceBackend::nccl);
    FAIL() << "nccl configured on a CPU-only libtorch";
  } catch (const AllreduceError& e) {
    EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
  }
#else
  GTEST_SKIP() << "CUDA build: NCCL exercised on GPU machines only";
#endif
}

}  // namespace
