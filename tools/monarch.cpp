// The monarch command line.
//
//   monarch agent --listen tcp://0.0.0.0:26600   host agent: spawns and reaps procs for clients
//                                                 that attach_to_workers() to it
//   monarch lighthouse --listen tcp://0.0.0.0:29500 [--http 127.0.0.1:29510] [--secret-file F]
//                                                 standalone lighthouse of fault-tolerant jobs
//                                                 (docs/ft.md), with an HTTP status page
//   monarch worker                                a plain worker proc (SpawnOptions::program), for
//                                                 programs that need no actors of their own
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli_checks.hpp"
#include "lighthouse_server.hpp"
#include "monarch/channel/channel.hpp"
#include "monarch/config/config.hpp"
#include "monarch/mesh/process.hpp"
#include "monarch/run_main.hpp"

static int run(int argc, char** argv) {
  monarch::mesh::bootstrap(argc, argv);  // started by an agent: become a worker, never return

  CLI::App app{"monarch: host agent, lighthouse and worker procs of monarch-cpp"};
  app.require_subcommand(1);
  // --listen is required, but checked after parsing rather than with CLI11's required(): CLI11
  // checks required options before unknown arguments, so `monarch agent --bogus` said only
  // "--listen is required".
  std::string listen;
  auto* agent = app.add_subcommand("agent", "run a host agent until SIGTERM or SIGINT");
  agent
      ->add_option("--listen", listen,
                   "channel address, e.g. tcp://0.0.0.0:26600 or unix://@agent (required)")
      ->check(monarch::cli::non_empty());
  monarch::tools::LighthouseFlags lf;
  int64_t join_ms = 0, heartbeat_ms = 0, recovery_ms = -1;
  auto* lighthouse = app.add_subcommand(
      "lighthouse", "run a standalone fault-tolerance lighthouse until SIGTERM or SIGINT");
  lighthouse
      ->add_option("--listen", lf.listen,
                   "channel address the jobs' managers reach, e.g. tcp://0.0.0.0:29500 "
                   "(required)")
      ->check(monarch::cli::non_empty());
  lighthouse
      ->add_option("--http", lf.http,
                   "HOST:PORT of the status page and JSON API (default 127.0.0.1, any port)")
      ->check(monarch::cli::non_empty());
  lighthouse
      ->add_option("--secret-file", lf.secret_file,
                   "file holding the job secret (TCP channels, POST /replica/ID/kill); "
                   "default $MONARCH_SECRET, $MONARCH_SECRET_FILE")
      ->check(monarch::cli::non_empty());
  lighthouse->add_option("--min-replicas", lf.min_replicas, "default ft.min_replicas")
      ->check(monarch::cli::integer_in(1));
  lighthouse->add_option("--join-timeout-ms", join_ms, "default ft.quorum_join_timeout")
      ->check(monarch::cli::integer_in(1));
  lighthouse->add_option("--heartbeat-timeout-ms", heartbeat_ms, "default ft.heartbeat_timeout")
      ->check(monarch::cli::integer_in(1));
  lighthouse
      ->add_option("--recovery-wait-ms", recovery_ms,
                   "after a start or a freeze, wait this long before leaving a group out "
                   "of a quorum (default: the heartbeat timeout; 0: off)")
      ->check(monarch::cli::integer_in(0));
  auto* worker =
      app.add_subcommand("worker", "run as a worker proc (only when started by an agent)");
  // CLI11 says only "A subcommand is required" for a word that names none: name it.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    if (word == "help") {
      std::printf("%s", app.help().c_str());
      return 0;
    }
    if (!agent->check_name(word) && !lighthouse->check_name(word) && !worker->check_name(word)) {
      std::fprintf(stderr,
                   "monarch: unknown subcommand '%s' (agent, lighthouse or worker; see "
                   "monarch --help)\n",
                   word.c_str());
      return 2;
    }
  }
  if (int rc = monarch::cli::parse(app, argc, argv); rc >= 0) return rc;
  for (auto* sub : {agent, lighthouse}) {
    if (*sub && sub->count("--listen") == 0) {
      std::fprintf(stderr, "monarch %s: --listen is required (see monarch %s --help)\n",
                   sub->get_name().c_str(), sub->get_name().c_str());
      return 2;
    }
    // An inproc address binds, but no other process can ever reach it.
    const std::string& addr = sub == agent ? listen : lf.listen;
    if (*sub && addr.rfind("inproc://", 0) == 0) {
      std::fprintf(stderr,
                   "monarch %s: --listen %s: an inproc:// address is reachable only inside this "
                   "process; use unix:// or tcp://\n",
                   sub->get_name().c_str(), addr.c_str());
      return 2;
    }
    // A TCP listener refuses to start without the job secret; say so in the CLI's own terms.
    if (*sub && (sub == agent || lf.secret_file.empty())) {
      auto problem =
          monarch::cli::tcp_secret_problem("--listen", addr, sub == agent ? "" : "--secret-file, ");
      if (!problem.empty()) {
        std::fprintf(stderr, "monarch %s: %s\n", sub->get_name().c_str(), problem.c_str());
        return 2;
      }
    }
  }

  if (*worker) {
    std::fprintf(stderr,
                 "monarch worker: not started by a host agent (MONARCH_WORKER_OWNER is not set)\n");
    return 2;
  }
  if (*lighthouse) {
    // A timing flag is a duration as the config layer takes one (at most about 115 days: beyond
    // that the lighthouse's clock arithmetic overflows). The checks above refuse 0 where the
    // lighthouse would read it as "the config default": a user who writes 0 means something else.
    for (const auto& [flag, ms] : {std::pair<const char*, int64_t>{"--join-timeout-ms", join_ms},
                                   {"--heartbeat-timeout-ms", heartbeat_ms},
                                   {"--recovery-wait-ms", recovery_ms}}) {
      if (lighthouse->count(flag) == 0) continue;
      try {
        (void)monarch::config::parse_duration(std::to_string(ms) + "ms");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "monarch lighthouse: %s: %s\n", flag, e.what());
        return 2;
      }
    }
    lf.join_timeout = std::chrono::milliseconds(join_ms);
    lf.heartbeat_timeout = std::chrono::milliseconds(heartbeat_ms);
    lf.recovery_wait = std::chrono::milliseconds(recovery_ms);
    try {
      return monarch::tools::run_lighthouse(lf);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "monarch lighthouse: %s\n", e.what());
      return 1;
    }
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
