// libFuzzer target for FrameDecoder (built with -DMONARCH_FUZZ=ON and clang; see CMakeLists.txt).
//
// Feeds the input to a decoder in pseudo-random chunk sizes (seeded from the input) and checks:
//  - no crash/UB on any input (ASan+UBSan);
//  - each decoded frame re-encodes to exactly the input bytes it was decoded from;
//  - the split decode yields the same frames and the same error as feeding everything at once.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "monarch/wire/frame.hpp"

namespace {

using monarch::wire::DecoderLimits;
using monarch::wire::Frame;
using monarch::wire::FrameDecoder;
using monarch::wire::FrameError;

struct Result {
  std::vector<Frame> frames;
  std::optional<std::string> error;
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "frame_fuzz: check failed: %s\n", what);
    std::abort();
  }
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// split == false: everything in one feed; otherwise chunks of 1..64 bytes.
Result run(std::span<const std::byte> in, std::uint64_t seed, bool split, DecoderLimits limits) {
  Result r;
  FrameDecoder d(limits);
  std::size_t off = 0;
  std::size_t consumed = 0;  // bytes accounted for by decoded frames
  try {
    while (true) {
      if (off < in.size()) {
        std::size_t n = in.size() - off;
        if (split) n = std::min<std::size_t>(n, 1 + splitmix(seed) % 64);
        auto direct = d.direct_buffer();
        if (split && !direct.empty() && (splitmix(seed) & 1) != 0) {
          // Read straight into the part being assembled, as the channel does for large frames.
          n = std::min(n, direct.size());
          std::memcpy(direct.data(), in.data() + off, n);
          d.commit_direct(n);
        } else {
          d.feed(in.subspan(off, n));
        }
        off += n;
      }
      while (auto f = d.next()) {
        auto enc = monarch::wire::encode_frame(*f);
        check(consumed + enc.size() <= off, "frame longer than the bytes fed");
        check(std::memcmp(enc.data(), in.data() + consumed, enc.size()) == 0,
              "re-encoded frame differs from its input bytes");
        consumed += enc.size();
        r.frames.push_back(std::move(*f));
      }
      check(d.buffered() == off - consumed, "buffered() disagrees with bytes fed");
      if (off == in.size()) break;
    }
  } catch (const FrameError& e) {
    r.error = e.what();
    check(d.poisoned(), "decoder not poisoned after an error");
    bool threw_same = false;
    try {
      d.next();
    } catch (const FrameError& e2) {
      threw_same = r.error == e2.what();
    }
    check(threw_same, "poisoned decoder did not rethrow the same error");
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  std::uint64_t seed = size;
  for (std::size_t i = 0; i < size && i < 16; ++i) seed = seed * 131 + data[i];
  // Small limits so the fuzzer reaches the limit checks with small inputs.
  DecoderLimits limits;
  limits.max_frame_bytes = 2048;
  limits.max_parts = 64;
  limits.direct_min_bytes = 24;  // small, so in-place assembly of "large" frames is exercised
  Result whole = run(in, seed, false, limits);
  Result split = run(in, seed, true, limits);
  check(whole.frames == split.frames, "split decode yields different frames");
  check(whole.error == split.error, "split decode yields a different error");
  return 0;
}
