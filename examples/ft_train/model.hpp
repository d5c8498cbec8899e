// The ft_train model: an MLP 784-256-10 (ReLU) on Fashion-MNIST whose parameters and Adam state
// live in a FlatState. Torch-free header (pimpl), so ft_train.cpp need not include libtorch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "fashion_mnist.hpp"
#include "monarch/ft/torch/flat_state.hpp"

namespace monarch::ft::example {

/// Call once at the start of every worker process, before any other torch work: limits libtorch
/// to `threads` intra-op threads (1 for replicas sharing a small host).
void init_torch_worker(int threads = 1);

/// Not thread-safe: one training thread per Model.
class Model {
 public:
  /// Builds the MLP with weights and biases drawn uniformly from +-1/sqrt(fan_in) (torch's
  /// nn::Linear default range) by a generator seeded with `seed` alone, so every replica built
  /// with the same seed starts bitwise equal (same FlatState::hash()).
  explicit Model(std::uint64_t seed, int hidden = 256);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  FlatState& state() noexcept;
  const FlatState& state() const noexcept;

  /// Zeroes state().grads(), then runs forward and backward on the samples `indices` of `data`:
  /// afterwards grads() holds the gradient of the mean cross-entropy over those samples. Returns
  /// that mean loss. With equal shards, summing grads over P replicas and scaling by 1/P gives
  /// the gradient of the global-batch mean. Throws std::out_of_range on a bad index,
  /// std::invalid_argument on an empty batch.
  double forward_backward(const Dataset& data, std::span<const std::int64_t> indices);

  /// Top-1 accuracy in [0, 1] over the whole of `data` (batches of 1000, no gradients).
  double evaluate(const Dataset& data) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace monarch::ft::example
