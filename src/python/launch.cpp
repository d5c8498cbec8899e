// monarch._native: the launchers (monarch::launch::SlurmJob, KubernetesJob) for
// python/monarch/job.py. Internal: the public API, argument checks and docstrings are job.py's.
// Options arrive as plain values already checked there; what only the C++ side checks
// (SlurmOptions, KubernetesOptions) raises UsageError naming the field.
//
// Threads and the GIL (runtime.hpp): start() and stop() release the GIL (they wait on the
// scheduler, and the job's monitor thread may need the GIL to run the failure handler meanwhile).
// The failure handler runs on that monitor thread, with the GIL taken there. The job is destroyed
// with the GIL released (its destructor stops the job and joins the monitor thread).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "monarch/launch/kubernetes.hpp"
#include "monarch/launch/slurm.hpp"
#include "runtime.hpp"

namespace monarch::python {

namespace {

using Ms = std::chrono::milliseconds;

Ms to_ms(double seconds, const char* what) {
  if (!(seconds > 0)) throw UsageError(std::string(what) + " must be > 0 seconds");
  return Ms(static_cast<long long>(seconds * 1000.0 + 0.5));
}

// A Python callable kept by C++ code that may outlive the interpreter: released with the GIL,
// or leaked once Python is finalizing.
std::shared_ptr<py::object> keep(py::object fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    if (!py_alive()) return;  // leaked with the interpreter
    Gil gil;
    delete p;
  });
}

// A launch::Job owned by Python. handler: callable(mesh, ranks, cause, text) -> bool, or None.
struct JobBox {
  std::unique_ptr<launch::Job> job;
  launch::SlurmJob* slurm = nullptr;     // set for a SLURM job
  launch::KubernetesJob* k8s = nullptr;  // set for a Kubernetes job

  JobBox() = default;
  JobBox(const JobBox&) = delete;
  JobBox& operator=(const JobBox&) = delete;
  ~JobBox() {
    // ~Job stops the job and joins its monitor thread, which may wait for the GIL.
    if (py_alive() && PyGILState_Check() != 0) {
      NoGil nogil;
      job.reset();
    } else {
      job.reset();
    }
  }

  std::vector<mesh::HostMesh> start() {
    auto& j = get();
    NoGil nogil;
    auto hosts = j.start();
    // Meshes decoded and ports opened in this client must be reachable from the job's hosts
    // (and carry its secret): this_host()'s unix-socket client Proc is neither.
    prefer_client_of(hosts.at(0));
    return hosts;
  }
  launch::Job& get() const {
    if (!job) throw UsageError("this job was stopped and closed");
    return *job;
  }
  void stop() {
    auto& j = get();
    NoGil nogil;
    j.stop();
  }
  // Destroys the job (after a stop(): its work dir goes unless kept). Idempotent.
  void close() {
    NoGil nogil;
    job.reset();
    slurm = nullptr;
    k8s = nullptr;
  }
  void on_failure(py::object fn) {
    auto& j = get();
    if (fn.is_none()) {
      NoGil nogil;
      j.on_failure(nullptr);
      return;
    }
    auto cb = keep(std::move(fn));
    NoGil nogil;
    j.on_failure([cb](const MeshFailure& f) -> bool {
      if (!py_alive()) return true;  // the client is exiting
      Gil gil;
      try {
        return (*cb)(f.mesh, f.ranks, f.cause, f.to_string()).cast<bool>();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("monarch: job failure handler");
        return false;
      }
    });
  }
};

// fn(report: str) receives what nobody handled on `hook`'s owner (a runtime thread).
template <class SetHook>
void set_python_fault_hook(SetHook set, py::object fn) {
  auto cb = keep(std::move(fn));
  NoGil nogil;
  set([cb](const ActorSupervisionEvent& ev) {
    if (!py_alive()) return;
    Gil gil;
    try {
      (*cb)(ev.to_string());
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("monarch: unhandled fault hook");
    }
  });
}

// One group: (nodes, tasks_per_node, gpus_per_node, partition).
using GroupSpec = std::tuple<size_t, size_t, size_t, std::string>;

std::shared_ptr<JobBox> make_slurm(std::vector<GroupSpec> groups, std::string job_name,
                                   std::string time_limit, std::vector<std::string> extra_sbatch,
                                   std::string agent_program, std::string shared_dir,
                                   std::string listen, double start_timeout_s,
                                   double poll_interval_s, bool keep_work_dir) {
  launch::SlurmOptions o;
  o.groups.clear();
  for (auto& [nodes, tasks, gpus, partition] : groups) {
    launch::SlurmGroup g;
    g.nodes = nodes;
    g.tasks_per_node = tasks;
    g.gpus_per_node = gpus;
    g.partition = std::move(partition);
    o.groups.push_back(std::move(g));
  }
  o.job_name = std::move(job_name);
  o.time_limit = std::move(time_limit);
  o.extra_sbatch = std::move(extra_sbatch);
  o.agent_program = std::move(agent_program);
  o.shared_dir = std::move(shared_dir);
  o.host.listen = std::move(listen);
  o.start_timeout = to_ms(start_timeout_s, "SlurmJob: start_timeout");
  o.poll_interval = to_ms(poll_interval_s, "SlurmJob: poll_interval");
  o.keep_work_dir = keep_work_dir;
  auto box = std::make_shared<JobBox>();
  auto job = std::make_unique<launch::SlurmJob>(std::move(o));
  box->slurm = job.get();
  box->job = std::move(job);
  return box;
}

std::shared_ptr<JobBox> make_kubernetes(std::string name, std::string ns, std::string image,
                                        size_t replicas, uint16_t agent_port, size_t gpus_per_pod,
                                        std::vector<std::string> command,
                                        std::vector<std::string> env, std::string secret,
                                        std::string kubectl, std::vector<std::string> kubectl_args,
                                        bool validate, std::string listen, double ready_timeout_s,
                                        double poll_interval_s) {
  launch::KubernetesOptions o;
  o.name = std::move(name);
  o.ns = std::move(ns);
  o.image = std::move(image);
  o.replicas = replicas;
  o.agent_port = agent_port;
  o.gpus_per_pod = gpus_per_pod;
  o.command = std::move(command);
  o.env = std::move(env);
  o.secret = std::move(secret);
  o.kubectl = std::move(kubectl);
  o.kubectl_args = std::move(kubectl_args);
  o.validate = validate;
  o.host.listen = std::move(listen);
  o.ready_timeout = to_ms(ready_timeout_s, "KubernetesJob: ready_timeout");
  o.poll_interval = to_ms(poll_interval_s, "KubernetesJob: poll_interval");
  auto box = std::make_shared<JobBox>();
  auto job = std::make_unique<launch::KubernetesJob>(std::move(o));
  box->k8s = job.get();
  box->job = std::move(job);
  return box;
}

}  // namespace

void register_launch(py::module_& m) {
  py::class_<JobBox, std::shared_ptr<JobBox>>(m, "Job")
      .def("start", &JobBox::start,
           "Submits the job and attaches to its agents (GIL released); one HostMesh per group.")
      .def("stop", &JobBox::stop, "Ends the job (GIL released). Idempotent.")
      .def("close", &JobBox::close, "Destroys the job (stopping it first); idempotent.")
      .def("on_failure", &JobBox::on_failure, py::arg("fn"),
           "fn(mesh, ranks, cause, text) -> bool on the job's monitor thread; None: unset.")
      .def_property_readonly(
          "job_id",
          [](const JobBox& b) { return b.slurm != nullptr ? b.slurm->job_id() : std::string(); })
      .def_property_readonly(
          "work_dir",
          [](const JobBox& b) { return b.slurm != nullptr ? b.slurm->work_dir() : std::string(); })
      .def("render",
           [](const JobBox& b) {
             b.get();
             return b.slurm != nullptr ? b.slurm->render_sbatch() : b.k8s->render();
           })
      .def("set_fault_hook", [](const JobBox& b, py::object fn) {
        b.get();
        if (b.k8s == nullptr) throw UsageError("set_fault_hook: only a KubernetesJob has one");
        auto* k = b.k8s;
        set_python_fault_hook(
            [k](std::function<void(const ActorSupervisionEvent&)> h) {
              k->set_fault_hook(std::move(h));
            },
            std::move(fn));
      });

  m.def("slurm_job", &make_slurm, py::arg("groups"), py::arg("job_name"), py::arg("time_limit"),
        py::arg("extra_sbatch"), py::arg("agent_program"), py::arg("shared_dir"), py::arg("listen"),
        py::arg("start_timeout_s"), py::arg("poll_interval_s"), py::arg("keep_work_dir"),
        "A SlurmJob (nothing submitted). groups: (nodes, tasks_per_node, gpus_per_node, "
        "partition) per group.");
  m.def("kubernetes_job", &make_kubernetes, py::arg("name"), py::arg("namespace"), py::arg("image"),
        py::arg("replicas"), py::arg("agent_port"), py::arg("gpus_per_pod"), py::arg("command"),
        py::arg("env"), py::arg("secret"), py::arg("kubectl"), py::arg("kubectl_args"),
        py::arg("validate"), py::arg("listen"), py::arg("ready_timeout_s"),
        py::arg("poll_interval_s"), "A KubernetesJob (nothing applied).");
  m.def("prefer_client_of", &prefer_client_of, py::arg("host"), py::call_guard<NoGil>(),
        "Makes host's client Proc this client's own when its own does not listen on TCP.");
  m.def(
      "set_host_fault_hook",
      [](const mesh::HostMesh& h, py::object fn) {
        set_python_fault_hook([&h](Proc::FaultHook hook) { h.set_fault_hook(std::move(hook)); },
                              std::move(fn));
      },
      py::arg("host"), py::arg("fn"),
      "fn(report: str) receives failures nobody handled on this HostMesh (a runtime thread).");
}

}  // namespace monarch::python
