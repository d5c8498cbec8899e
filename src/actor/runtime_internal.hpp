// Internal helpers shared by the actor runtime's .cpp files.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
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

/// Spins until `done()` or `until`, giving the CPU to any other runnable thread each round
/// (sched_yield), and returns done(). Used before sleeping on a futex or condition variable
/// (WAIT-1 in wait.cpp, SCHED-5 in scheduler.cpp): a thread that is still spinning when its event
/// comes needs no wake-up, and its CPU never goes idle. On a VM, waking an idle vCPU costs tens
/// of microseconds (docs/channels.md, "Latency path").
template <class Done>
bool spin_yield_until(Done done, std::chrono::steady_clock::time_point until) {
  do {
    if (done()) return true;
    sched_yield();
  } while (std::chrono::steady_clock::now() < until);
  return done();
}

/// The configured spin (`actor.spin_us`, docs/config.md). Throws config::ConfigError on a bad
/// config layer.
std::chrono::microseconds configured_spin();

}  // namespace monarch::detail
