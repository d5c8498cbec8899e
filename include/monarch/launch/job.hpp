// Job: what every launcher is, whichever scheduler runs it. A job asks a scheduler for hosts,
// starts one `monarch agent` on each, and hands them back as host meshes; it reports what the
// scheduler sees go wrong, and gives everything back when stopped.
//
//   std::unique_ptr<monarch::launch::Job> job;
//   if (on_slurm) job = std::make_unique<monarch::launch::SlurmJob>(slurm_options);
//   else job = std::make_unique<monarch::launch::KubernetesJob>(kubernetes_options);
//   job->on_failure([](const monarch::MeshFailure& f) { ...; return true; });  // before start()
//   auto hosts = job->start();                     // one HostMesh per group; hosts[0] for one
//   auto procs = hosts[0].spawn_procs({{"gpus", 8}});
//   ...
//   procs.stop();
//   job->stop();                                   // the destructor does it too
//
// Implementations: SlurmJob (monarch/launch/slurm.hpp, docs/launch-slurm.md) and KubernetesJob
// (monarch/launch/kubernetes.hpp, docs/launch-kubernetes.md). What only one scheduler has stays on
// its class: SlurmJob's submit/wait_running/query/spawn_procs, KubernetesJob's manifests/render/
// pods/set_fault_hook, ... Where the client listens (HostOptions) is part of each one's options.
//
// Shapes. A job has one or more groups (a SLURM heterogeneous job has one per component; a
// Kubernetes job has one). start() returns one HostMesh per group, in group order, each with
// extent {hosts: N} (host i = the scheduler's task or pod i of that group). The MeshFailures of
// on_failure number hosts across the groups: group 0's hosts first, then group 1's, ... (for one
// group, the rank in its HostMesh).
//
// Errors. Options are checked by the concrete constructor (UsageError naming the field). start()
// throws UsageError when called twice or when the options cannot work (e.g. a Kubernetes client
// address the pods cannot reach); otherwise the scheduler's error (SlurmError for SlurmJob,
// KubernetesError for KubernetesJob) naming the job, what failed and why: a scheduler command and
// its stderr, a deadline and the job's state then, a host that failed or never came up. When
// start() fails after it submitted the job, it stops the job before it throws (an error of that
// stop is logged): nothing it started is left running. stop() throws the same kinds.
//
// Threads. Call start(), stop() and the destructor from one thread (the owner's), not
// concurrently. The failure handler runs on the job's own monitor thread (SLURM: the squeue
// poller; Kubernetes: the pod watcher), never on the caller's; it must not call stop() or destroy
// the job (stop() joins that thread). on_failure may be called from any thread at any time.
#pragma once

#include <functional>
#include <vector>

#include "monarch/mesh/failure.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::launch {

class Job {
 public:
  /// Receives what the scheduler reports; true = handled. See on_failure.
  using FailureHandler = std::function<bool(const MeshFailure&)>;

  /// Implementations stop() the job; they log its errors instead of throwing them.
  virtual ~Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// Submits the job, waits until every host's agent listens (within the options' start
  /// deadline), attaches to them and starts monitoring the job. Returns one HostMesh per group
  /// (never empty; see the header comment). Call once, before stop(). Throws as described
  /// above.
  virtual std::vector<mesh::HostMesh> start() = 0;

  /// Gives back everything the job holds: stops monitoring (no failure handler call starts
  /// afterwards; one in progress is waited for), then has the scheduler end the job, and with it
  /// every agent and every proc they started: SlurmJob scancels and waits until squeue shows the
  /// job ended; KubernetesJob deletes the Service and the Job, the pods following (it does not
  /// wait for them to terminate). Stop your ProcMeshes first: their hosts go away. Idempotent:
  /// after a stop() that returned, and before start(), it does nothing. Throws when the scheduler
  /// refuses or the job outlives its deadline; see each class for whether a second call retries.
  virtual void stop() = 0;

  /// The handler for failures the scheduler reports after start() returned: a host (or the
  /// whole job) that ended, failed or was taken away. MeshFailure: mesh names the job, ranks are
  /// the hosts lost (numbered across groups), cause says what the scheduler saw. Each host is
  /// reported at most once. Failures of procs are not reported here: they go to their ProcMesh's
  /// on_failure. Unhandled (no handler, or it returns false): SlurmJob logs it as an error;
  /// KubernetesJob passes it to its fault hook (default: print and exit(1), fail fast). Set it
  /// before start() to miss nothing; it replaces the previous one.
  virtual void on_failure(FailureHandler handler) = 0;

 protected:
  Job() = default;
};

}  // namespace monarch::launch
