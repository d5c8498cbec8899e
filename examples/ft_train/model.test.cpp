// The ft_train model: seeded init gives bitwise-equal replicas, forward_backward is
// deterministic, and a short single-process run learns Fashion-MNIST (> 70% test accuracy).
// Also renders the gnuplot chart from two JSONL files.
#include "model.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "plot.hpp"

namespace ex = monarch::ft::example;

namespace {

TEST(Model, SameSeedSameStateDifferentSeedDifferent) {
  ex::init_torch_worker(1);
  ex::Model a(5), b(5), c(6);
  EXPECT_EQ(a.state().num_params(), 784u * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ(a.state().hash(), b.state().hash());
  EXPECT_NE(a.state().hash(), c.state().hash());
  auto start = std::chrono::steady_clock::now();
  std::uint64_t h = 0;
  for (int i = 0; i < 20; ++i) h = a.state().hash();
  auto us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
      20;
  std::printf("FlatState::hash over %zu bytes: %.0f us (%llx)\n", a.state().bytes().size(), us,
              static_cast<unsigned long long>(h));
}

class Training : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(ex::kFashionMnistDir)) return;
    train_ = new ex::Dataset(ex::load_fashion_mnist(ex::kFashionMnistDir, ex::Split::train));
    test_ = new ex::Dataset(ex::load_fashion_mnist(ex::kFashionMnistDir, ex::Split::test));
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
  }
  void SetUp() override {
    if (train_ == nullptr) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  }
  static ex::Dataset* train_;
  static ex::Dataset* test_;
};
ex::Dataset* Training::train_ = nullptr;
ex::Dataset* Training::test_ = nullptr;

TEST_F(Training, ForwardBackwardIsDeterministic) {
  ex::Model a(1), b(1);
  ex::Sampler sampler(train_->size, 1);
  auto idx = sampler.shard(0, 64, 0, 1);
  double la = a.forward_backward(*train_, idx);
  double lb = b.forward_backward(*train_, idx);
  EXPECT_EQ(la, lb);
  auto ga = a.state().grads();
  auto gb = b.state().grads();
  EXPECT_TRUE(std::equal(ga.begin(), ga.end(), gb.begin()));
  // forward_backward zeroes first: repeating it gives the same gradients, not double.
  a.forward_backward(*train_, idx);
  EXPECT_TRUE(std::equal(ga.begin(), ga.end(), gb.begin()));
  std::vector<std::int64_t> bad{train_->size};
  EXPECT_THROW(a.forward_backward(*train_, bad), std::out_of_range);
}

TEST_F(Training, ThreeHundredStepsReachSeventyPercent) {
  ex::init_torch_worker(1);
  ex::Model model(1);
  ex::Sampler sampler(train_->size, 1);
  auto& state = model.state();
  const double before = model.evaluate(*test_);
  auto start = std::chrono::steady_clock::now();
  double loss = 0;
  for (int step = 0; step < 300; ++step) {
    auto idx = sampler.shard(state.data_position(), 64, 0, 1);
    loss = model.forward_backward(*train_, idx);
    state.adam_step({});
    state.set_data_position(state.data_position() + 64);
  }
  auto train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double after = model.evaluate(*test_);
  std::printf("300 steps of 64: %.2f s (%.1f ms/step), loss %.3f, test accuracy %.1f%% -> %.1f%%\n",
              train_s, 1000 * train_s / 300, loss, 100 * before, 100 * after);
  EXPECT_EQ(state.step(), 300);
  EXPECT_EQ(state.data_position(), 300 * 64);
  EXPECT_LT(before, 0.3);
  EXPECT_GT(after, 0.70);
}

TEST(Plot, RendersTwoRunsToPng) {
  auto dir = std::filesystem::temp_directory_path() / ("ft_plot_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto clean = (dir / "clean.jsonl").string(), faulty = (dir / "faulty.jsonl").string();
  auto png = (dir / "chart.png").string();
  {
    std::ofstream c(clean), f(faulty);
    for (int s = 1; s <= 20; ++s) {
      c << "{\"step\":" << s << ",\"loss\":" << 2.0 / s;
      f << "{\"step\":" << s << ",\"loss\":" << 2.1 / s;
      if (s % 5 == 0) {
        c << ",\"accuracy\":" << 0.5 + s / 50.0;
        f << ",\"accuracy\":" << 0.49 + s / 50.0;
      }
      c << "}\n";
      f << "}\n";
      if (s == 7) f << "{\"step\":7,\"fault\":\"sigkill\"}\n";
      if (s == 9) f << "{\"event\":\"not a step line\"}\n";
    }
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    EXPECT_THROW(ex::plot_loss_accuracy(clean, faulty, png), std::runtime_error);
  } else {
    ex::plot_loss_accuracy(clean, faulty, png, "test chart");
    std::ifstream in(png, std::ios::binary);
    char sig[8] = {};
    in.read(sig, 8);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG");
    EXPECT_GT(std::filesystem::file_size(png), 5000u);
  }
  { std::ofstream(faulty, std::ios::app) << "{not json\n"; }
  EXPECT_THROW(ex::plot_loss_accuracy(clean, faulty, png), std::runtime_error);
  std::filesystem::remove_all(dir);
}

}  // namespace
