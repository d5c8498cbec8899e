// Fashion-MNIST loader and sampler (fashion_mnist.hpp).
#include "fashion_mnist.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

namespace monarch::ft::example {

namespace {

namespace fs = std::filesystem;

// Decoded bytes, owned by a vector or by a read-only mapping of a cache file.
struct Bytes {
  std::shared_ptr<const void> hold;
  const unsigned char* data = nullptr;
  std::size_t size = 0;
};

Bytes own(std::vector<unsigned char> v) {
  auto p = std::make_shared<std::vector<unsigned char>>(std::move(v));
  return {p, p->data(), p->size()};
}

// Decoded files smaller than this are not worth a cache entry (and tests write many tiny ones).
constexpr std::size_t kMinCached = std::size_t{1} << 20;

std::vector<unsigned char> gunzip(const std::string& path, std::size_t size_hint) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw DatasetError("cannot open " + path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  gzbuffer(f, 1 << 17);
  std::vector<unsigned char> out;
  out.reserve(std::min<std::size_t>(size_hint, std::size_t{1} << 28));  // a trailer can lie
  std::size_t used = 0;
  while (true) {
    if (out.size() - used < (1 << 16)) out.resize(std::max<std::size_t>(out.size() * 2, 1 << 20));
    int n = gzread(
        f, out.data() + used,
        static_cast<unsigned>(std::min<std::size_t>(out.size() - used, std::size_t{1} << 30)));
    if (n < 0) {
      int err = 0;
      throw DatasetError(path + ": gzip error: " + gzerror(f, &err));
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  out.resize(used);
  return out;
}

std::filesystem::path cache_dir() {
  if (const char* d = std::getenv("MONARCH_DATA_CACHE")) return d;  // "" = off
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    return fs::path(x) / "monarch";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != 0)
    return fs::path(h) / ".cache" / "monarch";
  return {};
}

// The cache entry for `gz` (empty: no cache), and the decoded length its gzip trailer promises
// (mod 2^32, RFC 1952).
std::pair<fs::path, std::uint32_t> cache_entry(const std::string& gz) {
  struct stat st {};
  if (::stat(gz.c_str(), &st) != 0 || st.st_size < 18) return {};
  unsigned char t[8];
  std::FILE* f = std::fopen(gz.c_str(), "rb");
  if (f == nullptr) return {};
  bool ok = std::fseek(f, -8, SEEK_END) == 0 && std::fread(t, 1, 8, f) == 8;
  std::fclose(f);
  if (!ok) return {};
  auto le32 = [&](int at) {
    return std::uint32_t{t[at]} | (std::uint32_t{t[at + 1]} << 8) |
           (std::uint32_t{t[at + 2]} << 16) | (std::uint32_t{t[at + 3]} << 24);
  };
  std::uint32_t crc = le32(0), isize = le32(4);
  fs::path dir = cache_dir();
  if (dir.empty() || isize < kMinCached) return {fs::path(), isize};
  std::error_code ec;
  fs::path abs = fs::absolute(gz, ec);
  char name[160];
  std::snprintf(name, sizeof name, "%016zx-%lld-%lld.%09ld-%08x",
                std::hash<std::string>{}(abs.string()), static_cast<long long>(st.st_size),
                static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec, crc);
  return {dir / (fs::path(gz).stem().string() + "." + name), isize};
}

// The mapped cache entry, if it is there and has the promised length.
std::optional<Bytes> map_cached(const fs::path& entry, std::uint32_t isize) {
  int fd = ::open(entry.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && static_cast<std::uint32_t>(st.st_size) == isize) {
    p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED) return std::nullopt;
  auto n = static_cast<std::size_t>(st.st_size);
  std::shared_ptr<const void> hold(p, [n](const void* q) { ::munmap(const_cast<void*>(q), n); });
  return Bytes{std::move(hold), static_cast<const unsigned char*>(p), n};
}

// Best effort: a cache that cannot be written only costs the next loader a decode.
void write_cached(const fs::path& entry, const std::vector<unsigned char>& bytes) {
  std::error_code ec;
  fs::create_directories(entry.parent_path(), ec);
  fs::path tmp = entry;
  tmp += ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return;
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (ok) fs::rename(tmp, entry, ec);
  if (!ok || ec) fs::remove(tmp, ec);
}

// The decoded bytes of `path`: from the cache when it holds them, else gunzipped (and cached).
Bytes decoded(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw DatasetError("Fashion-MNIST file " + path +
                       " is missing: install it with `apt-get install dataset-fashion-mnist` "
                       "(or `make deps`)");
  }
  auto [entry, isize] = cache_entry(path);
  if (!entry.empty()) {
    if (auto hit = map_cached(entry, isize)) return std::move(*hit);
  }
  auto bytes = gunzip(path, isize);
  if (!entry.empty() && static_cast<std::uint32_t>(bytes.size()) == isize)
    write_cached(entry, bytes);
  return own(std::move(bytes));
}

std::uint32_t be32(const Bytes& b, std::size_t at) {
  return (std::uint32_t{b.data[at]} << 24) | (std::uint32_t{b.data[at + 1]} << 16) |
         (std::uint32_t{b.data[at + 2]} << 8) | std::uint32_t{b.data[at + 3]};
}

}  // namespace

const std::array<float, 256> Dataset::kNormalized = [] {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) t[v] = (static_cast<float>(v) / 255.0f - 0.2860f) / 0.3530f;
  return t;
}();

Dataset Dataset::head(std::int64_t n) const {
  Dataset d;
  d.size = std::clamp<std::int64_t>(n, 0, size);
  d.pixels = pixels.first(static_cast<std::size_t>(d.size) * kImagePixels);
  d.labels.assign(labels.begin(), labels.begin() + d.size);
  d.storage = storage;
  return d;
}

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  if (std::filesystem::exists(dir) && !std::filesystem::is_directory(dir)) {
    throw DatasetError("Fashion-MNIST directory " + dir +
                       " is not a directory: --data takes the directory that holds "
                       "train-images-idx3-ubyte.gz and the other three files");
  }
  if (!std::filesystem::is_directory(dir)) {
    throw DatasetError("Fashion-MNIST directory " + dir +
                       " does not exist: install the data with `apt-get install "
                       "dataset-fashion-mnist` (or `make deps`)");
  }
  const std::string stem = split == Split::train ? "train" : "t10k";
  const std::string images_path = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  Bytes images = decoded(images_path);
  Bytes labels = decoded(labels_path);
  if (images.size < 16 || be32(images, 0) != 0x803) {
    throw DatasetError(images_path + ": not an IDX image file (magic 0x803 expected)");
  }
  if (labels.size < 8 || be32(labels, 0) != 0x801) {
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
  if (images.size != 16 + std::size_t{n} * kImagePixels) {
    throw DatasetError(images_path + ": " + std::to_string(images.size) +
                       " bytes after gunzip, expected " +
                       std::to_string(16 + std::size_t{n} * kImagePixels));
  }
  if (labels.size != 8 + std::size_t{n}) {
    throw DatasetError(labels_path + ": " + std::to_string(labels.size) +
                       " bytes after gunzip, expected " + std::to_string(8 + std::size_t{n}));
  }
  Dataset d;
  d.size = n;
  d.labels.assign(labels.data + 8, labels.data + labels.size);
  for (std::size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] >= kClasses) {
      throw DatasetError(labels_path + ": label " + std::to_string(d.labels[i]) + " at index " +
                         std::to_string(i) + " is out of range 0..9");
    }
  }
  d.pixels = {images.data + 16, std::size_t{n} * kImagePixels};
  d.storage = std::move(images.hold);
  return d;
}

}  // namespace monarch::ft::example
