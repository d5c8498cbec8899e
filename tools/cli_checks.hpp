// Number checks for the command-line tools' CLI11 options (monarch, ft_train, ddp_baseline,
// k8s_launch). CLI11's own CLI::Range and CLI::PositiveNumber answer any bad value with
// "Value X not in range A to B", print a 309-digit bound for an open double range, and let an
// unsigned value past 2^64-1 through, clamped. These say what was wrong with the text instead.
//
// Each is a CLI::Validator: it runs on the option's text before CLI11 converts it, and what it
// returns is printed as "--flag: MESSAGE" before main's own code runs; parse() then exits 2, as
// for every other usage error. Header-only; no state, usable from any thread. tcp_secret_problem()
// is the check of a TCP address against the job secret, in the tools' terms.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include "monarch/channel/channel.hpp"

namespace monarch::cli {

/// CLI11_PARSE, except that every usage error exits 2 (CLI11 gives each kind of error its own
/// code: 105 for a failed check, 106 for a missing value, ...), as the tools' own usage checks
/// do; --help exits 0. Prints what CLI11 prints. Returns the exit code, or -1 when the arguments
/// parsed: `if (int rc = cli::parse(app, argc, argv); rc >= 0) return rc;`.
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

/// An integer from `lo` to `hi`, both included, written in decimal (a leading '+' is refused, as
/// are spaces and a fraction). Messages: "'abc' is not an integer", "must be from 1 to 64, not 0",
/// and for text past int64: "must be from 1 to 64, not 99999999999999999999". With `hi` left
/// out, the bound is shown as "at least LO".
inline CLI::Validator integer_in(int64_t lo, int64_t hi = INT64_MAX) {
  auto range = hi == INT64_MAX ? "at least " + std::to_string(lo)
                               : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        // Empty text and no digits are invalid_argument; digits followed by more are not.
        if (ec == std::errc::invalid_argument ||
            (ec == std::errc{} && end != text.data() + text.size()))
          return "'" + text + "' is not an integer";
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return "must be " + range + ", not " + text;
        return {};
      },
      "INT " + range, "INTEGER_IN");
}

/// Text that is not empty (an address, a path): `--listen ""` would otherwise mean "none".
/// Message: "must not be empty".
inline CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; }, "",
      "NON_EMPTY");
}

/// An unsigned 64-bit integer (0 to 18446744073709551615), such as a seed. Messages:
/// "'-1' is not an unsigned integer", "18446744073709551616 is above 18446744073709551615".
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc::result_out_of_range)
          return text + " is above " + std::to_string(UINT64_MAX);
        if (ec != std::errc{} || end != text.data() + text.size())
          return "'" + text + "' is not an unsigned integer";
        return {};
      },
      "UINT64", "UNSIGNED_INTEGER");
}

/// A finite real number above 0, such as a learning rate ("1e-3" and "0.001" both parse).
/// Messages: "'abc' is not a number", "must be a finite number above 0, not -1".
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc::invalid_argument || end != text.data() + text.size())
          return "'" + text + "' is not a number";
        if (ec == std::errc::result_out_of_range || !std::isfinite(v) || !(v > 0))
          return "must be a finite number above 0, not " + text;
        return {};
      },
      "NUMBER above 0", "POSITIVE_NUMBER");
}

/// What to tell a user whose `flag` gives a tcp:// `addr` while the job secret is not set (TCP
/// channels refuse to run without it; the channel layer's own message names
/// ChannelOptions::secret, a C++ field): "--listen tcp://...: a TCP address needs the job's shared
/// secret: set MONARCH_SECRET or MONARCH_SECRET_FILE" (`other_ways` goes before those, e.g.
/// "--secret-file, "). Empty when addr is not tcp:// or the secret is set. A secret file that
/// cannot be read is the channel layer's error, returned as it is.
inline std::string tcp_secret_problem(const std::string& flag, const std::string& addr,
                                      const std::string& other_ways = "") {
  if (addr.rfind("tcp://", 0) != 0) return {};
  try {
    if (!monarch::channel::job_secret(monarch::channel::ChannelOptions{}).empty()) return {};
  } catch (const std::exception& e) {
    return e.what();
  }
  return flag + " " + addr + ": a TCP address needs the job's shared secret: set " + other_ways +
         "MONARCH_SECRET or MONARCH_SECRET_FILE";
}

}  // namespace monarch::cli
