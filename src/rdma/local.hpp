// Internal: the intra-node routes of the data plane (docs/data-plane.md, "Local routes").
//
//  shm  buffers made by RdmaBuffer::allocate live in a memfd: one status page, then the data.
//       A requester on the same host opens /proc/<owner>/fd/<n> once, checks the memfd's name and
//       status page (registration id + owner incarnation), maps it, caches the mapping per
//       (owner, incarnation, registration), and a transfer is a memcpy.
//  cma  any registration: reads by process_vm_readv of the owner's memory, between two reads of
//       the registration's entry in the owner's status table (a drop during the read -> Dropped).
//
// Drop on shm (RD-3): each requester process claims a slot {pid, active} in the status page and
// counts its copies in progress there. A copy increments `active`, then checks `state`; drop
// stores state = 0, then waits until every live requester's `active` is 0. Both sides use
// sequentially consistent atomics (Dekker), so either the copy sees the drop (and fails with
// Dropped) or drop waits for the copy.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "monarch/rdma/rdma.hpp"

namespace monarch::rdma::detail {

/// "<boot_id>:<pid-namespace device>:<pid-namespace inode>" of this process: two processes with
/// the same identity see the same pids and the same memory. "" if /proc cannot tell (no routes).
const std::string& host_identity();

/// "rdma read_into of 'w' (reg 3, 1048576 B at unix://@x, channel) [offset 0, 4096 B]": how
/// errors name a transfer.
std::string transfer_text(bool read, const RdmaHandle& h, uint64_t offset, size_t size);

/// Words per status-table entry: {reg_id, length, owner incarnation, 0}. The ucx route reads the
/// first two words; cma reads all of them. A dropped registration keeps its incarnation word and
/// has reg_id = length = 0.
constexpr size_t kStatusWords = 4;

/// The owner's status table: one entry per live registration, at a fixed address for the
/// process's lifetime (an anonymous mapping, zero until used). Thread-safe.
class StatusTable {
 public:
  explicit StatusTable(size_t entries);
  ~StatusTable();
  StatusTable(const StatusTable&) = delete;
  StatusTable& operator=(const StatusTable&) = delete;

  /// The whole table (registered with UCX so peers can get entries).
  void* base() const { return words_; }
  size_t bytes() const { return entries_ * kStatusWords * sizeof(uint64_t); }
  /// Publishes {reg_id, length, incarnation} in a free entry and returns it. Throws
  /// RdmaError(BackendUnavailable) naming `name` when every entry is taken.
  uint64_t* claim(uint64_t reg_id, uint64_t length, uint64_t incarnation, const std::string& name);
  /// Marks the entry dropped (reg_id = length = 0) and frees it for reuse.
  void release(uint64_t* entry);

 private:
  uint64_t* words_ = nullptr;
  size_t entries_;
  std::mutex mu_;
  std::vector<size_t> free_;
};

/// The shared first page of an allocate()d buffer's memfd. All fields are written by the owner;
/// `slots[i].active` by requester processes (atomically).
struct ShmPage {
  static constexpr uint64_t kMagic = 0x314d44524d4e4f4dull;  // "MONRMDR1"
  static constexpr size_t kBytes = 4096;
  struct Slot {
    uint64_t pid;     // the requester process owning the slot; 0 = free
    uint64_t active;  // its copies in progress
  };
  uint64_t magic;
  uint64_t incarnation;
  uint64_t reg_id;
  uint64_t length;  // data bytes
  uint64_t state;   // reg_id while registered, 0 once dropped
  uint64_t reserved[3];
  Slot slots[(kBytes - 64) / sizeof(Slot)];
};
static_assert(sizeof(ShmPage) == ShmPage::kBytes);

/// Owner side of an allocate()d buffer: the memfd and the owner's mapping of it.
class ShmSegment {
 public:
  /// Creates the memfd "monarch-rdma-<incarnation hex>-<reg_id>" holding a status page and
  /// `bytes` of zeroed data, maps it and publishes the registration. Throws RdmaError
  /// (BackendUnavailable) naming `name` if the kernel refuses.
  ShmSegment(size_t bytes, uint64_t reg_id, uint64_t incarnation, const std::string& name);
  ~ShmSegment();  // unmaps; requesters still mapping it keep the (orphaned) pages
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  std::byte* data() const { return data_; }
  int fd() const { return fd_; }
  /// Ends access: state = 0, waits (up to `wait`) for the copies of live requesters to finish,
  /// closes the fd (no new requester can open it). Idempotent.
  void revoke(std::chrono::milliseconds wait, const std::string& name);

 private:
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  ShmPage* page_ = nullptr;
  std::byte* data_ = nullptr;
};

/// A few threads that run the pieces of a big cma read next to the calling thread (one
/// process_vm_readv runs at the speed of one core pinning pages). Thread-safe; the destructor
/// joins the threads.
class CopyPool {
 public:
  explicit CopyPool(size_t workers);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;
  size_t workers() const { return threads_.size(); }
  /// Runs fn(0) .. fn(n - 1) on the workers and the calling thread; returns when all returned.
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Job;
  void work(Job& j);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// Requester side: tries the local routes for a transfer.
class LocalRoutes {
 public:
  explicit LocalRoutes(uint64_t incarnation) : incarnation_(incarnation) {}
  ~LocalRoutes();

  enum class Outcome {
    Done,      ///< the transfer ran (or failed) on a local route; `done` was called
    Fallback,  ///< no local route applies: use the backend's route; `done` not called
  };
  /// Runs the transfer on the calling thread if the owner is on this host and a route applies.
  Outcome run(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
              const std::function<void(std::exception_ptr)>& done);
  /// "shm", "cma" or "" (the backend's route): what run() would use for h now (it may open and
  /// map the owner's memfd, or read its status entry, to tell).
  std::string route(bool read, const RdmaHandle& h);

 private:
  struct Mapping;
  struct Failure {
    RdmaErrc code{};
    std::string why;
  };
  enum class Try { Ok, Fallback, Failed };
  /// probe: check only (route()); local may be null then.
  Try shm(bool read, const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset,
          Failure& f, bool probe);
  Try cma(const RdmaHandle& h, std::byte* local, size_t size, uint64_t offset, Failure& f,
          bool probe);
  /// The cached mapping of h's memfd, mapping it first; nullptr when it cannot be opened or is
  /// not h's registration (dropped, closed, pid reused): the next route decides.
  std::shared_ptr<Mapping> mapping(const RdmaHandle& h);
  void forget(const std::shared_ptr<Mapping>& m);
  /// process_vm_readv of [addr, addr + size) in pid into dst (big reads in parallel pieces):
  /// 0 or the first errno.
  int read_data(pid_t pid, std::byte* dst, uint64_t addr, size_t size);
  /// Removes mappings whose owner died or whose buffer was dropped (mu_ held).
  void sweep();

  uint64_t incarnation_;
  std::mutex mu_;
  std::map<std::tuple<int, uint64_t, uint64_t>, std::shared_ptr<Mapping>> maps_;
  std::atomic<bool> shm_off_{false};
  std::atomic<bool> cma_off_{false};
  std::once_flag pool_once_;
  std::unique_ptr<CopyPool> pool_;  // big cma reads; made on first use
};

}  // namespace monarch::rdma::detail
