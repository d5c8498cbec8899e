#include "monarch/wire/frame.hpp"

#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace monarch::wire {
namespace {

static_assert(kFrameHeaderSize == 4 + 2 + 1 + 1 + 8 + 8 + 8 + 4 + 4);

// Little-endian loads/stores through memcpy: no alignment or aliasing assumptions. These compile to
// single moves on little-endian targets.
template <class T>
void store_le(std::byte* p, T v) noexcept {
  unsigned char b[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    b[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
  }
  std::memcpy(p, b, sizeof(T));
}

template <class T>
T load_le(const std::byte* p) noexcept {
  unsigned char b[sizeof(T)];
  std::memcpy(b, p, sizeof(T));
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
  }
  return static_cast<T>(v);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

void write_header(std::byte* p, const FrameHeader& h, std::uint32_t num_parts,
                  std::uint32_t body_len) noexcept {
  store_le<std::uint32_t>(p + 0, kFrameMagic);
  store_le<std::uint16_t>(p + 4, kFrameVersion);
  store_le<std::uint8_t>(p + 6, static_cast<std::uint8_t>(h.kind));
  store_le<std::uint8_t>(p + 7, h.flags);
  store_le<std::uint64_t>(p + 8, h.session_id);
  store_le<std::uint64_t>(p + 16, h.incarnation);
  store_le<std::uint64_t>(p + 24, h.seq);
  store_le<std::uint32_t>(p + 32, num_parts);
  store_le<std::uint32_t>(p + 36, body_len);
}

}  // namespace

std::string to_string(FrameKind kind) {
  switch (kind) {
    case FrameKind::Hello:
      return "Hello";
    case FrameKind::Auth:
      return "Auth";
    case FrameKind::Accept:
      return "Accept";
    case FrameKind::Reject:
      return "Reject";
    case FrameKind::Data:
      return "Data";
    case FrameKind::Ack:
      return "Ack";
    case FrameKind::Heartbeat:
      return "Heartbeat";
    case FrameKind::Close:
      return "Close";
  }
  return "Unknown(" + std::to_string(static_cast<unsigned>(kind)) + ")";
}

bool is_valid_frame_kind(std::uint8_t v) noexcept {
  return v >= static_cast<std::uint8_t>(FrameKind::Hello) &&
         v <= static_cast<std::uint8_t>(FrameKind::Close);
}

std::vector<std::span<const std::byte>> Frame::part_spans() const {
  std::vector<std::span<const std::byte>> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.emplace_back(p);
  return out;
}

std::size_t encoded_size(Parts parts) noexcept {
  std::size_t n = kFrameHeaderSize + 4 * parts.size();
  for (auto p : parts) n += p.size();
  return n;
}

std::size_t encode_prefix(const FrameHeader& header, Parts parts, std::vector<std::byte>& out) {
  constexpr auto kMax32 = std::numeric_limits<std::uint32_t>::max();
  if (parts.size() > kMax32) {
    throw FrameError("frame: num_parts " + std::to_string(parts.size()) + " exceeds " +
                     std::to_string(kMax32));
  }
  std::uint64_t body = 4 * static_cast<std::uint64_t>(parts.size());
  for (auto p : parts) {
    if (p.size() > kMax32 || (body += p.size()) > kMax32) {
      throw FrameError("frame: body_len exceeds " + std::to_string(kMax32) + " (" +
                       std::to_string(parts.size()) + " parts)");
    }
  }
  const std::size_t prefix = kFrameHeaderSize + 4 * parts.size();
  const std::size_t start = out.size();
  out.resize(start + prefix);
  std::byte* p = out.data() + start;
  write_header(p, header, static_cast<std::uint32_t>(parts.size()),
               static_cast<std::uint32_t>(body));
  p += kFrameHeaderSize;
  for (auto part : parts) {
    store_le<std::uint32_t>(p, static_cast<std::uint32_t>(part.size()));
    p += 4;
  }
  return prefix;
}

std::vector<std::byte> encode_frame(const FrameHeader& header, Parts parts) {
  std::vector<std::byte> out;
  out.reserve(encoded_size(parts));
  encode_prefix(header, parts, out);
  for (auto part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<std::byte> encode_frame(const Frame& frame) {
  const auto spans = frame.part_spans();
  return encode_frame(frame.header, spans);
}

FrameHeader parse_header_unchecked(std::span<const std::byte> bytes) {
  if (bytes.size() < kFrameHeaderSize) {
    throw FrameError("frame: header needs " + std::to_string(kFrameHeaderSize) + " bytes, got " +
                     std::to_string(bytes.size()));
  }
  const std::byte* p = bytes.data();
  FrameHeader h;
  h.kind = static_cast<FrameKind>(load_le<std::uint8_t>(p + 6));
  h.flags = load_le<std::uint8_t>(p + 7);
  h.session_id = load_le<std::uint64_t>(p + 8);
  h.incarnation = load_le<std::uint64_t>(p + 16);
  h.seq = load_le<std::uint64_t>(p + 24);
  h.num_parts = load_le<std::uint32_t>(p + 32);
  h.body_len = load_le<std::uint32_t>(p + 36);
  return h;
}

FrameDecoder::FrameDecoder(DecoderLimits limits) : limits_(limits) {}

void FrameDecoder::fail(std::string msg) {
  error_ = msg;
  buf_.clear();
  buf_.shrink_to_fit();
  pos_ = 0;
  throw FrameError(std::move(msg));
}

void FrameDecoder::compact() {
  if (pos_ == 0) return;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ >= buf_.size() - pos_) {
    // The consumed prefix is at least as large as what remains: moving the tail is cheap relative
    // to the work already done on the prefix (amortised O(1) per byte).
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
}

void FrameDecoder::feed(std::span<const std::byte> bytes) {
  if (error_ || bytes.empty()) return;
  if (direct_ && !direct_complete()) bytes = bytes.subspan(absorb(bytes));
  if (bytes.empty()) return;
  compact();
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

std::size_t FrameDecoder::absorb(std::span<const std::byte> bytes) {
  std::size_t used = 0;
  while (direct_part_ < direct_lens_.size()) {
    auto& part = direct_->parts[direct_part_];
    const std::size_t len = direct_lens_[direct_part_];
    if (direct_off_ == len) {  // part complete (or empty): next one
      ++direct_part_;
      direct_off_ = 0;
      continue;
    }
    if (used == bytes.size()) break;
    if (part.size() != len) place(part, len);  // allocated when its first byte arrives
    const std::size_t n = std::min(len - direct_off_, bytes.size() - used);
    std::memcpy(part.data() + direct_off_, bytes.data() + used, n);
    direct_off_ += n;
    used += n;
  }
  direct_filled_ += used;
  return used;
}

std::span<std::byte> FrameDecoder::direct_buffer() {
  if (error_ || !direct_) return {};
  absorb({});  // skips finished and empty parts
  if (direct_complete()) return {};
  auto& part = direct_->parts[direct_part_];
  const std::size_t len = direct_lens_[direct_part_];
  if (part.size() != len) place(part, len);
  return {part.data() + direct_off_, len - direct_off_};
}

void FrameDecoder::place(std::vector<std::byte>& part, std::size_t len) {
  if (part.capacity() < len) {
    for (std::size_t i = 0; i < spares_.size(); ++i) {
      if (spares_[i].capacity() < len) continue;
      spare_bytes_ -= spares_[i].capacity();
      part.swap(spares_[i]);
      spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  part.resize(len);
}

void FrameDecoder::recycle(std::vector<std::byte>&& part) {
  const std::size_t cap = part.capacity();
  if (cap < limits_.direct_min_bytes || spare_bytes_ + cap > kMaxSpareBytes) return;
  part.clear();
  spare_bytes_ += cap;
  spares_.push_back(std::move(part));
}

void FrameDecoder::commit_direct(std::size_t n) {
  if (!direct_ || direct_complete()) return;
  const std::size_t room = direct_lens_[direct_part_] - direct_off_;
  if (n > room) n = room;
  direct_off_ += n;
  direct_filled_ += n;
  absorb({});
}

std::optional<Frame> FrameDecoder::next() {
  if (error_) throw FrameError(*error_);
  if (direct_) {
    absorb({});
    if (!direct_complete()) return std::nullopt;
    Frame f = std::move(*direct_);
    direct_.reset();
    direct_lens_.clear();
    direct_filled_ = 0;
    return f;
  }
  const std::size_t avail = buf_.size() - pos_;
  const std::byte* base = buf_.data() + pos_;

  if (!header_) {
    if (avail < kFrameHeaderSize) return std::nullopt;
    const auto magic = load_le<std::uint32_t>(base + 0);
    if (magic != kFrameMagic) fail("frame: bad magic " + hex32(magic));
    const auto version = load_le<std::uint16_t>(base + 4);
    if (version != kFrameVersion) fail("frame: unsupported version " + std::to_string(version));
    const auto kind = load_le<std::uint8_t>(base + 6);
    if (!is_valid_frame_kind(kind)) fail("frame: unknown kind " + std::to_string(kind));
    FrameHeader h = parse_header_unchecked({base, kFrameHeaderSize});
    if (h.num_parts > limits_.max_parts) {
      fail("frame: num_parts " + std::to_string(h.num_parts) + " exceeds " +
           std::to_string(limits_.max_parts));
    }
    if (h.body_len > limits_.max_frame_bytes) {
      fail("frame: body_len " + std::to_string(h.body_len) + " exceeds max_frame_bytes " +
           std::to_string(limits_.max_frame_bytes));
    }
    if (4 * static_cast<std::uint64_t>(h.num_parts) > h.body_len) {
      fail("frame: num_parts " + std::to_string(h.num_parts) + " needs a " +
           std::to_string(4 * static_cast<std::uint64_t>(h.num_parts)) +
           "-byte length table but body_len is " + std::to_string(h.body_len));
    }
    header_ = h;
    table_checked_ = false;
    // No reserve of body_len here: a peer must not make us allocate 64 MiB with 40 bytes; the
    // buffer grows geometrically as the body actually arrives.
  }

  const FrameHeader& h = *header_;
  const std::size_t table_bytes = 4 * static_cast<std::size_t>(h.num_parts);
  if (!table_checked_) {
    if (avail < kFrameHeaderSize + table_bytes) return std::nullopt;
    std::uint64_t sum = 0;
    const std::byte* t = base + kFrameHeaderSize;
    for (std::uint32_t i = 0; i < h.num_parts; ++i) sum += load_le<std::uint32_t>(t + 4 * i);
    const std::uint64_t data_bytes = h.body_len - table_bytes;
    if (sum != data_bytes) {
      fail("frame: part lengths sum to " + std::to_string(sum) + " but body has " +
           std::to_string(data_bytes) + " bytes");
    }
    table_checked_ = true;
  }

  const std::size_t total = kFrameHeaderSize + h.body_len;
  if (avail < total && h.body_len - table_bytes >= limits_.direct_min_bytes) {
    // Large frame: assemble its parts in place from here on.
    direct_.emplace();
    direct_->header = h;
    direct_->parts.resize(h.num_parts);
    direct_lens_.resize(h.num_parts);
    const std::byte* t = base + kFrameHeaderSize;
    for (std::uint32_t i = 0; i < h.num_parts; ++i)
      direct_lens_[i] = load_le<std::uint32_t>(t + 4 * i);
    direct_part_ = 0;
    direct_off_ = 0;
    direct_header_ = kFrameHeaderSize + table_bytes;
    direct_filled_ = direct_header_;
    pos_ += direct_header_;
    header_.reset();
    table_checked_ = false;
    pos_ += absorb({buf_.data() + pos_, buf_.size() - pos_});
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    return next();
  }
  if (avail < total) return std::nullopt;

  Frame f;
  f.header = h;
  f.parts.resize(h.num_parts);
  const std::byte* t = base + kFrameHeaderSize;
  const std::byte* d = t + table_bytes;
  for (std::uint32_t i = 0; i < h.num_parts; ++i) {
    const auto len = load_le<std::uint32_t>(t + 4 * i);
    f.parts[i].assign(d, d + len);
    d += len;
  }
  pos_ += total;
  header_.reset();
  table_checked_ = false;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return f;
}

}  // namespace monarch::wire
