// A replica-group stand-in for allreduce.test.cpp: one AllreduceGroup member in its own process,
// driven by commands on stdin, one per line:
//   configure <store_host> <store_port> <prefix> <rank> <world> <timeout_ms>
//        -> "CONFIGURED" | "ERROR <steady_ns> <message>"
//   loop <iterations, 0 = until an error> <floats>
//        -> per iteration "OK <i> <exact_hash> <full_hash>", then on failure "ERROR <steady_ns>
//        <message>"
//           and "DONE" after a finite loop
//   abort_after <iterations> <floats>  -> loops, then calls abort() and prints "ABORTED
//   <steady_ns>"
//   watched_loop <iterations> <floats> <probe_ms> <flag_file> -> as loop, with a Watch whose
//        probe (every probe_ms, printing "PROBE <i> <k>" for the k-th probe of iteration i) gives
//        a reason once <flag_file> exists; on an error also prints "BUFFER <hash of the buffer>"
//   rehash -> "BUFFER <hash>" of the last watched_loop's buffer again (nothing may write into it
//        after the op threw)
// Each iteration sums a buffer whose first half holds small integers (exact sums, the test checks
// the value) and second half pseudo-random floats (order-sensitive sums: hashes show every member
// got the same bits). steady_ns is CLOCK_MONOTONIC, comparable across processes on one host.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "monarch/ft/torch/allreduce.hpp"

namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::uint64_t fnv(const float* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) {
    h ^= b[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

void fill(std::vector<float>& buf, int rank, long iter) {
  std::size_t half = buf.size() / 2;
  for (std::size_t j = 0; j < half; ++j) {
    buf[j] =
        static_cast<float>((static_cast<long>(rank) * 7 + iter * 3 + static_cast<long>(j)) % 100);
  }
  std::uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(rank + 1) +
                    static_cast<std::uint64_t>(iter);
  for (std::size_t j = half; j < buf.size(); ++j) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf[j] = static_cast<float>(x % 1000003) / 3.7f - 1000.0f;
  }
}

}  // namespace

int main() {
  monarch::ft::AllreduceGroup group;
  std::vector<float> watched;  // watched_loop's buffer, kept for rehash
  std::string line;
  std::cout << std::unitbuf;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    try {
      if (cmd == "configure") {
        std::string host, prefix;
        int port = 0, rank = 0, world = 0;
        long timeout_ms = 0;
        in >> host >> port >> prefix >> rank >> world >> timeout_ms;
        group.configure(host, static_cast<std::uint16_t>(port), prefix, rank, world,
                        std::chrono::milliseconds(timeout_ms));
        std::cout << "CONFIGURED\n";
      } else if (cmd == "loop" || cmd == "abort_after") {
        long iterations = 0;
        std::size_t floats = 0;
        in >> iterations >> floats;
        std::vector<float> buf(floats);
        for (long i = 0; iterations == 0 || i < iterations; ++i) {
          fill(buf, group.rank(), i);
          group.allreduce_sum(buf);
          std::cout << "OK " << i << " " << fnv(buf.data(), floats / 2) << " "
                    << fnv(buf.data(), floats) << "\n";
        }
        if (cmd == "abort_after") {
          group.abort();
          std::cout << "ABORTED " << steady_ns() << "\n";
        } else {
          std::cout << "DONE\n";
        }
      } else if (cmd == "watched_loop") {
        long iterations = 0, probe_ms = 0;
        std::size_t floats = 0;
        std::string flag;
        in >> iterations >> floats >> probe_ms >> flag;
        watched.assign(floats, 0.0f);
        auto& buf = watched;
        long i = 0, k = 0;
        monarch::ft::AllreduceGroup::Watch watch;
        watch.after = watch.every = std::chrono::milliseconds(probe_ms);
        watch.probe = [&]() -> std::string {
          std::cout << "PROBE " << i << " " << ++k << "\n";
          return ::access(flag.c_str(), F_OK) == 0 ? "the test says a member is silent" : "";
        };
        for (; iterations == 0 || i < iterations; ++i) {
          fill(buf, group.rank(), i);
          k = 0;
          try {
            group.allreduce_sum(buf, &watch);
          } catch (const monarch::ft::AllreduceError& e) {
            std::string what = e.what();
            for (auto& c : what)
              if (c == '\n') c = ' ';
            std::cout << "ERROR " << steady_ns() << " " << what << "\n";
            std::cout << "BUFFER " << fnv(buf.data(), floats) << "\n";
            break;
          }
          std::cout << "OK " << i << " " << fnv(buf.data(), floats / 2) << " "
                    << fnv(buf.data(), floats) << "\n";
        }
        if (iterations > 0 && i == iterations) std::cout << "DONE\n";
      } else if (cmd == "rehash") {
        std::cout << "BUFFER " << fnv(watched.data(), watched.size()) << "\n";
      } else if (cmd == "exit") {
        return 0;
      }
    } catch (const monarch::ft::AllreduceError& e) {
      std::string what = e.what();
      for (auto& c : what) {
        if (c == '\n') c = ' ';
      }
      std::cout << "ERROR " << steady_ns() << " " << what << "\n";
    }
  }
  return 0;
}
