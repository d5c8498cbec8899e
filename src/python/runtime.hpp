// Internal to the Python bindings (monarch._native): the per-process runtime state, the C++ actor
// that hosts a Python actor (PyActor), the reducer that runs a Python combine inside the cast
// tree, and the error mapping. The Python side of these lives in python/monarch/_host.py.
//
// Threads and the GIL:
//   - Every binding that enters the runtime releases the GIL first (it may wait on a lock a
//     runtime thread holds while that thread waits for the GIL).
//   - Runtime threads (actor workers, channel I/O, mesh monitors) take the GIL only to run Python:
//     a Python actor's handler, a Python reducer, a failure handler or a future's done callback.
//     They never hold a runtime lock while they do.
//   - Once the interpreter is finalizing, runtime threads no longer enter Python (py_alive()).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "monarch/mesh/process.hpp"

namespace monarch::python {

namespace py = pybind11;

/// False once the interpreter is finalizing, or the client began to exit (prepare_exit):
/// runtime threads must not take the GIL then.
bool py_alive() noexcept;
/// Called at the client's exit (monarch.actor registers it with atexit, to run after its other
/// exit handlers): runtime threads stop entering Python, and those inside it get up to 2 s to
/// leave, before the interpreter finalizes. GIL held; releases it while waiting.
void prepare_exit();
/// Records the calling thread as the one that finalizes the interpreter (module import).
void note_main_thread();

/// Releases the GIL for its scope (use it, not py::gil_scoped_release, around every call into the
/// runtime). If the interpreter started finalizing meanwhile, the thread does not take the GIL
/// back: it blocks until the process exits (taking it would end the thread inside C++ with
/// pthread_exit, which aborts the process: a daemon thread inside a call at Ctrl-C).
class NoGil {
 public:
  NoGil();
  ~NoGil();
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* state_;
};

/// Seconds (Python's float timeouts) as a deadline: < 0, NaN or beyond ~30 years: never.
std::chrono::steady_clock::time_point deadline_after(double seconds);

/// Takes the GIL on a runtime thread (releases it at scope exit). The thread's Python thread
/// state is created once and kept: pybind11's gil_scoped_acquire alone would create and destroy
/// one per acquisition on a thread Python did not start (several microseconds per message).
class Gil {
 public:
  Gil() = default;
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  struct Pin {
    Pin();  // gives this thread its kept thread state (before gil_ is taken)
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    bool counted;  // a thread that did not hold the GIL yet (see prepare_exit)
  } pin_;
  py::gil_scoped_acquire gil_;
};

/// The listening Proc of this process: the client Proc of this_host() in a client, the worker's
/// own Proc in a worker (set by run_worker). Creates this_host() on first use in a client.
Proc& local_proc();
/// This process's HostMesh (this_host()), created on first use with `options`.
mesh::HostMesh& local_host();
/// True in a worker process (run_worker is running).
bool is_worker() noexcept;
/// In a client whose local_proc() does not listen on TCP (this_host()'s abstract unix socket,
/// unreachable from other hosts, and without the job's channel secret), makes `host`'s client
/// Proc the local_proc() from now on: the meshes decoded, ports opened and actors spawned on
/// this_proc() afterwards are reachable from `host`'s agents and workers. Used for HostMeshes of
/// launchers and attach_to_workers; the first one with a TCP client wins. Keeps `host` alive
/// for the life of the process. No-op in a worker (its own Proc stays local_proc()).
void prefer_client_of(const mesh::HostMesh& host);

/// A monarch::Error (or any exception) as an instance of its Python class (monarch.errors),
/// without raising it. Needs the GIL.
py::object error_object(const std::exception_ptr& e);

/// Hosts one Python actor: its endpoints take the Python endpoint's name and the pickled
/// arguments, and reply with the pickled result (python/monarch/_host.py encodes both).
class PyActor final : public Actor {
 public:
  /// `spec`: cloudpickle of (class, args, kwargs), unpickled in init() on the actor's proc.
  explicit PyActor(std::string spec) : spec_(std::move(spec)) {}
  ~PyActor() override;

  void init() override;
  void cleanup(const std::optional<ActorSupervisionEvent>& error) override;
  bool supervise(const MeshFailure& failure) override;
  /// The Python instance's _handle_undeliverable_message(envelope) decides: truthy = handled;
  /// without the hook, or falsy, the failure is rethrown (which fails this actor). A raise in the
  /// hook fails it too, with the hook's traceback. On the actor's thread.
  void undeliverable(const DeliveryFailure& failure) override;

  /// A call (call, call_one, choose, stream, reduce): the reply is the host's encoded result
  /// (a value or the handler's exception, python/monarch/_host.py). Completes later for async,
  /// concurrent and explicit-response-port endpoints.
  Future<std::string> call(std::string method, std::string payload);
  /// A broadcast: a handler that raises fails this actor (supervision), as in C++.
  void send(std::string method, std::string payload);
  /// Fails this actor with `why` (sent to itself when an async send handler raised).
  void fail(std::string why);
  /// A broadcast of this actor's that was lost before it left this process (sent to itself,
  /// Reply::lost): reported as undeliverable() reports one (PY-7) with `dest` (the actor mesh),
  /// `reason` and the full `text`; unhandled, it fails this actor with `text`.
  void lost_broadcast(std::string dest, std::string reason, std::string text);
  MONARCH_ENDPOINTS(PyActor, call, send, fail, lost_broadcast)

 private:
  py::object& host();
  /// The Python hook for a lost message (_handle_undeliverable_message): true when it handled
  /// it. Without a hook (or once the interpreter is exiting): false. Its raise is rethrown.
  bool undeliverable_hook(const std::string& dest, const std::string& reason,
                          const std::string& text);
  std::string spec_;
  py::object* host_ = nullptr;  // deleted with the GIL held
};

/// Completes a call's reply from Python (async, concurrent and explicit-port endpoints), or fails
/// the actor for a broadcast whose async handler raised. Each PyActor's ActorHost also holds one
/// naming its actor (`me`): the sender of the broadcasts its endpoints make, on any thread.
struct Reply {
  std::shared_ptr<Promise<std::string>> promise;
  // broadcasts, and an actor's own `me`: fail() sends PyActor::fail to it
  std::optional<ActorRef<PyActor>> self;
  void send(py::bytes b) {
    std::string s = b;
    NoGil nogil;
    if (promise) {
      try {
        promise->set_value(std::move(s));
      } catch (const UsageError&) {
        throw UsageError("response port: already answered (a reply is sent once)");
      }
    }
  }
  void fail(std::string why) {
    NoGil nogil;
    if (self) {
      // Sent as the actor itself: if it has failed meanwhile, this comes back to it and is
      // logged, rather than to its Proc's fault hook (from this thread, outside any actor).
      monarch::detail::CurrentCell as(self->cell());
      self->send(&PyActor::fail, std::move(why));
    } else if (promise && !promise->satisfied()) {
      promise->set_error(Error(why));
    }
  }
  // A call's reply whose handler failed its actor (a BaseException that is not an Exception):
  // the caller gets SupervisionError naming that actor (`me`, its own Reply) and `why`, whether
  // or not its proc then fails (a this_proc() actor's does not).
  void actor_failed(std::string why, const Reply& me) {
    NoGil nogil;
    if (!promise || !me.self) return;
    try {
      promise->set_error(SupervisionError(me.self->id(), std::move(why)));
    } catch (const UsageError&) {  // answered already (a response port)
    }
  }
  // An actor's own `me`: a broadcast it made was lost before it was sent (PyActor::lost_broadcast).
  void lost(std::string dest, std::string reason, std::string text) {
    NoGil nogil;
    if (!self) return;
    monarch::detail::CurrentCell as(self->cell());  // as in fail()
    self->send(&PyActor::lost_broadcast, std::move(dest), std::move(reason), std::move(text));
  }
};

/// The actor that sends on behalf of Python code: `sender` (an ActorHost's `me`) when given, else
/// the actor whose handler runs on this thread (none: the client or a thread outside actors). Used
/// for broadcasts and port sends made off the actor's thread (an async endpoint on the asyncio
/// thread, a queued broadcast sent by the spawn's thread), so that what cannot be delivered is
/// reported to that actor's undeliverable() (PY-7), not to its Proc's fault hook.
inline monarch::detail::Cell* sending_cell(const std::shared_ptr<Reply>& sender) {
  return sender && sender->self ? sender->self->cell() : monarch::detail::current_cell();
}

/// A combine written in Python, run inside the cast tree (reduce): `fn` is the cloudpickled
/// callable, applied to two encoded replies (python/monarch/_host.py: reduce_pair).
struct PyReducer {
  std::string fn;
  std::string operator()(std::string a, const std::string& b) const;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(fn);
  }
};

}  // namespace monarch::python
