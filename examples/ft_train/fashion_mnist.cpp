// Fashion-MNIST loader and sampler (fashion_mnist.hpp).
#include "fashion_mnist.hpp"

#include <zlib.h>

#include <filesystem>
#include <memory>

namespace monarch::ft::example {

namespace {

std::vector<unsigned char> gunzip(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw DatasetError("Fashion-MNIST file " + path +
                       " is missing: install it with `apt-get install dataset-fashion-mnist` "
                       "(or `make deps`)");
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DatasetError("cannot open " + path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      throw DatasetError(path + ": gzip error: " + gzerror(f, &err));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  return out;
}

std::uint32_t be32(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | std::uint32_t{b[at + 3]};
}

}  // namespace

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  if (!std::filesystem::is_directory(dir)) {
    throw DatasetError("Fashion-MNIST directory " + dir +
                       " does not exist: install the data with `apt-get install "
                       "dataset-fashion-mnist` (or `make deps`)");
  }
  const std::string stem = split == Split::train ? "train" : "t10k";
  const std::string images_path = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  auto images = gunzip(images_path);
  auto labels = gunzip(labels_path);
  if (images.size() < 16 || be32(images, 0) != 0x803) {
    throw DatasetError(images_path + ": not an IDX image file (magic 0x803 expected)");
  }
  if (labels.size() < 8 || be32(labels, 0) != 0x801) {
    throw DatasetError(labels_path + ": not an IDX label file (magic 0x801 expected)");
  }
  const std::uint32_t n = be32(images, 4);
  if (be32(images, 8) != kImageSide || be32(images, 12) != kImageSide) {
    throw DatasetError(images_path + ": images are not 28x28");
  }
  if (be32(labels, 4) != n) {
    throw DatasetError(labels_path + ": " + std::to_string(be32(labels, 4)) + " labels for " +
                       std::to_string(n) + " images");
  }
  if (images.size() != 16 + std::size_t{n} * kImagePixels) {
    throw DatasetError(images_path + ": " + std::to_string(images.size()) +
                       " bytes after gunzip, expected " +
                       std::to_string(16 + std::size_t{n} * kImagePixels));
  }
  if (labels.size() != 8 + std::size_t{n}) {
    throw DatasetError(labels_path + ": " + std::to_string(labels.size()) +
                       " bytes after gunzip, expected " + std::to_string(8 + std::size_t{n}));
  }
  Dataset d;
  d.size = n;
  d.labels.assign(labels.begin() + 8, labels.end());
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] >= kClasses) {
      throw DatasetError(labels_path + ": label " + std::to_string(d.labels[i]) + " at index " +
                         std::to_string(i) + " is out of range 0..9");
    }
  }
  d.images.resize(std::size_t{n} * kImagePixels);
  for (std::size_t i = 0; i < d.images.size(); ++i) {
    d.images[i] = (static_cast<float>(images[16 + i]) / 255.0f - 0.2860f) / 0.3530f;
  }
  return d;
}

}  // namespace monarch::ft::example
