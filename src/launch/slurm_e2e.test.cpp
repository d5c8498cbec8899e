// SLURM launcher end to end, on the real single-node cluster of scripts/slurm-local.sh (the CTest
// fixture slurm_cluster starts and stops it; SLURM_CONF points at it). Two srun tasks on one node
// are the two "hosts" of a ProcMesh; an actor per proc answers casts; killing one task's agent is a
// MeshFailure naming the job; scancel from outside is a job-end supervision event; afterwards no
// job is left in squeue and no process of the job survives.
//
// This binary is also the worker the agents start (bootstrap() first thing in main).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "monarch/launch/slurm.hpp"
#include "monarch/mesh/process.hpp"
#include "testing/mesh_failures.hpp"

using namespace std::chrono_literals;
using monarch::MeshFailure;
using monarch::launch::Job;
using monarch::launch::SlurmJob;
using monarch::launch::SlurmOptions;
using monarch::mesh::SpawnOptions;
using monarch::ndslice::Extent;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

using Failures = monarch::testing::FailureLog;
using monarch::testing::all_dead;

struct Echo : monarch::Actor {
  explicit Echo(size_t rank) : rank_(rank) {}
  size_t rank() const { return rank_; }
  int pid() const { return ::getpid(); }
  std::string job() const {
    const char* j = std::getenv("SLURM_JOB_ID");
    return j != nullptr ? j : "";
  }
  int twice(int n) const { return 2 * n + static_cast<int>(rank_); }
  MONARCH_ENDPOINTS(Echo, rank, pid, job, twice)
  size_t rank_;
};

void worker_setup(monarch::Proc& proc, const monarch::mesh::WorkerInfo& info) {
  proc.register_name("echo", proc.spawn<Echo>("echo", info.rank));
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// Processes whose environment carries SLURM_JOB_ID=<id> (everything the job started).
std::vector<int> processes_of_job(const std::string& id) {
  std::vector<int> out;
  const std::string needle = "SLURM_JOB_ID=" + id;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (size_t p = 0; p < env.size();) {
      size_t end = env.find('\0', p);
      if (end == std::string::npos) end = env.size();
      if (env.compare(p, end - p, needle) == 0) {
        int pid = std::stoi(name);
        std::ifstream st(e.path() / "stat");
        std::string line;
        std::getline(st, line);
        auto close = line.rfind(')');
        bool zombie =
            close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
        if (!zombie) out.push_back(pid);
        break;
      }
      p = end + 1;
    }
  }
  return out;
}

int parent_of(int pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(st, line);
  auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(line.substr(close + 2));
  char state;
  int ppid = -1;
  in >> state >> ppid;
  return ppid;
}

// Root and a cluster, or the reason to skip.
std::string why_skip() {
  if (::geteuid() != 0)
    return "needs root: scripts/slurm-local.sh runs slurmctld/slurmd (uid " +
           std::to_string(::geteuid()) + ")";
  if (std::getenv("SLURM_CONF") == nullptr)
    return "SLURM_CONF not set: run through ctest (fixture slurm_cluster)";
  if (run("command -v sbatch").empty()) return "slurm-wlm not installed (scripts/setup-deps.sh)";
  return "";
}

SlurmOptions options(const std::string& name) {
  SlurmOptions o;
  o.job_name = name;
  o.groups[0].nodes = 1;
  o.groups[0].tasks_per_node = 2;  // two agents on the one node: two "hosts"
  o.agent_program = MONARCH_CLI;
  o.shared_dir = fs::temp_directory_path() / ("monarch-slurm-e2e-" + std::to_string(::getpid()));
  o.time_limit = "5";
  o.poll_interval = 100ms;
  o.start_timeout = 20s;
  o.host.listen = "tcp://127.0.0.1:0";
  o.host.timeouts.heartbeat_interval = 100ms;
  o.host.timeouts.heartbeat_timeout = 2000ms;
  o.host.timeouts.spawn_timeout = 20s;
  o.host.timeouts.stop_timeout = 3s;
  o.host.channel.delivery_timeout = 5s;
  return o;
}

void expect_job_gone(const std::string& id, const fs::path& shared_dir) {
  // The job created the shared dir, so it goes with its work dir.
  EXPECT_FALSE(fs::exists(shared_dir)) << "work dir left under " << shared_dir;
  fs::remove_all(shared_dir);
  // Pending/running/completing jobs: what squeue lists by default.
  std::string q = run("squeue -h -o %i");
  std::istringstream in(q);
  std::string line;
  while (std::getline(in, line))
    EXPECT_NE(line.substr(0, line.find('+')), id) << "job " << id << " still in squeue";
  auto left = processes_of_job(id);
  EXPECT_TRUE(all_dead(left, 10s)) << left.size() << " process(es) of job " << id << " survived";
}

}  // namespace

TEST(SlurmE2E, TwoTasksCastKillOneAndShutDown) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto t0 = std::chrono::steady_clock::now();
  auto o = options("monarch-e2e");
  std::string id;
  {
    SlurmJob job(o);
    auto hosts = job.start();
    id = job.job_id();
    auto started = std::chrono::steady_clock::now();
    ASSERT_EQ(hosts.size(), 1u);
    EXPECT_EQ(hosts[0].extent().to_string(), "{hosts=2}");
    EXPECT_EQ(job.nodes().at(0), std::vector<std::string>{"localhost"});
    EXPECT_EQ(job.query().state, "RUNNING");

    Failures failures;
    SpawnOptions so;
    so.name = "slurm";
    so.on_failure = [&](const MeshFailure& f) {
      failures.add(f);
      return true;
    };
    auto procs = job.spawn_procs(0, Extent{{"gpus", 1}}, so);
    EXPECT_EQ(procs.extent().to_string(), "{hosts=2, gpus=1}");
    auto echo = procs.lookup<Echo>("echo");
    auto ranks = echo.call(&Echo::rank).get(10s);
    EXPECT_EQ(ranks[0], 0u);
    EXPECT_EQ(ranks[1], 1u);
    auto twice = echo.call(&Echo::twice, 20).get(10s);
    EXPECT_EQ(twice[0], 40);
    EXPECT_EQ(twice[1], 41);
    auto jobs = echo.call(&Echo::job).get(10s);
    EXPECT_EQ(jobs[0], id);  // the workers run inside the allocation
    EXPECT_EQ(jobs[1], id);
    auto pids = echo.call(&Echo::pid).get(10s);

    // Kill task 1: its agent (the worker's parent, started by srun) dies with SIGKILL.
    int agent1 = parent_of(pids[1]);
    ASSERT_GT(agent1, 1);
    ASSERT_EQ(::kill(agent1, SIGKILL), 0);
    ASSERT_TRUE(failures.wait(1, 10s)) << "no MeshFailure after killing task 1's agent";
    {
      std::lock_guard lock(failures.mu);
      std::set<size_t> failed;
      for (const auto& f : failures.got) failed.insert(f.ranks.begin(), f.ranks.end());
      EXPECT_EQ(failed, std::set<size_t>{1});
      EXPECT_THAT(failures.got[0].cause, HasSubstr("SLURM job " + id + " 'monarch-e2e'"));
      std::printf("failure: %s\n", failures.got[0].to_string().c_str());
    }
    EXPECT_TRUE(all_dead({agent1, pids[1]}, 5s));
    EXPECT_EQ(echo.slice("hosts", 0).call(&Echo::twice, 1).get(10s)[0], 2);  // rank 0 still works

    auto ms_since = [](std::chrono::steady_clock::time_point t) {
      return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - t)
                                        .count());
    };
    auto t_stop = std::chrono::steady_clock::now();
    EXPECT_TRUE(procs.stop());
    long long stop_ms = ms_since(t_stop);
    auto t_cancel = std::chrono::steady_clock::now();
    job.stop();
    long long cancel_ms = ms_since(t_cancel);
    EXPECT_TRUE(all_dead({pids[0]}, 5s));
    std::printf("job %s: start %lld ms, procs.stop %lld ms, cancel %lld ms, total %lld ms\n",
                id.c_str(),
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(started - t0).count()),
                stop_ms, cancel_ms, ms_since(t0));
  }
  expect_job_gone(id, o.shared_dir);
}

TEST(SlurmE2E, JobCancelledFromOutsideIsASupervisionEvent) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto o = options("monarch-e2e-end");
  std::string id;
  {
    SlurmJob job(o);
    job.start();
    id = job.job_id();
    Failures ended, failures;
    job.on_failure(ended.handler());
    SpawnOptions so;
    so.name = "doomed";
    so.on_failure = [&](const MeshFailure& f) {
      failures.add(f);
      return true;
    };
    auto procs = job.spawn_procs(0, Extent{{"gpus", 1}}, so);
    EXPECT_EQ(procs.lookup<Echo>("echo").call(&Echo::rank).get(10s)[1], 1u);

    ASSERT_EQ(std::system(("scancel " + id).c_str()), 0);  // the scheduler ends the job, not us
    ASSERT_TRUE(ended.wait(1, 10s)) << "no job-end event";
    {
      std::lock_guard lock(ended.mu);
      EXPECT_EQ(ended.got.size(), 1u);
      EXPECT_EQ(ended.got[0].mesh, "slurm-" + id);
      EXPECT_EQ(ended.got[0].ranks, (std::vector<size_t>{0, 1}));
      EXPECT_THAT(ended.got[0].cause, HasSubstr("SLURM job " + id + " 'monarch-e2e-end' ended: "));
      EXPECT_THAT(ended.got[0].cause, HasSubstr("ended: CANCELLED"));
      std::printf("job end: %s\n", ended.got[0].to_string().c_str());
    }
    // The agents went with the job: both ranks fail, each naming the job.
    ASSERT_TRUE(failures.wait(2, 10s)) << "the job ended but its ranks did not fail";
    {
      std::lock_guard lock(failures.mu);
      std::set<size_t> failed;
      for (const auto& f : failures.got) {
        failed.insert(f.ranks.begin(), f.ranks.end());
        EXPECT_THAT(f.cause, HasSubstr("SLURM job " + id));
      }
      EXPECT_EQ(failed, (std::set<size_t>{0, 1}));
    }
    procs.stop();
  }  // ~SlurmJob: stop (already ended)
  expect_job_gone(id, o.shared_dir);
}

// The same life cycle read through `squeue -h -o` (clusters without --json).
TEST(SlurmE2E, TextSqueueSeesTheSameLifeCycle) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto o = options("monarch-e2e-text");
  o.squeue_json = false;
  std::string id;
  {
    SlurmJob job(o);
    auto hosts = job.start();
    id = job.job_id();
    EXPECT_EQ(hosts.at(0).extent().to_string(), "{hosts=2}");
    auto st = job.query();
    EXPECT_EQ(st.state, "RUNNING");
    EXPECT_EQ(st.nodelists, std::vector<std::string>{"localhost"});
    job.stop();
    st = job.query();
    EXPECT_TRUE(st.gone || st.state == "CANCELLED") << st.state;
  }
  expect_job_gone(id, o.shared_dir);
}

// The same job held as a launch::Job (what a scheduler-agnostic caller sees): start, a proc on
// each host, stop, nothing left.
TEST(SlurmE2E, ThroughTheJobInterface) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto o = options("monarch-e2e-job");
  std::string id;
  {
    auto slurm = std::make_unique<SlurmJob>(o);
    SlurmJob& concrete = *slurm;
    std::unique_ptr<Job> job = std::move(slurm);
    Failures ended;
    job->on_failure(ended.handler());
    auto hosts = job->start();
    id = concrete.job_id();
    ASSERT_EQ(hosts.size(), 1u);
    EXPECT_EQ(hosts[0].extent().to_string(), "{hosts=2}");
    SpawnOptions so;
    so.name = "via-job";
    auto procs = hosts[0].spawn_procs(Extent{{"gpus", 1}}, so);
    EXPECT_EQ(procs.lookup<Echo>("echo").call(&Echo::job).get(10s)[1], id);
    EXPECT_TRUE(procs.stop());
    job->stop();
    job->stop();  // idempotent
    std::lock_guard lock(ended.mu);
    EXPECT_TRUE(ended.got.empty()) << ended.got[0].to_string();  // stopped by us: not a failure
  }
  expect_job_gone(id, o.shared_dir);
}

// Errors name the job and the cause: a request the cluster cannot satisfy (pending past the
// deadline), and agents that cannot start (the job ends before they listen; their stderr is
// quoted).
TEST(SlurmE2E, FailedStartsNameTheCause) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto o = options("monarch-e2e-bad");
  o.groups[0].nodes = 3;  // the cluster has one node: pending forever
  o.start_timeout = 2s;
  try {
    SlurmJob job(o);
    job.start();
    ADD_FAILURE() << "a 3-node job started on a 1-node cluster";
  } catch (const monarch::launch::SlurmError& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr(
            "'monarch-e2e-bad' not RUNNING within 2000 ms: PENDING (reason PartitionConfig)"));
  }
  o = options("monarch-e2e-noagent");
  o.agent_program = "/nonexistent/monarch";
  std::string id;
  try {
    SlurmJob job(o);
    job.start();
    ADD_FAILURE() << "agents that cannot exist listened";
  } catch (const monarch::launch::SlurmError& e) {
    std::string what = e.what();
    auto at = what.find("SLURM job ");
    ASSERT_NE(at, std::string::npos) << what;
    id = what.substr(at + 10, what.find(' ', at + 10) - at - 10);
    EXPECT_THAT(what, HasSubstr("before 2 agent(s) listened"));
    EXPECT_THAT(what, HasSubstr("/nonexistent/monarch"));  // the agent's stderr
    std::printf("error: %s\n", what.c_str());
  }
  std::string q = run("squeue -h -o %i");
  EXPECT_EQ(q.find(id + "\n"), std::string::npos) << q;
  auto left = processes_of_job(id);
  EXPECT_TRUE(all_dead(left, 10s));
  fs::remove_all(o.shared_dir);  // a failed start keeps its work dir for diagnosis
}

// A job sbatch refuses (here: a partition the cluster does not have) says why, and leaves no
// work dir behind: it had only the script, and the shared dir it made goes too.
TEST(SlurmE2E, ARefusedSubmitSaysWhyAndLeavesNoDirectory) {
  if (auto why = why_skip(); !why.empty()) GTEST_SKIP() << why;
  auto o = options("monarch-e2e-refused");
  o.groups[0].partition = "no-such-partition";
  ASSERT_FALSE(fs::exists(o.shared_dir));
  try {
    SlurmJob job(o);
    job.start();
    ADD_FAILURE() << "sbatch took a job for a partition that does not exist";
  } catch (const monarch::launch::SlurmError& e) {
    EXPECT_THAT(e.what(), HasSubstr("`sbatch --parsable "));
    EXPECT_THAT(e.what(), HasSubstr("failed (exit 1)"));
    EXPECT_THAT(e.what(), HasSubstr("invalid partition"));
  }
  EXPECT_FALSE(fs::exists(o.shared_dir)) << "left behind: " << o.shared_dir;
}

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv, worker_setup);  // a worker never returns from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
