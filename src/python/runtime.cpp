// The per-process runtime of the Python bindings, PyActor and PyReducer (runtime.hpp).
#include "runtime.hpp"

#include <Python.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "monarch/mesh/cast.hpp"

namespace monarch::python {

namespace {

struct Runtime {
  std::mutex mu;
  Proc* proc = nullptr;                    // the listening Proc of this process
  std::optional<mesh::HostMesh> host{};    // this_host(), clients (and workers that spawn procs)
  std::optional<mesh::HostMesh> remote{};  // whose client is proc (prefer_client_of), kept alive
  bool worker = false;
};

// Never destroyed: runtime threads may still run while the interpreter exits, and the HostMesh's
// destructor would wait for them. The process's exit ends them (its procs die with the agent).
Runtime& rt() {
  static auto* r = new Runtime();
  return *r;
}

}  // namespace

namespace {
// Set by prepare_exit(), at the client's exit: from then on runtime threads do not enter Python.
std::atomic<bool> g_exiting{false};
// Runtime threads inside (or waiting to enter) Python: prepare_exit() waits for them to leave.
std::atomic<int> g_in_python{0};
// The thread that imported the module (the main thread, which finalizes the interpreter).
std::thread::id g_main_thread;

[[noreturn]] void hang_until_exit() {
  while (true) ::pause();  // the process is exiting; never re-enter the interpreter
}
}  // namespace

void note_main_thread() {
  g_main_thread = std::this_thread::get_id();
}

bool py_alive() noexcept {
  return !g_exiting.load() && Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
}

void prepare_exit() {
  g_exiting.store(true);
  PyThreadState* st = PyEval_SaveThread();  // the threads inside Python need the GIL to leave
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (g_in_python.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PyEval_RestoreThread(st);
}

// A Python thread state for this thread that outlives every Gil on it (pybind11 then reuses it
// instead of making a new one each time). Counted in g_in_python until the Gil is gone, so that
// the interpreter is not finalized under it: a thread that takes the GIL while the interpreter
// finalizes is ended inside C++ (pthread_exit through noexcept frames: std::terminate).
Gil::Pin::Pin() : counted(PyGILState_Check() == 0) {
  if (counted) {
    g_in_python.fetch_add(1);
    if (g_exiting.load()) {
      g_in_python.fetch_sub(1);
      hang_until_exit();
    }
  }
  thread_local bool pinned = false;
  if (pinned) return;
  pinned = true;
  if (PyGILState_GetThisThreadState() == nullptr) {
    PyGILState_Ensure();  // creates the thread state (kept: never released) and takes the GIL
    PyEval_SaveThread();  // releases the GIL, keeping the thread state
  }
}

Gil::Pin::~Pin() {
  if (counted) g_in_python.fetch_sub(1);
}

NoGil::NoGil() : state_(PyEval_SaveThread()) {}

NoGil::~NoGil() {
  if (!py_alive() && std::this_thread::get_id() != g_main_thread) hang_until_exit();
  PyEval_RestoreThread(state_);
}

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  using Clock = std::chrono::steady_clock;
  if (!(seconds >= 0) || seconds > 1e9) return Clock::time_point::max();
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

mesh::HostMesh& local_host() {
  auto& r = rt();
  std::lock_guard lock(r.mu);
  if (!r.host) {
    r.host.emplace(mesh::this_host());
    if (r.proc == nullptr) r.proc = &r.host->client();
  }
  return *r.host;
}

Proc& local_proc() {
  {
    auto& r = rt();
    std::lock_guard lock(r.mu);
    if (r.proc != nullptr) return *r.proc;
  }
  return local_host().client();
}

void prefer_client_of(const mesh::HostMesh& host) {
  auto& r = rt();
  std::lock_guard lock(r.mu);
  if (r.worker || r.remote) return;
  Proc& p = host.client();
  if (p.address().rfind("tcp://", 0) != 0) return;
  if (r.proc != nullptr && r.proc->address().rfind("tcp://", 0) == 0) return;
  r.remote.emplace(host);
  r.proc = &p;
}

bool is_worker() noexcept {
  return rt().worker;
}

void set_worker_proc(Proc& p) {
  auto& r = rt();
  std::lock_guard lock(r.mu);
  r.proc = &p;
  r.worker = true;
}

py::object error_object(const std::exception_ptr& e) {
  auto errors = py::module_::import("monarch.errors");
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    const auto& o = err.origin();
    // A message to an actor that had failed: in Python every actor lives in a mesh (or is the
    // client's), whose member's failure fails its proc, so this is the SupervisionError PY-5
    // promises, whichever reached the caller first: this bounce or the proc's declared failure.
    auto* d = dynamic_cast<const DeliveryFailure*>(&err);
    const ErrorCode code = d != nullptr && d->actor_failed() ? ErrorCode::Supervision : err.code();
    return errors.attr("_from_native")(static_cast<int>(code), err.what(), o.actor,
                                       o.rank ? py::cast(*o.rank) : py::none(), o.address);
  } catch (const py::error_already_set& err) {
    return err.value();
  } catch (const std::exception& err) {
    return errors.attr("_from_native")(1, err.what(), "", py::none(), "");
  } catch (...) {
    return errors.attr("_from_native")(1, "unknown C++ exception", "", py::none(), "");
  }
}

// --- PyActor ---------------------------------------------------------------------------------

namespace {

// The point as (labels, sizes, coords), which python/monarch/_host.py turns into a Point.
py::object point_tuple(const std::optional<ndslice::Point>& p) {
  if (!p) return py::none();
  return py::make_tuple(p->extent().labels(), p->extent().sizes(), p->coords());
}

// A Python error raised inside a handler, as a C++ exception carrying its formatted text, after
// `prefix` when given.
[[noreturn]] void rethrow_python(py::error_already_set& e, const std::string& prefix = {}) {
  std::string text = prefix + e.what();
  e.restore();
  PyErr_Clear();
  throw Error(text);
}

}  // namespace

void register_reply(py::module_& m) {
  py::class_<Reply, std::shared_ptr<Reply>>(m, "Reply",
                                            "The response port of one call (internal: "
                                            "monarch._host answers through it).")
      .def("send", &Reply::send, py::arg("payload"))
      .def("fail", &Reply::fail, py::arg("why"))
      .def("actor_failed", &Reply::actor_failed, py::arg("why"), py::arg("me"))
      .def("lost", &Reply::lost, py::arg("dest"), py::arg("reason"), py::arg("text"))
      .def_property_readonly(
          "actor",
          [](const Reply& r) -> py::object {
            if (!r.self) return py::none();
            const ActorId& id = r.self->id();
            return py::make_tuple(id.proc, id.name, id.uid);
          },
          "The actor that fail() fails, as (proc, name, uid); None for a call's reply.");
}

PyActor::~PyActor() {
  if (host_ == nullptr) return;
  if (!py_alive()) return;  // leaked: the interpreter is going away
  Gil gil;
  delete host_;
}

py::object& PyActor::host() {
  if (host_ == nullptr) throw Error("python actor " + id().to_string() + " has no instance");
  return *host_;
}

void PyActor::init() {
  std::optional<ndslice::Point> rank;
  try {
    rank = mesh::Context::actor_rank();
  } catch (const UsageError&) {  // spawned outside a ProcMesh (this_proc): no mesh point
  }
  if (!py_alive()) throw Error("python actor " + id().to_string() + ": interpreter is exiting");
  Gil gil;
  py::object host_mod;
  try {
    host_mod = py::module_::import("monarch._host");
    auto me = std::make_shared<Reply>();  // fail(): fails this actor (from any thread)
    me->self = self<PyActor>();
    // Reports name the Python class ("actor ... (Trainer) failed"), not PyActor: ActorHost
    // calls this once it has unpickled the class, before the class's __init__ runs.
    py::cpp_function set_label([this](std::string label) { set_type_label(std::move(label)); });
    py::object h = host_mod.attr("ActorHost")(py::bytes(spec_), point_tuple(rank), id().to_string(),
                                              id().name, me, set_label);
    host_ = new py::object(std::move(h));
    spec_.clear();
  } catch (py::error_already_set& e) {
    // The class's __init__ raised: ActorHost's InitError carries "Cls.__init__ raised:" and the
    // user's traceback, without pybind's "At:" frames of ActorHost itself.
    if (host_mod && e.matches(host_mod.attr("InitError"))) {
      std::string text = py::str(e.value());
      PyErr_Clear();
      throw Error(text);
    }
    rethrow_python(e);
  }
}

void PyActor::cleanup(const std::optional<ActorSupervisionEvent>& error) {
  if (host_ == nullptr || !py_alive()) return;
  Gil gil;
  try {
    host_->attr("cleanup")(error ? py::cast(error->to_string()) : py::none());
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("monarch: __cleanup__");
  }
  // No message runs after cleanup. The instance goes now: its host holds a ref to this actor
  // (fail()), a cycle that would otherwise keep both alive.
  delete std::exchange(host_, nullptr);
}

bool PyActor::supervise(const MeshFailure& failure) {
  if (!py_alive()) return false;
  Gil gil;
  try {
    return host()
        .attr("supervise")(failure.mesh, failure.ranks, failure.cause, failure.to_string())
        .cast<bool>();
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
}

bool PyActor::undeliverable_hook(const std::string& dest, const std::string& reason,
                                 const std::string& text) {
  if (!py_alive()) return false;
  Gil gil;
  try {
    return host().attr("undeliverable")(dest, reason, text).cast<bool>();
  } catch (py::error_already_set& e) {
    rethrow_python(e, text + "\n_handle_undeliverable_message raised: ");
  }
}

void PyActor::undeliverable(const DeliveryFailure& failure) {
  // dest(): the actor, or for a port send the port (PortId::to_string, what repr(port) shows).
  std::string dest = failure.destination().to_string();
  if (PortId::is_label(failure.endpoint())) dest += "." + failure.endpoint();
  if (undeliverable_hook(dest, failure.reason(), failure.what())) return;
  throw failure;
}

void PyActor::lost_broadcast(std::string dest, std::string reason, std::string text) {
  if (!undeliverable_hook(dest, reason, text)) throw Error(text);
}

Future<std::string> PyActor::call(std::string method, std::string payload) {
  size_t rank = static_cast<size_t>(-1);
  try {
    rank = mesh::Context::message_rank();
  } catch (const UsageError&) {
  }
  if (!py_alive()) throw Error("python actor " + id().to_string() + ": interpreter is exiting");
  auto promise = std::make_shared<Promise<std::string>>();
  auto f = promise->get_future();
  Gil gil;
  try {
    auto reply = std::make_shared<Reply>();
    reply->promise = promise;
    py::object r = host().attr("handle")(method, py::bytes(payload), rank, reply);
    if (!r.is_none()) return Future<std::string>::ready_value(r.cast<std::string>());
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
  return f;
}

void PyActor::send(std::string method, std::string payload) {
  size_t rank = static_cast<size_t>(-1);
  try {
    rank = mesh::Context::message_rank();
  } catch (const UsageError&) {
  }
  if (!py_alive()) return;
  auto reply = std::make_shared<Reply>();
  reply->self = self<PyActor>();
  Gil gil;
  try {
    host().attr("handle_send")(method, py::bytes(payload), rank, reply);
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
}

void PyActor::fail(std::string why) {
  throw Error(why);
}

std::string PyReducer::operator()(std::string a, const std::string& b) const {
  if (!py_alive()) throw Error("reduce: the interpreter is exiting");
  Gil gil;
  try {
    auto host_mod = py::module_::import("monarch._host");
    return host_mod.attr("reduce_pair")(py::bytes(fn), py::bytes(a), py::bytes(b))
        .cast<std::string>();
  } catch (py::error_already_set& e) {
    rethrow_python(e);
  }
}

}  // namespace monarch::python
