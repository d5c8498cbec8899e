// Every layer's errors derive from the one root, each with its own stable code (docs/errors.md).
// This test sits beside the root but links the layers above it: it checks the whole tree.
#include <gtest/gtest.h>

#include <span>
#include <type_traits>

#include "monarch/actor/errors.hpp"
#include "monarch/channel/address.hpp"
#include "monarch/config/config.hpp"
#include "monarch/error.hpp"
#include "monarch/ft/lighthouse.hpp"
#include "monarch/ft/torch/allreduce.hpp"
#include "monarch/launch/hostlist.hpp"
#include "monarch/launch/kubernetes.hpp"
#include "monarch/launch/slurm.hpp"
#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/selection.hpp"
#include "monarch/rdma/rdma.hpp"
#include "monarch/wire/frame.hpp"
#include "monarch/wire/serialize.hpp"

namespace {

using monarch::Error;
using monarch::ErrorCode;

// AllreduceError is defined in the libtorch half (monarch_ft_torch): checked at compile time only.
static_assert(std::is_base_of_v<Error, monarch::ft::AllreduceError>);

template <class F>
ErrorCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  } catch (...) {
    ADD_FAILURE() << "threw something that is not a monarch::Error";
    return ErrorCode::Error;
  }
  ADD_FAILURE() << "did not throw";
  return ErrorCode::Error;
}

TEST(ErrorHierarchy, EachLayerThrowsAMonarchErrorWithItsCode) {
  using namespace monarch;
  EXPECT_EQ(code_of([] { (void)ndslice::Extent({"x"}, {0}); }), ErrorCode::Slice);
  EXPECT_EQ(code_of([] { (void)ndslice::parse("*,"); }), ErrorCode::SelectionParse);
  EXPECT_EQ(code_of([] { config::Config().set("no.such_key", "1"); }), ErrorCode::Config);
  EXPECT_EQ(code_of([] { (void)channel::ChannelAddr::parse("nope://x"); }), ErrorCode::Channel);
  try {
    (void)channel::ChannelAddr::parse("nope://x");
  } catch (const Error& e) {
    EXPECT_EQ(e.origin().address, "nope://x");  // the address at fault
  }
  EXPECT_EQ(code_of([] { (void)launch::expand_hostlist("node[3-1]"); }), ErrorCode::Hostlist);
  EXPECT_EQ(code_of([] { (void)wire::decode<std::string>(std::span<const std::byte>{}); }),
            ErrorCode::Decode);
}

TEST(ErrorHierarchy, EveryClassCarriesItsOwnCode) {
  using namespace monarch;
  ActorId a{"unix://@p0", "counter", 3};
  EXPECT_EQ(ActorError(a, "Counter::incr", "boom").code(), ErrorCode::Actor);
  EXPECT_EQ(ActorError(a, "Counter::incr", "boom").origin().actor, a.to_string());
  EXPECT_EQ(DeliveryFailure(a, "Counter::incr", "stopped").code(), ErrorCode::Delivery);
  SupervisionError s(a, "process exited with signal 9");
  EXPECT_EQ(s.code(), ErrorCode::Supervision);
  EXPECT_EQ(s.origin().address, "unix://@p0");
  EXPECT_EQ(TimeoutError("t").code(), ErrorCode::Timeout);
  EXPECT_EQ(DeadlockError("d").code(), ErrorCode::Deadlock);
  EXPECT_EQ(UsageError("u").code(), ErrorCode::Usage);
  EXPECT_EQ(wire::FrameError("f").code(), ErrorCode::Frame);
  EXPECT_EQ(rdma::RdmaError(rdma::RdmaErrc::Timeout, "r").code(), ErrorCode::Rdma);
  EXPECT_EQ(rdma::RdmaError(rdma::RdmaErrc::Timeout, "r").errc(), rdma::RdmaErrc::Timeout);
  EXPECT_EQ(ft::QuorumError("q").code(), ErrorCode::Quorum);
  EXPECT_EQ(launch::SlurmError("s").code(), ErrorCode::Slurm);
  EXPECT_EQ(launch::KubernetesError("k").code(), ErrorCode::Kubernetes);
}

}  // namespace
