// The host agent: the actor that spawns and kills a host's worker processes (HostAgent), and
// run_agent, the agent process's main (`monarch agent`). Protocol: host_agent.hpp.
#include "host_agent.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace monarch::mesh {

namespace process_detail {

std::atomic<uint64_t> g_counter{0};

// "unix://@x" -> "unix://@monarch-w-<pid>"; "tcp://H:P" -> "tcp://H".
std::string worker_listen_base(const std::string& agent_addr) {
  if (agent_addr.starts_with("tcp://")) {
    auto rest = agent_addr.substr(6);
    auto colon = rest.rfind(':');
    return "tcp://" + rest.substr(0, colon);
  }
  return "unix://@monarch-w-" + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
}

HostAgent::HostAgent(std::string listen_base, std::shared_ptr<CallbackGate> gate)
    : listen_base_(std::move(listen_base)),
      gate_(std::move(gate)),
      incarnation_(std::random_device{}() | 1),
      wire_version_(kAgentWireVersion) {
  if (const char* v = std::getenv("MONARCH_TESTING_AGENT_WIRE_VERSION")) {
    wire_version_ = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
  }
}

SpawnReply HostAgent::spawn(SpawnSpec spec, ActorRef<MeshController> controller) {
  SpawnReply reply{incarnation_, {}};
  auto& pids = reply.pids;
  const uint64_t target = gate_->add(controller);
  for (uint64_t i = 0; i < spec.count; ++i) {
    uint64_t rank = spec.first_rank + i;
    ChildSpec child;
    child.program = spec.program;
    child.args = spec.args;
    child.env = spec.env;
    child.fork_server = spec.fork_server;
    std::string listen = listen_base_.starts_with("tcp://")
                             ? listen_base_ + ":0"
                             : listen_base_ + "-" + std::to_string(next_++);
    child.own_env.push_back("MONARCH_WORKER_OWNER=" + controller.id().proc);
    child.own_env.push_back("MONARCH_WORKER_CONTROLLER=" + spec.controller_name);
    child.own_env.push_back("MONARCH_WORKER_MESH=" + spec.mesh);
    child.own_env.push_back("MONARCH_WORKER_RANK=" + std::to_string(rank));
    child.own_env.push_back("MONARCH_WORKER_LISTEN=" + listen);
    child.own_env.push_back("MONARCH_WORKER_HEARTBEAT_INTERVAL_MS=" +
                            std::to_string(spec.heartbeat_interval_ms));
    child.own_env.push_back("MONARCH_WORKER_HEARTBEAT_TIMEOUT_MS=" +
                            std::to_string(spec.heartbeat_timeout_ms));
    auto on_line = [target, rank, gate = gate_](int stream, std::string line) {
      gate->with(target, [&](const ActorRef<MeshController>& c) {
        (void)c.call(&MeshController::log, rank, stream, std::move(line));
      });
    };
    auto on_exit = [target, rank, gate = gate_](const ExitStatus& st) {
      gate->with(target, [&](const ActorRef<MeshController>& c) {
        (void)c.call(&MeshController::exited, rank, st.code, st.signal, st.core);
      });
    };
    pids.push_back(ProcessHost::instance().spawn(child, std::move(on_line), std::move(on_exit)));
  }
  return reply;
}

bool HostAgent::kill(int64_t pid, int sig) {
  return ProcessHost::instance().signal(static_cast<pid_t>(pid), sig);
}

}  // namespace process_detail

int run_agent(const std::string& listen,
              const std::function<void(const std::string&)>& on_listening) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit it
  process_detail::ProcessHost::instance();
  ProcOptions o;
  o.listen = listen;
  Proc proc(o);
  proc.set_fault_hook([](const ActorSupervisionEvent& ev) {
    std::fprintf(stderr, "monarch agent: %s\n", ev.to_string().c_str());
  });
  auto agent = proc.spawn<process_detail::HostAgent>(
      "monarch.agent", process_detail::worker_listen_base(proc.address()),
      std::make_shared<process_detail::CallbackGate>());
  proc.register_name("monarch.agent", agent);
  if (on_listening) on_listening(proc.address());
  int sig = 0;
  ::sigwait(&set, &sig);
  // Workers die with this process (PDEATHSIG); exit without waiting on them.
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(0);
}

}  // namespace monarch::mesh
