#include "monarch/ndslice/shape.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace monarch::ndslice {
namespace {

using ::testing::HasSubstr;
using V = std::vector<std::size_t>;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const SliceError& e) {
    return e.what();
  }
  return "<no error>";
}

V ranks(const Shape& s) {
  return V(s.base().begin(), s.base().end());
}

const Extent kE{{"hosts", 2}, {"gpus", 4}};

TEST(Shape, Dense) {
  Shape s(kE);
  EXPECT_EQ(s.extent(), kE);
  EXPECT_EQ(s.num_ranks(), 8u);
  EXPECT_EQ(ranks(s), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(s.rank_of(kE.point(5)), 5u);
  EXPECT_EQ(s.to_string(), "{hosts=2, gpus=4} @ Slice{offset=0, sizes=[2, 4], strides=[4, 1]}");
}

TEST(Shape, SliceRange) {
  Shape s = Shape(kE).slice("gpus", Range{1, 4, 2});
  EXPECT_EQ(s.extent(), (Extent{{"hosts", 2}, {"gpus", 2}}));
  EXPECT_EQ(ranks(s), (V{1, 3, 5, 7}));
  EXPECT_EQ(s.rank_of(V{1, 0}), 5u);
  EXPECT_EQ(s.point_of_rank(7).to_string(), "{hosts=1, gpus=1}");
  EXPECT_EQ(s.global_rank(2), 5u);
  EXPECT_TRUE(s.contains(3));
  EXPECT_FALSE(s.contains(2));
  std::vector<std::string> pts;
  for (const Point& p : s) pts.push_back(p.to_string() + "@" + std::to_string(s.rank_of(p)));
  EXPECT_EQ(pts, (std::vector<std::string>{"{hosts=0, gpus=0}@1", "{hosts=0, gpus=1}@3",
                                           "{hosts=1, gpus=0}@5", "{hosts=1, gpus=1}@7"}));
  // Open-ended range.
  EXPECT_EQ(ranks(Shape(kE).slice("gpus", Range{2})), (V{2, 3, 6, 7}));
}

TEST(Shape, SliceIndex) {
  Shape s = Shape(kE).slice("hosts", 1);
  EXPECT_EQ(s.extent(), (Extent{{"gpus", 4}}));
  EXPECT_EQ(ranks(s), (V{4, 5, 6, 7}));
  Shape t = s.slice("gpus", 2);
  EXPECT_EQ(t.num_dims(), 0u);
  EXPECT_EQ(ranks(t), (V{6}));
  EXPECT_EQ(t.point_of_rank(6).to_string(), "{}");
}

TEST(Shape, SplitFlattenRename) {
  Shape s(Extent{{"hosts", 2}, {"gpus", 8}});
  Shape sp = s.split("gpus", {"node", "gpu"}, {2, 4});
  EXPECT_EQ(sp.extent(), (Extent{{"hosts", 2}, {"node", 2}, {"gpu", 4}}));
  EXPECT_EQ(sp.base().strides(), (V{8, 4, 1}));
  EXPECT_EQ(ranks(sp.slice("node", 1).slice("gpu", 3)), (V{7, 15}));
  Shape f = sp.flatten("all");
  EXPECT_EQ(f.extent(), (Extent{{"all", 16}}));
  EXPECT_EQ(ranks(f), ranks(s));
  Shape h1 = s.slice("hosts", 1).flatten("x");
  EXPECT_EQ(ranks(h1), (V{8, 9, 10, 11, 12, 13, 14, 15}));
  Shape r = s.rename("gpus", "devices");
  EXPECT_EQ(r.labels(), (std::vector<std::string>{"hosts", "devices"}));
  EXPECT_EQ(ranks(r), ranks(s));
  // Split of a strided dim keeps the stride.
  Shape st = s.slice("gpus", Range{0, 8, 2}).split("gpus", {"a", "b"}, {2, 2});
  EXPECT_EQ(ranks(st), (V{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(st.base().strides(), (V{8, 4, 2}));
}

TEST(Shape, Errors) {
  Shape s(kE);
  EXPECT_THAT(error_of([&] { (void)s.slice("gpus", 7); }),
              HasSubstr("slice: index 7 out of range for dim 'gpus' of size 4"));
  EXPECT_THAT(error_of([&] { (void)s.slice("cpus", 0); }), HasSubstr("unknown dim 'cpus'"));
  EXPECT_THAT(error_of([&] {
                (void)s.slice("gpus", Range{1, 4, 0});
              }),
              HasSubstr("step 0 for dim 'gpus' of size 4"));
  EXPECT_THAT(error_of([&] {
                (void)s.slice("gpus", Range{3, 3, 1});
              }),
              HasSubstr("empty range 3:3 for dim 'gpus'"));
  EXPECT_THAT(error_of([&] {
                (void)s.slice("gpus", Range{0, 9, 1});
              }),
              HasSubstr("range end 9 out of range for dim 'gpus' of size 4"));
  EXPECT_THAT(error_of([&] { (void)s.slice("hosts", Range{2}); }),
              HasSubstr("range begin 2 out of range for dim 'hosts' of size 2"));
  EXPECT_THAT(error_of([&] {
                (void)s.split("gpus", {"a", "b"}, {3, 2});
              }),
              HasSubstr("split of dim 'gpus' of size 4 into [3, 2]: product 6 != 4"));
  EXPECT_THAT(error_of([&] {
                (void)s.split("gpus", {"a"}, {2, 2});
              }),
              HasSubstr("1 names but 2 sizes"));
  EXPECT_THAT(error_of([&] {
                (void)s.split("gpus", {"hosts", "b"}, {2, 2});
              }),
              HasSubstr("duplicate dim 'hosts'"));
  EXPECT_THAT(error_of([&] { (void)s.split("nope", {"a"}, {4}); }),
              HasSubstr("unknown dim 'nope'"));
  EXPECT_THAT(error_of([&] {
                (void)s.slice("gpus", Range{0, 4, 2}).flatten("x");
              }),
              HasSubstr("not contiguous"));
  EXPECT_THAT(error_of([&] { (void)s.rename("gpus", "hosts"); }),
              HasSubstr("'hosts' already exists"));
  EXPECT_THAT(error_of([&] { (void)s.rename("cpus", "x"); }), HasSubstr("unknown dim 'cpus'"));
  EXPECT_THAT(error_of([&] {
                (void)s.rank_of(Extent{{"x", 8}}.point(1));
              }),
              HasSubstr("does not belong to view"));
  EXPECT_THAT(error_of([&] {
                (void)s.rank_of(V{0, 4});
              }),
              HasSubstr("index 4 out of range for dim 'gpus' of size 4"));
  Shape odd = s.slice("gpus", Range{1, 4, 2});
  EXPECT_THAT(error_of([&] { (void)odd.point_of_rank(2); }), HasSubstr("rank 2 is not in view"));
  EXPECT_THAT(error_of([&] { (void)odd.global_rank(4); }), HasSubstr("local rank 4 out of range"));
  EXPECT_THAT(error_of([] {
                Shape x({"a"}, Slice::dense({2, 2}));
              }),
              HasSubstr("1 labels but 2 sizes"));
}

}  // namespace
}  // namespace monarch::ndslice
