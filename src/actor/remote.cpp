// Actor messages across processes over channels (see include/monarch/actor/remote.hpp).
//
// REM-1 A remote Call gets exactly one outcome: the reply, the handler's ActorError, or a
//       DeliveryFailure (unknown actor, unregistered endpoint, channel failure, Proc shut down).
// REM-2 A remote Send that cannot be delivered comes back to the sending actor's undeliverable()
//       (or the sending Proc's fault hook from outside actors), as for a local send.
// REM-3 Messages from one sender to one remote actor keep their order: one channel link per
//       destination Proc (CH-1), then the destination's mailbox (CELL-3).
#include <spdlog/spdlog.h>

#include <mutex>
#include <unordered_map>

#include "monarch/actor/proc.hpp"
#include "remote_state.hpp"
#include "runtime_internal.hpp"

namespace monarch {

namespace detail {

namespace {
thread_local Proc* tls_decoding = nullptr;
std::mutex g_invokers_mu;
std::unordered_map<std::type_index, std::unordered_map<std::string, std::shared_ptr<RemoteInvoker>>>
    g_invokers;

}  // namespace

DecodingScope::DecodingScope(Proc* p) : prev(tls_decoding) { tls_decoding = p; }
DecodingScope::~DecodingScope() { tls_decoding = prev; }

std::shared_ptr<RemoteInvoker> find_invoker(std::type_index type, const std::string& endpoint) {
  std::lock_guard lock(g_invokers_mu);
  auto t = g_invokers.find(type);
  if (t == g_invokers.end()) return nullptr;
  auto e = t->second.find(endpoint);
  return e == t->second.end() ? nullptr : e->second;
}

Proc* decoding_proc() noexcept { return tls_decoding; }

void add_remote_invoker(std::type_index type, std::string endpoint, RemoteInvoker inv) {
  std::lock_guard lock(g_invokers_mu);
  g_invokers[type][std::move(endpoint)] = std::make_shared<RemoteInvoker>(std::move(inv));
}

WireError WireError::from(const std::exception_ptr& e) {
  WireError w;
  try {
    std::rethrow_exception(e);
  } catch (const ActorError& x) {
    w = WireError{1, x.actor(), x.endpoint(), x.remote_message()};
  } catch (const DeliveryFailure& x) {
    w = WireError{2, x.destination(), x.endpoint(), x.reason()};
  } catch (const UsageError& x) {
    w = WireError{3, {}, {}, x.what()};
  } catch (...) {
    w = WireError{4, {}, {}, describe_exception(e)};
  }
  return w;
}

std::exception_ptr WireError::to_exception_ptr() const {
  switch (kind) {
    case 1: return std::make_exception_ptr(ActorError(actor, endpoint, message));
    case 2: return std::make_exception_ptr(DeliveryFailure(actor, endpoint, message));
    case 3: return std::make_exception_ptr(UsageError(message));
    default: return std::make_exception_ptr(Error(message));
  }
}

void WireError::rethrow() const { std::rethrow_exception(to_exception_ptr()); }

}  // namespace detail

// ---------------------------------------------------------------------------------------------

void Proc::start_remote() {
  if (options_.listen.empty()) return;
  remote_ = std::make_unique<Remote>();
  remote_->proc = this;
  remote_->opts = options_.channel;
  remote_->io = std::make_unique<channel::IoRuntime>();
  auto* r = remote_.get();
  remote_->listener = channel::Listener::serve(*remote_->io, channel::ChannelAddr::parse(options_.listen),
                                               options_.channel,
                                               [r](channel::Message&& m) { r->on_message(std::move(m)); });
  remote_->address = remote_->listener->bound_addr().to_string();
  options_.name = remote_->address;
}

void Proc::stop_remote() {
  if (remote_) remote_->shutdown(std::min<std::chrono::milliseconds>(options_.stop_timeout, std::chrono::milliseconds(2000)));
}

std::string Proc::address() const { return remote_ ? remote_->address : std::string(); }

Proc::Remote& Proc::remote() {
  if (!remote_) {
    throw UsageError("proc " + options_.name +
                     " does not listen (set ProcOptions::listen), so it cannot talk to actors in "
                     "other processes");
  }
  return *remote_;
}

Future<ActorId> Proc::remote_lookup_id(const std::string& proc_addr, const std::string& name,
                                       const std::string& type_name) {
  Promise<ActorId> p;
  auto f = p.get_future();
  auto& r = remote();
  uint64_t id = r.add_pending(proc_addr, [p = std::move(p)](detail::RemoteResult&& res) mutable {
    if (res.error) return p.set_error(res.error);
    try {
      p.set_value(wire::decode<ActorId>(res.payload));
    } catch (...) {
      p.set_error(std::current_exception());
    }
  });
  RemoteHeader h;
  h.kind = RemoteKind::Lookup;
  h.dest = ActorId{proc_addr, name, 0};
  h.endpoint = type_name;
  h.reply_proc = r.address;
  h.request_id = id;
  try {
    r.send(proc_addr, h, {});
  } catch (...) {
    if (auto handler = r.take_pending(id)) handler(detail::RemoteResult{{}, std::current_exception()});
  }
  return f;
}

namespace detail {

void export_port(Proc& proc, uint64_t index, std::weak_ptr<void> sink, std::type_index type,
                 PortBytesDeliver deliver) {
  auto& r = proc.remote();
  std::lock_guard lock(r.mu);
  r.ports[index] = Proc::Remote::Exported{std::move(sink), type, std::move(deliver)};
}

std::shared_ptr<void> find_exported_port(Proc& proc, uint64_t index, std::type_index type) {
  auto& r = proc.remote();
  std::lock_guard lock(r.mu);
  auto it = r.ports.find(index);
  if (it == r.ports.end() || it->second.type != type) return nullptr;
  return it->second.sink.lock();
}

void remote_port_send(Proc& proc, const PortId& id, std::vector<std::byte> payload) {
  auto& r = proc.remote();
  RemoteHeader h;
  h.kind = RemoteKind::PortSend;
  h.dest = id.owner;
  h.request_id = id.index;
  h.reply_proc = r.address;
  if (Cell* c = current_cell()) h.sender = c->id();
  r.send(id.owner.proc, h, std::move(payload));
}

void remote_dispatch(Proc& proc, const ActorId& dest, RemoteKind kind, const char* endpoint,
                     Bytes payload, ReplyHandler on_reply) {
  auto& r = proc.remote();
  RemoteHeader h;
  h.kind = kind;
  h.dest = dest;
  h.endpoint = endpoint;
  h.reply_proc = r.address;
  if (Cell* c = current_cell()) h.sender = c->id();
  if (kind == RemoteKind::Call) h.request_id = r.add_pending(dest.proc, std::move(on_reply));
  try {
    r.send(dest.proc, h, std::move(payload));
  } catch (...) {
    auto e = std::current_exception();
    if (kind == RemoteKind::Call) {
      if (auto handler = r.take_pending(h.request_id)) handler(RemoteResult{{}, e});
      return;
    }
    throw;
  }
}

}  // namespace detail
}  // namespace monarch
