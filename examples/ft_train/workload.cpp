// make_workload: "mlp" (Fashion-MNIST, model.hpp) and "llama-tiny" (fortunes, llama_tiny.hpp).
#include "workload.hpp"

#include <algorithm>
#include <stdexcept>

#include "fashion_mnist.hpp"
#include "llama_tiny.hpp"
#include "model.hpp"
#include "monarch/error.hpp"

namespace monarch::ft::example {
namespace {

class MlpWorkload final : public Workload {
 public:
  explicit MlpWorkload(const WorkloadOptions& o)
      : train_(
            load_fashion_mnist(o.data_dir.empty() ? kFashionMnistDir : o.data_dir, Split::train)),
        test_(load_fashion_mnist(o.data_dir.empty() ? kFashionMnistDir : o.data_dir, Split::test)),
        sampler_(train_.size, o.seed),
        model_(o.seed) {
    quick_ = test_.head(std::max<std::int64_t>(o.eval_samples, 1));
  }
  FlatState& state() override { return model_.state(); }
  double forward_backward(std::int64_t position, std::int64_t batch, int slot, int slots) override {
    if (slot < 0 || slot >= slots || slots > batch) {
      throw std::invalid_argument("mlp forward_backward: slot " + std::to_string(slot) + " of " +
                                  std::to_string(slots) + " in a batch of " +
                                  std::to_string(batch));
    }
    auto idx = sampler_.shard(position, batch, slot, slots);
    return model_.forward_backward(train_, idx);
  }
  double evaluate(bool full) override { return model_.evaluate(full ? test_ : quick_); }
  std::int64_t train_samples() const override { return train_.size; }
  const char* metric() const override { return "accuracy"; }
  bool higher_is_better() const override { return true; }

 private:
  Dataset train_, test_, quick_;
  Sampler sampler_;
  Model model_;
};

}  // namespace

std::unique_ptr<Workload> make_workload(const WorkloadOptions& options) {
  if (options.model == "mlp") return std::make_unique<MlpWorkload>(options);
  if (options.model == "llama-tiny") return make_llama_tiny(options);
  throw UsageError("unknown model '" + options.model + "'; expected mlp or llama-tiny");
}

WorkloadDefaults workload_defaults(const std::string& model) {
  if (model == "mlp") return {2000, 256, 2000, 8};
  if (model == "llama-tiny") return {500, 36, 64, 1};
  throw UsageError("unknown model '" + model + "'; expected mlp or llama-tiny");
}

}  // namespace monarch::ft::example
