// Data plane: one-sided reads and writes of registered memory (docs/data-plane.md; its place
// among the layers: docs/design.md, "Layers").
//
//   // owner process
//   std::vector<std::byte> weights(64 << 20);
//   monarch::rdma::RdmaBuffer buf(weights, "weights");    // registers, never copies
//   send_to_peer(buf.handle());                           // RdmaHandle: small, cereal-serialisable
//
//   // any process holding the handle
//   std::vector<std::byte> local(h.length);
//   h.read_into(local).get();                             // whole buffer
//   h.write_from(patch, /*offset=*/4096).get();           // bytes [4096, 4096+patch.size())
//
// Backends (docs/data-plane.md): `ucx` (UCX one-sided get/put: shared memory, cma, tcp, ib/rc
// where present) and `channel` (chunked transfers over monarch channels on several parallel
// links; always available). The setting rdma.backend picks one ("auto": ucx if it works, else
// channel, with a warning). A handle names the backend that registered it; a reader uses the same
// backend (a ucx handle also carries the channel route, so a reader without UCX falls back).
// Same host: a requester on the owner's host (same boot id and pid namespace) skips the backend:
// `shm` (a mapping of an RdmaBuffer::allocate()d buffer: reads and writes are memcpys) or `cma`
// (process_vm_readv: reads of any buffer). These copy on the calling thread; the Future is ready
// when read_into/write_from returns. rdma.local_routes=false turns them off; route_for() tells.
//
// Guarantees RD-1..RD-5 (tests cite them) are stated once, in docs/data-plane.md, "Guarantees"
// (index: docs/design.md).
//
// Threads: every function may be called from any thread, including actor handlers (get() there
// blocks the worker; prefer then/co_await). Futures complete on the data plane's I/O thread.
// The caller keeps the span of a read_into/write_from alive and unchanged until its Future
// completes.
#pragma once

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "monarch/actor/errors.hpp"
#include "monarch/actor/future.hpp"

namespace monarch::rdma {

enum class Backend : uint8_t { Channel = 1, Ucx = 2 };
/// "channel" or "ucx".
const char* backend_name(Backend b);

/// Where registered memory lives. Device memory (Cuda, Rocm) is reached only by the ucx backend,
/// and only when the UCX in use was built with that memory type (supported_memory_kinds()); the
/// channel, same-host and in-process routes copy with the CPU and refuse it with an RdmaError.
enum class MemoryKind : uint8_t { Host = 0, Cuda = 1, Rocm = 2 };
/// "host", "cuda" or "rocm".
const char* memory_kind_name(MemoryKind k);

enum class RdmaErrc : uint8_t {
  InvalidArgument = 1,  ///< zero length, null memory, bad setting
  OutOfBounds,          ///< offset + size past the end of the registered buffer
  UnknownBuffer,        ///< the owner has no such registration (forged handle, restarted owner)
  Dropped,              ///< the buffer was dropped by its owner
  Timeout,              ///< not complete within the transfer's timeout
  OwnerUnreachable,     ///< the owner's process cannot be reached (dead, link closed)
  BackendUnavailable,   ///< the handle's backend cannot run here
};
const char* errc_name(RdmaErrc c);

/// Every data-plane failure. The message names the buffer (name, registration id, owner address),
/// the operation, offset and length, and what went wrong.
class RdmaError : public Error {
 public:
  RdmaError(RdmaErrc errc, const std::string& what) : Error(ErrorCode::Rdma, what), errc_(errc) {}
  /// What went wrong, within the data plane (code() is ErrorCode::Rdma for every RdmaError).
  RdmaErrc errc() const { return errc_; }

 private:
  RdmaErrc errc_;
};

/// Per-transfer options. Defaults come from the config layer (rdma.* keys, docs/config.md).
struct TransferOptions {
  /// The transfer fails with RdmaError(Timeout) if not complete within this (RD-2). 0: the
  /// rdma.timeout setting; negative or above config::kMaxDuration: RdmaError(InvalidArgument).
  std::chrono::milliseconds timeout{0};
};

/// One way to reach an owner over UCX: a UCP worker and the packed remote keys (ucp_rkey_pack) of
/// the buffer and of the owner's status table, valid for that worker's context.
struct UcxRoute {
  uint8_t kind =
      0;  ///< 2: network plane (tcp, ib; event-driven). 1 is kept for a shared-memory plane
  std::vector<std::byte> worker_address{};
  std::vector<std::byte> rkey{};
  std::vector<std::byte> status_rkey{};
  template <class A>
  void serialize(A& ar) {
    ar(kind, worker_address, rkey, status_rkey);
  }
};

/// How a requester on the owner's host reaches the buffer without the backend (docs/data-plane.md,
/// "Local routes"): `shm` for buffers made by RdmaBuffer::allocate, `cma` (process_vm_readv) for
/// reads of any buffer.
struct LocalRoute {
  /// The owner's host identity: /proc/sys/kernel/random/boot_id and its pid namespace. A
  /// requester with another identity (another host or container) uses the backend's route.
  std::string host{};
  int32_t pid = 0;      ///< the owner's process id in that pid namespace (0: no local route)
  int32_t shm_fd = -1;  ///< allocate()d buffers: the memfd's fd number in the owner; else -1
  template <class A>
  void serialize(A& ar) {
    ar(host, pid, shm_fd);
  }
};

/// Where a registered buffer lives and how to reach it. Plain data, cereal-serialisable; send it
/// inside actor messages. Copies are cheap (a few hundred bytes).
struct RdmaHandle {
  std::string name;                ///< the owner's name for the buffer (for error messages)
  std::string owner;               ///< channel address of the owner's data-plane listener
  uint64_t owner_incarnation = 0;  ///< the owner process's incarnation: a restarted owner rejects
  uint64_t reg_id = 0;             ///< registration id, unique and never reused within the owner
  uint64_t address = 0;            ///< the buffer's virtual address in the owner
  uint64_t length = 0;             ///< bytes
  Backend backend = Backend::Channel;
  /// ucx: how to reach the owner's UCP workers, best first (shared memory, then network).
  std::vector<UcxRoute> ucx_routes{};
  /// ucx, cma: where the owner publishes this registration's status {reg_id, length, owner
  /// incarnation} (reg_id = length = 0 once dropped), in a table registered on every route.
  /// Readers check it so that a dropped buffer or an out-of-range access fails with RdmaError on
  /// these routes too (RD-3, RD-4).
  uint64_t status_address = 0;
  /// Same-host routes (shm, cma); empty host: none.
  LocalRoute local{};
  /// Host memory, or device memory (ucx route only).
  MemoryKind memory = MemoryKind::Host;
  /// Registered with RdmaBuffer::read_only: writes fail with RdmaError(InvalidArgument), checked
  /// by the writer and again by the owner (channel route, in-process).
  bool read_only = false;

  /// Copies bytes [offset, offset + dst.size()) of the remote buffer into dst.
  /// Errors (through the Future): RdmaError, see RdmaErrc and RD-2/RD-4.
  Future<void> read_into(std::span<std::byte> dst, uint64_t offset = 0,
                         TransferOptions opts = {}) const;
  /// Copies src into bytes [offset, offset + src.size()) of the remote buffer.
  Future<void> write_from(std::span<const std::byte> src, uint64_t offset = 0,
                          TransferOptions opts = {}) const;

  /// "'weights' (reg 3, 1048576 B at unix://@x, channel)".
  std::string describe() const;

  template <class A>
  void serialize(A& ar) {
    ar(name, owner, owner_incarnation, reg_id, address, length, backend, ucx_routes, status_address,
       local, memory, read_only);
  }
};

/// Registered memory. The constructor registers the caller's memory (no copy; the caller keeps
/// it alive until drop() or destruction); allocate() makes memory the buffer owns. Move-only.
class RdmaBuffer {
 public:
  /// A new buffer of `bytes` zeroed bytes in shared memory (a memfd mapping owned by the
  /// RdmaBuffer), registered under `name`. Same-host peers reach it by the shm route: a mapping
  /// of it, so their reads and writes are memcpys (docs/data-plane.md). memory() stays valid until
  /// the RdmaBuffer is destroyed or assigned to (drop() only ends remote access). Throws
  /// RdmaError(InvalidArgument) for 0 bytes, RdmaError(BackendUnavailable) if the kernel refuses
  /// the memory or the data plane cannot start.
  static RdmaBuffer allocate(size_t bytes, std::string name = "buffer");

  /// Registers `memory` under `name` (used in error messages). `kind`: where the memory lives;
  /// for device memory (a CUDA or ROCm pointer) pass its kind, which needs the ucx backend on a
  /// UCX built with it. Throws RdmaError(InvalidArgument) for an empty span,
  /// RdmaError(BackendUnavailable) if the data plane cannot start (e.g. its listen address cannot
  /// be bound) or cannot register memory of that kind here (the message says which kinds it can).
  explicit RdmaBuffer(std::span<std::byte> memory, std::string name = "buffer",
                      MemoryKind kind = MemoryKind::Host);
  /// Registers memory that peers may only read (e.g. an immutable object's bytes): the same as
  /// the constructor, except that every write to it fails with RdmaError(InvalidArgument), naming
  /// the buffer. memory() is then a view the caller must not write through either.
  static RdmaBuffer read_only(std::span<const std::byte> memory, std::string name = "buffer",
                              MemoryKind kind = MemoryKind::Host);
  RdmaBuffer(RdmaBuffer&&) noexcept;
  RdmaBuffer& operator=(RdmaBuffer&&) noexcept;
  RdmaBuffer(const RdmaBuffer&) = delete;
  RdmaBuffer& operator=(const RdmaBuffer&) = delete;
  ~RdmaBuffer();

  /// The handle peers use. Throws RdmaError(Dropped) after drop().
  RdmaHandle handle() const;
  std::span<std::byte> memory() const { return memory_; }
  /// Orders the calling thread's accesses to the memory with those of this process's data plane
  /// (the channel route applies peers' writes on its I/O thread, and sends peers' reads straight
  /// from the memory until they are acknowledged: sync() waits for those, up to
  /// max(8 x channel.ack_interval, 200 ms) for a requester that does not acknowledge). Call it
  /// after your own writes before telling peers to read or write, after peers' reads before you
  /// write the memory again, and before reading what peers wrote once a message told you their
  /// writes completed. The bytes are right
  /// either way on x86; this makes it well-defined in the C++ memory model and visible to
  /// ThreadSanitizer. (ucx-, shm- and cma-route accesses are made by UCX, the kernel or another
  /// process, outside the model.)
  void sync() const;
  /// Ends remote access (RD-3). Idempotent. Waits for transfers touching the memory right now.
  void drop();
  bool dropped() const { return reg_ == nullptr; }

  /// Same as handle().read_into(...) / write_from(...), for symmetry with Monarch's API.
  Future<void> read_into(std::span<std::byte> dst, uint64_t offset = 0,
                         TransferOptions o = {}) const {
    return handle().read_into(dst, offset, o);
  }
  Future<void> write_from(std::span<const std::byte> src, uint64_t offset = 0,
                          TransferOptions o = {}) const {
    return handle().write_from(src, offset, o);
  }

 private:
  RdmaBuffer() = default;
  std::span<std::byte> memory_;
  std::shared_ptr<void> reg_;      // the engine's registration record
  std::shared_ptr<void> storage_;  // allocate(): the memory (outlives drop(), not the buffer)
  RdmaHandle handle_;
};

/// Several transfers submitted together: one Future for all of them, completing when every one
/// has (RD-1), failing with the first error (all still run to completion or timeout).
class RdmaBatch {
 public:
  RdmaBatch& read_into(const RdmaHandle& h, std::span<std::byte> dst, uint64_t offset = 0);
  RdmaBatch& write_from(const RdmaHandle& h, std::span<const std::byte> src, uint64_t offset = 0);
  size_t size() const { return actions_.size(); }
  /// Starts every action (in parallel). An empty batch completes at once.
  Future<void> submit(TransferOptions opts = {});

 private:
  struct Action {
    bool read;
    RdmaHandle handle;
    std::byte* local;
    size_t size;
    uint64_t offset;
  };
  std::vector<Action> actions_;
};

/// The backend new registrations use in this process ("ucx" or "channel"); starts the data plane.
std::string active_backend();
/// The memory kinds RdmaBuffer can register in this process: Host always; Cuda / Rocm when the ucx
/// backend runs on a UCX built with them. Starts the data plane if needed.
std::vector<MemoryKind> supported_memory_kinds();
/// Transport detail: for ucx the transports UCX selected (e.g. "sm/cma,tcp"), for channel the
/// listen address and stream count.
std::string active_transport();
/// The route a read (or, with write = true, a write) of `h` from this process takes now:
/// "in-process" (h is ours), "shm", "cma" (reads only), "ucx" or "channel". It may open and map
/// the owner's memfd or read its status entry to tell (the transfer then reuses them). Local
/// routes are chosen when the owner runs on this host and rdma.local_routes is true.
std::string route_for(const RdmaHandle& h, bool write = false);

}  // namespace monarch::rdma
