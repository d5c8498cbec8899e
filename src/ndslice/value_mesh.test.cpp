#include "monarch/ndslice/value_mesh.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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

// Per-rank failures. ndslice sits below the actor layer, so these use their own exception types;
// what matters is that a read rethrows the very exception that was stored.
struct ErrA : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ErrB : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <class E>
std::exception_ptr err(const std::string& what) {
  return std::make_exception_ptr(E(what));
}

// T need not be default-constructible.
struct NoDefault {
  explicit NoDefault(int x) : v(x) {}
  int v;
  friend bool operator==(const NoDefault& a, const NoDefault& b) { return a.v == b.v; }
};

TEST(ValueMeshFailures, AllRanksFailed) {
  std::vector<std::optional<NoDefault>> slots(kE.num_ranks());
  std::vector<ValueMesh<NoDefault>::Failure> failures;
  for (std::size_t r = kE.num_ranks(); r-- > 0;) failures.emplace_back(r, err<ErrA>("dead"));
  auto m = ValueMesh<NoDefault>::from_slots(kE, slots, failures);
  EXPECT_EQ(m.size(), 8u);
  EXPECT_EQ(m.runs(), 0u);
  EXPECT_FALSE(m.all_ok());
  EXPECT_EQ(m.failed_ranks(), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (std::size_t r = 0; r < m.size(); ++r) {
    EXPECT_FALSE(m.ok(r));
    EXPECT_NE(m.error(r), nullptr);
    EXPECT_THROW((void)m.get(r), ErrA);
  }
  EXPECT_THROW((void)m.get(kE.point(7)), ErrA);
  EXPECT_THROW((void)m.to_vector(), ErrA);
  EXPECT_THROW(m.throw_if_failed(), ErrA);
  EXPECT_THROW((void)*m.begin(), ErrA);
  EXPECT_THROW((void)m.get(8), SliceError);  // out of range stays a SliceError
  // A value again: one run, the other ranks stay failed.
  m.set(5, NoDefault(3));
  EXPECT_EQ(m.runs(), 1u);
  EXPECT_TRUE(m.ok(5));
  EXPECT_EQ(m.get(5).v, 3);
  EXPECT_THROW((void)m.get(4), ErrA);
  EXPECT_THROW((void)m.get(6), ErrA);
  EXPECT_EQ(m.failed_ranks(), (std::vector<std::size_t>{0, 1, 2, 3, 4, 6, 7}));
  // Failing every rank again drops the stored value.
  m.set_error(5, err<ErrB>("late"));
  EXPECT_EQ(m.runs(), 0u);
  EXPECT_THROW((void)m.get(5), ErrB);
}

TEST(ValueMeshFailures, FailureInTheMiddleOfARun) {
  ValueMesh<int> m(kE, 7);
  EXPECT_TRUE(m.all_ok());
  EXPECT_EQ(m.error(3), nullptr);
  m.set_error(3, err<ErrA>("rank 3 died"));
  EXPECT_EQ(m.runs(), 1u);  // the run is not split; its value is just not read at rank 3
  EXPECT_FALSE(m.all_ok());
  EXPECT_TRUE(m.ok(2));
  EXPECT_FALSE(m.ok(3));
  EXPECT_TRUE(m.ok(4));
  EXPECT_EQ(m.get(2), 7);
  EXPECT_EQ(m[4], 7);
  try {
    (void)m[3];
    FAIL() << "a failed rank must rethrow";
  } catch (const ErrA& e) {
    EXPECT_STREQ(e.what(), "rank 3 died");
  }
  EXPECT_THROW((void)m.get(kE.point(3)), ErrA);
  EXPECT_THROW((void)m[kE.point(3)], ErrA);
  EXPECT_EQ(m.get(kE.point(2)), 7);
  EXPECT_EQ(m.failed_ranks(), (std::vector<std::size_t>{3}));
  EXPECT_NE(m.error(3), nullptr);
  EXPECT_EQ(m.error(2), nullptr);
  EXPECT_THROW((void)m.ok(8), SliceError);
  EXPECT_THROW((void)m.error(8), SliceError);
  EXPECT_THROW(m.set_error(8, err<ErrA>("x")), SliceError);
  EXPECT_THROW((void)m.get(8), SliceError);
  // A second error for the same rank replaces the first.
  m.set_error(3, err<ErrB>("again"));
  EXPECT_THROW((void)m[3], ErrB);
  EXPECT_EQ(m.failed_ranks().size(), 1u);
  // A null error is refused, and leaves the mesh as it was.
  try {
    m.set_error(4, nullptr);
    FAIL() << "a null error must be refused";
  } catch (const SliceError& e) {
    EXPECT_THAT(e.what(), HasSubstr("null error for rank 4"));
  }
  EXPECT_TRUE(m.ok(4));
}

TEST(ValueMeshFailures, SetClearsTheFailure) {
  auto m = ValueMesh<int>::from_vector(kE, {1, 1, 2, 2, 2, 3, 3, 3});
  m.set_error(0, err<ErrA>("a"));
  m.set_error(3, err<ErrA>("b"));
  m.set(3, 2);  // the value it had: still clears the failure
  EXPECT_TRUE(m.ok(3));
  EXPECT_EQ(m[3], 2);
  EXPECT_EQ(m.runs(), 3u);
  m.set(0, 9);
  EXPECT_TRUE(m.all_ok());
  EXPECT_EQ(m.runs(), 4u);
  EXPECT_EQ(m.to_vector(), (std::vector<int>{9, 1, 2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(m, ValueMesh<int>::from_vector(kE, {9, 1, 2, 2, 2, 3, 3, 3}));
  m.set_error(6, err<ErrA>("c"));
  m.set(kE.point(6), 4);
  EXPECT_TRUE(m.all_ok());
  EXPECT_EQ(m.to_vector(), (std::vector<int>{9, 1, 2, 2, 2, 3, 4, 3}));
}

TEST(ValueMeshFailures, EqualityComparesFailedRanksNotTheirErrors) {
  // Same values where ok, the failed rank (3) in different runs: equal.
  auto a = ValueMesh<int>::from_vector(kE, {1, 1, 1, 1, 2, 2, 2, 2});
  a.set_error(3, err<ErrA>("a"));
  auto b = ValueMesh<int>::from_vector(kE, {1, 1, 1, 2, 2, 2, 2, 2});
  b.set_error(3, err<ErrB>("b"));  // another error: compared by rank only
  auto c =
      ValueMesh<int>::from_slots(kE, {1, 1, 1, std::nullopt, 2, 2, 2, 2}, {{3, err<ErrA>("c")}});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, c);
  // Not equal: a different failed rank, an extra failed rank, no failure, a different value.
  auto d = ValueMesh<int>::from_vector(kE, {1, 1, 1, 1, 2, 2, 2, 2});
  d.set_error(2, err<ErrA>("d"));
  EXPECT_NE(a, d);
  auto e = a;
  e.set_error(7, err<ErrA>("e"));
  EXPECT_NE(a, e);
  EXPECT_NE(e, a);
  EXPECT_NE(a, ValueMesh<int>::from_vector(kE, {1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_NE(ValueMesh<int>::from_vector(kE, {1, 1, 1, 1, 2, 2, 2, 2}), a);
  auto f = a;
  f.set(4, 5);
  EXPECT_NE(a, f);
  // Every rank failed on both sides; and a different extent.
  std::vector<ValueMesh<int>::Failure> all;
  for (std::size_t r = 0; r < 8; ++r) all.emplace_back(r, err<ErrA>("x"));
  auto g = ValueMesh<int>::from_slots(kE, std::vector<std::optional<int>>(8), all);
  auto h = ValueMesh<int>(kE, 4);
  for (std::size_t r = 0; r < 8; ++r) h.set_error(r, err<ErrB>("y"));
  EXPECT_EQ(g, h);
  EXPECT_NE(g, a);
  auto i = ValueMesh<int>(Extent{{"x", 8}}, 1);
  i.set_error(3, err<ErrA>("i"));
  EXPECT_NE(a, i);
}

TEST(ValueMeshFailures, IteratorRethrowsAtAFailedRank) {
  auto m = ValueMesh<std::string>::from_slots(
      kE, {"a", "a", std::nullopt, "b", "b", std::nullopt, "c", "c"},
      {{5, err<ErrB>("five")}, {2, err<ErrA>("two")}});
  std::vector<std::string> seen;
  std::size_t thrown_a = 0;
  std::size_t thrown_b = 0;
  std::size_t r = 0;
  for (auto it = m.begin(); it != m.end(); ++it, ++r) {
    EXPECT_EQ(m.ok(r), r != 2 && r != 5);
    try {
      auto [p, v] = *it;
      EXPECT_EQ(p.rank(), r);
      seen.push_back(v);
    } catch (const ErrA& e) {
      EXPECT_EQ(r, 2u);
      EXPECT_STREQ(e.what(), "two");
      ++thrown_a;
    } catch (const ErrB& e) {
      EXPECT_EQ(r, 5u);
      EXPECT_STREQ(e.what(), "five");
      ++thrown_b;
    }
  }
  EXPECT_EQ(r, 8u);
  EXPECT_EQ(thrown_a, 1u);
  EXPECT_EQ(thrown_b, 1u);
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "a", "b", "b", "c", "c"}));
  EXPECT_EQ(m.runs(), 3u);  // failed slots never start a run of their own
}

TEST(ValueMeshFailures, ToVectorThrowsTheLowestFailedRanksErrorWithItsType) {
  ValueMesh<int> m(kE, 0);
  m.set_error(6, err<ErrB>("six"));
  m.set_error(1, err<ErrA>("one"));
  m.set_error(4, std::make_exception_ptr(SliceError("four")));
  EXPECT_EQ(m.failed_ranks(), (std::vector<std::size_t>{1, 4, 6}));
  try {
    (void)m.to_vector();
    FAIL() << "to_vector of a mesh with failures must throw";
  } catch (const ErrA& e) {
    EXPECT_STREQ(e.what(), "one");
  }
  EXPECT_THROW(m.throw_if_failed(), ErrA);
  m.set(1, 5);
  EXPECT_THROW((void)m.to_vector(), SliceError);  // now rank 4's, still its own type
  m.set(4, 5);
  EXPECT_THROW((void)m.to_vector(), ErrB);
  m.set(6, 5);
  EXPECT_NO_THROW(m.throw_if_failed());
  EXPECT_EQ(m.to_vector(), (std::vector<int>{0, 5, 0, 0, 5, 0, 5, 0}));
}

TEST(ValueMeshFailures, FromSlotsRejectsInconsistentInput) {
  using M = ValueMesh<int>;
  auto expect_slice_error = [](auto fn, const std::string& text) {
    try {
      fn();
      ADD_FAILURE() << "expected SliceError containing: " << text;
    } catch (const SliceError& e) {
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  const std::vector<std::optional<int>> ok{1, 1, 1, 1, 2, 2, 2, 2};
  auto with_hole = ok;
  with_hole[5] = std::nullopt;
  expect_slice_error([&] { (void)M::from_slots(kE, {1, 2, 3}, {}); }, "3 slots for extent");
  expect_slice_error([&] { (void)M::from_slots(kE, with_hole, {}); },
                     "rank 5 has neither a value nor a failure");
  expect_slice_error(
      [&] {
        (void)M::from_slots(kE, ok, {{2, err<ErrA>("x")}});
      },
      "failure for rank 2, but its slot holds a value");
  expect_slice_error(
      [&] {
        (void)M::from_slots(kE, with_hole, {{5, err<ErrA>("x")}, {5, err<ErrA>("y")}});
      },
      "failure for rank 5 given twice");
  expect_slice_error(
      [&] {
        (void)M::from_slots(kE, with_hole, {{5, nullptr}});
      },
      "failure for rank 5 has a null error");
  expect_slice_error(
      [&] {
        (void)M::from_slots(kE, with_hole, {{5, err<ErrA>("x")}, {8, err<ErrA>("y")}});
      },
      "failure for rank 8 out of range");
  // The consistent input is accepted.
  auto m = M::from_slots(kE, with_hole, {{5, err<ErrA>("x")}});
  EXPECT_EQ(m.failed_ranks(), (std::vector<std::size_t>{5}));
  EXPECT_EQ(m.runs(), 2u);
  EXPECT_EQ(M::from_slots(kE, ok, {}), M::from_vector(kE, {1, 1, 1, 1, 2, 2, 2, 2}));
}

// Random set/set_error against a reference of optional values: reads, ok() and equality with the
// mesh rebuilt by from_slots agree after every step.
TEST(ValueMeshFailures, RandomSetsAndErrorsMatchReference) {
  std::mt19937_64 rng(11);
  Extent e{{"a", 3}, {"b", 5}};
  const std::size_t n = e.num_ranks();
  for (int round = 0; round < 200; ++round) {
    std::vector<std::optional<int>> ref(n, 0);
    ValueMesh<int> m(e, 0);
    for (int i = 0; i < 40; ++i) {
      const std::size_t r = rng() % n;
      if (rng() % 3 == 0) {
        ref[r] = std::nullopt;
        m.set_error(r, err<ErrA>(std::to_string(r)));
      } else {
        ref[r] = static_cast<int>(rng() % 3);
        m.set(r, *ref[r]);
      }
      std::vector<ValueMesh<int>::Failure> failures;
      for (std::size_t k = 0; k < n; ++k) {
        ASSERT_EQ(m.ok(k), ref[k].has_value());
        if (ref[k]) {
          ASSERT_EQ(m[k], *ref[k]);
        } else {
          failures.emplace_back(k, err<ErrB>("other"));
          ASSERT_THROW((void)m[k], ErrA);
        }
      }
      ASSERT_EQ(m.all_ok(), failures.empty());
      ASSERT_LE(m.runs(), n);
      ASSERT_EQ(m.runs() == 0, failures.size() == n);
      ASSERT_EQ(m, ValueMesh<int>::from_slots(e, ref, failures));
    }
  }
}

}  // namespace
}  // namespace monarch::ndslice
