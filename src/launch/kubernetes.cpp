// KubernetesJob: manifests, kubectl, pod polling, attach, pod supervision.
#include "monarch/launch/kubernetes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "monarch/actor/errors.hpp"
#include "subprocess.hpp"

namespace monarch::launch {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// The label that selects our pods (Service selector, pod listing).
constexpr const char* kJobLabel = "monarch/job";
constexpr const char* kIndexKey = "batch.kubernetes.io/job-completion-index";

// Container states that will not get better by waiting: the launch fails at once.
const std::set<std::string> kFatalWaiting = {
    "ErrImagePull",         "ImagePullBackOff",           "InvalidImageName", "CrashLoopBackOff",
    "CreateContainerError", "CreateContainerConfigError", "RunContainerError"};

std::string ms(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

bool lower_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

// A DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit; a
// DNS-1035 label (`letter_first`) starts with a letter. (Hand-written: gcc 12's std::regex trips
// -Wmaybe-uninitialized under the sanitizer build.)
bool dns_label(const std::string& s, bool letter_first) {
  if (s.empty() || !lower_alnum(s.front()) || !lower_alnum(s.back())) return false;
  if (letter_first && !(s.front() >= 'a' && s.front() <= 'z')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return lower_alnum(c) || c == '-'; });
}

void validate(const KubernetesOptions& o) {
  if (o.name.empty() || o.name.size() > 52 || !dns_label(o.name, true)) {
    throw UsageError(
        "KubernetesJob: name '" + o.name +
        "' must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter) "
        "of at most 52 characters");
  }
  if (o.ns.empty() || o.ns.size() > 63 || !dns_label(o.ns, false)) {
    throw UsageError("KubernetesJob " + o.name + ": namespace '" + o.ns +
                     "' is not a DNS-1123 label");
  }
  if (o.image.empty()) throw UsageError("KubernetesJob " + o.name + ": image is empty");
  if (o.replicas == 0) throw UsageError("KubernetesJob " + o.name + ": replicas is 0");
  if (o.replicas > kMaxKubernetesReplicas) {
    throw UsageError("KubernetesJob " + o.name + ": replicas is " + std::to_string(o.replicas) +
                     " (an Indexed Job runs at most " + std::to_string(kMaxKubernetesReplicas) +
                     " pods)");
  }
  if (o.agent_port == 0) throw UsageError("KubernetesJob " + o.name + ": agent_port is 0");
  for (const auto& e : o.env) {
    auto eq = e.find('=');
    if (eq == 0 || eq == std::string::npos) {
      throw UsageError("KubernetesJob " + o.name + ": env entry '" + e + "' is not KEY=VALUE");
    }
  }
  if (o.poll_interval.count() <= 0 || o.ready_timeout.count() <= 0 ||
      o.kubectl_timeout.count() <= 0) {
    throw UsageError("KubernetesJob " + o.name +
                     ": poll_interval, ready_timeout and kubectl_timeout must be > 0");
  }
}

json pod_template(const KubernetesOptions& o) {
  const std::string port = std::to_string(o.agent_port);
  std::vector<std::string> command = o.command;
  if (command.empty())
    command = {"monarch", "agent", "--listen", "tcp://$(MONARCH_POD_IP):" + port};

  json env = json::array();
  // The agent listens on the pod IP: its workers listen on the agent's host and report that
  // address to the client, so 0.0.0.0 would not do.
  env.push_back(
      {{"name", "MONARCH_POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}});
  // Same source as the JOB_COMPLETION_INDEX the Job controller adds.
  env.push_back({{"name", "MONARCH_RANK"},
                 {"valueFrom",
                  {{"fieldRef",
                    {{"fieldPath", std::string("metadata.annotations['") + kIndexKey + "']"}}}}}});
  env.push_back({{"name", "MONARCH_WORLD_SIZE"}, {"value", std::to_string(o.replicas)}});
  for (const auto& e : o.env) {
    auto eq = e.find('=');
    env.push_back({{"name", e.substr(0, eq)}, {"value", e.substr(eq + 1)}});
  }

  json container = {
      {"name", "agent"},
      {"image", o.image},
      {"command", command},
      {"env", env},
      {"ports",
       json::array({{{"name", "agent"}, {"containerPort", o.agent_port}, {"protocol", "TCP"}}})},
      // Ready = the agent accepts connections.
      {"readinessProbe", {{"tcpSocket", {{"port", o.agent_port}}}, {"periodSeconds", 2}}},
      {"volumeMounts", json::array({{{"name", "dshm"}, {"mountPath", "/dev/shm"}}})},
  };
  if (!o.secret.empty())
    container["envFrom"] = json::array({{{"secretRef", {{"name", o.secret}}}}});
  json resources = json::object();
  if (!o.cpu.empty()) resources["requests"]["cpu"] = o.cpu;
  if (!o.memory.empty()) resources["requests"]["memory"] = o.memory;
  if (o.gpus_per_pod > 0) {
    const char* gpu = o.gpu_vendor == GpuVendor::amd ? "amd.com/gpu" : "nvidia.com/gpu";
    resources["limits"][gpu] = std::to_string(o.gpus_per_pod);
  }
  if (!resources.empty()) container["resources"] = resources;

  json dshm = {{"medium", "Memory"}};
  if (!o.shm_size.empty()) dshm["sizeLimit"] = o.shm_size;
  return {
      {"metadata", {{"labels", {{kJobLabel, o.name}}}}},
      {"spec",
       {
           {"restartPolicy", "Never"},
           {"subdomain", o.name},  // pods resolve as NAME-INDEX.NAME.NS.svc through the Service
           {"containers", json::array({container})},
           {"volumes", json::array({{{"name", "dshm"}, {"emptyDir", dshm}}})},
       }},
  };
}

json job_spec(const KubernetesOptions& o) {
  return {
      {"completionMode", "Indexed"},
      {"completions", o.replicas},
      {"parallelism", o.replicas},
      // A failed pod is a failed rank: no silent restart (a new agent would be a new incarnation).
      {"backoffLimit", 0},
      {"template", pod_template(o)},
  };
}

json labels(const KubernetesOptions& o) {
  return {{kJobLabel, o.name}, {"app.kubernetes.io/managed-by", "monarch"}};
}

// A key YAML can take unquoted: [A-Za-z_][A-Za-z0-9_./-]*; anything else is JSON-quoted.
std::string yaml_key(const std::string& k) {
  auto word = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  bool plain = !k.empty() && word(k.front()) && std::all_of(k.begin(), k.end(), [&](char c) {
    return word(c) || (c >= '0' && c <= '9') || c == '.' || c == '/' || c == '-';
  });
  return plain ? k : json(k).dump();
}

void emit_yaml(const json& v, size_t indent, std::string& out);

// A value after "key:" or "- ": scalars and empty containers inline, others on new lines.
void emit_value(const json& v, size_t indent, std::string& out) {
  if (v.is_object() && !v.empty()) {
    out += "\n";
    emit_yaml(v, indent, out);
  } else if (v.is_array() && !v.empty()) {
    out += "\n";
    emit_yaml(v, indent, out);
  } else if (v.is_object()) {
    out += " {}\n";
  } else if (v.is_array()) {
    out += " []\n";
  } else {
    out += " " + v.dump() + "\n";  // JSON scalars are YAML flow scalars ("..." escapes included)
  }
}

void emit_yaml(const json& v, size_t indent, std::string& out) {
  const std::string pad(indent, ' ');
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      out += pad + yaml_key(k) + ":";
      emit_value(x, indent + 2, out);
    }
    return;
  }
  for (const auto& x : v) {  // array
    if (x.is_object() && !x.empty()) {
      std::string item;
      emit_yaml(x, indent + 2, item);
      out += pad + "- " + item.substr(indent + 2);  // first key on the dash's line
    } else {
      out += pad + "-";
      emit_value(x, indent + 2, out);
    }
  }
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string r;
  for (size_t i = 0; i < v.size(); ++i) r += (i ? sep : "") + v[i];
  return r;
}

// kubectl's error summary: the last non-empty line of its stderr (earlier lines are klog noise
// such as "memcache.go:265] couldn't get current server API group list").
std::string last_line(const std::string& s) {
  auto t = s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// kubectl's output on one line: trailing newlines dropped, inner ones become "; ".
std::string one_line(const std::string& s) {
  auto t = s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  for (size_t p = t.find('\n'); p != std::string::npos; p = t.find('\n', p)) t.replace(p, 1, "; ");
  return t;
}

bool fatal(const PodInfo& p, const std::string& waiting) {
  return p.phase == "Failed" || p.phase == "Succeeded" || kFatalWaiting.count(waiting) > 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pods

std::string PodInfo::describe() const {
  std::string s = "pod " + name + " (index " + std::to_string(index) + ") " +
                  (phase.empty() ? "Unknown" : phase);
  if (deleting) s += ", being deleted";
  if (!detail.empty()) s += ": " + detail;
  return s;
}

namespace {
// Pods parsed together with their container's waiting reason (for fatal()).
struct ParsedPod {
  PodInfo info;
  std::string waiting;
};

std::vector<ParsedPod> parse_pods_full(const std::string& text) {
  json list;
  try {
    list = json::parse(text);
  } catch (const std::exception& e) {
    throw KubernetesError(std::string("pod list is not JSON: ") + e.what());
  }
  std::vector<ParsedPod> out;
  for (const auto& item : list.value("items", json::array())) {
    const json& meta = item.value("metadata", json::object());
    std::string idx;
    for (const char* where : {"annotations", "labels"}) {
      const json& m = meta.value(where, json::object());
      if (m.contains(kIndexKey) && m[kIndexKey].is_string()) {
        idx = m[kIndexKey].get<std::string>();
        break;
      }
    }
    if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) continue;
    ParsedPod p;
    p.info.index = std::stoul(idx);
    p.info.name = meta.value("name", "");
    p.info.deleting = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
    const json& st = item.value("status", json::object());
    p.info.phase = st.value("phase", "");
    p.info.ip = st.value("podIP", "");
    for (const auto& c : st.value("conditions", json::array())) {
      if (c.value("type", "") == "Ready") p.info.ready = c.value("status", "") == "True";
    }
    std::vector<std::string> detail;
    if (st.contains("reason"))
      detail.push_back(st.value("reason", "") + " (" + st.value("message", "") + ")");
    for (const auto& cs : st.value("containerStatuses", json::array())) {
      const json& state = cs.value("state", json::object());
      const std::string cname = "container " + cs.value("name", "?");
      if (state.contains("waiting")) {
        const json& w = state["waiting"];
        p.waiting = w.value("reason", "");
        std::string m = w.value("message", "");
        detail.push_back(cname + " waiting: " + p.waiting + (m.empty() ? "" : " (" + m + ")"));
      } else if (state.contains("terminated")) {
        const json& t = state["terminated"];
        std::string d = cname + " terminated: exit code " + std::to_string(t.value("exitCode", -1));
        if (t.contains("signal")) d += ", signal " + std::to_string(t.value("signal", 0));
        if (t.contains("reason")) d += " (" + t.value("reason", "") + ")";
        std::string m = t.value("message", "");
        if (!m.empty()) d += ": " + one_line(m);
        detail.push_back(d);
      }
    }
    p.info.detail = join(detail, "; ");
    out.push_back(std::move(p));
  }
  return out;
}
}  // namespace

std::vector<PodInfo> parse_pods(const std::string& pod_list_json) {
  std::vector<PodInfo> out;
  for (auto& p : parse_pods_full(pod_list_json)) out.push_back(std::move(p.info));
  return out;
}

// ---------------------------------------------------------------------------------------------
// YAML

std::string to_yaml(const std::vector<json>& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) out += "---\n";
    emit_yaml(docs[i], 0, out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// KubernetesJob

struct KubernetesJob::State {
  KubernetesOptions opts;
  std::mutex mu;  // everything below
  std::condition_variable cv;
  bool started = false;
  bool applied = false;
  bool stopping = false;
  bool deleted = false;
  std::optional<mesh::HostMesh> hosts;
  std::vector<PodInfo> pods;           // by index, as attached / last polled
  std::vector<std::string> pod_names;  // by index: the pods we attached to
  std::vector<bool> failed;            // by index, reported once
  FailureHandler handler;
  std::function<void(const ActorSupervisionEvent&)> fault_hook;
  std::thread watcher;

  std::vector<std::string> kubectl(std::vector<std::string> args) const {
    std::vector<std::string> argv{opts.kubectl};
    argv.insert(argv.end(), opts.kubectl_args.begin(), opts.kubectl_args.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  detail::CommandResult run(const std::vector<std::string>& args,
                            const std::string& input = {}) const {
    return detail::run_command(kubectl(args), {.input = input, .timeout = opts.kubectl_timeout});
  }
  std::string label_selector() const { return std::string(kJobLabel) + "=" + opts.name; }
  std::vector<ParsedPod> list_pods(std::string* err) const {
    auto r = run({"get", "pods", "-n", opts.ns, "-l", label_selector(), "-o", "json"});
    if (r.status != 0) {
      *err = "kubectl get pods exited with " + std::to_string(r.status) + ": " + last_line(r.err);
      return {};
    }
    return parse_pods_full(r.out);
  }

  void watch();
  void report(size_t index, const std::string& cause);
};

void KubernetesJob::State::report(size_t index, const std::string& cause) {
  MeshFailure f{opts.name, {index}, cause};
  FailureHandler h;
  std::function<void(const ActorSupervisionEvent&)> hook;
  std::string client;
  {
    std::lock_guard lock(mu);
    h = handler;
    hook = fault_hook;
    if (hosts) client = hosts->client().name();
  }
  spdlog::warn("KubernetesJob {}: {}", opts.name, f.to_string());
  if (h && h(f)) return;
  ActorSupervisionEvent ev{ActorId{client, "k8s." + opts.name, 0}, "KubernetesJob", f.to_string(),
                           nullptr};
  if (hook) return hook(ev);
  std::fprintf(stderr, "monarch: unhandled failure; exiting (fail fast)\n%s\n",
               ev.to_string().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

void KubernetesJob::State::watch() {
  std::string last_err;
  while (true) {
    {
      std::unique_lock lock(mu);
      if (cv.wait_for(lock, opts.poll_interval, [&] { return stopping; })) return;
    }
    std::string err;
    std::vector<ParsedPod> listed;
    try {
      listed = list_pods(&err);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (!err.empty()) {
      if (err != last_err) spdlog::warn("KubernetesJob {}: cannot list pods: {}", opts.name, err);
      last_err = err;
      continue;
    }
    last_err.clear();
    std::vector<std::pair<size_t, std::string>> failures;
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      for (size_t r = 0; r < pod_names.size(); ++r) {
        if (failed[r]) continue;
        auto it = std::find_if(listed.begin(), listed.end(),
                               [&](const ParsedPod& p) { return p.info.name == pod_names[r]; });
        if (it == listed.end()) {
          failures.emplace_back(
              r, "pod " + pod_names[r] + " (index " + std::to_string(r) + ") deleted");
          continue;
        }
        pods[r] = it->info;
        if (it->info.phase == "Failed" || it->info.phase == "Succeeded" ||
            it->info.phase == "Unknown" || it->info.deleting) {
          failures.emplace_back(r, it->info.describe());
        }
      }
      for (auto& [r, cause] : failures) failed[r] = true;
    }
    for (auto& [r, cause] : failures) report(r, cause);
  }
}

KubernetesJob::KubernetesJob(KubernetesOptions options) : state_(std::make_shared<State>()) {
  validate(options);
  state_->opts = std::move(options);
}

KubernetesJob::~KubernetesJob() {
  try {
    stop();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

const KubernetesOptions& KubernetesJob::options() const {
  return state_->opts;
}

std::vector<json> KubernetesJob::manifests() const {
  const auto& o = state_->opts;
  json service = {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", {{"name", o.name}, {"namespace", o.ns}, {"labels", labels(o)}}},
      {"spec",
       {
           {"clusterIP", "None"},
           {"publishNotReadyAddresses", true},  // DNS names exist before the agents are Ready
           {"selector", {{kJobLabel, o.name}}},
           {"ports", json::array({{{"name", "agent"},
                                   {"port", o.agent_port},
                                   {"targetPort", o.agent_port},
                                   {"protocol", "TCP"}}})},
       }},
  };
  if (!o.jobset) {
    json job = {
        {"apiVersion", "batch/v1"},
        {"kind", "Job"},
        {"metadata", {{"name", o.name}, {"namespace", o.ns}, {"labels", labels(o)}}},
        {"spec", job_spec(o)},
    };
    return {service, job};
  }
  json jobset = {
      {"apiVersion", "jobset.x-k8s.io/v1alpha2"},
      {"kind", "JobSet"},
      {"metadata", {{"name", o.name}, {"namespace", o.ns}, {"labels", labels(o)}}},
      {"spec",
       {
           // Our Service already gives the pods DNS names; JobSet's own one would duplicate it.
           {"network", {{"enableDNSHostnames", false}}},
           {"failurePolicy", {{"maxRestarts", 0}}},
           {"replicatedJobs",
            json::array(
                {{{"name", "hosts"}, {"replicas", 1}, {"template", {{"spec", job_spec(o)}}}}})},
       }},
  };
  return {service, jobset};
}

std::string KubernetesJob::render(Format format) const {
  auto docs = manifests();
  if (format == Format::yaml) return to_yaml(docs);
  json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", docs}};
  return list.dump(2) + "\n";
}

std::vector<mesh::HostMesh> KubernetesJob::start() {
  auto& s = *state_;
  const auto& o = s.opts;
  const mesh::HostOptions& host = o.host;
  if (!host.listen.starts_with("tcp://")) {
    throw UsageError("KubernetesJob " + o.name +
                     ": start needs KubernetesOptions::host.listen = a tcp address the pods " +
                     "can reach (e.g. tcp://<client pod IP>:0), not '" + host.listen + "'");
  }
  {
    std::lock_guard lock(s.mu);
    if (s.started) throw UsageError("KubernetesJob " + o.name + ": start called twice");
    s.started = true;
  }
  auto fail = [&](const std::string& why) {
    try {
      stop();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
    }
    throw KubernetesError("KubernetesJob " + o.name + ": " + why);
  };

  std::vector<std::string> apply{"apply", "-f", "-"};
  if (!o.validate) apply.push_back("--validate=false");
  detail::CommandResult applied;
  try {
    applied = s.run(apply, render(Format::json));
  } catch (const Error& e) {  // kubectl hung or could not start; it may have created objects
    {
      std::lock_guard lock(s.mu);
      s.applied = true;
    }
    fail(std::string("kubectl apply: ") + e.what());
  }
  // A workload of that name existed before ("job.batch/NAME unchanged" or "configured"): its
  // pods are not ours to attach to, and not ours to delete.
  const std::string kind = o.jobset ? "jobset" : "job";
  std::istringstream lines(applied.out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with(kind + ".") ||
        !(line.ends_with(" unchanged") || line.ends_with(" configured")))
      continue;
    throw KubernetesError("KubernetesJob " + o.name + ": a " + (o.jobset ? "JobSet" : "Job") +
                          " named " + o.name + " already exists in namespace " + o.ns +
                          " (kubectl apply: " + line + "); delete it (kubectl delete -n " + o.ns +
                          " " + kind + "/" + o.name + ") or choose another name");
  }
  {
    std::lock_guard lock(s.mu);
    s.applied = true;  // even a failed apply may have created some objects
  }
  if (applied.status != 0) {
    fail("kubectl apply exited with " + std::to_string(applied.status) + ": " +
         last_line(applied.err));
  }
  spdlog::info("KubernetesJob {}: applied ({}); waiting for {} pod(s)", o.name,
               one_line(applied.out), o.replicas);

  const auto deadline = Clock::now() + o.ready_timeout;
  std::vector<PodInfo> ready;
  std::string last_err;
  std::vector<ParsedPod> listed;
  while (true) {
    std::string err;
    try {
      listed = s.list_pods(&err);
    } catch (const Error& e) {  // kubectl past kubectl_timeout, or bad JSON: try again
      err = e.what();
    }
    if (!err.empty()) last_err = err;
    std::vector<std::optional<PodInfo>> by_index(o.replicas);
    for (const auto& p : listed) {
      if (p.info.index >= o.replicas) continue;
      if (fatal(p.info, p.waiting)) fail(p.info.describe());
      if (p.info.deleting) continue;  // a replacement may follow
      if (!by_index[p.info.index] || (p.info.ready && !by_index[p.info.index]->ready))
        by_index[p.info.index] = p.info;
    }
    bool all = std::all_of(by_index.begin(), by_index.end(), [](const std::optional<PodInfo>& p) {
      return p && p->ready && p->phase == "Running" && !p->ip.empty();
    });
    if (all) {
      for (auto& p : by_index) ready.push_back(*p);
      break;
    }
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < o.replicas; ++i) {
        if (!by_index[i]) {
          missing.push_back("index " + std::to_string(i) + ": no pod");
        } else if (!by_index[i]->ready || by_index[i]->phase != "Running" ||
                   by_index[i]->ip.empty()) {
          missing.push_back(by_index[i]->describe() + (by_index[i]->ready ? "" : ", not Ready"));
        }
      }
      fail("pods not Ready within " + ms(o.ready_timeout) + ": " + join(missing, "; ") +
           (last_err.empty() ? "" : " (last error: " + last_err + ")"));
    }
    bool stopped = false;
    {
      std::unique_lock lock(s.mu);
      stopped = s.cv.wait_for(lock, o.poll_interval, [&] { return s.stopping; });
    }
    if (stopped) fail("shut down while waiting for the pods");
  }

  std::vector<std::string> agents;
  for (const auto& p : ready) {
    std::string h = p.ip.find(':') != std::string::npos ? "[" + p.ip + "]" : p.ip;  // IPv6
    agents.push_back("tcp://" + h + ":" + std::to_string(o.agent_port));
  }
  spdlog::info("KubernetesJob {}: pods Ready; attaching to {}", o.name, join(agents, ", "));
  std::optional<mesh::HostMesh> hosts;
  try {
    hosts.emplace(mesh::attach_to_workers(agents, host));
  } catch (const std::exception& e) {
    std::vector<std::string> names;
    for (const auto& p : ready) names.push_back(p.name + "=" + p.ip);
    fail(std::string("attach to pods (") + join(names, ", ") + ") failed: " + e.what());
  }
  {
    std::lock_guard lock(s.mu);
    s.hosts = hosts;
    s.pods = ready;
    for (const auto& p : ready) s.pod_names.push_back(p.name);
    s.failed.assign(ready.size(), false);
    s.watcher = std::thread([st = state_.get()] { st->watch(); });
  }
  return {*hosts};
}

mesh::HostMesh KubernetesJob::hosts() const {
  std::lock_guard lock(state_->mu);
  if (!state_->hosts)
    throw UsageError("KubernetesJob " + state_->opts.name + ": hosts() before start()");
  return *state_->hosts;
}

std::vector<PodInfo> KubernetesJob::pods() const {
  std::lock_guard lock(state_->mu);
  return state_->pods;
}

void KubernetesJob::on_failure(FailureHandler handler) {
  std::lock_guard lock(state_->mu);
  state_->handler = std::move(handler);
}

void KubernetesJob::set_fault_hook(std::function<void(const ActorSupervisionEvent&)> hook) {
  std::lock_guard lock(state_->mu);
  state_->fault_hook = std::move(hook);
}

void KubernetesJob::stop() {
  auto& s = *state_;
  std::thread watcher;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
    watcher = std::move(s.watcher);
  }
  s.cv.notify_all();
  if (watcher.joinable()) watcher.join();
  {
    std::lock_guard lock(s.mu);
    if (!s.applied || s.deleted) return;
    s.deleted = true;
  }
  const auto& o = s.opts;
  std::string workload = o.jobset ? "jobsets.jobset.x-k8s.io/" + o.name : "job/" + o.name;
  detail::CommandResult r;
  try {
    r = s.run({"delete", "-n", o.ns, "service/" + o.name, workload, "--ignore-not-found",
               "--wait=false"});
  } catch (const std::exception& e) {
    throw KubernetesError("KubernetesJob " + o.name + ": kubectl delete: " + e.what());
  }
  if (r.status != 0) {
    throw KubernetesError("KubernetesJob " + o.name + ": kubectl delete exited with " +
                          std::to_string(r.status) + ": " + last_line(r.err));
  }
}

}  // namespace monarch::launch
