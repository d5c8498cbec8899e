// Actor messages across processes over channels (see include/monarch/actor/remote.hpp).
//
// REM-1 A remote Call gets exactly one outcome: the reply, the handler's ActorError, or a
//       DeliveryFailure (unknown actor, unregistered endpoint, channel failure, Proc shut down,
//       a reply over max_frame_bytes of the replier or of the caller) naming the actor and what
//       was called.
// REM-2 A remote Send that cannot be delivered comes back to the sending actor's undeliverable()
//       (or the sending Proc's fault hook from outside actors), as for a local send; if that
//       actor has stopped or failed meanwhile, the report is logged (not the fault hook's).
// REM-3 Messages from one sender to one remote actor keep their order: one channel link per
//       destination Proc (CH-1), then the destination's mailbox (CELL-3).
// REM-4 A stop/kill of a remote actor returns a Future at once; it completes when the actor is
//       Stopped or Failed there, or fails (DeliveryFailure, SupervisionError): never blocks.
// REM-5 After declare_proc_failed(addr): every call pending on addr has failed with
//       SupervisionError, and every later call/send/stop/spawn to addr fails with it at once.
// REM-6 declare_proc_failed(addr) closes the link to addr at once: calls pending there fail with
//       SupervisionError (REM-5), and sends from actors still unacknowledged on it come back to
//       their sending actor's undeliverable() as DeliveryFailures naming that failure, except
//       to the actor that owns addr's mesh (declare_proc_failed's owner), which hears that
//       failure as a MeshFailure; nor from outside actors, for the same reason.
// SPAWN-1 The receiving Proc creates a remotely spawned actor while reading the Spawn message
//       (io thread), before it reads the next message on that link: with REM-3 and CELL-2,
//       messages sent on the ref right after spawn_remote run after construction and init().
// SPAWN-2 A spawn that cannot succeed (no factory, bad arguments, uid taken, throwing
//       constructor/init, unreachable Proc) reaches the owner as a supervision event; messages to
//       the actor then fail with a DeliveryFailure saying why (tombstone), never hang.
// SUP-R1 A remotely spawned actor's failure goes to its owner's supervise() in the owner's Proc
//       (or that Proc's fault hook when the owner is its client), never to the worker's hook.
// SUP-R3 If the owner cannot be told (link closed, proc failed), the worker logs it and its own
//       fault hook decides.
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

DecodingScope::DecodingScope(Proc* p) : prev(tls_decoding) {
  tls_decoding = p;
}
DecodingScope::~DecodingScope() {
  tls_decoding = prev;
}

std::shared_ptr<RemoteInvoker> find_invoker(std::type_index type, const std::string& endpoint) {
  std::lock_guard lock(g_invokers_mu);
  auto t = g_invokers.find(type);
  if (t == g_invokers.end()) return nullptr;
  auto e = t->second.find(endpoint);
  return e == t->second.end() ? nullptr : e->second;
}

Proc* decoding_proc() noexcept {
  return tls_decoding;
}

namespace {
std::mutex& factories_mu() {
  static std::mutex mu;
  return mu;
}
// Function-local: filled during static initialisation of other translation units.
std::unordered_map<std::string, std::unique_ptr<RemoteFactory>>& factories() {
  static std::unordered_map<std::string, std::unique_ptr<RemoteFactory>> m;
  return m;
}
}  // namespace

bool add_remote_factory(const std::string& key, RemoteFactory factory) {
  std::lock_guard lock(factories_mu());
  factories().try_emplace(key, std::make_unique<RemoteFactory>(std::move(factory)));
  return true;
}

const RemoteFactory* find_remote_factory(const std::string& key) {
  std::lock_guard lock(factories_mu());
  auto it = factories().find(key);
  return it == factories().end() ? nullptr : it->second.get();
}

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
    w = WireError{static_cast<uint8_t>(x.actor_failed() ? 6 : 2), x.destination(), x.endpoint(),
                  x.reason()};
  } catch (const SupervisionError& x) {
    w = WireError{5, x.actor(), {}, x.cause()};
  } catch (const UsageError& x) {
    w = WireError{3, {}, {}, x.what()};
  } catch (const Error& x) {
    w = WireError{4, {}, {}, describe_exception(e), static_cast<uint16_t>(x.code())};
  } catch (...) {
    w = WireError{4, {}, {}, describe_exception(e)};
  }
  return w;
}

std::exception_ptr WireError::to_exception_ptr() const {
  switch (kind) {
    case 1:
      return std::make_exception_ptr(ActorError(actor, endpoint, message));
    case 2:
    case 6:
      return std::make_exception_ptr(DeliveryFailure(actor, endpoint, message, kind == 6));
    case 3:
      return std::make_exception_ptr(UsageError(message));
    case 5:
      return std::make_exception_ptr(SupervisionError(actor, message));
    default:
      if (code == 0) return std::make_exception_ptr(Error(message));
      return std::make_exception_ptr(Error(static_cast<ErrorCode>(code), message));
  }
}

void WireError::rethrow() const {
  std::rethrow_exception(to_exception_ptr());
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------

namespace {
// The listening Procs of this process, by address (Remote::bounce_in_sender_proc). A Proc is in
// it from the end of start_remote() to the start of stop_remote(), while its cells and its Remote
// are alive. Never destroyed: a Proc may be destroyed by another static's destructor.
struct LocalProcs {
  std::mutex mu;
  std::unordered_map<std::string, Proc*> by_address;  // guarded by mu
};
LocalProcs& local_procs() {
  static auto* l = new LocalProcs;
  return *l;
}
}  // namespace

bool Proc::Remote::bounce_in_sender_proc(const ActorId& sender, const DeliveryFailure& f) {
  detail::CellPtr c;
  {
    auto& l = local_procs();
    std::lock_guard lock(l.mu);
    auto it = l.by_address.find(sender.proc);
    if (it == l.by_address.end() || it->second == proc) return false;
    Proc* p = it->second;
    if (p->remote_->failure_reported_to(sender, f.destination().proc)) {
      spdlog::debug(
          "monarch: {}: report for {} dropped (its proc's failure was reported to it): {}", address,
          sender.to_string(), f.what());
      return true;
    }
    c = p->find(sender);
  }
  if (!c) return false;
  detail::route_undeliverable(c.get(), nullptr, f);
  return true;
}

void Proc::start_remote() {
  if (options_.listen.empty()) return;
  remote_ = std::make_unique<Remote>();
  remote_->proc = this;
  remote_->opts = options_.channel;
  remote_->io = std::make_unique<channel::IoRuntime>();
  auto* r = remote_.get();
  // A peer may send as soon as we are bound (it may have learnt the address out of band), so
  // on_message waits for the address and name written below (Remote::wait_started).
  std::lock_guard hold(r->start_mu);
  remote_->listener = channel::Listener::serve(
      *remote_->io, channel::ChannelAddr::parse(options_.listen), options_.channel,
      [r](channel::Message&& m) { r->on_message(std::move(m)); });
  remote_->address = remote_->listener->bound_addr().to_string();
  options_.name = remote_->address;
  r->started.store(true, std::memory_order_release);
  auto& l = local_procs();
  std::lock_guard lock(l.mu);
  l.by_address[remote_->address] = this;
}

void Proc::stop_remote() {
  if (remote_) {
    auto& l = local_procs();
    std::lock_guard lock(l.mu);
    auto it = l.by_address.find(remote_->address);
    if (it != l.by_address.end() && it->second == this) l.by_address.erase(it);
  }
  if (remote_)
    remote_->shutdown(std::min<std::chrono::milliseconds>(options_.stop_timeout,
                                                          std::chrono::milliseconds(2000)));
}

void Proc::declare_proc_failed(const std::string& proc_addr, const std::string& cause,
                               const ActorId& owner) {
  if (remote_) remote_->declare_failed(proc_addr, cause, owner);
}

void Proc::forget_proc(const std::string& proc_addr, const std::string& why) {
  if (remote_) remote_->forget(proc_addr, why);
}

bool Proc::proc_failed(const std::string& proc_addr) const {
  return remote_ && remote_->is_failed(proc_addr);
}

std::optional<std::string> Proc::proc_failure(const std::string& proc_addr) const {
  if (!remote_ || remote_->failed_count.load(std::memory_order_acquire) == 0) return std::nullopt;
  return remote_->failure_of(proc_addr);
}

std::string Proc::link_error(const std::string& proc_addr) const {
  if (!remote_) return {};
  std::shared_ptr<channel::Sender> link;
  {
    std::lock_guard lock(remote_->mu);
    auto it = remote_->senders.find(proc_addr);
    if (it == remote_->senders.end()) return {};
    link = it->second;
  }
  return link->last_connection_error();
}

size_t Proc::failed_proc_count() const noexcept {
  return remote_ ? remote_->failed_count.load(std::memory_order_acquire) : 0;
}

void Proc::forward_supervision(const ActorId& owner,
                               std::shared_ptr<const ActorSupervisionEvent> ev) {
  if (!remote_) return on_root_event(*ev);
  remote_->send_event(owner, std::move(ev));
}

void Proc::remember_failed_actor(const ActorSupervisionEvent& ev) {
  if (!remote_) return;  // in-process messages find no tombstones
  remote_->add_tombstone(ev.actor.uid,
                         "actor " + ev.actor_type + " '" + ev.actor.name + "' failed: " + ev.cause,
                         true);
}

DeliveryFailure Proc::gone_actor_failure(const ActorId& id, std::string endpoint) {
  auto t = remote_ ? remote_->tombstone(id.uid) : detail::Tombstone{};
  if (t.why.empty()) t.why = "unknown actor";
  return DeliveryFailure(id, std::move(endpoint), std::move(t.why), t.failed);
}

namespace detail {
DeliveryFailure gone_actor_failure(Proc* proc, const ActorId& id, std::string endpoint) {
  if (proc != nullptr && id.proc == proc->name())
    return proc->gone_actor_failure(id, std::move(endpoint));
  return DeliveryFailure(id, std::move(endpoint), "unknown actor");
}
}  // namespace detail

void Proc::stop_remote_child(const ActorId& id, bool kill) {
  if (!remote_) return;
  RemoteHeader h;
  h.kind = RemoteKind::Stop;
  h.dest = id;
  h.endpoint = kill ? "kill" : "stop";
  h.reply_proc = remote_->address;
  try {
    remote_->send(id.proc, h, {});
  } catch (const std::exception& e) {
    spdlog::debug("monarch: stop of remote child {} not sent: {}", id.to_string(), e.what());
  }
}

std::string Proc::address() const {
  return remote_ ? remote_->address : std::string();
}

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
  uint64_t id = r.add_pending(ActorId{proc_addr, name, 0}, "lookup<" + type_name + ">",
                              [p = std::move(p)](detail::RemoteResult&& res) mutable {
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
  h.reply_limit = r.opts.max_frame_bytes;
  try {
    r.send(proc_addr, h, {});
  } catch (...) {
    if (auto handler = r.take_pending(id))
      handler(detail::RemoteResult{{}, std::current_exception()});
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

ActorId remote_spawn_id(Proc& proc, Cell* owner, const std::string& proc_addr, std::string name,
                        const std::string& key, Bytes args, const ndslice::Point* mesh_point) {
  auto& r = proc.remote();
  std::string addr;
  try {
    addr = channel::ChannelAddr::parse(proc_addr).to_string();  // the name that Proc goes by
  } catch (const std::exception& e) {
    throw UsageError("spawn_remote('" + name + "'): " + e.what());
  }
  RemoteHeader h;
  h.kind = RemoteKind::Spawn;
  h.dest = ActorId{addr, std::move(name), r.next_spawn_uid()};
  h.endpoint = key;
  h.reply_proc = r.address;
  h.sender = owner != nullptr ? owner->id() : ActorId{r.address, "client", 0};
  if (mesh_point != nullptr) {
    h.message_rank = mesh_point->rank();
    h.spawn_labels = mesh_point->extent().labels();
    const auto& sizes = mesh_point->extent().sizes();
    h.spawn_sizes.assign(sizes.begin(), sizes.end());
  }
  r.send(addr, h, std::move(args));
  if (owner != nullptr) owner->add_remote_child(h.dest);
  return h.dest;
}

Future<void> remote_stop(Proc& proc, const ActorId& dest, bool kill) {
  Promise<void> p;
  auto f = p.get_future();
  auto& r = proc.remote();
  uint64_t id =
      r.add_pending(dest, kill ? "kill" : "stop", [p = std::move(p)](RemoteResult&& res) mutable {
        if (res.error) return p.set_error(res.error);
        p.set_value();
      });
  RemoteHeader h;
  h.kind = RemoteKind::Stop;
  h.dest = dest;
  h.endpoint = kill ? "kill" : "stop";
  h.reply_proc = r.address;
  h.request_id = id;
  h.reply_limit = r.opts.max_frame_bytes;
  try {
    r.send(dest.proc, h, {});
  } catch (...) {
    if (auto handler = r.take_pending(id)) handler(RemoteResult{{}, std::current_exception()});
  }
  return f;
}

void remote_dispatch(Proc& proc, const ActorId& dest, RemoteKind kind, const char* endpoint,
                     Bytes payload, ReplyHandler on_reply, size_t message_rank,
                     const ReportTo* report_to) {
  auto& r = proc.remote();
  RemoteHeader h;
  h.kind = kind;
  h.message_rank = message_rank;
  h.dest = dest;
  h.endpoint = endpoint;
  h.reply_proc = r.address;
  if (report_to != nullptr && kind == RemoteKind::Send) {
    // The receiver bounces to (reply_proc, sender); so does this Proc when the link returns the
    // message (Remote::return_report).
    h.reply_proc = report_to->proc;
    h.sender = report_to->sender;
  } else if (Cell* c = current_cell()) {
    h.sender = c->id();
  }
  if (kind == RemoteKind::Call) {
    h.request_id = r.add_pending(dest, endpoint, std::move(on_reply));
    h.reply_limit = r.opts.max_frame_bytes;
  }
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

void return_to_sender(Proc& proc, const ReportTo& to, const DeliveryFailure& f) noexcept {
  try {
    if (proc.options().listen.empty()) return route_undeliverable(nullptr, &proc, f);
    auto& r = proc.remote();
    if (to.proc.empty() || to.proc == r.address) return r.local_bounce(to.sender, f);
    r.bounce_to_sender(to.proc, to.sender, f);
  } catch (const std::exception& e) {
    spdlog::warn("monarch: undeliverable report for {} lost ({}): {}", to.sender.to_string(),
                 e.what(), f.what());
  }
}

}  // namespace detail
}  // namespace monarch
