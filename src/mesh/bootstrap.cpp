// The worker side of a process mesh: bootstrap() turns a process started by a host agent into a
// worker (its Proc, the user's setup, heartbeats to the owner, WorkerControl's stop) and never
// returns; elsewhere it returns at once.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>

#include "fork_server.hpp"
#include "host_agent.hpp"
#include "monarch/mesh/cast.hpp"

namespace monarch::mesh {

using namespace std::chrono_literals;

namespace process_detail {

void WorkerControl::stop_worker(std::vector<std::string> stopping) {
  std::lock_guard lock(s_->mu);
  s_->stop = true;
  s_->stopping = std::move(stopping);
  s_->cv.notify_all();
}

void WorkerControl::proc_failed(std::string addr, std::string cause) {
  if (addr != proc().address()) proc().declare_proc_failed(addr, cause);
}

namespace {

std::string env_or(const char* key, const char* dflt) {
  const char* v = std::getenv(key);
  return v != nullptr ? v : dflt;
}

[[noreturn]] void quit(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

int run_worker(const WorkerSetup& setup) {
  const std::string owner = env_or("MONARCH_WORKER_OWNER", "");
  const std::string controller_name = env_or("MONARCH_WORKER_CONTROLLER", "");
  WorkerInfo info{env_or("MONARCH_WORKER_MESH", "procs"),
                  std::stoull(env_or("MONARCH_WORKER_RANK", "0"))};
  // The process's name (ps, top, /proc/PID/comm) says which worker it is: "<mesh>[<rank>]", cut
  // to the kernel's 15 characters. Workers forked by one fork server share their command line,
  // and their /proc/PID/environ shows the server's (the kernel keeps the environment of the exec).
  const std::string title = info.mesh + "[" + std::to_string(info.rank) + "]";
  ::prctl(PR_SET_NAME, title.substr(0, 15).c_str());
  const std::chrono::milliseconds interval{
      std::stoll(env_or("MONARCH_WORKER_HEARTBEAT_INTERVAL_MS", "100"))};
  const std::chrono::milliseconds timeout{
      std::stoll(env_or("MONARCH_WORKER_HEARTBEAT_TIMEOUT_MS", "1500"))};
  auto shared = std::make_shared<WorkerControl::Shared>();

  ProcOptions o;
  o.listen = env_or("MONARCH_WORKER_LISTEN", "");
  o.channel.delivery_timeout = timeout;
  o.stop_timeout = std::max<std::chrono::milliseconds>(timeout, 1000ms);
  Proc proc(o);
  // An unhandled actor failure: the main loop reports it to the owner, then the proc exits.
  proc.set_fault_hook([shared](const ActorSupervisionEvent& ev) {
    std::lock_guard lock(shared->mu);
    if (!shared->failure) shared->failure = ev.to_string();
    shared->cv.notify_all();
  });
  ActorRef<MeshController> owner_ref;
  try {
    owner_ref = proc.lookup_remote<MeshController>(owner, controller_name).get(timeout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker %s[%zu]: cannot reach owner %s: %s\n", info.mesh.c_str(),
                 info.rank, owner.c_str(), e.what());
    quit(2);
  }
  auto report = [&](const std::string& why) {
    try {
      owner_ref.call(&MeshController::actor_failed, uint64_t{info.rank}, why).get(timeout);
    } catch (...) {
    }
    quit(1);
  };
  try {
    if (setup) setup(proc, info);
  } catch (const std::exception& e) {
    report(std::string("worker setup threw: ") + e.what());
  }
  auto control = proc.spawn<WorkerControl>("monarch.worker", shared);
  auto comm = monarch::mesh::detail::install_comm(proc);  // this proc's node of the cast tree
  try {
    if (!owner_ref
             .call(&MeshController::ready, uint64_t{info.rank}, proc.address(), int64_t{::getpid()},
                   control, comm.id())
             .get(timeout)) {
      quit(0);  // the owner no longer wants this rank
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker %s[%zu]: ready not acknowledged: %s\n", info.mesh.c_str(),
                 info.rank, e.what());
    quit(2);
  }
  std::vector<std::string> stopping;  // procs stopped with this one
  // Heartbeats go out every interval whether or not the last one was answered: an answer can
  // queue behind bulk data on the owner->worker link (tensors, large replies) for longer than
  // heartbeat_timeout, and the owner declares a rank that stays silent for that long failed.
  // The owner is gone when its link closes: this Proc's delivery_timeout is heartbeat_timeout,
  // so a heartbeat the owner's process does not acknowledge in that time (killed, frozen, host
  // lost) closes the link (CH-4, CH-7) and fails the heartbeats pending on it (REM-1).
  // Answers are read in order; at most kMaxBeatsInFlight wait (an owner whose process acks but
  // never answers is then left to its own monitor).
  constexpr size_t kMaxBeatsInFlight = 64;
  std::deque<Future<bool>> beats;
  while (true) {
    std::optional<std::string> failure;
    {
      std::unique_lock lock(shared->mu);
      shared->cv.wait_for(lock, interval, [&] { return shared->stop || shared->failure; });
      if (shared->failure) failure = shared->failure;
      if (shared->stop && !failure) {
        stopping = shared->stopping;
        break;
      }
    }
    if (failure) report(*failure);
    try {
      while (!beats.empty() && beats.front().ready()) {
        if (!beats.front().get()) quit(0);  // the owner no longer wants this rank
        beats.pop_front();
      }
      if (beats.size() < kMaxBeatsInFlight)
        beats.push_back(owner_ref.call(&MeshController::heartbeat, uint64_t{info.rank}));
    } catch (const std::exception& e) {
      // The owner is gone (killed, or its link lost): a worker never outlives its owner.
      std::fprintf(stderr, "monarch worker %s[%zu]: owner unreachable (%s); exiting\n",
                   info.mesh.c_str(), info.rank, e.what());
      quit(0);
    }
  }
  // Not under shared->mu: forget_proc waits for the channel I/O thread, which runs the fault hook.
  for (const auto& peer : stopping) {
    if (peer != proc.address())
      proc.forget_proc(peer, "proc " + peer + " stopped with " + proc.address());
  }
  proc.shutdown(o.stop_timeout);
  return 0;
}

}  // namespace
}  // namespace process_detail

void bootstrap(int argc, char** argv, WorkerSetup setup) {
  (void)argc;
  (void)argv;
  // A fork server (SpawnOptions::fork_server): it serves here, and returns only in a forked
  // worker, whose environment then says what to be.
  if (const char* fd = std::getenv(process_detail::kForkServerEnv)) process_detail::serve_forks(fd);
  if (std::getenv("MONARCH_WORKER_OWNER") == nullptr ||
      std::getenv("MONARCH_WORKER_CONTROLLER") == nullptr)
    return;
  int code = 1;
  try {
    code = process_detail::run_worker(setup);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch worker: %s\n", e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

}  // namespace monarch::mesh
