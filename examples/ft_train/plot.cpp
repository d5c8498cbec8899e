// gnuplot chart of two metrics runs (plot.hpp).
#include "plot.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

namespace monarch::ft::example {

namespace {

struct Series {
  std::vector<std::pair<long, double>> loss, metric;
  std::vector<std::pair<long, std::string>> faults;
};

Series read_jsonl(const std::string& path, const std::string& metric) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("plot: cannot read metrics file " + path);
  Series s;
  std::string line;
  for (long lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw std::runtime_error("plot: " + path + ":" + std::to_string(lineno) +
                               " is not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
    long step = j["step"].get<long>();
    if (j.contains("loss") && j["loss"].is_number())
      s.loss.emplace_back(step, j["loss"].get<double>());
    if (j.contains(metric) && j[metric].is_number()) {
      double v = j[metric].get<double>();
      s.metric.emplace_back(step, metric == "accuracy" ? 100.0 * v : v);
    }
    if (j.contains("fault") && j["fault"].is_string())
      s.faults.emplace_back(step, j["fault"].get<std::string>());
  }
  return s;
}

// Two gnuplot data blocks (index 0: loss, index 1: the metric), separated by two blank lines.
void write_dat(const std::string& path, const Series& s) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("plot: cannot write " + path);
  out << "# step loss\n";
  for (auto& [step, v] : s.loss) out << step << " " << v << "\n";
  if (s.loss.empty()) out << "NaN NaN\n";
  out << "\n\n# step metric\n";
  for (auto& [step, v] : s.metric) out << step << " " << v << "\n";
  if (s.metric.empty()) out << "NaN NaN\n";
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

void plot_loss_accuracy(const std::string& fault_free_jsonl, const std::string& faulty_jsonl,
                        const std::string& png_path, const std::string& title,
                        const std::string& metric) {
  const Series clean = read_jsonl(fault_free_jsonl, metric);
  const Series faulty = read_jsonl(faulty_jsonl, metric);
  const std::string clean_dat = png_path + ".fault_free.dat";
  const std::string faulty_dat = png_path + ".faulty.dat";
  const std::string script = png_path + ".gnuplot";
  write_dat(clean_dat, clean);
  write_dat(faulty_dat, faulty);

  std::ofstream g(script);
  if (!g) throw std::runtime_error("plot: cannot write " + script);
  g << "set terminal pngcairo size 1000,800 noenhanced\n"
    << "set output " << quoted(png_path) << "\n"
    << "set multiplot layout 2,1 title " << quoted(title) << "\n"
    << "set grid\nset key top right\nset xlabel 'step'\n";
  for (auto& [step, kind] : faulty.faults) {
    g << "set arrow from " << step << ", graph 0 to " << step
      << ", graph 1 nohead dashtype 3 linecolor rgb '#aa0000'\n";
  }
  g << "set ylabel 'training loss'\n"
    << "plot " << quoted(clean_dat)
    << " index 0 using 1:2 with lines linewidth 2 title 'fault-free', " << quoted(faulty_dat)
    << " index 0 using 1:2 with lines linewidth 2 dashtype 2 title 'with faults ("
    << faulty.faults.size() << ")'\n"
    << (metric == "accuracy"
            ? "set ylabel 'test accuracy (%)'\nset key bottom right\n"
            : "set ylabel " + quoted("held-out " + metric) + "\nset key top right\n")
    << "plot " << quoted(clean_dat)
    << " index 1 using 1:2 with linespoints linewidth 2 title 'fault-free', " << quoted(faulty_dat)
    << " index 1 using 1:2 with linespoints linewidth 2 dashtype 2 title 'with faults'\n"
    << "unset multiplot\n";
  g.close();

  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    throw std::runtime_error(
        "plot: gnuplot not found: install it with `apt-get install gnuplot-nox`");
  }
  // Its output only when it fails: its warnings (a 1-step run's "empty x range") are noise.
  const std::string cmd = "gnuplot " + shell_quoted(script) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("plot: cannot run `" + cmd + "`");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) throw std::runtime_error("plot: `" + cmd + "` failed:\n" + out);
}

void write_file(const std::string& flag, const std::string& path, const std::string* text) {
  // Append mode for the check: it creates a missing file but does not truncate one.
  std::ofstream f(path, text ? std::ios::trunc : std::ios::app);
  if (f && text) f << *text;
  if (f) f.flush();
  if (!f) {
    throw std::runtime_error("cannot write " + flag + " '" + path + "': " + std::strerror(errno));
  }
}

void make_dir(const std::string& flag, const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw std::runtime_error("cannot create " + flag + " '" + path + "': " + ec.message());
}

}  // namespace monarch::ft::example
