// The error root: stable codes, names, origins (docs/errors.md).
#include "monarch/error.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

using monarch::Error;
using monarch::ErrorCode;
using monarch::Origin;

// The numbers cross the wire and Python maps them to exception classes: changing one is a
// protocol break, so each is pinned here.
TEST(ErrorRoot, CodesAreStableNumbersWithDistinctNames) {
  const std::pair<ErrorCode, int> pinned[] = {
      {ErrorCode::Error, 1},          {ErrorCode::Usage, 2},  {ErrorCode::Timeout, 3},
      {ErrorCode::Deadlock, 4},       {ErrorCode::Config, 5}, {ErrorCode::Slice, 6},
      {ErrorCode::SelectionParse, 7}, {ErrorCode::Frame, 8},  {ErrorCode::Decode, 9},
      {ErrorCode::Channel, 10},       {ErrorCode::Actor, 11}, {ErrorCode::Delivery, 12},
      {ErrorCode::Supervision, 13},   {ErrorCode::Rdma, 14},  {ErrorCode::Quorum, 15},
      {ErrorCode::Allreduce, 16},     {ErrorCode::Slurm, 17}, {ErrorCode::Hostlist, 18},
      {ErrorCode::Kubernetes, 19},
  };
  std::set<std::string> names;
  for (auto [code, number] : pinned) {
    EXPECT_EQ(static_cast<int>(code), number);
    std::string name(monarch::error_code_name(code));
    EXPECT_NE(name, "unknown") << number;
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
  }
  EXPECT_EQ(monarch::error_code_name(static_cast<ErrorCode>(999)), "unknown");
}

TEST(ErrorRoot, MessageIsWhatAndOriginIsKept) {
  Error e(ErrorCode::Channel, "cannot bind tcp://127.0.0.1:1",
          Origin{.address = "tcp://127.0.0.1:1"});
  EXPECT_STREQ(e.what(), "cannot bind tcp://127.0.0.1:1");
  EXPECT_EQ(e.message(), e.what());
  EXPECT_EQ(e.code(), ErrorCode::Channel);
  EXPECT_EQ(e.origin().address, "tcp://127.0.0.1:1");
  EXPECT_EQ(e.origin().to_string(), "address tcp://127.0.0.1:1");

  Error plain("something");
  EXPECT_EQ(plain.code(), ErrorCode::Error);
  EXPECT_TRUE(plain.origin().empty());
  EXPECT_EQ(plain.origin().to_string(), "");
}

TEST(ErrorRoot, OriginListsOnlyTheKnownFields) {
  Origin o{.actor = "w[0].counter[3]", .rank = 5, .address = "unix://@p0"};
  EXPECT_FALSE(o.empty());
  EXPECT_EQ(o.to_string(), "actor w[0].counter[3], rank 5, address unix://@p0");
  EXPECT_EQ((Origin{.rank = 0}).to_string(), "rank 0");
}

TEST(ErrorRoot, UsageErrorIsAnErrorWithItsCode) {
  try {
    throw monarch::UsageError("Future::get: value already retrieved");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Usage);
    EXPECT_STREQ(e.what(), "Future::get: value already retrieved");
  }
}

}  // namespace
