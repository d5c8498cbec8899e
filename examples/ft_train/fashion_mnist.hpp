// Fashion-MNIST for the ft_train example: loading the gzipped IDX files of Debian's
// dataset-fashion-mnist, and a deterministic sampler that shards each global batch across the
// participating replica groups. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace monarch::ft::example {

/// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kImageSide = 28;
inline constexpr int kImagePixels = kImageSide * kImageSide;  // 784
inline constexpr int kClasses = 10;

/// The data is missing or malformed. what() names the file and, when files are absent, the
/// package to install.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Split { train, test };

/// One split in memory. Copies are cheap and share the pixels (head() too).
struct Dataset {
  std::int64_t size = 0;  // N images
  /// N x 784 raw pixel values 0..255, row-major 28x28: the IDX file's bytes (read-only; may map
  /// the decoded cache file). The model's input is normalized(pixel).
  std::span<const std::uint8_t> pixels;
  std::vector<std::uint8_t> labels;     // N, each 0..9
  std::shared_ptr<const void> storage;  // keeps `pixels` alive

  /// The normalized input value of a pixel: (v / 255 - 0.2860) / 0.3530, as a float.
  static float normalized(std::uint8_t v) noexcept { return kNormalized.at(v); }
  /// The first n (clamped to 0..size) samples, sharing the pixels.
  Dataset head(std::int64_t n) const;

 private:
  static const std::array<float, 256> kNormalized;
};

/// Reads <dir>/train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz (60000 images) or the
/// t10k-* pair (10000 images). Validates magic numbers (0x803 images, 0x801 labels), 28x28
/// dimensions, matching counts, exact file lengths and label range. Throws DatasetError; when
/// the directory or a file is absent the message says `apt-get install dataset-fashion-mnist`.
///
/// Gunzipping both splits and normalizing them took ~0.5 s of CPU, which every respawned group
/// paid again. So a decoded file of 1 MiB or more is kept in a cache directory and mapped
/// (read-only, shared by every process of the host) on later loads: $MONARCH_DATA_CACHE, else
/// $XDG_CACHE_HOME/monarch, else $HOME/.cache/monarch; MONARCH_DATA_CACHE set to "" turns the
/// cache off. A cache entry is named by the source's path, size, mtime and gzip trailer (CRC-32
/// and length of the decoded bytes), so a changed source never hits a stale entry; entries are
/// written to a temporary file and renamed (concurrent loaders are safe). A cache that cannot be
/// written only costs the decode. Any thread.
Dataset load_fashion_mnist(const std::string& dir, Split split);

/// The global data stream: epoch e is a permutation of 0..N-1 drawn from (seed, e); position p
/// (samples consumed since the start, the FlatState data_position) maps to sample
/// perm_{p / N}[p % N]. Replicas that agree on (seed, position) agree on the batch, so a healed
/// replica continues at its donor's position. Not thread-safe (caches one permutation).
class Sampler {
 public:
  Sampler(std::int64_t dataset_size, std::uint64_t seed);

  /// The sample indices replica group `replica` of `replicas` trains on in the global batch
  /// [position, position + global_batch): the contiguous share
  /// [global_batch * replica / replicas, global_batch * (replica + 1) / replicas) of it, so
  /// shares are disjoint, cover the batch, and differ in size by at most one.
  /// Throws std::invalid_argument unless 0 <= replica < replicas and global_batch >= replicas.
  std::vector<std::int64_t> shard(std::int64_t position, std::int64_t global_batch, int replica,
                                  int replicas);

  /// The sample at stream position `position`.
  std::int64_t at(std::int64_t position);

 private:
  const std::vector<std::int64_t>& permutation(std::int64_t epoch);

  std::int64_t size_;
  std::uint64_t seed_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> perm_;
};

}  // namespace monarch::ft::example
