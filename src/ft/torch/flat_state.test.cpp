// FlatState: parameters and gradients alias the flat buffers, load_from/bytes round trip, hash
// equality, header checks, the flat Adam update against torch::optim::Adam, and the
// shared-memory option (a real process reads the state by the shm route).
#include "monarch/ft/torch/flat_state.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <vector>

#include "monarch/rdma/rdma.hpp"
#include "rdma/testing/pattern.hpp"
#include "testing/subprocess.hpp"

using monarch::ft::FlatState;
using monarch::ft::FlatStateOptions;
using namespace std::chrono_literals;

namespace {

struct Net : torch::nn::Module {
  explicit Net(std::uint64_t seed)
      : a(register_module("a", torch::nn::Linear(5, 7))),
        b(register_module("b", torch::nn::Linear(7, 3))) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.uniform_(-0.5, 0.5, gen);
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a, b;
};

constexpr std::size_t kParams = 5 * 7 + 7 + 7 * 3 + 3;

bool inside(const void* p, std::span<const std::byte> range) {
  auto* b = static_cast<const std::byte*>(p);
  return b >= range.data() && b < range.data() + range.size();
}

torch::Tensor input() {
  return torch::linspace(-1, 1, 4 * 5).view({4, 5});
}

TEST(FlatState, ParametersAndGradientsAliasTheFlatBuffers) {
  Net net(1);
  std::vector<torch::Tensor> before;
  for (auto& p : net.parameters()) before.push_back(p.detach().clone());
  FlatState state(net);
  ASSERT_EQ(state.num_params(), kParams);
  EXPECT_EQ(state.bytes().size() % 64, 0u);
  EXPECT_GE(state.bytes().size(), 64 + 12 * kParams);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(state.bytes().data()) % 64, 0u);
  std::size_t offset = 0;
  auto params = net.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << "values kept";
    EXPECT_EQ(params[i].data_ptr<float>(), state.params().data() + offset) << "parameter " << i;
    EXPECT_TRUE(inside(params[i].data_ptr(), state.bytes()));
    EXPECT_TRUE(params[i].requires_grad());
    offset += static_cast<std::size_t>(params[i].numel());
  }

  // backward accumulates straight into grads(); zero_grads clears it through the same views.
  net.forward(input()).sum().backward();
  double norm = 0;
  for (float g : state.grads()) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 0.0);
  for (auto& p : net.parameters()) {
    EXPECT_GE(p.grad().data_ptr<float>(), state.grads().data());
    EXPECT_LT(p.grad().data_ptr<float>(), state.grads().data() + state.grads().size());
  }
  auto first = std::vector<float>(state.grads().begin(), state.grads().end());
  state.zero_grads();
  for (auto& p : net.parameters()) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.0f);
  net.forward(input()).sum().backward();
  EXPECT_EQ(std::vector<float>(state.grads().begin(), state.grads().end()), first)
      << "same input after zero_grads gives the same gradients";
  state.scale_grads(0.5f);
  EXPECT_EQ(state.grads()[0], first[0] * 0.5f);

  // Writes through the flat buffer are what the module computes with.
  auto out = net.forward(input()).detach().clone();
  state.params()[0] += 1.0f;
  EXPECT_FALSE(torch::equal(net.forward(input()), out));
}

TEST(FlatState, LoadFromMakesReplicasBitwiseEqual) {
  Net net_a(1), net_b(2);
  FlatState a(net_a), b(net_b);
  EXPECT_NE(a.hash(), b.hash());
  net_a.forward(input()).sum().backward();
  a.adam_step({});
  a.adam_step({});
  a.set_data_position(12345);
  EXPECT_EQ(a.step(), 2);
  b.load_from(a.bytes());
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()), 0);
  EXPECT_EQ(b.step(), 2);
  EXPECT_EQ(b.data_position(), 12345);
  EXPECT_TRUE(torch::equal(net_a.forward(input()), net_b.forward(input())));
  // Optimizer moments came along: the next identical step keeps them equal. (Gradients are not
  // committed state: each replica zeroes its own.)
  a.zero_grads();
  b.zero_grads();
  net_b.forward(input()).sum().backward();
  net_a.forward(input()).sum().backward();
  a.adam_step({});
  b.adam_step({});
  EXPECT_EQ(a.hash(), b.hash());
}

TEST(FlatState, HashSeesOneBit) {
  Net net(3);
  FlatState s(net);
  auto h = s.hash();
  s.bytes()[s.bytes().size() / 2] ^= std::byte{1};
  EXPECT_NE(s.hash(), h);
  s.bytes()[s.bytes().size() / 2] ^= std::byte{1};
  EXPECT_EQ(s.hash(), h);
  s.set_step(1);
  EXPECT_NE(s.hash(), h) << "step is part of the committed state";
}

TEST(FlatState, LoadFromRejectsForeignBytesAndKeepsState) {
  Net net(1);
  FlatState s(net);
  auto h = s.hash();
  std::vector<std::byte> shorter(s.bytes().begin(), s.bytes().end() - 64);
  EXPECT_THROW(s.load_from(shorter), monarch::UsageError);
  std::vector<std::byte> bad(s.bytes().begin(), s.bytes().end());
  bad[0] ^= std::byte{0xff};  // magic
  EXPECT_THROW(s.load_from(bad), monarch::UsageError);
  std::vector<std::byte> other_count(s.bytes().begin(), s.bytes().end());
  other_count[8] ^= std::byte{1};  // P
  EXPECT_THROW(s.load_from(other_count), monarch::UsageError);
  EXPECT_EQ(s.hash(), h);

  // A raw write straight into bytes() (what an RdmaBuffer read does) is checked afterwards.
  s.check_header();
  std::memcpy(s.bytes().data(), bad.data(), s.bytes().size());
  EXPECT_THROW(s.check_header(), monarch::UsageError);
}

TEST(FlatState, AdamMatchesTorchOptimAdam) {
  Net flat_net(4), ref_net(4);
  FlatState state(flat_net);
  monarch::ft::AdamOptions opts{.lr = 0.01, .weight_decay = 0.001};
  torch::optim::Adam ref(ref_net.parameters(),
                         torch::optim::AdamOptions(opts.lr).weight_decay(opts.weight_decay));
  for (int i = 0; i < 5; ++i) {
    state.zero_grads();
    flat_net.forward(input() * (i + 1)).pow(2).sum().backward();
    state.adam_step(opts);
    ref.zero_grad();
    ref_net.forward(input() * (i + 1)).pow(2).sum().backward();
    ref.step();
  }
  EXPECT_EQ(state.step(), 5);
  auto flat_params = flat_net.parameters();
  auto ref_params = ref_net.parameters();
  for (std::size_t i = 0; i < flat_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(flat_params[i], ref_params[i]))
        << "parameter " << i << " differs from torch::optim::Adam";
  }
}

// FlatStateOptions::shared_memory: bytes() is the memory of an allocate()d RdmaBuffer, training
// on it is bitwise what training on heap memory gives, another process reads it by the shm route
// (a heal at memcpy speed), a healer can read a donor straight into its own bytes(), and the
// module's parameters stay valid after the FlatState is gone.
TEST(FlatState, SharedMemoryStateIsServedByTheShmRoute) {
  Net shm_net(6), heap_net(6), healer_net(7);
  FlatState state(shm_net, FlatStateOptions{.shared_memory = true, .rdma_name = "test.state"});
  FlatState heap(heap_net);
  EXPECT_EQ(heap.rdma_buffer(), nullptr);
  ASSERT_NE(state.rdma_buffer(), nullptr);
  EXPECT_EQ(state.rdma_buffer()->memory().data(), state.bytes().data());
  EXPECT_EQ(state.rdma_buffer()->memory().size(), state.bytes().size());
  EXPECT_EQ(state.bytes().size(), heap.bytes().size());
  for (auto& p : shm_net.parameters()) EXPECT_TRUE(inside(p.data_ptr(), state.bytes()));

  monarch::ft::AdamOptions opts{.lr = 0.01};
  for (int i = 0; i < 3; ++i) {
    for (auto [s, net] : {std::pair{&state, &shm_net}, std::pair{&heap, &heap_net}}) {
      s->zero_grads();
      net->forward(input() * (i + 1)).pow(2).sum().backward();
      s->adam_step(opts);
    }
  }
  EXPECT_EQ(state.hash(), heap.hash()) << "same training on shared memory and on heap memory";

  // Another process on this host reads it by the shm route (a donor serving a healer).
  state.rdma_buffer()->sync();
  monarch::testing::Subprocess reader(
      MONARCH_RDMA_PEER,
      {"read-route", monarch::rdma::testing::to_hex(state.rdma_buffer()->handle()), "0",
       std::to_string(state.bytes().size())});
  auto line = reader.line(30s);
  while (line && !line->starts_with("SUM ")) line = reader.line(30s);  // skip log lines
  ASSERT_TRUE(line) << "rdma_peer read-route printed no SUM line";
  EXPECT_EQ(*line, "SUM " + std::to_string(monarch::rdma::testing::checksum(state.bytes())) +
                       " ROUTE shm");

  // A healer reads the donor straight into its own shared-memory bytes(), no staging copy.
  FlatState healer(healer_net, FlatStateOptions{.shared_memory = true});
  ASSERT_NE(healer.hash(), state.hash());
  state.rdma_buffer()->handle().read_into(healer.bytes()).get(30s);
  healer.rdma_buffer()->sync();
  healer.check_header();
  EXPECT_EQ(healer.hash(), state.hash());
  EXPECT_EQ(healer.step(), 3);
  EXPECT_TRUE(torch::equal(healer_net.forward(input()), shm_net.forward(input())));

  // The parameters' storage keeps the shared memory alive after the FlatState is gone.
  Net kept_net(8);
  auto expected = kept_net.forward(input()).detach().clone();
  { FlatState gone(kept_net, FlatStateOptions{.shared_memory = true}); }
  EXPECT_TRUE(torch::equal(kept_net.forward(input()), expected));
}

TEST(FlatState, RejectsNonFloatParameters) {
  torch::nn::Linear lin(2, 2);
  lin->to(torch::kFloat64);
  EXPECT_THROW(FlatState{*lin}, monarch::UsageError);
  torch::nn::Module empty;
  EXPECT_THROW(FlatState{empty}, monarch::UsageError);
}

// A second FlatState over a module took the parameters' .grad away from the first, whose grads()
// then stayed zero while the job trained nothing, without an error (newcomer report, stop 51).
TEST(FlatState, OneFlatStateAtATimePerModule) {
  Net net(3);
  auto first = std::make_unique<FlatState>(net);
  try {
    FlatState second(net);
    FAIL() << "a second live FlatState over the same module was accepted";
  } catch (const monarch::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("already bound into another FlatState"), std::string::npos)
        << e.what();
  }
  // The first one still owns the gradients.
  torch::nn::functional::mse_loss(net.forward(torch::ones({2, 5})), torch::zeros({2, 3}))
      .backward();
  float sum = 0;
  for (float g : first->grads()) sum += std::abs(g);
  EXPECT_GT(sum, 0.0f);
  // Moved, it is still the one; once it is gone, the module can be wrapped again.
  FlatState moved(std::move(*first));
  EXPECT_THROW(FlatState{net}, monarch::UsageError);
  Net other(4);
  FlatState assigned(other);
  assigned = std::move(moved);
  EXPECT_THROW(FlatState{net}, monarch::UsageError);
  first.reset();
  { FlatState gone = std::move(assigned); }
  FlatState again(net);
  EXPECT_EQ(again.num_params(), kParams);
}

}  // namespace
