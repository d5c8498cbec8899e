// Fashion-MNIST for the ft_train example: loading the gzipped IDX files of Debian's
// dataset-fashion-mnist, and a deterministic sampler that shards each global batch across the
// participating replica groups. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
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

/// One split in memory.
struct Dataset {
  std::int64_t size = 0;      // N images
  std::vector<float> images;  // N x 784, row-major 28x28, normalized (x/255 - 0.2860) / 0.3530
  std::vector<std::uint8_t> labels;  // N, each 0..9
};

/// Reads <dir>/train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz (60000 images) or the
/// t10k-* pair (10000 images). Validates magic numbers (0x803 images, 0x801 labels), 28x28
/// dimensions, matching counts, exact file lengths and label range. Throws DatasetError; when
/// the directory or a file is absent the message says `apt-get install dataset-fashion-mnist`.
/// Takes ~0.5 s for the training split (gunzip).
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
