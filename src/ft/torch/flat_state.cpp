// FlatState (include/monarch/ft/torch/flat_state.hpp).
#include "monarch/ft/torch/flat_state.hpp"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "monarch/rdma/rdma.hpp"

namespace monarch::ft {

namespace {

constexpr std::uint64_t kMagic = 0x315441545346544dULL;  // "MFTSTAT1"
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kHeaderFloats = kHeaderBytes / sizeof(float);
constexpr std::size_t kAlignFloats = 16;  // total size a multiple of 64 bytes
// Header fields, as int64 slots.
constexpr std::size_t kMagicSlot = 0, kCountSlot = 1, kStepSlot = 2, kPositionSlot = 3;

std::int64_t read_slot(const std::byte* base, std::size_t slot) {
  std::int64_t v;
  std::memcpy(&v, base + slot * 8, 8);
  return v;
}
void write_slot(std::byte* base, std::size_t slot, std::int64_t v) {
  std::memcpy(base + slot * 8, &v, 8);
}

// The buffers of the live FlatStates. A module's parameters can be bound into one of them at a
// time: a second FlatState over the same module would take the parameters' .grad away from the
// first, whose grads() then stay zero while training goes on (nothing would fail).
std::mutex live_mu;
std::set<const void*>& live_buffers() {
  static std::set<const void*> live;
  return live;
}
void forget_buffer(const void* base) {
  std::lock_guard lock(live_mu);
  live_buffers().erase(base);
}

}  // namespace

struct FlatState::Impl {
  std::shared_ptr<rdma::RdmaBuffer> shm;  // shared_memory: holds buffer's memory
  torch::Tensor buffer;  // float32 [total]: header + params + exp_avg + exp_avg_sq + padding
  torch::Tensor params;  // views of buffer, [P] each
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
  torch::Tensor grads;  // float32 [P], separate
};

FlatState::FlatState(::torch::nn::Module& module, FlatStateOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto parameters = module.parameters(/*recurse=*/true);
  if (parameters.empty()) throw UsageError("FlatState: the module has no parameters");
  std::size_t count = 0;
  {
    std::lock_guard lock(live_mu);
    for (const auto& p : parameters) {
      if (p.device() != torch::kCPU || p.scalar_type() != torch::kFloat32 || p.is_sparse()) {
        throw UsageError("FlatState: parameter of shape " + c10::str(p.sizes()) +
                         " is not a dense CPU float32 tensor");
      }
      if (live_buffers().count(p.storage().data()) != 0) {
        throw UsageError("FlatState: the parameter of shape " + c10::str(p.sizes()) +
                         " is already bound into another FlatState, which is still alive: a "
                         "module can have one FlatState at a time (a second one takes the "
                         "parameters' gradients away from the first)");
      }
      count += static_cast<std::size_t>(p.numel());
    }
  }
  num_params_ = count;
  std::size_t total = kHeaderFloats + 3 * count;
  total = (total + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  auto& s = *impl_;
  if (options.shared_memory) {
    // allocate()d memory is zeroed and page-aligned. The tensor's storage keeps the RdmaBuffer
    // alive, so views bound into the module outlive this FlatState safely (as with torch::zeros).
    s.shm = std::make_shared<rdma::RdmaBuffer>(
        rdma::RdmaBuffer::allocate(total * sizeof(float), options.rdma_name));
    rdma_buffer_ = s.shm.get();
    // Touch every page now (the memfd starts as a hole): a heal writes the whole state at once,
    // and faulting the pages in there, one write fault per 4 KiB, made it several times slower.
    std::memset(s.shm->memory().data(), 0, s.shm->memory().size());
    s.buffer = torch::from_blob(
        s.shm->memory().data(), {static_cast<int64_t>(total)},
        [keep = s.shm](void*) mutable { keep.reset(); }, torch::kFloat32);
  } else {
    s.buffer = torch::zeros({static_cast<int64_t>(total)}, torch::kFloat32);
  }
  auto n = static_cast<int64_t>(count);
  s.params = s.buffer.narrow(0, kHeaderFloats, n);
  s.exp_avg = s.buffer.narrow(0, kHeaderFloats + n, n);
  s.exp_avg_sq = s.buffer.narrow(0, kHeaderFloats + 2 * n, n);
  s.grads = torch::zeros({n}, torch::kFloat32);

  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : parameters) {
    auto numel = p.numel();
    auto value = s.params.narrow(0, offset, numel).view(p.sizes());
    value.copy_(p.detach());
    p.set_data(value);
    p.mutable_grad() = s.grads.narrow(0, offset, numel).view(p.sizes());
    offset += numel;
  }
  base_ = reinterpret_cast<std::byte*>(s.buffer.data_ptr<float>());
  size_ = total * sizeof(float);
  params_ = s.params.data_ptr<float>();
  grads_ = s.grads.data_ptr<float>();
  write_slot(base_, kMagicSlot, static_cast<std::int64_t>(kMagic));
  write_slot(base_, kCountSlot, static_cast<std::int64_t>(count));
  std::lock_guard lock(live_mu);
  live_buffers().insert(base_);
}

FlatState::~FlatState() {
  if (impl_) forget_buffer(base_);
}
FlatState::FlatState(FlatState&&) noexcept = default;
FlatState& FlatState::operator=(FlatState&& other) noexcept {
  if (this != &other) {
    if (impl_) forget_buffer(base_);
    impl_ = std::move(other.impl_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    num_params_ = std::exchange(other.num_params_, 0);
    rdma_buffer_ = std::exchange(other.rdma_buffer_, nullptr);
    params_ = std::exchange(other.params_, nullptr);
    grads_ = std::exchange(other.grads_, nullptr);
  }
  return *this;
}

void FlatState::load_from(std::span<const std::byte> src) {
  if (src.size() != size_) {
    throw UsageError("FlatState::load_from: " + std::to_string(src.size()) + " bytes, expected " +
                     std::to_string(size_));
  }
  if (static_cast<std::uint64_t>(read_slot(src.data(), kMagicSlot)) != kMagic ||
      read_slot(src.data(), kCountSlot) != static_cast<std::int64_t>(num_params_)) {
    throw UsageError(
        "FlatState::load_from: header mismatch (not a FlatState of a "
        "model with " +
        std::to_string(num_params_) + " parameters)");
  }
  std::memcpy(base_, src.data(), size_);
}

void FlatState::check_header() const {
  if (static_cast<std::uint64_t>(read_slot(base_, kMagicSlot)) != kMagic ||
      read_slot(base_, kCountSlot) != static_cast<std::int64_t>(num_params_)) {
    throw UsageError(
        "FlatState: header after a raw read is not a FlatState of a "
        "model with " +
        std::to_string(num_params_) + " parameters");
  }
}

std::uint64_t FlatState::hash() const noexcept {
  // Eight independent FNV-1a lanes, lane l taking word l of every 64-byte block (size_ is a
  // multiple of 64): one lane is a chain of dependent multiplies (~4 cycles per word), eight
  // overlap, which halves the time for the 2.4 MB MLP state (about 300 -> 140 us, best of 20).
  constexpr std::uint64_t kBasis = 0xcbf29ce484222325ULL, kPrime = 0x100000001b3ULL;
  std::uint64_t lane[8];
  for (std::size_t l = 0; l < 8; ++l) lane[l] = kBasis + l;
  for (std::size_t i = 0; i < size_; i += 64) {
    for (std::size_t l = 0; l < 8; ++l) {
      std::uint64_t w;
      std::memcpy(&w, base_ + i + 8 * l, 8);
      lane[l] = (lane[l] ^ w) * kPrime;
    }
  }
  std::uint64_t h = kBasis;
  for (std::uint64_t v : lane) h = (h ^ v) * kPrime;
  return h;
}

void FlatState::zero_grads() noexcept {
  std::memset(grads_, 0, num_params_ * sizeof(float));
}

void FlatState::scale_grads(float factor) noexcept {
  for (std::size_t i = 0; i < num_params_; ++i) grads_[i] *= factor;
}

std::int64_t FlatState::step() const noexcept {
  return read_slot(base_, kStepSlot);
}
void FlatState::set_step(std::int64_t step) noexcept {
  write_slot(base_, kStepSlot, step);
}
std::int64_t FlatState::data_position() const noexcept {
  return read_slot(base_, kPositionSlot);
}
void FlatState::set_data_position(std::int64_t position) noexcept {
  write_slot(base_, kPositionSlot, position);
}

void FlatState::adam_step(const AdamOptions& o) {
  torch::NoGradGuard no_grad;
  auto& s = *impl_;
  const auto t = static_cast<double>(step() + 1);
  auto grad = s.grads;
  if (o.weight_decay != 0.0) grad = grad.add(s.params, o.weight_decay);
  s.exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
  s.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1.0 - o.beta2);
  const double bias1 = 1.0 - std::pow(o.beta1, t);
  const double bias2 = 1.0 - std::pow(o.beta2, t);
  auto denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(o.eps);
  s.params.addcdiv_(s.exp_avg, denom, -o.lr / bias1);
  set_step(step() + 1);
}

}  // namespace monarch::ft
