// The monarch command line.
//
//   monarch agent --listen tcp://0.0.0.0:26600   host agent: spawns and reaps procs for clients
//                                                 that attach_to_workers() to it
//   monarch worker                                a plain worker proc (SpawnOptions::program), for
//                                                 programs that need no actors of their own
#include <CLI/CLI.hpp>
#include <cstdio>

#include "monarch/mesh/process.hpp"
#include "monarch/run_main.hpp"

static int run(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv);  // started by an agent: become a worker, never return

  CLI::App app{"monarch: host agent and worker procs of monarch-cpp"};
  app.require_subcommand(1);
  std::string listen;
  auto* agent = app.add_subcommand("agent", "run a host agent until SIGTERM or SIGINT");
  agent
      ->add_option("--listen", listen, "channel address, e.g. tcp://0.0.0.0:26600 or unix://@agent")
      ->required();
  auto* worker =
      app.add_subcommand("worker", "run as a worker proc (only when started by an agent)");
  CLI11_PARSE(app, argc, argv);

  if (*worker) {
    std::fprintf(stderr,
                 "monarch worker: not started by a host agent (MONARCH_WORKER_OWNER is not set)\n");
    return 2;
  }
  try {
    return monarch::mesh::run_agent(listen, [](const std::string& addr) {
      std::printf("LISTENING %s\n", addr.c_str());
      std::fflush(stdout);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch agent: %s\n", e.what());
    return 1;
  }
}

// A bad setting (a ConfigError) or any other error that escapes run() prints and exits 1.
int main(int argc, char** argv) {
  return monarch::run_main(argv[0], [&] { return run(argc, argv); });
}
