// `ft_train --model llama-tiny`: a small decoder-only transformer in the style of LLaMA (token
// embedding; blocks of RMSNorm, causal multi-head self-attention with rotary position embeddings,
// RMSNorm, SwiGLU MLP; final RMSNorm; output head) trained as a byte-level language model on
// Debian's fortunes (text_data.hpp). Every parameter lives in one FlatState. Torch-free header
// (pimpl), so the job need not include libtorch.
//
// Measured single-process (one thread, defaults, seed 1, Adam lr 1e-3, batches of 36 sequences):
// full held-out perplexity 8.09 after 300 steps and 6.65 after 600, against 27.1 for the byte
// unigram; lr 6e-4 / 2e-3 / 3e-3 gave 8.18 / 9.51 / 10.1 after 300 steps. A global batch that 1,
// 2, 3 and 4 divide (36) keeps the shares equal whichever groups are up to date, so the job's
// 1/slots scaling gives exactly the whole batch's mean gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "text_data.hpp"
#include "workload.hpp"

namespace monarch::ft::example {

/// Shapes of the model and of its data. The defaults give 1.07 M parameters (parameter_count()).
struct LlamaConfig {
  int seq_len = 64;      ///< bytes of context per training sequence (windows of seq_len + 1)
  int dim = 128;         ///< model width
  int layers = 5;        ///< transformer blocks
  int heads = 4;         ///< attention heads; dim / heads (the head width) must be even (rotary)
  int ffn_hidden = 352;  ///< SwiGLU hidden width
  double rope_base = 10000.0;
  int eval_batch = 64;  ///< held-out sequences per forward in evaluate()

  /// The number of parameter floats these shapes give (FlatState::num_params()).
  std::int64_t parameter_count() const noexcept;
};

/// The llama-tiny Workload. Not thread-safe: one per trainer rank, used only by its training
/// thread (torch runs with the caller's intra-op thread count; ft_train sets 1).
class LlamaTiny final : public Workload {
 public:
  /// Loads the fortunes from options.data_dir (empty: kFortunesDir) and builds the model.
  /// Parameters are drawn by a generator seeded with options.seed alone (embedding, attention and
  /// MLP weights normal with std 0.02, the two output projections of each block scaled by
  /// 1/sqrt(2 layers); norm gains 1), so every instance with the same seed starts bitwise equal
  /// (same FlatState::hash()); the data order is seeded with options.seed too. The quick
  /// evaluation subset is min(options.eval_samples, held-out windows) held-out windows spread
  /// evenly over the split: it costs ~3 ms a window on one core, so pass ~64 (the MLP's 2000
  /// is nearly the whole split of 2039 windows, ~6 s per evaluation). Throws DatasetError when the
  /// text is missing (naming the package), std::invalid_argument on bad shapes (non-positive, dim
  /// not a multiple of heads, odd head width, eval_samples < 1).
  explicit LlamaTiny(const WorkloadOptions& options, const LlamaConfig& config = {});
  /// As above on an already loaded corpus (tests build several instances from one load).
  LlamaTiny(const WorkloadOptions& options, const LlamaConfig& config,
            std::shared_ptr<const TextCorpus> corpus);
  ~LlamaTiny() override;
  LlamaTiny(const LlamaTiny&) = delete;
  LlamaTiny& operator=(const LlamaTiny&) = delete;

  FlatState& state() override;

  /// Batch = `batch` sequences of config().seq_len + 1 bytes (TextSampler over the train split);
  /// the loss is the mean next-byte cross-entropy (nats) over every position of the share's
  /// sequences, so with equal shares the mean of the shares' gradients is the whole batch's.
  double forward_backward(std::int64_t position, std::int64_t batch, int slot, int slots) override;

  /// Perplexity exp(mean next-byte NLL) over the held-out windows (all of them when `full`, else
  /// the quick subset), in batches of config().eval_batch, under NoGradGuard. >= 1, lower is
  /// better; kFortunesDir's unigram baseline is unigram_perplexity() (27.1 at seq_len 64).
  double evaluate(bool full) override;

  std::int64_t train_samples() const override;
  const char* metric() const override { return "perplexity"; }
  bool higher_is_better() const override { return false; }

  const LlamaConfig& config() const noexcept;
  const TextCorpus& corpus() const noexcept;
  /// Windows in the train and held-out splits, and in the quick evaluation subset.
  std::int64_t train_windows() const noexcept;
  std::int64_t heldout_windows() const noexcept;
  std::int64_t quick_eval_windows() const noexcept;
  /// The model's NLL (nats) of each byte of `text` after the first given the bytes before it:
  /// text.size() - 1 values, position i scoring text[i + 1]. Causal: a value depends only on the
  /// bytes up to its target. Throws std::invalid_argument unless 2 <= text.size() <=
  /// config().seq_len + 1. No gradients; does not change state().
  std::vector<double> next_byte_nll(std::span<const std::uint8_t> text);
  /// The byte-unigram baseline on the held-out targets (text_data.hpp unigram_perplexity).
  double unigram_perplexity() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// make_workload's "llama-tiny": a LlamaTiny with `config`.
std::unique_ptr<Workload> make_llama_tiny(const WorkloadOptions& options,
                                          const LlamaConfig& config = {});

}  // namespace monarch::ft::example
