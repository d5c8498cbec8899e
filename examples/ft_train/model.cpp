// The ft_train MLP (model.hpp).
#include "model.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace monarch::ft::example {

void init_torch_worker(int threads) {
  torch::set_num_threads(threads);
}

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int hidden, torch::Generator& gen)
      : fc1(register_module("fc1", torch::nn::Linear(kImagePixels, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, kClasses))) {
    torch::NoGradGuard no_grad;
    for (auto* layer : {&fc1, &fc2}) {
      const double bound = 1.0 / std::sqrt(static_cast<double>((*layer)->weight.size(1)));
      (*layer)->weight.uniform_(-bound, bound, gen);
      (*layer)->bias.uniform_(-bound, bound, gen);
    }
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }

  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

// Copies samples `indices` of `data` (normalized) into a [n, 784] input and [n] int64 label tensor.
std::pair<torch::Tensor, torch::Tensor> gather(const Dataset& data,
                                               std::span<const std::int64_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  auto x = torch::empty({n, kImagePixels}, torch::kFloat32);
  auto y = torch::empty({n}, torch::kInt64);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const std::int64_t s = indices[static_cast<std::size_t>(i)];
    if (s < 0 || s >= data.size) {
      throw std::out_of_range("sample index " + std::to_string(s) + " outside dataset of " +
                              std::to_string(data.size));
    }
    const std::uint8_t* px = data.pixels.data() + s * kImagePixels;
    float* out = xp + i * kImagePixels;
    for (int k = 0; k < kImagePixels; ++k) out[k] = Dataset::normalized(px[k]);
    yp[i] = data.labels[static_cast<std::size_t>(s)];
  }
  return {x, y};
}

}  // namespace

struct Model::Impl {
  Impl(std::uint64_t seed, int hidden)
      : gen(at::make_generator<at::CPUGeneratorImpl>(seed)),
        mlp(hidden, gen),
        state(mlp, FlatStateOptions{.shared_memory = true, .rdma_name = "mlp.state"}) {}
  torch::Generator gen;
  MlpImpl mlp;
  FlatState state;
};

Model::Model(std::uint64_t seed, int hidden) : impl_(std::make_unique<Impl>(seed, hidden)) {}
Model::~Model() = default;

FlatState& Model::state() noexcept {
  return impl_->state;
}
const FlatState& Model::state() const noexcept {
  return impl_->state;
}

double Model::forward_backward(const Dataset& data, std::span<const std::int64_t> indices) {
  if (indices.empty()) throw std::invalid_argument("Model::forward_backward: empty batch");
  impl_->state.zero_grads();
  auto [x, y] = gather(data, indices);
  auto loss = torch::nn::functional::cross_entropy(impl_->mlp.forward(x), y);
  loss.backward();
  return loss.item<double>();
}

double Model::evaluate(const Dataset& data) const {
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0;
  std::vector<std::int64_t> idx;
  for (std::int64_t start = 0; start < data.size; start += 1000) {
    const std::int64_t end = std::min<std::int64_t>(data.size, start + 1000);
    idx.clear();
    for (std::int64_t i = start; i < end; ++i) idx.push_back(i);
    auto [x, y] = gather(data, idx);
    correct += impl_->mlp.forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  return data.size == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(data.size);
}

}  // namespace monarch::ft::example
