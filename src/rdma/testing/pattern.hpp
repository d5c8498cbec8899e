// Test support: deterministic byte patterns and a fast checksum, shared by the rdma tests, the
// rdma_peer helper process and the benchmark.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch::rdma::testing {

/// Fills `out` with a pattern that depends on `seed` and on each byte's position `base + i`
/// (so a sub-range of a pattern equals the pattern of that sub-range with the same base).
inline void fill(std::span<std::byte> out, uint64_t seed, uint64_t base = 0) {
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t x = (base + i) * 0x9E3779B97F4A7C15ull + seed;
    out[i] = static_cast<std::byte>((x >> 29) ^ (x >> 7));
  }
}

/// FNV-1a over 8-byte words, then the tail.
inline uint64_t checksum(std::span<const std::byte> in) {
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= in.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, in.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < in.size(); ++i) h = (h ^ static_cast<uint64_t>(in[i])) * 1099511628211ull;
  return h;
}

inline uint64_t pattern_checksum(size_t n, uint64_t seed, uint64_t base = 0) {
  std::vector<std::byte> v(n);
  fill(v, seed, base);
  return checksum(v);
}

inline std::string to_hex(const RdmaHandle& h) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (std::byte b : wire::encode(h)) {
    out += d[static_cast<uint8_t>(b) >> 4];
    out += d[static_cast<uint8_t>(b) & 15];
  }
  return out;
}

inline RdmaHandle from_hex(const std::string& s) {
  std::vector<std::byte> bytes(s.size() / 2);
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>(v(s[2 * i]) * 16 + v(s[2 * i + 1]));
  }
  return wire::decode<RdmaHandle>(bytes);
}

}  // namespace monarch::rdma::testing
