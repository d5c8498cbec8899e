#pragma once
// monarch::wire framing: length-prefixed, multipart frames on a byte stream.
//
// Wire format (all integers little-endian, no padding, 40-byte fixed header):
//
//   offset size field
//        0    4 magic        kFrameMagic = 0x4D4E5243, i.e. the bytes 'C','R','N','M' on the wire
//        4    2 version      kFrameVersion = 1
//        6    1 kind         FrameKind
//        7    1 flags        opaque to this layer (carried unchanged)
//        8    8 session_id
//       16    8 incarnation
//       24    8 seq          Data: sequence number of this message; Ack: highest seq delivered
//       32    4 num_parts
//       36    4 body_len     = 4*num_parts + sum of part lengths
//       40      body: num_parts uint32 part lengths, then the parts' bytes back to back
//
// Multipart frames let large byte payloads go out with writev and no copy: encode_prefix() writes
// the header plus the length table; the caller then writes [prefix, part0, part1, ...].
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/error.hpp"

namespace monarch::wire {

inline constexpr std::uint32_t kFrameMagic = 0x4D4E5243;  // bytes on the wire: 'C','R','N','M'
inline constexpr std::uint16_t kFrameVersion = 1;
inline constexpr std::size_t kFrameHeaderSize = 40;

enum class FrameKind : std::uint8_t {
  Hello = 1,
  Auth = 2,
  Accept = 3,
  Reject = 4,
  Data = 5,
  Ack = 6,
  Heartbeat = 7,
  Close = 8,
};

// "Hello", "Data", ...; "Unknown(42)" for a value outside the enum.
std::string to_string(FrameKind kind);
// True for the values listed in FrameKind.
bool is_valid_frame_kind(std::uint8_t v) noexcept;

struct FrameHeader {
  FrameKind kind = FrameKind::Data;
  std::uint8_t flags = 0;
  std::uint64_t session_id = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t seq = 0;
  // Filled in by the encoder from the parts (values passed in are ignored); set by the decoder.
  std::uint32_t num_parts = 0;
  std::uint32_t body_len = 0;

  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// A decoded frame. Owns its bytes: each part is its own vector (one copy out of the stream buffer),
// so a Frame can be moved, copied and kept after the decoder is gone or fed more bytes.
struct Frame {
  FrameHeader header;
  std::vector<std::vector<std::byte>> parts;

  // The parts as spans, e.g. to re-encode.
  std::vector<std::span<const std::byte>> part_spans() const;
  friend bool operator==(const Frame&, const Frame&) = default;
};

// Malformed input (decoder) or a frame that cannot be represented (encoder). The message names the
// field and the bad value, e.g. "frame: bad magic 0x41414141".
class FrameError : public monarch::Error {
 public:
  explicit FrameError(const std::string& message) : monarch::Error(ErrorCode::Frame, message) {}
};

using Parts = std::span<const std::span<const std::byte>>;

// Appends the 40-byte header plus the 4*parts.size() length table to `out` and returns the number
// of bytes appended. header.num_parts/body_len are computed from `parts`. Throws FrameError when
// there are more than 2^32-1 parts or the body would not fit body_len's uint32.
std::size_t encode_prefix(const FrameHeader& header, Parts parts, std::vector<std::byte>& out);

// Header + length table + all parts in one buffer (tests, small control frames).
std::vector<std::byte> encode_frame(const FrameHeader& header, Parts parts = {});
std::vector<std::byte> encode_frame(const Frame& frame);

// Total encoded size of a frame with these parts (header + table + parts).
std::size_t encoded_size(Parts parts) noexcept;

struct DecoderLimits {
  std::size_t max_frame_bytes = std::size_t{64} << 20;  // limit on body_len
  std::uint32_t max_parts = 4096;
  // Frames whose parts total at least this many bytes are assembled in place: once the header and
  // length table are validated, each part is allocated at its final size and filled directly
  // (see FrameDecoder::direct_buffer), so large payloads are never copied through the stream
  // buffer.
  std::size_t direct_min_bytes = std::size_t{64} << 10;
};

// Incremental decoder for a byte stream. Not thread-safe.
//
// feed() appends bytes; next() returns the next complete frame, or nullopt when more bytes are
// needed. The header (magic, version, kind, num_parts, body_len against the limits) is validated as
// soon as its 40 bytes are buffered, and the length table as soon as it is buffered, so an
// oversize or inconsistent frame is rejected before its body arrives. On malformed input next()
// throws FrameError and the decoder is poisoned: every later next() throws the same error and
// feed() discards its input.
//
// Buffering: consumed bytes are dropped lazily (when everything is consumed, or when the consumed
// prefix is at least half the buffer), so a stream of frames is not re-copied per frame.
class FrameDecoder {
 public:
  explicit FrameDecoder(DecoderLimits limits = {});

  void feed(std::span<const std::byte> bytes);
  std::optional<Frame> next();

  // Bytes fed but not yet returned as frames (including those already placed into the parts of
  // a large frame being assembled in place).
  std::size_t buffered() const noexcept { return buf_.size() - pos_ + direct_filled_; }

  // While a large frame is being assembled in place: the unfilled rest of its current part, where
  // the caller may read the next bytes of the stream directly (then call commit_direct(n)).
  // Empty otherwise: read into your own buffer and feed() it.
  std::span<std::byte> direct_buffer();
  // Records that the first n bytes of direct_buffer() now hold stream bytes (n <= its size).
  void commit_direct(std::size_t n);
  // Hands back a large part of a frame this decoder returned, once the caller is done with it:
  // a later large part of the same or smaller size is read into it, so a stream of large frames
  // reuses warm memory instead of faulting in fresh pages. Keeps at most kMaxSpareBytes in all;
  // anything else is freed.
  void recycle(std::vector<std::byte>&& part);
  static constexpr std::size_t kMaxSpareBytes = std::size_t{8} << 20;
  // Bytes of capacity held in recycled buffers not yet reused.
  std::size_t spare_bytes() const noexcept { return spare_bytes_; }
  bool poisoned() const noexcept { return error_.has_value(); }
  const DecoderLimits& limits() const noexcept { return limits_; }

 private:
  [[noreturn]] void fail(std::string msg);
  void compact();

  DecoderLimits limits_;
  std::vector<std::byte> buf_;
  std::size_t pos_ = 0;  // start of the first unconsumed byte in buf_
  // State of the frame at pos_ once its header/length table have been validated.
  std::optional<FrameHeader> header_;
  bool table_checked_ = false;
  std::optional<std::string> error_;
  // In-place assembly of a large frame (header and table already consumed from buf_).
  std::size_t absorb(std::span<const std::byte> bytes);
  bool direct_complete() const noexcept { return direct_ && direct_part_ == direct_lens_.size(); }
  // Sizes a part of the frame being assembled in place to len, from a spare buffer if one fits.
  void place(std::vector<std::byte>& part, std::size_t len);
  std::optional<Frame> direct_;
  std::vector<std::vector<std::byte>> spares_;
  std::size_t spare_bytes_ = 0;
  std::vector<std::uint32_t> direct_lens_;
  std::size_t direct_part_ = 0;    // part being filled
  std::size_t direct_off_ = 0;     // bytes of it filled
  std::size_t direct_header_ = 0;  // header + table bytes of the frame (for buffered())
  std::size_t direct_filled_ = 0;  // header + table + part bytes received so far
};

// Parses a 40-byte header without validating it (no magic/version/kind checks). `bytes` must hold
// at least kFrameHeaderSize bytes (throws FrameError otherwise).
FrameHeader parse_header_unchecked(std::span<const std::byte> bytes);

}  // namespace monarch::wire
