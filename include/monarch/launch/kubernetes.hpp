// KubernetesJob: a HostMesh whose hosts are the pods of a Kubernetes Indexed Job.
//
//   monarch::launch::KubernetesOptions o;
//   o.name = "trainers"; o.image = "registry.example.com/monarch:latest"; o.replicas = 4;
//   o.gpus_per_pod = 8; o.secret = "monarch-secret";      // Secret with key MONARCH_SECRET
//   monarch::launch::KubernetesJob job(o);
//   std::cout << job.render();                              // the manifests, YAML
//   auto hosts = job.launch({.listen = "tcp://" + my_pod_ip + ":0"});   // HostMesh {hosts: 4}
//   job.on_failure([](const monarch::MeshFailure& f) { ...; return true; });
//   auto procs = hosts.spawn_procs({{"gpus", 8}});          // {hosts: 4, gpus: 8}
//   ...
//   procs.stop();
//   job.shutdown();                                         // kubectl delete (the destructor too)
//
// What launch() does (docs/launch-kubernetes.md):
//   1. `kubectl apply -f -` with manifests(): a headless Service (clusterIP: None) and a batch/v1
//      Job with completionMode Indexed, parallelism = completions = replicas, backoffLimit 0.
//      Pod index = rank (the Job's completion index; the pod sees it as JOB_COMPLETION_INDEX and
//      MONARCH_RANK). Each pod runs `monarch agent --listen tcp://$(MONARCH_POD_IP):PORT` (the
//      agent must listen on the pod IP: its workers listen on the agent's host and report it).
//   2. Polls `kubectl get pods -l monarch/job=NAME -o json` every poll_interval until there is one
//      Running, Ready pod with an IP for every index 0..replicas-1; a pod that Failed, or whose
//      container cannot start (ErrImagePull, CrashLoopBackOff, ...), fails the launch at once.
//   3. attach_to_workers({"tcp://IP0:PORT", "tcp://IP1:PORT", ...}) in index order.
//   4. Keeps polling: a pod that fails, finishes, turns Unknown, is being deleted or disappears
//      becomes a MeshFailure
//      {mesh: NAME, ranks: [index], cause: "pod NAME-1-x7k2p (index 1) Failed: ..."}.
//
// Unverified against a live cluster: the manifests are checked with kubectl's client-side dry
// run and golden files; the watch/attach path runs against a fake API server replaying recorded
// pod lists (src/launch/kubernetes.test.cpp, scripts/fake-kube-api.py).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "monarch/actor/supervision.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::launch {

enum class GpuVendor { nvidia, amd };  ///< resource nvidia.com/gpu or amd.com/gpu

struct KubernetesOptions {
  /// Job and Service name: a DNS-1035 label of at most 52 characters (pods are NAME-INDEX-xxxxx).
  std::string name{};
  std::string ns = "default";   ///< namespace
  std::string image{};          ///< container image holding `monarch` (and the worker binary)
  size_t replicas = 1;          ///< pods = hosts of the HostMesh
  uint16_t agent_port = 26600;  ///< the agent's TCP port in each pod
  size_t gpus_per_pod = 0;      ///< GPU limit per pod (0: none)
  GpuVendor gpu_vendor = GpuVendor::nvidia;
  std::string cpu{};       ///< cpu request, Kubernetes quantity ("8", "500m"); empty: none
  std::string memory{};    ///< memory request ("64Gi"); empty: none
  std::string shm_size{};  ///< sizeLimit of the /dev/shm emptyDir (medium Memory); empty: none
  /// Container command; empty: {"monarch", "agent", "--listen", "tcp://$(MONARCH_POD_IP):PORT"}.
  /// Kubernetes expands $(VAR) of the container's env in it.
  std::vector<std::string> command{};
  std::vector<std::string> env{};  ///< extra container env, "KEY=VALUE"
  /// A Secret whose keys become env (envFrom), e.g. one with key MONARCH_SECRET: TCP links need
  /// the same secret in client and agents (docs/channels.md). Empty: none.
  std::string secret{};
  /// Render a JobSet (jobset.x-k8s.io/v1alpha2, one replicated job) instead of the Job. Rendered
  /// only: launch() with jobset = true is untested against any server.
  bool jobset = false;

  std::string kubectl = "kubectl";          ///< program (searched on PATH)
  std::vector<std::string> kubectl_args{};  ///< before every subcommand, e.g. {"--context", "c"}
  /// kubectl apply validates against the server's OpenAPI schema; false adds --validate=false
  /// (the server still checks the objects).
  bool validate = true;
  std::chrono::milliseconds ready_timeout{std::chrono::minutes(5)};     ///< apply until all Ready
  std::chrono::milliseconds poll_interval{std::chrono::seconds(1)};     ///< pod polling period
  std::chrono::milliseconds kubectl_timeout{std::chrono::seconds(60)};  ///< each kubectl run
};

/// One pod of the job as last seen.
struct PodInfo {
  size_t index = 0;  ///< completion index = rank in the HostMesh
  std::string name;
  std::string phase;      ///< Pending, Running, Succeeded, Failed, Unknown
  std::string ip;         ///< status.podIP; empty until assigned
  bool ready = false;     ///< condition Ready is True
  bool deleting = false;  ///< metadata.deletionTimestamp is set
  std::string detail;     ///< why it is not running: container waiting/terminated reason, message
  /// "pod trainers-1-x7k2p (index 1) Pending: ContainerCreating"
  std::string describe() const;
};

/// Parses a PodList (`kubectl get pods -o json`) into pods with a completion index (annotation or
/// label batch.kubernetes.io/job-completion-index); others are skipped. Throws Error on bad JSON.
std::vector<PodInfo> parse_pods(const std::string& pod_list_json);

/// The result of a finished command.
struct CommandResult {
  int status = 0;  ///< exit code; 128+signal when killed
  std::string out;
  std::string err;
};
/// Runs argv[0] (searched on PATH) with `input` on its stdin; kills it after `timeout`. Throws
/// Error naming the command when it cannot start or runs past the timeout.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& input,
                          std::chrono::milliseconds timeout);

/// Manifests as a YAML stream ("---" between documents). Strings are double-quoted.
std::string to_yaml(const std::vector<nlohmann::json>& docs);

class KubernetesJob {
 public:
  /// Receives pod failures; true = handled. Runs on the job's watcher thread; must not call
  /// shutdown() or destroy the job (the watcher is joined there).
  using FailureHandler = std::function<bool(const MeshFailure&)>;
  enum class Format { yaml, json };

  /// Throws UsageError naming the bad option (name, image, replicas, port, env entry).
  explicit KubernetesJob(KubernetesOptions options);
  /// shutdown().
  ~KubernetesJob();
  KubernetesJob(const KubernetesJob&) = delete;
  KubernetesJob& operator=(const KubernetesJob&) = delete;

  const KubernetesOptions& options() const;
  /// {Service, Job} (or {Service, JobSet}).
  std::vector<nlohmann::json> manifests() const;
  /// manifests() as YAML documents or a JSON List.
  std::string render(Format format = Format::yaml) const;

  /// Applies the manifests, waits until every pod is Ready (ready_timeout), attaches to the
  /// agents and starts watching the pods. `host.listen` must be a TCP address the pods can reach
  /// (e.g. "tcp://<client pod IP>:0"): UsageError otherwise. Throws Error naming the pod and its
  /// phase when a pod fails or is not Ready in time, or the kubectl command and its stderr when
  /// kubectl fails; the job is deleted before it throws. Call once.
  mesh::HostMesh launch(mesh::HostOptions host);
  /// The HostMesh of launch(); UsageError before.
  mesh::HostMesh hosts() const;
  /// Pods by index as last polled (empty before launch()).
  std::vector<PodInfo> pods() const;

  /// Pod failures after launch(): each failed index is reported once. Unhandled (no handler, or
  /// it returns false): the fault hook.
  void on_failure(FailureHandler handler);
  /// Receives unhandled pod failures as an ActorSupervisionEvent of actor "<client>.k8s.NAME",
  /// type "KubernetesJob". Default: print and exit(1) (fail fast, like HostMesh).
  void set_fault_hook(std::function<void(const ActorSupervisionEvent&)> hook);

  /// Stops watching, then `kubectl delete` of the Service and the Job (cascading to the pods,
  /// not waiting for them). Stop your ProcMeshes first: their agents die with the pods.
  /// Idempotent; returns false (and logs kubectl's stderr) when the delete failed.
  bool shutdown();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace monarch::launch
