// llama-tiny (llama_tiny.hpp): the transformer over a FlatState and its Workload.
#include "llama_tiny.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace monarch::ft::example {

std::int64_t LlamaConfig::parameter_count() const noexcept {
  const std::int64_t d = dim, h = ffn_hidden;
  const std::int64_t block = 2 * d + 4 * d * d + 3 * d * h;  // 2 norms, q k v o, gate up down
  return 2 * std::int64_t{kByteVocab} * d + layers * block + d;
}

namespace {

void check_config(const LlamaConfig& c, std::int64_t eval_samples) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("llama-tiny: " + what); };
  if (c.seq_len < 1 || c.dim < 1 || c.layers < 1 || c.heads < 1 || c.ffn_hidden < 1 ||
      c.eval_batch < 1) {
    bad("seq_len, dim, layers, heads, ffn_hidden and eval_batch must be positive");
  }
  if (c.dim % c.heads != 0) {
    bad("dim " + std::to_string(c.dim) + " is not a multiple of heads " + std::to_string(c.heads));
  }
  if ((c.dim / c.heads) % 2 != 0) {
    bad("head width " + std::to_string(c.dim / c.heads) + " is odd (rotary embeddings pair dims)");
  }
  if (!(c.rope_base > 1.0)) bad("rope_base must be > 1");
  if (eval_samples < 1) bad("eval_samples " + std::to_string(eval_samples) + " < 1");
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& gain) {
  constexpr double kEps = 1e-5;
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kEps) * gain;
}

// Rotates the pairs (x[..., i], x[..., i + w/2]) of each head by angle position * base^(-2i/w).
// x: [B, H, T, w]; cos, sin: [T, w/2].
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

struct Block {
  torch::Tensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
};

struct Transformer : torch::nn::Module {
  Transformer(const LlamaConfig& c, torch::Generator& gen) : cfg(c) {
    torch::NoGradGuard no_grad;
    const std::int64_t d = c.dim, h = c.ffn_hidden;
    const double init_std = 0.02, out_std = init_std / std::sqrt(2.0 * c.layers);
    auto normal = [&](const std::string& name, std::vector<std::int64_t> shape, double s) {
      auto t = torch::empty(shape, torch::kFloat32);
      t.normal_(0.0, s, gen);
      return register_parameter(name, t);
    };
    auto ones = [&](const std::string& name) {
      return register_parameter(name, torch::ones({d}, torch::kFloat32));
    };
    embedding = normal("embedding", {kByteVocab, d}, init_std);
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "block" + std::to_string(l) + "_";
      Block b;
      b.attn_norm = ones(p + "attn_norm");
      b.wq = normal(p + "wq", {d, d}, init_std);
      b.wk = normal(p + "wk", {d, d}, init_std);
      b.wv = normal(p + "wv", {d, d}, init_std);
      b.wo = normal(p + "wo", {d, d}, out_std);
      b.mlp_norm = ones(p + "mlp_norm");
      b.w_gate = normal(p + "w_gate", {h, d}, init_std);
      b.w_up = normal(p + "w_up", {h, d}, init_std);
      b.w_down = normal(p + "w_down", {d, h}, out_std);
      blocks.push_back(b);
    }
    final_norm = ones("final_norm");
    head = normal("head", {kByteVocab, d}, init_std);

    // Rotary tables: buffers (derived from the shapes alone), not parameters, so not state.
    const std::int64_t w = d / c.heads;
    auto inv_freq = torch::pow(c.rope_base, -torch::arange(0, w, 2, torch::kFloat64) / w);
    auto angles = torch::outer(torch::arange(c.seq_len, torch::kFloat64), inv_freq);
    rope_cos = register_buffer("rope_cos", angles.cos().to(torch::kFloat32));
    rope_sin = register_buffer("rope_sin", angles.sin().to(torch::kFloat32));
    causal = register_buffer(
        "causal", torch::ones({c.seq_len, c.seq_len}, torch::kBool).triu(1));  // true: masked
  }

  // tokens: [B, T] int64 with T <= seq_len. Returns logits [B, T, 256].
  torch::Tensor forward(const torch::Tensor& tokens) {
    const auto B = tokens.size(0), T = tokens.size(1);
    const std::int64_t H = cfg.heads, w = cfg.dim / cfg.heads;
    auto cos = rope_cos.narrow(0, 0, T), sin = rope_sin.narrow(0, 0, T);
    auto mask = causal.narrow(0, 0, T).narrow(1, 0, T);
    const double scale = 1.0 / std::sqrt(static_cast<double>(w));
    auto x = torch::embedding(embedding, tokens);  // [B, T, d]
    for (const auto& b : blocks) {
      auto a = rms_norm(x, b.attn_norm);
      auto split = [&](const torch::Tensor& weight) {
        return torch::linear(a, weight).view({B, T, H, w}).transpose(1, 2);  // [B, H, T, w]
      };
      auto q = rotate(split(b.wq), cos, sin);
      auto k = rotate(split(b.wk), cos, sin);
      auto v = split(b.wv);
      auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // [B, H, T, T]
      auto attn = torch::softmax(scores.masked_fill(mask, -INFINITY), -1);
      auto y = torch::matmul(attn, v).transpose(1, 2).reshape({B, T, cfg.dim});
      x = x + torch::linear(y, b.wo);
      auto m = rms_norm(x, b.mlp_norm);
      x = x + torch::linear(torch::silu(torch::linear(m, b.w_gate)) * torch::linear(m, b.w_up),
                            b.w_down);
    }
    return torch::linear(rms_norm(x, final_norm), head);
  }

  LlamaConfig cfg;
  torch::Tensor embedding, final_norm, head;
  std::vector<Block> blocks;
  torch::Tensor rope_cos, rope_sin, causal;
};

// Windows at `offsets` of `stream` as inputs [n, T] and targets [n, T] (int64).
std::pair<torch::Tensor, torch::Tensor> gather(const std::vector<std::uint8_t>& stream,
                                               const std::vector<std::int64_t>& offsets, int T) {
  const auto n = static_cast<std::int64_t>(offsets.size());
  auto x = torch::empty({n, T}, torch::kInt64);
  auto y = torch::empty({n, T}, torch::kInt64);
  auto* xp = x.data_ptr<std::int64_t>();
  auto* yp = y.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto off = offsets[static_cast<std::size_t>(i)];
    if (off < 0 || off + T >= static_cast<std::int64_t>(stream.size())) {
      throw std::out_of_range("llama-tiny: window at byte " + std::to_string(off) +
                              " outside a stream of " + std::to_string(stream.size()));
    }
    const std::uint8_t* s = stream.data() + off;
    for (int t = 0; t < T; ++t) {
      xp[i * T + t] = s[t];
      yp[i * T + t] = s[t + 1];
    }
  }
  return {x, y};
}

}  // namespace

struct LlamaTiny::Impl {
  Impl(const WorkloadOptions& o, const LlamaConfig& c, std::shared_ptr<const TextCorpus> text)
      : cfg((check_config(c, o.eval_samples), c)),
        corpus(std::move(text)),
        gen(at::make_generator<at::CPUGeneratorImpl>(o.seed)),
        model(cfg, gen),
        state(model, FlatStateOptions{.shared_memory = true, .rdma_name = "llama-tiny.state"}),
        train(TextWindows(static_cast<std::int64_t>(corpus->train.size()), cfg.seq_len)),
        heldout(static_cast<std::int64_t>(corpus->heldout.size()), cfg.seq_len),
        sampler(train, o.seed) {
    const std::int64_t n = heldout.count();
    const std::int64_t quick = std::min<std::int64_t>(o.eval_samples, n);
    for (std::int64_t i = 0; i < n; ++i) all_heldout.push_back(heldout.offset(i));
    for (std::int64_t i = 0; i < quick; ++i) quick_heldout.push_back(heldout.offset(i * n / quick));
  }

  LlamaConfig cfg;
  std::shared_ptr<const TextCorpus> corpus;
  torch::Generator gen;
  Transformer model;
  FlatState state;
  TextWindows train, heldout;
  TextSampler sampler;
  std::vector<std::int64_t> all_heldout, quick_heldout;  // window offsets
};

LlamaTiny::LlamaTiny(const WorkloadOptions& options, const LlamaConfig& config)
    : LlamaTiny(options, config,
                std::make_shared<const TextCorpus>(
                    load_fortunes(options.data_dir.empty() ? kFortunesDir : options.data_dir))) {}

LlamaTiny::LlamaTiny(const WorkloadOptions& options, const LlamaConfig& config,
                     std::shared_ptr<const TextCorpus> corpus) {
  if (!corpus) throw std::invalid_argument("llama-tiny: null corpus");
  impl_ = std::make_unique<Impl>(options, config, std::move(corpus));
}

LlamaTiny::~LlamaTiny() = default;

FlatState& LlamaTiny::state() {
  return impl_->state;
}

std::int64_t LlamaTiny::train_samples() const {
  return impl_->train.count();
}

double LlamaTiny::forward_backward(std::int64_t position, std::int64_t batch, int slot, int slots) {
  if (slots < 1 || slot < 0 || slot >= slots || batch < slots) {
    throw std::invalid_argument("llama-tiny forward_backward: slot " + std::to_string(slot) +
                                " of " + std::to_string(slots) + " with batch " +
                                std::to_string(batch) + " (need 0 <= slot < slots <= batch)");
  }
  auto& s = *impl_;
  const auto offsets = s.sampler.shard(position, batch, slot, slots);
  auto [x, y] = gather(s.corpus->train, offsets, s.cfg.seq_len);
  s.state.zero_grads();
  auto logits = s.model.forward(x);
  auto loss = torch::nn::functional::cross_entropy(logits.view({-1, kByteVocab}), y.view({-1}));
  loss.backward();
  return loss.item<double>();
}

double LlamaTiny::evaluate(bool full) {
  auto& s = *impl_;
  torch::NoGradGuard no_grad;
  const auto& windows = full ? s.all_heldout : s.quick_heldout;
  double nll = 0;
  std::int64_t targets = 0;
  std::vector<std::int64_t> chunk;
  for (std::size_t start = 0; start < windows.size();
       start += static_cast<std::size_t>(s.cfg.eval_batch)) {
    const auto end = std::min(windows.size(), start + static_cast<std::size_t>(s.cfg.eval_batch));
    chunk.assign(windows.begin() + static_cast<std::ptrdiff_t>(start),
                 windows.begin() + static_cast<std::ptrdiff_t>(end));
    auto [x, y] = gather(s.corpus->heldout, chunk, s.cfg.seq_len);
    auto logits = s.model.forward(x).view({-1, kByteVocab});
    nll += torch::nn::functional::cross_entropy(
               logits, y.view({-1}),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .item<double>();
    targets += y.numel();
  }
  return std::exp(nll / static_cast<double>(targets));
}

std::vector<double> LlamaTiny::next_byte_nll(std::span<const std::uint8_t> text) {
  auto& s = *impl_;
  if (text.size() < 2 || text.size() > static_cast<std::size_t>(s.cfg.seq_len) + 1) {
    throw std::invalid_argument("llama-tiny next_byte_nll: " + std::to_string(text.size()) +
                                " bytes, need 2.." + std::to_string(s.cfg.seq_len + 1));
  }
  torch::NoGradGuard no_grad;
  const std::vector<std::uint8_t> stream(text.begin(), text.end());
  const int T = static_cast<int>(text.size()) - 1;
  auto [x, y] = gather(stream, {0}, T);
  auto nll = torch::nn::functional::cross_entropy(
      s.model.forward(x).view({-1, kByteVocab}), y.view({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto values = nll.to(torch::kFloat64).contiguous();
  return {values.data_ptr<double>(), values.data_ptr<double>() + values.numel()};
}

const LlamaConfig& LlamaTiny::config() const noexcept {
  return impl_->cfg;
}
const TextCorpus& LlamaTiny::corpus() const noexcept {
  return *impl_->corpus;
}
std::int64_t LlamaTiny::train_windows() const noexcept {
  return impl_->train.count();
}
std::int64_t LlamaTiny::heldout_windows() const noexcept {
  return impl_->heldout.count();
}
std::int64_t LlamaTiny::quick_eval_windows() const noexcept {
  return static_cast<std::int64_t>(impl_->quick_heldout.size());
}
double LlamaTiny::unigram_perplexity() const {
  return example::unigram_perplexity(impl_->corpus->train, impl_->corpus->heldout,
                                     impl_->cfg.seq_len);
}

std::unique_ptr<Workload> make_llama_tiny(const WorkloadOptions& options,
                                          const LlamaConfig& config) {
  return std::make_unique<LlamaTiny>(options, config);
}

}  // namespace monarch::ft::example
