// Procs on the pods of a Kubernetes Job (docs/launch-kubernetes.md).
//
//   k8s_launch --name demo --image IMG --replicas 2 --render        print the manifests (YAML)
//   k8s_launch --name demo --image IMG --replicas 2 --listen tcp://$MY_POD_IP:0
//       apply them, wait for the pods, attach, spawn --procs procs per pod, say hello from each,
//       stop, delete the Job.
//
//   k8s_launch --job ft_train --name ft --image IMG --replicas 3 --render [-- FT_TRAIN_ARGS...]
//       the fault-tolerant job: a controller Job running `ft_train --launcher kubernetes ...`
//       (with a service account allowed to manage its agent Jobs) and the agent Job + Service
//       ft_train applies for each replica group (ft-train's launcher.hpp, the same code path).
//
// The workers are this executable (bootstrap() below), started by the agent in each pod: the
// image must hold it at the same path as the client's.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "cli_checks.hpp"
#include "launcher.hpp"
#include "monarch/launch/kubernetes.hpp"
#include "monarch/run_main.hpp"

namespace {
using json = nlohmann::json;

// The FT job: RBAC for the controller, the controller Job, one agent Job + Service per group.
std::vector<json> ft_train_manifests(const monarch::ft::example::LauncherOptions& lo,
                                     size_t replicas, const std::string& ft_train,
                                     const std::vector<std::string>& ft_args) {
  const std::string ctl = lo.k8s_name + "-controller";
  json meta{{"name", ctl},
            {"namespace", lo.k8s_namespace},
            {"labels", {{"monarch/job", lo.k8s_name}, {"monarch/role", "controller"}}}};
  std::vector<json> docs;
  docs.push_back({{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", meta}});
  json verbs = {"get", "list", "watch", "create", "patch", "delete"};
  docs.push_back(
      {{"apiVersion", "rbac.authorization.k8s.io/v1"},
       {"kind", "Role"},
       {"metadata", meta},
       {"rules",
        {{{"apiGroups", {"batch"}}, {"resources", {"jobs"}}, {"verbs", verbs}},
         {{"apiGroups", {""}}, {"resources", {"services", "pods"}}, {"verbs", verbs}}}}});
  docs.push_back(
      {{"apiVersion", "rbac.authorization.k8s.io/v1"},
       {"kind", "RoleBinding"},
       {"metadata", meta},
       {"roleRef", {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", ctl}}},
       {"subjects",
        {{{"kind", "ServiceAccount"}, {"name", ctl}, {"namespace", lo.k8s_namespace}}}}});
  std::vector<std::string> cmd{ft_train,
                               "--launcher",
                               "kubernetes",
                               "--k8s-name",
                               lo.k8s_name,
                               "--k8s-namespace",
                               lo.k8s_namespace,
                               "--k8s-image",
                               lo.k8s_image,
                               "--replicas",
                               std::to_string(replicas),
                               "--client-listen",
                               "tcp://$(MONARCH_POD_IP):0"};
  auto opt = [&](const char* flag, const std::string& v) {
    if (!v.empty()) cmd.insert(cmd.end(), {flag, v});
  };
  opt("--k8s-secret", lo.k8s_secret);
  opt("--k8s-gpus", lo.k8s_gpus > 0 ? std::to_string(lo.k8s_gpus) : "");
  opt("--k8s-cpu", lo.k8s_cpu);
  opt("--k8s-memory", lo.k8s_memory);
  opt("--k8s-shm", lo.k8s_shm);
  for (const auto& a : ft_args) cmd.push_back(a);
  json container{{"name", "controller"},
                 {"image", lo.k8s_image},
                 {"command", cmd},
                 {"env",
                  {{{"name", "MONARCH_POD_IP"},
                    {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}}}}};
  if (!lo.k8s_secret.empty()) container["envFrom"] = {{{"secretRef", {{"name", lo.k8s_secret}}}}};
  docs.push_back({{"apiVersion", "batch/v1"},
                  {"kind", "Job"},
                  {"metadata", meta},
                  {"spec",
                   {{"backoffLimit", 0},
                    {"template",
                     {{"metadata", {{"labels", meta["labels"]}}},
                      {"spec",
                       {{"serviceAccountName", ctl},
                        {"restartPolicy", "Never"},
                        {"containers", {container}}}}}}}}});
  for (size_t r = 0; r < replicas; ++r) {
    monarch::launch::KubernetesJob group(
        monarch::ft::example::kubernetes_group_options(lo, lo.k8s_name + "-g" + std::to_string(r)));
    for (auto& d : group.manifests()) docs.push_back(std::move(d));
  }
  return docs;
}

struct Hello : monarch::Actor {
  std::string where() const {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const char* rank = std::getenv("MONARCH_RANK");  // the pod's completion index
    return std::string(host) + " (pod index " + (rank ? rank : "?") + ", pid " +
           std::to_string(::getpid()) + ")";
  }
  MONARCH_ENDPOINTS(Hello, where)
};
}  // namespace

static int run(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv);  // in a worker: serves the proc, never returns

  monarch::launch::KubernetesOptions o;
  std::string listen, vendor = "nvidia";
  size_t procs_per_pod = 1;
  bool render = false;
  std::string job_kind = "hello", render_format = "yaml", ft_train = "ft_train";
  std::vector<std::string> ft_args;
  CLI::App app{"k8s_launch: a HostMesh on the pods of a Kubernetes Indexed Job"};
  app.add_option("--name", o.name, "Job and Service name")->required();
  app.add_option("--image", o.image, "container image with monarch and this program")->required();
  app.add_option("--namespace", o.ns, "namespace")->capture_default_str();
  app.add_option("--replicas", o.replicas, "pods (hosts)")
      ->check(monarch::cli::integer_in(
          1, static_cast<int64_t>(monarch::launch::kMaxKubernetesReplicas)))
      ->capture_default_str();
  app.add_option("--port", o.agent_port, "agent port in each pod")
      ->check(monarch::cli::integer_in(1, 65535))
      ->capture_default_str();
  app.add_option("--gpus", o.gpus_per_pod, "GPUs per pod")
      ->check(monarch::cli::integer_in(0, 1024))
      ->capture_default_str();
  app.add_option("--gpu-vendor", vendor, "nvidia or amd")->check(CLI::IsMember({"nvidia", "amd"}));
  app.add_option("--cpu", o.cpu, "cpu request per pod, e.g. 8");
  app.add_option("--memory", o.memory, "memory request per pod, e.g. 64Gi");
  app.add_option("--shm", o.shm_size, "size limit of /dev/shm, e.g. 16Gi");
  app.add_option("--secret", o.secret, "Secret with key MONARCH_SECRET, loaded into the pods' env");
  app.add_option("--kubectl-arg", o.kubectl_args,
                 "extra kubectl argument (repeatable), e.g. --context=c");
  app.add_flag("--jobset", o.jobset, "render a JobSet instead of a Job");
  app.add_option("--procs", procs_per_pod, "procs per pod")
      ->check(monarch::cli::integer_in(1, 1024))
      ->capture_default_str();
  app.add_option("--listen", listen, "client address the pods can reach, e.g. tcp://$MY_POD_IP:0");
  app.add_flag("--render", render, "print the manifests and exit");
  app.add_option("--render-format", render_format, "yaml or json (a v1 List)")
      ->check(CLI::IsMember({"yaml", "json"}))
      ->capture_default_str();
  app.add_option("--job", job_kind,
                 "hello (procs that say where they run) or ft_train (the fault-tolerant job; "
                 "--render only)")
      ->check(CLI::IsMember({"hello", "ft_train"}))
      ->capture_default_str();
  app.add_option("--ft-train", ft_train, "--job ft_train: ft_train's path in the image")
      ->capture_default_str();
  app.add_option("ft_args", ft_args, "--job ft_train: more ft_train arguments (after --)");
  if (int rc = monarch::cli::parse(app, argc, argv); rc >= 0) return rc;
  o.gpu_vendor =
      vendor == "amd" ? monarch::launch::GpuVendor::amd : monarch::launch::GpuVendor::nvidia;
  o.host.listen = listen;

  try {
    if (job_kind == "ft_train") {
      if (!render) {
        std::fprintf(stderr,
                     "k8s_launch: --job ft_train only renders (apply the output with kubectl "
                     "apply -f -; ft_train's controller pod starts the agents)\n");
        return 2;
      }
      monarch::ft::example::LauncherOptions lo;
      lo.launcher = "kubernetes";
      lo.k8s_name = o.name;
      lo.k8s_namespace = o.ns;
      lo.k8s_image = o.image;
      lo.k8s_secret = o.secret;
      lo.k8s_gpus = static_cast<int64_t>(o.gpus_per_pod);
      lo.k8s_cpu = o.cpu;
      lo.k8s_memory = o.memory;
      lo.k8s_shm = o.shm_size;
      auto docs = ft_train_manifests(lo, o.replicas, ft_train, ft_args);
      if (render_format == "json") {
        std::puts(json{{"apiVersion", "v1"}, {"kind", "List"}, {"items", docs}}.dump(2).c_str());
      } else {
        std::fputs(monarch::launch::to_yaml(docs).c_str(), stdout);
      }
      return 0;
    }
    monarch::launch::KubernetesJob job(o);
    if (render) {
      std::fputs(job.render(render_format == "json" ? monarch::launch::KubernetesJob::Format::json
                                                    : monarch::launch::KubernetesJob::Format::yaml)
                     .c_str(),
                 stdout);
      return 0;
    }
    job.on_failure([](const monarch::MeshFailure& f) {
      std::fprintf(stderr, "pod failure: %s\n", f.to_string().c_str());
      return true;
    });
    auto hosts = job.start().at(0);  // one group: {hosts: replicas}
    auto procs = hosts.spawn_procs({{"procs", procs_per_pod}});
    procs.on_failure([](const monarch::MeshFailure& f) {
      std::fprintf(stderr, "proc failure: %s\n", f.to_string().c_str());
      return true;
    });
    auto hello = procs.spawn<Hello>("hello");
    auto where = hello.call(&Hello::where).get(std::chrono::seconds(60));
    for (size_t r = 0; r < where.size(); ++r) std::printf("rank %zu: %s\n", r, where[r].c_str());
    procs.stop();
    job.stop();  // kubectl delete; throws (below) when it failed
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k8s_launch: %s\n", e.what());
    return 1;
  }
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
