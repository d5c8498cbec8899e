#include "monarch/ndslice/value_mesh.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace monarch::ndslice {
namespace {

using ::testing::HasSubstr;

const Extent kE{{"hosts", 2}, {"gpus", 4}};

TEST(ValueMesh, FillAndSet) {
  ValueMesh<int> m(kE, 7);
  EXPECT_EQ(m.size(), 8u);
  EXPECT_EQ(m.runs(), 1u);
  EXPECT_EQ(m[5], 7);
  m.set(3, 1);
  EXPECT_EQ(m.runs(), 3u);
  EXPECT_EQ(m.to_vector(), (std::vector<int>{7, 7, 7, 1, 7, 7, 7, 7}));
  m.set(3, 7);
  EXPECT_EQ(m.runs(), 1u);
  m.set(0, 2);
  m.set(7, 2);
  EXPECT_EQ(m.runs(), 3u);
  m.set(kE.point(1), 2);
  EXPECT_EQ(m.get(kE.point(1)), 2);
  EXPECT_EQ(m.runs(), 3u);
  EXPECT_EQ(m.to_vector(), (std::vector<int>{2, 2, 7, 7, 7, 7, 7, 2}));
}

TEST(ValueMesh, FromVectorAndIterate) {
  auto m = ValueMesh<std::string>::from_vector(kE, {"a", "a", "b", "b", "b", "c", "a", "a"});
  EXPECT_EQ(m.runs(), 4u);
  EXPECT_EQ(m[4], "b");
  EXPECT_EQ(m.get(kE.point(5)), "c");
  std::vector<std::string> seen;
  for (const auto& [p, v] : m) seen.push_back(p.to_string() + "=" + v);
  ASSERT_EQ(seen.size(), 8u);
  EXPECT_EQ(seen[0], "{hosts=0, gpus=0}=a");
  EXPECT_EQ(seen[5], "{hosts=1, gpus=1}=c");
  EXPECT_EQ(seen[7], "{hosts=1, gpus=3}=a");
  ValueMesh<int> sm(Shape(kE).slice("gpus", Range{0, 4, 2}), 0);
  EXPECT_EQ(sm.size(), 4u);
}

TEST(ValueMesh, Errors) {
  ValueMesh<int> m(kE, 0);
  try {
    (void)m[8];
    FAIL();
  } catch (const SliceError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 8 out of range"));
    EXPECT_THAT(e.what(), HasSubstr("8 ranks"));
  }
  EXPECT_THROW(m.set(9, 1), SliceError);
  EXPECT_THROW((void)m.get(Extent{{"x", 8}}.point(0)), SliceError);
  EXPECT_THROW((void)ValueMesh<int>::from_vector(kE, {1, 2, 3}), SliceError);
}

TEST(ValueMesh, RandomSetsMatchVector) {
  std::mt19937_64 rng(7);
  Extent e{{"a", 5}, {"b", 7}};
  for (int round = 0; round < 200; ++round) {
    std::vector<int> ref(e.num_ranks(), 0);
    ValueMesh<int> m(e, 0);
    for (int i = 0; i < 60; ++i) {
      const std::size_t r = rng() % ref.size();
      const int v = static_cast<int>(rng() % 3);
      ref[r] = v;
      m.set(r, v);
      std::size_t runs = 1;
      for (std::size_t k = 1; k < ref.size(); ++k) runs += ref[k] != ref[k - 1] ? 1 : 0;
      ASSERT_EQ(m.runs(), runs);
    }
    ASSERT_EQ(m.to_vector(), ref);
    ASSERT_EQ(m, ValueMesh<int>::from_vector(e, ref));
  }
}

}  // namespace
}  // namespace monarch::ndslice
