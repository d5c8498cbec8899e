// KubernetesJob: manifests (golden files, kubectl client dry run), pod parsing, kubectl runs, and
// the launch path (apply, watch until Ready, attach, pod failures) against scripts/fake-kube-api.py
// replaying the pod lists in src/launch/testdata/, with real `monarch agent`s on 127.0.0.2/.3.
//
// This binary is also the worker of the HostMesh: main() calls bootstrap() first.
// MONARCH_UPDATE_GOLDEN=1 rewrites the golden files instead of comparing.
#include "monarch/launch/kubernetes.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "launch/subprocess.hpp"
#include "testing/mesh_failures.hpp"
#include "testing/subprocess.hpp"

using namespace std::chrono_literals;
using monarch::MeshFailure;
using monarch::launch::Job;
using monarch::launch::KubernetesJob;
using monarch::launch::KubernetesOptions;
using monarch::launch::detail::run_command;
using monarch::mesh::HostOptions;
using monarch::ndslice::Extent;
using nlohmann::json;
using ::testing::HasSubstr;

namespace {

using Failures = monarch::testing::FailureLog;

struct Worker : monarch::Actor {
  explicit Worker(size_t rank) : rank_(rank) {}
  size_t rank() const { return rank_; }
  int agent_pid() const { return ::getppid(); }  // the agent that forked this worker
  MONARCH_ENDPOINTS(Worker, rank, agent_pid)
  size_t rank_;
};

void worker_setup(monarch::Proc& proc, const monarch::mesh::WorkerInfo& info) {
  proc.register_name("worker", proc.spawn<Worker>("worker", info.rank));
}

std::string source(const std::string& rel) {
  return std::string(MONARCH_SOURCE_DIR) + "/" + rel;
}
std::string testdata(const std::string& f) {
  return source("src/launch/testdata/" + f);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool have_kubectl() {
  try {
    return run_command({"kubectl", "version", "--client"}, {.input = "", .timeout = 20s}).status ==
           0;
  } catch (const monarch::Error&) {
    return false;
  }
}
#define REQUIRE_KUBECTL() \
  if (!have_kubectl()) GTEST_SKIP() << "kubectl is not on PATH (apt package kubernetes-client)"

HostOptions fast() {
  HostOptions o;
  o.listen = "tcp://127.0.0.1:0";
  o.timeouts.heartbeat_interval = 100ms;
  o.timeouts.heartbeat_timeout = 2000ms;  // generous: sanitizer builds under ctest -j2 are slow
  o.timeouts.spawn_timeout = 20s;
  o.timeouts.stop_timeout = 3s;
  o.channel.delivery_timeout = 5s;
  return o;
}

// The fake API server, and a kubeconfig pointing at it.
class FakeApi {
 public:
  explicit FakeApi(const std::string& scenario = {})
      : proc_("/usr/bin/python3",
              scenario.empty() ? std::vector<std::string>{source("scripts/fake-kube-api.py")}
                               : std::vector<std::string>{source("scripts/fake-kube-api.py"),
                                                          "--scenario", testdata(scenario)}) {
    auto l = proc_.line(10s);
    if (!l || !l->starts_with("LISTENING "))
      throw std::runtime_error("fake-kube-api did not start");
    url_ = l->substr(10);
    kubeconfig_ = ::testing::TempDir() + "kubeconfig-" + std::to_string(::getpid()) + "-" +
                  std::to_string(next_++);
    std::ofstream(kubeconfig_)
        << "apiVersion: v1\nkind: Config\n"
        << "clusters:\n- name: fake\n  cluster:\n    server: " << url_ << "\n"
        << "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
        << "users:\n- name: fake\n  user: {}\n"
        << "current-context: fake\n";
  }
  ~FakeApi() { std::remove(kubeconfig_.c_str()); }
  std::vector<std::string> kubectl_args() const { return {"--kubeconfig", kubeconfig_}; }
  // Control requests go through kubectl too: no HTTP client needed.
  void step(const std::string& name) const {
    auto r = run_command({"kubectl", "--kubeconfig", kubeconfig_, "create", "--raw",
                          "/_fake/step/" + name, "-f", "-"},
                         {.input = "{}", .timeout = 20s});
    if (r.status != 0) throw std::runtime_error("fake step " + name + ": " + r.err);
  }
  json log() const {
    auto r = run_command({"kubectl", "--kubeconfig", kubeconfig_, "get", "--raw", "/_fake/log"},
                         {.input = "", .timeout = 20s});
    if (r.status != 0) throw std::runtime_error("fake log: " + r.err);
    return json::parse(r.out);
  }
  size_t count(const json& log, const std::string& method, const std::string& path) const {
    size_t n = 0;
    for (const auto& e : log) n += e["method"] == method && e["path"] == path;
    return n;
  }

 private:
  monarch::testing::Subprocess proc_;
  std::string url_, kubeconfig_;
  static inline int next_ = 0;
};

KubernetesOptions sample() {
  KubernetesOptions o;
  o.name = "trainers";
  o.ns = "monarch-test";
  o.image = "registry.example.com/monarch:latest";
  o.replicas = 4;
  o.gpus_per_pod = 8;
  o.cpu = "32";
  o.memory = "256Gi";
  o.shm_size = "64Gi";
  o.secret = "monarch-secret";
  o.env = {"NCCL_DEBUG=INFO"};
  return o;
}

void check_golden(const std::string& file, const std::string& got) {
  if (std::getenv("MONARCH_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(testdata(file)) << got;
    return;
  }
  EXPECT_EQ(got, slurp(testdata(file)))
      << "rendered manifests differ from " << file << " (MONARCH_UPDATE_GOLDEN=1 rewrites it)";
}

// ---------------------------------------------------------------------------------------------
// Manifests

TEST(KubernetesRender, IndexedJobAndHeadlessServiceMatchGolden) {
  KubernetesJob job(sample());
  check_golden("trainers.golden.yaml", job.render());
  check_golden("trainers.golden.json", job.render(KubernetesJob::Format::json));
}

TEST(KubernetesRender, AmdJobSetMatchesGolden) {
  auto o = sample();
  o.name = "amd";
  o.replicas = 2;
  o.gpu_vendor = monarch::launch::GpuVendor::amd;
  o.jobset = true;
  o.secret.clear();
  o.cpu.clear();
  o.shm_size.clear();
  o.env.clear();
  o.command = {"/opt/app/train", "--agent", "tcp://$(MONARCH_POD_IP):26600"};
  check_golden("amd-jobset.golden.yaml", KubernetesJob(o).render());
}

// The fields the launch path depends on, stated once more than the golden file does.
TEST(KubernetesRender, JobHasRanksByIndexShmGpusAndAgentOnPodIp) {
  auto docs = KubernetesJob(sample()).manifests();
  ASSERT_EQ(docs.size(), 2u);
  const json& svc = docs[0];
  const json& job = docs[1];
  EXPECT_EQ(svc["kind"], "Service");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["apiVersion"], "batch/v1");
  const json& spec = job["spec"];
  EXPECT_EQ(spec["completionMode"], "Indexed");
  EXPECT_EQ(spec["completions"], 4);
  EXPECT_EQ(spec["parallelism"], 4);
  EXPECT_EQ(spec["backoffLimit"], 0);
  const json& pod = spec["template"];
  EXPECT_EQ(svc["spec"]["selector"], pod["metadata"]["labels"]);  // the Service selects the pods
  EXPECT_EQ(pod["spec"]["subdomain"], "trainers");
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["command"], json({"monarch", "agent", "--listen", "tcp://$(MONARCH_POD_IP):26600"}));
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "8");
  EXPECT_EQ(c["resources"]["requests"]["memory"], "256Gi");
  EXPECT_EQ(c["ports"][0]["containerPort"], 26600);
  EXPECT_EQ(c["readinessProbe"]["tcpSocket"]["port"], 26600);
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"], "/dev/shm");
  EXPECT_EQ(pod["spec"]["volumes"][0]["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"], "64Gi");
  EXPECT_EQ(c["envFrom"][0]["secretRef"]["name"], "monarch-secret");
  std::map<std::string, json> env;
  for (const auto& e : c["env"]) env[e["name"]] = e;
  // MONARCH_POD_IP must come before the command that expands it: it is the first entry.
  EXPECT_EQ(c["env"][0]["name"], "MONARCH_POD_IP");
  EXPECT_EQ(env["MONARCH_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  EXPECT_EQ(env["MONARCH_RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(env["MONARCH_WORLD_SIZE"]["value"], "4");
  EXPECT_EQ(env["NCCL_DEBUG"]["value"], "INFO");
}

TEST(KubernetesRender, OptionsAreValidatedNamingTheOption) {
  auto bad = [](auto change, const std::string& what) {
    auto o = sample();
    change(o);
    try {
      KubernetesJob job(o);
      ADD_FAILURE() << "no UsageError for " << what;
    } catch (const monarch::UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  bad([](KubernetesOptions& o) { o.name = "Trainers"; }, "name 'Trainers'");
  bad([](KubernetesOptions& o) { o.name = std::string(53, 'a'); }, "at most 52");
  bad([](KubernetesOptions& o) { o.ns = "a_b"; }, "namespace 'a_b'");
  bad([](KubernetesOptions& o) { o.image.clear(); }, "image is empty");
  bad([](KubernetesOptions& o) { o.replicas = 0; }, "replicas is 0");
  bad([](KubernetesOptions& o) { o.replicas = size_t(-1); },
      "replicas is 18446744073709551615 (an Indexed Job runs at most 100000 pods)");
  bad([](KubernetesOptions& o) { o.agent_port = 0; }, "agent_port is 0");
  bad([](KubernetesOptions& o) { o.env = {"NOVALUE"}; }, "env entry 'NOVALUE'");
  KubernetesJob job(sample());
  EXPECT_THROW(job.start(), monarch::UsageError);  // host.listen (empty here) must be tcp
  EXPECT_THROW(job.hosts(), monarch::UsageError);
}

// Held as a launch::Job: the same checks through the interface; nothing to stop before start().
TEST(KubernetesRender, IsALaunchJob) {
  std::unique_ptr<Job> job = std::make_unique<KubernetesJob>(sample());
  job->on_failure([](const MeshFailure&) { return true; });
  EXPECT_THROW(job->start(), monarch::UsageError);  // sample() has no host.listen
  EXPECT_NO_THROW(job->stop());
}

// What kubectl (1.20 from Debian, or newer) reads back from our YAML is what we built: the YAML
// is valid, and kubectl accepts the objects in a client dry run. Needs discovery only.
TEST(KubernetesRender, KubectlClientDryRunAcceptsTheManifests) {
  REQUIRE_KUBECTL();
  FakeApi api;
  for (bool jobset : {false, true}) {
    auto o = sample();
    o.jobset = jobset;
    KubernetesJob job(o);
    std::string file = ::testing::TempDir() + "manifests-" + std::to_string(::getpid()) + ".yaml";
    std::ofstream(file) << job.render();
    std::vector<std::string> argv{"kubectl"};
    for (auto& a : api.kubectl_args()) argv.push_back(a);
    argv.insert(argv.end(),
                {"apply", "--dry-run=client", "--validate=false", "-o", "yaml", "-f", file});
    auto r = run_command(argv, {.input = "", .timeout = 30s});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(jobset ? "kind: JobSet" : "completionMode: Indexed"));
    // Same command with -o json: parse back and compare with manifests().
    argv[argv.size() - 3] = "json";
    r = run_command(argv, {.input = "", .timeout = 30s});
    ASSERT_EQ(r.status, 0) << r.err;
    std::remove(file.c_str());
    json back = json::parse(r.out);
    auto docs = job.manifests();
    ASSERT_EQ(back["items"].size(), docs.size());
    for (size_t i = 0; i < docs.size(); ++i) {
      EXPECT_EQ(back["items"][i]["spec"], docs[i]["spec"]) << "document " << i;
      EXPECT_EQ(back["items"][i]["metadata"]["labels"], docs[i]["metadata"]["labels"]);
    }
  }
  // Nothing was created by the dry runs.
  auto log = api.log();
  for (const auto& e : log) EXPECT_NE(e["method"], "POST") << e.dump();
}

// ---------------------------------------------------------------------------------------------
// Pods and commands

TEST(KubernetesPods, ParseRecordedPodListsByIndex) {
  auto pods = monarch::launch::parse_pods(slurp(testdata("pods-1-failed.json")));
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0].index, 0u);
  EXPECT_EQ(pods[0].name, "trainers-0-x7k2p");
  EXPECT_TRUE(pods[0].ready);
  EXPECT_EQ(pods[0].ip, "127.0.0.2");
  EXPECT_EQ(pods[1].index, 1u);
  EXPECT_EQ(pods[1].phase, "Failed");
  EXPECT_FALSE(pods[1].ready);
  EXPECT_EQ(
      pods[1].describe(),
      "pod trainers-1-q9w4z (index 1) Failed: container agent terminated: exit code 137 (Error)");
  auto pending = monarch::launch::parse_pods(slurp(testdata("pods-imagepull.json")));
  EXPECT_EQ(pending[0].describe(),
            "pod trainers-0-x7k2p (index 0) Pending: container agent waiting: ErrImagePull (failed "
            "to pull image "
            "\"registry.example.com/monarch:nope\": not found)");
  EXPECT_THROW(monarch::launch::parse_pods("{not json"), monarch::Error);
}

TEST(KubernetesCommands, RunCommandFeedsStdinAndEnforcesItsTimeout) {
  std::string big(1 << 20, 'x');  // more than a pipe holds: stdin and stdout must interleave
  auto r = run_command({"cat"}, {.input = big, .timeout = 10s});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.size(), big.size());
  r = run_command({"sh", "-c", "echo oops >&2; exit 3"}, {.input = "", .timeout = 10s});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err, "oops\n");
  auto start = std::chrono::steady_clock::now();
  try {
    run_command({"sleep", "30"}, {.input = "", .timeout = 200ms});
    ADD_FAILURE() << "no timeout";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("sleep 30: no answer within 200 ms"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_THROW(run_command({"/nonexistent/kubectl"}, {.input = "", .timeout = 1s}), monarch::Error);
  // A child that exits without reading its input does not kill us with SIGPIPE.
  r = run_command({"true"}, {.input = big, .timeout = 10s});
  EXPECT_EQ(r.status, 0);
}

// ---------------------------------------------------------------------------------------------
// Launch against the fake API

KubernetesOptions fake_options(const FakeApi& api, size_t replicas, uint16_t port) {
  KubernetesOptions o;
  o.name = "trainers";
  o.ns = "monarch-test";
  o.image = "registry.example.com/monarch:latest";
  o.replicas = replicas;
  o.agent_port = port;
  o.kubectl_args = api.kubectl_args();
  o.validate = false;  // the fake serves no OpenAPI schema
  o.poll_interval = 50ms;
  o.ready_timeout = 20s;
  o.kubectl_timeout = 20s;
  o.host = fast();
  return o;
}

TEST(KubernetesLaunch, AttachesToReadyPodsInIndexOrderAndReportsPodFailures) {
  REQUIRE_KUBECTL();
  // Two "pods": agents on 127.0.0.2 and 127.0.0.3 (the IPs in the recorded pod lists), one port.
  monarch::testing::Subprocess agent0(MONARCH_CLI, {"agent", "--listen", "tcp://127.0.0.2:0"});
  std::string a0 = agent0.listening();
  std::string port = a0.substr(a0.rfind(':') + 1);
  monarch::testing::Subprocess agent1(MONARCH_CLI,
                                      {"agent", "--listen", "tcp://127.0.0.3:" + port});
  agent1.listening();
  FakeApi api("scenario-attach.json");

  Failures pod_failures;  // before the job: its watcher reports here until the job is gone
  KubernetesJob job(fake_options(api, 2, static_cast<uint16_t>(std::stoi(port))));
  job.on_failure(pod_failures.handler());
  auto meshes = job.start();
  ASSERT_EQ(meshes.size(), 1u);
  auto hosts = meshes[0];
  EXPECT_EQ(hosts.extent().to_string(), "{hosts=2}");
  auto pods = job.pods();
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0].name, "trainers-0-x7k2p");
  EXPECT_EQ(pods[1].name, "trainers-1-q9w4z");

  // It applied the Service and the Job, and polled through Pending and not-Ready first.
  auto log = api.log();
  EXPECT_EQ(api.count(log, "POST", "/api/v1/namespaces/monarch-test/services"), 1u);
  EXPECT_EQ(api.count(log, "POST", "/apis/batch/v1/namespaces/monarch-test/jobs"), 1u);
  EXPECT_GE(api.count(log, "GET", "/api/v1/namespaces/monarch-test/pods"), 3u);

  // The HostMesh really attached: procs spawn on both agents and answer, host index = pod index.
  Failures proc_failures;
  monarch::mesh::SpawnOptions so;
  so.name = "k8s";
  so.on_failure = proc_failures.handler();
  auto procs = hosts.spawn_procs(Extent{{"gpus", 2}}, so);
  auto workers = procs.lookup<Worker>("worker");
  auto ranks = workers.call(&Worker::rank).get(10s);
  auto agents = workers.call(&Worker::agent_pid).get(10s);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r], r);
  EXPECT_EQ(agents[0], agent0.pid());
  EXPECT_EQ(agents[1], agent0.pid());
  EXPECT_EQ(agents[2], agent1.pid());
  EXPECT_EQ(agents[3], agent1.pid());

  // Pod 1 fails: its agent dies (as the kubelet would kill it) and the API shows phase Failed.
  agent1.kill(SIGKILL);
  api.step("pod-1-failed");
  ASSERT_TRUE(pod_failures.wait(1)) << "no MeshFailure for the failed pod";
  auto f = pod_failures.snapshot()[0];
  EXPECT_EQ(f.mesh, "trainers");
  EXPECT_EQ(f.ranks, std::vector<size_t>{1});
  EXPECT_THAT(f.cause, HasSubstr("pod trainers-1-q9w4z (index 1) Failed"));
  EXPECT_THAT(f.cause, HasSubstr("exit code 137"));
  // The mesh layer sees the agent go too: ranks 2 and 3 (host 1) fail; host 0 keeps working.
  ASSERT_TRUE(proc_failures.wait(2));
  std::set<size_t> failed;
  for (auto& pf : proc_failures.snapshot()) failed.insert(pf.ranks.begin(), pf.ranks.end());
  EXPECT_EQ(failed, (std::set<size_t>{2, 3}));
  EXPECT_EQ(workers.slice("hosts", 0).call(&Worker::rank).get(10s)[1], 1u);

  // Pod 0 is deleted.
  api.step("pod-0-deleted");
  ASSERT_TRUE(pod_failures.wait(2)) << "no MeshFailure for the deleted pod";
  f = pod_failures.snapshot()[1];
  EXPECT_EQ(f.ranks, std::vector<size_t>{0});
  EXPECT_EQ(f.cause, "pod trainers-0-x7k2p (index 0) deleted");
  // Each pod is reported once: let the watcher poll a few more times, then count.
  size_t polls = api.count(api.log(), "GET", "/api/v1/namespaces/monarch-test/pods");
  auto until = std::chrono::steady_clock::now() + 10s;
  while (api.count(api.log(), "GET", "/api/v1/namespaces/monarch-test/pods") < polls + 3 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  EXPECT_EQ(pod_failures.snapshot().size(), 2u);

  procs.stop();
  EXPECT_NO_THROW(job.stop());
  log = api.log();
  EXPECT_EQ(api.count(log, "DELETE", "/api/v1/namespaces/monarch-test/services/trainers"), 1u);
  EXPECT_EQ(api.count(log, "DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers"), 1u);
  EXPECT_NO_THROW(job.stop());  // idempotent: no second delete
  EXPECT_EQ(api.count(api.log(), "DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers"),
            1u);
}

TEST(KubernetesLaunch, UnhandledPodFailureGoesToTheFaultHook) {
  REQUIRE_KUBECTL();
  monarch::testing::Subprocess agent0(MONARCH_CLI, {"agent", "--listen", "tcp://127.0.0.2:0"});
  std::string a0 = agent0.listening();
  std::string port = a0.substr(a0.rfind(':') + 1);
  monarch::testing::Subprocess agent1(MONARCH_CLI,
                                      {"agent", "--listen", "tcp://127.0.0.3:" + port});
  agent1.listening();
  FakeApi api("scenario-attach.json");
  std::mutex mu;  // before the job: its watcher reports here until the job is gone
  std::condition_variable cv;
  std::vector<monarch::ActorSupervisionEvent> events;
  KubernetesJob job(fake_options(api, 2, static_cast<uint16_t>(std::stoi(port))));
  job.on_failure([](const MeshFailure&) { return false; });  // not handled
  job.set_fault_hook([&](const monarch::ActorSupervisionEvent& ev) {
    std::lock_guard lock(mu);
    events.push_back(ev);
    cv.notify_all();
  });
  auto hosts = job.start();
  api.step("pod-1-failed");
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 15s, [&] { return !events.empty(); }));
  EXPECT_EQ(events[0].actor_type, "KubernetesJob");
  EXPECT_EQ(events[0].actor.to_string().find("k8s.trainers") != std::string::npos, true)
      << events[0].actor.to_string();
  EXPECT_THAT(events[0].cause,
              HasSubstr("mesh trainers: rank [1] failed: pod trainers-1-q9w4z (index 1) Failed"));
}

TEST(KubernetesLaunch, FailsNamingThePodWhenItsImageCannotBePulled) {
  REQUIRE_KUBECTL();
  FakeApi api("scenario-imagepull.json");
  KubernetesJob job(fake_options(api, 2, 26600));
  try {
    job.start();
    ADD_FAILURE() << "launch succeeded";
  } catch (const monarch::UsageError& e) {
    ADD_FAILURE() << e.what();
  } catch (const monarch::Error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr("KubernetesJob trainers: pod trainers-0-x7k2p (index 0) Pending: container "
                  "agent waiting: ErrImagePull"));
  }
  // Nothing is left behind: the job was deleted before launch threw.
  auto log = api.log();
  EXPECT_EQ(api.count(log, "DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers"), 1u);
  EXPECT_EQ(api.count(log, "DELETE", "/api/v1/namespaces/monarch-test/services/trainers"), 1u);
}

TEST(KubernetesLaunch, TimesOutNamingPodsThatAreNotReady) {
  REQUIRE_KUBECTL();
  FakeApi api("scenario-stuck.json");
  auto o = fake_options(api, 3, 26600);
  o.ready_timeout = 500ms;
  KubernetesJob job(o);
  try {
    job.start();
    ADD_FAILURE() << "launch succeeded";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("pods not Ready within 500 ms"));
    EXPECT_THAT(
        e.what(),
        HasSubstr(
            "pod trainers-0-x7k2p (index 0) Pending: container agent waiting: ContainerCreating"));
    EXPECT_THAT(e.what(), HasSubstr("index 2: no pod"));
  }
  EXPECT_EQ(api.count(api.log(), "DELETE", "/apis/batch/v1/namespaces/monarch-test/jobs/trainers"),
            1u);
}

// A Job of that name left from an earlier run (or someone else's) is neither adopted nor deleted.
TEST(KubernetesLaunch, RefusesAJobThatAlreadyExists) {
  REQUIRE_KUBECTL();
  FakeApi api("scenario-attach.json");
  KubernetesJob job(fake_options(api, 2, 26600));
  std::vector<std::string> argv{"kubectl"};
  for (auto& a : api.kubectl_args()) argv.push_back(a);
  argv.insert(argv.end(), {"apply", "--validate=false", "-f", "-"});
  ASSERT_EQ(
      run_command(argv, {.input = job.render(KubernetesJob::Format::json), .timeout = 30s}).status,
      0);
  try {
    job.start();
    ADD_FAILURE() << "launch adopted an existing Job";
  } catch (const monarch::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a Job named trainers already exists in namespace monarch-test "
                                    "(kubectl apply: job.batch/trainers unchanged)"));
  }
  job.stop();
  auto log = api.log();
  for (const auto& e : log) EXPECT_NE(e["method"], "DELETE") << e.dump();
  EXPECT_EQ(api.count(log, "GET", "/api/v1/namespaces/monarch-test/pods"), 0u);
}

TEST(KubernetesLaunch, ApplyFailureCarriesKubectlsError) {
  REQUIRE_KUBECTL();
  FakeApi api("scenario-stuck.json");
  auto o = fake_options(api, 1, 26600);
  o.validate = true;  // the fake has no OpenAPI schema: kubectl's validation fails
  KubernetesJob job(o);
  try {
    job.start();
    ADD_FAILURE() << "launch succeeded";
  } catch (const monarch::Error& e) {
    // kubectl's own stderr (1.20: "Error from server (NotFound): ...", 1.32: "error validating
    // ...").
    EXPECT_THAT(e.what(), HasSubstr("KubernetesJob trainers: kubectl apply exited with 1: "));
    EXPECT_THAT(e.what(), HasSubstr("the server could not find the requested resource"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv, worker_setup);  // a worker never returns from here
  ::setenv("MONARCH_SECRET", "k8s-test-secret", 1);    // TCP links (the agents inherit it)
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
