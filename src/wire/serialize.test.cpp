#include "monarch/wire/serialize.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace monarch::wire {
namespace {

using ::testing::HasSubstr;

struct Point3 {
  int x = 0;
  double y = 0;
  std::string label;
  std::vector<std::int64_t> ids;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(x, y, label, ids);
  }
  friend bool operator==(const Point3&, const Point3&) = default;
};

struct Split {  // free serialize function
  std::uint16_t a = 0;
  std::optional<std::string> b;
  friend bool operator==(const Split&, const Split&) = default;
};
template <class Archive>
void serialize(Archive& ar, Split& s) {
  ar(s.a, s.b);
}

struct NotSerializable {
  int x;
};

static_assert(is_serializable_v<int>);
static_assert(is_serializable_v<std::string>);
static_assert(is_serializable_v<std::map<std::string, std::vector<int>>>);
static_assert(is_serializable_v<std::optional<Point3>>);
static_assert(is_serializable_v<Split>);
static_assert(is_serializable_v<std::variant<int, std::string>>);
static_assert(!is_serializable_v<NotSerializable>);
static_assert(!is_serializable_v<std::vector<NotSerializable>>);
static_assert(!is_serializable_v<std::map<int, std::optional<NotSerializable>>>);
static_assert(!is_serializable_v<std::tuple<int, NotSerializable>>);
static_assert(is_serializable_v<std::vector<std::map<int, Point3>>>);
static_assert(is_serializable_v<const std::array<Split, 2>&>);

template <class T>
T round_trip(const T& v) {
  return decode<T>(encode(v));
}

template <class F>
std::string decode_error_of(F&& f) {
  try {
    f();
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Serialize, Scalars) {
  EXPECT_EQ(round_trip(0), 0);
  EXPECT_EQ(round_trip(-123456789), -123456789);
  EXPECT_EQ(round_trip(std::uint64_t{0xFFFFFFFFFFFFFFFFULL}), 0xFFFFFFFFFFFFFFFFULL);
  EXPECT_EQ(round_trip(3.25), 3.25);
  EXPECT_EQ(round_trip(true), true);
  EXPECT_EQ(encode(std::int32_t{1}).size(), 4u);
}

TEST(Serialize, StringsVectorsMaps) {
  EXPECT_EQ(round_trip(std::string()), "");
  EXPECT_EQ(round_trip(std::string("hello\0world", 11)), std::string("hello\0world", 11));
  std::vector<int> v = {1, 2, 3, -4};
  EXPECT_EQ(round_trip(v), v);
  std::vector<std::string> vs = {"a", "", "ccc"};
  EXPECT_EQ(round_trip(vs), vs);
  std::map<std::string, std::vector<int>> m = {{"x", {1}}, {"y", {}}, {"z", {2, 3}}};
  EXPECT_EQ(round_trip(m), m);
  std::unordered_map<int, std::string> um = {{1, "one"}, {2, "two"}};
  EXPECT_EQ(round_trip(um), um);
}

TEST(Serialize, OptionalVariantPair) {
  EXPECT_EQ(round_trip(std::optional<int>()), std::nullopt);
  EXPECT_EQ(round_trip(std::optional<int>(5)), 5);
  std::variant<int, std::string> var = std::string("s");
  EXPECT_EQ(round_trip(var), var);
  std::pair<int, std::string> p = {1, "p"};
  EXPECT_EQ(round_trip(p), p);
}

TEST(Serialize, UserStructs) {
  Point3 p{7, 2.5, "label", {1, -2, 3}};
  EXPECT_EQ(round_trip(p), p);
  Split s{9, "b"};
  EXPECT_EQ(round_trip(s), s);
  std::vector<Point3> ps = {p, Point3{}, p};
  EXPECT_EQ(round_trip(ps), ps);
}

TEST(Serialize, EncodeIntoAppends) {
  std::vector<std::byte> out = {std::byte{0xEE}};
  encode_into(std::int32_t{5}, out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0], std::byte{0xEE});
  EXPECT_EQ(decode<std::int32_t>(std::span<const std::byte>(out).subspan(1)), 5);
}

TEST(Serialize, Tuples) {
  auto bytes = encode_tuple(1, std::string("two"), std::vector<double>{3.0}, Point3{4, 0, "", {}});
  auto [a, b, c, d] = decode_tuple<int, std::string, std::vector<double>, Point3>(bytes);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, "two");
  EXPECT_EQ(c, std::vector<double>{3.0});
  EXPECT_EQ(d.x, 4);
  // Same bytes as std::tuple of the values.
  EXPECT_EQ(encode_tuple(1, std::string("x")), encode(std::tuple<int, std::string>(1, "x")));
  EXPECT_TRUE(encode_tuple().empty());
  EXPECT_EQ(decode_tuple<>(encode_tuple()), std::tuple<>());
  EXPECT_THAT(decode_error_of([&] { decode_tuple<int, std::string>(encode_tuple(1)); }),
              HasSubstr("std::tuple<int, std::"));
}

TEST(Serialize, TruncatedInputNamesType) {
  auto bytes = encode(Point3{7, 2.5, "label", {1, 2, 3}});
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto msg = decode_error_of([&] { decode<Point3>(std::span<const std::byte>(bytes).first(n)); });
    EXPECT_THAT(msg, HasSubstr("cannot decode monarch::wire::(anonymous namespace)::Point3")) << n;
    EXPECT_THAT(msg, HasSubstr("truncated")) << n;
  }
  auto s = encode(std::string("hello"));
  EXPECT_THAT(
      decode_error_of([&] { decode<std::string>(std::span<const std::byte>(s).first(10)); }),
      HasSubstr("std::__cxx11::basic_string"));
  EXPECT_THROW(decode<int>(std::span<const std::byte>()), DecodeError);
}

TEST(Serialize, TrailingGarbage) {
  auto bytes = encode(std::string("abc"));
  bytes.push_back(std::byte{1});
  bytes.push_back(std::byte{2});
  auto msg = decode_error_of([&] { decode<std::string>(bytes); });
  EXPECT_THAT(msg, HasSubstr("cannot decode std::"));
  EXPECT_THAT(msg, HasSubstr("2 trailing bytes"));
  auto two = encode_tuple(1, 2);
  EXPECT_THAT(decode_error_of([&] { decode<int>(two); }),
              HasSubstr("cannot decode int: 4 trailing"));
}

}  // namespace
}  // namespace monarch::wire
