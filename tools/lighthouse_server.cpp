// `monarch lighthouse`: a standalone ft::Lighthouse (docs/ft.md, "The standalone lighthouse").
//
// Threads: the Lighthouse actor runs on the Proc's workers; the HTTP server runs on its own
// threads (cpp-httplib's pool) and reads the lighthouse only through actor calls
// (Lighthouse::status, Lighthouse::kill_replica) bounded by a deadline, so a slow page never
// blocks the actor and a frozen actor never hangs a request forever. The main thread waits for
// SIGTERM or SIGINT.
#include "lighthouse_server.hpp"

// cpp-httplib serves one connection per pool thread and, by default, listens with a backlog of 5.
#define CPPHTTPLIB_LISTEN_BACKLOG 128
#include <httplib.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "monarch/actor/proc.hpp"
#include "monarch/ft/lighthouse.hpp"

namespace monarch::tools {
namespace {

using json = nlohmann::json;

// The job secret as the channel layer finds it: the flag's file, $MONARCH_SECRET,
// $MONARCH_SECRET_FILE. Empty: none (then the kill endpoint is refused).
std::string job_secret(const std::string& secret_file) {
  if (!secret_file.empty()) return channel::read_secret_file(secret_file, "--secret-file");
  return channel::job_secret(channel::ChannelOptions{});
}

json to_json(const ft::LighthouseStatus& s) {
  json replicas = json::array();
  for (const auto& r : s.replicas) {
    replicas.push_back({{"replica_id", r.replica_id},
                        {"step", r.step},
                        {"heartbeat_age_ms", r.heartbeat_age_ms},
                        {"healthy", r.healthy},
                        {"pending", r.pending},
                        {"in_quorum", r.in_quorum}});
  }
  json changes = json::array();
  for (const auto& c : s.changes) {
    changes.push_back({{"quorum_id", c.quorum_id},
                       {"unix_ms", c.unix_ms},
                       {"max_step", c.max_step},
                       {"participants", c.participants},
                       {"healing", c.healing},
                       {"reason", c.reason}});
  }
  // The members of the current quorum that heal in it: its own change's healers (the record keeps
  // the last changes, so the current quorum's is there once one formed).
  std::vector<std::string> healing;
  for (const auto& c : s.changes) {
    if (c.quorum_id == s.quorum_id) healing = c.healing;
  }
  return {{"epoch", std::to_string(s.epoch)},
          {"quorum_id", s.quorum_id},
          {"max_step", s.max_step},
          {"members", s.members},
          {"healing", healing},
          {"replicas", replicas},
          {"pending", s.pending},
          {"waiting_for", s.waiting_for},
          {"heartbeat_timeout_ms", s.heartbeat_timeout_ms},
          {"recent_changes", changes}};
}

// A JSON response body. Strings from the request (a path, a replica id) need not be UTF-8:
// invalid bytes become U+FFFD instead of throwing out of a handler (which aborted the process:
// `GET /%ff`).
std::string json_body(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(json_body(json{{"error", message}}), "application/json");
}

// The replica id of a kill request's path ("/replica/ID/kill"), if it is one.
std::optional<std::string> kill_target(const std::string& path) {
  const std::string prefix = "/replica/", suffix = "/kill";
  if (path.rfind(prefix, 0) != 0 || path.size() <= prefix.size() + suffix.size() ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  std::string id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
  if (id.find('/') != std::string::npos) return std::nullopt;
  return id;
}

// No route takes this request: 405 (with Allow) on a path that exists, else 404.
void reply_no_route(const httplib::Request& req, httplib::Response& res) {
  const bool kill_path = kill_target(req.path).has_value();
  if (kill_path || req.path == "/" || req.path == "/status") {
    res.set_header("Allow", kill_path ? "POST" : "GET");
    reply_error(res, 405, "method " + req.method + " not allowed on " + req.path);
  } else {
    reply_error(res, 404, "no such path: " + req.path);
  }
}

// A replica group id as the managers send it: printable ASCII, no spaces or slashes.
bool plausible_replica_id(const std::string& id) {
  return std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 0x7f && c != '/'; });
}

// The status page: polls /status twice a second; no external resources.
constexpr const char* kPage = R"HTML(<!doctype html>
<html><head><meta charset="utf-8"><title>monarch lighthouse</title>
<style>
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; }
.bad { color: #b00; }
</style></head>
<body>
<h1>monarch lighthouse</h1>
<p>quorum <b id="quorum_id">?</b>, max step <b id="max_step">?</b>,
members: <span id="members"></span></p>
<p id="waiting"></p>
<h2>replica groups</h2>
<table><thead><tr><th>replica</th><th>step</th><th>heartbeat age (ms)</th><th>healthy</th>
<th>in quorum</th><th>pending</th></tr></thead><tbody id="replicas"></tbody></table>
<h2>recent quorum changes</h2>
<table><thead><tr><th>quorum id</th><th>time</th><th>max step</th><th>participants</th>
<th>reason</th></tr></thead><tbody id="changes"></tbody></table>
<p id="error" class="bad"></p>
<script>
function cell(row, text) { const td = document.createElement('td'); td.textContent = text; row.appendChild(td); }
function render(s) {
  document.getElementById('quorum_id').textContent = s.quorum_id;
  document.getElementById('max_step').textContent = s.max_step;
  document.getElementById('members').textContent =
    s.members.map(m => s.healing.includes(m) ? m + ' (healing)' : m).join(' ');
  document.getElementById('waiting').textContent = s.waiting_for ? 'waiting: ' + s.waiting_for : '';
  const rb = document.getElementById('replicas'); rb.replaceChildren();
  for (const r of s.replicas) {
    const tr = document.createElement('tr');
    if (!r.healthy) tr.className = 'bad';
    cell(tr, r.replica_id); cell(tr, r.step); cell(tr, r.heartbeat_age_ms);
    cell(tr, r.healthy ? 'yes' : 'no'); cell(tr, r.in_quorum ? 'yes' : 'no'); cell(tr, r.pending ? 'yes' : 'no');
    rb.appendChild(tr);
  }
  const cb = document.getElementById('changes'); cb.replaceChildren();
  for (const c of s.recent_changes.slice().reverse()) {
    const tr = document.createElement('tr');
    cell(tr, c.quorum_id); cell(tr, new Date(c.unix_ms).toISOString()); cell(tr, c.max_step);
    cell(tr, c.participants.map(p => c.healing.includes(p) ? p + ' (healing)' : p).join(' '));
    cell(tr, c.reason);
    cb.appendChild(tr);
  }
  document.getElementById('error').textContent = '';
}
function poll() {
  fetch('/status').then(r => r.json()).then(render)
    .catch(e => { document.getElementById('error').textContent = 'cannot read /status: ' + e; })
    .finally(() => setTimeout(poll, 500));
}
poll();
</script>
</body></html>
)HTML";

}  // namespace

int run_lighthouse(const LighthouseFlags& flags) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit it

  const auto beat = config::global().duration("ft.heartbeat_interval");
  if (flags.heartbeat_timeout.count() > 0 && flags.heartbeat_timeout < 2 * beat) {
    throw std::runtime_error(
        "--heartbeat-timeout-ms " + std::to_string(flags.heartbeat_timeout.count()) +
        " is below twice ft.heartbeat_interval (" + std::to_string(beat.count()) +
        " ms): every replica group would look dead between its heartbeats");
  }
  std::string secret = job_secret(flags.secret_file);
  std::string http_host = "127.0.0.1";
  int http_port = 0;
  if (!flags.http.empty()) {
    auto colon = flags.http.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw std::runtime_error("--http '" + flags.http + "': expected HOST:PORT");
    http_host = flags.http.substr(0, colon);
    // An IPv6 literal is written in brackets ([::1]:8080, as in a URL); the resolver takes it bare.
    if (http_host.size() > 2 && http_host.front() == '[' && http_host.back() == ']')
      http_host = http_host.substr(1, http_host.size() - 2);
    try {
      size_t used = 0;
      http_port = std::stoi(flags.http.substr(colon + 1), &used);
      if (used != flags.http.size() - colon - 1 || http_port < 0 || http_port > 65535)
        throw std::out_of_range("port");
    } catch (const std::exception&) {
      throw std::runtime_error("--http '" + flags.http + "': bad port");
    }
  }

  ProcOptions o;
  o.listen = flags.listen;
  if (!flags.secret_file.empty()) o.channel.secret = secret;
  Proc proc(o);
  proc.set_fault_hook([](const ActorSupervisionEvent& ev) {
    std::fprintf(stderr, "monarch lighthouse: %s\n", ev.to_string().c_str());
  });
  ft::LighthouseOptions lo;
  lo.min_replicas = flags.min_replicas;
  lo.join_timeout = flags.join_timeout;
  lo.heartbeat_timeout = flags.heartbeat_timeout;
  lo.recovery_wait = flags.recovery_wait.count() >= 0
                         ? flags.recovery_wait
                         : (flags.heartbeat_timeout.count() > 0
                                ? flags.heartbeat_timeout
                                : config::global().duration("ft.heartbeat_timeout"));
  auto lh = proc.spawn<ft::Lighthouse>(ft::kLighthouseName, lo);
  proc.register_name(ft::kLighthouseName, lh);

  const auto deadline = std::chrono::milliseconds(2000);
  httplib::Server http;
  // Each connection holds a pool thread while it sends its request. cpp-httplib's defaults (8
  // threads, 5 s to read, 5 s idle keep-alive) let a few connections that send half a request
  // keep the page and the kill endpoint down for tens of seconds (40 such connections: 40 s).
  // Here such a connection costs a thread for 1 s at most, and 32 threads serve at once.
  http.new_task_queue = [] { return new httplib::ThreadPool(32); };
  http.set_read_timeout(1, 0);
  http.set_keep_alive_timeout(1);
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kPage, "text/html; charset=utf-8");
  });
  http.Get("/status", [&](const httplib::Request&, httplib::Response& res) {
    try {
      auto s = lh.call(&ft::Lighthouse::status).get(deadline);
      res.set_content(json_body(to_json(s)), "application/json");
    } catch (const std::exception& e) {
      reply_error(res, 503, std::string("the lighthouse did not answer: ") + e.what());
    }
  });
  // POST /replica/ID/kill is answered before routing: routing would first read a body, and
  // cpp-httplib refuses (400) a POST that has no Content-Length, as `curl -X POST` sends it.
  auto kill = [&](const std::string& id, const httplib::Request& req, httplib::Response& res) {
    if (secret.empty()) {
      return reply_error(res, 403, "this lighthouse has no job secret: the kill endpoint is off");
    }
    auto auth = req.get_header_value("Authorization");
    const std::string bearer = "bearer ";  // the scheme is case-insensitive (RFC 9110 11.1)
    if (auth.size() < bearer.size() ||
        !std::equal(bearer.begin(), bearer.end(), auth.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      res.set_header("WWW-Authenticate", "Bearer");
      return reply_error(res, 401, "the kill endpoint needs 'Authorization: Bearer <job secret>'");
    }
    std::string given = auth.substr(bearer.size());
    if (given.size() != secret.size() ||
        CRYPTO_memcmp(given.data(), secret.data(), secret.size()) != 0) {
      return reply_error(res, 403, "wrong job secret");
    }
    if (!plausible_replica_id(id))
      return reply_error(res, 404, "unknown replica group '" + id + "'");
    try {
      if (!lh.call(&ft::Lighthouse::kill_replica, id).get(deadline))
        return reply_error(res, 404, "unknown replica group '" + id + "'");
    } catch (const std::exception& e) {
      return reply_error(res, 503, std::string("the lighthouse did not answer: ") + e.what());
    }
    std::fprintf(stderr, "monarch lighthouse: kill of %s requested over HTTP\n", id.c_str());
    res.set_content(json_body(json{{"killing", id}}), "application/json");
  };
  // Every request that is not a GET or HEAD is answered here too: no route reads a body, and
  // routing would wait out the read timeout (5 s) for one that was announced but never sent.
  http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD")
      return httplib::Server::HandlerResponse::Unhandled;
    if (auto id = kill_target(req.path); id && req.method == "POST") {
      kill(*id, req, res);
    } else {
      reply_no_route(req, res);
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if ((res.status == 404 || res.status == 405) && res.body.empty()) {  // no route matched
      reply_no_route(req, res);
    } else if (res.status >= 400 && res.body.empty()) {  // refused by the parser (bad request)
      res.set_content(
          json_body(json{{"error", "request refused (HTTP " + std::to_string(res.status) + ")"}}),
          "application/json");
    }
  });
  // Whatever a handler throws is an error reply, never the end of the process.
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        reply_error(res, 500, "internal error: " + what);
      });
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second lighthouse bind the same HTTP
  // port and share its requests (kills included). SO_REUSEADDR only: a second bind fails.
  http.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const std::string shown_host =
      http_host.find(':') != std::string::npos ? "[" + http_host + "]" : http_host;
  errno = 0;  // cpp-httplib says only whether the bind worked; errno says why it did not
  int bound = http_port == 0 ? http.bind_to_any_port(http_host) : http_port;
  if (http_port != 0 && !http.bind_to_port(http_host, http_port)) bound = -1;
  if (bound <= 0) {
    const int err = errno;
    throw std::runtime_error("cannot bind the HTTP server to " + shown_host + ":" +
                             std::to_string(http_port) +
                             (err != 0 ? std::string(" (") + std::strerror(err) + ")"
                                       : std::string(" (not an address of this machine?)")));
  }
  std::thread http_thread([&] { http.listen_after_bind(); });

  std::printf("LISTENING %s\n", proc.address().c_str());
  std::printf("HTTP http://%s:%d/\n", shown_host.c_str(), bound);
  std::fflush(stdout);
  int sig = 0;
  ::sigwait(&set, &sig);
  std::fprintf(stderr, "monarch lighthouse: signal %d, stopping\n", sig);
  http.stop();
  http_thread.join();
  (void)lh.stop().get(deadline);
  return 0;
}

}  // namespace monarch::tools
