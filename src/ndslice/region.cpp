#include "monarch/ndslice/region.hpp"

#include <algorithm>

namespace monarch::ndslice {

Region::Region(const Shape& shape) {
  std::vector<std::size_t> ranks;
  ranks.reserve(shape.num_ranks());
  shape.base().for_each([&](std::size_t r) { ranks.push_back(r); });
  *this = from_ranks(std::move(ranks));
}

Region::Region(const Extent& extent)
    : runs_{Run{0, extent.num_ranks()}}, size_(extent.num_ranks()) {}

Region Region::from_ranks(std::vector<std::size_t> ranks) {
  if (!std::is_sorted(ranks.begin(), ranks.end())) std::sort(ranks.begin(), ranks.end());
  Region r;
  for (std::size_t x : ranks) {
    if (!r.runs_.empty() && x < r.runs_.back().end) continue;  // duplicate
    if (!r.runs_.empty() && x == r.runs_.back().end) {
      ++r.runs_.back().end;
    } else {
      r.runs_.push_back(Run{x, x + 1});
    }
    ++r.size_;
  }
  return r;
}

Region Region::coalesce(const std::vector<Run>& sorted) {
  Region r;
  for (const Run& run : sorted) {
    if (!r.runs_.empty() && run.begin <= r.runs_.back().end) {
      r.runs_.back().end = std::max(r.runs_.back().end, run.end);
    } else {
      r.runs_.push_back(run);
    }
  }
  for (const Run& run : r.runs_) r.size_ += run.end - run.begin;
  return r;
}

Region Region::from_runs(std::vector<Run> runs) {
  for (const Run& run : runs) {
    if (run.begin >= run.end) {
      throw SliceError("region: empty run [" + std::to_string(run.begin) + ", " +
                       std::to_string(run.end) + "): begin must be < end");
    }
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  return coalesce(runs);
}

bool Region::contains(std::size_t rank) const noexcept {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), rank,
                             [](std::size_t x, const Run& run) { return x < run.begin; });
  if (it == runs_.begin()) return false;
  --it;
  return rank < it->end;
}

std::vector<std::size_t> Region::ranks() const {
  std::vector<std::size_t> out;
  out.reserve(size_);
  for (const Run& run : runs_) {
    for (std::size_t x = run.begin; x < run.end; ++x) out.push_back(x);
  }
  return out;
}

Region Region::union_(const Region& other) const {
  std::vector<Run> all;
  all.reserve(runs_.size() + other.runs_.size());
  std::merge(runs_.begin(), runs_.end(), other.runs_.begin(), other.runs_.end(),
             std::back_inserter(all), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  return coalesce(all);
}

Region Region::intersection(const Region& other) const {
  Region r;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < runs_.size() && j < other.runs_.size()) {
    const Run& a = runs_[i];
    const Run& b = other.runs_[j];
    const std::size_t lo = std::max(a.begin, b.begin);
    const std::size_t hi = std::min(a.end, b.end);
    if (lo < hi) {
      r.runs_.push_back(Run{lo, hi});
      r.size_ += hi - lo;
    }
    if (a.end < b.end) {
      ++i;
    } else {
      ++j;
    }
  }
  return r;
}

Region Region::difference(const Region& other) const {
  Region r;
  std::size_t j = 0;
  for (const Run& a : runs_) {
    std::size_t cur = a.begin;
    while (j < other.runs_.size() && other.runs_[j].end <= cur) ++j;
    std::size_t k = j;
    while (cur < a.end) {
      if (k >= other.runs_.size() || other.runs_[k].begin >= a.end) {
        r.runs_.push_back(Run{cur, a.end});
        r.size_ += a.end - cur;
        break;
      }
      const Run& b = other.runs_[k];
      if (b.begin > cur) {
        r.runs_.push_back(Run{cur, b.begin});
        r.size_ += b.begin - cur;
      }
      cur = std::max(cur, b.end);
      ++k;
    }
  }
  return r;
}

std::string Region::to_string() const {
  std::string s = "{";
  for (std::size_t i = 0; i < runs_.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(runs_[i].begin);
    if (runs_[i].end - runs_[i].begin > 1) s += ".." + std::to_string(runs_[i].end - 1);
  }
  return s + "}";
}

Region::iterator Region::begin() const noexcept {
  iterator it;
  it.runs_ = &runs_;
  it.run_ = 0;
  it.rank_ = runs_.empty() ? 0 : runs_[0].begin;
  return it;
}

Region::iterator Region::end() const noexcept {
  iterator it;
  it.runs_ = &runs_;
  it.run_ = runs_.size();
  it.rank_ = 0;
  return it;
}

std::ostream& operator<<(std::ostream& os, const Region& r) {
  return os << r.to_string();
}

}  // namespace monarch::ndslice
