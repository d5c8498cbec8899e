// Internal: the process's data plane. One Engine per process, created on first use and never
// deleted; at exit (atexit, before static destructors) its threads are stopped and joined and its
// state torn down, after which calls fail with BackendUnavailable.
//
// The channel route is always served: every registration can be read/written over channels.
// The ucx route (ucx.cpp) is added when the backend setting allows and UCX starts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "local.hpp"
#include "monarch/rdma/rdma.hpp"

namespace monarch::rdma::detail {

/// Called once when a transfer ends: nullptr on success, else an RdmaError.
using Done = std::function<void(std::exception_ptr)>;

struct Registration {
  uint64_t id = 0;
  std::byte* base = nullptr;
  size_t length = 0;
  std::string name;
  /// Shared while a transfer touches the memory, exclusive in drop() (RD-3).
  std::shared_mutex mu;
  bool dropped = false;                    // guarded by mu
  void* ucx_memh[2] = {nullptr, nullptr};  // ucp_mem_h per UCX plane (shm, net)
  uint64_t* status = nullptr;              // its entry in the status table (ucx, cma)
  std::shared_ptr<ShmSegment> shm;         // allocate()d buffers: the memfd
  MemoryKind kind = MemoryKind::Host;      // device memory: the ucx route only
  bool read_only = false;                  // RdmaBuffer::read_only: writes are refused
  /// Channel-route read replies are sent straight from `base`: each one the channel still holds
  /// (unacknowledged) counts here, by reply link (requester address, stream); drop() waits until
  /// none is left (RD-3, RD-5).
  std::mutex lend_mu;
  std::condition_variable lend_cv;
  std::map<std::pair<std::string, uint32_t>, size_t> lent;  // guarded by lend_mu
};

/// The UCX side (ucx.cpp); absent when built without UCX or when it failed to start.
class UcxPlane {
 public:
  virtual ~UcxPlane() = default;
  /// Registers reg's memory and fills h.rkey / h.worker_address. Throws RdmaError.
  virtual void register_memory(Registration& reg, RdmaHandle& h) = 0;
  virtual void deregister(Registration& reg) = 0;
  /// One-sided get (read) or put (write) of [offset, offset+size) of h into/from local.
  virtual void start(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
                     std::chrono::milliseconds timeout, std::string what, Done done) = 0;
  virtual std::string transport() const = 0;
  /// Bit (1 << MemoryKind) for every kind of memory every plane can register (Host at least).
  virtual uint32_t memory_kinds() const = 0;
  /// Stops the plane's I/O thread (at process exit).
  virtual void shutdown() = 0;
};

/// Starts the UCX plane, or returns nullptr with `why` set. Defined in ucx.cpp or ucx_stub.cpp.
/// The plane registers `status` (the engine's status table, alive for the process) with UCX.
std::unique_ptr<UcxPlane> make_ucx_plane(StatusTable& status, std::string& why);

class Engine {
 public:
  static Engine& get();

  /// `read_only`: RdmaBuffer::read_only (writes to it are refused).
  std::shared_ptr<Registration> register_memory(std::span<std::byte> memory,
                                                const std::string& name, MemoryKind kind,
                                                RdmaHandle& out, bool read_only = false);
  /// See rdma::supported_memory_kinds.
  std::vector<MemoryKind> memory_kinds() const;
  /// A memfd-backed buffer of `bytes` (RdmaBuffer::allocate), registered; reg->shm owns it.
  std::shared_ptr<Registration> allocate(size_t bytes, const std::string& name, RdmaHandle& out);
  void drop(Registration& reg);
  /// RdmaBuffer::sync: orders the caller with everything served from reg so far, including
  /// read replies the channel still sends from the memory (waits for them, up to a grace).
  void sync(Registration& reg);

  /// Starts one transfer; `done` runs exactly once (maybe on this thread, for early errors).
  void start(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
             std::chrono::milliseconds timeout, Done done);

  /// Channel-route read replies still sent from registered memory (held by the channel until
  /// acknowledged), over all registrations. For tests.
  size_t lent_replies();

  /// See rdma::route_for.
  std::string route_for(const RdmaHandle& h, bool write);

  std::chrono::milliseconds default_timeout() const { return timeout_; }
  Backend backend() const;
  std::string transport() const;
  /// Stops the engine's I/O threads; called once, from an atexit handler.
  void shutdown_at_exit();

  struct Impl;

 private:
  Engine();
  std::shared_ptr<Registration> add(std::shared_ptr<Registration> reg, RdmaHandle& h);
  /// Shared by every call, exclusive in shutdown_at_exit (which resets impl_).
  mutable std::shared_mutex life_mu_;
  std::unique_ptr<Impl> impl_;
  std::chrono::milliseconds timeout_;
};

}  // namespace monarch::rdma::detail
