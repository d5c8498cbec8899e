#include "monarch/ndslice/selection.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace monarch::ndslice {
namespace {

using ::testing::HasSubstr;
using V = std::vector<std::size_t>;
using S = Selection;

const Shape kS(Extent{{"hosts", 2}, {"gpus", 4}});

V ev(std::string_view text, const Shape& s = kS) {
  return eval_ranks(parse(text), s);
}

TEST(Selection, ParseStructure) {
  EXPECT_EQ(parse("*,0,1:4"), S::all(S::index(0, S::range(Range{1, 4, 1}))));
  EXPECT_EQ(parse("*"), S::all());
  EXPECT_EQ(parse("?"), S::first());
  EXPECT_EQ(parse("true"), S::true_());
  EXPECT_EQ(parse("false"), S::false_());
  EXPECT_EQ(parse("3"), S::index(3));
  EXPECT_EQ(parse("1:"), S::range(Range{1, std::nullopt, 1}));
  EXPECT_EQ(parse(":3"), S::range(Range{0, 3, 1}));
  EXPECT_EQ(parse("::2"), S::range(Range{0, std::nullopt, 2}));
  EXPECT_EQ(parse("1:7:3"), S::range(Range{1, 7, 3}));
  EXPECT_EQ(parse("@gpus+cpus"), S::label({"gpus", "cpus"}));
  EXPECT_EQ(parse(" 1:4 | 5:6 "), S::union_(S::range(Range{1, 4}), S::range(Range{5, 6})));
  EXPECT_EQ(parse("0|1&2"), S::union_(S::index(0), S::intersection(S::index(1), S::index(2))));
  EXPECT_EQ(parse("(0|1)&2"), S::intersection(S::union_(S::index(0), S::index(1)), S::index(2)));
  // A group applies what follows it to each branch.
  EXPECT_EQ(parse("*,(1:4|5:6)"), S::all(S::union_(S::range(Range{1, 4}), S::range(Range{5, 6}))));
  EXPECT_EQ(parse("(0|1),*"), S::union_(S::index(0, S::all()), S::index(1, S::all())));
  EXPECT_EQ(parse("0,true"), S::index(0));
  EXPECT_NE(parse("0"), parse("1"));
  EXPECT_NE(parse("*"), parse("0:"));
}

TEST(Selection, Print) {
  EXPECT_EQ(to_string(S::all(S::index(0, S::range(Range{1, 4})))), "*,0,1:4");
  EXPECT_EQ(to_string(S::true_()), "true");
  EXPECT_EQ(to_string(S::index(0, S::union_(S::index(1), S::index(2)))), "0,(1|2)");
  EXPECT_EQ(to_string(S::intersection(S::union_(S::index(0), S::index(1)), S::index(2))),
            "(0|1)&2");
  EXPECT_EQ(to_string(S::union_(S::index(0), S::union_(S::index(1), S::index(2)))), "0|(1|2)");
  EXPECT_EQ(to_string(S::label({"a", "b"}, S::first(S::false_()))), "@a+b,?,false");
}

TEST(Selection, Eval) {
  EXPECT_EQ(ev("*"), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ev("true"), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ev("false"), V{});
  EXPECT_EQ(ev("1"), (V{4, 5, 6, 7}));
  EXPECT_EQ(ev("*,1:3"), (V{1, 2, 5, 6}));
  EXPECT_EQ(ev("?,?"), (V{0}));
  EXPECT_EQ(ev("*,(0|3)"), (V{0, 3, 4, 7}));
  EXPECT_EQ(ev("*,0:4:2&1,*"), (V{4, 6}));
  EXPECT_EQ(ev("*,2:100"), (V{2, 3, 6, 7}));  // ranges clip
  EXPECT_EQ(ev("5"), V{});
  EXPECT_EQ(ev("*,@gpus"), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(ev("@gpus"), V{});
  EXPECT_EQ(ev("@hosts+x,3"), (V{3, 7}));
  // On a strided view the result is global ranks.
  Shape odd = kS.slice("gpus", Range{1, 4, 2});  // ranks 1 3 5 7
  EXPECT_EQ(ev("*,1", odd), (V{3, 7}));
  EXPECT_EQ(ev("1", odd), (V{5, 7}));
  Region r = eval(parse("0|1,0"), kS);
  EXPECT_EQ(r.to_string(), "{0..4}");
}

TEST(Selection, EvalErrors) {
  try {
    (void)ev("*,*,*");
    FAIL() << "no error";
  } catch (const SliceError& e) {
    EXPECT_THAT(e.what(), HasSubstr("addresses dim #2"));
    EXPECT_THAT(e.what(), HasSubstr("has only 2 dims"));
  }
  EXPECT_THROW((void)S::range(Range{1, 4, 0}), SliceError);
  EXPECT_THROW((void)S::range(Range{4, 4, 1}), SliceError);
  EXPECT_THROW((void)S::label({}), SliceError);
  EXPECT_THROW((void)S::label({"not-ident"}), SliceError);
  EXPECT_THROW((void)S::index(0).lhs(), SliceError);
  EXPECT_THROW((void)S::true_().inner(), SliceError);
}

std::size_t err_col(std::string_view text, std::string* msg = nullptr) {
  try {
    (void)parse(text);
  } catch (const ParseError& e) {
    if (msg != nullptr) *msg = e.what();
    return e.column();
  }
  return 0;
}

TEST(Selection, ParseErrorColumns) {
  std::string msg;
  EXPECT_EQ(err_col("*,1:x", &msg), 5u);
  EXPECT_THAT(msg, HasSubstr("column 5"));
  EXPECT_THAT(msg, HasSubstr("got 'x'"));
  EXPECT_EQ(err_col("", &msg), 1u);
  EXPECT_THAT(msg, HasSubstr("expected a selection"));
  EXPECT_EQ(err_col("*,", &msg), 3u);
  EXPECT_THAT(msg, HasSubstr("got end of input"));
  EXPECT_EQ(err_col("(0|1", &msg), 5u);
  EXPECT_THAT(msg, HasSubstr("expected ')'"));
  EXPECT_EQ(err_col("1:4:0", &msg), 5u);
  EXPECT_THAT(msg, HasSubstr("step must be >= 1"));
  EXPECT_EQ(err_col("*,4:2", &msg), 5u);
  EXPECT_THAT(msg, HasSubstr("empty range 4:2"));
  EXPECT_EQ(err_col("0 1", &msg), 3u);
  EXPECT_THAT(msg, HasSubstr("expected ',', '|', '&' or end of input"));
  EXPECT_EQ(err_col("@", &msg), 2u);
  EXPECT_THAT(msg, HasSubstr("dim label"));
  EXPECT_EQ(err_col("*,99999999999999999999999", &msg), 3u);
  EXPECT_THAT(msg, HasSubstr("overflow"));
  EXPECT_EQ(err_col("1:4:", &msg), 5u);
  EXPECT_THAT(msg, HasSubstr("expected an integer step"));
  EXPECT_EQ(err_col("x"), 1u);
  EXPECT_THROW((void)parse("*|"), SliceError);  // ParseError is an Error
}

TEST(SelectionParse, HostileInputIsRejectedWithABoundedClearMessage) {
  auto message = [](const std::string& text) {
    try {
      (void)parse(text);
    } catch (const ParseError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Deep nesting: an error, not a stack overflow.
  std::string deep = std::string(20000, '(') + "*" + std::string(20000, ')');
  EXPECT_THAT(message(deep), HasSubstr("nested deeper than 64"));
  EXPECT_NO_THROW((void)parse(std::string(64, '(') + "*" + std::string(64, ')')));
  // Too many components.
  std::string wide = "*";
  for (int i = 0; i < 1000; ++i) wide += ",*";
  EXPECT_THAT(message(wide), HasSubstr("more than 256 dimension components"));
  // The largest integer as an index cannot form a range.
  EXPECT_THAT(message("18446744073709551615"), HasSubstr("is too large"));
  // The message quotes at most a window of the input, with control bytes escaped.
  std::string huge = std::string(100000, '*');
  EXPECT_LT(message(huge).size(), 300u);
  EXPECT_THAT(message("*,\x01"), HasSubstr("'\\x01'"));
}

}  // namespace
}  // namespace monarch::ndslice
