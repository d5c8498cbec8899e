// What both ends of a socket channel share (declared in channel_internal.hpp, which also describes
// the wire protocol), the process incarnation and IoRuntime.
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>

#include "channel_internal.hpp"

namespace monarch::channel {

using namespace detail;

std::string read_secret_file(const std::string& path, const std::string& label) {
  const std::string what = label + " '" + path + "'";
  std::error_code ec;
  // An ifstream opens a directory and reads nothing: it would be called empty.
  if (std::filesystem::is_directory(path, ec)) throw ChannelError(what + " is a directory");
  std::ifstream in(path);
  if (!in) throw ChannelError("cannot read " + what + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string secret = ss.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) throw ChannelError(what + " is empty");
  return secret;
}

std::string job_secret(const ChannelOptions& o) {
  if (!o.secret.empty()) return o.secret;
  if (const char* s = std::getenv("MONARCH_SECRET"); s != nullptr && *s != '\0') return s;
  if (const char* f = std::getenv("MONARCH_SECRET_FILE"); f != nullptr && *f != '\0')
    return read_secret_file(f, "MONARCH_SECRET_FILE");
  return {};
}

namespace detail {

uint64_t random64() {
  uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1) {
    std::random_device rd;
    v = (uint64_t{rd()} << 32) ^ rd();
  }
  return v == 0 ? 1 : v;
}

Bytes compute_hmac(const std::string& secret, const Bytes& nonce, uint64_t session,
                   uint64_t incarnation) {
  Bytes msg(nonce);
  auto append = [&](uint64_t v) {
    auto* p = reinterpret_cast<const std::byte*>(&v);
    msg.insert(msg.end(), p, p + sizeof v);
  };
  append(session);
  append(incarnation);
  Bytes out(EVP_MAX_MD_SIZE);
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
       reinterpret_cast<unsigned char*>(out.data()), &len);
  out.resize(len);
  return out;
}

Endpoint to_endpoint(asio::io_context& ctx, const ChannelAddr& a) {
  if (a.transport == Transport::Unix) {
    std::string path = a.abstract ? std::string(1, '\0') + a.name : a.name;
    return Endpoint(asio::local::stream_protocol::endpoint(path));
  }
  asio::ip::tcp::resolver resolver(ctx);
  asio::error_code ec;
  auto results = resolver.resolve(a.host, std::to_string(a.port), ec);
  if (ec || results.empty()) {
    throw ChannelError("cannot resolve host '" + a.host + "' of " + a.to_string() + ": " +
                       ec.message());
  }
  return Endpoint(results.begin()->endpoint());
}

wire::DecoderLimits limits_of(const ChannelOptions& o) {
  wire::DecoderLimits l;
  // The frame body also carries the part-length table.
  l.max_frame_bytes = o.max_frame_bytes + 4 * l.max_parts;
  return l;
}

FrameHeader header(FrameKind kind, uint64_t session, uint64_t incarnation, uint64_t seq) {
  FrameHeader h{};
  h.kind = kind;
  h.session_id = session;
  h.incarnation = incarnation;
  h.seq = seq;
  return h;
}

namespace {

// Encodes a frame's prefix (header + part-length table) for parts.
std::vector<std::byte> prefix_of(const FrameHeader& h, const std::vector<Bytes>& parts) {
  std::vector<std::span<const std::byte>> spans;
  spans.reserve(parts.size());
  for (const auto& p : parts) spans.emplace_back(p.data(), p.size());
  std::vector<std::byte> out;
  wire::encode_prefix(h, spans, out);
  return out;
}

}  // namespace

// asio::async_write's default completion condition (transfer_all) hands the socket at most
// 64 KiB per sendmsg: a 1 MiB part took 16 system calls and as many wake-ups of the reader.
// This one lets each sendmsg take everything that is left (the kernel takes what fits).
std::size_t whole_writes(const asio::error_code& ec, std::size_t) {
  return ec ? 0 : std::numeric_limits<std::size_t>::max();
}

// Unix-socket connections get ChannelOptions::unix_socket_buffer for both directions: with the
// default (~208 KiB) a 1 MiB message crossed in five writes, each waking the reader. TCP keeps
// the kernel's autotuning.
void size_unix_buffers(Socket& s, Transport t, const ChannelOptions& o) {
  if (t != Transport::Unix || o.unix_socket_buffer == 0) return;
  const int n = static_cast<int>(std::min<size_t>(o.unix_socket_buffer, 1u << 30));
  asio::error_code ignored;  // best effort: the kernel caps it at net.core.{w,r}mem_max
  s.set_option(asio::socket_base::send_buffer_size(n), ignored);
  s.set_option(asio::socket_base::receive_buffer_size(n), ignored);
}

awaitable<void> write_frame(Socket& s, const FrameHeader& h, const std::vector<Bytes>& parts) {
  auto prefix = prefix_of(h, parts);
  std::vector<asio::const_buffer> bufs;
  bufs.emplace_back(prefix.data(), prefix.size());
  for (const auto& p : parts) bufs.emplace_back(p.data(), p.size());
  co_await asio::async_write(s, bufs, whole_writes, use_awaitable);
}

bool write_frame_now(Socket& s, const FrameHeader& h) {
  auto prefix = prefix_of(h, {});
  asio::error_code ec;
  s.non_blocking(true, ec);
  if (ec) return false;
  size_t n = s.write_some(asio::buffer(prefix), ec);
  return !ec && n == prefix.size();
}

// Reads until the decoder yields one frame.
awaitable<wire::Frame> read_frame(Socket& s, wire::FrameDecoder& dec, std::vector<std::byte>& buf) {
  while (true) {
    if (auto f = dec.next()) co_return std::move(*f);
    size_t n = co_await s.async_read_some(asio::buffer(buf), use_awaitable);
    dec.feed(std::span<const std::byte>(buf.data(), n));
  }
}

}  // namespace detail

uint64_t process_incarnation() {
  static const uint64_t inc = random64();
  return inc;
}

// ---------------------------------------------------------------------------------------------
// IoRuntime

struct IoRuntime::Impl {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  std::thread thread;
};

namespace {
thread_local bool tls_io_thread = false;
}  // namespace

void log_to_stderr_by_default() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Also creates spdlog's registry before any of our threads starts: it is a lazily built
    // static inside the (uninstrumented) shared library, so racing to build it would be
    // invisible to TSan.
    auto current = spdlog::default_logger();
    if (!current || !current->name().empty() || current->sinks().size() != 1 ||
        dynamic_cast<spdlog::sinks::stdout_color_sink_mt*>(current->sinks()[0].get()) == nullptr)
      return;
    auto to_stderr = std::make_shared<spdlog::logger>(
        "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    to_stderr->set_level(current->level());
    to_stderr->flush_on(current->flush_level());
    spdlog::set_default_logger(std::move(to_stderr));
  });
}

IoRuntime::IoRuntime() : impl_(std::make_unique<Impl>()) {
  log_to_stderr_by_default();
  // asio's error categories are statics built on first use, and destroyed at exit in the reverse
  // order of construction. Built here, they outlive this runtime's thread (joined by the atexit
  // handlers and static destructors registered after this point), which reads them to fail a
  // pending operation.
  (void)asio::error::get_misc_category();
  (void)asio::error::get_netdb_category();
  (void)asio::error::get_addrinfo_category();
  impl_->thread = std::thread([this] {
    tls_io_thread = true;
    impl_->ctx.run();
  });
}

bool IoRuntime::on_io_thread() noexcept {
  return tls_io_thread;
}

IoRuntime::~IoRuntime() {
  impl_->guard.reset();
  impl_->ctx.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void* IoRuntime::context() {
  return &impl_->ctx;
}

IoRuntime& IoRuntime::shared() {
  static IoRuntime rt;
  return rt;
}

}  // namespace monarch::channel
