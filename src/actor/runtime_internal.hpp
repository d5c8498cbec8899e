// Internal helpers shared by the actor runtime's .cpp files.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace monarch::detail {

/// Demangled C++ type name ("Counter" for typeid(Counter).name()).
std::string demangle(const char* mangled);

/// Blocks on a futex word while it equals `expected`, up to `timeout_ns` (< 0: no timeout).
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, long long timeout_ns) noexcept;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace monarch::detail
