#include "monarch/wire/frame.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace monarch::wire {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

Frame make_frame(FrameKind kind, std::vector<std::vector<std::byte>> parts, std::uint64_t seq = 7) {
  Frame f;
  f.header.kind = kind;
  f.header.flags = 0xA5;
  f.header.session_id = 0x0102030405060708ULL;
  f.header.incarnation = 0xFFFFFFFFFFFFFFFFULL;
  f.header.seq = seq;
  f.parts = std::move(parts);
  f.header.num_parts = static_cast<std::uint32_t>(f.parts.size());
  std::uint32_t body = 4 * f.header.num_parts;
  for (const auto& p : f.parts) body += static_cast<std::uint32_t>(p.size());
  f.header.body_len = body;
  return f;
}

std::vector<Frame> decode_all(FrameDecoder& d) {
  std::vector<Frame> out;
  while (auto f = d.next()) out.push_back(std::move(*f));
  return out;
}

template <class F>
std::string frame_error_of(F&& f) {
  try {
    f();
  } catch (const FrameError& e) {
    return e.what();
  }
  return "<no error>";
}

// Writes a little-endian value into an encoded frame.
template <class T>
void poke(std::vector<std::byte>& v, std::size_t off, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v[off + i] = static_cast<std::byte>(static_cast<std::uint64_t>(value) >> (8 * i));
  }
}

std::string decode_error(const std::vector<std::byte>& bytes, DecoderLimits limits = {}) {
  FrameDecoder d(limits);
  d.feed(bytes);
  return frame_error_of([&] { decode_all(d); });
}

TEST(Frame, HeaderLayoutIsLittleEndian) {
  auto f = make_frame(FrameKind::Ack, {});
  auto bytes = encode_frame(f);
  ASSERT_EQ(bytes.size(), kFrameHeaderSize);
  EXPECT_EQ(bytes[0], std::byte{'C'});
  EXPECT_EQ(bytes[1], std::byte{'R'});
  EXPECT_EQ(bytes[2], std::byte{'N'});
  EXPECT_EQ(bytes[3], std::byte{'M'});
  EXPECT_EQ(bytes[4], std::byte{1});
  EXPECT_EQ(bytes[5], std::byte{0});
  EXPECT_EQ(bytes[6], std::byte{6});
  EXPECT_EQ(bytes[7], std::byte{0xA5});
  EXPECT_EQ(bytes[8], std::byte{0x08});  // session_id LSB first
  EXPECT_EQ(bytes[15], std::byte{0x01});
  EXPECT_EQ(bytes[24], std::byte{7});  // seq
  auto h = parse_header_unchecked(bytes);
  EXPECT_EQ(h, f.header);
}

TEST(Frame, HeaderRoundTripEveryKind) {
  for (int k = 1; k <= 8; ++k) {
    auto kind = static_cast<FrameKind>(k);
    auto f = make_frame(kind, {bytes_of("x")}, 1000 + static_cast<std::uint64_t>(k));
    FrameDecoder d;
    d.feed(encode_frame(f));
    auto got = d.next();
    ASSERT_TRUE(got.has_value()) << to_string(kind);
    EXPECT_EQ(*got, f) << to_string(kind);
    EXPECT_FALSE(d.next().has_value());
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(Frame, KindToString) {
  EXPECT_EQ(to_string(FrameKind::Hello), "Hello");
  EXPECT_EQ(to_string(FrameKind::Data), "Data");
  EXPECT_EQ(to_string(FrameKind::Close), "Close");
  EXPECT_EQ(to_string(static_cast<FrameKind>(42)), "Unknown(42)");
}

TEST(Frame, MultipartZeroOneMany) {
  std::vector<Frame> frames = {
      make_frame(FrameKind::Heartbeat, {}),
      make_frame(FrameKind::Data, {bytes_of("hello")}),
      make_frame(FrameKind::Data, {{}}),  // one empty part
      make_frame(FrameKind::Data, {bytes_of("a"), {}, bytes_of("bcd"), pattern(300, 1), {}}),
  };
  std::vector<std::vector<std::byte>> many;
  for (int i = 0; i < 1000; ++i) many.push_back(pattern(static_cast<std::size_t>(i % 17), 2));
  frames.push_back(make_frame(FrameKind::Data, many));

  std::vector<std::byte> stream;
  for (const auto& f : frames) {
    auto e = encode_frame(f);
    EXPECT_EQ(e.size(), encoded_size(f.part_spans()));
    stream.insert(stream.end(), e.begin(), e.end());
  }
  FrameDecoder d;
  d.feed(stream);
  EXPECT_EQ(decode_all(d), frames);
}

TEST(Frame, OneMebibytePart) {
  auto f = make_frame(FrameKind::Data, {pattern(1 << 20, 3), bytes_of("tail")});
  FrameDecoder d;
  d.feed(encode_frame(f));
  auto got = d.next();
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, f);
}

TEST(Frame, PrefixPlusPartsEqualsWholeFrame) {
  auto p0 = pattern(100, 4);
  auto p1 = bytes_of("xyz");
  std::vector<std::span<const std::byte>> parts = {p0, p1};
  FrameHeader h;
  h.kind = FrameKind::Data;
  h.seq = 42;
  h.num_parts = 999;                              // ignored by the encoder
  std::vector<std::byte> out = bytes_of("junk");  // encode_prefix appends
  auto n = encode_prefix(h, parts, out);
  EXPECT_EQ(n, kFrameHeaderSize + 8);
  ASSERT_EQ(out.size(), 4 + n);
  std::vector<std::byte> gathered(out.begin() + 4, out.end());  // what writev would send
  gathered.insert(gathered.end(), p0.begin(), p0.end());
  gathered.insert(gathered.end(), p1.begin(), p1.end());
  EXPECT_EQ(gathered, encode_frame(h, parts));
  auto hh = parse_header_unchecked(gathered);
  EXPECT_EQ(hh.num_parts, 2u);
  EXPECT_EQ(hh.body_len, 8u + 103u);
}

TEST(Frame, ByteByByteAndRandomChunksYieldSameFrames) {
  std::vector<Frame> frames;
  std::mt19937 rng(12345);
  for (int i = 0; i < 40; ++i) {
    std::vector<std::vector<std::byte>> parts;
    const int np = static_cast<int>(rng() % 5);
    for (int j = 0; j < np; ++j) parts.push_back(pattern(rng() % 200, rng()));
    frames.push_back(make_frame(static_cast<FrameKind>(1 + rng() % 8), parts, rng()));
  }
  std::vector<std::byte> stream;
  for (const auto& f : frames) {
    auto e = encode_frame(f);
    stream.insert(stream.end(), e.begin(), e.end());
  }

  {  // byte by byte
    FrameDecoder d;
    std::vector<Frame> got;
    for (std::byte b : stream) {
      d.feed(std::span<const std::byte>(&b, 1));
      while (auto f = d.next()) got.push_back(std::move(*f));
    }
    EXPECT_EQ(got, frames);
    EXPECT_EQ(d.buffered(), 0u);
  }
  for (unsigned seed = 0; seed < 20; ++seed) {  // random chunk sizes, fixed seeds
    std::mt19937 crng(seed);
    FrameDecoder d;
    std::vector<Frame> got;
    std::size_t off = 0;
    while (off < stream.size()) {
      std::size_t n = std::min<std::size_t>(stream.size() - off, 1 + crng() % 700);
      d.feed(std::span<const std::byte>(stream).subspan(off, n));
      off += n;
      while (auto f = d.next()) got.push_back(std::move(*f));
    }
    EXPECT_EQ(got, frames) << "seed " << seed;
  }
}

TEST(Frame, NextWithoutEnoughBytesReturnsNullopt) {
  auto e = encode_frame(make_frame(FrameKind::Data, {bytes_of("abcdef")}));
  FrameDecoder d;
  EXPECT_FALSE(d.next());
  d.feed(std::span<const std::byte>(e).first(kFrameHeaderSize - 1));
  EXPECT_FALSE(d.next());
  d.feed(std::span<const std::byte>(e).subspan(kFrameHeaderSize - 1, 5));
  EXPECT_FALSE(d.next());
  d.feed(std::span<const std::byte>(e).subspan(kFrameHeaderSize + 4));
  EXPECT_TRUE(d.next());
}

TEST(FrameErrors, BadMagic) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint32_t>(e, 0, 0x41414141);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: bad magic 0x41414141"));
}

TEST(FrameErrors, UnsupportedVersion) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint16_t>(e, 4, 7);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: unsupported version 7"));
}

TEST(FrameErrors, UnknownKind) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint8_t>(e, 6, 42);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: unknown kind 42"));
  poke<std::uint8_t>(e, 6, 0);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: unknown kind 0"));
}

TEST(FrameErrors, PartLengthsDisagreeWithBody) {
  // Two parts of 4 and 6 bytes declared, but body_len says 12 data bytes.
  auto e = encode_frame(make_frame(FrameKind::Data, {bytes_of("abcd"), bytes_of("efghij")}));
  poke<std::uint32_t>(e, 36, 8 + 12);
  e.push_back(std::byte{0});
  e.push_back(std::byte{0});
  EXPECT_THAT(decode_error(e), HasSubstr("frame: part lengths sum to 10 but body has 12 bytes"));
}

TEST(FrameErrors, PartLengthsOverflowUint32) {
  auto e = encode_frame(make_frame(FrameKind::Data, {bytes_of("ab"), bytes_of("c")}));
  poke<std::uint32_t>(e, kFrameHeaderSize, 0xFFFFFFFFu);
  poke<std::uint32_t>(e, kFrameHeaderSize + 4, 0x4u);  // sum wraps in 32 bits to 3
  EXPECT_THAT(decode_error(e), HasSubstr("frame: part lengths sum to 4294967299"));
}

TEST(FrameErrors, TooManyParts) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint32_t>(e, 32, 5000);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: num_parts 5000 exceeds 4096"));
}

TEST(FrameErrors, LengthTableLargerThanBody) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint32_t>(e, 32, 3);
  poke<std::uint32_t>(e, 36, 8);
  EXPECT_THAT(decode_error(e), HasSubstr("frame: num_parts 3 needs a 12-byte length table"));
}

TEST(FrameErrors, OversizeRejectedFromHeaderAlone) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint32_t>(e, 32, 1);
  poke<std::uint32_t>(e, 36, 99999999);
  ASSERT_EQ(e.size(), kFrameHeaderSize);  // only the header; no body is ever fed
  EXPECT_THAT(decode_error(e),
              HasSubstr("frame: body_len 99999999 exceeds max_frame_bytes 67108864"));
  DecoderLimits small;
  small.max_frame_bytes = 100;
  auto ok = encode_frame(make_frame(FrameKind::Data, {pattern(97, 1)}));  // body_len 101
  EXPECT_THAT(
      decode_error(std::vector<std::byte>(ok.begin(), ok.begin() + kFrameHeaderSize), small),
      HasSubstr("frame: body_len 101 exceeds max_frame_bytes 100"));
}

TEST(FrameErrors, DecoderIsPoisoned) {
  auto good = encode_frame(make_frame(FrameKind::Data, {bytes_of("ok")}));
  auto bad = good;
  poke<std::uint32_t>(bad, 0, 0x41414141);
  FrameDecoder d;
  d.feed(good);
  d.feed(bad);
  ASSERT_TRUE(d.next());  // frames before the error are still delivered
  EXPECT_THAT(frame_error_of([&] { d.next(); }), HasSubstr("bad magic"));
  EXPECT_TRUE(d.poisoned());
  d.feed(good);
  EXPECT_EQ(frame_error_of([&] { d.next(); }), "frame: bad magic 0x41414141");
}

TEST(FrameErrors, ThrowsFrameErrorType) {
  auto e = encode_frame(make_frame(FrameKind::Data, {}));
  poke<std::uint16_t>(e, 4, 2);
  FrameDecoder d;
  d.feed(e);
  EXPECT_THROW(d.next(), FrameError);
  EXPECT_THROW(d.next(), std::runtime_error);
}

// Feeds `stream` to d the way the channel reads a socket, 100000 bytes at most per read:
// straight into direct_buffer() while a large frame is pending, else through feed(). Returns the
// frames decoded; `direct_reads` counts the reads that went straight into a part.
std::vector<Frame> read_like_channel(FrameDecoder& d, std::span<const std::byte> stream,
                                     size_t* direct_reads = nullptr) {
  std::vector<Frame> out;
  size_t off = 0;
  while (off < stream.size()) {
    auto direct = d.direct_buffer();
    size_t n = std::min<size_t>(stream.size() - off, 100000);
    if (!direct.empty()) {
      n = std::min(n, direct.size());
      std::memcpy(direct.data(), stream.data() + off, n);
      d.commit_direct(n);
      if (direct_reads != nullptr) ++*direct_reads;
    } else {
      d.feed(stream.subspan(off, n));
    }
    off += n;
    while (auto f = d.next()) out.push_back(std::move(*f));
  }
  return out;
}

TEST(Frame, LargeFramesAreAssembledInPlace) {
  // Two frames: a small one, then one with a 1 MiB part, then a small one, read the way the
  // channel reads: straight into direct_buffer() while a large frame is pending, else feed().
  std::vector<std::byte> big(1u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::byte> head(5, std::byte{1});
  std::vector<std::span<const std::byte>> parts{head, big, {}};
  FrameHeader h{};
  h.seq = 2;
  auto stream = encode_frame(FrameHeader{}, {});
  auto f2 = encode_frame(h, parts);
  stream.insert(stream.end(), f2.begin(), f2.end());
  auto f3 = encode_frame(FrameHeader{}, {});
  stream.insert(stream.end(), f3.begin(), f3.end());

  FrameDecoder d;
  size_t direct_reads = 0;
  std::vector<Frame> out = read_like_channel(d, stream, &direct_reads);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_GT(direct_reads, 5u);  // most of the 1 MiB went straight into the part
  EXPECT_EQ(out[1].header.seq, 2u);
  ASSERT_EQ(out[1].parts.size(), 3u);
  EXPECT_EQ(out[1].parts[0], head);
  EXPECT_TRUE(out[1].parts[1] == big);
  EXPECT_TRUE(out[1].parts[2].empty());
  EXPECT_EQ(d.buffered(), 0u);
}

TEST(Frame, RecycledPartsAreReusedForLaterLargeParts) {
  // Frames with one large part each, read as the channel reads them; each part handed back with
  // recycle() once "handled". Later parts of the same or a smaller size land in that memory.
  auto run = [](FrameDecoder& d, std::span<const std::byte> payload) {
    std::vector<std::span<const std::byte>> parts{payload};
    auto frames = read_like_channel(d, encode_frame(FrameHeader{}, parts));
    EXPECT_EQ(frames.size(), 1u);
    return std::move(frames.at(0));
  };
  std::vector<std::byte> a(1u << 20, std::byte{0xa1}), b((1u << 20) - 100, std::byte{0xb2});
  FrameDecoder d;
  Frame f1 = run(d, a);
  ASSERT_TRUE(f1.parts[0] == a);
  const std::byte* mem = f1.parts[0].data();
  d.recycle(std::move(f1.parts[0]));
  EXPECT_GE(d.spare_bytes(), a.size());
  Frame f2 = run(d, b);
  EXPECT_EQ(d.spare_bytes(), 0u);
  EXPECT_EQ(f2.parts[0].data(), mem);  // the recycled buffer, not a fresh one
  EXPECT_TRUE(f2.parts[0] == b);       // holding exactly the new part
  // A part larger than the spare can hold gets its own buffer.
  std::vector<std::byte> c(3u << 20, std::byte{0xc3});
  d.recycle(std::move(f2.parts[0]));
  Frame f3 = run(d, c);
  EXPECT_TRUE(f3.parts[0] == c);
  EXPECT_GE(d.spare_bytes(), a.size());  // still kept for a part it fits
  // Small buffers, and more than kMaxSpareBytes in all, are not kept.
  d.recycle(std::vector<std::byte>(100));
  d.recycle(std::vector<std::byte>(FrameDecoder::kMaxSpareBytes));
  EXPECT_LT(d.spare_bytes(), 2 * a.size());
}

}  // namespace
}  // namespace monarch::wire
