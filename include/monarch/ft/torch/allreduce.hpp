// Gradient allreduce across replica groups, reconfigurable per quorum (docs/ft-torch.md).
//
// A StoreServer (hosted by the controller) is the rendezvous point: a c10d TCPStore on an
// ephemeral port. Each quorum gets a fresh key prefix ("q<quorum_id>"), and every participant
// calls AllreduceGroup::configure with that prefix, its rank in the quorum and the world size;
// that builds a new c10d ProcessGroupGloo under the prefix and drops the previous one.
//
// This header is torch-free (pimpl), so the FT core and the example can include it cheaply; the
// library monarch_ft_torch links libtorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "monarch/error.hpp"

namespace monarch::ft {

/// An allreduce (or group setup) failed: a peer died, aborted or missed the timeout. The group
/// that threw is closed (its sockets are shut, so peers blocked on it fail fast too); the caller
/// reconfigures with a new prefix before the next allreduce.
class AllreduceError : public monarch::Error {
 public:
  AllreduceError(std::string prefix, int rank, int world_size, const std::string& cause);
  const std::string& prefix() const noexcept { return prefix_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }

 private:
  std::string prefix_;
  int rank_;
  int world_size_;
};

/// The rendezvous store: a c10d::TCPStore server listening on `host`:<ephemeral port>. The
/// process hosting it (the controller) keeps it alive as long as any quorum may form; destroying
/// it stops the server thread. Thread-safe to read host()/port() from any thread.
class StoreServer {
 public:
  /// Listens on all interfaces, advertises `host` (default "127.0.0.1"). Throws
  /// std::runtime_error if the listening socket cannot be opened.
  explicit StoreServer(std::string host = "127.0.0.1");
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& host() const noexcept { return host_; }
  std::uint16_t port() const noexcept { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  std::uint16_t port_ = 0;
};

/// Which collective backend configure() builds.
enum class AllreduceBackend {
  gloo,  // CPU tensors over TCP; always built
  nccl,  // CUDA tensors; only when built against a CUDA libtorch (MONARCH_FT_HAVE_NCCL). The
         // Debian libtorch has no CUDA, so here configure(nccl) throws AllreduceError.
};

/// One member of a reconfigurable allreduce group. Not thread-safe: one thread (the replica's
/// training loop) calls configure/allreduce_sum/abort in turn. The group owns one gloo worker
/// thread that runs the collective, and one gloo device (its TCP event loop thread), kept across
/// configure() calls while `local_host` stays the same; while it builds or drops a group, a helper
/// thread wakes that loop every 200 us (gloo's own loop wakes every 10 ms, and each socket taken
/// off it waits for a wakeup: a group of 4 took 40-70 ms to build, 8 ms with the wakeups; see
/// bench_ft_reconfigure). Constructing the first AllreduceGroup sets SIGPIPE to
/// SIG_IGN for the whole process: gloo writes to sockets without MSG_NOSIGNAL, and a member
/// whose peers closed the group must get an AllreduceError, not die.
class AllreduceGroup {
 public:
  AllreduceGroup();
  ~AllreduceGroup();
  AllreduceGroup(const AllreduceGroup&) = delete;
  AllreduceGroup& operator=(const AllreduceGroup&) = delete;

  /// Joins the group `prefix` (unique per quorum, e.g. "q7"; reusing a prefix that an earlier
  /// group used on the same store is an error that shows up as a hang until the timeout) as
  /// `rank` of `world_size` (0 <= rank < world_size). Drops the previous group first. Blocks
  /// until every member of the group has joined; throws AllreduceError if that takes longer than
  /// `timeout` (a peer never showed up), if another member gave up on the group meanwhile (its
  /// abort key, see abort(); seen within ~5 ms), or if the store at `store_host`:`store_port` is
  /// unreachable (connecting to the store waits at least 5 s whatever `timeout`: c10d's connect
  /// failed at once with shorter ones when clients connected together). A configure that fails
  /// gives up on the group the same way.
  /// `timeout` also bounds every later allreduce_sum of this group. `local_host` is the address
  /// this member's gloo device binds and advertises (loopback for replicas on one host).
  void configure(const std::string& store_host, std::uint16_t store_port, const std::string& prefix,
                 int rank, int world_size, std::chrono::milliseconds timeout,
                 AllreduceBackend backend = AllreduceBackend::gloo,
                 const std::string& local_host = "127.0.0.1");

  /// Who else may end a wait in allreduce_sum: while the op has not completed, `probe` is called
  /// (on the caller's thread) `after` the op started and then every `every`; a non-empty answer
  /// is the reason to give up on the op (a probe that throws reports nothing). ReplicaClient's
  /// probe asks the group's Manager whether
  /// the lighthouse reports a member of the quorum silent (a frozen peer: quorum.hpp, Q-9).
  struct Watch {
    std::chrono::milliseconds after{0};
    std::chrono::milliseconds every{0};  ///< 0: no probing
    std::function<std::string()> probe;
  };

  /// In-place elementwise sum of `data` over all members (every member passes the same number of
  /// floats). All members get bitwise-identical results (gloo's ring allreduce reduces each chunk
  /// once, in one order, then broadcasts it). With world_size 1 it returns at once.
  /// The first call with a given size in a group first checks, with one 16-byte collective, that
  /// every member passes that size: if not, every member throws UsageError naming the sizes seen
  /// (the group is closed), rather than gloo aborting the process of a member that receives more
  /// than it expects. That collective is waited for like the allreduce (the same `watch`).
  /// Throws AllreduceError if the group is not configured, a peer died or aborted (typically
  /// within milliseconds: its sockets close), the op took longer than the configure timeout
  /// (a stopped peer), or `watch`'s probe gave a reason ("... abandoned: <reason>"; the group's
  /// connections are closed first, so that nothing more arrives into `data` and peers blocked on
  /// this member fail fast too; gloo's worker, still waiting, is parked until its timeout).
  /// When another member gave up on the group first (its abort key is set), the message ends
  /// "(another member had already given up on this group and closed its connections)": the
  /// socket error gloo reports then names no member.
  /// After a throw the group is closed (see abort()) and `data` holds partial sums.
  void allreduce_sum(std::span<float> data, const Watch* watch = nullptr);

  /// Closes the current group now: its sockets shut, so peers blocked in allreduce_sum on this
  /// group fail fast instead of waiting for their timeout. First it sets the group's abort key in
  /// the store (a set and a check, once per prefix), so that peers still inside configure()
  /// of this prefix, waiting for a member that will never come, fail within ~5 ms. Use it when
  /// this member gives up on a step (e.g. an exception before its allreduce); configure() of the
  /// next group and the destructor call it too. Idempotent. Call it from the same thread as
  /// allreduce_sum, not concurrently.
  void abort() noexcept;

  /// True between a successful configure() and the next error or abort().
  bool configured() const noexcept;
  const std::string& prefix() const noexcept { return prefix_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }

 private:
  struct Collective;  // one allreduce's tensors, reduce op and name (allreduce.cpp)
  // Runs `op` and waits for it as allreduce_sum documents (watched, guarded, abandoned on the
  // probe's word); returns once it completed, else throws AllreduceError naming it.
  void run(Collective& op, const Watch* watch);
  // gloo: every member passes n floats, else UsageError. Watched like the allreduce itself.
  void check_sizes(std::size_t n, const Watch* watch);
  [[noreturn]] void op_failed(const std::exception& e, const std::string& op);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string prefix_;
  int rank_ = -1;
  int world_size_ = 0;
};

}  // namespace monarch::ft
