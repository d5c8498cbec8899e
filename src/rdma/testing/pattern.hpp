// Test support: deterministic byte patterns and a fast checksum, shared by the rdma tests, the
// rdma_peer helper process and the benchmark.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch::rdma::testing {

inline std::byte pattern_byte(uint64_t pos, uint64_t seed) {
  uint64_t x = pos * 0x9E3779B97F4A7C15ull + seed;
  return static_cast<std::byte>((x >> 29) ^ (x >> 7));
}

/// Fills `out` with a pattern that depends on `seed` and on each byte's position `base + i`
/// (so a sub-range of a pattern equals the pattern of that sub-range with the same base).
/// Stores 8 bytes at a time (sanitizers instrument each store).
inline void fill(std::span<std::byte> out, uint64_t seed, uint64_t base = 0) {
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    std::byte w[8];
    for (size_t k = 0; k < 8; ++k) w[k] = pattern_byte(base + i + k, seed);
    std::memcpy(out.data() + i, w, 8);
  }
  for (; i < out.size(); ++i) out[i] = pattern_byte(base + i, seed);
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

/// checksum() of fill(n bytes, seed, base), computed in 64 KiB pieces without the whole buffer.
inline uint64_t pattern_checksum(size_t n, uint64_t seed, uint64_t base = 0) {
  uint64_t h = 1469598103934665603ull;
  std::vector<std::byte> piece(std::min<size_t>(n, 64 << 10));
  size_t done = 0;
  while (done < n) {
    size_t len = std::min(piece.size(), n - done);
    fill(std::span<std::byte>(piece.data(), len), seed, base + done);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      uint64_t w;
      std::memcpy(&w, piece.data() + i, 8);
      h = (h ^ w) * 1099511628211ull;
    }
    for (; i < len; ++i) h = (h ^ static_cast<uint64_t>(piece[i])) * 1099511628211ull;
    done += len;
  }
  return h;
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
