// Internal: Envelope (one queued message) and Mailbox (intrusive multi-producer single-consumer
// queue of envelopes). Push is one atomic exchange; pop is consumer-only and allocation-free.
#pragma once

#include <atomic>
#include <cstddef>
#include <string_view>

namespace monarch {
class DeliveryFailure;
}

namespace monarch::detail {

class Cell;

/// One message in a mailbox. `invoke` runs the handler on the destination actor's thread;
/// `bounce` reports that the message can no longer be delivered (it must not throw).
struct Envelope {
  std::atomic<Envelope*> next{nullptr};
  /// System envelopes (stop, child stopped, supervision) still run while the actor is stopping.
  bool system = false;
  /// For messages cast to a mesh: the receiver's local rank in the view (Context::message_rank).
  size_t message_rank = static_cast<size_t>(-1);

  Envelope() = default;
  Envelope(const Envelope&) = delete;
  Envelope& operator=(const Envelope&) = delete;
  virtual ~Envelope() = default;

  /// Runs the message. A throw means a fire-and-forget handler failed: the actor fails.
  virtual void invoke(Cell& self) = 0;
  /// The destination cannot run this message; tell whoever waits on it. Never throws.
  virtual void bounce(const DeliveryFailure& why) noexcept = 0;
  /// Endpoint name for reports ("Counter::incr", or "endpoint" when unregistered).
  virtual std::string_view endpoint() const noexcept { return "message"; }
};

/// Vyukov intrusive MPSC queue. Producers: any thread. Consumer: the thread running the actor.
class Mailbox {
 public:
  Mailbox() : tail_(&stub_), head_(&stub_) {}
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  void push(Envelope* e) noexcept {
    e->next.store(nullptr, std::memory_order_relaxed);
    Envelope* prev = tail_.exchange(e, std::memory_order_seq_cst);
    prev->next.store(e, std::memory_order_release);
  }

  /// Next envelope in FIFO order, or nullptr when empty (or when a producer is mid-push; then
  /// maybe_nonempty() stays true and a later pop returns it).
  Envelope* pop() noexcept {
    Envelope* head = head_;
    Envelope* next = head->next.load(std::memory_order_acquire);
    if (head == &stub_) {
      if (next == nullptr) return nullptr;
      head_ = next;
      head = next;
      next = next->next.load(std::memory_order_acquire);
    }
    if (next != nullptr) {
      head_ = next;
      return head;
    }
    if (head != tail_.load(std::memory_order_acquire)) return nullptr;
    push(&stub_);
    next = head->next.load(std::memory_order_acquire);
    if (next != nullptr) {
      head_ = next;
      return head;
    }
    return nullptr;
  }

  /// Consumer only: whether pop() may return something now.
  bool consumer_nonempty() const noexcept {
    return head_ != &stub_ || stub_.next.load(std::memory_order_acquire) != nullptr;
  }

  /// After pop() returned nullptr and the consumer cleared its scheduled flag: true when a push
  /// happened (or is in progress) since, so the consumer must reschedule. Reads only the
  /// producers' atomic end, so it is safe even if another consumer activation has started.
  bool pushed_since_empty() const noexcept {
    return tail_.load(std::memory_order_seq_cst) != &stub_;
  }

 private:
  struct Stub final : Envelope {
    void invoke(Cell&) override {}
    void bounce(const DeliveryFailure&) noexcept override {}
  };
  std::atomic<Envelope*> tail_;  // producers' end
  Envelope* head_;               // consumer's end
  Stub stub_;
};

}  // namespace monarch::detail
