// Benchmark reporting shared by every bench binary.
//
// Each measurement is one JSON object per line appended to the file named by MONARCH_BENCH_OUT
// (default: build/bench/results.jsonl, set by scripts/run-bench.sh), with keys
//   bench  : what is measured, e.g. "inproc_rtt"
//   impl   : "monarch" or the peer's name ("caf", "raw_socket", "memcpy", "naive_loop")
//   metric : e.g. "p50", "p99", "rate"
//   value  : a number, in `unit`
//   unit   : "us", "ms", "ns", "msgs/s", "actors/s", "GB/s", ...
//   better : "lower" or "higher" (scripts/bench-report.py uses it to orient ratios)
// and any extra string/number parameters (e.g. "in_flight": 64).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace monarch::bench {

inline std::string results_path() {
  const char* p = std::getenv("MONARCH_BENCH_OUT");
  return p != nullptr ? p : "build/bench/results.jsonl";
}

// Appends one measurement line; also prints it to stdout so a run is readable on its own.
inline void report(const std::string& bench, const std::string& impl, const std::string& metric,
                   double value, const std::string& unit, const std::string& better,
                   nlohmann::json params = nlohmann::json::object()) {
  nlohmann::json j = {{"bench", bench}, {"impl", impl}, {"metric", metric},
                      {"value", value}, {"unit", unit}, {"better", better}};
  for (auto& [k, v] : params.items()) j[k] = v;
  std::ofstream out(results_path(), std::ios::app);
  out << j.dump() << "\n";
  std::printf("%s\n", j.dump().c_str());
}

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Percentile of samples (q in [0,1]); sorts a copy.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto idx = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
  return v[idx];
}

}  // namespace monarch::bench
