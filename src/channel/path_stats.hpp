// Internal counters of how Sender::send moved messages (tests check that each path was taken).
#pragma once

#include <atomic>
#include <cstdint>

namespace monarch::channel::detail {

/// Process-wide, relaxed counters; updated by Sender::send on the calling thread.
struct SendPathStats {
  std::atomic<uint64_t> direct_whole{0};     // written whole by the caller (direct path)
  std::atomic<uint64_t> direct_deferred{0};  // direct write partial/would block: writer finishes
  std::atomic<uint64_t> queued{0};           // handed to the io thread's writer
};

SendPathStats& send_path_stats();

}  // namespace monarch::channel::detail
