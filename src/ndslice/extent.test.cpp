#include "monarch/ndslice/extent.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "monarch/ndslice/point.hpp"

namespace monarch::ndslice {
namespace {

using ::testing::HasSubstr;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const SliceError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Extent, Basics) {
  Extent e{{"hosts", 2}, {"gpus", 4}};
  EXPECT_EQ(e.num_dims(), 2u);
  EXPECT_EQ(e.num_ranks(), 8u);
  EXPECT_EQ(e.labels(), (std::vector<std::string>{"hosts", "gpus"}));
  EXPECT_EQ(e.sizes(), (std::vector<std::size_t>{2, 4}));
  EXPECT_EQ(e.size("gpus"), 4u);
  EXPECT_EQ(e.index_of("gpus"), 1u);
  EXPECT_EQ(e.find("nope"), std::nullopt);
  EXPECT_EQ(e.to_string(), "{hosts=2, gpus=4}");
  EXPECT_EQ(e.rank({1, 3}), 7u);
  EXPECT_EQ(e.coords_of(6), (std::vector<std::size_t>{1, 2}));
  EXPECT_EQ(e, (Extent({"hosts", "gpus"}, {2, 4})));
  EXPECT_NE(e, (Extent{{"hosts", 2}, {"cpus", 4}}));
  EXPECT_NE(e, (Extent{{"hosts", 4}, {"gpus", 2}}));
}

TEST(Extent, ZeroDims) {
  Extent e;
  EXPECT_EQ(e.num_ranks(), 1u);
  EXPECT_EQ(e.to_string(), "{}");
  EXPECT_EQ(e.point(0).to_string(), "{}");
  EXPECT_EQ(e.rank({}), 0u);
}

TEST(Extent, Errors) {
  EXPECT_THAT(error_of([] {
                Extent e{{"hosts", 2}, {"hosts", 4}};
              }),
              HasSubstr("duplicate dim 'hosts'"));
  EXPECT_THAT(error_of([] {
                Extent e{{"hosts", 2}, {"gpus", 0}};
              }),
              HasSubstr("dim 'gpus' has size 0"));
  EXPECT_THAT(error_of([] { Extent e({"a", "b"}, {2}); }), HasSubstr("2 labels but 1 sizes"));
  EXPECT_THAT(error_of([] { Extent e{{"", 2}}; }), HasSubstr("empty label"));
  // Selection text and Python keywords can name only identifiers.
  for (const char* bad : {"a b", "1st", "gpu-0", "x.y", "h\xc3\xa9"}) {
    EXPECT_THAT(error_of([&] { Extent e{{bad, 2}}; }), HasSubstr("is not an identifier")) << bad;
  }
  EXPECT_EQ((Extent{{"_x1", 2}, {"Hosts_2", 3}}).num_ranks(), 6u);
  EXPECT_TRUE(is_dim_label("gpus"));
  EXPECT_FALSE(is_dim_label(""));
  EXPECT_FALSE(is_dim_label("9"));
  const std::size_t big = std::size_t{1} << 33;
  EXPECT_THAT(error_of([&] {
                Extent e{{"a", big}, {"b", big}};
              }),
              HasSubstr("overflow at dim 'b'"));
  Extent e{{"hosts", 2}, {"gpus", 4}};
  EXPECT_THAT(error_of([&] { (void)e.size("cpus"); }), HasSubstr("unknown dim 'cpus'"));
  EXPECT_THAT(error_of([&] {
                (void)e.rank({1, 7});
              }),
              HasSubstr("index 7 out of range for dim 'gpus' of size 4"));
  EXPECT_THAT(error_of([&] { (void)e.rank({1}); }), HasSubstr("1 coordinates"));
  EXPECT_THAT(error_of([&] { (void)e.point(8); }), HasSubstr("rank 8 out of range"));
  EXPECT_THROW((void)e.point(8), SliceError);
}

TEST(Point, Basics) {
  Extent e{{"hosts", 2}, {"gpus", 4}};
  Point p = e.point(7);
  EXPECT_EQ(p.coords(), (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(p.rank(), 7u);
  EXPECT_EQ(p["hosts"], 1u);
  EXPECT_EQ(p["gpus"], 3u);
  EXPECT_EQ(p.at(1), 3u);
  EXPECT_EQ(p.to_string(), "{hosts=1, gpus=3}");
  EXPECT_EQ(p, Point({1, 3}, e));
  EXPECT_NE(p, Point({1, 2}, e));
  EXPECT_NE(p, (Point({1, 3}, Extent{{"hosts", 2}, {"cpus", 4}})));
  EXPECT_THAT(error_of([&] { (void)p["cpus"]; }), HasSubstr("unknown dim 'cpus'"));
  EXPECT_THAT(error_of([&] { (void)p.at(2); }), HasSubstr("dim #2 out of range"));
  EXPECT_THAT(error_of([&] {
                Point q({2, 0}, e);
              }),
              HasSubstr("index 2 out of range for dim 'hosts' of size 2"));
}

}  // namespace
}  // namespace monarch::ndslice
