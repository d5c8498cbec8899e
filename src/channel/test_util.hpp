// Helpers shared by the channel tests.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "monarch/channel/channel.hpp"
#include "monarch/wire/frame.hpp"

namespace monarch::channel::testing {

inline Bytes bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return Bytes(p, p + s.size());
}
inline std::string text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

/// A name unique to this process and call (socket names, inproc names).
inline std::string unique_name(const std::string& stem) {
  static std::atomic<int> n{0};
  return "monarch-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + "-" + stem;
}

/// Polls `pred` until true or the deadline; for state with no event to wait on (e.g. pending()).
template <class F>
bool wait_until(F pred, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

/// Collects delivered messages; waits on a condition variable with a deadline.
class Inbox {
 public:
  Listener::Handler handler() {
    return [this](Message&& m) {
      std::lock_guard lock(mu_);
      msgs_.push_back(std::move(m));
      cv_.notify_all();
    };
  }
  bool wait_for_count(size_t n, std::chrono::milliseconds deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, deadline, [&] { return msgs_.size() >= n; });
  }
  size_t count() {
    std::lock_guard lock(mu_);
    return msgs_.size();
  }
  std::vector<std::string> texts() {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (auto& m : msgs_) out.push_back(m.parts.empty() ? "" : text(m.parts[0]));
    return out;
  }
  Message take(size_t i) {
    std::lock_guard lock(mu_);
    return std::move(msgs_.at(i));
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> msgs_;
};

/// The bytes of a valid frame header (kind Auth) claiming a body of `body_len` bytes.
inline std::string auth_frame_with_body_len(uint32_t body_len) {
  wire::FrameHeader h{};
  h.kind = wire::FrameKind::Auth;
  std::vector<std::byte> out;
  wire::encode_prefix(h, {}, out);
  // body_len is the header's last field (little-endian uint32 at offset 36).
  for (int i = 0; i < 4; ++i) out[36 + i] = static_cast<std::byte>((body_len >> (8 * i)) & 0xff);
  return std::string(reinterpret_cast<const char*>(out.data()), out.size());
}

}  // namespace monarch::channel::testing
