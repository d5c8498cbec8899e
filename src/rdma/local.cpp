// The intra-node routes (local.hpp): shm (memfd mappings) and cma (process_vm_readv).
#include "local.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace monarch::rdma::detail {
namespace {

constexpr size_t kPage = ShmPage::kBytes;

size_t round_up(size_t n) {
  return (n + kPage - 1) / kPage * kPage;
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string memfd_name(uint64_t incarnation, uint64_t reg_id) {
  return "monarch-rdma-" + hex(incarnation) + "-" + std::to_string(reg_id);
}

std::atomic_ref<uint64_t> at(uint64_t& w) {
  return std::atomic_ref<uint64_t>(w);
}

/// Whether `pid` exists and is not a zombie (slow: reads /proc; only for waiting loops).
bool running(uint64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

/// Reads n bytes at `addr` in `pid`; 0 or the errno of the failure (EFAULT for a short read).
int vm_read(pid_t pid, void* dst, uint64_t addr, size_t n) {
  size_t done = 0;
  while (done < n) {
    iovec l{static_cast<char*>(dst) + done, n - done};
    iovec r{reinterpret_cast<void*>(addr + done), n - done};
    ssize_t k = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (k == 0) return EFAULT;
    done += static_cast<size_t>(k);
  }
  return 0;
}

/// getpid() without a system call per transfer (refreshed in forked children).
std::atomic<pid_t> g_pid{0};
pid_t self_pid() {
  pid_t p = g_pid.load(std::memory_order_relaxed);
  if (p != 0) return p;
  static const bool hooked = [] {
    ::pthread_atfork(nullptr, nullptr, [] { g_pid.store(0, std::memory_order_relaxed); });
    return true;
  }();
  (void)hooked;
  p = ::getpid();
  g_pid.store(p, std::memory_order_relaxed);
  return p;
}

std::exception_ptr make_error(RdmaErrc c, const std::string& what) {
  return std::make_exception_ptr(RdmaError(c, what));
}

}  // namespace

std::string transfer_text(bool read, const RdmaHandle& h, uint64_t offset, size_t size) {
  return std::string("rdma ") + (read ? "read_into" : "write_from") + " of " + h.describe() +
         " [offset " + std::to_string(offset) + ", " + std::to_string(size) + " B]";
}

const std::string& host_identity() {
  static const std::string id = [] {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(f, boot);
    struct stat st {};
    if (boot.empty() || ::stat("/proc/self/ns/pid", &st) != 0) return std::string();
    return boot + ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  }();
  return id;
}

// ---- StatusTable ----

StatusTable::StatusTable(size_t entries) : entries_(entries) {
  void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw RdmaError(RdmaErrc::BackendUnavailable,
                    std::string("rdma: cannot map the status table: ") + std::strerror(errno));
  }
  words_ = static_cast<uint64_t*>(p);
  free_.reserve(entries_);
  for (size_t i = entries_; i-- > 0;) free_.push_back(i);
}

StatusTable::~StatusTable() {
  ::munmap(words_, bytes());
}

uint64_t* StatusTable::claim(uint64_t reg_id, uint64_t length, uint64_t incarnation,
                             const std::string& name) {
  size_t i = 0;
  {
    std::lock_guard lock(mu_);
    if (free_.empty()) {
      throw RdmaError(RdmaErrc::BackendUnavailable, "rdma: cannot register buffer '" + name +
                                                        "': more than " + std::to_string(entries_) +
                                                        " registrations live");
    }
    i = free_.back();
    free_.pop_back();
  }
  uint64_t* e = words_ + i * kStatusWords;
  at(e[1]).store(length, std::memory_order_relaxed);
  at(e[2]).store(incarnation, std::memory_order_relaxed);
  at(e[0]).store(reg_id, std::memory_order_release);
  return e;
}

void StatusTable::release(uint64_t* e) {
  if (e == nullptr) return;
  at(e[0]).store(0, std::memory_order_seq_cst);
  at(e[1]).store(0, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  free_.push_back(static_cast<size_t>(e - words_) / kStatusWords);
}

// ---- ShmSegment (owner) ----

ShmSegment::ShmSegment(size_t bytes, uint64_t reg_id, uint64_t incarnation,
                       const std::string& name) {
  auto fail = [&](const char* step) {
    int e = errno;
    if (map_ != nullptr) ::munmap(map_, map_len_);
    if (fd_ >= 0) ::close(fd_);
    throw RdmaError(RdmaErrc::BackendUnavailable, "rdma: cannot allocate buffer '" + name + "' (" +
                                                      std::to_string(bytes) + " B): " + step +
                                                      ": " + std::strerror(e));
  };
  fd_ = ::memfd_create(memfd_name(incarnation, reg_id).c_str(), MFD_CLOEXEC);
  if (fd_ < 0) fail("memfd_create");
  map_len_ = kPage + round_up(bytes);
  if (::ftruncate(fd_, static_cast<off_t>(map_len_)) != 0) fail("ftruncate");
  void* p = ::mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) fail("mmap");
  map_ = p;
  page_ = static_cast<ShmPage*>(p);
  data_ = static_cast<std::byte*>(p) + kPage;
  page_->magic = ShmPage::kMagic;
  page_->incarnation = incarnation;
  page_->reg_id = reg_id;
  page_->length = bytes;
  at(page_->state).store(reg_id, std::memory_order_seq_cst);
}

ShmSegment::~ShmSegment() {
  if (fd_ >= 0) ::close(fd_);
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

void ShmSegment::revoke(std::chrono::milliseconds wait, const std::string& name) {
  if (fd_ < 0) return;
  at(page_->state).store(0, std::memory_order_seq_cst);
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (auto& slot : page_->slots) {
    uint64_t pid = at(slot.pid).load(std::memory_order_seq_cst);
    if (pid == 0) continue;
    // Copies are memcpys: they end in microseconds to milliseconds. Spin briefly, then back off.
    for (int spins = 0; at(slot.active).load(std::memory_order_seq_cst) != 0; ++spins) {
      if (spins < 1000) {
        std::this_thread::yield();
        continue;
      }
      if (!running(pid)) break;  // died mid-copy: nothing touches the memory any more
      if (std::chrono::steady_clock::now() > deadline) {
        spdlog::warn(
            "rdma: drop of buffer '{}': process {} still copies after {} ms (frozen?); "
            "dropping anyway",
            name, pid, wait.count());
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  ::close(fd_);
  fd_ = -1;
}

// ---- CopyPool ----

struct CopyPool::Job {
  const std::function<void(size_t)>* fn;  // the caller's; used only while indices are left
  size_t n = 0;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;  // guarded by mu
};

CopyPool::CopyPool(size_t workers) {
  for (size_t i = 0; i < workers; ++i) {
    threads_.emplace_back([this] {
      std::unique_lock lock(mu_);
      while (true) {
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        std::shared_ptr<Job> j = queue_.front();
        if (j->next.load() >= j->n) {  // every piece taken: the job leaves the queue
          queue_.pop_front();
          continue;
        }
        lock.unlock();
        work(*j);
        lock.lock();
      }
    });
  }
}

CopyPool::~CopyPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void CopyPool::work(Job& j) {
  size_t mine = 0;
  for (size_t i = j.next.fetch_add(1); i < j.n; i = j.next.fetch_add(1)) {
    (*j.fn)(i);
    ++mine;
  }
  if (mine == 0) return;
  std::lock_guard lock(j.mu);
  j.done += mine;
  if (j.done == j.n) j.cv.notify_all();
}

void CopyPool::run(size_t n, const std::function<void(size_t)>& fn) {
  auto j = std::make_shared<Job>();
  j->fn = &fn;
  j->n = n;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(j);
  }
  cv_.notify_all();
  work(*j);
  std::unique_lock lock(j->mu);
  j->cv.wait(lock, [&] { return j->done == j->n; });
}

// ---- LocalRoutes (requester) ----

struct LocalRoutes::Mapping {
  int pid = 0;
  uint64_t incarnation = 0;
  uint64_t reg_id = 0;
  void* base = nullptr;
  size_t len = 0;
  ShmPage* page = nullptr;
  std::byte* data = nullptr;
  uint64_t length = 0;
  int pidfd = -1;  // the owner process (its exit makes it readable), or -1 without pidfd_open
  std::mutex slot_mu;
  ShmPage::Slot* slot = nullptr;  // guarded by slot_mu
  pid_t slot_pid = 0;             // the process that claimed `slot` (a forked child re-claims)

  ~Mapping() {
    if (slot != nullptr && slot_pid == self_pid() && at(slot->active).load() == 0) {
      at(slot->pid).store(0, std::memory_order_seq_cst);
    }
    if (base != nullptr) ::munmap(base, len);
    if (pidfd >= 0) ::close(pidfd);
  }

  bool owner_dead() const {
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      return ::poll(&p, 1, 0) > 0;
    }
    return ::kill(pid, 0) != 0 && errno == ESRCH;
  }
  bool dropped() const { return at(page->state).load(std::memory_order_seq_cst) != reg_id; }

  /// This process's slot in the status page, claimed once; nullptr when every slot is taken.
  ShmPage::Slot* claim_slot() {
    std::lock_guard lock(slot_mu);
    pid_t me = self_pid();
    if (slot != nullptr && slot_pid == me) return slot;
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& s : page->slots) {
        uint64_t cur = at(s.pid).load(std::memory_order_seq_cst);
        // Pass 0 takes free slots; pass 1 reclaims slots of requesters that died.
        if (pass == 0 ? cur != 0 : (cur == 0 || running(cur))) continue;
        if (!at(s.pid).compare_exchange_strong(cur, static_cast<uint64_t>(me),
                                               std::memory_order_seq_cst)) {
          continue;
        }
        at(s.active).store(0, std::memory_order_seq_cst);
        slot = &s;
        slot_pid = me;
        return slot;
      }
    }
    return nullptr;
  }
};

LocalRoutes::~LocalRoutes() = default;

std::shared_ptr<LocalRoutes::Mapping> LocalRoutes::mapping(const RdmaHandle& h) {
  auto key = std::make_tuple(h.local.pid, h.owner_incarnation, h.reg_id);
  {
    std::lock_guard lock(mu_);
    auto it = maps_.find(key);
    if (it != maps_.end()) return it->second;
  }
  auto m = std::make_shared<Mapping>();
  m->pid = h.local.pid;
  m->incarnation = h.owner_incarnation;
  m->reg_id = h.reg_id;
  // The pidfd first: if the pid was reused before, the memfd opened below is not the owner's and
  // the checks fail.
  m->pidfd = static_cast<int>(::syscall(SYS_pidfd_open, h.local.pid, 0));
  std::string path =
      "/proc/" + std::to_string(h.local.pid) + "/fd/" + std::to_string(h.local.shm_fd);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if ((errno == EACCES || errno == EPERM) && !shm_off_.exchange(true)) {
      spdlog::warn(
          "rdma: cannot open {} ({}): the shm route is off for this process (ptrace "
          "restrictions?); using the backend's route",
          path, std::strerror(errno));
    }
    return nullptr;  // closed (dropped) or not ours: the next route tells
  }
  char link[256] = {};
  std::string self = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(self.c_str(), link, sizeof link - 1);
  std::string want = "/memfd:" + memfd_name(h.owner_incarnation, h.reg_id);
  std::string got(link, n > 0 ? static_cast<size_t>(n) : 0);
  struct stat st {};
  bool ok = (got == want || got == want + " (deleted)") && ::fstat(fd, &st) == 0 &&
            static_cast<size_t>(st.st_size) >= kPage;
  // Segments up to 64 MiB are mapped populated: a restarted replica's heal reads the donor's
  // whole state once, on a fresh mapping, and faulting it in page by page cost ~2 us per 4 KiB
  // page under load (1.1 ms of a 1.3 ms heal of 2.4 MB in ft_train). Larger segments fault on
  // demand, so that a small read of a huge buffer stays cheap.
  constexpr off_t kPopulateMax = off_t{64} << 20;
  const int flags = MAP_SHARED | (st.st_size <= kPopulateMax ? MAP_POPULATE : 0);
  void* p =
      ok ? ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, flags, fd, 0)
         : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  if (flags & MAP_POPULATE) {
    // Populated is not yet cheap to copy from: on a VM with shadow page tables (nested
    // virtualization: every first access of a page through a new mapping exits to the
    // hypervisor, even with the PTE in place) the first copy of 2.4 MB took 2.5-3.5 ms and the
    // second 0.07-0.1 ms. One read per page here pays that where the mapping is made (a healer
    // sets its route up while the new gloo group forms), not inside the first transfer. On bare
    // metal it costs a TLB miss per page.
    const auto* bytes = static_cast<const volatile unsigned char*>(p);
    for (size_t i = 0; i < static_cast<size_t>(st.st_size); i += kPage) (void)bytes[i];
  }
  m->base = p;
  m->len = static_cast<size_t>(st.st_size);
  m->page = static_cast<ShmPage*>(p);
  m->data = static_cast<std::byte*>(p) + kPage;
  m->length = m->page->length;
  if (m->page->magic != ShmPage::kMagic || m->page->incarnation != h.owner_incarnation ||
      m->page->reg_id != h.reg_id || m->length > m->len - kPage || m->dropped()) {
    return nullptr;
  }
  std::lock_guard lock(mu_);
  sweep();
  auto [it, fresh] = maps_.emplace(key, m);
  return it->second;  // another thread may have mapped it meanwhile: use that one
}

void LocalRoutes::forget(const std::shared_ptr<Mapping>& m) {
  std::lock_guard lock(mu_);
  auto it = maps_.find(std::make_tuple(m->pid, m->incarnation, m->reg_id));
  if (it != maps_.end() && it->second == m) maps_.erase(it);
}

void LocalRoutes::sweep() {
  for (auto it = maps_.begin(); it != maps_.end();) {
    if (it->second->owner_dead() || it->second->dropped()) {
      it = maps_.erase(it);
    } else {
      ++it;
    }
  }
}

LocalRoutes::Try LocalRoutes::shm(bool read, const RdmaHandle& h, std::byte* local, size_t size,
                                  uint64_t offset, Failure& f, bool probe) {
  if (h.local.shm_fd < 0 || shm_off_.load(std::memory_order_relaxed)) return Try::Fallback;
  auto m = mapping(h);
  if (!m) return Try::Fallback;
  if (m->owner_dead()) {
    forget(m);
    f = {RdmaErrc::OwnerUnreachable,
         "owner process " + std::to_string(h.local.pid) + " on this host has exited"};
    return Try::Failed;
  }
  auto dropped = [&] {
    forget(m);  // unmapped once the last transfer using it ends
    f = {RdmaErrc::Dropped, "buffer '" + h.name + "' was dropped by its owner"};
    return Try::Failed;
  };
  if (size > m->length || offset > m->length - size) {
    f = {RdmaErrc::OutOfBounds,
         "past the end of the owner's " + std::to_string(m->length) + " B buffer"};
    return Try::Failed;
  }
  if (probe) return m->dropped() ? dropped() : Try::Ok;
  ShmPage::Slot* slot = m->claim_slot();
  if (slot == nullptr) return Try::Fallback;  // every slot taken: the backend's route serves it
  // Dekker with revoke(): count ourselves in, then look at the state (both seq_cst).
  at(slot->active).fetch_add(1, std::memory_order_seq_cst);
  if (m->dropped()) {
    at(slot->active).fetch_sub(1, std::memory_order_seq_cst);
    return dropped();
  }
  if (read) {
    std::memcpy(local, m->data + offset, size);
  } else {
    std::memcpy(m->data + offset, local, size);
  }
  at(slot->active).fetch_sub(1, std::memory_order_seq_cst);
  return Try::Ok;
}

LocalRoutes::Try LocalRoutes::cma(const RdmaHandle& h, std::byte* local, size_t size,
                                  uint64_t offset, Failure& f, bool probe) {
  if (h.status_address == 0 || cma_off_.load(std::memory_order_relaxed)) return Try::Fallback;
  auto pid = static_cast<pid_t>(h.local.pid);
  uint64_t st[kStatusWords] = {};
  // The registration's entry: 0 if it is live and covers the range, else the outcome.
  auto check = [&](int e) {
    if (e == EPERM || e == EACCES) {
      if (!cma_off_.exchange(true)) {
        spdlog::warn(
            "rdma: process_vm_readv of process {} refused ({}): the cma route is off for "
            "this process (ptrace restrictions, seccomp?); using the backend's route",
            pid, std::strerror(e));
      }
      return Try::Fallback;
    }
    if (e == ESRCH) {
      f = {RdmaErrc::OwnerUnreachable,
           "owner process " + std::to_string(pid) + " on this host has exited"};
      return Try::Failed;
    }
    if (e != 0 || st[2] != h.owner_incarnation) return Try::Fallback;  // pid reused? not ours
    if (st[0] != h.reg_id) {
      f = {RdmaErrc::Dropped, "buffer '" + h.name + "' was dropped by its owner"};
      return Try::Failed;
    }
    if (size > st[1] || offset > st[1] - size) {
      f = {RdmaErrc::OutOfBounds,
           "past the end of the owner's " + std::to_string(st[1]) + " B buffer"};
      return Try::Failed;
    }
    return Try::Ok;
  };
  Try t = check(vm_read(pid, st, h.status_address, sizeof st));
  if (t != Try::Ok || probe) return t;
  int e = read_data(pid, local, h.address + offset, size);
  if (e == EPERM || e == EACCES || e == ESRCH) return check(e);
  // After the data: a drop (or exit) meanwhile fails the read (its bytes may be anything).
  Try after = check(vm_read(pid, st, h.status_address, sizeof st));
  if (after == Try::Fallback) {
    f = {RdmaErrc::OwnerUnreachable, "owner's status became unreadable during the read"};
    return Try::Failed;
  }
  if (after != Try::Ok) return after;
  if (e != 0) {
    f = {RdmaErrc::UnknownBuffer, std::string("owner's memory is unreadable (freed without "
                                              "drop()?): ") +
                                      std::strerror(e)};
    return Try::Failed;
  }
  return Try::Ok;
}

int LocalRoutes::read_data(pid_t pid, std::byte* dst, uint64_t addr, size_t size) {
  // Big reads in pieces over a few threads: the kernel pins the owner's pages 64 KiB at a time
  // on the calling core, so one call runs at one core's speed.
  constexpr size_t kPiece = 4u << 20;
  if (size < 2 * kPiece) return vm_read(pid, dst, addr, size);
  std::call_once(pool_once_, [this] {
    size_t cores = std::max(1u, std::thread::hardware_concurrency());
    pool_ = std::make_unique<CopyPool>(std::min<size_t>(3, cores - 1));
  });
  if (pool_->workers() == 0) return vm_read(pid, dst, addr, size);
  size_t parts = std::min(pool_->workers() + 1, size / kPiece);
  size_t piece = (size / parts + 4095) / 4096 * 4096;
  std::vector<int> errors(parts, 0);
  pool_->run(parts, [&](size_t i) {
    size_t off = i * piece;
    if (off >= size) return;
    errors[i] = vm_read(pid, dst + off, addr + off, std::min(piece, size - off));
  });
  for (int e : errors) {
    if (e != 0) return e;
  }
  return 0;
}

LocalRoutes::Outcome LocalRoutes::run(bool read, const RdmaHandle& h, std::byte* local, size_t size,
                                      uint64_t offset,
                                      const std::function<void(std::exception_ptr)>& done) {
  if (h.local.pid <= 0 || h.local.host.empty() || h.local.host != host_identity()) {
    return Outcome::Fallback;
  }
  Failure f;
  Try t = shm(read, h, local, size, offset, f, false);
  if (t == Try::Fallback && read) t = cma(h, local, size, offset, f, false);
  if (t == Try::Fallback && ::kill(h.local.pid, 0) != 0 && errno == ESRCH) {
    // Fail fast instead of waiting for the backend's timeout.
    f = {RdmaErrc::OwnerUnreachable,
         "owner process " + std::to_string(h.local.pid) + " on this host has exited"};
    t = Try::Failed;
  }
  if (t == Try::Fallback) return Outcome::Fallback;
  done(t == Try::Ok ? nullptr
                    : make_error(f.code, transfer_text(read, h, offset, size) + ": " + f.why));
  return Outcome::Done;
}

std::string LocalRoutes::route(bool read, const RdmaHandle& h) {
  if (h.local.pid <= 0 || h.local.host.empty() || h.local.host != host_identity()) return "";
  Failure f;
  if (shm(read, h, nullptr, 1, 0, f, true) != Try::Fallback) return "shm";
  if (read && cma(h, nullptr, 1, 0, f, true) != Try::Fallback) return "cma";
  return "";
}

}  // namespace monarch::rdma::detail
