// SLURM hostlist expansion: ranges, padding, products, comma lists, and errors naming the bad text.
#include "monarch/launch/hostlist.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using monarch::launch::expand_hostlist;
using monarch::launch::HostlistError;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Hostlist, PlainNamesAndCommaLists) {
  EXPECT_THAT(expand_hostlist("localhost"), ElementsAre("localhost"));
  EXPECT_THAT(expand_hostlist("a,b,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(expand_hostlist("gpu-node.example.com"), ElementsAre("gpu-node.example.com"));
}

TEST(Hostlist, RangesKeepZeroPadding) {
  EXPECT_THAT(expand_hostlist("node[01-04,07]"),
              ElementsAre("node01", "node02", "node03", "node04", "node07"));
  EXPECT_THAT(expand_hostlist("n[001-003],m5"), ElementsAre("n001", "n002", "n003", "m5"));
  EXPECT_THAT(expand_hostlist("n[8-11]"), ElementsAre("n8", "n9", "n10", "n11"));
  EXPECT_THAT(expand_hostlist("n[098-101]"), ElementsAre("n098", "n099", "n100", "n101"));
  EXPECT_THAT(expand_hostlist("x[5]"), ElementsAre("x5"));
}

TEST(Hostlist, SuffixesAndProducts) {
  EXPECT_THAT(expand_hostlist("a[1-2]b"), ElementsAre("a1b", "a2b"));
  EXPECT_THAT(expand_hostlist("r[1-2]n[1-2]"), ElementsAre("r1n1", "r1n2", "r2n1", "r2n2"));
  EXPECT_THAT(expand_hostlist("a[1-2]b,c[3,5]-ib"), ElementsAre("a1b", "a2b", "c3-ib", "c5-ib"));
  EXPECT_EQ(expand_hostlist("big[0000-1023]").size(), 1024u);
  EXPECT_EQ(expand_hostlist("big[0000-1023]").back(), "big1023");
}

TEST(Hostlist, BadInputThrowsNamingTheText) {
  auto message = [](const char* text) {
    try {
      expand_hostlist(text);
    } catch (const HostlistError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message("node[01-04"), HasSubstr("'node[01-04'"));
  EXPECT_THAT(message("node[01-04"), HasSubstr("without ']'"));
  EXPECT_THAT(message("node01-04]"), HasSubstr("without '['"));
  EXPECT_THAT(message("node[04-01]"), HasSubstr("'04-01' runs backwards"));
  EXPECT_THAT(message("node[a-b]"), HasSubstr("range 'a-b'"));
  EXPECT_THAT(message("node[1-]"), HasSubstr("range '1-'"));
  EXPECT_THAT(message("node[]"), HasSubstr("empty brackets"));
  EXPECT_THAT(message("a,,b"), HasSubstr("empty host name"));
  EXPECT_THAT(message("a,"), HasSubstr("'a,'"));
  EXPECT_THAT(message(""), HasSubstr("empty"));
  EXPECT_THAT(message("n[1-[2]]"), HasSubstr("nested"));
  EXPECT_THAT(message("n[0-99999999]"), HasSubstr("too large"));
  EXPECT_THAT(message("a b"), HasSubstr("whitespace"));
}
