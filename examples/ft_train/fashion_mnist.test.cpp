// Fashion-MNIST loader on the real Debian data and on broken files; the sampler's determinism,
// epoch coverage and disjoint shards.
#include "fashion_mnist.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace ex = monarch::ft::example;
namespace fs = std::filesystem;

namespace {

TEST(FashionMnist, LoadsBothSplitsOfTheRealDataset) {
  if (!fs::exists(ex::kFashionMnistDir)) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  for (auto [split, n] : {std::pair{ex::Split::train, 60000}, std::pair{ex::Split::test, 10000}}) {
    auto d = ex::load_fashion_mnist(ex::kFashionMnistDir, split);
    ASSERT_EQ(d.size, n);
    ASSERT_EQ(d.pixels.size(), static_cast<std::size_t>(n) * 784);
    ASSERT_EQ(d.labels.size(), static_cast<std::size_t>(n));
    std::array<int, 10> per_class{};
    for (auto l : d.labels) {
      ASSERT_LT(l, 10);
      ++per_class[l];
    }
    for (int c : per_class) EXPECT_EQ(c, n / 10) << "Fashion-MNIST is balanced";
    auto [lo, hi] = std::minmax_element(d.pixels.begin(), d.pixels.end());
    EXPECT_NEAR(ex::Dataset::normalized(*lo), (0.0f - 0.2860f) / 0.3530f, 1e-5);
    EXPECT_NEAR(ex::Dataset::normalized(*hi), (1.0f - 0.2860f) / 0.3530f, 1e-5);
  }
}

class BrokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fmnist_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_gz(const std::string& name, const std::vector<unsigned char>& bytes) {
    gzFile f = gzopen((dir_ / name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
  }
  static std::vector<unsigned char> idx(std::uint32_t magic, std::vector<std::uint32_t> dims,
                                        std::size_t payload, unsigned char fill = 0) {
    std::vector<unsigned char> b;
    dims.insert(dims.begin(), magic);
    for (auto v : dims) {
      for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
    }
    b.insert(b.end(), payload, fill);
    return b;
  }
  std::string load_error(ex::Split split = ex::Split::test) {
    try {
      ex::load_fashion_mnist(dir_.string(), split);
    } catch (const ex::DatasetError& e) {
      return e.what();
    }
    return "<no error>";
  }
  fs::path dir_;
};

TEST_F(BrokenData, MissingDirectoryOrFileNamesThePackage) {
  try {
    ex::load_fashion_mnist("/nonexistent/fashion-mnist", ex::Split::train);
    FAIL();
  } catch (const ex::DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"),
              std::string::npos)
        << e.what();
  }
  auto msg = load_error();
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST_F(BrokenData, ValidatesMagicSizesAndLabels) {
  write_gz("t10k-images-idx3-ubyte.gz", idx(0x803, {2, 28, 28}, 2 * 784));
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 2, 3));
  auto ok = ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  EXPECT_EQ(ok.size, 2);
  EXPECT_EQ(ok.labels, (std::vector<std::uint8_t>{3, 3}));

  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x803, {2}, 2));
  EXPECT_NE(load_error().find("magic 0x801"), std::string::npos);
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x801, {3}, 3));
  EXPECT_NE(load_error().find("3 labels for 2 images"), std::string::npos) << load_error();
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 2, 10));
  EXPECT_NE(load_error().find("out of range"), std::string::npos) << load_error();
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 2, 1));
  write_gz("t10k-images-idx3-ubyte.gz", idx(0x803, {2, 28, 28}, 2 * 784 - 1));
  EXPECT_NE(load_error().find("bytes after gunzip"), std::string::npos) << load_error();
  write_gz("t10k-images-idx3-ubyte.gz", idx(0x803, {2, 32, 32}, 2 * 1024));
  EXPECT_NE(load_error().find("28x28"), std::string::npos) << load_error();
  write_gz("t10k-images-idx3-ubyte.gz", idx(0x801, {2, 28, 28}, 2 * 784));
  EXPECT_NE(load_error().find("magic 0x803"), std::string::npos) << load_error();
}

// A decoded split of 1 MiB or more is cached; later loads map the entry, a changed source (same
// name and size) misses it, and a broken entry is decoded again instead of trusted.
TEST_F(BrokenData, DecodedCacheIsReusedAndNeverStale) {
  const fs::path cache = dir_ / "cache";
  ::setenv("MONARCH_DATA_CACHE", cache.c_str(), 1);
  const std::uint32_t n = 1400;  // 1.05 MiB of pixels: cached
  auto images = [&](unsigned char seed) {
    auto b = idx(0x803, {n, 28, 28}, std::size_t{n} * 784);
    for (std::size_t i = 16; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * seed);
    return b;
  };
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x801, {n}, n, 4));
  auto entries = [&] {
    std::vector<fs::path> v;
    if (fs::exists(cache))
      for (auto& e : fs::directory_iterator(cache)) v.push_back(e.path());
    return v;
  };
  auto pixels = [](const ex::Dataset& d) {
    return std::vector<std::uint8_t>(d.pixels.begin(), d.pixels.end());
  };
  write_gz("t10k-images-idx3-ubyte.gz", images(3));
  auto first = ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  ASSERT_EQ(entries().size(), 1u) << "the images are cached, the 1.4 KB labels are not";
  auto again = ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  EXPECT_EQ(pixels(again), pixels(first));
  EXPECT_EQ(again.pixels[16 * 784 + 5], static_cast<std::uint8_t>((16 + 16 * 784 + 5) * 3));

  write_gz("t10k-images-idx3-ubyte.gz", images(5));  // same size, other bytes
  auto changed = ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  EXPECT_EQ(changed.pixels[16 * 784 + 5], static_cast<std::uint8_t>((16 + 16 * 784 + 5) * 5));
  ASSERT_EQ(entries().size(), 2u);

  for (auto& e : entries()) fs::resize_file(e, 100);  // truncated entries: decoded again
  auto fixed = ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  EXPECT_EQ(pixels(fixed), pixels(changed));

  ::setenv("MONARCH_DATA_CACHE", "", 1);  // off: nothing written
  fs::remove_all(cache);
  (void)ex::load_fashion_mnist(dir_.string(), ex::Split::test);
  EXPECT_TRUE(entries().empty());
  ::unsetenv("MONARCH_DATA_CACHE");
}

TEST(Sampler, EachEpochIsAPermutationFixedBySeedAndEpoch) {
  ex::Sampler s(1000, 7), same(1000, 7), other(1000, 8);
  std::vector<std::int64_t> e0, e1;
  for (std::int64_t p = 0; p < 1000; ++p) e0.push_back(s.at(p));
  for (std::int64_t p = 1000; p < 2000; ++p) e1.push_back(s.at(p));
  auto sorted0 = e0;
  std::sort(sorted0.begin(), sorted0.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted0[static_cast<std::size_t>(i)], i);
  EXPECT_NE(e0, e1) << "epochs are reshuffled";
  // Random access (what a healed replica does) gives the same stream.
  for (std::int64_t p : {1500, 3, 999, 1000, 42}) {
    EXPECT_EQ(same.at(p),
              p < 1000 ? e0[static_cast<std::size_t>(p)] : e1[static_cast<std::size_t>(p - 1000)]);
  }
  int differ = 0;
  for (std::int64_t p = 0; p < 1000; ++p) differ += other.at(p) != e0[static_cast<std::size_t>(p)];
  EXPECT_GT(differ, 900);
}

TEST(Sampler, ShardsAreDisjointAndCoverTheGlobalBatch) {
  ex::Sampler s(100, 1);
  for (int replicas : {1, 3, 4}) {
    // 70 + 50 crosses the epoch boundary at 100.
    for (std::int64_t position : {0, 70}) {
      std::multiset<std::int64_t> seen;
      std::size_t total = 0;
      for (int r = 0; r < replicas; ++r) {
        auto shard = s.shard(position, 50, r, replicas);
        EXPECT_LE(shard.size(), 50u / static_cast<std::size_t>(replicas) + 1);
        EXPECT_GE(shard.size(), 50u / static_cast<std::size_t>(replicas));
        total += shard.size();
        seen.insert(shard.begin(), shard.end());
      }
      EXPECT_EQ(total, 50u);
      std::multiset<std::int64_t> batch;
      for (std::int64_t p = position; p < position + 50; ++p) batch.insert(s.at(p));
      EXPECT_EQ(seen, batch);
    }
  }
  EXPECT_THROW(s.shard(0, 50, 4, 4), std::invalid_argument);
  EXPECT_THROW(s.shard(0, 3, 0, 4), std::invalid_argument);
}

}  // namespace
