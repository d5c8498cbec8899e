// Where ft_train's replica groups run: this host, or the hosts of a SLURM job
// (`ft_train --launcher slurm`). Torch-free.
//
//   Launcher launcher(options);                       // validates the flags; submits nothing
//   auto hosts = launcher.start_hosts(replicas);      // local: {this_host()}; slurm: one HostMesh
//                                                     // per SLURM task (agent), {} extent each
//   ... group r spawns its procs on launcher.host_for(r) (hosts[r % hosts.size()] until that host
//   is lost) ...
//   launcher.stop();                                  // scancel; also done by ~Launcher
//
// Kubernetes layout: one Indexed Job of one pod (a `monarch agent`) per replica group, named
// --k8s-name-g<r>; a lost host is replaced by a fresh Job NAME-g<r>-<k>. ft_train runs in a pod
// of the cluster (its address: --client-listen tcp://$(MONARCH_POD_IP):0) with a service account
// that may manage Jobs, Services and Pods (k8s_launch --job ft_train --render writes it all).
//
// SLURM layout: one job of --slurm-nodes nodes x --slurm-tasks-per-node agents (one `monarch
// agent` per task; SlurmJob, monarch/launch/slurm.hpp). Each agent is one host: start_hosts
// returns one single-host HostMesh per agent, in task order, and group r is placed on host
// r % hosts (round-robin). Default nodes: one per replica group.
//
// A lost host (its agent killed, its node gone, the job ended): group r's procs fail with a cause
// naming the agent, or spawning on it fails. The caller (ReplicaController::replace_host) says so
// with host_lost(r, why); the next host_for(r) then submits a fresh one-task SLURM job
// (same partition, time, account) and returns its host, which group r keeps from then on. The
// fresh jobs live until stop(). Locally there is one host and it is never replaced.
//
// Errors: the constructor throws monarch::UsageError naming the flag (unknown launcher, 0 tasks,
// ...). start_hosts and host_for throw what SlurmJob::start throws (SlurmError naming the job, its
// state and what failed), or UsageError when called out of order.
//
// Threads: start_hosts and stop from the owner's thread (main); host_for and host_lost from any
// thread (the controller actor's), serialized by an internal mutex. host_for may block for a
// whole SLURM start (sbatch until its agent listens: start_timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "monarch/launch/kubernetes.hpp"
#include "monarch/mesh/process.hpp"

namespace CLI {
class App;
}

namespace monarch::ft::example {

struct LauncherOptions {
  std::string launcher = "local";  ///< "local", "slurm" or "kubernetes"
  std::string job_name = "ft_train";
  // --- SLURM (ignored by "local") ---
  int64_t nodes = 0;           ///< --slurm-nodes; 0: one node per replica group
  int64_t tasks_per_node = 1;  ///< --slurm-tasks-per-node: agents (hosts) per node
  int64_t cpus_per_task = 0;   ///< --slurm-cpus-per-task; 0: SLURM's default
  int64_t gpus_per_node = 0;   ///< --slurm-gpus-per-node; 0: none requested
  std::string partition{};     ///< --slurm-partition; empty: the cluster's default
  std::string time_limit{};    ///< --slurm-time, e.g. "30" or "01:00:00"; empty: default
  std::string account{};       ///< --slurm-account; empty: none
  std::vector<std::string> extra_sbatch{};  ///< --slurm-sbatch (repeatable), e.g. --qos=high
  /// The monarch CLI on the compute nodes; empty: $MONARCH_AGENT_PROGRAM, else `monarch` next to
  /// this executable when it exists, else `monarch` on PATH.
  std::string agent_program{};
  /// Where the job's script and agent files go (shared with the nodes); empty: SlurmJob's
  /// default ($MONARCH_SLURM_SHARED_DIR, else ./.monarch-slurm).
  std::string shared_dir{};
  /// Address this process listens on for the agents and workers, e.g. "tcp://10.0.0.5:0";
  /// empty: tcp://<this host name>:0.
  std::string listen{};
  int64_t start_timeout_s = 300;  ///< --slurm-start-timeout: submit until every agent listens
  // --- Kubernetes (ignored by the others): one 1-pod Indexed Job (KubernetesJob) per group ---
  std::string k8s_name =
      "ft-train";  ///< --k8s-name: group r's Job is NAME-g<r>, a fresh one NAME-g<r>-<k>
  std::string k8s_namespace = "default";
  std::string k8s_image{};   ///< --k8s-image: holds `monarch` and ft_train at this process's path
  std::string k8s_secret{};  ///< --k8s-secret: Secret with key MONARCH_SECRET (envFrom)
  int64_t k8s_gpus = 0;      ///< --k8s-gpus per pod
  std::string k8s_cpu{}, k8s_memory{}, k8s_shm{};  ///< --k8s-cpu/-memory/-shm requests
};

/// The KubernetesJob options of the agent Job named `name` (one pod) that `--launcher kubernetes`
/// applies for a replica group: what `k8s_launch --job ft_train --render` prints. Throws
/// UsageError when k8s_image is empty.
launch::KubernetesOptions kubernetes_group_options(const LauncherOptions& o,
                                                   const std::string& name);

/// Adds --launcher and the --slurm-* flags (SLURM's names: partition, time, nodes, ...) to `app`,
/// writing into `o` when parsed.
void add_launcher_flags(CLI::App& app, LauncherOptions& o);

/// Where this worker's gloo device binds and advertises (AllreduceGroup::configure's
/// local_host): the host its agent told it to listen on (MONARCH_WORKER_LISTEN "tcp://H:P" set by a
/// remote agent: a SLURM node's or a pod's address), else 127.0.0.1 (this_host(): one machine).
/// Peers on other nodes cannot reach a gloo device bound to loopback.
std::string worker_gloo_host();

class Launcher {
 public:
  /// Validates (UsageError naming the flag); starts nothing.
  explicit Launcher(LauncherOptions options);
  /// stop(); errors are logged.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  /// Once: the hosts the replica groups go on (see the header comment). `replicas` >= 1 sizes
  /// the default SLURM job. Never empty. SLURM: prints "ft_train: SLURM job ID: N host(s), ..."
  /// and, from then on, SIGTERM and SIGINT scancel every job of this launcher before ft_train
  /// dies of the signal (a job whose sbatch has not answered yet is not cancelled).
  std::vector<mesh::HostMesh> start_hosts(int64_t replicas);
  /// The host group r spawns on now: hosts[r % n], or the fresh host that replaced it. The
  /// reference is the launcher's; it stays valid until stop() (a later host_for(r) that
  /// replaces the host rewrites it in place).
  const mesh::HostMesh& host_for(int64_t group);
  /// Group r's host is gone (`why`: a failure naming its agent, or the spawn error there;
  /// ReplicaController::replace_host). Locally: returns false (there is no other host). SLURM
  /// and Kubernetes: marks that host lost, so that the next host_for(r) starts a fresh one;
  /// returns true.
  bool host_lost(int64_t group, const std::string& why);
  /// The name other hosts reach this process by (for the rendezvous store): the listen host, or
  /// this host's name; "127.0.0.1" locally.
  std::string advertise_host() const;
  /// Fresh hosts started so far (SLURM jobs submitted by host_for).
  int64_t fresh_hosts() const;
  /// The SLURM job id of the main job ("" locally or before start_hosts).
  std::string job_id() const;
  /// Ends every SLURM job (main and fresh). Stop the ProcMeshes first. Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace monarch::ft::example
