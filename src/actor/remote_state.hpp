// Internal: the channel state of a listening Proc (Proc::Remote), shared by proc.cpp/remote.cpp.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "monarch/actor/proc.hpp"

namespace monarch {
namespace detail {
/// Sets decoding_proc() for the duration of a remote message's handling.
struct DecodingScope {
  Proc* prev;
  explicit DecodingScope(Proc* p);
  ~DecodingScope();
  DecodingScope(const DecodingScope&) = delete;
  DecodingScope& operator=(const DecodingScope&) = delete;
};
std::shared_ptr<RemoteInvoker> find_invoker(std::type_index type, const std::string& endpoint);
}  // namespace detail

using detail::RemoteHeader;
using detail::RemoteKind;

struct Proc::Remote {
  Proc* proc = nullptr;
  channel::ChannelOptions opts;
  std::unique_ptr<channel::IoRuntime> io;
  std::unique_ptr<channel::Listener> listener;
  std::string address;

  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<channel::Sender>> senders;
  struct PendingCall {
    std::string dest_proc;  // failed when the link to it closes (REM-1)
    detail::ReplyHandler handler;
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

  std::shared_ptr<channel::Sender> sender_for(const std::string& addr) {
    std::lock_guard lock(mu);
    if (closed) throw DeliveryFailure(ActorId{addr, "", 0}, "", "proc " + address + " shut down");
    auto it = senders.find(addr);
    if (it != senders.end() && !it->second->closed()) return it->second;
    // A closed link (CH-4) is replaced: the peer may be back. Parse first, so a bad address
    // leaves no entry behind.
    auto target = channel::ChannelAddr::parse(addr);
    auto s = channel::Sender::connect(
        *io, target, opts,
        [this](channel::Message&& m, const std::string& why) { on_returned(std::move(m), why); });
    s->on_close([this, addr](const std::string& why) { on_link_closed(addr, why); });
    senders[addr] = s;
    return s;
  }

  uint64_t add_pending(const std::string& dest_proc, detail::ReplyHandler h) {
    std::lock_guard lock(mu);
    uint64_t id = next_request++;
    pending.emplace(id, PendingCall{dest_proc, std::move(h)});
    return id;
  }

  // The link to `addr` closed (delivery timeout, peer unreachable): calls already delivered there
  // will never be answered, so they fail now instead of waiting forever (REM-1).
  void on_link_closed(const std::string& addr, const std::string& why) {
    std::vector<detail::ReplyHandler> lost;
    {
      std::lock_guard lock(mu);
      if (closed) return;
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.dest_proc == addr) {
          lost.push_back(std::move(it->second.handler));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& h : lost) {
      h(detail::RemoteResult{{}, std::make_exception_ptr(DeliveryFailure(
                                     ActorId{addr, "", 0}, "", "link to proc closed: " + why))});
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

  // Throws UsageError for a malformed address or an oversize message (the caller's mistake).
  void send(const std::string& to, const RemoteHeader& h, channel::Bytes payload) {
    channel::Message m;
    m.parts.push_back(wire::encode(h));
    m.parts.push_back(std::move(payload));
    try {
      sender_for(to)->send(std::move(m));
    } catch (const channel::ChannelError& e) {
      throw UsageError(e.what());
    }
  }

  void reply(const std::string& to, uint64_t request, detail::RemoteResult&& r) {
    RemoteHeader h;
    h.kind = RemoteKind::Reply;
    h.request_id = request;
    if (r.error) h.error = detail::WireError::from(r.error);
    try {
      send(to, h, std::move(r.payload));
    } catch (const std::exception& e) {
      spdlog::warn("monarch: reply to {} lost: {}", to, e.what());
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

  // A message this Proc sent could not be delivered (channel failure: CH-3, CH-4).
  void on_returned(channel::Message&& m, const std::string& why) {
    {
      std::lock_guard lock(mu);
      if (closed) {  // this Proc is shutting down: its actors are gone; pending calls already failed
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
    DeliveryFailure f(h.dest, h.endpoint, why);
    switch (h.kind) {
      case RemoteKind::Call:
      case RemoteKind::Lookup:
        if (auto r = take_pending(h.request_id)) r(detail::RemoteResult{{}, std::make_exception_ptr(f)});
        return;
      case RemoteKind::Send:
      case RemoteKind::PortSend: return local_bounce(h.sender, f);
      default: spdlog::warn("monarch: {} (a reply or report was lost)", f.what());
    }
  }

  // Routes f to the local actor that sent the message (REM-2).
  void local_bounce(const ActorId& sender, const DeliveryFailure& f) {
    detail::CellPtr c = sender.uid != 0 ? proc->find(sender) : detail::CellPtr();
    detail::route_undeliverable(c.get(), proc, f);
  }

  // A message from another Proc (io thread).
  void on_message(channel::Message&& m) {
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
      case RemoteKind::Send: return on_request(h, std::move(payload));
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
          return local_bounce(h.sender, d);
        } catch (...) {
          return;
        }
      }
      case RemoteKind::Lookup: return on_lookup(h);
      case RemoteKind::PortSend: return on_port_send(h, std::move(payload));
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
    bounce_to_sender(h.reply_proc, h.sender,
                     DeliveryFailure(h.dest, "port[" + std::to_string(h.request_id) + "]", why));
  }

  void on_request(const RemoteHeader& h, channel::Bytes payload) {
    bool is_call = h.kind == RemoteKind::Call;
    auto fail = [&](const DeliveryFailure& f) {
      if (is_call) return reply(h.reply_proc, h.request_id, detail::RemoteResult{{}, std::make_exception_ptr(f)});
      bounce_to_sender(h.reply_proc, h.sender, f);
    };
    detail::CellPtr c = proc->find(h.dest);
    if (!c) return fail(DeliveryFailure(h.dest, h.endpoint, "unknown actor"));
    auto inv = detail::find_invoker(c->type(), h.endpoint);
    if (!inv) {
      return fail(DeliveryFailure(h.dest, h.endpoint,
                                  "actor type " + c->type_name() + " has no registered endpoint '" +
                                      h.endpoint + "' (MONARCH_ENDPOINTS)"));
    }
    detail::RemoteRequest req;
    req.payload = std::move(payload);
    req.is_call = is_call;
    std::string to = h.reply_proc;
    uint64_t id = h.request_id;
    ActorId sender = h.sender;
    req.reply = [this, to, id](detail::RemoteResult&& r) { reply(to, id, std::move(r)); };
    req.bounce_send = [this, to, sender](const DeliveryFailure& f) { bounce_to_sender(to, sender, f); };
    try {
      (*inv)(*c.get(), std::move(req));
    } catch (const std::exception& e) {
      fail(DeliveryFailure(h.dest, h.endpoint, std::string("cannot decode arguments: ") + e.what()));
    }
  }

  void on_lookup(const RemoteHeader& h) {
    detail::RemoteResult r;
    try {
      std::lock_guard lock(proc->mu_);
      auto it = proc->names_.find(h.dest.name);
      if (it == proc->names_.end()) {
        throw UsageError("proc " + address + " has no actor registered as '" + h.dest.name + "'");
      }
      if (it->second->type_name() != h.endpoint) {
        throw UsageError("actor '" + h.dest.name + "' in " + address + " is a " +
                         it->second->type_name() + ", not a " + h.endpoint);
      }
      r.payload = wire::encode(it->second->id());
    } catch (...) {
      r.error = std::current_exception();
    }
    reply(h.reply_proc, h.request_id, std::move(r));
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
    }
    listener.reset();
    links.clear();
    io.reset();
    for (auto& [id, call] : left) {
      call.handler(detail::RemoteResult{{}, std::make_exception_ptr(DeliveryFailure(
                                     ActorId{}, "", "proc " + address + " shut down"))});
    }
  }
};


}  // namespace monarch
