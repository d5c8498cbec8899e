// The launchers' command runner (src/launch/subprocess.hpp): what SlurmJob relies on (stdin from
// /dev/null, extra environment, every outcome in the result). KubernetesJob's side (stdin fed
// through a pipe, the throwing form) is tested in kubernetes.test.cpp.
#include "launch/subprocess.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>

#include "monarch/actor/errors.hpp"

using namespace std::chrono_literals;
using monarch::launch::detail::CommandFailure;
using monarch::launch::detail::try_run_command;
using ::testing::HasSubstr;

TEST(Subprocess, NoInputIsDevNullAndEnvEntriesReplaceOurs) {
  ::setenv("MONARCH_SUBPROCESS_TEST_A", "ours", 1);
  ::setenv("MONARCH_SUBPROCESS_TEST_B", "kept", 1);
  auto r = try_run_command(
      {"sh", "-c",
       "readlink /proc/self/fd/0; echo \"$MONARCH_SUBPROCESS_TEST_A $MONARCH_SUBPROCESS_TEST_B "
       "$MONARCH_SUBPROCESS_TEST_C\"; cat"},
      {.env = {"MONARCH_SUBPROCESS_TEST_A=theirs", "MONARCH_SUBPROCESS_TEST_C=new"},
       .timeout = 10s});
  EXPECT_EQ(r.failure, CommandFailure::none);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "/dev/null\ntheirs kept new\n");  // cat read EOF at once
  ::unsetenv("MONARCH_SUBPROCESS_TEST_A");
  ::unsetenv("MONARCH_SUBPROCESS_TEST_B");
}

TEST(Subprocess, OutcomesAreInTheResult) {
  auto r = try_run_command({"sh", "-c", "echo partial; kill -TERM $$"}, {.timeout = 10s});
  EXPECT_EQ(r.failure, CommandFailure::none);
  EXPECT_EQ(r.status, 128 + 15);  // ended by SIGTERM
  EXPECT_EQ(r.out, "partial\n");

  auto start = std::chrono::steady_clock::now();
  r = try_run_command({"sh", "-c", "echo before; exec sleep 30"}, {.timeout = 300ms});
  EXPECT_EQ(r.failure, CommandFailure::timeout);
  EXPECT_EQ(r.status, -1);
  EXPECT_EQ(r.out, "before\n");  // what it wrote before it was killed
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);

  r = try_run_command({"/nonexistent/sbatch", "--parsable"}, {.timeout = 1s});
  EXPECT_EQ(r.failure, CommandFailure::spawn);
  EXPECT_EQ(r.error, ENOENT);
  EXPECT_EQ(r.status, -1);

  EXPECT_THROW(try_run_command({}, {}), monarch::UsageError);
}

TEST(Subprocess, TheThrowingFormNamesTheCommand) {
  try {
    monarch::launch::detail::run_command({"/nonexistent/kubectl", "get"}, {.timeout = 1s});
    ADD_FAILURE() << "no error";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/kubectl get: cannot start /nonexistent/kubectl: "
                                    "No such file or directory"));
  }
  auto r = monarch::launch::detail::run_command({"false"}, {.timeout = 10s});
  EXPECT_EQ(r.status, 1);  // not an error: the caller reads the status
}
