// KubernetesJob: a HostMesh whose hosts are the pods of a Kubernetes Indexed Job. A launch::Job
// (monarch/launch/job.hpp): start, stop, on_failure.
//
//   monarch::launch::KubernetesOptions o;
//   o.name = "trainers"; o.image = "registry.example.com/monarch:latest"; o.replicas = 4;
//   o.gpus_per_pod = 8; o.secret = "monarch-secret";      // Secret with key MONARCH_SECRET
//   o.host.listen = "tcp://" + my_pod_ip + ":0";           // where the pods reach this client
//   monarch::launch::KubernetesJob job(o);
//   std::cout << job.render();                              // the manifests, YAML
//   job.on_failure([](const monarch::MeshFailure& f) { ...; return true; });
//   auto hosts = job.start().at(0);                         // HostMesh {hosts: 4}
//   auto procs = hosts.spawn_procs({{"gpus", 8}});          // {hosts: 4, gpus: 8}
//   ...
//   procs.stop();
//   job.stop();                                             // kubectl delete (the destructor too)
//
// What start() does (docs/launch-kubernetes.md):
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
#include "monarch/launch/job.hpp"
#include "monarch/mesh/process.hpp"

namespace monarch::launch {

enum class GpuVendor { nvidia, amd };  ///< resource nvidia.com/gpu or amd.com/gpu

/// Thrown by KubernetesJob when kubectl fails (apply, get, delete), a name is taken, or the pods
/// fail or never come up; what() names the job and what kubectl said.
struct KubernetesError : monarch::Error {
  explicit KubernetesError(const std::string& message)
      : monarch::Error(ErrorCode::Kubernetes, message) {}
};

/// The most pods a KubernetesJob runs: the API server's limit on an Indexed Job's completions.
inline constexpr size_t kMaxKubernetesReplicas = 100000;

struct KubernetesOptions {
  /// Job and Service name: a DNS-1035 label of at most 52 characters (pods are NAME-INDEX-xxxxx).
  std::string name{};
  std::string ns = "default";   ///< namespace
  std::string image{};          ///< container image holding `monarch` (and the worker binary)
  size_t replicas = 1;          ///< pods = hosts of the HostMesh: 1 to kMaxKubernetesReplicas
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
  /// only: start() with jobset = true is untested against any server.
  bool jobset = false;

  std::string kubectl = "kubectl";          ///< program (searched on PATH)
  std::vector<std::string> kubectl_args{};  ///< before every subcommand, e.g. {"--context", "c"}
  /// kubectl apply validates against the server's OpenAPI schema; false adds --validate=false
  /// (the server still checks the objects).
  bool validate = true;
  std::chrono::milliseconds ready_timeout{std::chrono::minutes(5)};     ///< apply until all Ready
  std::chrono::milliseconds poll_interval{std::chrono::seconds(1)};     ///< pod polling period
  std::chrono::milliseconds kubectl_timeout{std::chrono::seconds(60)};  ///< each kubectl run
  /// How the client attaches to the agents. `host.listen` must be a TCP address the pods can
  /// reach (e.g. "tcp://<client pod IP>:0"); start() throws UsageError otherwise.
  mesh::HostOptions host{};
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

/// Manifests as a YAML stream ("---" between documents). Strings are double-quoted.
std::string to_yaml(const std::vector<nlohmann::json>& docs);

class KubernetesJob final : public Job {
 public:
  enum class Format { yaml, json };

  /// Throws UsageError naming the bad option (name, image, replicas, port, env entry).
  explicit KubernetesJob(KubernetesOptions options);
  /// stop(); an error is logged.
  ~KubernetesJob() override;
  KubernetesJob(const KubernetesJob&) = delete;
  KubernetesJob& operator=(const KubernetesJob&) = delete;

  const KubernetesOptions& options() const;
  /// {Service, Job} (or {Service, JobSet}).
  std::vector<nlohmann::json> manifests() const;
  /// manifests() as YAML documents or a JSON List.
  std::string render(Format format = Format::yaml) const;

  /// Applies the manifests, waits until every pod is Ready (ready_timeout), attaches to the
  /// agents (options().host) and starts watching the pods. Returns one HostMesh (one group),
  /// {hosts: replicas}, host i = pod index i. options().host.listen must be a TCP address the
  /// pods can reach (e.g. "tcp://<client pod IP>:0"): UsageError otherwise. Throws Error naming
  /// the pod and its phase when a pod fails or is not Ready in time, or the kubectl command and
  /// its stderr when kubectl fails; the job is deleted before it throws. Call once. stop() from
  /// another thread while it waits for the pods makes it fail ("shut down while waiting").
  std::vector<mesh::HostMesh> start() override;
  /// The HostMesh of start(); UsageError before.
  mesh::HostMesh hosts() const;
  /// Pods by index as last polled (empty before start()).
  std::vector<PodInfo> pods() const;

  /// Pod failures after start(): a MeshFailure {mesh: name, ranks: [pod index], cause: "pod
  /// NAME-1-x7k2p (index 1) Failed: ..."}; each failed index is reported once. Runs on the job's
  /// watcher thread; must not call stop() or destroy the job (the watcher is joined there).
  /// Unhandled (no handler, or it returns false): the fault hook.
  void on_failure(FailureHandler handler) override;
  /// Receives unhandled pod failures as an ActorSupervisionEvent of actor "<client>.k8s.NAME",
  /// type "KubernetesJob". Default: print and exit(1) (fail fast, like HostMesh).
  void set_fault_hook(std::function<void(const ActorSupervisionEvent&)> hook);

  /// Stops watching, then `kubectl delete` of the Service and the Job (cascading to the pods,
  /// not waiting for them). Stop your ProcMeshes first: their agents die with the pods.
  /// Idempotent: the delete is issued once. Throws Error naming kubectl's exit status and the
  /// last line of its stderr when the delete failed; a later stop() does not retry it.
  void stop() override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace monarch::launch
