// Internal: fork servers (SpawnOptions::fork_server, PH-7 of docs/processes.md).
//
// A fork server is a worker program that a host agent started with MONARCH_FORK_SERVER=3 in its
// environment: bootstrap() sees it and calls serve_forks(3) before anything else, so the process
// holds its loaded libraries (libtorch: most of a worker's start) and nothing more: one thread,
// no Proc, no sockets but fd 3. The agent then gets new workers of that program from it by fork,
// in milliseconds, instead of by exec.
//
// Protocol on fd 3, a SOCK_SEQPACKET socket pair (one message per record, in order):
//   server -> agent  'H' hello, once: `threads` = the server's thread count (only 1 may fork;
//                    any other count and the server exits after saying so)
//   agent -> server  'R' fork: `seq`, then the child's whole environment as NUL-terminated
//                    "KEY=VALUE" strings; SCM_RIGHTS: its stdout and stderr (write ends)
//   server -> agent  'S' forked: `seq`, `pid` (> 0) or -errno when fork failed
//   server -> agent  'X' exited: `pid`, `code` (-1 when killed), `signal`, `core` (the server is
//                    the children's parent and reaps them; 'S' of a pid always comes first)
// The server exits when the agent's end closes; its children die with it (PR_SET_PDEATHSIG), as
// it dies with the agent's spawner thread (PH-1).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace monarch::mesh::process_detail {

inline constexpr const char* kForkServerEnv = "MONARCH_FORK_SERVER";
inline constexpr int kForkServerFd = 3;

struct ForkMsg {
  char type = 0;  ///< 'H', 'R', 'S' or 'X'
  uint64_t seq = 0;
  int64_t pid = 0;
  int64_t threads = 0;
  int32_t code = -1, signal = 0, core = 0;
};

/// The server's loop (the worker side, from bootstrap), on the socket whose number `fd` (the
/// value of MONARCH_FORK_SERVER) names. Returns in a forked child, whose stdio and environment
/// are then the requested ones; the server itself exits with the agent. Also returns, after a
/// message on stderr and with the variable removed, when `fd` names no SOCK_SEQPACKET socket (set
/// by hand, not by an agent): the process then goes on as if it had not been set.
void serve_forks(const char* fd);

}  // namespace monarch::mesh::process_detail
