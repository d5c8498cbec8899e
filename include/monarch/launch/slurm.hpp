// SLURM launcher: host meshes from a SLURM allocation (docs/launch-slurm.md). A launch::Job
// (monarch/launch/job.hpp): start, stop, on_failure.
//
//   monarch::launch::SlurmOptions o;
//   o.groups[0].nodes = 4;                 // 4 nodes x 1 agent each -> HostMesh {hosts: 4}
//   o.groups[0].gpus_per_node = 8;
//   o.time_limit = "01:00:00";
//   monarch::launch::SlurmJob job(o);      // nothing submitted yet; job.render_sbatch() is the
//                                          // script
//   auto hosts = job.start();              // sbatch, wait RUNNING, attach: one HostMesh per group
//   auto procs = job.spawn_procs(0, {{"gpus", 8}}, so);   // {hosts: 4, gpus: 8}; failures name
//                                                         // the job
//   ...
//   procs.stop();
//   job.stop();                            // scancel; also done by ~SlurmJob
//
// How agents are found (robust against port clashes): the batch script runs one `monarch agent`
// per SLURM task through srun; each binds port 0 on its node's name ($SLURMD_NODENAME) and prints
// `LISTENING tcp://node:port` into `<shared_dir>/job-<tag>/agent-<group>-<task>.out` (srun
// --output). The client reads those files, so shared_dir must be on a file system that the
// compute nodes and the client share (the usual home/project file system; any directory on a
// one-node cluster). Task t of a group runs on node t / tasks_per_node of its nodelist (block
// distribution), and rank t of its HostMesh is that agent.
//
// Threads: SlurmJob's methods are called from one thread (the owner's). A monitor thread polls
// squeue every poll_interval while the job is attached and calls the on_failure handler when the
// job leaves RUNNING. Failure handlers passed to spawn_procs run on the mesh's monitor thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "monarch/error.hpp"
#include "monarch/launch/job.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::launch {

/// One component of the job (a heterogeneous group when there are several): one HostMesh.
struct SlurmGroup {
  size_t nodes = 1;           ///< sbatch --nodes
  size_t tasks_per_node = 1;  ///< agents per node (--ntasks-per-node); each is one host of the mesh
  size_t gpus_per_node = 0;   ///< --gpus-per-node; 0: not requested
  size_t cpus_per_task = 0;   ///< --cpus-per-task; 0: SLURM's default
  std::string partition{};    ///< --partition; empty: the cluster's default
  /// More sbatch options for this group, one per line without "#SBATCH", e.g. "--constraint=h100".
  std::vector<std::string> extra_sbatch{};
};

struct SlurmOptions {
  /// Several groups make a heterogeneous job (`#SBATCH hetjob` between them, `srun --het-group`).
  std::vector<SlurmGroup> groups{SlurmGroup{}};
  std::string job_name = "monarch";  ///< --job-name
  std::string time_limit{};          ///< --time, e.g. "30" (minutes) or "01:00:00"; empty: default
  /// Job-wide sbatch options (written with the first group), e.g. "--account=proj".
  std::vector<std::string> extra_sbatch{};
  /// The monarch CLI on the compute nodes; empty: $MONARCH_AGENT_PROGRAM, else `monarch` on PATH.
  std::string agent_program{};
  /// Shell expression (inside single quotes, evaluated per task) for the host agents listen on.
  std::string agent_host = "${SLURMD_NODENAME}";
  /// Where the script and the agents' address files go; see the header comment. Empty:
  /// $MONARCH_SLURM_SHARED_DIR, else ./.monarch-slurm under the current directory. A shared dir
  /// that did not exist before submit() is removed with the work dir when nothing else is in it.
  std::string shared_dir{};
  /// Keep the work dir (script, agent output, batch output) after the job was stopped; it is
  /// always kept when starting or stopping failed after sbatch took the job. When sbatch refuses
  /// it, the work dir (only the script: render_sbatch()) is removed unless this is set.
  bool keep_work_dir = false;
  /// How the client attaches (HostOptions::listen empty: tcp://<this host name>:0). Without a
  /// secret in channel.secret, MONARCH_SECRET or MONARCH_SECRET_FILE, a random one is made for
  /// this job and handed to the agents through sbatch's environment (not the script).
  mesh::HostOptions host{};
  std::chrono::milliseconds start_timeout{
      std::chrono::minutes(5)};  ///< submit until all agents listen
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(250)};  ///< squeue / file polls
  std::chrono::milliseconds command_timeout{
      std::chrono::seconds(30)};  ///< each sbatch/squeue/scancel
  std::chrono::milliseconds cancel_timeout{
      std::chrono::seconds(30)};  ///< scancel until the job ended
  /// squeue output: true JSON (`squeue --json`, 22.05+), false `squeue -h -o ...`; nullopt: try
  /// JSON once and fall back when it fails.
  std::optional<bool> squeue_json{};
};

/// A job's state as squeue reports it.
struct SlurmJobState {
  std::string state;                   ///< "PENDING", "RUNNING", "FAILED", ...; "" when unknown
  std::string reason;                  ///< squeue's reason ("Resources", "None", ...)
  std::vector<std::string> nodelists;  ///< per group (het component), compressed ("node[01-04]")
  bool gone = false;                   ///< squeue no longer knows the job
};
/// True for states a job never leaves: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL,
/// PREEMPTED, BOOT_FAIL, DEADLINE, OUT_OF_MEMORY (also COMPLETING, which only ends).
bool is_final_state(const std::string& state);

/// Thrown by SlurmJob on a failed command, a deadline, or a job that ended; what() names the job
/// id (when there is one) and its state.
struct SlurmError : monarch::Error {
  explicit SlurmError(const std::string& message) : monarch::Error(ErrorCode::Slurm, message) {}
};

class SlurmJob final : public Job {
 public:
  /// Validates the options (throws UsageError naming the field); submits nothing.
  explicit SlurmJob(SlurmOptions options);
  /// stop()s the job when it was submitted (errors are logged, not thrown), then removes the
  /// work dir unless keep_work_dir.
  ~SlurmJob() override;
  SlurmJob(const SlurmJob&) = delete;
  SlurmJob& operator=(const SlurmJob&) = delete;

  /// The batch script (bash). Deterministic for given options and shared dir.
  std::string render_sbatch() const;

  /// submit(), wait_running(), then attach to every agent. Returns one HostMesh per group, each
  /// with extent {hosts: nodes * tasks_per_node}. Throws SlurmError naming the job id and state
  /// when the job ends or does not start within start_timeout (the job is stopped then).
  std::vector<mesh::HostMesh> start() override;
  /// Writes the script under the shared dir and runs `sbatch --parsable`; returns the job id.
  std::string submit();
  /// Polls squeue until the job is RUNNING; throws SlurmError when it ends first or the deadline
  /// passes. Returns the state (nodelists filled).
  SlurmJobState wait_running();
  /// squeue once. Throws SlurmError when squeue fails (other than for an unknown job: gone).
  SlurmJobState query() const;

  /// Host names per group (the expanded nodelist); valid after wait_running.
  const std::vector<std::vector<std::string>>& nodes() const;
  /// Agent addresses of `group`, rank order; valid after start.
  const std::vector<std::string>& agents(size_t group) const;
  /// The HostMesh of `group`; valid after start.
  const mesh::HostMesh& hosts(size_t group = 0) const;

  /// spawn_procs on hosts(group), with a failure handler that adds the job to each cause:
  /// "... (SLURM job 42 'monarch': RUNNING)" or "(SLURM job 42 'monarch': CANCELLED)". The
  /// user's options.on_failure receives that MeshFailure; when it is empty the failure is logged
  /// and left unhandled (the HostMesh fault hook).
  mesh::ProcMesh spawn_procs(size_t group, const ndslice::Extent& per_host,
                             mesh::SpawnOptions options = {});

  /// Called once (monitor thread) when the job leaves RUNNING while attached: a MeshFailure with
  /// mesh "slurm-<id>", every rank of every group (groups in order), cause "SLURM job 42
  /// 'monarch' ended: NODE_FAIL (reason ...)". While the job shows COMPLETING (its steps being
  /// killed) the report waits up to 5 s for the final state. Unhandled (no handler, or it returns
  /// false): logged as an error. Not called after stop() began.
  void on_failure(FailureHandler handler) override;

  /// scancel the job and wait (cancel_timeout) until squeue shows it ended. Idempotent. Throws
  /// SlurmError naming the job when scancel fails or the job outlives the deadline; a later
  /// stop() (or the destructor) tries again.
  void stop() override;

  const std::string& job_id() const;    ///< "" before submit
  const std::string& work_dir() const;  ///< <shared_dir>/job-<tag>: script, agent files, job output

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// What a process started inside an allocation (by srun or the batch script) knows.
struct SlurmEnv {
  std::string job_id;              ///< SLURM_JOB_ID
  size_t procid = 0;               ///< SLURM_PROCID: rank in the step
  size_t ntasks = 1;               ///< SLURM_NTASKS (or SLURM_NPROCS): size of the step
  size_t localid = 0;              ///< SLURM_LOCALID: rank on this node
  size_t nodeid = 0;               ///< SLURM_NODEID
  std::string nodelist;            ///< SLURM_JOB_NODELIST (or SLURM_NODELIST), compressed
  std::vector<std::string> nodes;  ///< nodelist expanded
};
/// Reads SLURM_* from the environment; nullopt outside an allocation (no SLURM_JOB_ID). Throws
/// SlurmError naming the variable whose value is malformed.
std::optional<SlurmEnv> slurm_env();

namespace detail {
/// Parsers of squeue output for job `job_id` (exposed for tests). JSON: `squeue --json`'s
/// document (every job; filtered here); text: `squeue -h -o %i|%T|%N|%r` lines.
SlurmJobState parse_squeue_json(const std::string& text, const std::string& job_id);
SlurmJobState parse_squeue_text(const std::string& text, const std::string& job_id);
/// Single-quotes `s` for a POSIX shell.
std::string shell_quote(const std::string& s);
}  // namespace detail

}  // namespace monarch::launch
