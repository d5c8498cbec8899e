// In-process tests of the data plane: API contract, bad input, drop, batches, the handle codec.
// (Transfers across processes: testing/multiprocess.test.cpp.)
#include "monarch/rdma/rdma.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <thread>

#include "monarch/config/config.hpp"
#include "rdma/testing/expect.hpp"
#include "rdma/testing/pattern.hpp"

using namespace monarch::rdma;
namespace pat = monarch::rdma::testing;
using namespace std::chrono_literals;
using monarch::rdma::testing::expect_rdma_error;

namespace {

std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  pat::fill(v, seed);
  return v;
}

}  // namespace

TEST(Rdma, ActiveBackendIsQueryable) {
  std::string b = active_backend();
  EXPECT_TRUE(b == "ucx" || b == "channel") << b;
  EXPECT_FALSE(active_transport().empty());
  std::string want = monarch::config::global().string("rdma.backend");
  if (want != "auto") {
    EXPECT_EQ(b, want);
  }
}

// libucs's load-time constructor takes SIGHUP (which then no longer ends the process) and the
// error signals; the data plane gives them back (ucx.cpp). Checked after the backend started.
TEST(Rdma, LeavesTheProcessSignalHandlersAlone) {
  (void)active_backend();
  for (int sig : {SIGHUP, SIGILL, SIGSEGV, SIGBUS, SIGFPE}) {
    struct sigaction sa {};
    ASSERT_EQ(sigaction(sig, nullptr, &sa), 0);
    if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) continue;
    void* handler = (sa.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(sa.sa_sigaction)
                                                    : reinterpret_cast<void*>(sa.sa_handler);
    Dl_info info{};
    if (dladdr(handler, &info) != 0 && info.dli_fname != nullptr) {
      EXPECT_EQ(std::strstr(info.dli_fname, "libucs"), nullptr)
          << "signal " << sig << " is handled in " << info.dli_fname;
    }
  }
}

TEST(Rdma, ZeroLengthRegistrationFails) {  // RD-4
  std::vector<std::byte> none;
  auto e = expect_rdma_error([&] { RdmaBuffer b(none, "empty-one"); }, RdmaErrc::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("empty-one"), std::string::npos) << e.what();
}

TEST(Rdma, HandleRoundTripsThroughTheWire) {
  auto mem = pattern(1000, 1);
  RdmaBuffer buf(mem, "codec");
  RdmaHandle h = buf.handle();
  RdmaHandle back = pat::from_hex(pat::to_hex(h));
  EXPECT_EQ(back.name, "codec");
  EXPECT_EQ(back.owner, h.owner);
  EXPECT_EQ(back.reg_id, h.reg_id);
  EXPECT_EQ(back.length, 1000u);
  EXPECT_EQ(back.address, reinterpret_cast<uintptr_t>(mem.data()));
  ASSERT_EQ(back.ucx_routes.size(), h.ucx_routes.size());
  for (size_t i = 0; i < h.ucx_routes.size(); ++i) {
    EXPECT_EQ(back.ucx_routes[i].kind, h.ucx_routes[i].kind);
    EXPECT_EQ(back.ucx_routes[i].rkey, h.ucx_routes[i].rkey);
    EXPECT_EQ(back.ucx_routes[i].worker_address, h.ucx_routes[i].worker_address);
  }
  EXPECT_EQ(back.status_address, h.status_address);
  EXPECT_LT(monarch::wire::encode(h).size(), 4096u);
}

TEST(Rdma, LocalReadAndWriteWithOffsets) {  // RD-1 in one process
  auto mem = pattern(10000, 2);
  RdmaBuffer buf(mem, "local");
  std::vector<std::byte> got(3000);
  buf.handle().read_into(got, 5000).get(5s);
  EXPECT_EQ(pat::checksum(got), pat::checksum(std::span<const std::byte>(mem).subspan(5000, 3000)));
  auto patch = pattern(100, 3);
  buf.write_from(patch, 9900).get(5s);
  EXPECT_TRUE(std::equal(patch.begin(), patch.end(), mem.begin() + 9900));
}

TEST(Rdma, BadInputFailsWithClearErrors) {  // RD-4
  auto mem = pattern(4096, 4);
  RdmaBuffer buf(mem, "bounds");
  RdmaHandle h = buf.handle();
  std::vector<std::byte> dst(100);
  auto e = expect_rdma_error([&] { h.read_into(dst, 4000).get(5s); }, RdmaErrc::OutOfBounds);
  EXPECT_NE(std::string(e.what()).find("'bounds'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("offset 4000"), std::string::npos) << e.what();
  expect_rdma_error([&] { h.read_into(dst, ~0ull).get(5s); }, RdmaErrc::OutOfBounds);
  expect_rdma_error([&] { h.read_into(std::span<std::byte>()).get(5s); },
                    RdmaErrc::InvalidArgument);
  expect_rdma_error([&] { h.write_from(std::span<const std::byte>(), 0).get(5s); },
                    RdmaErrc::InvalidArgument);
  expect_rdma_error([&] { RdmaHandle{}.read_into(dst).get(5s); }, RdmaErrc::UnknownBuffer);
  RdmaHandle forged = h;
  forged.reg_id = 1'000'000;
  expect_rdma_error([&] { forged.read_into(dst).get(5s); }, RdmaErrc::UnknownBuffer);
  RdmaHandle stale = h;
  stale.owner_incarnation ^= 1;
  expect_rdma_error([&] { stale.read_into(dst).get(5s); }, RdmaErrc::UnknownBuffer);
  // A negative timeout was the 30 s default, and max() failed at once ("not complete after
  // 9223372036854775807 ms"): both are refused, naming the range.
  for (auto t : {-1ms, std::chrono::milliseconds::min(), std::chrono::milliseconds::max(),
                 monarch::config::kMaxDuration + 1ms}) {
    auto te = expect_rdma_error([&] { h.read_into(dst, 0, {.timeout = t}).get(5s); },
                                RdmaErrc::InvalidArgument);
    EXPECT_NE(std::string(te.what()).find("timeout"), std::string::npos) << te.what();
  }
  h.read_into(dst, 0, {.timeout = monarch::config::kMaxDuration}).get(5s);
}

// A read-only registration (RdmaBuffer::read_only): reads work, writes fail naming the buffer,
// also through a handle that does not say so (the owner checks in-process), and through a batch.
TEST(Rdma, AReadOnlyBufferRefusesWrites) {  // RD-4
  const auto mem = pattern(4096, 7);
  RdmaBuffer buf = RdmaBuffer::read_only(mem, "constant");
  RdmaHandle h = buf.handle();
  EXPECT_TRUE(h.read_only);
  std::vector<std::byte> dst(4096);
  h.read_into(dst).get(5s);
  EXPECT_EQ(dst, mem);
  std::vector<std::byte> src(16, std::byte{1});
  auto e = expect_rdma_error([&] { h.write_from(src, 100).get(5s); }, RdmaErrc::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("'constant'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  RdmaHandle forged = h;
  forged.read_only = false;
  expect_rdma_error([&] { forged.write_from(src, 100).get(5s); }, RdmaErrc::InvalidArgument);
  RdmaBatch batch;
  batch.read_into(h, dst).write_from(h, src);
  expect_rdma_error([&] { batch.submit().get(5s); }, RdmaErrc::InvalidArgument);
  EXPECT_EQ(std::vector<std::byte>(buf.memory().begin(), buf.memory().end()), pattern(4096, 7));
}

TEST(Rdma, DroppedBufferRefusesAccess) {  // RD-3
  auto mem = pattern(4096, 5);
  RdmaBuffer buf(mem, "gone-soon");
  RdmaHandle h = buf.handle();
  buf.drop();
  buf.drop();  // idempotent
  EXPECT_TRUE(buf.dropped());
  std::vector<std::byte> dst(10);
  auto e = expect_rdma_error([&] { h.read_into(dst).get(5s); }, RdmaErrc::Dropped);
  EXPECT_NE(std::string(e.what()).find("gone-soon"), std::string::npos) << e.what();
  expect_rdma_error([&] { (void)buf.handle(); }, RdmaErrc::Dropped);
}

TEST(Rdma, MovedBufferKeepsItsRegistration) {
  auto mem = pattern(64, 6);
  RdmaBuffer a(mem, "moved");
  RdmaHandle h = a.handle();
  RdmaBuffer b(std::move(a));
  EXPECT_TRUE(a.dropped());  // NOLINT(bugprone-use-after-move): documented moved-from state
  std::vector<std::byte> dst(64);
  h.read_into(dst).get(5s);
  EXPECT_EQ(dst, mem);
}

TEST(Rdma, BatchCompletesWhenAllDoAndReportsTheFirstError) {
  auto mem = pattern(1 << 16, 7);
  RdmaBuffer buf(mem, "batch");
  RdmaHandle h = buf.handle();
  std::vector<std::vector<std::byte>> parts(8, std::vector<std::byte>(1 << 13));
  RdmaBatch batch;
  for (size_t i = 0; i < parts.size(); ++i) batch.read_into(h, parts[i], i << 13);
  EXPECT_EQ(batch.size(), 8u);
  batch.submit().get(5s);
  std::vector<std::byte> joined;
  for (auto& p : parts) joined.insert(joined.end(), p.begin(), p.end());
  EXPECT_EQ(joined, mem);

  std::vector<std::byte> dst(16);
  RdmaBatch bad;
  bad.read_into(h, dst, 0).read_into(h, dst, 1 << 16);
  expect_rdma_error([&] { bad.submit().get(5s); }, RdmaErrc::OutOfBounds);
  EXPECT_NO_THROW(RdmaBatch{}.submit().get(1s));
}

TEST(Rdma, ConfigRejectsAnUnknownBackend) {
  monarch::config::Config c;
  EXPECT_THROW(c.set("rdma.backend", "carrier-pigeon"), monarch::config::ConfigError);
  EXPECT_NO_THROW(c.set("rdma.backend", "channel"));
  EXPECT_THROW(c.set("rdma.streams", "0"), monarch::config::ConfigError);
}

TEST(Rdma, AllocateOwnsZeroedSharedMemory) {
  expect_rdma_error([] { (void)RdmaBuffer::allocate(0, "nothing"); }, RdmaErrc::InvalidArgument);
  RdmaBuffer buf = RdmaBuffer::allocate(10000, "owned");
  ASSERT_EQ(buf.memory().size(), 10000u);
  EXPECT_TRUE(std::all_of(buf.memory().begin(), buf.memory().end(),
                          [](std::byte b) { return b == std::byte{0}; }));
  RdmaHandle h = buf.handle();
  EXPECT_GE(h.local.shm_fd, 0);
  EXPECT_GT(h.local.pid, 0);
  EXPECT_FALSE(h.local.host.empty());
  EXPECT_EQ(route_for(h), "in-process");
  pat::fill(buf.memory(), 8);
  std::vector<std::byte> got(10000);
  h.read_into(got).get(5s);
  EXPECT_EQ(pat::checksum(got), pat::pattern_checksum(10000, 8));
  RdmaHandle back = pat::from_hex(pat::to_hex(h));
  EXPECT_EQ(back.local.host, h.local.host);
  EXPECT_EQ(back.local.pid, h.local.pid);
  EXPECT_EQ(back.local.shm_fd, h.local.shm_fd);
  RdmaBuffer moved = std::move(buf);
  moved.drop();  // ends remote access; the memory stays the buffer's until it is destroyed
  expect_rdma_error([&] { h.read_into(got).get(5s); }, RdmaErrc::Dropped);
  EXPECT_EQ(pat::checksum(moved.memory()), pat::pattern_checksum(10000, 8));
}

TEST(Rdma, RouteForAPlainBufferOfOursIsInProcess) {
  auto mem = pattern(64, 9);
  RdmaBuffer buf(mem, "ours");
  EXPECT_EQ(route_for(buf.handle()), "in-process");
  EXPECT_EQ(route_for(buf.handle(), true), "in-process");
  EXPECT_EQ(buf.handle().local.shm_fd, -1);
}

TEST(Rdma, DeviceMemoryNeedsAUcxBuiltForItAndCpuRoutesRefuseIt) {
  auto kinds = supported_memory_kinds();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.front(), MemoryKind::Host);
  std::vector<std::byte> mem(4096);
  if (std::find(kinds.begin(), kinds.end(), MemoryKind::Cuda) == kinds.end()) {
    // Debian's UCX is built without CUDA: a clear refusal naming the buffer and what works.
    std::string what = expect_rdma_error([&] { RdmaBuffer gpu(mem, "weights", MemoryKind::Cuda); },
                                         RdmaErrc::BackendUnavailable)
                           .what();
    EXPECT_NE(what.find("'weights' of cuda memory"), std::string::npos) << what;
    EXPECT_NE(what.find("can register: host"), std::string::npos) << what;
  }
  // A handle to device memory is refused by the routes that copy with the CPU (here: in-process),
  // and the kind survives the wire.
  RdmaBuffer host(mem, "host-pretending");
  RdmaHandle h = host.handle();
  h.memory = MemoryKind::Rocm;
  RdmaHandle back = pat::from_hex(pat::to_hex(h));
  EXPECT_EQ(back.memory, MemoryKind::Rocm);
  std::vector<std::byte> dst(16);
  std::string what =
      expect_rdma_error([&] { back.read_into(dst).get(10s); }, RdmaErrc::BackendUnavailable).what();
  EXPECT_NE(what.find("rocm memory"), std::string::npos) << what;
  EXPECT_NE(route_for(back).find("ucx route only"), std::string::npos) << route_for(back);
}
