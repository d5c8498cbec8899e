// bench_rdma: data-plane bandwidth, 4 KiB .. 256 MiB, per backend, against the local limits.
//
//   rdma_read_<backend> / rdma_write_<backend>   GB/s of RdmaHandle::read_into / write_from from
//       another process (one transfer at a time, waited on), impl "monarch", same-host routes
//       off (rdma.local_routes=false) so that the backend's own route is measured;
//     peers in the same run: "memcpy" (same sizes, this process); for ucx "ucx_perftest"
//       (ucp_get / ucp_put over the transport our ucx route uses) and "ucx_perftest_shm" (UCX's
//       default choice, shared memory on UCX-allocated buffers); for channel "raw_socket" (one
//       unix stream socket between two processes, blocking read/write of the same sizes),
//       measured in the channel client interleaved with the transfers, size by size, round by
//       round: each side the median of 5 rounds (with "spread"), ratios the median of the
//       per-round ratios.
//   rdma_read_shm / rdma_write_shm / rdma_read_cma   the same-host routes (docs/data-plane.md):
//       shm on an RdmaBuffer::allocate()d owner buffer, cma (reads) on a plain vector; writes to a
//       plain vector take the backend's route (rows above). Peer "memcpy" is measured in the same
//       client process, interleaved with them size by size: the same sizes, the same destination
//       (reads) / source (writes) buffer as the transfers, the other side page-aligned like
//       the shm data, every page warm for both; each value is the best of 3 interleaved rounds. The
//       ratio to memcpy is printed on stderr and by scripts/bench-report.py.
//   ft_heal_read   a same-host heal of a FlatState-sized committed state (2.4 MB: the ft_train
//       MLP's; 24 MiB: a llama-tiny-sized one), as ft_train's healer can do it with
//       FlatStateOptions::shared_memory on both sides: one shm read of the donor's allocate()d
//       buffer straight into the healer's own allocate()d state. Peers: "memcpy" (same size, into
//       the same destination, page-aligned warm source) and "staged_cma" (the heal before: the
//       donor's plain memory read by cma into a fresh staging vector, 256 KiB first then a batch
//       of 1 MiB reads, then copied into the state as FlatState::load_from does). Best of 3
//       interleaved rounds, in the `local` group.
//   ft_heal_read_cold   the same two heals as a restarted replica does them: each sample a fresh
//       process, its state allocated and touched first (as FlatState's constructor does), donors
//       of exactly the state's size; medians of 5 alternating samples of each. "monarch" times the
//       heal as ReplicaClient does (its route to the donor set up first: open + populated map of
//       the donor's segment, which ReplicaClient overlaps with the forming of the gloo group);
//       "monarch_with_setup" times route setup + heal (the page-table setup of the mapping is most
//       of it: ~10 us per 64 KiB under load); both are broken down on stderr (times, page faults).
//       Peer "memcpy" as above (cache-hot: the same warm source and destination each round).
//
// BENCH_RDMA_ONLY=ucx|channel|local runs one group of rows with its peers; =heal the ft_heal_read
// rows alone (a part of `local`).
//
// Roles (this binary re-executed): no arguments = driver; `--client BACKEND` measures one backend
// (MONARCH_RDMA_BACKEND is set for it); `--client local` the same-host routes; `--owner SIZE
// [alloc]` registers SIZE bytes (alloc: RdmaBuffer::allocate) and prints its handle.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/report.hpp"
#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/pattern.hpp"
#include "testing/subprocess.hpp"

using namespace monarch;
using bench::Clock;

namespace {

const std::vector<size_t> kSizes = {4u << 10,  64u << 10, 1u << 20,  4u << 20,
                                    16u << 20, 64u << 20, 256u << 20};
constexpr size_t kMax = 256u << 20;

std::string self_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(buf, static_cast<size_t>(n));
}

/// The median of samples (the upper one of an even count), 0 for none.
double median(std::vector<double> v) {
  return v.empty() ? 0.0 : bench::percentile(std::move(v), 0.5);
}

/// [min, max] of samples, which must not be empty.
std::pair<double, double> range_of(const std::vector<double>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *hi};
}

/// Runs `f` enough times (>= 3, about 0.25 s or 2 GiB) and returns GB/s.
template <class F>
double measure(size_t size, F&& f) {
  f();  // warm-up (connections, page faults)
  size_t iters = 0;
  auto t0 = Clock::now();
  double secs = 0;
  while (iters < 3 || (secs < 0.25 && iters * size < (2ull << 30))) {
    f();
    ++iters;
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return static_cast<double>(iters * size) / secs / 1e9;
}

nlohmann::json params(size_t size, const std::string& extra_key = "", const std::string& v = "") {
  nlohmann::json p = {{"size", size}};
  if (!extra_key.empty()) p[extra_key] = v;
  return p;
}

int role_owner(size_t size, bool alloc) {
  std::vector<std::byte> vec;
  rdma::RdmaBuffer buf = [&] {
    if (alloc) return rdma::RdmaBuffer::allocate(size, "bench-shm");
    vec.resize(size);
    return rdma::RdmaBuffer(vec, "bench");
  }();
  rdma::testing::fill(buf.memory(), 1);
  buf.sync();
  std::printf("HANDLE %s\n", rdma::testing::to_hex(buf.handle()).c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

/// Starts an owner of kMax bytes; its handle, or nullopt (reported on stderr).
std::optional<rdma::RdmaHandle> start_owner(std::unique_ptr<testing::Subprocess>& owner, bool alloc,
                                            size_t size = kMax) {
  std::vector<std::string> args = {"--owner", std::to_string(size)};
  if (alloc) args.push_back("alloc");
  owner = std::make_unique<testing::Subprocess>(self_path(), args);
  auto l = owner->line(std::chrono::seconds(30));
  while (l && !l->starts_with("HANDLE ")) l = owner->line(std::chrono::seconds(30));
  if (!l) {
    std::fprintf(stderr, "bench_rdma: owner did not start\n");
    return std::nullopt;
  }
  return rdma::testing::from_hex(l->substr(7));
}

/// `--cold-heal HEX SIZE shm|staged`: one heal as a freshly restarted replica does it (nothing
/// mapped or connected yet): its state made and touched first (like FlatState's constructor),
/// then the timed read: "shm" straight into allocate()d state, "staged" the heal before (cma into
/// a fresh vector, 256 KiB then 1 MiB pieces, copied into plain state). Prints "GBPS <value>".
int role_cold_heal(const std::string& hex, size_t size, const std::string& how) {
  constexpr size_t kChunk = 256 << 10;
  rdma::RdmaHandle h = rdma::testing::from_hex(hex);
  std::optional<rdma::RdmaBuffer> shm_state;
  std::vector<std::byte> plain_state;
  std::span<std::byte> dst;
  if (how == "shm") {
    shm_state.emplace(rdma::RdmaBuffer::allocate(size, "bench-cold-state"));
    dst = shm_state->memory();
  } else {
    plain_state.resize(size);
    dst = plain_state;
  }
  rdma::testing::fill(dst, 6);
  auto faults = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt + u.ru_majflt;
  };
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  long f0 = faults();
  auto t0 = Clock::now();
  std::string route;
  Clock::time_point t1 = t0;
  long f1 = f0;
  if (how == "shm") {
    route = rdma::route_for(h);  // the route setup (opens and maps the donor's segment)
    t1 = Clock::now();
    f1 = faults();
    h.read_into(dst.first(kChunk)).get();
    rdma::RdmaBatch rest;
    for (size_t off = kChunk; off < size; off += 4 * kChunk) {
      rest.read_into(h, dst.subspan(off, std::min(4 * kChunk, size - off)), off);
    }
    rest.submit().get();
  } else {
    std::vector<std::byte> buf(size);
    h.read_into(std::span(buf).first(kChunk)).get();
    rdma::RdmaBatch rest;
    for (size_t off = kChunk; off < size; off += 4 * kChunk) {
      rest.read_into(h, std::span(buf).subspan(off, std::min(4 * kChunk, size - off)), off);
    }
    rest.submit().get();
    std::memcpy(dst.data(), buf.data(), size);
  }
  auto t2 = Clock::now();
  long f2 = faults();
  double secs = std::chrono::duration<double>(t2 - t0).count();
  if (route.empty()) route = rdma::route_for(h);
  std::printf("GBPS %.4f ROUTE %s SETUP_US %.1f COPY_US %.1f FAULTS %ld %ld\n",
              static_cast<double>(size) / secs / 1e9, route.c_str(), us(t0, t1), us(t1, t2),
              f1 - f0, f2 - f1);
  return 0;
}

/// ft_heal_read rows (see the file comment): `src` is a warm page-aligned kMax-byte buffer for the
/// memcpy peer.
int heal_rows(std::span<std::byte> src) {
  constexpr size_t kChunk = 256 << 10;  // ft_train's --heal-chunk-bytes default
  for (size_t size : {size_t{2400000}, size_t{24} << 20}) {
    // Donors of exactly the state's size, as in ft_train (how the healer maps a segment depends
    // on its size: local.cpp).
    std::unique_ptr<testing::Subprocess> shm_owner, cma_owner;
    auto shm_h = start_owner(shm_owner, true, size);
    auto cma_h = start_owner(cma_owner, false, size);
    if (!shm_h || !cma_h) return 1;
    const rdma::RdmaHandle& shm = *shm_h;
    const rdma::RdmaHandle& cma = *cma_h;
    // The healer's own state: allocate()d like the donor's (FlatStateOptions::shared_memory).
    rdma::RdmaBuffer state = rdma::RdmaBuffer::allocate(size, "bench-healer-state");
    std::span<std::byte> dst = state.memory();
    rdma::testing::fill(dst, 4);
    auto staged = [&] {
      std::vector<std::byte> buf(size);
      cma.read_into(std::span(buf).first(kChunk)).get();
      rdma::RdmaBatch rest;
      for (size_t off = kChunk; off < size; off += 4 * kChunk) {
        rest.read_into(cma, std::span(buf).subspan(off, std::min(4 * kChunk, size - off)), off);
      }
      rest.submit().get();
      std::memcpy(dst.data(), buf.data(), size);
    };
    double direct = 0, copy = 0, before = 0;
    for (int round = 0; round < 3; ++round) {
      copy = std::max(copy, measure(size, [&] { std::memcpy(dst.data(), src.data(), size); }));
      direct = std::max(direct, measure(size, [&] { shm.read_into(dst).get(); }));
      before = std::max(before, measure(size, staged));
    }
    // Cold: each sample a fresh process (a restarted replica heals once), 5 alternating samples
    // of each way, medians.
    std::vector<double> cold_shm, cold_staged, cold_heal, setup_us, copy_us, faults_setup,
        faults_copy;
    for (int i = 0; i < 5; ++i) {
      for (bool use_shm : {true, false}) {
        testing::Subprocess p(self_path(),
                              {"--cold-heal", rdma::testing::to_hex(use_shm ? shm : cma),
                               std::to_string(size), use_shm ? "shm" : "staged"});
        auto l = p.line(std::chrono::seconds(30));
        while (l && !l->starts_with("GBPS ")) l = p.line(std::chrono::seconds(30));
        if (!l) continue;
        (use_shm ? cold_shm : cold_staged).push_back(std::stod(l->substr(5)));
        double setup = 0, cp = 0;
        long fs = 0, fc = 0;
        char route[16] = {};
        if (use_shm && std::sscanf(l->c_str(),
                                   "GBPS %*f ROUTE %15s SETUP_US %lf COPY_US %lf "
                                   "FAULTS %ld %ld",
                                   route, &setup, &cp, &fs, &fc) == 5) {
          setup_us.push_back(setup);
          copy_us.push_back(cp);
          cold_heal.push_back(static_cast<double>(size) / cp / 1e3);
          faults_setup.push_back(static_cast<double>(fs));
          faults_copy.push_back(static_cast<double>(fc));
        }
      }
    }
    auto spread = [](const std::vector<double>& v) {
      if (v.empty()) return std::string("-");
      auto [lo, hi] = range_of(v);
      return std::to_string(lo).substr(0, 5) + ".." + std::to_string(hi).substr(0, 5);
    };
    // "monarch": the heal as ReplicaClient times it (its route to the donor set up before, while
    // the new gloo group forms); "monarch_with_setup": route setup + heal, one after the other.
    bench::report("ft_heal_read_cold", "monarch", "bandwidth", median(cold_heal), "GB/s", "higher",
                  params(size));
    bench::report("ft_heal_read_cold", "monarch_with_setup", "bandwidth", median(cold_shm), "GB/s",
                  "higher", params(size));
    bench::report("ft_heal_read_cold", "staged_cma", "bandwidth", median(cold_staged), "GB/s",
                  "higher", params(size));
    bench::report("ft_heal_read_cold", "memcpy", "bandwidth", copy, "GB/s", "higher", params(size));
    std::fprintf(
        stderr,
        "bench_rdma: ft_heal_read_cold %9zu B  shm heal (route set up before) %.2f GB/s "
        "(%s), with the setup %.2f GB/s (%s)  staged cma %.2f GB/s (%s)  memcpy (cache-hot) "
        "%.2f: ratios %.2f / %.2f / %.2f (medians of 5 fresh processes)\n",
        size, median(cold_heal), spread(cold_heal).c_str(), median(cold_shm),
        spread(cold_shm).c_str(), median(cold_staged), spread(cold_staged).c_str(), copy,
        median(cold_heal) / copy, median(cold_shm) / copy, median(cold_staged) / copy);
    std::fprintf(stderr,
                 "bench_rdma: ft_heal_read_cold %9zu B  shm breakdown (medians): route setup "
                 "(open + map the donor's segment) %.0f us (%.0f page faults), copy %.0f us (%.0f "
                 "page faults); memcpy of the size %.0f us\n",
                 size, median(setup_us), median(faults_setup), median(copy_us), median(faults_copy),
                 static_cast<double>(size) / copy / 1e3);
    bench::report("ft_heal_read", "monarch", "bandwidth", direct, "GB/s", "higher", params(size));
    bench::report("ft_heal_read", "memcpy", "bandwidth", copy, "GB/s", "higher", params(size));
    bench::report("ft_heal_read", "staged_cma", "bandwidth", before, "GB/s", "higher",
                  params(size));
    std::fprintf(stderr,
                 "bench_rdma: ft_heal_read    %9zu B  shm direct %7.2f GB/s  memcpy %7.2f GB/s  "
                 "ratio %.2f  (before: staged cma %.2f GB/s, ratio %.2f)\n",
                 size, direct, copy, direct / copy, before, before / copy);
  }
  return 0;
}

/// The same-host routes against memcpy, size by size (see the file comment); heal_only: the
/// ft_heal_read rows alone (BENCH_RDMA_ONLY=heal).
int role_local_client(bool heal_only) {
  std::unique_ptr<testing::Subprocess> shm_owner, cma_owner;
  auto shm = start_owner(shm_owner, true);
  auto cma = start_owner(cma_owner, false);
  if (!shm || !cma) return 1;
  std::fprintf(stderr, "bench_rdma: routes: shm buffer read %s write %s; plain buffer read %s\n",
               rdma::route_for(*shm).c_str(), rdma::route_for(*shm, true).c_str(),
               rdma::route_for(*cma).c_str());
  // `other` is page-aligned like the owner's shm data, so memcpy(local, other) copies between
  // buffers aligned like the shm route's (the alignment of source against destination matters).
  std::vector<std::byte> local(kMax);
  std::unique_ptr<std::byte, decltype(&std::free)> other_mem(
      static_cast<std::byte*>(std::aligned_alloc(4096, kMax)), &std::free);
  std::span<std::byte> other(other_mem.get(), kMax);
  rdma::testing::fill(local, 2);
  rdma::testing::fill(other, 3);
  for (size_t size : kSizes) {
    if (heal_only) break;
    std::span<std::byte> buf(local.data(), size);
    // Rounds interleave the five measurements so that a noisy moment hits them alike; each keeps
    // its best round. memcpy peer: reads land in `local` (like the transfers'), writes come from
    // it.
    double copy_in = 0, copy_out = 0, shm_r = 0, shm_w = 0, cma_r = 0;
    for (int round = 0; round < 3; ++round) {
      copy_in =
          std::max(copy_in, measure(size, [&] { std::memcpy(local.data(), other.data(), size); }));
      copy_out =
          std::max(copy_out, measure(size, [&] { std::memcpy(other.data(), local.data(), size); }));
      shm_r = std::max(shm_r, measure(size, [&] { shm->read_into(buf).get(); }));
      shm_w = std::max(shm_w, measure(size, [&] { shm->write_from(buf).get(); }));
      cma_r = std::max(cma_r, measure(size, [&] { cma->read_into(buf).get(); }));
    }
    struct Row {
      const char* bench;
      double value;
      double memcpy;
    };
    for (const Row& r :
         {Row{"rdma_read_shm", shm_r, copy_in}, Row{"rdma_write_shm", shm_w, copy_out},
          Row{"rdma_read_cma", cma_r, copy_in}}) {
      bench::report(r.bench, "monarch", "bandwidth", r.value, "GB/s", "higher", params(size));
      bench::report(r.bench, "memcpy", "bandwidth", r.memcpy, "GB/s", "higher", params(size));
      std::fprintf(stderr, "bench_rdma: %-15s %9zu B  %7.2f GB/s  memcpy %7.2f GB/s  ratio %.2f\n",
                   r.bench, size, r.value, r.memcpy, r.value / r.memcpy);
    }
  }
  return heal_rows(other);
}

/// One unix stream socket between two processes; the forked child writes `size`-byte messages
/// from `src`, we read them into `dst`. GB/s, or 0 if the socket or fork fails. The child only
/// calls write() and _exit(), so forking a process with data-plane threads is safe.
double raw_socket_gbs(size_t size, std::span<const std::byte> src, std::span<std::byte> dst) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
  size_t iters = std::max<size_t>(4, std::min<size_t>(2000, (1ull << 30) / size));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    for (size_t i = 0; i < iters + 1; ++i) {
      size_t done = 0;
      while (done < size) {
        ssize_t n = ::write(sv[1], src.data() + done, size - done);
        if (n <= 0) ::_exit(1);
        done += static_cast<size_t>(n);
      }
    }
    ::_exit(0);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return 0;
  }
  auto read_one = [&] {
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::read(sv[0], dst.data() + done, size - done);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  };
  read_one();  // warm-up
  auto t0 = Clock::now();
  size_t got = 0;
  for (size_t i = 0; i < iters && read_one(); ++i) got += size;
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(sv[0]);
  ::waitpid(pid, nullptr, 0);
  return static_cast<double>(got) / secs / 1e9;
}

int role_client(const std::string& backend) {
  if (backend == "local" || backend == "heal") return role_local_client(backend == "heal");
  std::unique_ptr<testing::Subprocess> owner;
  auto handle = start_owner(owner, false);
  if (!handle) return 1;
  rdma::RdmaHandle h = *handle;
  std::vector<std::byte> local(kMax);
  rdma::testing::fill(local, 2);
  std::string active = rdma::active_backend();
  if (active != backend) {
    std::fprintf(stderr, "bench_rdma: asked for %s, running %s\n", backend.c_str(), active.c_str());
  }
  // channel: the raw socket peer is measured here too, interleaved with the transfers size by
  // size, round by round, so that a busy moment of the (shared) machine hits both sides alike
  // (measured minutes apart, their ratio swung 0.2x-1.9x in one run under load). Each side's
  // figure is the median of kRounds rounds, with its spread; the printed ratios are the medians
  // of the per-round ratios (best-of-3 of each side, taken independently, swung 0.45-0.92x at
  // 4 MiB writes between runs minutes apart).
  const bool with_socket = backend == "channel";
  constexpr int kRounds = 5;
  std::vector<std::byte> sock_src(with_socket ? kMax : 0);
  if (with_socket) rdma::testing::fill(sock_src, 5);
  auto with_spread = [](size_t size, const std::vector<double>& v) {
    nlohmann::json p = params(size);
    auto [lo, hi] = range_of(v);
    p["spread"] = {lo, hi};
    return p;
  };
  for (size_t size : kSizes) {
    std::span<std::byte> dst(local.data(), size);
    std::vector<double> r, w, sock, rr, wr;
    for (int round = 0; round < (with_socket ? kRounds : 1); ++round) {
      r.push_back(measure(size, [&] { h.read_into(dst).get(); }));
      w.push_back(measure(size, [&] { h.write_from(dst).get(); }));
      if (!with_socket) continue;
      sock.push_back(raw_socket_gbs(size, sock_src, dst));
      rr.push_back(sock.back() > 0 ? r.back() / sock.back() : 0);
      wr.push_back(sock.back() > 0 ? w.back() / sock.back() : 0);
    }
    bench::report("rdma_read_" + backend, "monarch", "bandwidth", median(r), "GB/s", "higher",
                  with_spread(size, r));
    bench::report("rdma_write_" + backend, "monarch", "bandwidth", median(w), "GB/s", "higher",
                  with_spread(size, w));
    if (!with_socket) continue;
    for (const char* dir : {"read", "write"}) {
      bench::report(std::string("rdma_") + dir + "_channel", "raw_socket", "bandwidth",
                    median(sock), "GB/s", "higher", with_spread(size, sock));
    }
    auto [rlo, rhi] = range_of(rr);
    auto [wlo, whi] = range_of(wr);
    std::fprintf(stderr,
                 "bench_rdma: channel %9zu B  read %6.2f  write %6.2f  raw socket %6.2f GB/s  "
                 "ratios %.2f [%.2f..%.2f] %.2f [%.2f..%.2f] (medians of %d rounds)\n",
                 size, median(r), median(w), median(sock), median(rr), rlo, rhi, median(wr), wlo,
                 whi, kRounds);
  }
  std::fprintf(stderr, "bench_rdma: %s transport: %s\n", active.c_str(),
               rdma::active_transport().c_str());
  return 0;
}

void memcpy_peer() {
  std::vector<std::byte> a(kMax), b(kMax);
  rdma::testing::fill(a, 3);
  std::memset(b.data(), 0, b.size());
  for (size_t size : kSizes) {
    double g = measure(size, [&] { std::memcpy(b.data(), a.data(), size); });
    for (const char* be : {"ucx", "channel"}) {
      for (const char* dir : {"read", "write"}) {
        bench::report(std::string("rdma_") + dir + "_" + be, "memcpy", "bandwidth", g, "GB/s",
                      "higher", params(size));
      }
    }
  }
}

/// ucx_perftest (ucx-utils) with ucp_get / ucp_put, server and client on this host. Returns GB/s
/// from its "Final:" line (overall bandwidth, MB/s), or a negative number if it cannot run.
double perftest(const std::string& test, size_t size, const std::string& tls) {
  if (std::system("command -v ucx_perftest > /dev/null 2>&1") != 0) return -1;
  static int seq = 0;  // a fresh port per run: the previous server's port may still be held
  int port = 20000 + static_cast<int>((::getpid() + 7 * seq++) % 20000);
  std::string p = std::to_string(port);
  pid_t server = ::fork();
  if (server == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    if (!tls.empty()) ::setenv("UCX_TLS", tls.c_str(), 1);
    ::execlp("ucx_perftest", "ucx_perftest", "-p", p.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  size_t iters = std::max<size_t>(10, std::min<size_t>(2000, (1ull << 30) / size));
  double gbs = -1;
  for (int attempt = 0; attempt < 20 && gbs < 0; ++attempt) {
    ::usleep(100000);  // the server needs a moment to listen; retried, not assumed
    std::string cmd = (tls.empty() ? std::string() : "UCX_TLS=" + tls + " ") + "ucx_perftest -p " +
                      p + " -t " + test + " -s " + std::to_string(size) + " -n " +
                      std::to_string(iters) + " localhost 2>/dev/null";
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) break;
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strncmp(line, "Final:", 6) != 0) continue;
      double it, p50, avg, overall, bw_avg, bw_overall;
      if (std::sscanf(line + 6, "%lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &overall, &bw_avg,
                      &bw_overall) == 6) {
        gbs = bw_overall * 1024 * 1024 / 1e9;  // ucx_perftest's MB is MiB
      }
    }
    ::pclose(f);
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  return gbs;
}

/// "ucx_perftest": the transport our ucx route uses (tcp unless UCX_TLS / rdma.ucx_tls say
/// otherwise); "ucx_perftest_shm": UCX's own choice on UCX-allocated memory (shared memory), the
/// ceiling a future shared-memory route could reach.
void perftest_peer() {
  const char* env = std::getenv("UCX_TLS");
  std::string ours = env != nullptr ? env : "tcp";
  for (auto [impl, tls] :
       {std::pair{"ucx_perftest", ours}, std::pair{"ucx_perftest_shm", std::string()}}) {
    bool works[2] = {true, true};  // a test that fails once (e.g. ucp_put over tcp) is not retried
    for (size_t size : kSizes) {
      for (int t = 0; t < 2; ++t) {
        const char* test = t == 0 ? "ucp_get" : "ucp_put_bw";
        const char* dir = t == 0 ? "read" : "write";
        if (!works[t]) continue;
        double g = perftest(test, size, tls);
        if (g < 0) {
          std::fprintf(stderr,
                       "bench_rdma: ucx_perftest %s (UCX_TLS=%s) failed or absent; skipped\n", test,
                       tls.empty() ? "default" : tls.c_str());
          works[t] = false;
          continue;
        }
        bench::report(std::string("rdma_") + dir + "_ucx", impl, "bandwidth", g, "GB/s", "higher",
                      params(size));
      }
    }
  }
}

int run_client(const std::string& backend) {
  if (backend == "local" || backend == "heal") {
    ::setenv("MONARCH_RDMA_BACKEND", "channel", 1);
    ::setenv("MONARCH_RDMA_LOCAL_ROUTES", "true", 1);
  } else {
    ::setenv("MONARCH_RDMA_BACKEND", backend.c_str(), 1);
    ::setenv("MONARCH_RDMA_LOCAL_ROUTES", "false", 1);  // the backend's own route
  }
  testing::Subprocess client(self_path(), {"--client", backend});
  while (auto l = client.line(std::chrono::minutes(5))) std::printf("%s\n", l->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  std::string role = argc > 1 ? argv[1] : "";
  if (role == "--owner" && (argc == 3 || argc == 4)) {
    return role_owner(std::stoull(argv[2]), argc == 4 && std::string(argv[3]) == "alloc");
  }
  if (role == "--client" && argc == 3) return role_client(argv[2]);
  if (role == "--cold-heal" && argc == 5)
    return role_cold_heal(argv[2], std::stoull(argv[3]), argv[4]);
  // BENCH_RDMA_ONLY=ucx|channel|local runs one backend's rows and their peers; heal: the heal rows.
  const char* only_env = std::getenv("BENCH_RDMA_ONLY");
  std::string only = only_env != nullptr ? only_env : "";
  if (!only.empty() && only != "ucx" && only != "channel" && only != "local" && only != "heal") {
    std::fprintf(stderr, "bench_rdma: BENCH_RDMA_ONLY=%s: expected ucx, channel, local or heal\n",
                 only.c_str());
    return 2;
  }
  auto want = [&](const char* b) { return only.empty() || only == b; };
#ifdef MONARCH_HAVE_UCX
  if (want("ucx")) {
    run_client("ucx");
    perftest_peer();
  }
#endif
  if (want("channel")) run_client("channel");
  if (want("local")) run_client("local");
  if (only == "heal") run_client("heal");
  if (want("ucx") || want("channel")) memcpy_peer();
  return 0;
}
