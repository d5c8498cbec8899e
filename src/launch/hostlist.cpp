// SLURM hostlist expansion (see hostlist.hpp).
#include "monarch/launch/hostlist.hpp"

#include <cctype>
#include <cstdint>

namespace monarch::launch {
namespace {

[[noreturn]] void bad(std::string_view all, std::string_view part, const std::string& why) {
  throw HostlistError("bad hostlist '" + std::string(all) + "': '" + std::string(part) +
                      "': " + why);
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) return false;
  }
  return true;
}

uint64_t to_number(std::string_view all, std::string_view s) {
  if (s.size() > 18) bad(all, s, "number too long");
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

std::string padded(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "01-04,07" -> {"01","02","03","04","07"}
std::vector<std::string> expand_ranges(std::string_view all, std::string_view body) {
  std::vector<std::string> out;
  if (body.empty()) bad(all, "[]", "empty brackets");
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string_view r =
        body.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    size_t dash = r.find('-');
    std::string_view lo_s = r.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : r.substr(dash + 1);
    if (!all_digits(lo_s) || !all_digits(hi_s)) {
      bad(all, "[" + std::string(body) + "]",
          "range '" + std::string(r) + "' is not N or N-M with digits");
    }
    uint64_t lo = to_number(all, lo_s), hi = to_number(all, hi_s);
    if (hi < lo)
      bad(all, "[" + std::string(body) + "]", "range '" + std::string(r) + "' runs backwards");
    if (hi - lo >= 1'000'000)
      bad(all, "[" + std::string(body) + "]", "range '" + std::string(r) + "' is too large");
    for (uint64_t v = lo; v <= hi; ++v) out.push_back(padded(v, lo_s.size()));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

// One host expression without top-level commas: "a[1-2]b[3,4]" -> cartesian product.
void expand_item(std::string_view all, std::string_view item, std::vector<std::string>& out) {
  if (item.empty()) bad(all, item, "empty host name (stray comma?)");
  std::vector<std::string> acc{""};
  size_t pos = 0;
  while (pos < item.size()) {
    char c = item[pos];
    if (c == ']') bad(all, item, "']' without '['");
    if (c == '[') {
      size_t close = item.find(']', pos);
      if (close == std::string_view::npos) bad(all, item, "'[' without ']'");
      std::string_view body = item.substr(pos + 1, close - pos - 1);
      if (body.find('[') != std::string_view::npos) bad(all, item, "nested '['");
      auto values = expand_ranges(all, body);
      std::vector<std::string> next;
      next.reserve(acc.size() * values.size());
      for (const auto& a : acc) {
        for (const auto& v : values) next.push_back(a + v);
      }
      acc = std::move(next);
      pos = close + 1;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c)) != 0)
      bad(all, item, "whitespace in a host name");
    for (auto& a : acc) a += c;
    ++pos;
  }
  for (auto& a : acc) out.push_back(std::move(a));
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view hostlist) {
  std::vector<std::string> out;
  if (hostlist.empty()) throw HostlistError("bad hostlist '': empty");
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    if (i == hostlist.size() || (hostlist[i] == ',' && depth == 0)) {
      expand_item(hostlist, hostlist.substr(start, i - start), out);
      start = i + 1;
      continue;
    }
    if (hostlist[i] == '[') ++depth;
    if (hostlist[i] == ']') depth = depth > 0 ? depth - 1 : 0;
  }
  return out;
}

}  // namespace monarch::launch
