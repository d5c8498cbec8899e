// ft_train's summary (summary.hpp).
#include "summary.hpp"

#include <cstdio>

namespace monarch::ft::example {

using json = nlohmann::json;

json run_json(const ft::RunStats& s, const std::string& metric, double detect_s) {
  bool acc = metric == "accuracy";
  return {{"faults_injected", s.faults_injected},
          {"faults_outside", s.faults_outside},
          {"faults_total", s.faults_injected + s.faults_outside},
          {"survivor_restarts", s.survivor_restarts},
          {"replicas_bitwise_equal", s.replicas_bitwise_equal},
          {"hash_mismatches", s.hash_mismatches},
          {"metric", metric},
          {"metric_value", s.metric},
          {"test_accuracy", acc ? json(s.metric) : json(nullptr)},
          {"max_survivor_stall_s", s.max_survivor_stall_s},
          {"max_survivor_stall_at", s.max_stall_where},
          {"detection_timeout_s", detect_s},
          {"recovery_p50_s", ft::percentile(s.recovery_s, 0.5)},
          {"recovery_p95_s", ft::percentile(s.recovery_s, 0.95)},
          {"recoveries", s.recovery_s.size()},
          {"respawns", s.respawns},
          {"spares_promoted", s.spares_promoted},
          {"spare_failures", s.spare_failures},
          {"committed_samples_per_s", s.committed_samples_per_s},
          {"heal_gbps", s.heal_gbps},
          {"state_bytes", s.state_bytes},
          {"step_ms_p50", s.step_ms_p50},
          {"step_ms_p95", s.step_ms_p95},
          {"steps", s.steps},
          {"wall_s", s.wall_s},
          {"error", s.error},
          {"faults", json::parse(s.faults_json.empty() ? "[]" : s.faults_json)}};
}

void print_table(const json* ff, const json& r, const std::string& ff_name,
                 const std::string& name) {
  std::printf("\n== ft_train summary ==\n  %-28s %14s %14s\n", "", ff_name.c_str(), name.c_str());
  auto cell = [](const json& v) {
    char b[32];
    if (!v.is_number_float()) return v.dump();
    std::snprintf(b, sizeof b, "%.3f", v.get<double>());
    return std::string(b);
  };
  for (const char* k :
       {"metric_value", "replicas_bitwise_equal", "faults_injected", "faults_outside",
        "survivor_restarts", "max_survivor_stall_s", "recovery_p50_s", "recovery_p95_s",
        "committed_samples_per_s", "step_ms_p50", "wall_s"})
    std::printf("  %-28s %14s %14s\n", k, ff ? cell((*ff)[k]).c_str() : "-", cell(r[k]).c_str());
}

}  // namespace monarch::ft::example
