// ValueMesh<T>: one value per point of an Extent (e.g. the replies of a mesh call), indexed by
// Point or by rank (row-major rank within the extent). Storage is run-length encoded: consecutive
// ranks holding equal values share one run, so a mesh where every rank returned the same value
// costs O(1) memory. T must be copyable and equality-comparable.
#pragma once

#include <algorithm>
#include <exception>
#include <optional>
#include <cstddef>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/point.hpp"
#include "monarch/ndslice/shape.hpp"

namespace monarch::ndslice {

template <class T>
class ValueMesh {
 public:
  /// Every rank of `extent` holds `fill` (one run).
  ValueMesh(Extent extent, T fill) : extent_(std::move(extent)) {
    runs_.push_back(Run{0, std::move(fill)});
  }
  /// Over the (local) extent of a shape.
  ValueMesh(const Shape& shape, T fill) : ValueMesh(shape.extent(), std::move(fill)) {}

  /// values[r] is the value at rank r. Throws SliceError if values.size() != extent.num_ranks().
  static ValueMesh from_vector(Extent extent, const std::vector<T>& values) {
    if (values.size() != extent.num_ranks()) {
      throw SliceError("value_mesh: " + std::to_string(values.size()) + " values for extent " +
                       extent.to_string() + " of " + std::to_string(extent.num_ranks()) + " ranks");
    }
    ValueMesh m(std::move(extent), values[0]);
    for (std::size_t r = 1; r < values.size(); ++r) {
      if (!(values[r] == m.runs_.back().value)) m.runs_.push_back(Run{r, values[r]});
    }
    return m;
  }

  // TEMP (lead's stand-in until H1's version lands)
  static ValueMesh from_slots(Extent extent, std::vector<std::optional<T>> slots,
                              std::vector<std::pair<std::size_t, std::exception_ptr>> failures) {
    std::optional<T> any;
    for (auto& v : slots) if (v) { any = v; break; }
    if (!any) throw SliceError("from_slots: all failed (stand-in)");
    std::vector<T> vals;
    for (auto& v : slots) vals.push_back(v ? *v : *any);
    ValueMesh m = from_vector(std::move(extent), vals);
    std::sort(failures.begin(), failures.end(), [](auto& a, auto& b) { return a.first < b.first; });
    m.failures_ = std::move(failures);
    return m;
  }
  bool ok(std::size_t r) const {
    for (auto& f : failures_) if (f.first == r) return false;
    return true;
  }
  std::exception_ptr error(std::size_t r) const {
    for (auto& f : failures_) if (f.first == r) return f.second;
    return nullptr;
  }
  bool all_ok() const noexcept { return failures_.empty(); }
  std::vector<std::size_t> failed_ranks() const {
    std::vector<std::size_t> o;
    for (auto& f : failures_) o.push_back(f.first);
    return o;
  }
  void throw_if_failed() const { if (!failures_.empty()) std::rethrow_exception(failures_[0].second); }
  std::vector<std::pair<std::size_t, std::exception_ptr>> failures_;
  [[nodiscard]] const Extent& extent() const noexcept { return extent_; }
  /// Number of values (= extent().num_ranks()).
  [[nodiscard]] std::size_t size() const noexcept { return extent_.num_ranks(); }
  /// Number of runs of equal consecutive values (1 <= runs() <= size()).
  [[nodiscard]] std::size_t runs() const noexcept { return runs_.size(); }

  /// Value at rank (0 <= rank < size(), else SliceError). O(log runs()).
  [[nodiscard]] const T& get(std::size_t rank) const { return runs_[find(rank)].value; }
  [[nodiscard]] const T& operator[](std::size_t rank) const { return get(rank); }
  /// Value at a point; throws SliceError if p.extent() != extent().
  [[nodiscard]] const T& get(const Point& p) const { return get(rank_of(p)); }
  [[nodiscard]] const T& operator[](const Point& p) const { return get(p); }

  /// Sets the value at rank (0 <= rank < size(), else SliceError), splitting/merging runs.
  void set(std::size_t rank, T value) {
    const std::size_t k = find(rank);
    if (runs_[k].value == value) return;
    const std::size_t b = runs_[k].begin;
    const std::size_t e = k + 1 < runs_.size() ? runs_[k + 1].begin : size();
    std::vector<Run> repl;
    if (b < rank) repl.push_back(Run{b, runs_[k].value});
    repl.push_back(Run{rank, std::move(value)});
    if (rank + 1 < e) repl.push_back(Run{rank + 1, runs_[k].value});
    const auto pos = runs_.begin() + static_cast<std::ptrdiff_t>(k);
    runs_.erase(pos);
    runs_.insert(runs_.begin() + static_cast<std::ptrdiff_t>(k), repl.begin(), repl.end());
    // Merge with equal neighbours (only runs k-1 .. k+repl.size() can have changed).
    std::size_t lo = k == 0 ? 0 : k - 1;
    std::size_t hi = std::min(k + repl.size(), runs_.size() - 1);
    for (std::size_t i = hi; i > lo; --i) {
      if (runs_[i].value == runs_[i - 1].value) {
        runs_.erase(runs_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }
  /// Sets the value at a point; throws SliceError if p.extent() != extent().
  void set(const Point& p, T value) { set(rank_of(p), std::move(value)); }

  /// All values in rank order.
  [[nodiscard]] std::vector<T> to_vector() const {
    std::vector<T> out;
    out.reserve(size());
    for (std::size_t k = 0; k < runs_.size(); ++k) {
      const std::size_t e = k + 1 < runs_.size() ? runs_[k + 1].begin : size();
      out.insert(out.end(), e - runs_[k].begin, runs_[k].value);
    }
    return out;
  }

  /// Same extent and same values.
  friend bool operator==(const ValueMesh& a, const ValueMesh& b) {
    return a.extent_ == b.extent_ && a.runs_ == b.runs_;
  }

  /// Input iterator yielding std::pair<Point, const T&> in rank order.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = std::pair<Point, const T&>;
    using difference_type = std::ptrdiff_t;
    using reference = value_type;

    iterator() = default;
    value_type operator*() const { return {m_->extent_.point(rank_), m_->runs_[run_].value}; }
    iterator& operator++() noexcept {
      ++rank_;
      if (run_ + 1 < m_->runs_.size() && m_->runs_[run_ + 1].begin == rank_) ++run_;
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.rank_ == b.rank_;
    }

   private:
    friend class ValueMesh;
    const ValueMesh* m_ = nullptr;
    std::size_t rank_ = 0;
    std::size_t run_ = 0;
  };

  [[nodiscard]] iterator begin() const noexcept {
    iterator it;
    it.m_ = this;
    return it;
  }
  [[nodiscard]] iterator end() const noexcept {
    iterator it;
    it.m_ = this;
    it.rank_ = size();
    it.run_ = runs_.size();
    return it;
  }

 private:
  struct Run {
    std::size_t begin;  // first rank of the run; it extends to the next run's begin (or size())
    T value;
    friend bool operator==(const Run& a, const Run& b) {
      return a.begin == b.begin && a.value == b.value;
    }
  };

  std::size_t find(std::size_t rank) const {
    if (rank >= size()) {
      throw SliceError("value_mesh: rank " + std::to_string(rank) + " out of range for extent " +
                       extent_.to_string() + " of " + std::to_string(size()) + " ranks");
    }
    auto it = std::upper_bound(runs_.begin(), runs_.end(), rank,
                               [](std::size_t r, const Run& run) { return r < run.begin; });
    return static_cast<std::size_t>(it - runs_.begin()) - 1;
  }

  std::size_t rank_of(const Point& p) const {
    if (!(p.extent() == extent_)) {
      throw SliceError("value_mesh: point " + p.to_string() + " is in extent " +
                       p.extent().to_string() + ", not the mesh's extent " + extent_.to_string());
    }
    return p.rank();
  }

  Extent extent_;
  std::vector<Run> runs_;  // sorted by begin; runs_[0].begin == 0; neighbours differ in value
};

}  // namespace monarch::ndslice
