// Procs on the pods of a Kubernetes Job (docs/launch-kubernetes.md).
//
//   k8s_launch --name demo --image IMG --replicas 2 --render        print the manifests (YAML)
//   k8s_launch --name demo --image IMG --replicas 2 --listen tcp://$MY_POD_IP:0
//       apply them, wait for the pods, attach, spawn --procs procs per pod, say hello from each,
//       stop, delete the Job.
//
// The workers are this executable (bootstrap() below), started by the agent in each pod: the
// image must hold it at the same path as the client's.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "monarch/launch/kubernetes.hpp"
#include "monarch/run_main.hpp"

namespace {
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
  CLI::App app{"k8s_launch: a HostMesh on the pods of a Kubernetes Indexed Job"};
  app.add_option("--name", o.name, "Job and Service name")->required();
  app.add_option("--image", o.image, "container image with monarch and this program")->required();
  app.add_option("--namespace", o.ns, "namespace")->capture_default_str();
  app.add_option("--replicas", o.replicas, "pods (hosts)")->capture_default_str();
  app.add_option("--port", o.agent_port, "agent port in each pod")->capture_default_str();
  app.add_option("--gpus", o.gpus_per_pod, "GPUs per pod")->capture_default_str();
  app.add_option("--gpu-vendor", vendor, "nvidia or amd")->check(CLI::IsMember({"nvidia", "amd"}));
  app.add_option("--cpu", o.cpu, "cpu request per pod, e.g. 8");
  app.add_option("--memory", o.memory, "memory request per pod, e.g. 64Gi");
  app.add_option("--shm", o.shm_size, "size limit of /dev/shm, e.g. 16Gi");
  app.add_option("--secret", o.secret, "Secret with key MONARCH_SECRET, loaded into the pods' env");
  app.add_option("--kubectl-arg", o.kubectl_args,
                 "extra kubectl argument (repeatable), e.g. --context=c");
  app.add_flag("--jobset", o.jobset, "render a JobSet instead of a Job");
  app.add_option("--procs", procs_per_pod, "procs per pod")->capture_default_str();
  app.add_option("--listen", listen, "client address the pods can reach, e.g. tcp://$MY_POD_IP:0");
  app.add_flag("--render", render, "print the manifests and exit");
  CLI11_PARSE(app, argc, argv);
  o.gpu_vendor =
      vendor == "amd" ? monarch::launch::GpuVendor::amd : monarch::launch::GpuVendor::nvidia;
  o.host.listen = listen;

  try {
    monarch::launch::KubernetesJob job(o);
    if (render) {
      std::fputs(job.render().c_str(), stdout);
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
