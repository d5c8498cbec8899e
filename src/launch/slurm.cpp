// SLURM launcher (see include/monarch/launch/slurm.hpp and docs/launch-slurm.md).
#include "monarch/launch/slurm.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "monarch/actor/errors.hpp"
#include "monarch/launch/hostlist.hpp"
#include "subprocess.hpp"

namespace monarch::launch {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace detail {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

namespace {
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

// Combines the het components' states into the job's: a final state of any component wins,
// then anything that is not RUNNING (PENDING, CONFIGURING), else RUNNING.
void combine_state(SlurmJobState& job, const std::string& state, const std::string& reason) {
  if (job.state.empty() || (is_final_state(state) && !is_final_state(job.state)) ||
      (job.state == "RUNNING" && state != "RUNNING")) {
    job.state = state;
    job.reason = reason;
  }
}
}  // namespace

SlurmJobState parse_squeue_json(const std::string& text, const std::string& job_id) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw SlurmError("squeue --json for SLURM job " + job_id + ": output is not JSON (" + e.what() +
                     ")");
  }
  if (!doc.contains("jobs") || !doc["jobs"].is_array()) {
    throw SlurmError("squeue --json for SLURM job " + job_id + ": no 'jobs' array in its output");
  }
  uint64_t id = std::stoull(job_id);
  std::vector<std::pair<uint64_t, const nlohmann::json*>> parts;  // (het offset, job)
  for (const auto& j : doc["jobs"]) {
    uint64_t jid = j.value("job_id", uint64_t{0});
    uint64_t het = j.contains("het_job_id") && j["het_job_id"].is_number()
                       ? j["het_job_id"].get<uint64_t>()
                       : 0;
    if (jid == id || (het != 0 && het == id)) {
      uint64_t off = j.contains("het_job_offset") && j["het_job_offset"].is_number()
                         ? j["het_job_offset"].get<uint64_t>()
                         : 0;
      parts.emplace_back(off, &j);
    }
  }
  SlurmJobState st;
  if (parts.empty()) {
    st.gone = true;
    return st;
  }
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [off, j] : parts) {
    std::string state = (*j)["job_state"].is_string() ? (*j)["job_state"].get<std::string>() : "";
    std::string reason = j->contains("state_reason") && (*j)["state_reason"].is_string()
                             ? (*j)["state_reason"].get<std::string>()
                             : "";
    combine_state(st, state, reason);
    st.nodelists.push_back(
        j->contains("nodes") && (*j)["nodes"].is_string() ? (*j)["nodes"].get<std::string>() : "");
  }
  return st;
}

SlurmJobState parse_squeue_text(const std::string& text, const std::string& job_id) {
  std::vector<std::pair<uint64_t, std::vector<std::string>>> parts;
  for (const auto& line : split(text, '\n')) {
    if (line.empty()) continue;
    auto f = split(line, '|');
    if (f.size() < 4)
      throw SlurmError("squeue for SLURM job " + job_id + ": unexpected line '" + line + "'");
    std::string id = f[0];
    uint64_t off = 0;
    if (auto plus = id.find('+'); plus != std::string::npos) {
      std::string o = id.substr(plus + 1);
      if (o.empty() || o.find_first_not_of("0123456789") != std::string::npos) {
        throw SlurmError("squeue for SLURM job " + job_id + ": bad het job id in line '" + line +
                         "'");
      }
      off = std::stoull(o);
      id = id.substr(0, plus);
    }
    if (id != job_id) continue;
    parts.emplace_back(off, f);
  }
  SlurmJobState st;
  if (parts.empty()) {
    st.gone = true;
    return st;
  }
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [off, f] : parts) {
    combine_state(st, f[1], f[3]);
    st.nodelists.push_back(f[2] == "(null)" ? "" : f[2]);
  }
  return st;
}

}  // namespace detail

bool is_final_state(const std::string& s) {
  static const char* const kFinal[] = {"COMPLETED", "COMPLETING",    "FAILED",       "CANCELLED",
                                       "TIMEOUT",   "NODE_FAIL",     "PREEMPTED",    "BOOT_FAIL",
                                       "DEADLINE",  "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"};
  for (const char* f : kFinal) {
    if (s == f) return true;
  }
  return false;
}

namespace {

// Runs argv (PATH lookup, stdin /dev/null) with `extra_env` ("K=V", overriding ours), collects
// stdout/stderr, kills it at `timeout`. Throws SlurmError when it cannot start or times out.
detail::CommandResult run_slurm(const std::vector<std::string>& argv,
                                const std::vector<std::string>& extra_env, milliseconds timeout) {
  auto r =
      detail::try_run_command(argv, {.input = std::nullopt, .env = extra_env, .timeout = timeout});
  const std::string what = detail::join_command(argv);
  switch (r.failure) {
    case detail::CommandFailure::none:
      break;
    case detail::CommandFailure::pipe:
      throw SlurmError("pipe for `" + what + "`: " + std::strerror(r.error));
    case detail::CommandFailure::spawn:
      throw SlurmError("cannot run `" + what + "`: " + std::strerror(r.error));
    case detail::CommandFailure::timeout:
      throw SlurmError("`" + what + "` did not finish within " + std::to_string(timeout.count()) +
                       " ms");
  }
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i])) != 0) ++i;
  return s.substr(i);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tail_of(const fs::path& p, size_t max_bytes = 600) {
  std::string s = trim(read_file(p));
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

std::string random_hex(size_t bytes) {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xffu;
    s += hex[v >> 4];
    s += hex[v & 0xfu];
  }
  return s;
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

void check_option_line(const std::string& field, const std::string& line) {
  if (line.find('\n') != std::string::npos || line.find('\r') != std::string::npos) {
    throw UsageError("SlurmOptions::" + field + ": '" + line + "' contains a line break");
  }
}

}  // namespace

struct SlurmJob::Impl : std::enable_shared_from_this<Impl> {
  SlurmOptions opt;
  std::string tag;  // unique per SlurmJob, names the work dir
  fs::path dir;     // <shared_dir>/job-<tag>
  std::string dir_str;
  std::string id;                          // job id after submit
  std::string secret_env;                  // "MONARCH_SECRET=..." handed to sbatch, or ""
  mutable std::atomic<int> json_mode{-1};  // -1 unknown, 0 text, 1 json
  std::vector<std::vector<std::string>> nodes;
  std::vector<std::vector<std::string>> agents;
  std::vector<mesh::HostMesh> hosts;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::atomic<bool> cancelling{false};
  bool cancelled = false;
  bool start_failed = false;
  bool made_shared_dir = false;  // submit() created opt.shared_dir: removed with dir when empty
  std::string ended_state;       // final state seen by the monitor
  FailureHandler on_end;
  std::thread monitor;

  // Removes the work dir, and the shared dir when this job created it and nothing else is left
  // in it (another job's work dir keeps it).
  void discard_work_dir() const {
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (made_shared_dir) fs::remove(opt.shared_dir, ec);
  }

  std::string label() const {
    return "SLURM job " + (id.empty() ? std::string("(not submitted)") : id) + " '" + opt.job_name +
           "'";
  }

  SlurmJobState query() const {
    int mode = json_mode.load();
    if (mode != 0) {
      detail::CommandResult r =
          run_slurm({"squeue", "--json", "--jobs=" + id}, {}, opt.command_timeout);
      if (r.status == 0) {
        try {
          auto st = detail::parse_squeue_json(r.out, id);
          json_mode.store(1);
          return st;
        } catch (const SlurmError& e) {
          if (mode == 1 || opt.squeue_json.value_or(false)) throw;
        }
      } else if (mode == 1 || opt.squeue_json.value_or(false)) {
        if (r.err.find("Invalid job id") != std::string::npos)
          return SlurmJobState{{}, {}, {}, true};
        throw SlurmError("`squeue --json` for " + label() + " failed (exit " +
                         std::to_string(r.status) + "): " + trim(r.err));
      }
      if (mode == -1) {
        spdlog::info("{}: `squeue --json` unsupported here; using `squeue -h -o`", label());
      }
      json_mode.store(0);
    }
    detail::CommandResult r =
        run_slurm({"squeue", "-h", "--states=all", "--jobs=" + id, "-o", "%i|%T|%N|%r"}, {},
                  opt.command_timeout);
    if (r.status != 0) {
      if (r.err.find("Invalid job id") != std::string::npos) return SlurmJobState{{}, {}, {}, true};
      throw SlurmError("`squeue` for " + label() + " failed (exit " + std::to_string(r.status) +
                       "): " + trim(r.err));
    }
    return detail::parse_squeue_text(r.out, id);
  }

  std::string describe_now() const {
    if (cancelling.load()) return label() + ": cancelled by this client";
    try {
      auto st = query();
      return label() + ": " + (st.gone ? std::string("no longer in squeue") : st.state);
    } catch (const std::exception& e) {
      return label() + ": state unknown (" + e.what() + ")";
    }
  }

  // Batch output tail for error messages.
  std::string batch_output() const {
    auto p = dir / ("batch-" + id + ".out");
    std::string t = tail_of(p);
    return t.empty() ? "" : "; batch output (" + p.string() + "): " + t;
  }

  void start_monitor() {
    monitor = std::thread([self = shared_from_this()] { self->monitor_loop(); });
  }

  static constexpr milliseconds kCompletingWait{5000};

  void monitor_loop() {
    std::optional<Clock::time_point> completing_since;
    std::unique_lock lock(mu);
    while (!stopping) {
      cv.wait_for(lock, opt.poll_interval);
      if (stopping) break;
      lock.unlock();
      SlurmJobState st;
      bool ok = true;
      try {
        st = query();
      } catch (const std::exception& e) {
        spdlog::warn("{}: squeue failed while monitoring: {}", label(), e.what());
        ok = false;
      }
      lock.lock();
      if (!ok || stopping || cancelling.load()) continue;
      // COMPLETING hides the final state (CANCELLED, NODE_FAIL, ...) while steps are killed
      // (KillWait); report that state when it shows within kCompletingWait, else COMPLETING.
      if (st.state == "COMPLETING") {
        if (!completing_since) completing_since = Clock::now();
        if (Clock::now() - *completing_since < kCompletingWait) continue;
      }
      if (st.gone || is_final_state(st.state)) {
        ended_state = st.gone ? "gone from squeue" : st.state;
        MeshFailure f;
        f.mesh = "slurm-" + id;
        size_t n = 0;
        for (const auto& a : agents) n += a.size();
        for (size_t r = 0; r < n; ++r) f.ranks.push_back(r);
        f.cause = label() + " ended: " + ended_state +
                  (st.reason.empty() || st.reason == "None" ? "" : " (reason " + st.reason + ")");
        auto handler = on_end;
        lock.unlock();
        if (!handler || !handler(f)) spdlog::error("{}", f.to_string());
        lock.lock();
        break;
      }
    }
  }

  void stop_monitor() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (monitor.joinable() && monitor.get_id() != std::this_thread::get_id()) monitor.join();
  }
};

SlurmJob::SlurmJob(SlurmOptions options) : impl_(std::make_shared<Impl>()) {
  auto& o = options;
  if (o.groups.empty())
    throw UsageError("SlurmOptions::groups is empty: ask for at least one group");
  for (size_t g = 0; g < o.groups.size(); ++g) {
    const auto& gr = o.groups[g];
    std::string where = "SlurmOptions::groups[" + std::to_string(g) + "]";
    if (gr.nodes == 0) throw UsageError(where + ".nodes is 0");
    if (gr.tasks_per_node == 0) throw UsageError(where + ".tasks_per_node is 0");
    for (const auto& l : gr.extra_sbatch)
      check_option_line("groups[" + std::to_string(g) + "].extra_sbatch", l);
    check_option_line("groups[" + std::to_string(g) + "].partition", gr.partition);
  }
  for (const auto& l : o.extra_sbatch) check_option_line("extra_sbatch", l);
  check_option_line("job_name", o.job_name);
  check_option_line("time_limit", o.time_limit);
  if (o.agent_host.find('\'') != std::string::npos || o.agent_host.empty()) {
    throw UsageError("SlurmOptions::agent_host '" + o.agent_host +
                     "' must be non-empty and free of single quotes");
  }
  if (o.poll_interval.count() <= 0) throw UsageError("SlurmOptions::poll_interval must be > 0 ms");
  if (o.agent_program.empty()) {
    const char* p = std::getenv("MONARCH_AGENT_PROGRAM");
    o.agent_program = p != nullptr && *p != '\0' ? p : "monarch";
  }
  if (o.shared_dir.empty()) {
    const char* d = std::getenv("MONARCH_SLURM_SHARED_DIR");
    o.shared_dir = d != nullptr && *d != '\0' ? std::string(d)
                                              : (fs::current_path() / ".monarch-slurm").string();
  }
  o.shared_dir = fs::absolute(o.shared_dir).string();
  if (o.shared_dir.find_first_of(" \t\n'\"") != std::string::npos) {
    throw UsageError("SlurmOptions::shared_dir '" + o.shared_dir +
                     "' must not contain spaces or quotes (it goes into #SBATCH lines)");
  }
  if (o.squeue_json.has_value()) impl_->json_mode.store(*o.squeue_json ? 1 : 0);
  impl_->opt = std::move(o);
  impl_->tag = std::to_string(::getpid()) + "-" + random_hex(4);
  impl_->dir = fs::path(impl_->opt.shared_dir) / ("job-" + impl_->tag);
  impl_->dir_str = impl_->dir.string();
}

SlurmJob::~SlurmJob() {
  bool clean = true;
  try {
    stop();
  } catch (const std::exception& e) {
    clean = false;
    spdlog::error("~SlurmJob: {}", e.what());
  }
  impl_->stop_monitor();
  if (clean && !impl_->start_failed && !impl_->opt.keep_work_dir && !impl_->id.empty()) {
    impl_->discard_work_dir();
  }
}

std::string SlurmJob::render_sbatch() const {
  const auto& o = impl_->opt;
  const std::string dir = impl_->dir.string();
  std::ostringstream s;
  bool het = o.groups.size() > 1;
  s << "#!/bin/bash\n";
  s << "# monarch-cpp SLURM launcher: one `monarch agent` per task. Each binds port 0 on its node "
       "and\n";
  s << "# writes `LISTENING <address>` to " << dir
    << "/agent-<group>-<task>.out, which the client reads.\n";
  for (size_t g = 0; g < o.groups.size(); ++g) {
    const auto& gr = o.groups[g];
    if (g > 0) s << "#SBATCH hetjob\n";
    if (g == 0) {
      s << "#SBATCH --job-name=" << o.job_name << "\n";
      s << "#SBATCH --output=" << dir << "/batch-%j.out\n";
    }
    s << "#SBATCH --nodes=" << gr.nodes << "\n";
    s << "#SBATCH --ntasks-per-node=" << gr.tasks_per_node << "\n";
    if (gr.gpus_per_node > 0) s << "#SBATCH --gpus-per-node=" << gr.gpus_per_node << "\n";
    if (gr.cpus_per_task > 0) s << "#SBATCH --cpus-per-task=" << gr.cpus_per_task << "\n";
    if (!gr.partition.empty()) s << "#SBATCH --partition=" << gr.partition << "\n";
    if (!o.time_limit.empty()) s << "#SBATCH --time=" << o.time_limit << "\n";
    if (g == 0) {
      for (const auto& l : o.extra_sbatch) s << "#SBATCH " << l << "\n";
    }
    for (const auto& l : gr.extra_sbatch) s << "#SBATCH " << l << "\n";
  }
  s << "set -u\n";
  for (size_t g = 0; g < o.groups.size(); ++g) {
    std::string stem = dir + "/agent-" + std::to_string(g);
    s << "srun" << (het ? " --het-group=" + std::to_string(g) : std::string())
      << " --kill-on-bad-exit=0"
      << " --output=" << detail::shell_quote(stem + "-%t.out")
      << " --error=" << detail::shell_quote(stem + "-%t.err")
      << " \\\n  /bin/sh -c 'exec \"$0\" agent --listen \"tcp://" << o.agent_host << ":0\"' "
      << detail::shell_quote(o.agent_program) << " &\n";
    s << "pids=\"${pids:-} $!\"\n";
  }
  s << "# The job fails (rather than completes) when an agent's step failed.\n";
  s << "rc=0\nfor p in $pids; do wait \"$p\" || rc=$?; done\nexit $rc\n";
  return s.str();
}

std::string SlurmJob::submit() {
  auto& im = *impl_;
  if (!im.id.empty()) throw UsageError(im.label() + " was already submitted");
  std::error_code ec;
  // Another job sharing the shared dir removes it when it is the last one in it (discard_work_dir),
  // which can happen between making it and making im.dir inside it: try again then. The job that
  // made the shared dir removes it at the end when it is empty (made_shared_dir).
  for (int attempt = 0; attempt < 3; ++attempt) {
    ec.clear();
    const bool made = fs::create_directories(im.opt.shared_dir, ec);
    if (ec) continue;
    fs::create_directory(im.dir, ec);
    if (!ec) {
      im.made_shared_dir = made;
      break;
    }
  }
  if (ec) throw SlurmError("cannot create SLURM work dir " + im.dir.string() + ": " + ec.message());
  fs::path script = im.dir / "job.sbatch";
  {
    std::ofstream out(script);
    out << render_sbatch();
    if (!out) throw SlurmError("cannot write SLURM batch script " + script.string());
  }
  // The agents (and the workers they start) need the client's channel secret.
  std::vector<std::string> env;
  auto& ch = im.opt.host.channel;
  bool env_secret =
      (std::getenv("MONARCH_SECRET") != nullptr && *std::getenv("MONARCH_SECRET") != '\0') ||
      (std::getenv("MONARCH_SECRET_FILE") != nullptr &&
       *std::getenv("MONARCH_SECRET_FILE") != '\0');
  if (ch.secret.empty() && !env_secret) ch.secret = random_hex(32);
  if (!ch.secret.empty()) env.push_back("MONARCH_SECRET=" + ch.secret);
  detail::CommandResult r =
      run_slurm({"sbatch", "--parsable", script.string()}, env, im.opt.command_timeout);
  // Refused by sbatch, the job has nothing in its work dir but the script (which
  // render_sbatch() gives back): nothing is left behind unless keep_work_dir.
  auto refused = [&](const std::string& why) {
    if (!im.opt.keep_work_dir) im.discard_work_dir();
    return SlurmError(why);
  };
  if (r.status != 0) {
    throw refused("`sbatch --parsable " + script.string() + "` failed (exit " +
                  std::to_string(r.status) + "): " + trim(r.err + r.out));
  }
  std::string id = trim(r.out);
  id = id.substr(0, id.find(';'));  // "42;cluster" on federated setups
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    throw refused("sbatch printed no job id (stdout '" + trim(r.out) + "', stderr '" + trim(r.err) +
                  "')");
  }
  im.id = id;
  spdlog::info("{} submitted ({} group(s), work dir {})", im.label(), im.opt.groups.size(),
               im.dir.string());
  return id;
}

SlurmJobState SlurmJob::query() const {
  if (impl_->id.empty()) throw UsageError("SlurmJob::query before submit");
  return impl_->query();
}

SlurmJobState SlurmJob::wait_running() {
  auto& im = *impl_;
  if (im.id.empty()) throw UsageError("SlurmJob::wait_running before submit");
  auto deadline = Clock::now() + im.opt.start_timeout;
  SlurmJobState st;
  while (true) {
    st = im.query();
    if (st.gone || is_final_state(st.state)) {
      throw SlurmError(
          im.label() +
          " ended before it ran: " + (st.gone ? std::string("gone from squeue") : st.state) +
          (st.reason.empty() || st.reason == "None" ? "" : " (reason " + st.reason + ")") +
          im.batch_output());
    }
    if (st.state == "RUNNING") break;
    if (Clock::now() >= deadline) {
      throw SlurmError(im.label() + " not RUNNING within " +
                       std::to_string(im.opt.start_timeout.count()) + " ms: " + st.state +
                       (st.reason.empty() ? "" : " (reason " + st.reason + ")"));
    }
    std::this_thread::sleep_for(
        im.opt.poll_interval);  // polling squeue: it has no event to wait on
  }
  if (st.nodelists.size() != im.opt.groups.size()) {
    throw SlurmError(im.label() + ": squeue shows " + std::to_string(st.nodelists.size()) +
                     " component(s), asked for " + std::to_string(im.opt.groups.size()));
  }
  im.nodes.clear();
  for (size_t g = 0; g < st.nodelists.size(); ++g) {
    auto names = expand_hostlist(st.nodelists[g]);
    if (names.size() != im.opt.groups[g].nodes) {
      throw SlurmError(im.label() + " group " + std::to_string(g) + ": nodelist '" +
                       st.nodelists[g] + "' has " + std::to_string(names.size()) +
                       " node(s), asked for " + std::to_string(im.opt.groups[g].nodes));
    }
    im.nodes.push_back(std::move(names));
  }
  return st;
}

std::vector<mesh::HostMesh> SlurmJob::start() {
  auto& im = *impl_;
  auto deadline = Clock::now() + im.opt.start_timeout;
  submit();
  try {
    wait_running();
    // Rendezvous: every agent's LISTENING line.
    im.agents.assign(im.opt.groups.size(), {});
    for (size_t g = 0; g < im.opt.groups.size(); ++g) {
      im.agents[g].assign(im.opt.groups[g].nodes * im.opt.groups[g].tasks_per_node, "");
    }
    while (true) {
      size_t missing = 0;
      std::string first_missing;
      for (size_t g = 0; g < im.agents.size(); ++g) {
        for (size_t t = 0; t < im.agents[g].size(); ++t) {
          if (!im.agents[g][t].empty()) continue;
          auto p = im.dir / ("agent-" + std::to_string(g) + "-" + std::to_string(t) + ".out");
          std::istringstream in(read_file(p));
          std::string line;
          while (std::getline(in, line)) {
            if (line.rfind("LISTENING ", 0) == 0) im.agents[g][t] = trim(line.substr(10));
          }
          if (im.agents[g][t].empty()) {
            ++missing;
            if (first_missing.empty())
              first_missing = "group " + std::to_string(g) + " task " + std::to_string(t);
          }
        }
      }
      if (missing == 0) break;
      auto st = im.query();
      if (st.gone || is_final_state(st.state) || Clock::now() >= deadline) {
        std::string g0 = first_missing.substr(6, first_missing.find(' ', 6) - 6);
        std::string t0 = first_missing.substr(first_missing.rfind(' ') + 1);
        auto err = im.dir / ("agent-" + g0 + "-" + t0 + ".err");
        std::string why =
            st.gone || is_final_state(st.state)
                ? "ended (" + (st.gone ? std::string("gone from squeue") : st.state) + ")"
                : "still " + st.state + " after " + std::to_string(im.opt.start_timeout.count()) +
                      " ms";
        std::string errtail = tail_of(err);
        throw SlurmError(im.label() + " " + why + " before " + std::to_string(missing) +
                         " agent(s) listened (first: " + first_missing +
                         (errtail.empty() ? "" : ", its stderr: " + errtail) + ")" +
                         im.batch_output());
      }
      std::this_thread::sleep_for(im.opt.poll_interval);  // agents write files; nothing to wait on
    }
    mesh::HostOptions ho = im.opt.host;
    if (ho.listen.empty()) ho.listen = "tcp://" + this_host_name() + ":0";
    im.hosts.clear();
    for (const auto& a : im.agents) im.hosts.push_back(mesh::attach_to_workers(a, ho));
  } catch (...) {
    im.start_failed = true;
    try {
      stop();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
    }
    throw;
  }
  im.start_monitor();
  return im.hosts;
}

const std::vector<std::vector<std::string>>& SlurmJob::nodes() const {
  return impl_->nodes;
}

const std::vector<std::string>& SlurmJob::agents(size_t group) const {
  if (group >= impl_->agents.size())
    throw UsageError("SlurmJob::agents: no group " + std::to_string(group) + " (not started?)");
  return impl_->agents[group];
}

const mesh::HostMesh& SlurmJob::hosts(size_t group) const {
  if (group >= impl_->hosts.size())
    throw UsageError("SlurmJob::hosts: no group " + std::to_string(group) + " (not started?)");
  return impl_->hosts[group];
}

mesh::ProcMesh SlurmJob::spawn_procs(size_t group, const ndslice::Extent& per_host,
                                     mesh::SpawnOptions options) {
  std::weak_ptr<Impl> weak = impl_;
  auto user = std::move(options.on_failure);
  options.on_failure = [weak, user](const MeshFailure& f) {
    MeshFailure g = f;
    auto im = weak.lock();
    g.cause += " (" + (im ? im->describe_now() : std::string("SLURM job released")) + ")";
    if (user) return user(g);
    spdlog::error("{}", g.to_string());
    return false;
  };
  return hosts(group).spawn_procs(per_host, std::move(options));
}

void SlurmJob::on_failure(FailureHandler handler) {
  std::lock_guard lock(impl_->mu);
  impl_->on_end = std::move(handler);
}

void SlurmJob::stop() {
  auto& im = *impl_;
  if (im.id.empty() || im.cancelled) return;
  im.cancelling.store(true);
  im.stop_monitor();
  im.hosts.clear();  // our references to the agents; users' copies stay valid (and see them go)
  detail::CommandResult r = run_slurm({"scancel", im.id}, {}, im.opt.command_timeout);
  if (r.status != 0) {
    throw SlurmError("`scancel " + im.id + "` for " + im.label() + " failed (exit " +
                     std::to_string(r.status) + "): " + trim(r.err));
  }
  auto deadline = Clock::now() + im.opt.cancel_timeout;
  SlurmJobState st;
  while (true) {
    st = im.query();
    if (st.gone || (is_final_state(st.state) && st.state != "COMPLETING")) break;
    if (Clock::now() >= deadline) {
      throw SlurmError(im.label() + " still " + st.state + " " +
                       std::to_string(im.opt.cancel_timeout.count()) + " ms after scancel");
    }
    std::this_thread::sleep_for(im.opt.poll_interval);  // squeue polling
  }
  im.cancelled = true;
  spdlog::info("{} cancelled ({})", im.label(),
               st.gone ? std::string("gone from squeue") : st.state);
}

const std::string& SlurmJob::job_id() const {
  return impl_->id;
}

const std::string& SlurmJob::work_dir() const {
  return impl_->dir_str;
}

std::optional<SlurmEnv> slurm_env() {
  auto get = [](const char* k) -> std::optional<std::string> {
    const char* v = std::getenv(k);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  auto num = [&](const char* k, size_t dflt) -> size_t {
    auto v = get(k);
    if (!v) return dflt;
    if (v->empty() || v->find_first_not_of("0123456789") != std::string::npos) {
      throw SlurmError(std::string(k) + "='" + *v + "' is not a non-negative integer");
    }
    return std::stoull(*v);
  };
  auto job = get("SLURM_JOB_ID");
  if (!job) job = get("SLURM_JOBID");
  if (!job) return std::nullopt;
  SlurmEnv e;
  e.job_id = *job;
  e.procid = num("SLURM_PROCID", 0);
  e.ntasks = num("SLURM_NTASKS", num("SLURM_NPROCS", 1));
  e.localid = num("SLURM_LOCALID", 0);
  e.nodeid = num("SLURM_NODEID", 0);
  if (e.ntasks == 0 || e.procid >= e.ntasks) {
    throw SlurmError("SLURM_PROCID=" + std::to_string(e.procid) +
                     " is not below SLURM_NTASKS=" + std::to_string(e.ntasks));
  }
  auto nl = get("SLURM_JOB_NODELIST");
  if (!nl) nl = get("SLURM_NODELIST");
  if (nl) {
    e.nodelist = *nl;
    try {
      e.nodes = expand_hostlist(*nl);
    } catch (const HostlistError& err) {
      throw SlurmError(std::string("SLURM_JOB_NODELIST: ") + err.what());
    }
  }
  return e;
}

}  // namespace monarch::launch
