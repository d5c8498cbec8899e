// Internal: the channel state of a listening Proc (Proc::Remote), shared by proc.cpp/remote.cpp.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "monarch/actor/proc.hpp"
#include "monarch/ndslice/extent.hpp"

namespace monarch {
namespace detail {
std::shared_ptr<RemoteInvoker> find_invoker(std::type_index type, const std::string& endpoint);
Cell* spawn_remote_cell(Proc& proc, ActorId id, std::type_index type, Cell::Factory factory,
                        ActorId owner, std::shared_ptr<const ndslice::Point> mesh_point);

/// REM-2: a report of a message whose sending actor has stopped or failed; nobody is left to tell,
/// and its Proc is not failed. Logged: the first report for each such sender as a warning, its
/// later ones at debug level (an actor that stops with many sends in flight would log a line per
/// send). Any thread.
void log_report_for_stopped_sender(const ActorId& sender, const DeliveryFailure& f) noexcept;

/// Why an actor of this Proc that is no longer registered cannot be reached (Proc::Remote's
/// tombstones): `failed` when it failed rather than stopped. An empty `why`: not remembered.
struct Tombstone {
  std::string why;
  bool failed = false;
};

/// A supervision event chain on the wire: outermost first.
struct WireEvent {
  ActorId actor;
  std::string actor_type;
  std::string cause;
  template <class Ar>
  void serialize(Ar& ar) {
    ar(actor, actor_type, cause);
  }
};
inline Bytes encode_event(const ActorSupervisionEvent& ev) {
  std::vector<WireEvent> chain;
  for (const auto* e = &ev; e != nullptr; e = e->caused_by.get()) {
    chain.push_back(WireEvent{e->actor, e->actor_type, e->cause});
  }
  return wire::encode(chain);
}
inline std::shared_ptr<const ActorSupervisionEvent> decode_event(const Bytes& b) {
  auto chain = wire::decode<std::vector<WireEvent>>(b);
  if (chain.empty()) throw wire::DecodeError("wire: empty supervision event chain");
  std::shared_ptr<const ActorSupervisionEvent> ev;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    ev = std::make_shared<const ActorSupervisionEvent>(
        ActorSupervisionEvent{it->actor, it->actor_type, it->cause, ev});
  }
  return ev;
}
/// The actor type of a factory key "Type(args...)".
inline std::string type_of_key(const std::string& key) {
  if (const auto* f = find_remote_factory(key)) return f->type_name;
  return key.substr(0, key.find('('));
}
}  // namespace detail

using detail::RemoteHeader;
using detail::RemoteKind;

struct Proc::Remote {
  Proc* proc = nullptr;
  channel::ChannelOptions opts;
  std::unique_ptr<channel::IoRuntime> io;
  std::unique_ptr<channel::Listener> listener;
  std::string address;
  // start_remote holds start_mu until `address` and the Proc's name are set; the io thread
  // waits for that before handling its first message.
  std::mutex start_mu;
  std::atomic<bool> started{false};
  void wait_started() {
    if (started.load(std::memory_order_acquire)) return;
    std::lock_guard lock(start_mu);
  }

  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<channel::Sender>> senders;
  // Per link in `senders`: set by forget() before it closes the link, so that what comes back
  // from it is dropped quietly (the peer is gone by design).
  std::unordered_map<std::string, std::shared_ptr<std::atomic<bool>>> forgotten;  // guarded by mu
  struct PendingCall {
    ActorId dest;  // failed when the link to dest.proc closes (REM-1) or it is declared failed
    std::string endpoint;  // what was asked: the endpoint, "stop"/"kill", "lookup<Type>"
    detail::ReplyHandler handler;
  };
  // Where a reply goes, and what it answers (named in the error that replaces an oversize reply).
  struct ReplyTo {
    std::string proc;  // the caller's proc (RemoteHeader::reply_proc)
    uint64_t request = 0;
    ActorId actor;         // the actor (or proc, for lookups) replying
    std::string endpoint;  // what was called
    uint64_t limit = 0;    // the caller's max_frame_bytes (RemoteHeader::reply_limit; 0: unknown)
    std::type_index type = typeid(void);  // the actor's type, if known (named with the endpoint)
    // "Type::endpoint", as a local DeliveryFailure names it; demangled only when an error needs it.
    std::string what() const {
      return type == typeid(void) ? endpoint : detail::demangle(type.name()) + "::" + endpoint;
    }
    static ReplyTo of(const RemoteHeader& h) {
      return ReplyTo{h.reply_proc, h.request_id, h.dest, h.endpoint, h.reply_limit};
    }
  };
  std::unordered_map<uint64_t, PendingCall> pending;
  uint64_t next_request = 1;
  bool closed = false;
  struct Exported {
    std::weak_ptr<void> sink;
    std::type_index type = typeid(void);
    detail::PortBytesDeliver deliver;
  };
  std::unordered_map<uint64_t, Exported> ports;  // guarded by mu
  // Procs declared failed (declare_proc_failed): address -> cause. Never removed (REM-5).
  std::unordered_map<std::string, std::string> failed;  // guarded by mu
  std::atomic<size_t> failed_count{0};                  // failed.size(), readable without mu
  // The actor that owns a failed proc's mesh (declare_proc_failed's `owner`): it hears the
  // failure as a MeshFailure, so its messages lost there are not reported to it again (REM-6).
  std::unordered_map<std::string, ActorId> failed_owner;  // guarded by mu
  // Procs forget() was told are gone by design, until a request comes from them again (the
  // address may be reused): address -> why. A reply to one is dropped with a debug log: its
  // caller was stopped. A new link to one (a call through a stale reference) closes at its first
  // refused connection (ChannelOptions::close_if_refused), so the call fails at once, naming
  // why, instead of waiting out the delivery timeout. Bounded.
  // Its own mutex: once a Proc forgot a peer, every request and reply looks here.
  static constexpr size_t kMaxGone = 4096;
  std::mutex gone_mu;
  std::unordered_map<std::string, std::string> gone;  // guarded by gone_mu
  std::deque<std::string> gone_order;  // guarded by gone_mu; may hold addresses not in `gone`
  std::atomic<bool> any_gone{false};   // !gone.empty(), read without a lock on every request
  // Why actors of this Proc are gone (a remote spawn refused, an actor failed: Cell::finish_stop
  // via Proc::remember_failed_actor): uid -> reason, so a later message to them says more than
  // "unknown actor". Bounded, oldest dropped first.
  static constexpr size_t kMaxTombstones = 4096;
  std::unordered_map<uint64_t, detail::Tombstone> tombstones;  // guarded by mu
  std::deque<uint64_t> tombstone_order;                        // guarded by mu
  // uids for actors this Proc spawns elsewhere (kRemoteSpawnBit | random base + counter).
  std::atomic<uint64_t> next_spawn{std::random_device{}() * 0x9E3779B97F4A7C15ULL ^
                                   std::random_device{}()};

  uint64_t next_spawn_uid() {
    return detail::kRemoteSpawnBit |
           (next_spawn.fetch_add(1, std::memory_order_relaxed) & ~detail::kRemoteSpawnBit);
  }

  void add_tombstone(uint64_t uid, std::string why, bool actor_failed = false) {
    std::lock_guard lock(mu);
    if (!tombstones.emplace(uid, detail::Tombstone{std::move(why), actor_failed}).second) return;
    tombstone_order.push_back(uid);
    if (tombstone_order.size() > kMaxTombstones) {
      tombstones.erase(tombstone_order.front());
      tombstone_order.pop_front();
    }
  }
  detail::Tombstone tombstone(uint64_t uid) {
    std::lock_guard lock(mu);
    auto it = tombstones.find(uid);
    return it == tombstones.end() ? detail::Tombstone{} : it->second;
  }

  // Throws SupervisionError naming `dest` when `addr` was declared failed, DeliveryFailure naming
  // `dest` and `endpoint` when this Proc has shut down.
  std::shared_ptr<channel::Sender> sender_for(const std::string& addr, const ActorId& dest,
                                              const std::string& endpoint) {
    std::lock_guard lock(mu);
    if (closed) throw DeliveryFailure(dest, endpoint, "proc " + address + " shut down");
    if (auto f = failed.find(addr); f != failed.end()) throw SupervisionError(dest, f->second);
    auto it = senders.find(addr);
    if (it != senders.end() && !it->second->closed()) return it->second;
    // A closed link (CH-4) is replaced: the peer may be back. Parse first, so a bad address
    // leaves no entry behind.
    auto target = channel::ChannelAddr::parse(addr);
    auto quiet = std::make_shared<std::atomic<bool>>(false);
    // A proc forgotten as stopped: a refused connection closes the new link at once, and what it
    // returns says why the proc went. (gone_why takes gone_mu inside mu; nothing takes mu while
    // holding gone_mu.)
    std::string stopped = gone_why(addr);
    channel::ChannelOptions o = opts;
    o.close_if_refused = !stopped.empty();
    auto because = [stopped](const std::string& why) {
      return stopped.empty() ? why : why + "; " + stopped;
    };
    auto s = channel::Sender::connect(
        *io, target, o, [this, addr, quiet, because](channel::Message&& m, const std::string& why) {
          on_returned(std::move(m), addr, because(why), quiet->load());
        });
    s->on_close(
        [this, addr, because](const std::string& why) { on_link_closed(addr, because(why)); });
    senders[addr] = s;
    forgotten[addr] = std::move(quiet);
    return s;
  }

  // `endpoint` names what was asked in the DeliveryFailure the call fails with if its link closes
  // or this Proc shuts down first.
  uint64_t add_pending(const ActorId& dest, std::string endpoint, detail::ReplyHandler h) {
    std::lock_guard lock(mu);
    uint64_t id = next_request++;
    pending.emplace(id, PendingCall{dest, std::move(endpoint), std::move(h)});
    return id;
  }

  // REM-5: the mesh layer learnt that `addr` crashed or froze. Pending calls fail now with
  // SupervisionError; later ones fail in sender_for; the link is closed.
  void declare_failed(const std::string& addr, const std::string& cause, const ActorId& owner) {
    std::vector<PendingCall> lost;
    std::shared_ptr<channel::Sender> link;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      // A worker may hear of the failure (WorkerControl::proc_failed) before the mesh that owns
      // the proc declares it: the owner is recorded either way.
      if (owner.uid != 0) failed_owner.emplace(addr, owner);
      if (!failed.emplace(addr, cause).second) return;
      failed_count.store(failed.size(), std::memory_order_release);
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.dest.proc == addr) {
          lost.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (auto it = senders.find(addr); it != senders.end()) {
        link = std::move(it->second);
        senders.erase(it);
      }
      forgotten.erase(addr);
    }
    spdlog::log(lost.empty() ? spdlog::level::debug : spdlog::level::warn,
                "monarch: {}: proc {} declared failed ({}); {} pending calls fail", address, addr,
                cause, lost.size());
    for (auto& call : lost) {
      call.handler(
          detail::RemoteResult{{}, std::make_exception_ptr(SupervisionError(call.dest, cause))});
    }
    // Quietly: the failure is reported (MeshFailure); what was unacknowledged still comes back
    // to on_returned (REM-6), and may well have been delivered before the proc died.
    if (link) link->close_quietly("proc " + addr + " declared failed: " + cause);
  }
  // Proc::forget_proc: `addr` is gone by design. Its link closes quietly; calls pending on it fail
  // with DeliveryFailure (on_link_closed); what comes back from the link is dropped (on_returned);
  // replies owed to it are dropped (`gone`, even when there is no link yet).
  void forget(const std::string& addr, const std::string& why) {
    std::shared_ptr<channel::Sender> link;
    {
      std::lock_guard lock(gone_mu);
      if (gone.emplace(addr, why).second) {
        gone_order.push_back(addr);
        while (gone_order.size() > kMaxGone) {
          gone.erase(gone_order.front());
          gone_order.pop_front();
        }
        any_gone.store(true, std::memory_order_relaxed);
      }
    }
    {
      std::lock_guard lock(mu);
      if (closed) return;
      auto it = senders.find(addr);
      if (it == senders.end()) return;
      link = std::move(it->second);
      senders.erase(it);
      if (auto q = forgotten.find(addr); q != forgotten.end()) {
        q->second->store(true);
        forgotten.erase(q);
      }
    }
    spdlog::debug("monarch: {}: forgetting proc {} ({})", address, addr, why);
    link->close_quietly(why);
  }
  bool is_failed(const std::string& addr) {
    std::lock_guard lock(mu);
    return failed.count(addr) != 0;
  }
  std::optional<std::string> failure_of(const std::string& addr) {
    std::lock_guard lock(mu);
    auto it = failed.find(addr);
    if (it == failed.end()) return std::nullopt;
    return it->second;
  }
  // Whether `sender` of this Proc has heard (or will hear) that `addr` failed, so a message it
  // sent there that comes back need not be reported to it (REM-6): code outside actors (uid 0)
  // hears every failure this Proc declared through the mesh layer's report, an actor the
  // failures of procs of the meshes it owns (its supervise()).
  bool failure_reported_to(const ActorId& sender, const std::string& addr) {
    if (failed_count.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard lock(mu);
    if (failed.count(addr) == 0) return false;
    if (sender.uid == 0) return true;
    auto it = failed_owner.find(addr);
    return it != failed_owner.end() && it->second == sender;
  }
  bool is_gone(const std::string& addr) {
    if (!any_gone.load(std::memory_order_relaxed)) return false;
    std::lock_guard lock(gone_mu);
    return gone.count(addr) != 0;
  }
  // Why forget() was told `addr` is gone; empty when it was not (or was heard from since).
  std::string gone_why(const std::string& addr) {
    if (!any_gone.load(std::memory_order_relaxed)) return {};
    std::lock_guard lock(gone_mu);
    auto it = gone.find(addr);
    return it == gone.end() ? std::string() : it->second;
  }
  // A request (it wants a reply) came from `addr`: it is there again, so replies to it go out.
  void heard_from(const std::string& addr) {
    if (!any_gone.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(gone_mu);
    if (gone.erase(addr) != 0 && gone.empty()) {
      gone_order.clear();
      any_gone.store(false, std::memory_order_relaxed);
    }
  }

  // The link to `addr` closed (delivery timeout, peer unreachable): calls already delivered there
  // will never be answered, so they fail now instead of waiting forever (REM-1).
  void on_link_closed(const std::string& addr, const std::string& why) {
    std::vector<PendingCall> lost;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.dest.proc == addr) {
          lost.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& call : lost) {
      call.handler(
          detail::RemoteResult{{},
                               std::make_exception_ptr(DeliveryFailure(
                                   call.dest, call.endpoint, "link to proc closed: " + why))});
    }
  }
  detail::ReplyHandler take_pending(uint64_t id) {
    std::lock_guard lock(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return nullptr;
    auto h = std::move(it->second.handler);
    pending.erase(it);
    return h;
  }
  // As take_pending, with what the call asked; nullopt when it is no longer pending.
  std::optional<PendingCall> take_call(uint64_t id) {
    std::lock_guard lock(mu);
    auto it = pending.find(id);
    if (it == pending.end()) return std::nullopt;
    PendingCall c = std::move(it->second);
    pending.erase(it);
    return c;
  }
  // Fails the pending call `id` (if still pending) with a DeliveryFailure naming what it asked.
  void fail_call(uint64_t id, const std::string& why) {
    if (id == 0) return;
    if (auto c = take_call(id)) {
      c->handler(detail::RemoteResult{
          {}, std::make_exception_ptr(DeliveryFailure(c->dest, c->endpoint, why))});
    }
  }

  // Throws UsageError for a malformed address or an oversize message (the caller's mistake).
  void send(const std::string& to, const RemoteHeader& h, channel::Bytes payload) {
    send_encoded(to, h.dest, h.endpoint, wire::encode(h), std::move(payload));
  }
  void send_encoded(const std::string& to, const ActorId& dest, const std::string& endpoint,
                    channel::Bytes header, channel::Bytes payload) {
    channel::Message m;
    m.parts.push_back(std::move(header));
    m.parts.push_back(std::move(payload));
    try {
      sender_for(to, dest, endpoint)->send(std::move(m));
    } catch (const channel::ChannelError& e) {
      throw UsageError(e.what());
    }
  }

  // Sends the reply to a Call/Lookup/Stop. A reply larger than this Proc's max_frame_bytes or the
  // caller's (ReplyTo::limit) is replaced by a DeliveryFailure naming the actor, the endpoint and
  // the limit, so the caller's future fails instead of never completing (REM-1). A reply to a proc
  // that is gone by design (forget) or declared failed is dropped with a debug log.
  void reply(const ReplyTo& to, detail::RemoteResult&& r) {
    if (is_gone(to.proc)) {
      spdlog::debug("monarch: {}: reply (request {}) to proc {} dropped: it was stopped", address,
                    to.request, to.proc);
      return;
    }
    RemoteHeader h;
    h.kind = RemoteKind::Reply;
    h.request_id = to.request;
    if (r.error) h.error = detail::WireError::from(r.error);
    channel::Bytes header = wire::encode(h);
    const bool theirs = to.limit != 0 && to.limit < opts.max_frame_bytes;
    const uint64_t limit = theirs ? to.limit : opts.max_frame_bytes;
    const uint64_t size = header.size() + r.payload.size();
    if (size > limit) {
      std::string why = "reply of " + std::to_string(size) + " bytes exceeds " +
                        (theirs ? "the caller's channel.max_frame_bytes (" + std::to_string(limit) +
                                      ", proc " + to.proc + ")"
                                : "channel.max_frame_bytes (" + std::to_string(limit) +
                                      ") of the replying proc " + address);
      DeliveryFailure f(to.actor, to.what(), why);
      spdlog::debug("monarch: {}: reply (request {}) replaced by an error: {}", address, to.request,
                    f.what());
      h.error = detail::WireError::from(std::make_exception_ptr(f));
      header = wire::encode(h);
      r.payload.clear();
      r.payload.shrink_to_fit();
    }
    try {
      send_encoded(to.proc, to.actor, to.endpoint, std::move(header), std::move(r.payload));
    } catch (const std::exception& e) {
      if (is_failed(to.proc) || is_gone(to.proc)) {
        spdlog::debug("monarch: {}: reply to {} dropped: {}", address, to.proc, e.what());
      } else {
        spdlog::warn("monarch: {}: reply (request {}) to {} lost: {}", address, to.request, to.proc,
                     e.what());
      }
    }
  }

  void bounce_to_sender(const std::string& to, const ActorId& sender, const DeliveryFailure& f) {
    RemoteHeader h;
    h.kind = RemoteKind::Bounce;
    h.sender = sender;
    h.error = detail::WireError::from(std::make_exception_ptr(f));
    try {
      send(to, h, {});
    } catch (const std::exception& e) {
      spdlog::warn("monarch: undeliverable report to {} lost: {}", to, e.what());
    }
  }

  // The endpoint label of a DeliveryFailure for a message this Proc sent: a port send names its
  // port (PortId::label, as the receiving Proc's own report does), anything else its endpoint.
  static std::string what_was_sent(const RemoteHeader& h) {
    if (h.kind == RemoteKind::PortSend) return PortId::label(h.request_id);
    return h.endpoint;
  }

  // A message this Proc sent could not be delivered (channel failure: CH-3, CH-4).
  // `quiet`: the link was closed by forget(): the peer is gone by design.
  void on_returned(channel::Message&& m, const std::string& to, const std::string& why,
                   bool quiet) {
    {
      std::lock_guard lock(mu);
      if (closed) {  // this Proc is shutting down: its actors are gone; pending calls already
                     // failed
        spdlog::debug("monarch: {}: message returned during shutdown: {}", address, why);
        return;
      }
    }
    RemoteHeader h;
    try {
      h = wire::decode<RemoteHeader>(m.parts.at(0));
    } catch (const std::exception& e) {
      spdlog::error("monarch: returned message has a bad header: {}", e.what());
      return;
    }
    DeliveryFailure f(h.dest, what_was_sent(h), why);
    if (quiet) {
      // REM-1 still holds for calls (one outcome); the rest is dropped: its receiver went away
      // when asked to, so its sender learns nothing it did not ask for.
      if ((h.kind == RemoteKind::Call || h.kind == RemoteKind::Lookup ||
           h.kind == RemoteKind::Stop) &&
          h.request_id != 0) {
        return fail_call(h.request_id, why);
      }
      spdlog::debug("monarch: {}: message to forgotten proc {} dropped: {}", address, to, why);
      return;
    }
    bool spawn_or_send =
        h.kind == RemoteKind::Spawn || h.kind == RemoteKind::Send || h.kind == RemoteKind::PortSend;
    if (spawn_or_send) {
      if (auto cause = failure_of(h.dest.proc)) {
        // REM-6: the proc was declared failed. A send from an actor comes back to that actor as a
        // DeliveryFailure naming the failure (its undeliverable() decides), unless that actor owns
        // the proc's mesh: the mesh layer has reported that very failure to it (MeshFailure), as
        // it has to code outside actors, so neither hears of it a second time (local_bounce). A
        // spawn's failure is the mesh's to report.
        DeliveryFailure lost(h.dest, what_was_sent(h), "its proc was declared failed: " + *cause);
        if (h.kind != RemoteKind::Spawn && h.sender.uid != 0) return return_report(h, lost);
        spdlog::debug("monarch: {}: dropped: {}", address, lost.what());
        return;
      }
    }
    switch (h.kind) {
      case RemoteKind::Call:
      case RemoteKind::Lookup:
      case RemoteKind::Stop:
        return fail_call(h.request_id, why);
      case RemoteKind::Send:
      case RemoteKind::PortSend:
        return return_report(h, f);
      case RemoteKind::Spawn:
        return deliver_event(h.sender,
                             std::make_shared<const ActorSupervisionEvent>(ActorSupervisionEvent{
                                 h.dest, detail::type_of_key(h.endpoint),
                                 "spawn in proc " + h.dest.proc + " failed: " + why, nullptr}));
      case RemoteKind::Supervise: {
        std::shared_ptr<const ActorSupervisionEvent> ev;
        try {
          ev = detail::decode_event(m.parts.at(1));
        } catch (const std::exception& e) {
          spdlog::error("monarch: returned supervision event is malformed: {}", e.what());
          return;
        }
        return owner_unreachable(h.dest, ev, why);
      }
      default:
        // A reply (or an undeliverable report) to a caller's proc. If the mesh layer declared that
        // proc failed, its callers are gone and it was reported already (REM-5); if this Proc was
        // told it is gone by design (forget: stopped with this one, or by its owner), its callers
        // were stopped.
        if (is_failed(to) || is_gone(to)) {
          spdlog::debug("monarch: {}: {} (request {}) to {} proc {} dropped: {}", address,
                        h.kind == RemoteKind::Reply ? "reply" : "report", h.request_id,
                        is_failed(to) ? "failed" : "stopped", to, why);
        } else {
          spdlog::warn("monarch: {} (request {}) to proc {} lost: {}",
                       h.kind == RemoteKind::Reply ? "reply" : "report", h.request_id, to, why);
        }
    }
  }

  // A Send this Proc made on behalf of an actor of another Proc (a comm actor relaying a
  // broadcast, ReportTo) reports there; any other goes to the local sender (REM-2).
  void return_report(const RemoteHeader& h, const DeliveryFailure& f) {
    if (!h.reply_proc.empty() && h.reply_proc != address)
      return bounce_to_sender(h.reply_proc, h.sender, f);
    local_bounce(h.sender, f);
  }

  // Routes f to the local actor that sent the message (REM-2), unless it was lost on a proc whose
  // failure that sender hears of anyway (REM-6, failure_reported_to).
  void local_bounce(const ActorId& sender, const DeliveryFailure& f) {
    if (failure_reported_to(sender, f.destination().proc)) {
      spdlog::debug("monarch: {}: report dropped (its proc's failure was reported to {}): {}",
                    address, sender.uid == 0 ? std::string("the client") : sender.to_string(),
                    f.what());
      return;
    }
    if (sender.uid != 0 && sender.proc != address && bounce_in_sender_proc(sender, f)) return;
    detail::CellPtr c = sender.uid != 0 ? proc->find(sender) : detail::CellPtr();
    if (sender.uid != 0 && !c) {
      // The sending actor stopped or failed before its report came back: no one is left to tell,
      // as when its mailbox closes with the report in it (UndeliverableEnvelope). Not this
      // Proc's fault hook: that would fail the whole proc for an actor that is gone.
      return detail::log_report_for_stopped_sender(sender, f);
    }
    detail::route_undeliverable(c.get(), proc, f);
  }

  // A report for an actor of another Proc of this process, which sent its message through this
  // one (a mesh's casts go through the Proc that spawned its procs: on a worker, its HostMesh
  // client Proc, not the Proc of the actor that owns the mesh). Routes it as that Proc's
  // local_bounce would and returns true; false when no Proc of this process has that address or
  // that actor (the report then goes to this Proc's fault hook, as for a sender that stopped).
  bool bounce_in_sender_proc(const ActorId& sender, const DeliveryFailure& f);

  // A supervision event for `owner`, an actor of this Proc (or its client: uid 0).
  void deliver_event(const ActorId& owner, std::shared_ptr<const ActorSupervisionEvent> ev) {
    if (owner.uid == 0) return proc->on_root_event(*ev);
    detail::CellPtr c = proc->find(owner);
    if (!c) {
      spdlog::error("monarch: supervision event for {} lost (owner gone): {}", owner.to_string(),
                    ev->to_string());
      return;
    }
    detail::post_child_event(c.get(), std::move(ev));
  }

  // A remotely spawned actor of this Proc failed: its owner hears it in its own Proc (SUP-R1).
  void send_event(const ActorId& owner, std::shared_ptr<const ActorSupervisionEvent> ev) {
    RemoteHeader h;
    h.kind = RemoteKind::Supervise;
    h.dest = owner;
    h.reply_proc = address;
    h.sender = ev->actor;
    try {
      send(owner.proc, h, detail::encode_event(*ev));
    } catch (const std::exception& e) {
      owner_unreachable(owner, ev, e.what());
    }
  }

  // SUP-R3: the owner cannot hear the failure: log it, then this Proc's fault hook decides.
  void owner_unreachable(const ActorId& owner,
                         const std::shared_ptr<const ActorSupervisionEvent>& ev,
                         const std::string& why) {
    spdlog::error(
        "monarch: cannot report the failure of {} to its owner {} ({}); using the fault "
        "hook of proc {}",
        ev->actor.to_string(), owner.to_string(), why, address);
    proc->on_root_event(*ev);
  }

  // SPAWN-1: handled inline on the io thread, so later messages on the same link find the actor.
  void on_spawn(const RemoteHeader& h, channel::Bytes payload) {
    std::string type = detail::type_of_key(h.endpoint);
    auto refuse = [&](const std::string& cause) {
      std::string why =
          "spawn of " + type + " '" + h.dest.name + "' in proc " + address + " failed: " + cause;
      add_tombstone(h.dest.uid, why);
      send_event(h.sender, std::make_shared<const ActorSupervisionEvent>(
                               ActorSupervisionEvent{h.dest, type, why, nullptr}));
    };
    if (h.dest.proc != address) return refuse("it was addressed to proc " + h.dest.proc);
    if ((h.dest.uid & detail::kRemoteSpawnBit) == 0)
      return refuse("bad uid " + std::to_string(h.dest.uid));
    const detail::RemoteFactory* f = detail::find_remote_factory(h.endpoint);
    if (f == nullptr) {
      return refuse("no factory for " + h.endpoint +
                    " in this binary (it must contain a spawn_remote<" + type +
                    ">(...) call with these argument types)");
    }
    detail::Cell::Factory make;
    try {
      make = f->decode(payload);
    } catch (...) {
      return refuse("cannot decode constructor arguments: " +
                    detail::describe_exception(std::current_exception()));
    }
    std::shared_ptr<const ndslice::Point> point;  // a member of an ActorMesh (ProcMesh::spawn)
    if (h.message_rank != UINT64_MAX) {
      try {
        ndslice::Extent extent(h.spawn_labels,
                               std::vector<size_t>(h.spawn_sizes.begin(), h.spawn_sizes.end()));
        point = std::make_shared<const ndslice::Point>(extent.point(h.message_rank));
      } catch (...) {
        return refuse("bad mesh point (rank " + std::to_string(h.message_rank) +
                      "): " + detail::describe_exception(std::current_exception()));
      }
    }
    try {
      detail::CellPtr::adopt(detail::spawn_remote_cell(*proc, h.dest, f->type, std::move(make),
                                                       h.sender, std::move(point)));
    } catch (...) {
      refuse(detail::describe_exception(std::current_exception()));
    }
  }

  void on_supervise(const RemoteHeader& h, const channel::Bytes& payload) {
    std::shared_ptr<const ActorSupervisionEvent> ev;
    try {
      ev = detail::decode_event(payload);
    } catch (const std::exception& e) {
      spdlog::error("monarch: dropping a malformed supervision event from {}: {}", h.reply_proc,
                    e.what());
      return;
    }
    deliver_event(h.dest, std::move(ev));
  }

  // Stop/kill of a local actor asked by another Proc; replied to once it is Stopped or Failed
  // (an unknown actor is stopped already).
  void on_stop(const RemoteHeader& h) {
    if (h.request_id != 0) heard_from(h.reply_proc);
    detail::CellPtr c = proc->find(h.dest);
    if (!c) {
      if (h.request_id != 0) reply(ReplyTo::of(h), detail::RemoteResult{});
      return;
    }
    auto done = c->request_stop(h.endpoint == "kill");
    if (h.request_id == 0) return;
    done.on_complete(
        [this, to = ReplyTo::of(h)](detail::State<void>&) { reply(to, detail::RemoteResult{}); });
  }

  // A message from another Proc (io thread).
  void on_message(channel::Message&& m) {
    wait_started();
    if (m.parts.empty()) return;
    RemoteHeader h;
    try {
      h = wire::decode<RemoteHeader>(m.parts[0]);
    } catch (const std::exception& e) {
      spdlog::warn("monarch: dropping a remote message with a bad header: {}", e.what());
      return;
    }
    channel::Bytes payload = m.parts.size() > 1 ? std::move(m.parts[1]) : channel::Bytes{};
    detail::DecodingScope scope(proc);
    switch (h.kind) {
      case RemoteKind::Call:
      case RemoteKind::Send:
        return on_request(h, std::move(payload));
      case RemoteKind::Reply: {
        auto r = take_pending(h.request_id);
        if (!r) return;
        detail::RemoteResult res;
        res.payload = std::move(payload);
        if (h.error.kind != 0) res.error = h.error.to_exception_ptr();
        return r(std::move(res));
      }
      case RemoteKind::Bounce: {
        auto f = h.error.to_exception_ptr();
        try {
          std::rethrow_exception(f);
        } catch (const DeliveryFailure& d) {
          // REM-6 holds for reports a relay forwards too (CAST-9): local_bounce drops a loss on a
          // proc whose failure was reported to the caster already.
          return local_bounce(h.sender, d);
        } catch (...) {
          return;
        }
      }
      case RemoteKind::Lookup:
        return on_lookup(h);
      case RemoteKind::PortSend:
        return on_port_send(h, std::move(payload));
      case RemoteKind::Spawn:
        return on_spawn(h, std::move(payload));
      case RemoteKind::Supervise:
        return on_supervise(h, payload);
      case RemoteKind::Stop:
        return on_stop(h);
    }
  }

  void on_port_send(const RemoteHeader& h, channel::Bytes payload) {
    detail::PortBytesDeliver deliver;
    {
      std::lock_guard lock(mu);
      auto it = ports.find(h.request_id);
      if (it != ports.end()) {
        if (it->second.sink.expired()) {
          ports.erase(it);
        } else {
          deliver = it->second.deliver;
        }
      }
    }
    std::string why = "port closed";
    try {
      if (deliver && deliver(payload)) return;
    } catch (const std::exception& e) {
      why = std::string("cannot deliver to port: ") + e.what();
    }
    bounce_to_sender(h.reply_proc, h.sender, DeliveryFailure(h.dest, what_was_sent(h), why));
  }

  void on_request(const RemoteHeader& h, channel::Bytes payload) {
    bool is_call = h.kind == RemoteKind::Call;
    if (is_call) heard_from(h.reply_proc);
    auto fail = [&](const DeliveryFailure& f) {
      if (is_call)
        return reply(ReplyTo::of(h), detail::RemoteResult{{}, std::make_exception_ptr(f)});
      bounce_to_sender(h.reply_proc, h.sender, f);
    };
    detail::CellPtr c = proc->find(h.dest);
    if (!c) return fail(proc->gone_actor_failure(h.dest, h.endpoint));
    auto inv = detail::find_invoker(c->type(), h.endpoint);
    if (!inv) {
      return fail(DeliveryFailure(h.dest, h.endpoint,
                                  "actor type " + c->cpp_type_name() +
                                      " has no registered endpoint '" + h.endpoint +
                                      "' (MONARCH_ENDPOINTS)"));
    }
    detail::RemoteRequest req;
    req.payload = std::move(payload);
    req.is_call = is_call;
    req.message_rank = static_cast<size_t>(h.message_rank);
    std::string to = h.reply_proc;
    ActorId sender = h.sender;
    if (is_call) {
      ReplyTo reply_to = ReplyTo::of(h);
      reply_to.type = c->type();
      req.reply = [this, rt = std::move(reply_to)](detail::RemoteResult&& r) {
        reply(rt, std::move(r));
      };
    }
    req.bounce_send = [this, to, sender](const DeliveryFailure& f) {
      bounce_to_sender(to, sender, f);
    };
    try {
      (*inv)(*c.get(), std::move(req));
    } catch (const std::exception& e) {
      fail(
          DeliveryFailure(h.dest, h.endpoint, std::string("cannot decode arguments: ") + e.what()));
    }
  }

  void on_lookup(const RemoteHeader& h) {
    heard_from(h.reply_proc);
    detail::RemoteResult r;
    try {
      std::lock_guard lock(proc->mu_);
      auto it = proc->names_.find(h.dest.name);
      if (it == proc->names_.end()) {
        throw UsageError("proc " + address + " has no actor registered as '" + h.dest.name + "'");
      }
      if (it->second->cpp_type_name() != h.endpoint) {
        throw UsageError("actor '" + h.dest.name + "' in " + address + " is a " +
                         it->second->cpp_type_name() + ", not a " + h.endpoint);
      }
      r.payload = wire::encode(it->second->id());
    } catch (...) {
      r.error = std::current_exception();
    }
    ReplyTo to = ReplyTo::of(h);
    to.actor = ActorId{address, h.dest.name, 0};
    to.endpoint = "lookup<" + h.endpoint + ">";
    reply(to, std::move(r));
  }

  void shutdown(std::chrono::milliseconds flush_timeout) {
    // Let what was already sent reach its destination (acknowledged) before closing the links.
    auto deadline = std::chrono::steady_clock::now() + flush_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t pending_msgs = 0;
      {
        std::lock_guard lock(mu);
        for (auto& [addr, s] : senders) pending_msgs += s->closed() ? 0 : s->pending();
      }
      if (pending_msgs == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::unordered_map<uint64_t, PendingCall> left;
    std::unordered_map<std::string, std::shared_ptr<channel::Sender>> links;
    {
      std::lock_guard lock(mu);
      closed = true;
      left.swap(pending);
      links.swap(senders);
      forgotten.clear();
    }
    listener.reset();
    links.clear();
    io.reset();
    for (auto& [id, call] : left) {
      call.handler(
          detail::RemoteResult{{},
                               std::make_exception_ptr(DeliveryFailure(
                                   call.dest, call.endpoint, "proc " + address + " shut down"))});
    }
  }
};

}  // namespace monarch
