// Internal: the few runtime entry points that header templates (Future, Port, Task, ActorRef) call.
// Implemented in src/actor/. Not part of the public API.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "monarch/actor/detail/unique_function.hpp"

namespace monarch {
class Error;
}

namespace monarch::detail {

class Cell;
struct StateBase;

/// Demangled C++ type name ("Counter" for typeid(Counter).name()).
std::string demangle(const char* mangled);

/// The actor whose handler is running on this thread, or nullptr outside any actor.
Cell* current_cell() noexcept;

/// The message rank of the envelope being handled on this thread (SIZE_MAX outside a cast).
size_t current_message_rank() noexcept;

/// Reference counting of Cells (the runtime record of one actor).
void cell_add_ref(Cell* c) noexcept;
void cell_release(Cell* c) noexcept;

/// Runs `fn` inside actor `c`, serially with its handlers (as a message at the back of its
/// mailbox). If `c` can no longer run messages, `fn` is dropped (destroyed without running).
void post_closure(Cell* c, UniqueFunction<void()> fn);

using Deadline = std::optional<std::chrono::steady_clock::time_point>;

/// Blocks the calling thread until `s` is ready or the deadline passes; returns readiness.
/// Detects an actor waiting on itself (throws DeadlockError), lends the scheduler a spare worker
/// while a worker thread blocks, and drives the deterministic test scheduler when one is active.
bool wait_ready(StateBase& s, const Deadline& deadline);

/// TimeoutError text for a wait on `s` (names the actor expected to reply, when known).
std::string timeout_message(const StateBase& s);

}  // namespace monarch::detail
