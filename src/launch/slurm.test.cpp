// SLURM launcher without a cluster: the batch script (golden files), squeue parsers on recorded
// output (JSON of slurm 22.05 and the text fallback), option checks, and the SLURM_* environment.
#include "monarch/launch/slurm.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "monarch/actor/errors.hpp"

using monarch::launch::Job;
using monarch::launch::SlurmError;
using monarch::launch::SlurmGroup;
using monarch::launch::SlurmJob;
using monarch::launch::SlurmOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The script with the job's work dir replaced by @WORKDIR@ (it holds a per-job random tag).
std::string rendered(const SlurmJob& job) {
  std::string s = job.render_sbatch();
  const std::string& dir = job.work_dir();
  for (size_t p = s.find(dir); p != std::string::npos; p = s.find(dir, p))
    s.replace(p, dir.size(), "@WORKDIR@");
  return s;
}

// MONARCH_UPDATE_GOLDEN=1 rewrites the golden file with `actual` (review the diff before
// committing).
std::string golden(const char* name, const std::string& actual) {
  std::string path = std::string(MONARCH_LAUNCH_TESTDATA) + "/" + name;
  if (const char* u = std::getenv("MONARCH_UPDATE_GOLDEN"); u != nullptr && std::string(u) == "1") {
    std::ofstream(path) << actual;
  }
  return read(path);
}

}  // namespace

TEST(SlurmScript, OneGroupMatchesGolden) {
  SlurmOptions o;
  o.groups[0].nodes = 4;
  o.groups[0].tasks_per_node = 2;
  o.groups[0].gpus_per_node = 8;
  o.groups[0].partition = "gpu";
  o.time_limit = "01:30:00";
  o.job_name = "trainers";
  o.extra_sbatch = {"--account=proj", "--exclusive"};
  o.agent_program = "/opt/monarch/bin/monarch";
  o.shared_dir = "/shared/monarch";
  SlurmJob job(o);
  EXPECT_THAT(job.work_dir(), HasSubstr("/shared/monarch/job-"));
  std::string got = rendered(job);
  EXPECT_EQ(got, golden("one_group.sbatch", got));
}

TEST(SlurmScript, SeveralMeshesMakeAHeterogeneousJob) {
  SlurmOptions o;
  o.groups = {SlurmGroup{}, SlurmGroup{}};
  o.groups[0].nodes = 2;
  o.groups[0].gpus_per_node = 8;
  o.groups[0].partition = "gpu";
  o.groups[1].nodes = 1;
  o.groups[1].tasks_per_node = 4;
  o.groups[1].cpus_per_task = 16;
  o.groups[1].partition = "cpu";
  o.groups[1].extra_sbatch = {"--mem=64G"};
  o.agent_program = "/opt/it's here/monarch";  // quoted for the shell
  o.shared_dir = "/shared/monarch";
  SlurmJob job(o);
  std::string got = rendered(job);
  EXPECT_EQ(got, golden("hetjob.sbatch", got));
}

TEST(SlurmScript, BadOptionsThrowNamingTheField) {
  auto message = [](SlurmOptions o) {
    try {
      SlurmJob job(o);
    } catch (const monarch::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SlurmOptions o;
  o.groups.clear();
  EXPECT_THAT(message(o), HasSubstr("groups is empty"));
  o = SlurmOptions{};
  o.groups[0].nodes = 0;
  EXPECT_THAT(message(o), HasSubstr("groups[0].nodes is 0"));
  o = SlurmOptions{};
  o.extra_sbatch = {"--x\n#SBATCH --y"};
  EXPECT_THAT(message(o), HasSubstr("extra_sbatch"));
  o = SlurmOptions{};
  o.agent_host = "'$(evil)'";
  EXPECT_THAT(message(o), HasSubstr("agent_host"));
}

// Held as a launch::Job; before start() there is nothing to stop.
TEST(SlurmScript, IsALaunchJob) {
  SlurmOptions o;
  o.shared_dir = "/shared/monarch";
  std::unique_ptr<Job> job = std::make_unique<SlurmJob>(o);
  job->on_failure([](const monarch::MeshFailure&) { return true; });
  EXPECT_NO_THROW(job->stop());
  EXPECT_NO_THROW(job->stop());
}

// Recorded from `squeue --json` of slurm 22.05.8 (trimmed to the fields we read, plus noise):
// squeue 22.05 ignores --jobs with --json, so other jobs are in the document.
TEST(SqueueParse, JsonPicksTheJobAndItsHetComponents) {
  std::string doc = R"({"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "jobs": [
    {"job_id": 1, "job_state": "COMPLETED", "nodes": "localhost", "het_job_id": 0, "het_job_offset": 0, "state_reason": "None"},
    {"job_id": 7, "job_state": "RUNNING", "nodes": "node[01-02]", "het_job_id": 7, "het_job_offset": 0, "state_reason": "None"},
    {"job_id": 8, "job_state": "PENDING", "nodes": "", "het_job_id": 7, "het_job_offset": 1, "state_reason": "Resources"},
    {"job_id": 9, "job_state": "RUNNING", "nodes": "n5", "het_job_id": 0, "het_job_offset": 0, "state_reason": "None"}]})";
  auto het = monarch::launch::detail::parse_squeue_json(doc, "7");
  EXPECT_FALSE(het.gone);
  EXPECT_EQ(het.state, "PENDING");  // not every component runs yet
  EXPECT_EQ(het.reason, "Resources");
  EXPECT_THAT(het.nodelists, ElementsAre("node[01-02]", ""));
  auto one = monarch::launch::detail::parse_squeue_json(doc, "9");
  EXPECT_EQ(one.state, "RUNNING");
  EXPECT_THAT(one.nodelists, ElementsAre("n5"));
  EXPECT_TRUE(monarch::launch::detail::parse_squeue_json(doc, "42").gone);
  EXPECT_THROW(
      monarch::launch::detail::parse_squeue_json("squeue: unrecognized option '--json'", "7"),
      SlurmError);
}

TEST(SqueueParse, TextFallback) {
  using monarch::launch::detail::parse_squeue_text;
  auto st = parse_squeue_text("12+1|RUNNING|c[3-4]|None\n12+0|RUNNING|g1|None\n", "12");
  EXPECT_EQ(st.state, "RUNNING");
  EXPECT_THAT(st.nodelists, ElementsAre("g1", "c[3-4]"));  // ordered by het offset
  auto failed = parse_squeue_text("12+0|RUNNING|g1|None\n12+1|NODE_FAIL|c[3-4]|NodeDown\n", "12");
  EXPECT_EQ(failed.state, "NODE_FAIL");  // a final component state wins
  EXPECT_EQ(failed.reason, "NodeDown");
  EXPECT_TRUE(parse_squeue_text("", "12").gone);
  EXPECT_THROW(parse_squeue_text("garbage\n", "12"), SlurmError);
  EXPECT_THROW(parse_squeue_text("12+x|RUNNING|g1|None\n", "12"), SlurmError);
  EXPECT_TRUE(monarch::launch::is_final_state("PREEMPTED"));
  EXPECT_FALSE(monarch::launch::is_final_state("RUNNING"));
}

TEST(SlurmEnv, ReadsTheAllocation) {
  ::unsetenv("SLURM_JOB_ID");
  ::unsetenv("SLURM_JOBID");
  EXPECT_FALSE(monarch::launch::slurm_env().has_value());
  ::setenv("SLURM_JOB_ID", "77", 1);
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NODEID", "2", 1);
  ::setenv("SLURM_JOB_NODELIST", "node[01-04]", 1);
  auto e = monarch::launch::slurm_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->job_id, "77");
  EXPECT_EQ(e->procid, 5u);
  EXPECT_EQ(e->ntasks, 8u);
  EXPECT_EQ(e->localid, 1u);
  EXPECT_EQ(e->nodeid, 2u);
  EXPECT_THAT(e->nodes, ElementsAre("node01", "node02", "node03", "node04"));
  ::setenv("SLURM_PROCID", "x1", 1);
  try {
    monarch::launch::slurm_env();
    ADD_FAILURE() << "no error";
  } catch (const SlurmError& err) {
    EXPECT_THAT(err.what(), HasSubstr("SLURM_PROCID='x1'"));
  }
  ::setenv("SLURM_PROCID", "9", 1);
  EXPECT_THROW(monarch::launch::slurm_env(), SlurmError);  // 9 >= 8 tasks
  for (const char* k : {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                        "SLURM_NODEID", "SLURM_JOB_NODELIST"}) {
    ::unsetenv(k);
  }
}
