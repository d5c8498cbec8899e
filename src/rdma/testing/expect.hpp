// Test support (gtest): expect an RdmaError with a given code.
#pragma once

#include <gtest/gtest.h>

#include "monarch/rdma/rdma.hpp"

namespace monarch::rdma::testing {

/// Runs f; records a failure unless it throws RdmaError with `code`. Returns the error caught.
template <class F>
RdmaError expect_rdma_error(F&& f, RdmaErrc code) {
  try {
    f();
  } catch (const RdmaError& e) {
    EXPECT_EQ(e.errc(), code) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected RdmaError(" << errc_name(code) << ")";
  return RdmaError(code, "");
}

}  // namespace monarch::rdma::testing
