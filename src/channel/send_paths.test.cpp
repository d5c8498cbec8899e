// Sender::send's two paths (a direct write by the caller on an idle link, or the io thread's
// batching writer) must keep CH-1 between them: many threads, mixed sizes, a receiver that stalls
// now and then so direct writes meet a full socket buffer.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "monarch/channel/channel.hpp"
#include "path_stats.hpp"
#include "test_util.hpp"

using namespace monarch::channel;
using namespace std::chrono_literals;
using monarch::channel::testing::unique_name;

namespace {

using Clock = std::chrono::steady_clock;

ChannelOptions opts() {
  ChannelOptions o;
  o.secret = "test-secret";
  return o;
}

void spin_for(std::chrono::microseconds d) {  // a caller's pause between sends, or a slow consumer
  auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

// Payload byte i of message (thread, index): checks integrity at the receiver.
std::byte pattern(uint32_t thread, uint32_t index, size_t i) {
  return static_cast<std::byte>((thread * 131u + index * 7u + i) & 0xff);
}

struct Header {
  uint32_t thread;
  uint32_t index;
};

class SendPaths : public ::testing::TestWithParam<std::string> {};

TEST_P(SendPaths, DirectAndQueuedWritesKeepPerSenderOrderWithoutLossOrDuplicates) {  // CH-1
  constexpr uint32_t kThreads = 3;
  constexpr uint32_t kPerThread = 2000;
  constexpr uint32_t kTotal = kThreads * kPerThread;
  auto& stats = detail::send_path_stats();
  const uint64_t whole0 = stats.direct_whole.load(), deferred0 = stats.direct_deferred.load(),
                 queued0 = stats.queued.load();

  IoRuntime rx_io, tx_io;  // separate loops: a stalled receiver must not stall the sender's writer
  std::mutex mu;
  std::condition_variable cv;
  uint32_t received = 0;
  std::vector<uint32_t> next(kThreads + 1, 0);  // [kThreads]: the second phase's sender
  std::mutex gate_mu;  // second phase: the receiver blocks until the gate opens
  std::condition_variable gate_cv;
  bool gate_open = false;
  std::vector<std::string> errors;
  auto l = Listener::serve(rx_io, ChannelAddr::parse(GetParam()), opts(), [&](Message&& m) {
    std::string err;
    if (m.parts.size() < 2 || m.parts[0].size() != sizeof(Header)) {
      err = "malformed message";
    } else {
      Header h;
      std::memcpy(&h, m.parts[0].data(), sizeof h);
      if (h.thread == kThreads && h.index == 0) {  // a consumer that stops reading for a while
        std::unique_lock gate(gate_mu);
        gate_cv.wait_for(gate, 20s, [&] { return gate_open; });
      }
      size_t off = 0;
      for (size_t p = 1; p < m.parts.size() && err.empty(); ++p) {
        for (auto b : m.parts[p]) {
          if (b != pattern(h.thread, h.index, off++)) {
            err = "corrupt payload in " + std::to_string(h.thread) + "/" + std::to_string(h.index);
            break;
          }
        }
      }
      std::lock_guard lock(mu);
      if (h.thread > kThreads || h.index != next[h.thread]) {
        err = "thread " + std::to_string(h.thread) + ": got " + std::to_string(h.index) +
              ", expected " + std::to_string(h.thread <= kThreads ? next[h.thread] : 0);
      } else {
        ++next[h.thread];
      }
    }
    std::lock_guard lock(mu);
    if (!err.empty() && errors.size() < 10) errors.push_back(err);
    ++received;
    cv.notify_all();
    if (received % 1000 == 0) spin_for(4000us);  // a slow consumer: the sender's socket fills
  });
  std::atomic<int> failures{0};
  auto s = Sender::connect(tx_io, l->bound_addr(), opts(),
                           [&](Message&&, const std::string&) { failures.fetch_add(1); });

  auto make = [](uint32_t t, uint32_t i, size_t size, bool split) {
    Header h{t, i};
    Bytes head(sizeof h);
    std::memcpy(head.data(), &h, sizeof h);
    Bytes body(size);
    for (size_t k = 0; k < size; ++k) body[k] = pattern(t, i, k);
    Message m;
    m.parts.push_back(std::move(head));
    if (split && size > 1) {  // the second half as a shared part
      auto half = static_cast<long>(size / 2);
      m.parts.emplace_back(body.begin(), body.begin() + half);
      m.shared_parts.push_back(std::make_shared<const Bytes>(body.begin() + half, body.end()));
    } else {
      m.parts.push_back(std::move(body));
    }
    return m;
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      for (uint32_t i = 0; i < kPerThread; ++i) {
        // Mostly small; some medium (direct-path eligible); a few large (always queued).
        uint32_t dice = rng() % 100;
        size_t size = dice < 85   ? rng() % 256
                      : dice < 98 ? 4096 + rng() % (60 << 10)
                                  : (70 << 10) + rng() % (200 << 10);
        s->send(make(t, i, size, rng() % 10 == 0));
        // Pauses long enough for the link to go idle (direct path) mixed with bursts (queued).
        if (rng() % 4 != 0) spin_for(std::chrono::microseconds(rng() % 100));
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return received >= kTotal; }))
        << "received " << received << " of " << kTotal;
  }
  // Second phase: the receiver stops reading at its first message, so paced direct writes fill
  // the socket and one must be finished by the writer; what follows queues behind it.
  const uint64_t deferred1 = stats.direct_deferred.load();
  uint32_t phase2 = 0;
  for (; phase2 < 400 && stats.direct_deferred.load() == deferred1; ++phase2) {
    s->send(make(kThreads, phase2, 60 << 10, phase2 % 3 == 0));
    spin_for(20us);
  }
  for (uint32_t i = 0; i < 20; ++i, ++phase2) s->send(make(kThreads, phase2, 100 + i, false));
  {
    std::lock_guard gate(gate_mu);
    gate_open = true;
  }
  gate_cv.notify_all();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 30s, [&] { return received >= kTotal + phase2; }))
        << "received " << received << " of " << kTotal + phase2;
  }
  ASSERT_TRUE(monarch::channel::testing::wait_until([&] { return s->pending() == 0; }, 10s));
  std::lock_guard lock(mu);
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(received, kTotal + phase2);  // nothing duplicated
  for (uint32_t t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], kPerThread);
  EXPECT_EQ(next[kThreads], phase2);
  EXPECT_EQ(failures.load(), 0);
  std::printf("paths: direct %lu, deferred %lu, queued %lu\n",
              static_cast<unsigned long>(stats.direct_whole.load() - whole0),
              static_cast<unsigned long>(stats.direct_deferred.load() - deferred0),
              static_cast<unsigned long>(stats.queued.load() - queued0));
  // The test is only meaningful if both paths, and direct writes that had to be finished by the
  // writer, actually happened.
  EXPECT_GT(stats.direct_whole.load() - whole0, 0u);
  EXPECT_GT(stats.queued.load() - queued0, 0u);
  EXPECT_GT(stats.direct_deferred.load() - deferred0, 0u);
}

INSTANTIATE_TEST_SUITE_P(SocketTransports, SendPaths,
                         ::testing::Values("unix://@" + unique_name("paths"), "tcp://127.0.0.1:0"));

}  // namespace
