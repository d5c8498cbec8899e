// The seeded global data stream both workloads draw from (Sampler, fashion_mnist.hpp): epoch
// permutations and disjoint shares of each global batch. Torch-free; in ft_llama_lib, which
// ft_train_lib links, so the MLP's images and llama-tiny's text windows use one implementation.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "fashion_mnist.hpp"

namespace monarch::ft::example {

namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Sampler::Sampler(std::int64_t dataset_size, std::uint64_t seed) : size_(dataset_size), seed_(seed) {
  if (dataset_size <= 0) throw std::invalid_argument("Sampler: empty dataset");
}

const std::vector<std::int64_t>& Sampler::permutation(std::int64_t epoch) {
  if (epoch == cached_epoch_) return perm_;
  perm_.resize(static_cast<std::size_t>(size_));
  for (std::int64_t i = 0; i < size_; ++i) perm_[static_cast<std::size_t>(i)] = i;
  // Fisher-Yates with our own generator (std:: distributions differ between standard
  // libraries; this stream is fixed by (seed, epoch) alone).
  std::uint64_t state = seed_ ^ (0xd1b54a32d192ed03ULL * static_cast<std::uint64_t>(epoch + 1));
  for (std::int64_t i = size_ - 1; i > 0; --i) {
    auto j = static_cast<std::int64_t>(splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
  }
  cached_epoch_ = epoch;
  return perm_;
}

std::int64_t Sampler::at(std::int64_t position) {
  if (position < 0) throw std::invalid_argument("Sampler: negative position");
  return permutation(position / size_)[static_cast<std::size_t>(position % size_)];
}

std::vector<std::int64_t> Sampler::shard(std::int64_t position, std::int64_t global_batch,
                                         int replica, int replicas) {
  if (replicas <= 0 || replica < 0 || replica >= replicas || global_batch < replicas) {
    throw std::invalid_argument("Sampler::shard: replica " + std::to_string(replica) + " of " +
                                std::to_string(replicas) + " with global batch " +
                                std::to_string(global_batch));
  }
  const std::int64_t begin = global_batch * replica / replicas;
  const std::int64_t end = global_batch * (replica + 1) / replicas;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(end - begin));
  for (std::int64_t p = position + begin; p < position + end; ++p) out.push_back(at(p));
  return out;
}

}  // namespace monarch::ft::example
