// getting_started: a tour of monarch-cpp's model in one program (build/bin/getting_started).
//
// One program drives a mesh of worker processes as if they were one machine:
//   1. spawn procs (child processes of this host) and an actor on each,
//   2. call them all (ValueMesh), reduce inside the cast tree, call one, choose one,
//   3. slice the mesh and broadcast to a slice,
//   4. lose a proc and handle the MeshFailure in the owner's supervise(); the rest keeps working.
// The worker processes run this same executable: bootstrap() at the top of main turns them into
// workers, so the actor types below exist on both sides.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "monarch/mesh/process.hpp"
#include "monarch/run_main.hpp"

using namespace std::chrono_literals;
namespace mesh = monarch::mesh;

// An actor: endpoints are member functions; MONARCH_ENDPOINTS names them so that they can be
// called in other processes.
struct Worker : monarch::Actor {
  explicit Worker(int base) : base_(base) {}
  int value(int x) { return base_ + x + static_cast<int>(mesh::Context::message_rank()); }
  std::string hello(std::string who) {
    return "hello " + who + " from pid " + std::to_string(::getpid());
  }
  void add(int x) { base_ += x; }
  void exit_now(int code) { std::_Exit(code); }  // simulates a crashing process
  MONARCH_ENDPOINTS(Worker, value, hello, add, exit_now)
  int base_;
};

// The owner of the proc mesh: failures of its procs arrive in its supervise().
struct Controller : monarch::Actor {
  explicit Controller(mesh::HostMesh host) : host_(std::move(host)) {}

  // Spawns the procs from inside this actor, which makes it their owner.
  mesh::ProcMesh start() {
    return host_.spawn_procs({{"replicas", 2}, {"gpus", 2}}, {.name = "tour"});
  }

  // Completes with the next failure this actor handled.
  monarch::Future<std::string> next_failure() {
    promise_ = monarch::Promise<std::string>();
    auto f = promise_->get_future();
    if (!seen_.empty()) promise_->set_value(seen_), promise_.reset();
    return f;
  }

  bool supervise(const mesh::MeshFailure& failure) override {
    seen_ = failure.to_string();
    if (promise_) promise_->set_value(seen_), promise_.reset();
    return true;  // handled: the other ranks keep working
  }
  MONARCH_ENDPOINTS(Controller, start, next_failure)

  mesh::HostMesh host_;
  std::optional<monarch::Promise<std::string>> promise_;
  std::string seen_;
};

static int run(int argc, char** argv) {
  mesh::bootstrap(argc, argv);  // in a worker process: serves the proc and never returns
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  mesh::HostMesh host = mesh::this_host();
  auto controller = host.client().spawn<Controller>("controller", host);
  mesh::ProcMesh procs = controller.call(&Controller::start).get(30s);
  std::printf("1. %zu procs, extent %s\n", procs.size(), procs.extent().to_string().c_str());

  auto workers = procs.spawn<Worker>("worker", 100);       // one Worker per proc; does not block
  auto values = workers.call(&Worker::value, 1).get(10s);  // ValueMesh<int> over the extent
  std::printf("2. call:      ");
  for (size_t r = 0; r < values.size(); ++r) std::printf("%d ", values[r]);
  std::printf("\n   reduce:    sum = %d (one reply, reduced in the cast tree)\n",
              workers.reduce(mesh::Sum{}, &Worker::value, 1).get(10s));
  auto one = workers.slice("replicas", 1).slice("gpus", 0);
  std::printf("   call_one:  %s\n",
              one.call_one(&Worker::hello, std::string("main")).get(10s).c_str());
  std::printf("   choose:    %d\n", workers.choose(&Worker::value, 0).get(10s));

  auto replica1 = workers.slice("replicas", 1);
  replica1.broadcast(&Worker::add, 1000);                  // fire and forget, to a slice
  auto after = replica1.call(&Worker::value, 0).get(10s);  // FIFO per sender: sees the add
  std::printf("3. broadcast to replicas=1, then call: %d %d\n", after[0], after[1]);

  workers.slice("replicas", 1).slice("gpus", 1).broadcast(&Worker::exit_now, 3);
  std::printf("4. supervise(): %s\n", controller.call(&Controller::next_failure).get(30s).c_str());
  auto survivors = workers.slice("replicas", 0).call(&Worker::value, 0).get(10s);
  std::printf("   replicas=0 still answers: %d %d; failed ranks:", survivors[0], survivors[1]);
  for (size_t r : procs.failed_ranks()) std::printf(" %zu", r);
  auto all = workers.call(&Worker::value, 0).get(10s);  // the dead rank holds its error, at once
  std::printf("\n   call to all: %zu answered, rank", all.size() - all.failed_ranks().size());
  for (size_t r : all.failed_ranks()) std::printf(" %zu", r);
  std::printf(" failed; survivors(): sum = %d\n",
              workers.survivors().reduce(mesh::Sum{}, &Worker::value, 0).get(10s));

  procs.stop();
  std::printf("done\n");
  return 0;
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
