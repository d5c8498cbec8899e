// English text for `ft_train --model llama-tiny`: the fortunes of Debian's `fortunes` and
// `fortunes-min` packages as byte streams (a byte-level tokenizer: token = byte, vocabulary 256),
// a deterministic train / held-out split, and a seeded sampler of fixed-length byte windows that
// shards each global batch across the replica groups. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"  // DatasetError, Sampler

namespace monarch::ft::example {

/// Where Debian's fortunes packages put their text files.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
/// Tokens are bytes.
inline constexpr int kByteVocab = 256;
/// Ends every fortune in the streams (the "%" separator lines are dropped). Byte 0 never occurs
/// in the text, so the model can learn where a fortune ends.
inline constexpr std::uint8_t kEndOfText = 0;
/// Fortune k (counted over all files in name order, from 0) is held out when
/// k % kHeldOutEvery == kHeldOutEvery - 1: every 20th fortune, 5 % of the corpus.
inline constexpr int kHeldOutEvery = 20;

/// The corpus in memory: each split is the concatenation of its fortunes, each fortune's lines
/// joined by '\n' (with a final '\n') and followed by kEndOfText.
struct TextCorpus {
  std::vector<std::uint8_t> train;
  std::vector<std::uint8_t> heldout;
  std::int64_t files = 0;             ///< text files read
  std::int64_t train_fortunes = 0;    ///< fortunes in `train`
  std::int64_t heldout_fortunes = 0;  ///< fortunes in `heldout`
};

/// Reads every plain text file of `dir` in name order: regular files only (not symlinks, such as
/// the packages' *.u8 links, nor subdirectories), skipping the *.dat index files and *.u8 names.
/// A fortune is the run of lines between lines holding only "%" (a trailing '\r' is ignored);
/// fortunes that are empty or only whitespace are skipped and not counted. Throws DatasetError
/// when `dir` is missing, holds no text file or too few fortunes to hold one out (the message
/// says `apt-get install fortunes fortunes-min`), or a file cannot be read or holds a NUL byte
/// (not text, e.g. a --data meant for another model; the message names the file).
/// Takes ~10 ms for the 2.5 MB of the two packages (43 files, 15217 fortunes).
TextCorpus load_fortunes(const std::string& dir = kFortunesDir);

/// Byte frequencies of `text` (256 counts).
std::array<std::int64_t, kByteVocab> byte_counts(const std::vector<std::uint8_t>& text);

/// The baseline a byte-level model must beat: the perplexity exp(mean NLL) of the byte unigram
/// model estimated on `train` (add-one smoothed, so every byte has a finite NLL) over the bytes a
/// model predicts in `heldout` windows (the targets of TextWindows(heldout, seq_len)).
double unigram_perplexity(const std::vector<std::uint8_t>& train,
                          const std::vector<std::uint8_t>& heldout, int seq_len);

/// A stream cut into windows of seq_len + 1 bytes with stride seq_len: window i covers bytes
/// [i * seq_len, i * seq_len + seq_len], so inputs are its first seq_len bytes and targets its
/// last seq_len bytes, and consecutive windows predict every byte after the first exactly once.
class TextWindows {
 public:
  /// Throws std::invalid_argument unless seq_len >= 1 and the stream holds one window at least.
  TextWindows(std::int64_t stream_bytes, int seq_len);
  std::int64_t count() const noexcept { return count_; }
  int seq_len() const noexcept { return seq_len_; }
  /// The first byte of window `i`. Throws std::out_of_range unless 0 <= i < count().
  std::int64_t offset(std::int64_t i) const;

 private:
  std::int64_t count_;
  int seq_len_;
};

/// The global data stream over the windows of the train split, like fashion_mnist.hpp's Sampler
/// over images: epoch e is a permutation of the windows drawn from (seed, e) alone; stream
/// position p (sequences consumed since the start, the FlatState data_position) maps to window
/// perm_{p / W}[p % W]. Replicas that agree on (seed, position) agree on the batch, so a healed
/// replica continues at its donor's position. Not thread-safe (caches one permutation).
class TextSampler {
 public:
  TextSampler(TextWindows windows, std::uint64_t seed);

  /// The window offsets share `slot` of `slots` trains on in the global batch
  /// [position, position + global_batch): the contiguous share
  /// [global_batch * slot / slots, global_batch * (slot + 1) / slots), so shares are disjoint,
  /// cover the batch and differ in size by at most one. Throws std::invalid_argument unless
  /// 0 <= slot < slots <= global_batch and position >= 0.
  std::vector<std::int64_t> shard(std::int64_t position, std::int64_t global_batch, int slot,
                                  int slots);

  /// The window index at stream position `position` (>= 0).
  std::int64_t at(std::int64_t position);

  const TextWindows& windows() const noexcept { return windows_; }

 private:
  TextWindows windows_;
  Sampler order_;  // the same seeded stream as the MLP's images, over window indices
};

}  // namespace monarch::ft::example
