#include "monarch/ndslice/region.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace monarch::ndslice {
namespace {

using V = std::vector<std::size_t>;

TEST(Region, FromShape) {
  Extent e{{"hosts", 2}, {"gpus", 4}};
  Region r(Shape(e).slice("gpus", Range{1, 3}));
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(r.ranks(), (V{1, 2, 5, 6}));
  EXPECT_EQ(r.runs().size(), 2u);
  EXPECT_EQ(r.to_string(), "{1..2, 5..6}");
  EXPECT_TRUE(r.contains(5));
  EXPECT_FALSE(r.contains(4));
  EXPECT_TRUE(r.contains(e.point(6)));
  EXPECT_FALSE(r.contains(e.point(7)));
  EXPECT_EQ(V(r.begin(), r.end()), (V{1, 2, 5, 6}));
  Region all(e);
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(all.runs().size(), 1u);
}

TEST(Region, SetOps) {
  Region a = Region::from_ranks({5, 1, 2, 3, 9, 3});
  Region b = Region::from_ranks({3, 4, 5, 6, 10});
  EXPECT_EQ(a.to_string(), "{1..3, 5, 9}");
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(union_(a, b).ranks(), (V{1, 2, 3, 4, 5, 6, 9, 10}));
  EXPECT_EQ(union_(a, b).runs().size(), 2u);
  EXPECT_EQ(intersection(a, b).ranks(), (V{3, 5}));
  EXPECT_EQ(a.difference(b).ranks(), (V{1, 2, 9}));
  EXPECT_EQ(b.difference(a).ranks(), (V{4, 6, 10}));
  EXPECT_TRUE(Region().empty());
  EXPECT_EQ(Region().to_string(), "{}");
  EXPECT_EQ(Region::from_runs({{4, 6}, {0, 2}, {2, 3}}).ranks(), (V{0, 1, 2, 4, 5}));
  EXPECT_THROW((void)Region::from_runs({{4, 4}}), SliceError);
}

TEST(Region, RandomSetOpsMatchBruteForce) {
  std::mt19937_64 rng(42);
  for (int it = 0; it < 2000; ++it) {
    std::vector<bool> ma(64), mb(64);
    V ra, rb;
    for (std::size_t i = 0; i < 64; ++i) {
      if (rng() % 3 == 0) {
        ma[i] = true;
        ra.push_back(i);
      }
      if (rng() % 3 == 0) {
        mb[i] = true;
        rb.push_back(i);
      }
    }
    Region a = Region::from_ranks(ra), b = Region::from_ranks(rb);
    V u, x, d;
    for (std::size_t i = 0; i < 64; ++i) {
      if (ma[i] || mb[i]) u.push_back(i);
      if (ma[i] && mb[i]) x.push_back(i);
      if (ma[i] && !mb[i]) d.push_back(i);
    }
    ASSERT_EQ(a.union_(b).ranks(), u);
    ASSERT_EQ(a.intersection(b).ranks(), x);
    ASSERT_EQ(a.difference(b).ranks(), d);
    ASSERT_EQ(a.union_(b).size(), u.size());
  }
}

}  // namespace
}  // namespace monarch::ndslice
