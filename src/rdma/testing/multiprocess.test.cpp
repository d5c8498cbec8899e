// The data plane across real processes (rdma_peer, fork/exec): checksummed reads and writes from
// 1 B to 256 MiB in both directions, concurrent transfers, a dropped buffer, and an owner that
// freezes and dies mid-transfer. The backend is this process's rdma.backend (ctest runs the
// binary once per backend through MONARCH_RDMA_BACKEND; the peers inherit it).
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <optional>
#include <thread>

#include "monarch/rdma/rdma.hpp"
#include "rdma/engine.hpp"
#include "rdma/testing/pattern.hpp"
#include "rdma/testing/peers.hpp"
#include "testing/freeze.hpp"

using namespace monarch::rdma;
namespace pat = monarch::rdma::testing;
using namespace std::chrono_literals;
using monarch::rdma::testing::EnvFor;
using monarch::rdma::testing::Owner;
using monarch::rdma::testing::peer_line;
using monarch::rdma::testing::Subprocess;
using monarch::rdma::testing::sum_line;

TEST(RdmaProcesses, ReadFromAnotherProcessOfManySizes) {  // RD-1
  for (size_t size : {size_t{1}, size_t{4099}, size_t{(5u << 20) + 7}}) {
    Owner owner(size, 11);
    EXPECT_EQ(owner.handle.backend == Backend::Ucx ? "ucx" : "channel", active_backend());
    std::vector<std::byte> dst(size);
    owner.handle.read_into(dst).get(20s);
    EXPECT_EQ(pat::checksum(dst), pat::pattern_checksum(size, 11)) << size;
    if (size > 10) {  // a sub-range at an offset
      std::vector<std::byte> part(size / 2);
      owner.handle.read_into(part, size / 3).get(20s);
      EXPECT_EQ(pat::checksum(part), owner.sum(size / 3, size / 2)) << size;
    }
  }
}

TEST(RdmaProcesses, WriteIntoAnotherProcess) {  // RD-1
  for (size_t size : {size_t{1}, size_t{65537}, size_t{(9u << 20) + 3}}) {
    Owner owner(size + 100, 12);
    std::vector<std::byte> src(size);
    pat::fill(src, 99, 50);
    owner.handle.write_from(src, 50).get(20s);
    EXPECT_EQ(owner.sum(50, size), pat::checksum(src)) << size;
    // Bytes around the written range are untouched.
    EXPECT_EQ(owner.sum(0, 50), pat::pattern_checksum(50, 12));
    EXPECT_EQ(owner.sum(50 + size, 50), pat::pattern_checksum(50, 12, 50 + size));
  }
}

TEST(RdmaProcesses, PeersReadAndWriteOurBuffer256MiB) {  // RD-1, largest size once
  const size_t size = 256u << 20;
  std::vector<std::byte> mem(size);
  pat::fill(mem, 13);
  RdmaBuffer buf(mem, "big");
  std::string hex = pat::to_hex(buf.handle());
  EXPECT_EQ(peer_line({"read", hex, "0", std::to_string(size)}), sum_line(pat::checksum(mem)));
  buf.sync();  // our reads above come before the peer's writes below
  EXPECT_EQ(peer_line({"write", hex, "0", std::to_string(size), "77"}), "OK");
  buf.sync();  // the peer's "OK" says its writes completed
  EXPECT_EQ(pat::checksum(mem), pat::pattern_checksum(size, 77));
}

TEST(RdmaProcesses, ConcurrentTransfersToOneOwner) {  // RD-1 under concurrency
  const size_t part = (1u << 20) + 5;
  const int n = 8;
  Owner owner(part * n * 2, 14);
  std::vector<std::vector<std::byte>> reads(n, std::vector<std::byte>(part));
  std::vector<std::vector<std::byte>> writes(n, std::vector<std::byte>(part));
  std::vector<monarch::Future<void>> futures;
  for (int i = 0; i < n; ++i) {
    futures.push_back(owner.handle.read_into(reads[i], i * part));  // first half: read
    pat::fill(writes[i], 200 + i);
    futures.push_back(owner.handle.write_from(writes[i], (n + i) * part));  // second half: write
  }
  std::vector<std::thread> threads;  // and from other threads at the same time
  std::vector<std::vector<std::byte>> more(4, std::vector<std::byte>(part));
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { owner.handle.read_into(more[t], t * part).get(20s); });
  }
  for (auto& f : futures) f.get(20s);
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(pat::checksum(reads[i]), pat::pattern_checksum(part, 14, i * part)) << i;
    EXPECT_EQ(owner.sum((n + i) * part, part), pat::checksum(writes[i])) << i;
  }
  for (int t = 0; t < 4; ++t) EXPECT_EQ(more[t], reads[t]) << t;
}

TEST(RdmaProcesses, RemoteDropAndBoundsAreReportedByTheOwner) {  // RD-3, RD-4
  Owner owner(4096, 15);
  RdmaHandle lying = owner.handle;
  lying.length = 1 << 20;  // a handle claiming more than the owner registered
  std::vector<std::byte> dst(100);
  try {
    lying.read_into(dst, 8000).get(10s);
    ADD_FAILURE() << "read past the owner's buffer succeeded";
  } catch (const RdmaError& e) {
    EXPECT_EQ(e.errc(), RdmaErrc::OutOfBounds) << e.what();
  }
  EXPECT_EQ(owner.ask("drop"), "DROPPED");
  try {
    owner.handle.read_into(dst).get(10s);
    ADD_FAILURE() << "read of a dropped buffer succeeded";
  } catch (const RdmaError& e) {
    EXPECT_EQ(e.errc(), RdmaErrc::Dropped) << e.what();
    EXPECT_NE(std::string(e.what()).find("peer-buffer"), std::string::npos) << e.what();
  }
  std::vector<std::byte> src(10);
  EXPECT_THROW(owner.handle.write_from(src).get(10s), RdmaError);
}

// RD-4: a buffer registered read-only refuses writes: the writer refuses from its handle, and the
// owner refuses a handle that does not say so (forged, or from a build without the flag) on the
// channel route. Reads work; the owner's bytes are unchanged.
TEST(RdmaProcesses, AReadOnlyBufferRefusesWrites) {
  Owner owner(4096, 16, "readonly");
  EXPECT_TRUE(owner.handle.read_only);
  std::vector<std::byte> dst(4096);
  owner.handle.read_into(dst).get(20s);
  EXPECT_EQ(pat::checksum(dst), pat::pattern_checksum(4096, 16));
  std::vector<std::byte> src(10, std::byte{0x5a});
  RdmaHandle forged = owner.handle;
  forged.read_only = false;
  forged.ucx_routes.clear();  // the channel route, where the owner checks
  forged.local = {};
  for (const RdmaHandle* h : {&owner.handle, &forged}) {
    try {
      h->write_from(src, 8).get(20s);
      ADD_FAILURE() << "a write to a read-only buffer succeeded";
    } catch (const RdmaError& e) {
      EXPECT_EQ(e.errc(), RdmaErrc::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("peer-buffer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(owner.sum(0, 4096), pat::pattern_checksum(4096, 16));
}

// The channel route sends read replies straight from the registered memory, and the channel
// holds them until the requester acknowledges them. A requester that froze before acknowledging
// must not make drop() hang, nor leave the memory referenced after drop() returned (RD-3, RD-5).
TEST(RdmaProcesses, DropWithRepliesAFrozenRequesterNeverAcknowledged) {
  const size_t size = 16u << 20;
  std::vector<std::byte> mem(size);
  pat::fill(mem, 17);
  auto buf = std::make_unique<RdmaBuffer>(mem, "lent");
  EnvFor backend("MONARCH_RDMA_BACKEND", "channel");  // the peer reads over the channel route
  EnvFor routes("MONARCH_RDMA_LOCAL_ROUTES", "false");
  EnvFor ack_every("MONARCH_RDMA_ACK_EVERY", "1000000");  // the peer acknowledges only by time,
  EnvFor ack_interval("MONARCH_CHANNEL_ACK_INTERVAL", "1500ms");  // long after it froze itself
  EnvFor heartbeat("MONARCH_MESH_HEARTBEAT_INTERVAL", "1600ms");  // kept above the ack interval
  Subprocess peer(MONARCH_RDMA_PEER,
                  {"read-then-freeze", pat::to_hex(buf->handle()), "0", std::to_string(size)});
  auto l = peer.line(60s);
  while (l && l->starts_with("[")) l = peer.line(60s);
  ASSERT_EQ(l.value_or("<no output>"), sum_line(pat::checksum(mem)));
  auto& engine = monarch::rdma::detail::Engine::get();
  EXPECT_GT(engine.lent_replies(), 0u);  // unacknowledged replies still point into `mem`
  auto t0 = std::chrono::steady_clock::now();
  buf.reset();                                           // drop
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // not the link's 30 s delivery timeout
  EXPECT_EQ(engine.lent_replies(), 0u);  // nothing refers to `mem` any more: it may be freed
  peer.kill(SIGKILL);
}

// Write chunks go out straight from the caller's span, and the channel holds them until the owner
// acknowledges them. An owner that stays frozen must not hold the transfer past its timeout, and
// after the failure the span may be freed (RD-2). The owner then serves again.
TEST(RdmaProcesses, WriteToAFrozenOwnerFailsByItsTimeoutAndLetsGoOfTheSpan) {
  Owner owner(8u << 20, 18);
  RdmaHandle h = owner.handle;
  h.local = {};  // the backend's route, not a same-host copy
  std::vector<std::byte> warm(16);
  h.read_into(warm).get(10s);  // links are up
  ASSERT_TRUE(monarch::testing::freeze(owner.proc.pid()));
  auto src = std::make_unique<std::vector<std::byte>>(8u << 20);
  TransferOptions o;
  o.timeout = 1000ms;
  auto t0 = std::chrono::steady_clock::now();
  auto w = h.write_from(*src, 0, o);
  try {
    w.get(20s);
    ADD_FAILURE() << "write to a frozen owner succeeded";
  } catch (const RdmaError& e) {
    EXPECT_TRUE(e.errc() == RdmaErrc::Timeout || e.errc() == RdmaErrc::OwnerUnreachable)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // by its timeout, not the link's 30 s
  src.reset();  // nothing may read the span any more (ASan checks the channel's writes)
  ::kill(owner.proc.pid(), SIGCONT);
  std::vector<std::byte> again(1000);
  pat::fill(again, 5);
  h.write_from(again, 0).get(20s);
  EXPECT_EQ(owner.sum(0, again.size()), pat::checksum(again));
}

TEST(RdmaProcesses, OwnerFrozenThenKilledMidTransferFailsByTheTimeout) {  // RD-2
  const size_t size = 64u << 20;
  Owner owner(size, 16);
  // The backend's route: same-host routes read a frozen owner's memory without its help
  // (local_routes.test.cpp covers an owner killed during those).
  RdmaHandle h = owner.handle;
  h.local = {};
  std::vector<std::byte> warm(16);
  h.read_into(warm).get(10s);  // links are up: the transfer below is really mid-way
  ASSERT_TRUE(monarch::testing::freeze(owner.proc.pid()));
  std::vector<std::byte> dst(size);
  TransferOptions o;
  o.timeout = 1500ms;
  auto t0 = std::chrono::steady_clock::now();
  auto f = h.read_into(dst, 0, o);
  std::vector<std::byte> small(1 << 20);
  auto w = h.write_from(small, 0, o);
  EXPECT_FALSE(f.wait_for(300ms));  // the frozen owner cannot have answered
  owner.proc.kill(SIGKILL);
  for (auto* fut : {&f, &w}) {
    try {
      fut->get(10s);
      ADD_FAILURE() << "transfer from a dead owner succeeded";
    } catch (const RdmaError& e) {
      EXPECT_TRUE(e.errc() == RdmaErrc::Timeout || e.errc() == RdmaErrc::OwnerUnreachable)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("peer-buffer"), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);  // by the timeout, not the link's 30 s
  // A new transfer to the dead owner fails too, within its timeout.
  o.timeout = 500ms;
  EXPECT_THROW(h.read_into(warm, 0, o).get(5s), RdmaError);
  EXPECT_THROW(owner.handle.read_into(warm, 0, o).get(5s), RdmaError);  // and on a local route
}

TEST(RdmaProcesses, UcxThatCannotStartFallsBackToChannel) {
  // The peer asks for ucx with a transport UCX does not have: it warns and serves over channels,
  // and its handle says so; we read it whatever our own backend is.
  EnvFor backend("MONARCH_RDMA_BACKEND", "ucx");
  EnvFor tls("MONARCH_RDMA_UCX_TLS", "no-such-transport");
  auto owner = std::make_unique<Owner>(4099, 17);
  EXPECT_EQ(owner->handle.backend, Backend::Channel);
  EXPECT_TRUE(owner->handle.ucx_routes.empty());
  std::vector<std::byte> dst(4099);
  owner->handle.read_into(dst).get(20s);
  EXPECT_EQ(pat::checksum(dst), pat::pattern_checksum(4099, 17));
}
