// A caching CPU allocator for libtorch, built and linked only in AddressSanitizer builds
// (MONARCH_SANITIZE=address,...: .ci/run's ASan stage); it replaces c10's CPU allocator when the
// program starts (static initialiser, c10::SetCPUAllocator).
//
// Why: ASan serves each allocation above 128 KiB from its own mmap and unmaps it on free, and
// c10's default CPU allocator does not cache. Every large tensor of every training step was a
// fresh mapping: page faults, kernel page zeroing and munmap made the torch tests several times
// slower under ASan than in the plain build (ft_llama_test: 243 s against 20 s).
//
// What it does: blocks of at least kMinCached bytes are rounded up to a size class (eight per
// power of two) and, when freed, kept on that class's free list (at most kMaxCachedBytes in all)
// to serve the next allocation of the class. ASan still sees misuse of them: a cached block is
// poisoned while it waits (a use after free reports as use-after-poison), and a reused block's
// tail past the requested size stays poisoned (an overflow reports too). Smaller blocks go
// straight to c10::alloc_cpu / free_cpu, i.e. to ASan's own allocator.
//
// Threads: any (one mutex). Blocks are never returned to the system while cached; the allocator
// itself is never destroyed, so tensors freed during exit still find it.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sanitizer/asan_interface.h>

#include <bit>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

constexpr std::size_t kMinCached = std::size_t{128} << 10;     // ASan's mmap threshold
constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;  // on the free lists, at most

// n rounded up to one of eight classes per power of two (at most 12.5 % slack).
std::size_t size_class(std::size_t n) {
  const std::size_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const override {
    void* p = nullptr;
    if (n >= kMinCached) {
      p = take(n);
    } else if (n > 0) {
      p = c10::alloc_cpu(n);
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  static CachingCpuAllocator& self();

 private:
  void* take(std::size_t n) const {
    const std::size_t cls = size_class(n);
    void* p = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
      }
    }
    if (p == nullptr) p = c10::alloc_cpu(cls);
    {
      std::lock_guard lock(mu_);
      live_[p] = cls;
    }
    ASAN_UNPOISON_MEMORY_REGION(p, n);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + n, cls - n);
    return p;
  }

  static void release(void* p) {
    if (p == nullptr) return;
    auto& a = self();
    std::unique_lock lock(a.mu_);
    auto it = a.live_.find(p);
    if (it == a.live_.end()) {  // a small block
      lock.unlock();
      c10::free_cpu(p);
      return;
    }
    const std::size_t cls = it->second;
    a.live_.erase(it);
    if (a.cached_ + cls > kMaxCachedBytes) {
      lock.unlock();
      ASAN_UNPOISON_MEMORY_REGION(p, cls);
      c10::free_cpu(p);
      return;
    }
    ASAN_POISON_MEMORY_REGION(p, cls);
    a.free_[cls].push_back(p);
    a.cached_ += cls;
  }

  mutable std::mutex mu_;
  mutable std::unordered_map<std::size_t, std::vector<void*>> free_;  // class -> cached blocks
  mutable std::unordered_map<void*, std::size_t> live_;  // large block handed out -> its class
  mutable std::size_t cached_ = 0;                       // bytes on free_
};

CachingCpuAllocator& CachingCpuAllocator::self() {
  static auto* a = new CachingCpuAllocator;  // never destroyed (see the file comment)
  return *a;
}

// Priority 1: above c10's default (0), so this one serves every CPU tensor allocated from here on.
[[maybe_unused]] const bool installed = [] {
  c10::SetCPUAllocator(&CachingCpuAllocator::self(), /*priority=*/1);
  return true;
}();

}  // namespace
