// What ft_train trains: a model whose whole committed state is one FlatState, plus its data.
// `--model mlp` (Fashion-MNIST, model.hpp) and `--model llama-tiny` (a byte-level decoder-only
// transformer on Debian's fortunes text) are the two implementations. Torch-free header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "monarch/ft/torch/flat_state.hpp"

namespace monarch::ft::example {

/// Not thread-safe: one per trainer rank, used only by that rank's training thread.
class Workload {
 public:
  virtual ~Workload() = default;

  /// The committed state (parameters, Adam moments, step, data position) and the gradients.
  virtual FlatState& state() = 0;

  /// Zeroes state().grads(), then runs forward and backward on share `slot` of `slots` of the
  /// global batch of `batch` samples that starts at `position` of the seeded data stream
  /// (replicas that agree on (seed, position) agree on the batch; shares are disjoint and cover
  /// it). Afterwards grads() holds the gradient of the mean loss over the share; returns that
  /// mean loss. Throws std::invalid_argument unless 0 <= slot < slots <= batch.
  virtual double forward_backward(std::int64_t position, std::int64_t batch, int slot,
                                  int slots) = 0;

  /// The quality metric on held-out data: `full` the whole held-out split, otherwise a quick
  /// fixed subset (for progress). No gradients; does not change state().
  virtual double evaluate(bool full) = 0;

  /// Samples in one epoch of the training data (images; windows of text). ft_train refuses a
  /// global batch larger than this.
  virtual std::int64_t train_samples() const = 0;

  /// "accuracy" (in [0, 1], higher is better) or "perplexity" (>= 1, lower is better).
  virtual const char* metric() const = 0;
  virtual bool higher_is_better() const = 0;
};

struct WorkloadOptions {
  std::string model = "mlp";  ///< "mlp" or "llama-tiny"
  std::uint64_t seed = 1;     ///< model init (same seed: bitwise-equal replicas) and data order
  std::string data_dir{};     ///< empty: the model's Debian default
  std::int64_t eval_samples = 2000;  ///< size of the quick evaluation subset (images, windows)
};

/// What the job uses for a model when its flags do not say (ft_train --steps/--batch).
struct WorkloadDefaults {
  std::int64_t steps = 0;         ///< committed training steps
  std::int64_t batch = 0;         ///< global batch, samples (images; sequences of 65 bytes)
  std::int64_t eval_samples = 0;  ///< quick evaluation subset
  /// ReplicaClientOptions::quorum_every unless ft.quorum_every is set: K steps of the model should
  /// stay well under a process start (a joiner waits up to K - 1 of them).
  std::int64_t quorum_every = 1;
};
/// mlp: 2000 steps of 256 images, 2000 test images per quick evaluation, a quorum every 8 steps
/// (~10 ms each). llama-tiny: 500 steps of 36 sequences (36 divides evenly among 1-4 up-to-date
/// groups), 64 held-out windows, a quorum every step (~170 ms each: the quorum is ~1 % of it).
/// Throws UsageError on an unknown model.
WorkloadDefaults workload_defaults(const std::string& model);

/// Builds the workload (loads its data: may take ~1 s). Throws UsageError on an unknown model,
/// DatasetError (fashion_mnist.hpp) when the data is missing, naming the package to install.
std::unique_ptr<Workload> make_workload(const WorkloadOptions& options);

}  // namespace monarch::ft::example
