// The in-process transport: a registry of named listeners; delivery is a post to the io thread.
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "channel_internal.hpp"

namespace monarch::channel::detail {

namespace {

struct InprocListener;
std::mutex g_inproc_mu;
std::unordered_map<std::string, std::weak_ptr<InprocListener>> g_inproc;

struct InprocListener final : Listener {
  ChannelAddr addr;
  std::shared_ptr<Listener::Handler> handler;
  ~InprocListener() override {
    std::lock_guard lock(g_inproc_mu);
    g_inproc.erase(addr.name);
  }
  ChannelAddr bound_addr() const override { return addr; }
  size_t rejected_connections() const override { return 0; }
};

struct InprocSender final : Sender {
  asio::io_context& ctx;
  ChannelAddr target;
  ChannelOptions opt;
  FailureHandler on_failure;
  std::atomic<bool> is_closed{false};
  InprocSender(asio::io_context& c, ChannelAddr a, ChannelOptions o, FailureHandler f)
      : ctx(c), target(std::move(a)), opt(std::move(o)), on_failure(std::move(f)) {}

  void send(Message m) override {
    if (m.size_bytes() > opt.max_frame_bytes) {
      throw ChannelError("message of " + std::to_string(m.size_bytes()) +
                         " bytes exceeds max_frame_bytes " + std::to_string(opt.max_frame_bytes) +
                         " (to " + target.to_string() + ")");
    }
    std::shared_ptr<Listener::Handler> h;
    {
      std::lock_guard lock(g_inproc_mu);
      auto it = g_inproc.find(target.name);
      if (it != g_inproc.end()) {
        if (auto l = it->second.lock()) h = l->handler;
      }
    }
    for (auto& sp : m.shared_parts)
      m.parts.emplace_back(sp.bytes.begin(), sp.bytes.end());  // receivers own parts
    m.shared_parts.clear();
    std::string why = is_closed ? "link closed" : "no inproc listener named '" + target.name + "'";
    asio::post(ctx, [h, m = std::move(m), fail = on_failure, why]() mutable {
      if (h) return (*h)(std::move(m));
      if (fail) fail(std::move(m), why);
    });
  }
  size_t pending() const override { return 0; }
  bool closed() const override { return is_closed; }
  std::string last_connection_error() const override { return {}; }
  const ChannelAddr& addr() const override { return target; }
  void close_quietly(const std::string& why) override { close(why); }
  void close(const std::string& why) override {
    is_closed = true;
    std::function<void(const std::string&)> h;
    {
      std::lock_guard lock(mu);
      h = std::move(close_handler);
    }
    if (h) asio::post(ctx, [h, why] { h(why); });
  }
  void on_close(std::function<void(const std::string&)> f) override {
    std::lock_guard lock(mu);
    close_handler = std::move(f);
  }
  std::mutex mu;
  std::function<void(const std::string&)> close_handler;
};

}  // namespace

std::unique_ptr<Listener> serve_inproc(const ChannelAddr& addr, Listener::Handler handler) {
  auto l = std::make_shared<InprocListener>();
  l->addr = addr;
  l->handler = std::make_shared<Listener::Handler>(std::move(handler));
  std::lock_guard lock(g_inproc_mu);
  auto& slot = g_inproc[addr.name];
  if (!slot.expired()) throw ChannelError("inproc address " + addr.to_string() + " already in use");
  slot = l;
  // The registry holds a weak reference; the caller owns the listener.
  struct Owner final : Listener {
    std::shared_ptr<InprocListener> l;
    ChannelAddr bound_addr() const override { return l->bound_addr(); }
    size_t rejected_connections() const override { return 0; }
  };
  auto o = std::make_unique<Owner>();
  o->l = std::move(l);
  return o;
}

std::shared_ptr<Sender> connect_inproc(asio::io_context& ctx, const ChannelAddr& target,
                                       ChannelOptions options, Sender::FailureHandler on_failure) {
  return std::make_shared<InprocSender>(ctx, target, std::move(options), std::move(on_failure));
}

}  // namespace monarch::channel::detail
