// Internal: the Proc's actor registry, uid -> Cell*. uids are handed out in increasing order and
// never reused, so the registry is a table of fixed-size chunks indexed by uid: insert, erase and
// find are O(1) without allocating per actor (one chunk per kChunk spawns), and a chunk is freed
// once every actor in it has stopped and no uid can land in it any more. Actors spawned from
// another process have sparse uids picked by the spawner (bit 63 set, see Proc::spawn_remote):
// they live in a hash map beside the chunks.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "monarch/actor/detail/cell.hpp"

namespace monarch::detail {

class Registry {
 public:
  static constexpr uint64_t kChunk = 4096;

  /// Returns false (and registers nothing) for a remote-spawn uid that is already taken.
  bool insert(uint64_t uid, Cell* c) {
    std::lock_guard lock(mu_);
    if (is_sparse(uid)) return sparse_.emplace(uid, c).second;
    uint64_t ci = uid / kChunk;
    if (ci < base_) return false;  // cannot happen: uids increase
    while (base_ + chunks_.size() <= ci) chunks_.push_back(std::make_unique<Chunk>());
    auto& ch = *chunks_[ci - base_];
    ch.slots[uid % kChunk] = c;
    ++ch.live;
    if (uid + 1 > high_) high_ = uid + 1;
    return true;
  }

  /// Returns whether uid was registered.
  bool erase(uint64_t uid) {
    std::lock_guard lock(mu_);
    if (is_sparse(uid)) return sparse_.erase(uid) != 0;
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
    Cell* c = nullptr;
    if (is_sparse(id.uid)) {
      auto it = sparse_.find(id.uid);
      c = it == sparse_.end() ? nullptr : it->second;
    } else {
      Chunk* ch = chunk(id.uid);
      c = ch == nullptr ? nullptr : ch->slots[id.uid % kChunk];
    }
    if (c == nullptr || c->id() != id) return {};
    return CellPtr::share(c);
  }

 private:
  struct Chunk {
    std::array<Cell*, kChunk> slots{};
    uint64_t live = 0;
  };
  static bool is_sparse(uint64_t uid) { return (uid >> 63) != 0; }
  Chunk* chunk(uint64_t uid) {
    uint64_t ci = uid / kChunk;
    if (ci < base_ || ci - base_ >= chunks_.size()) return nullptr;
    return chunks_[ci - base_].get();
  }

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Chunk>> chunks_;
  uint64_t base_ = 0;                           // chunk index of chunks_.front()
  uint64_t high_ = 0;                           // one past the highest uid inserted
  std::unordered_map<uint64_t, Cell*> sparse_;  // remotely spawned actors
};

}  // namespace monarch::detail
