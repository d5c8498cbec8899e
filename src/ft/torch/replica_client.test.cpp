// ReplicaClient + ReplicaController end to end, over real processes (this binary is also the
// worker: main() calls bootstrap() first) and a tiny libtorch model: 3 replica groups train a
// linear regression; the controller's fault points throw inside one allreduce, then SIGKILL one
// group while a second one is killed from outside the job (a plain kill(2), as a user's `kill -9`).
// At the end every group holds a bitwise-equal state at the last step, the faults are counted as
// faults (1 outside), and no survivor was restarted. A second run fires the chaos kinds at their
// points (quorum.after_request, heal.after_first_chunk killing the healer, two groups at once).
#include "monarch/ft/torch/replica_client.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <thread>

#include "monarch/config/config.hpp"
#include "monarch/ft/controller.hpp"
#include "monarch/mesh/process.hpp"

namespace ft = monarch::ft;
namespace mesh = monarch::mesh;
using monarch::ActorRef;
using monarch::Future;

namespace {

constexpr int64_t kGroups = 3;
constexpr int64_t kSteps = 300;
constexpr int64_t kBatch = 48;

// y = 0.5 * sum(x) on a deterministic stream of inputs: sample p is sin(0.01 * p * (1..8)).
struct TinyModel {
  TinyModel() {
    torch::set_num_threads(1);
    torch::manual_seed(7);  // same seed in every process: every replica starts bitwise equal
    lin = torch::nn::Linear(8, 1);
    state = std::make_unique<ft::FlatState>(*lin);
  }
  double forward_backward(int64_t pos, int slot, int slots) {
    int64_t lo = pos + kBatch * slot / slots, hi = pos + kBatch * (slot + 1) / slots;
    auto p = torch::arange(lo, hi, torch::kFloat).unsqueeze(1);
    auto x = torch::sin(p * torch::arange(1, 9, torch::kFloat) * 0.01);
    auto y = x.sum(1, true) * 0.5;
    state->zero_grads();
    auto loss = torch::mse_loss(lin->forward(x), y);
    loss.backward();
    return loss.item<double>();
  }
  torch::nn::Linear lin{nullptr};
  std::unique_ptr<ft::FlatState> state;
};

struct TinyTrainer : monarch::Actor {
  TinyTrainer(ft::ReplicaClientOptions options, ActorRef<ft::Manager> manager)
      : options_(std::move(options)), manager_(std::move(manager)) {}
  void init() override { model_ = std::make_unique<TinyModel>(); }
  int pid() { return ::getpid(); }
  void start() {
    thread_ = std::thread([this] { loop(); });
  }
  void cleanup(const std::optional<monarch::ActorSupervisionEvent>&) override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  MONARCH_ENDPOINTS(TinyTrainer, pid, start)

 private:
  void loop() {
    ft::FlatState& st = *model_->state;
    ft::ReplicaClient client(manager_, st, options_);
    ft::AdamOptions adam{.lr = 1e-2};
    while (!stop_ && st.step() < options_.max_steps) {
      double loss = -1;
      try {
        ft::StepPlan plan = client.start_quorum();
        if (plan.step) {
          int64_t pos = st.data_position();
          bool ok = true;
          try {
            if (plan.train) loss = model_->forward_backward(pos, plan.slot, plan.slots);
            client.allreduce(st.grads());
          } catch (const std::exception&) {
            ok = false;
          }
          if (client.should_commit(ok)) {
            st.adam_step(adam);
            st.set_data_position(pos + kBatch);
          }
        }
      } catch (const std::exception&) {
        // the next start_quorum retries (the error is in client.last_error())
      }
      client.report(loss);
    }
    if (!stop_) client.report(-1, 1.0, /*final=*/true);
    while (!stop_) client.hold();
  }

  ft::ReplicaClientOptions options_;
  ActorRef<ft::Manager> manager_;
  std::unique_ptr<TinyModel> model_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Faults at named points: allreduce.enter on replica0 at step 5; at the first quiet step >= 20,
// an injected SIGKILL of replica1 and, at the same moment, a kill from outside of replica2.
// With `chaos`, the chaos kinds instead, each at the first quiet step after the last:
// kill_in_quorum of replica0, kill_healer_mid_heal of replica1, then replica0 and replica2 killed
// at once.
struct TestController : ft::ReplicaController {
  TestController(std::vector<mesh::HostMesh> hosts, ActorRef<ft::Lighthouse> lighthouse,
                 ft::ReplicaClientOptions client, bool chaos)
      : ReplicaController(std::move(hosts), std::move(lighthouse),
                          {.groups = kGroups,
                           .steps = client.max_steps,
                           .samples_per_step = kBatch,
                           .run_name = "test"}),
        client_(std::move(client)),
        chaos_(chaos) {}
  std::vector<std::string> events() { return events_; }
  MONARCH_FT_CONTROLLER_ENDPOINTS(TestController, events)

 protected:
  Future<void> spawn_trainers(const ft::GroupInfo& g, const mesh::ProcMesh& procs,
                              ActorRef<ft::Manager> manager) override {
    auto o = client_;
    o.replica_id = g.replica_id;
    o.incarnation = g.incarnation;
    o.controller = self<ft::ReplicaController>();
    auto t = procs.spawn<TinyTrainer>("trainer", o, manager);
    trainers_.insert_or_assign(g.group, t);
    return t.call(&TinyTrainer::pid).then([this, r = g.group](auto v) { pids_[r] = v[0]; });
  }
  void start_trainers(const ft::GroupInfo& g) override {
    trainers_.at(g.group).at(0).send(&TinyTrainer::start);
  }
  void on_event(const std::string& line) override { events_.push_back(line); }
  void on_commit(int64_t step, const ft::StepInfo&) override {
    if (chaos_) {
      if (step < 5 || !quiet()) return;
      if (stage_ == 0) inject(ft::FaultKind::kill_in_quorum, 0);
      if (stage_ == 1) inject(ft::FaultKind::kill_healer_mid_heal, 1);
      if (stage_ == 2) inject_two(0, 2);
      ++stage_;
      return;
    }
    if (stage_ == 0 && step >= 5 && quiet()) {
      inject(ft::FaultKind::allreduce_throw, 0);
      stage_ = 1;
    } else if (stage_ == 1 && step >= 20 && quiet()) {
      inject(ft::FaultKind::sigkill, 1);
      ::kill(pids_.at(2), SIGKILL);  // not through the controller: a fault it did not inject
      stage_ = 2;
    }
  }

 private:
  ft::ReplicaClientOptions client_;
  std::map<int64_t, mesh::ActorMesh<TinyTrainer>> trainers_;
  std::map<int64_t, int> pids_;
  std::vector<std::string> events_;
  int stage_ = 0;
  bool chaos_ = false;
};

struct Run {
  ft::RunStats stats;
  std::string log;
};

Run run_job(bool chaos, int64_t steps) {
  ft::StoreServer store;
  std::vector<mesh::HostMesh> hosts{mesh::this_host()};
  auto& client = hosts[0].client();
  auto lighthouse = client.spawn<ft::Lighthouse>("lighthouse", ft::LighthouseOptions{});
  ft::ReplicaClientOptions o;
  o.store_host = store.host();
  o.store_port = store.port();
  o.store_namespace = chaos ? "chaos" : "test";
  o.max_steps = steps;
  auto c = client.spawn<TestController>("controller", hosts, lighthouse, o, chaos);
  auto timeout = monarch::config::global().duration("mesh.spawn_timeout");
  c.call(&TestController::spawn_all).get(timeout * 2);
  c.call(&TestController::start_all).get(timeout * 2);
  Run r;
  r.stats = c.call(&TestController::done).get(std::chrono::seconds(180));
  for (auto& e : c.call(&TestController::events).get(timeout)) r.log += e + "\n";
  lighthouse.stop().get(timeout);
  c.call(&TestController::shutdown).get(timeout * 2);
  c.stop().get(timeout);
  return r;
}

TEST(ReplicaClient, HealsAKilledGroupAndCountsAnOutsideKillAsAFault) {
  auto [s, log] = run_job(false, kSteps);

  EXPECT_TRUE(s.replicas_bitwise_equal) << log;
  EXPECT_EQ(s.hash_mismatches, 0) << log;
  EXPECT_EQ(s.faults_injected, 2) << log;  // allreduce.enter + SIGKILL
  EXPECT_EQ(s.faults_outside, 1) << log;   // the plain kill(2)
  EXPECT_EQ(s.survivor_restarts, 0) << log;
  EXPECT_EQ(s.respawns, 2) << log;   // replica1 and replica2; replica0 was never restarted
  EXPECT_GT(s.heal_gbps, 0) << log;  // the respawned groups caught up by healing
  EXPECT_EQ(s.steps, kSteps);
  EXPECT_TRUE(s.error.empty()) << s.error;
  auto faults = nlohmann::json::parse(s.faults_json);
  ASSERT_EQ(faults.size(), 3u) << s.faults_json;
  EXPECT_EQ(faults[2]["fault"], "outside") << s.faults_json;
}

// The chaos kinds at their points: each fires (a pending request, a healer mid-read, two groups
// at once), each is counted per failed group, each recovers; replicas end bitwise equal.
TEST(ReplicaClient, ChaosKindsFireAtTheirPointsAndRecover) {
  auto [s, log] = run_job(true, 1500);
  EXPECT_TRUE(s.replicas_bitwise_equal) << log;
  EXPECT_EQ(s.survivor_restarts, 0) << log;
  EXPECT_EQ(s.faults_outside, 0) << log;
  EXPECT_EQ(s.faults_injected, 5) << log;  // 1 in quorum, the victim and its healer, 2 at once
  EXPECT_EQ(s.respawns, 5) << log;
  EXPECT_TRUE(s.error.empty()) << s.error;
  auto faults = nlohmann::json::parse(s.faults_json);
  ASSERT_EQ(faults.size(), 3u) << s.faults_json;
  EXPECT_EQ(faults[0]["fault"], "kill_in_quorum") << s.faults_json;
  EXPECT_EQ(faults[0]["fired"], true) << s.faults_json;
  EXPECT_EQ(faults[1]["fault"], "kill_healer_mid_heal") << s.faults_json;
  EXPECT_EQ(faults[1]["fired"], true) << s.faults_json;
  EXPECT_EQ(faults[2]["fault"], "sigkill_two_at_once") << s.faults_json;
  EXPECT_EQ(faults[2]["victims"].size(), 2u) << s.faults_json;
  for (auto& f : faults) EXPECT_FALSE(f["recovery_s"].is_null()) << f.dump() << "\n" << log;
  EXPECT_EQ(s.recovery_s.size(), 3u) << log;
}

TEST(FaultPoints, ArmRejectsAnUnknownPointAndTakeConsumesOnce) {
  EXPECT_THROW(ft::arm_fault("quorum.before_request"), monarch::UsageError);
  EXPECT_THROW(ft::arm_fault("allreduce.exit"), monarch::UsageError);
  EXPECT_FALSE(ft::take_fault(ft::kFaultAllreduceEnter));
  ft::arm_fault(ft::kFaultAllreduceEnter);
  EXPECT_TRUE(ft::take_fault(ft::kFaultAllreduceEnter));
  EXPECT_FALSE(ft::take_fault(ft::kFaultAllreduceEnter));
}

}  // namespace

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv);  // a worker (replica rank) never returns from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
