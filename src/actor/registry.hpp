// Internal: the Proc's actor registry, uid -> Cell*. uids are handed out in increasing order and
// never reused, so the registry is a table of fixed-size chunks indexed by uid: insert, erase and
// find are O(1) without allocating per actor (one chunk per kChunk spawns), and a chunk is freed
// once every actor in it has stopped and no uid can land in it any more.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "monarch/actor/detail/cell.hpp"

namespace monarch::detail {

class Registry {
 public:
  static constexpr uint64_t kChunk = 4096;

  void insert(uint64_t uid, Cell* c) {
    std::lock_guard lock(mu_);
    uint64_t ci = uid / kChunk;
    if (ci < base_) return;  // cannot happen: uids increase
    while (base_ + chunks_.size() <= ci) chunks_.push_back(std::make_unique<Chunk>());
    auto& ch = *chunks_[ci - base_];
    ch.slots[uid % kChunk] = c;
    ++ch.live;
    if (uid + 1 > high_) high_ = uid + 1;
  }

  /// Returns whether uid was registered.
  bool erase(uint64_t uid) {
    std::lock_guard lock(mu_);
    Chunk* ch = chunk(uid);
    if (ch == nullptr || ch->slots[uid % kChunk] == nullptr) return false;
    ch->slots[uid % kChunk] = nullptr;
    --ch->live;
    // Free leading chunks that are empty and entirely below the highest uid seen.
    while (!chunks_.empty() && chunks_.front()->live == 0 && (base_ + 1) * kChunk <= high_) {
      chunks_.pop_front();
      ++base_;
    }
    return true;
  }

  /// The registered cell with exactly this id, with a reference taken under the lock (a
  /// registered cell is alive: its owner's reference outlives its registration).
  CellPtr find_shared(const ActorId& id) {
    std::lock_guard lock(mu_);
    Chunk* ch = chunk(id.uid);
    Cell* c = ch == nullptr ? nullptr : ch->slots[id.uid % kChunk];
    if (c == nullptr || c->id() != id) return {};
    return CellPtr::share(c);
  }

 private:
  struct Chunk {
    std::array<Cell*, kChunk> slots{};
    uint64_t live = 0;
  };
  Chunk* chunk(uint64_t uid) {
    uint64_t ci = uid / kChunk;
    if (ci < base_ || ci - base_ >= chunks_.size()) return nullptr;
    return chunks_[ci - base_].get();
  }

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Chunk>> chunks_;
  uint64_t base_ = 0;  // chunk index of chunks_.front()
  uint64_t high_ = 0;  // one past the highest uid inserted
};

}  // namespace monarch::detail
