// Randomized property tests (fixed seeds: deterministic).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "monarch/ndslice/ndslice.hpp"

namespace monarch::ndslice {
namespace {

using V = std::vector<std::size_t>;
using S = Selection;
constexpr int kCases = 10000;

std::size_t uni(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {  // inclusive
  return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
}

Range random_range(std::mt19937_64& rng, std::size_t n) {
  Range r;
  r.begin = uni(rng, 0, n - 1);
  if (rng() % 4 != 0) r.end = uni(rng, r.begin + 1, n);
  r.step = uni(rng, 1, 3);
  return r;
}

std::size_t range_end(const Range& r, std::size_t n) {
  return r.end.value_or(n);
}

// A random shape: a dense extent, then a few random range/index/split operations.
Shape random_shape(std::mt19937_64& rng) {
  const std::size_t nd = uni(rng, 1, 4);
  std::vector<std::string> labels;
  V sizes;
  for (std::size_t d = 0; d < nd; ++d) {
    labels.push_back("d" + std::to_string(d));
    sizes.push_back(uni(rng, 1, 6));
  }
  Shape s(Extent(labels, sizes));
  const std::size_t ops = uni(rng, 0, 3);
  int fresh = 0;
  for (std::size_t i = 0; i < ops && s.num_dims() > 0; ++i) {
    const std::size_t d = uni(rng, 0, s.num_dims() - 1);
    const std::string& name = s.labels()[d];
    const std::size_t n = s.sizes()[d];
    switch (rng() % 3) {
      case 0:
        s = s.slice(name, random_range(rng, n));
        break;
      case 1:
        if (s.num_dims() > 1) s = s.slice(name, uni(rng, 0, n - 1));
        break;
      default: {
        std::size_t a = 1;
        for (std::size_t f = 2; f <= n; ++f) {
          if (n % f == 0 && rng() % 2 == 0) {
            a = f;
            break;
          }
        }
        const std::string x = "s" + std::to_string(fresh++);
        const std::string y = "s" + std::to_string(fresh++);
        s = s.split(name, {x, y}, {a, n / a});
      }
    }
  }
  return s;
}

TEST(Property, CoordinatesOfLocationRoundTrip) {
  std::mt19937_64 rng(0x5eed0001);
  for (int c = 0; c < kCases; ++c) {
    const Shape s = random_shape(rng);
    const std::size_t local = uni(rng, 0, s.num_ranks() - 1);
    const Point p = s.extent().point(local);
    ASSERT_EQ(p.rank(), local);
    ASSERT_EQ(s.extent().rank(p.coords()), local);
    const std::size_t g = s.rank_of(p);
    ASSERT_EQ(s.base().coordinates(g), p.coords()) << s.to_string() << " rank " << g;
    ASSERT_EQ(s.point_of_rank(g), p);
    ASSERT_EQ(s.base().index(g), local);
    ASSERT_EQ(s.global_rank(local), g);
    ASSERT_TRUE(s.contains(g));
  }
}

TEST(Property, IterationMatchesLocation) {
  std::mt19937_64 rng(0x5eed0002);
  for (int c = 0; c < kCases / 10; ++c) {
    const Shape s = random_shape(rng);
    V it(s.base().begin(), s.base().end());
    ASSERT_EQ(it.size(), s.num_ranks());
    for (std::size_t i = 0; i < it.size(); ++i) ASSERT_EQ(it[i], s.global_rank(i));
    V fe;
    s.base().for_each([&](std::size_t r) { fe.push_back(r); });
    ASSERT_EQ(fe, it);
    // Non-members are rejected.
    std::size_t hi = it.empty() ? 0 : *std::max_element(it.begin(), it.end());
    for (std::size_t r = 0; r <= hi + 1; ++r) {
      ASSERT_EQ(s.contains(r), std::find(it.begin(), it.end(), r) != it.end());
    }
  }
}

TEST(Property, SlicingTwiceEqualsDirectSlice) {
  std::mt19937_64 rng(0x5eed0003);
  for (int c = 0; c < kCases; ++c) {
    const Shape s = random_shape(rng);
    if (s.num_dims() == 0) continue;
    const std::size_t d = uni(rng, 0, s.num_dims() - 1);
    const std::string name = s.labels()[d];
    const std::size_t n = s.sizes()[d];
    const Range r1 = random_range(rng, n);
    const Shape once = s.slice(name, r1);
    const std::size_t m = once.sizes()[d];
    ASSERT_EQ(m, (range_end(r1, n) - r1.begin + r1.step - 1) / r1.step);
    if (rng() % 2 == 0) {
      const Range r2 = random_range(rng, m);
      Range composed;
      composed.begin = r1.begin + r2.begin * r1.step;
      composed.step = r1.step * r2.step;
      composed.end = r1.begin + (range_end(r2, m) - 1) * r1.step + 1;
      const Shape twice = once.slice(name, r2);
      const Shape direct = s.slice(name, composed);
      ASSERT_EQ(twice, direct) << s.to_string() << " " << r1 << " then " << r2;
      ASSERT_EQ(V(twice.base().begin(), twice.base().end()),
                V(direct.base().begin(), direct.base().end()));
    } else {
      const std::size_t i = uni(rng, 0, m - 1);
      const Shape twice = once.slice(name, i);
      const Shape direct = s.slice(name, r1.begin + i * r1.step);
      ASSERT_EQ(twice, direct);
    }
  }
}

// ---- selections

std::vector<std::string> kLabelPool = {"d0", "d1", "d2", "s0", "s1", "zz"};

Selection random_selection(std::mt19937_64& rng, std::size_t dims_left, int depth) {
  if (depth == 0 || dims_left == 0 || rng() % 6 == 0) {
    return rng() % 5 == 0 ? S::false_() : S::true_();
  }
  switch (rng() % 7) {
    case 0:
      return S::all(random_selection(rng, dims_left - 1, depth - 1));
    case 1:
      return S::first(random_selection(rng, dims_left - 1, depth - 1));
    case 2:
    case 3: {
      Range r;
      r.begin = uni(rng, 0, 6);
      if (rng() % 3 != 0) r.end = uni(rng, r.begin + 1, 8);
      r.step = uni(rng, 1, 3);
      return S::range(r, random_selection(rng, dims_left - 1, depth - 1));
    }
    case 4: {
      std::vector<std::string> ls;
      for (const auto& l : kLabelPool) {
        if (rng() % 3 == 0) ls.push_back(l);
      }
      if (ls.empty()) ls.push_back(kLabelPool[rng() % kLabelPool.size()]);
      return S::label(ls, random_selection(rng, dims_left - 1, depth - 1));
    }
    case 5:
      return S::union_(random_selection(rng, dims_left, depth - 1),
                       random_selection(rng, dims_left, depth - 1));
    default:
      return S::intersection(random_selection(rng, dims_left, depth - 1),
                             random_selection(rng, dims_left, depth - 1));
  }
}

// Independent reference semantics: does the selection contain local coordinates c?
bool matches(const Selection& s, const Shape& shape, const V& c, std::size_t d) {
  switch (s.kind()) {
    case S::Kind::True:
      return true;
    case S::Kind::False:
      return false;
    case S::Kind::All:
      return matches(s.inner(), shape, c, d + 1);
    case S::Kind::First:
      return c[d] == 0 && matches(s.inner(), shape, c, d + 1);
    case S::Kind::Range: {
      const Range& r = s.range_value();
      const bool in =
          c[d] >= r.begin && (!r.end || c[d] < *r.end) && (c[d] - r.begin) % r.step == 0;
      return in && matches(s.inner(), shape, c, d + 1);
    }
    case S::Kind::Label: {
      const auto& ls = s.labels();
      return std::find(ls.begin(), ls.end(), shape.labels()[d]) != ls.end() &&
             matches(s.inner(), shape, c, d + 1);
    }
    case S::Kind::Union:
      return matches(s.lhs(), shape, c, d) || matches(s.rhs(), shape, c, d);
    case S::Kind::Intersection:
      return matches(s.lhs(), shape, c, d) && matches(s.rhs(), shape, c, d);
  }
  return false;
}

TEST(Property, EvalEqualsBruteForce) {
  std::mt19937_64 rng(0x5eed0004);
  std::size_t nonempty = 0;
  for (int c = 0; c < kCases; ++c) {
    const Shape s = random_shape(rng);
    const Selection sel = random_selection(rng, s.num_dims(), 5);
    V expect;
    for (const Point& p : s) {
      if (matches(sel, s, p.coords(), 0)) expect.push_back(s.rank_of(p));
    }
    std::sort(expect.begin(), expect.end());
    const V got = eval_ranks(sel, s);
    ASSERT_EQ(got, expect) << to_string(sel) << " on " << s.to_string();
    ASSERT_EQ(eval(sel, s).ranks(), expect);
    nonempty += expect.empty() ? 0 : 1;
  }
  EXPECT_GT(nonempty, static_cast<std::size_t>(kCases / 4));  // the generator is not degenerate
}

TEST(Property, ParsePrintRoundTrip) {
  std::mt19937_64 rng(0x5eed0005);
  for (int c = 0; c < kCases; ++c) {
    const Selection sel = random_selection(rng, 5, 6);
    const std::string text = to_string(sel);
    Selection back;
    ASSERT_NO_THROW(back = parse(text)) << text;
    ASSERT_EQ(back, sel) << text << " reparsed as " << to_string(back);
    ASSERT_EQ(to_string(back), text);
  }
}

}  // namespace
}  // namespace monarch::ndslice
