#include "monarch/ndslice/slice.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

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

V collect(const Slice& s) {
  return V(s.begin(), s.end());
}

TEST(Slice, Dense) {
  Slice s = Slice::dense({2, 3, 4});
  EXPECT_EQ(s.strides(), (V{12, 4, 1}));
  EXPECT_EQ(s.len(), 24u);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.location({1, 2, 3}), 23u);
  EXPECT_EQ(s.coordinates(17), (V{1, 1, 1}));
  EXPECT_EQ(s.index(17), 17u);
  V all = collect(s);
  ASSERT_EQ(all.size(), 24u);
  for (std::size_t i = 0; i < 24; ++i) EXPECT_EQ(all[i], i);
  EXPECT_EQ(s.to_string(), "Slice{offset=0, sizes=[2, 3, 4], strides=[12, 4, 1]}");
}

TEST(Slice, Strided) {
  // {hosts=2, gpus=4} with gpus 1:4:2 -> ranks 1 3 5 7.
  Slice s = Slice::dense({2, 4}).range(1, Range{1, 4, 2});
  EXPECT_EQ(s.offset(), 1u);
  EXPECT_EQ(s.sizes(), (V{2, 2}));
  EXPECT_EQ(s.strides(), (V{4, 2}));
  EXPECT_EQ(collect(s), (V{1, 3, 5, 7}));
  V fe;
  s.for_each([&](std::size_t r) { fe.push_back(r); });
  EXPECT_EQ(fe, (V{1, 3, 5, 7}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.location({1, 1}), 7u);
  EXPECT_EQ(s.coordinates(5), (V{1, 0}));
  EXPECT_EQ(s.index(5), 2u);
  EXPECT_EQ(s.at_index(3), 7u);
  EXPECT_TRUE(s.contains(3));
  EXPECT_FALSE(s.contains(4));
  EXPECT_FALSE(s.contains(0));
  EXPECT_FALSE(s.contains(9));
  EXPECT_THAT(error_of([&] { (void)s.coordinates(4); }), HasSubstr("rank 4 is not in"));
  EXPECT_THAT(error_of([&] { (void)s.index(8); }), HasSubstr("rank 8 is not in"));
}

TEST(Slice, AtSplitFlatten) {
  Slice s = Slice::dense({2, 6});
  Slice a = s.at(0, 1);
  EXPECT_EQ(collect(a), (V{6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(a.is_contiguous());
  Slice f = a.flatten();
  EXPECT_EQ(f.sizes(), (V{6}));
  EXPECT_EQ(f.offset(), 6u);
  Slice sp = s.split(1, {2, 3});
  EXPECT_EQ(sp.sizes(), (V{2, 2, 3}));
  EXPECT_EQ(sp.strides(), (V{6, 3, 1}));
  EXPECT_EQ(collect(sp), collect(s));
  EXPECT_THAT(error_of([&] {
                (void)s.range(1, Range{0, 6, 2}).flatten();
              }),
              HasSubstr("cannot flatten non-contiguous"));
  // A size-1 dim with any stride does not break contiguity.
  EXPECT_TRUE(Slice(3, {1, 4}, {100, 1}).is_contiguous());
  EXPECT_EQ(Slice(3, {1, 4}, {100, 1}), Slice(3, {1, 4}, {4, 1}));
}

TEST(Slice, IrregularStrides) {
  // Non-nested strides fall back to a scan: locations 0 2 4 3 5 7.
  Slice s(0, {2, 3}, {3, 2});
  EXPECT_EQ(collect(s), (V{0, 2, 4, 3, 5, 7}));
  EXPECT_EQ(s.coordinates(4), (V{0, 2}));
  EXPECT_EQ(s.index(3), 3u);
  EXPECT_FALSE(s.contains(1));
}

TEST(Slice, Errors) {
  Slice s = Slice::dense({2, 4});
  EXPECT_THAT(error_of([] { Slice x(0, {2, 3}, {1}); }), HasSubstr("2 sizes but 1 strides"));
  EXPECT_THAT(error_of([] { (void)Slice::dense({2, 0}); }), HasSubstr("dim #1 has size 0"));
  EXPECT_THAT(error_of([&] {
                (void)s.location({2, 0});
              }),
              HasSubstr("index 2 out of range for dim #0 of size 2"));
  EXPECT_THAT(error_of([&] { (void)s.location({0}); }), HasSubstr("1 coordinates"));
  EXPECT_THAT(error_of([&] { (void)s.at(1, 4); }),
              HasSubstr("index 4 out of range for dim #1 of size 4"));
  EXPECT_THAT(error_of([&] { (void)s.at(2, 0); }), HasSubstr("dim #2 out of range"));
  EXPECT_THAT(error_of([&] { (void)s.range(1, Range{0, 4, 0}); }), HasSubstr("step 0"));
  EXPECT_THAT(error_of([&] {
                (void)s.range(1, Range{4, std::nullopt, 1});
              }),
              HasSubstr("range begin 4 out of range for dim #1 of size 4"));
  EXPECT_THAT(error_of([&] {
                (void)s.range(1, Range{0, 5, 1});
              }),
              HasSubstr("range end 5 out of range for dim #1 of size 4"));
  EXPECT_THAT(error_of([&] { (void)s.range(1, Range{2, 2, 1}); }), HasSubstr("empty range"));
  EXPECT_THAT(error_of([&] { (void)s.split(1, {3, 2}); }), HasSubstr("product 6 != 4"));
  EXPECT_THAT(error_of([&] { (void)s.split(1, {4, 0}); }), HasSubstr("is 0"));
  EXPECT_THAT(error_of([&] { (void)s.at_index(8); }), HasSubstr("index 8 out of range"));
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  EXPECT_THAT(error_of([] {
                (void)Slice::dense({std::size_t{1} << 40, std::size_t{1} << 40});
              }),
              HasSubstr("overflow"));
  EXPECT_THAT(error_of([&] { Slice x(kMax - 2, {4}, {1}); }), HasSubstr("overflow"));
  EXPECT_THAT(error_of([&] { Slice x(0, {3}, {kMax / 2 + 1}); }), HasSubstr("overflow"));
}

TEST(Range, ToString) {
  EXPECT_EQ((Range{1, 4, 2}).to_string(), "1:4:2");
  EXPECT_EQ((Range{3, 4, 1}).to_string(), "3");
  EXPECT_EQ((Range{2, std::nullopt, 1}).to_string(), "2:");
  EXPECT_EQ((Range{0, std::nullopt, 3}).to_string(), "0::3");
}

}  // namespace
}  // namespace monarch::ndslice
