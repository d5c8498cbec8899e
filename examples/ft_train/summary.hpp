// ft_train's summary: the JSON keys of one run (check_summary.py, bench/ft_bench.py and
// docs/ft.md read them) and the table printed at the end.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "monarch/ft/controller.hpp"

namespace monarch::ft::example {

/// The summary of one run. `metric`: the workload's metric name ("accuracy" also fills
/// test_accuracy); `detect_s`: the detection timeout, seconds.
nlohmann::json run_json(const ft::RunStats& s, const std::string& metric, double detect_s);

/// Prints the summary table of `r` (the main run) next to `ff` (the fault-free run, if any).
void print_table(const nlohmann::json* ff, const nlohmann::json& r, const std::string& ff_name,
                 const std::string& name);

}  // namespace monarch::ft::example
