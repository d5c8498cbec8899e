// FlatState: a replica's whole committed training state in one contiguous CPU buffer, so that
// healing is one RdmaBuffer read and replica equality is one hash (docs/ft.md, docs/ft-torch.md).
//
// Layout of bytes() (all little-endian host order, 64-byte aligned, size a multiple of 64 B):
//   [0, 64)                       header: magic, P (number of parameter floats), step,
//                                 data_position (int64 each), zero padding
//   [64, 64 + 4P)                 parameters (float32), in module.parameters() order
//   [64 + 4P, 64 + 8P)            Adam first moment  (exp_avg)
//   [64 + 8P, 64 + 12P)           Adam second moment (exp_avg_sq)
//   then zero padding to a multiple of 64 bytes.
// The gradients live in a separate flat float buffer of P floats (not part of the committed
// state), so one allreduce_sum call covers every gradient.
//
// Torch-free header: the module is only forward-declared; monarch_ft_torch links libtorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "monarch/error.hpp"

namespace torch::nn {
class Module;
}

namespace monarch::rdma {
class RdmaBuffer;
}

namespace monarch::ft {

/// Adam hyper-parameters (Kingma & Ba; same update as torch::optim::Adam without amsgrad).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2 added to the gradient, like torch::optim::Adam
};

/// Where FlatState keeps bytes().
struct FlatStateOptions {
  /// false: ordinary heap memory (a torch tensor). true: shared memory made by
  /// rdma::RdmaBuffer::allocate(bytes().size(), rdma_name) and registered with the data plane
  /// (rdma_buffer()). A same-host healer then reads it by the shm route (a memcpy from a mapping
  /// of the donor's memory, ~0.9-1.0x memcpy) instead of cma (process_vm_readv, ~0.2-0.35x),
  /// and can read it straight into its own bytes() (bench_rdma, rows ft_heal_read). Starts the
  /// data plane (its listener) on construction.
  bool shared_memory = false;
  /// The registration's name (error messages of remote readers), e.g. "replica-1.r0.state".
  std::string rdma_name = "flat_state";
};

/// Not thread-safe: the replica's training thread owns it. The RDMA engine may read bytes()
/// concurrently only while the owner does not write (between committed steps).
class FlatState {
 public:
  /// Adopts every parameter of `module` (module.parameters(), recursive, in registration order):
  /// copies its value into the flat buffer, rebinds the parameter (set_data) to a view of that
  /// buffer, and sets its .grad to a view of the flat gradient buffer (zeroed), so forward and
  /// backward read and write the flat buffers with no copies. The buffers are shared with the
  /// module's tensors (reference counted), so either may outlive the other. Do not replace the
  /// module's parameters afterwards (module.to(), optimizer.zero_grad(set_to_none)), or they stop
  /// aliasing. A module can have one FlatState at a time: a second one would take the
  /// parameters' gradients away from the first. Throws UsageError if a parameter is not a dense
  /// CPU float32 tensor, is already bound into another live FlatState, or the module has none.
  /// Optimizer moments start at zero, step and data_position at 0. With options.shared_memory,
  /// bytes() lives in an RdmaBuffer::allocate()d buffer (see FlatStateOptions); throws
  /// rdma::RdmaError(BackendUnavailable) if that memory cannot be made.
  explicit FlatState(::torch::nn::Module& module, FlatStateOptions options = {});
  ~FlatState();
  FlatState(FlatState&&) noexcept;
  FlatState& operator=(FlatState&&) noexcept;

  /// P: the number of parameter floats.
  std::size_t num_params() const noexcept { return num_params_; }

  /// The whole committed state (layout above). Heal donors expose it: rdma_buffer() when made
  /// with shared_memory, else register it as an RdmaBuffer (plain memory: the cma route).
  std::span<std::byte> bytes() noexcept { return {base_, size_}; }
  std::span<const std::byte> bytes() const noexcept { return {base_, size_}; }

  /// With FlatStateOptions::shared_memory: the RdmaBuffer whose memory() is bytes() (same address
  /// and size); hand its handle() to healers and call its sync() as RdmaBuffer documents. It lives
  /// as long as this FlatState or any tensor of the module that aliases bytes(), whichever is
  /// last (drop() it to end remote access earlier). nullptr without shared_memory.
  rdma::RdmaBuffer* rdma_buffer() noexcept { return rdma_buffer_; }

  /// Overwrites the committed state with `src` (bytes() of another FlatState of the same model,
  /// e.g. read from a donor). Throws UsageError, leaving this state unchanged, if the
  /// size, magic or P differ.
  void load_from(std::span<const std::byte> src);

  /// Throws UsageError unless the header in bytes() (magic, P) is this model's. For a
  /// healer that reads the donor's RdmaBuffer straight into bytes() (no staging copy): call it
  /// after the read completes. A read that failed part-way leaves bytes() mixed: the healer
  /// must heal again (or restart) before it trains or donates.
  void check_header() const;

  /// 64-bit hash of bytes(): eight FNV-1a lanes (lane l, offset basis + l, consumes the l-th
  /// 8-byte word of every 64-byte block: xor word, multiply by the FNV prime), then FNV-1a over
  /// the eight lane values. Independent lanes overlap their multiplies: about 0.14 ms for the
  /// 2.4 MB MLP state (one lane: 0.3 ms). Equal hashes are how replicas are checked bitwise equal.
  std::uint64_t hash() const noexcept;

  /// Parameter values (P floats, views of bytes()).
  std::span<float> params() noexcept { return {params_, num_params_}; }
  std::span<const float> params() const noexcept { return {params_, num_params_}; }
  /// The flat gradient buffer (P floats): what backward accumulates into and what the allreduce
  /// sums. Not part of bytes().
  std::span<float> grads() noexcept { return {grads_, num_params_}; }

  /// Sets every gradient to 0 (keeps the .grad views bound).
  void zero_grads() noexcept;
  /// Multiplies every gradient by `factor` (e.g. 1/participants after a sum).
  void scale_grads(float factor) noexcept;

  /// Committed optimizer steps. adam_step() increments it.
  std::int64_t step() const noexcept;
  void set_step(std::int64_t step) noexcept;
  /// Samples consumed from the global data stream (see examples/ft_train sampler).
  std::int64_t data_position() const noexcept;
  void set_data_position(std::int64_t position) noexcept;

  /// One Adam update of the parameters from grads() with bias correction for t = step() + 1,
  /// then step() += 1. Deterministic: the same state and gradients give bitwise-identical results
  /// on every replica (elementwise ops only).
  void adam_step(const AdamOptions& opts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t num_params_ = 0;
  rdma::RdmaBuffer* rdma_buffer_ = nullptr;  // owned by impl_ (shared with the tensors' storage)
  float* params_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace monarch::ft
