// ft_train's launchers (launcher.hpp): this host, or the agents of SLURM jobs.
#include "launcher.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "cli_checks.hpp"
#include "monarch/error.hpp"
#include "monarch/launch/slurm.hpp"

namespace monarch::ft::example {

namespace fs = std::filesystem;
namespace launch = monarch::launch;

namespace {

std::string host_name() {
  char b[256] = {};
  if (::gethostname(b, sizeof b - 1) != 0 || b[0] == '\0') return "localhost";
  return b;
}

// 32 random bytes as hex: the channel secret of this job's agents, workers and client procs.
std::string random_secret() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char raw[32] = {};
  in.read(reinterpret_cast<char*>(raw), sizeof raw);
  if (!in) throw monarch::Error("ft_train: cannot read /dev/urandom for the job's channel secret");
  std::string s;
  char hex[3];
  for (unsigned char c : raw) {
    std::snprintf(hex, sizeof hex, "%02x", c);
    s += hex;
  }
  return s;
}

bool env_has_secret() {
  for (const char* k : {"MONARCH_SECRET", "MONARCH_SECRET_FILE"}) {
    const char* v = std::getenv(k);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

// `monarch` next to this executable (build/bin/ft_train -> build/bin/monarch), if there.
std::string sibling_monarch() {
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  auto cli = self.parent_path() / "monarch";
  return fs::exists(cli, ec) ? cli.string() : "";
}

// SIGTERM / SIGINT while SLURM jobs run (docs/ft.md): the jobs would outlive ft_train until their
// --slurm-time. The handler only writes the signal to a pipe; a thread of ours runs scancel on
// the jobs' ids, then ft_train dies of the signal as it would have.
int g_signal_pipe[2] = {-1, -1};
std::mutex g_jobs_mu;
std::vector<std::string> g_jobs;  // SLURM job ids started and not yet stopped

void on_terminate(int sig) {
  unsigned char c = static_cast<unsigned char>(sig);
  ssize_t n = ::write(g_signal_pipe[1], &c, 1);
  (void)n;
}

void cancel_on_signal(const std::string& job_id) {
  std::lock_guard lock(g_jobs_mu);
  if (!job_id.empty()) g_jobs.push_back(job_id);
}

void cancelled(const std::string& job_id) {
  std::lock_guard lock(g_jobs_mu);
  std::erase(g_jobs, job_id);
}

// Once per process: installs the handlers and starts the thread that cancels on a signal. A job
// still being submitted when the signal comes (sbatch has not answered) is not cancelled.
void watch_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe(g_signal_pipe) != 0)
      throw monarch::Error("ft_train: pipe() for the SIGTERM handler failed");
    std::thread([] {
      unsigned char c = 0;
      ssize_t n = 0;
      while ((n = ::read(g_signal_pipe[0], &c, 1)) != 1) {
        if (n < 0 && errno != EINTR) return;  // no pipe: the default dispositions are gone too
      }
      std::vector<std::string> ids;
      {
        std::lock_guard lock(g_jobs_mu);
        ids = g_jobs;
      }
      std::string cmd = "timeout 30 scancel";  // a dead slurmctld must not keep us alive
      for (const auto& id : ids) cmd += " " + id;
      std::fprintf(stderr, "ft_train: signal %d: %s\n", c,
                   ids.empty() ? "no SLURM job to cancel" : cmd.c_str());
      if (!ids.empty() && std::system(cmd.c_str()) != 0)
        std::fprintf(stderr, "ft_train: '%s' failed; the jobs end at their --slurm-time\n",
                     cmd.c_str());
      std::signal(c, SIG_DFL);
      ::raise(c);
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = on_terminate;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
  });
}

}  // namespace

void add_launcher_flags(CLI::App& app, LauncherOptions& o) {
  app.add_option("--launcher", o.launcher,
                 "where the replica groups run: local, slurm or kubernetes")
      ->check(CLI::IsMember({"local", "slurm", "kubernetes"}))
      ->capture_default_str();
  const char* sl = "SLURM (--launcher slurm)";
  app.add_option("--slurm-nodes", o.nodes, "nodes (default: one per replica group)")
      ->check(monarch::cli::integer_in(1, 100000))
      ->group(sl);
  app.add_option("--slurm-tasks-per-node", o.tasks_per_node,
                 "agents (hosts) per node; group r runs on host r % (nodes x tasks)")
      ->check(monarch::cli::integer_in(1, 1024))
      ->group(sl)
      ->capture_default_str();
  app.add_option("--slurm-partition", o.partition, "partition (default: the cluster's)")->group(sl);
  app.add_option("--slurm-time", o.time_limit, "time limit, e.g. 30 or 01:00:00")->group(sl);
  app.add_option("--slurm-account", o.account, "account to charge")->group(sl);
  app.add_option("--slurm-cpus-per-task", o.cpus_per_task, "CPUs per agent")
      ->check(monarch::cli::integer_in(1, 100000))
      ->group(sl);
  app.add_option("--slurm-gpus-per-node", o.gpus_per_node, "GPUs per node")
      ->check(monarch::cli::integer_in(0, 1024))
      ->group(sl);
  app.add_option("--slurm-sbatch", o.extra_sbatch, "extra sbatch option (repeatable)")->group(sl);
  app.add_option("--slurm-job-name", o.job_name, "job name")->group(sl)->capture_default_str();
  app.add_option("--slurm-shared-dir", o.shared_dir,
                 "directory shared with the nodes (default $MONARCH_SLURM_SHARED_DIR, else "
                 "./.monarch-slurm)")
      ->group(sl);
  app.add_option("--slurm-start-timeout", o.start_timeout_s,
                 "seconds from sbatch until every agent listens")
      ->check(monarch::cli::integer_in(1, 10'000'000))
      ->group(sl)
      ->capture_default_str();
  app.add_option("--agent-program", o.agent_program,
                 "monarch CLI on the nodes (default: $MONARCH_AGENT_PROGRAM, else the one next "
                 "to ft_train)")
      ->group(sl);
  const char* kg = "Kubernetes (--launcher kubernetes)";
  app.add_option("--k8s-name", o.k8s_name, "agent Job names: NAME-g<group>")
      ->group(kg)
      ->capture_default_str();
  app.add_option("--k8s-namespace", o.k8s_namespace, "namespace")->group(kg)->capture_default_str();
  app.add_option("--k8s-image", o.k8s_image, "image holding monarch and ft_train")->group(kg);
  app.add_option("--k8s-secret", o.k8s_secret, "Secret with key MONARCH_SECRET")->group(kg);
  app.add_option("--k8s-gpus", o.k8s_gpus, "GPUs per pod")
      ->check(monarch::cli::integer_in(0, 1024))
      ->group(kg);
  app.add_option("--k8s-cpu", o.k8s_cpu, "cpu request per pod")->group(kg);
  app.add_option("--k8s-memory", o.k8s_memory, "memory request per pod")->group(kg);
  app.add_option("--k8s-shm", o.k8s_shm, "size of /dev/shm per pod")->group(kg);
  app.add_option("--client-listen", o.listen,
                 "address the nodes reach this process at (default tcp://<hostname>:0)")
      ->group(sl);
}

std::string worker_gloo_host() {
  const char* l = std::getenv("MONARCH_WORKER_LISTEN");
  std::string s = l != nullptr ? l : "";
  if (s.rfind("tcp://", 0) != 0) return "127.0.0.1";
  std::string h = s.substr(6);
  h = h.substr(0, h.find('/'));
  // "H", "H:PORT", "[V6]" or "[V6]:PORT"
  if (!h.empty() && h.front() == '[') {
    h = h.substr(1, h.find(']') == std::string::npos ? std::string::npos : h.find(']') - 1);
  } else if (auto colon = h.rfind(':'); colon != std::string::npos) {
    h = h.substr(0, colon);
  }
  if (h.empty() || h == "0.0.0.0") return "127.0.0.1";
  // gloo binds the first address a name resolves to; "localhost" may give ::1 first, which it
  // then fails to bind ("Cannot resolve localhost:0"). Hand it this host's IPv4 address.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return h;
  char ip[INET_ADDRSTRLEN] = {};
  const auto* sin = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  bool ok = ::inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip) != nullptr;
  ::freeaddrinfo(res);
  return ok ? std::string(ip) : h;
}

launch::KubernetesOptions kubernetes_group_options(const LauncherOptions& o,
                                                   const std::string& name) {
  if (o.k8s_image.empty()) throw UsageError("--k8s-image: required with --launcher kubernetes");
  launch::KubernetesOptions k;
  k.name = name;
  k.ns = o.k8s_namespace;
  k.image = o.k8s_image;
  k.replicas = 1;
  k.gpus_per_pod = static_cast<size_t>(o.k8s_gpus);
  k.cpu = o.k8s_cpu;
  k.memory = o.k8s_memory;
  k.shm_size = o.k8s_shm;
  k.secret = o.k8s_secret;
  k.env = {"MONARCH_FT_GROUP=" + name};
  return k;
}

struct Launcher::Impl {
  LauncherOptions opt;
  mutable std::mutex mu;
  bool started = false;
  std::vector<mesh::HostMesh> hosts;        // start_hosts' answer
  std::map<int64_t, mesh::HostMesh> fresh;  // group -> the host that replaced its own
  std::map<int64_t, std::string> lost;      // group -> why its current host is lost
  std::unique_ptr<launch::SlurmJob> main_job;
  std::vector<std::unique_ptr<launch::KubernetesJob>> k8s_jobs;  // one per group, then fresh ones
  std::vector<std::unique_ptr<launch::SlurmJob>> fresh_jobs;
  mesh::HostOptions host_options;  // every client Proc this launcher makes (one secret)

  launch::SlurmOptions slurm_options(const std::string& name, size_t nodes, size_t tasks) const {
    launch::SlurmOptions o;
    o.job_name = name;
    o.groups[0].nodes = nodes;
    o.groups[0].tasks_per_node = tasks;
    o.groups[0].cpus_per_task = static_cast<size_t>(opt.cpus_per_task);
    o.groups[0].gpus_per_node = static_cast<size_t>(opt.gpus_per_node);
    o.groups[0].partition = opt.partition;
    o.time_limit = opt.time_limit;
    if (!opt.account.empty()) o.extra_sbatch.push_back("--account=" + opt.account);
    for (const auto& e : opt.extra_sbatch) o.extra_sbatch.push_back(e);
    o.agent_program = opt.agent_program;
    if (o.agent_program.empty() && std::getenv("MONARCH_AGENT_PROGRAM") == nullptr)
      o.agent_program = sibling_monarch();
    o.shared_dir = opt.shared_dir;
    o.host = host_options;
    o.start_timeout = std::chrono::seconds(opt.start_timeout_s);
    return o;
  }

  // Applies group `group`'s agent Job named `name` and returns its one host.
  mesh::HostMesh start_k8s(int64_t group, const std::string& name) {
    auto ko = kubernetes_group_options(opt, name);
    ko.host = host_options;
    auto job = std::make_unique<launch::KubernetesJob>(std::move(ko));
    job->on_failure([group](const MeshFailure& f) {
      // The pod is gone: the group's procs fail with it and the controller respawns the group;
      // spawning there fails and host_lost brings a fresh Job. Handled: no fail-fast exit.
      std::fprintf(stderr, "ft_train: group %lld: %s\n", static_cast<long long>(group),
                   f.to_string().c_str());
      return true;
    });
    auto meshes = job->start();
    k8s_jobs.push_back(std::move(job));
    return meshes.at(0);
  }

  // Submits a job and returns its agents as single-host meshes (attached with host_options).
  std::vector<mesh::HostMesh> start_job(std::unique_ptr<launch::SlurmJob>& slot,
                                        launch::SlurmOptions o) {
    auto job = std::make_unique<launch::SlurmJob>(std::move(o));
    job->on_failure([](const MeshFailure& f) {
      // The whole job ended (scancel, time limit, node failure): its hosts are gone. Their groups
      // fail to spawn there next and get fresh hosts (host_lost); nothing to do here but say it.
      std::fprintf(stderr, "ft_train: %s\n", f.to_string().c_str());
      return true;
    });
    auto meshes = job->start();
    std::vector<mesh::HostMesh> out;
    const auto& agents = job->agents(0);
    if (agents.size() == 1) {
      out.push_back(meshes.at(0));
    } else {
      for (const auto& a : agents) out.push_back(mesh::attach_to_workers({a}, host_options));
    }
    slot = std::move(job);
    return out;
  }
};

Launcher::Launcher(LauncherOptions options) : impl_(std::make_unique<Impl>()) {
  auto& o = impl_->opt;
  o = std::move(options);
  if (o.launcher != "local" && o.launcher != "slurm" && o.launcher != "kubernetes")
    throw UsageError("--launcher: '" + o.launcher + "' is not local, slurm or kubernetes");
  if (o.launcher == "kubernetes") (void)kubernetes_group_options(o, o.k8s_name + "-g0");
  if (o.nodes < 0) throw UsageError("--slurm-nodes: must be >= 0 (0: one per replica group)");
  if (o.tasks_per_node < 1) throw UsageError("--slurm-tasks-per-node: must be >= 1");
  if (o.cpus_per_task < 0) throw UsageError("--slurm-cpus-per-task: must be >= 0");
  if (o.gpus_per_node < 0) throw UsageError("--slurm-gpus-per-node: must be >= 0");
  if (o.start_timeout_s < 1) throw UsageError("--slurm-start-timeout: must be >= 1 s");
  if (!o.listen.empty() && o.listen.rfind("tcp://", 0) != 0)
    throw UsageError("--client-listen: '" + o.listen + "' is not a tcp:// address");
}

Launcher::~Launcher() {
  try {
    stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ft_train: stopping the launcher: %s\n", e.what());
  }
}

std::vector<mesh::HostMesh> Launcher::start_hosts(int64_t replicas) {
  auto& im = *impl_;
  std::lock_guard lock(im.mu);
  if (im.started) throw UsageError("Launcher::start_hosts: called twice");
  if (replicas < 1) throw UsageError("Launcher::start_hosts: replicas must be >= 1");
  im.started = true;
  if (im.opt.launcher == "local") {
    im.hosts = {mesh::this_host()};
    return im.hosts;
  }
  im.host_options.listen = im.opt.listen.empty() ? "tcp://" + host_name() + ":0" : im.opt.listen;
  // Kubernetes pods get the secret from --k8s-secret (envFrom), as this pod does.
  if (im.opt.launcher == "slurm" && !env_has_secret())
    im.host_options.channel.secret = random_secret();
  if (im.opt.launcher == "kubernetes") {
    for (int64_t r = 0; r < replicas; ++r) {
      im.hosts.push_back(im.start_k8s(r, im.opt.k8s_name + "-g" + std::to_string(r)));
    }
    return im.hosts;
  }
  auto nodes = static_cast<size_t>(im.opt.nodes > 0 ? im.opt.nodes : replicas);
  watch_signals();
  im.hosts = im.start_job(
      im.main_job,
      im.slurm_options(im.opt.job_name, nodes, static_cast<size_t>(im.opt.tasks_per_node)));
  cancel_on_signal(im.main_job->job_id());
  std::printf("ft_train: SLURM job %s: %zu host(s), group r on host r %% %zu\n",
              im.main_job->job_id().c_str(), im.hosts.size(), im.hosts.size());
  return im.hosts;
}

const mesh::HostMesh& Launcher::host_for(int64_t group) {
  auto& im = *impl_;
  std::lock_guard lock(im.mu);
  if (!im.started) throw UsageError("Launcher::host_for: start_hosts was not called");
  if (auto l = im.lost.find(group); l != im.lost.end()) {
    std::string why = l->second;
    std::unique_ptr<launch::SlurmJob> job;
    std::string name = im.opt.job_name + "-g" + std::to_string(group) + "-" +
                       std::to_string(im.fresh_jobs.size() + 1);
    std::fprintf(stderr,
                 "ft_train: group %lld lost its host (%s): starting a fresh one (SLURM job "
                 "'%s')\n",
                 static_cast<long long>(group), why.c_str(), name.c_str());
    std::vector<mesh::HostMesh> meshes;
    std::exception_ptr failed;
    try {
      // On a thread of its own: host_for runs in an actor (the controller), and a SlurmJob's
      // start (attach: a new client Proc looking up the agent) must not run in actor context.
      std::thread([&] {
        try {
          if (im.opt.launcher == "kubernetes") {
            meshes = {im.start_k8s(group, im.opt.k8s_name + "-g" + std::to_string(group) + "-" +
                                              std::to_string(im.k8s_jobs.size() + 1))};
          } else {
            meshes = im.start_job(job, im.slurm_options(name, 1, 1));
            cancel_on_signal(job->job_id());
          }
        } catch (...) {
          failed = std::current_exception();
        }
      }).join();
      if (failed) std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ft_train: group %lld: no fresh host: %s\n",
                   static_cast<long long>(group), e.what());
      throw;
    }
    if (job) im.fresh_jobs.push_back(std::move(job));
    im.fresh.insert_or_assign(group, meshes.at(0));
    im.lost.erase(l);
  }
  if (auto f = im.fresh.find(group); f != im.fresh.end()) return f->second;
  return im.hosts.at(static_cast<size_t>(group) % im.hosts.size());
}

bool Launcher::host_lost(int64_t group, const std::string& why) {
  auto& im = *impl_;
  std::lock_guard lock(im.mu);
  if (im.opt.launcher == "local") return false;
  im.lost.insert_or_assign(group, why);
  return true;
}

std::string Launcher::advertise_host() const {
  auto& im = *impl_;
  if (im.opt.launcher == "local") return "127.0.0.1";
  if (!im.opt.listen.empty()) {
    std::string rest = im.opt.listen.substr(6);  // after tcp://
    std::string h = rest.substr(0, rest.rfind(':'));
    if (!h.empty() && h != "0.0.0.0" && h != "[::]") return h;
  }
  return host_name();
}

int64_t Launcher::fresh_hosts() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<int64_t>(impl_->fresh.size());
}

std::string Launcher::job_id() const {
  std::lock_guard lock(impl_->mu);
  return impl_->main_job ? impl_->main_job->job_id() : "";
}

void Launcher::stop() {
  auto& im = *impl_;
  std::lock_guard lock(im.mu);
  im.fresh.clear();
  im.hosts.clear();
  std::string errors;
  auto end = [&](std::unique_ptr<launch::SlurmJob>& job) {
    if (!job) return;
    try {
      job->stop();
      cancelled(job->job_id());
      job.reset();
    } catch (const std::exception& e) {
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
    }
  };
  for (auto& j : im.fresh_jobs) end(j);
  for (auto& j : im.k8s_jobs) {
    try {
      if (j) j->stop();
      j.reset();
    } catch (const std::exception& e) {
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
    }
  }
  std::erase(im.k8s_jobs, nullptr);
  std::erase(im.fresh_jobs, nullptr);
  end(im.main_job);
  if (!errors.empty()) throw monarch::Error("ft_train: stopping the launcher's jobs: " + errors);
}

}  // namespace monarch::ft::example
