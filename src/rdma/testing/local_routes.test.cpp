// The same-host routes (docs/data-plane.md, "Local routes") across real processes: shm
// (RdmaBuffer::allocate) reads and writes and cma reads with checksums from 1 B to 256 MiB, drop
// and bounds on each route, an owner killed during transfers, the setting off, another host, and
// refused ptrace access falling back to the backend's route.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <thread>

#include "monarch/config/config.hpp"
#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/expect.hpp"
#include "rdma/testing/pattern.hpp"
#include "rdma/testing/peers.hpp"

using namespace monarch::rdma;
namespace pat = monarch::rdma::testing;
using namespace std::chrono_literals;
using monarch::rdma::testing::EnvFor;
using monarch::rdma::testing::expect_rdma_error;
using monarch::rdma::testing::Owner;
using monarch::rdma::testing::peer_line;

namespace {

/// rdma.local_routes for this process (runtime override) and for peers started meanwhile (env).
struct LocalRoutesSetting {
  EnvFor env;
  explicit LocalRoutesSetting(bool on) : env("MONARCH_RDMA_LOCAL_ROUTES", on ? "true" : "false") {
    monarch::config::global().set("rdma.local_routes", on ? "true" : "false");
  }
  ~LocalRoutesSetting() {
    monarch::config::global().set("rdma.local_routes",
                                  env.old.value_or("true") == "false" ? "false" : "true");
  }
};

class LocalRoutes : public ::testing::Test {
 protected:
  LocalRoutesSetting on_{true};
};

std::string backend_route() {
  return active_backend();
}

}  // namespace

TEST_F(LocalRoutes, ShmReadsAndWritesOfManySizes) {  // RD-1 on shm
  for (size_t size : {size_t{1}, size_t{4099}, size_t{(5u << 20) + 7}}) {
    Owner owner(size + 100, 21, "alloc");
    EXPECT_GE(owner.handle.local.shm_fd, 0);
    EXPECT_EQ(route_for(owner.handle), "shm");
    EXPECT_EQ(route_for(owner.handle, /*write=*/true), "shm");
    std::vector<std::byte> all(size + 100);
    owner.handle.read_into(all).get(20s);
    EXPECT_EQ(pat::checksum(all), pat::pattern_checksum(size + 100, 21)) << size;
    std::vector<std::byte> part(size);
    owner.handle.read_into(part, 50).get(20s);
    EXPECT_EQ(pat::checksum(part), owner.sum(50, size)) << size;

    std::vector<std::byte> src(size);
    pat::fill(src, 98, 50);
    owner.handle.write_from(src, 50).get(20s);
    EXPECT_EQ(owner.sum(50, size), pat::checksum(src)) << size;
    EXPECT_EQ(owner.sum(0, 50), pat::pattern_checksum(50, 21));  // neighbours untouched
    EXPECT_EQ(owner.sum(50 + size, 50), pat::pattern_checksum(50, 21, 50 + size));
  }
}

TEST_F(LocalRoutes, CmaReadsOfManySizesAndWritesOnTheBackend) {  // RD-1 on cma
  for (size_t size : {size_t{1}, size_t{4099}, size_t{(5u << 20) + 7}}) {
    Owner owner(size, 22);
    EXPECT_EQ(owner.handle.local.shm_fd, -1);
    EXPECT_EQ(route_for(owner.handle), "cma");
    EXPECT_EQ(route_for(owner.handle, /*write=*/true), backend_route());
    std::vector<std::byte> dst(size);
    owner.handle.read_into(dst).get(20s);
    EXPECT_EQ(pat::checksum(dst), pat::pattern_checksum(size, 22)) << size;
    if (size > 10) {
      std::vector<std::byte> part(size / 2);
      owner.handle.read_into(part, size / 3).get(20s);
      EXPECT_EQ(pat::checksum(part), owner.sum(size / 3, size / 2)) << size;
      std::vector<std::byte> src(size / 2);
      pat::fill(src, 97);
      owner.handle.write_from(src, size / 4).get(20s);
      EXPECT_EQ(owner.sum(size / 4, size / 2), pat::checksum(src)) << size;
    }
  }
}

TEST_F(LocalRoutes, PeersReadAndWrite256MiBOnShmAndCma) {  // RD-1, largest size once per route
  const size_t size = 256u << 20;
  std::vector<std::byte> mem;
  uint64_t written = 0;
  {
    RdmaBuffer buf = RdmaBuffer::allocate(size, "big-shm");
    ASSERT_EQ(buf.memory().size(), size);
    pat::fill(buf.memory(), 31);
    buf.sync();
    std::string hex = pat::to_hex(buf.handle());
    EXPECT_EQ(peer_line({"read-route", hex, "0", std::to_string(size)}),
              "SUM " + std::to_string(pat::checksum(buf.memory())) + " ROUTE shm");
    EXPECT_EQ(peer_line({"write", hex, "0", std::to_string(size), "78"}), "OK");
    buf.sync();
    written = pat::checksum(buf.memory());
    EXPECT_EQ(written, pat::pattern_checksum(size, 78));
    mem.assign(buf.memory().begin(), buf.memory().end());  // the same bytes, in plain memory
  }
  RdmaBuffer buf(mem, "big-cma");
  EXPECT_EQ(peer_line({"read-route", pat::to_hex(buf.handle()), "0", std::to_string(size)}),
            "SUM " + std::to_string(written) + " ROUTE cma");
}

TEST_F(LocalRoutes, DropThenReadOrWriteFailsWithDroppedOnEachRoute) {  // RD-3
  for (const char* flags : {"alloc", ""}) {
    SCOPED_TRACE(*flags ? "shm" : "cma");
    Owner owner(4096, 23, flags);
    std::vector<std::byte> dst(100), src(100);
    owner.handle.read_into(dst).get(10s);  // the route is set up (shm: mapped and cached)
    owner.handle.write_from(src).get(10s);
    EXPECT_EQ(owner.ask("drop"), "DROPPED");
    auto e = expect_rdma_error([&] { owner.handle.read_into(dst).get(10s); }, RdmaErrc::Dropped);
    EXPECT_NE(std::string(e.what()).find("peer-buffer"), std::string::npos) << e.what();
    expect_rdma_error([&] { owner.handle.write_from(src).get(10s); }, RdmaErrc::Dropped);
    // A process that never mapped it (shm: the memfd is closed) gets the same answer.
    EXPECT_TRUE(peer_line({"read-route", pat::to_hex(owner.handle), "0", "10"})
                    .starts_with("ERROR " + std::to_string(static_cast<int>(RdmaErrc::Dropped))));
  }
}

TEST_F(LocalRoutes, ShmWritesRacingDropAreWholeAndNeverLandAfterIt) {  // RD-3 on shm
  // Whole-buffer writes of two patterns loop while the owner drops. drop() waits for the copy
  // in flight, so the owner then holds one whole pattern (never a torn mix), and nothing changes
  // it afterwards: the writer's next write fails with Dropped.
  const size_t size = 4u << 20;  // a copy takes long enough for drop() to land in one
  Owner owner(size, 30, "alloc");
  std::vector<std::byte> a(size), b(size);
  pat::fill(a, 101);
  for (size_t i = 0; i < size; ++i) b[i] = ~a[i];  // differs from a in every byte
  std::atomic<int> writes{0};
  std::optional<RdmaError> error;  // set by the writer, read after join
  std::thread writer([&] {
    for (int i = 0; i < 1'000'000; ++i) {
      try {
        owner.handle.write_from(i % 2 == 0 ? a : b).get(10s);
      } catch (const RdmaError& e) {
        error = e;
        return;
      }
      ++writes;
    }
  });
  while (writes.load() < 3) std::this_thread::yield();
  // The owner reads its last word, its first word and its checksum as soon as drop() returns.
  std::istringstream in(owner.ask("drop-sum"));
  std::string word;
  uint64_t at_drop = 0, first = 0, last = 0;
  in >> word >> at_drop >> first >> last;
  ASSERT_EQ(word, "DROPPED");
  writer.join();
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->errc(), RdmaErrc::Dropped) << error->what();
  EXPECT_EQ(owner.sum(0, size), at_drop);
  const auto& whole = at_drop == pat::checksum(a) ? a : b;
  EXPECT_EQ(at_drop, pat::checksum(whole)) << "torn: a write was still landing after drop()";
  uint64_t want_first = 0, want_last = 0;
  std::memcpy(&want_first, whole.data(), 8);
  std::memcpy(&want_last, whole.data() + size - 8, 8);
  EXPECT_EQ(first, want_first);
  EXPECT_EQ(last, want_last);
}

TEST_F(LocalRoutes, OutOfBoundsIsCheckedAgainstTheOwnersLength) {  // RD-4
  for (const char* flags : {"alloc", ""}) {
    SCOPED_TRACE(*flags ? "shm" : "cma");
    Owner owner(4096, 24, flags);
    RdmaHandle lying = owner.handle;
    lying.length = 1 << 20;  // claims more than the owner registered
    std::vector<std::byte> dst(100);
    auto e = expect_rdma_error([&] { lying.read_into(dst, 8000).get(10s); }, RdmaErrc::OutOfBounds);
    EXPECT_NE(std::string(e.what()).find("offset 8000"), std::string::npos) << e.what();
    expect_rdma_error([&] { lying.write_from(dst, 4000).get(10s); }, RdmaErrc::OutOfBounds);
    expect_rdma_error([&] { owner.handle.read_into(dst, 4000).get(10s); }, RdmaErrc::OutOfBounds);
    EXPECT_EQ(owner.sum(0, 4096), pat::pattern_checksum(4096, 24));  // nothing written
  }
}

TEST_F(LocalRoutes, OwnerKilledDuringTransfersFailsClearlyWithoutHanging) {  // RD-2
  const size_t size = 64u << 20;
  for (const char* flags : {"", "alloc"}) {
    SCOPED_TRACE(*flags ? "shm" : "cma");
    Owner owner(size, 25, flags);
    const uint64_t want = pat::pattern_checksum(size, 25);
    std::atomic<int> good{0};
    std::atomic<bool> failed{false};
    std::optional<RdmaError> error;  // set by the reader, read after join
    std::vector<uint64_t> sums;
    std::thread reader([&] {
      std::vector<std::byte> dst(size);
      auto deadline = std::chrono::steady_clock::now() + 15s;
      while (std::chrono::steady_clock::now() < deadline) {
        try {
          owner.handle.read_into(dst).get(10s);
        } catch (const RdmaError& e) {
          error = e;
          failed = true;
          return;
        }
        if (sums.size() < 2) sums.push_back(pat::checksum(dst));
        ++good;
      }
    });
    while (good.load() == 0 && !failed.load()) std::this_thread::yield();  // reads are flowing
    auto t0 = std::chrono::steady_clock::now();
    owner.proc.kill(SIGKILL);
    reader.join();
    ASSERT_TRUE(error.has_value()) << "reads kept succeeding after the owner died";
    EXPECT_EQ(error->errc(), RdmaErrc::OwnerUnreachable) << error->what();
    EXPECT_NE(std::string(error->what()).find("peer-buffer"), std::string::npos) << error->what();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    for (uint64_t s : sums) EXPECT_EQ(s, want);  // reads that succeeded were complete
  }
}

TEST_F(LocalRoutes, SettingOffUsesTheBackendRoute) {
  Owner shm_owner(4099, 26, "alloc");
  Owner cma_owner(4099, 27);
  ASSERT_EQ(route_for(shm_owner.handle), "shm");
  ASSERT_EQ(route_for(cma_owner.handle), "cma");
  {
    LocalRoutesSetting off(false);
    for (auto* o : {&shm_owner, &cma_owner}) {
      EXPECT_EQ(route_for(o->handle), backend_route());
      EXPECT_EQ(route_for(o->handle, true), backend_route());
      std::vector<std::byte> dst(4099);
      o->handle.read_into(dst).get(20s);
      EXPECT_EQ(pat::checksum(dst), o->sum(0, 4099));
    }
    // A peer started with the setting off uses the backend's route too.
    EXPECT_EQ(
        peer_line({"read-route", pat::to_hex(cma_owner.handle), "0", "4099"}),
        "SUM " + std::to_string(pat::pattern_checksum(4099, 27)) + " ROUTE " + backend_route());
  }
  EXPECT_EQ(route_for(shm_owner.handle), "shm");
}

TEST_F(LocalRoutes, AnotherHostOrDeadOwnerIsNotLocal) {
  Owner owner(4099, 28, "alloc");
  RdmaHandle elsewhere = owner.handle;
  elsewhere.local.host = "another-boot-id:1:2";
  EXPECT_EQ(route_for(elsewhere), backend_route());
  std::vector<std::byte> dst(4099);
  elsewhere.read_into(dst).get(20s);
  EXPECT_EQ(pat::checksum(dst), pat::pattern_checksum(4099, 28));
  // A memfd number that is not this registration's (closed, reused) is refused: next route.
  RdmaHandle wrong_fd = owner.handle;
  wrong_fd.local.shm_fd = 0;  // the owner's stdin
  EXPECT_EQ(route_for(wrong_fd), "cma");
  EXPECT_EQ(route_for(wrong_fd, true), backend_route());
}

TEST_F(LocalRoutes, RefusedPtraceAccessFallsBackToTheBackendRoute) {
  // A non-dumpable owner and a requester without CAP_SYS_PTRACE: /proc/<pid>/fd and
  // process_vm_readv are refused; the requester warns, turns the routes off and reads anyway.
  Owner owner(4099, 29, "alloc,nodump");
  std::string out = peer_line({"read-route", pat::to_hex(owner.handle), "0", "4099", "noptrace"});
  if (out.starts_with("SKIP")) GTEST_SKIP() << out;
  EXPECT_EQ(out,
            "SUM " + std::to_string(pat::pattern_checksum(4099, 29)) + " ROUTE " + backend_route());
}
