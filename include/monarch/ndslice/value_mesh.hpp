// ValueMesh<T>: one value per point of an Extent (e.g. the replies of a mesh call), indexed by
// Point or by rank (row-major rank within the extent). Storage is run-length encoded: consecutive
// ranks holding equal values share one run, so a mesh where every rank returned the same value
// costs O(1) memory. T must be copyable and equality-comparable.
//
// Per-rank failures: a rank may hold an error (a std::exception_ptr) instead of a value, e.g. the
// member of a mesh call whose proc died or whose handler threw. Reading a failed rank (get,
// operator[], the iterator, to_vector) rethrows that rank's own exception, with its original type
// (ActorError, SupervisionError, ...); ok(), error(), failed_ranks() and throw_if_failed() inspect
// failures without throwing. Failures live in a separate small vector sorted by rank, so a mesh
// without failures keeps its O(1) memory and O(log runs) reads (one empty() check more). A failed
// rank sits inside some run; the value that run stores is never read for it. When every rank
// failed, no value is stored at all (T need not be default-constructible).
//
// Not thread-safe: like a std::vector, concurrent reads are fine, a write needs exclusive access.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/point.hpp"
#include "monarch/ndslice/shape.hpp"

namespace monarch::ndslice {

// [[nodiscard]]: a ValueMesh may hold errors (a mesh call's failed members), so dropping one
// unread would lose them silently; call throw_if_failed() when only success matters.
template <class T>
class [[nodiscard]] ValueMesh {
 public:
  /// (rank, error) of one failed rank.
  using Failure = std::pair<std::size_t, std::exception_ptr>;

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

  /// Builds from per-rank slots: slots[r] is the value of rank r, or nullopt when rank r failed;
  /// `failures` holds (rank, error) for every failed rank, in any order. Every rank may have
  /// failed (then no value is stored at all). Throws SliceError, naming the rank, when
  /// slots.size() != extent.num_ranks(), or a failure's rank is out of range, repeats, has a null
  /// error or has a value in `slots`, or a nullopt slot has no failure.
  static ValueMesh from_slots(Extent extent, std::vector<std::optional<T>> slots,
                              std::vector<Failure> failures) {
    const std::size_t n = extent.num_ranks();
    if (slots.size() != n) {
      throw SliceError("value_mesh: from_slots: " + std::to_string(slots.size()) +
                       " slots for extent " + extent.to_string() + " of " + std::to_string(n) +
                       " ranks");
    }
    std::sort(failures.begin(), failures.end(),
              [](const Failure& a, const Failure& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < failures.size(); ++i) {
      const std::size_t r = failures[i].first;
      const std::string what = "value_mesh: from_slots: failure for rank " + std::to_string(r);
      if (r >= n) {
        throw SliceError(what + " out of range for extent " + extent.to_string() + " of " +
                         std::to_string(n) + " ranks");
      }
      if (i > 0 && failures[i - 1].first == r) throw SliceError(what + " given twice");
      if (!failures[i].second) throw SliceError(what + " has a null error");
      if (slots[r].has_value()) throw SliceError(what + ", but its slot holds a value");
    }
    ValueMesh m(NoRuns{}, std::move(extent));
    std::size_t next_failed = 0;  // index into the sorted failures
    for (std::size_t r = 0; r < n; ++r) {
      if (next_failed < failures.size() && failures[next_failed].first == r) {
        ++next_failed;  // failed: stays inside the current run (its stored value is never read)
        continue;
      }
      if (!slots[r].has_value()) {
        throw SliceError("value_mesh: from_slots: rank " + std::to_string(r) +
                         " has neither a value nor a failure");
      }
      if (m.runs_.empty()) {
        m.runs_.push_back(Run{0, std::move(*slots[r])});  // leading failed ranks join it
      } else if (!(*slots[r] == m.runs_.back().value)) {
        m.runs_.push_back(Run{r, std::move(*slots[r])});
      }
    }
    m.failures_ = std::move(failures);
    return m;
  }

  [[nodiscard]] const Extent& extent() const noexcept { return extent_; }
  /// Number of ranks, failed ones included (= extent().num_ranks()).
  [[nodiscard]] std::size_t size() const noexcept { return extent_.num_ranks(); }
  /// Number of stored runs of equal consecutive values (0 <= runs() <= size(); 0 exactly when
  /// every rank failed). A failed rank keeps the run it was in; from_slots never starts a run at
  /// one.
  [[nodiscard]] std::size_t runs() const noexcept { return runs_.size(); }

  /// Value at rank (0 <= rank < size(), else SliceError). O(log runs()) without failures, plus
  /// O(log failures) with some. A failed rank rethrows its own error (its original type).
  [[nodiscard]] const T& get(std::size_t rank) const {
    if (!failures_.empty()) rethrow_if_failed(rank);
    return runs_[find(rank)].value;
  }
  [[nodiscard]] const T& operator[](std::size_t rank) const { return get(rank); }
  /// Value at a point; throws SliceError if p.extent() != extent(), and a failed rank's error.
  [[nodiscard]] const T& get(const Point& p) const { return get(rank_of(p)); }
  [[nodiscard]] const T& operator[](const Point& p) const { return get(p); }

  /// Sets the value at rank (0 <= rank < size(), else SliceError), splitting/merging runs. A
  /// failed rank stops being failed.
  void set(std::size_t rank, T value) {
    if (!failures_.empty()) {
      check_rank(rank);
      auto it = find_failure(rank);
      if (it != failures_.end() && it->first == rank) failures_.erase(it);
      if (runs_.empty()) {  // every rank had failed: one run again, the others stay failed
        runs_.push_back(Run{0, std::move(value)});
        return;
      }
    }
    const std::size_t k = find(rank);
    if (runs_[k].value == value) return;
    const std::size_t b = runs_[k].begin;
    const std::size_t e = run_end(k);
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

  /// Marks rank failed with error `e` (replacing an earlier error of that rank); its value is
  /// dropped from view. Throws SliceError when rank >= size() or `e` is null. O(failures).
  void set_error(std::size_t rank, std::exception_ptr e) {
    check_rank(rank);
    if (!e) {
      throw SliceError("value_mesh: set_error: null error for rank " + std::to_string(rank));
    }
    auto it = find_failure(rank);
    if (it != failures_.end() && it->first == rank) {
      it->second = std::move(e);
    } else {
      failures_.insert(it, Failure{rank, std::move(e)});
    }
    if (failures_.size() == size()) runs_.clear();  // every rank failed: no value is kept
  }

  /// Whether rank holds a value (false: it failed). Throws SliceError when rank >= size().
  [[nodiscard]] bool ok(std::size_t rank) const {
    check_rank(rank);
    if (failures_.empty()) return true;
    auto it = find_failure(rank);
    return it == failures_.end() || it->first != rank;
  }
  /// Whether no rank failed.
  [[nodiscard]] bool all_ok() const noexcept { return failures_.empty(); }
  /// The failed ranks, ascending.
  [[nodiscard]] std::vector<std::size_t> failed_ranks() const {
    std::vector<std::size_t> out;
    out.reserve(failures_.size());
    for (const auto& f : failures_) out.push_back(f.first);
    return out;
  }
  /// The error of a failed rank; null when the rank is ok. Throws SliceError when rank >= size().
  [[nodiscard]] std::exception_ptr error(std::size_t rank) const {
    check_rank(rank);
    if (failures_.empty()) return nullptr;
    auto it = find_failure(rank);
    return it != failures_.end() && it->first == rank ? it->second : nullptr;
  }
  /// Rethrows the error of the lowest failed rank (its original type); no-op when all_ok().
  void throw_if_failed() const {
    if (!failures_.empty()) std::rethrow_exception(failures_.front().second);
  }

  /// All values in rank order. When a rank failed, rethrows the error of the lowest failed rank
  /// (throw_if_failed).
  [[nodiscard]] std::vector<T> to_vector() const {
    throw_if_failed();
    std::vector<T> out;
    out.reserve(size());
    for (std::size_t k = 0; k < runs_.size(); ++k) {
      out.insert(out.end(), run_end(k) - runs_[k].begin, runs_[k].value);
    }
    return out;
  }

  /// Same extent, same failed ranks (their errors are not compared), and the same value at every
  /// other rank. O(runs) without failures, O(runs * log failures) with some.
  friend bool operator==(const ValueMesh& a, const ValueMesh& b) {
    if (!(a.extent_ == b.extent_)) return false;
    if (a.failures_.empty() && b.failures_.empty()) return a.runs_ == b.runs_;
    if (a.failures_.size() != b.failures_.size()) return false;
    for (std::size_t i = 0; i < a.failures_.size(); ++i) {
      if (a.failures_[i].first != b.failures_[i].first) return false;
    }
    if (a.runs_.empty()) return true;  // every rank failed, in both
    // Walk the segments on which both meshes store one value each; where those differ, every
    // rank of the segment must have failed. Failed ranks may sit in different runs in a and b.
    std::size_t i = 0;
    std::size_t j = 0;
    for (std::size_t lo = 0; lo < a.size();) {
      const std::size_t ea = a.run_end(i);
      const std::size_t eb = b.run_end(j);
      const std::size_t hi = std::min(ea, eb);
      if (!(a.runs_[i].value == b.runs_[j].value) && a.failures_between(lo, hi) != hi - lo) {
        return false;
      }
      lo = hi;
      if (ea == hi) ++i;
      if (eb == hi) ++j;
    }
    return true;
  }

  /// Input iterator yielding std::pair<Point, const T&> in rank order. Dereferencing it at a
  /// failed rank rethrows that rank's error (check ok(rank) when iterating a mesh with failures).
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = std::pair<Point, const T&>;
    using difference_type = std::ptrdiff_t;
    using reference = value_type;

    iterator() = default;
    value_type operator*() const {
      if (!m_->failures_.empty()) m_->rethrow_if_failed(rank_);
      return {m_->extent_.point(rank_), m_->runs_[run_].value};
    }
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
  struct NoRuns {};
  ValueMesh(NoRuns, Extent extent) : extent_(std::move(extent)) {}

  void check_rank(std::size_t rank) const {
    if (rank >= size()) {
      throw SliceError("value_mesh: rank " + std::to_string(rank) + " out of range for extent " +
                       extent_.to_string() + " of " + std::to_string(size()) + " ranks");
    }
  }

  std::size_t find(std::size_t rank) const {
    check_rank(rank);
    auto it = std::upper_bound(runs_.begin(), runs_.end(), rank,
                               [](std::size_t r, const Run& run) { return r < run.begin; });
    return static_cast<std::size_t>(it - runs_.begin()) - 1;
  }
  std::size_t run_end(std::size_t k) const noexcept {
    return k + 1 < runs_.size() ? runs_[k + 1].begin : size();
  }

  // First failure with rank >= `rank`.
  typename std::vector<Failure>::const_iterator find_failure(std::size_t rank) const {
    return std::lower_bound(failures_.begin(), failures_.end(), rank,
                            [](const Failure& f, std::size_t r) { return f.first < r; });
  }
  typename std::vector<Failure>::iterator find_failure(std::size_t rank) {
    return std::lower_bound(failures_.begin(), failures_.end(), rank,
                            [](const Failure& f, std::size_t r) { return f.first < r; });
  }
  void rethrow_if_failed(std::size_t rank) const {
    auto it = find_failure(rank);
    if (it != failures_.end() && it->first == rank) std::rethrow_exception(it->second);
  }
  // Number of failed ranks in [lo, hi).
  std::size_t failures_between(std::size_t lo, std::size_t hi) const {
    return static_cast<std::size_t>(find_failure(hi) - find_failure(lo));
  }

  std::size_t rank_of(const Point& p) const {
    if (!(p.extent() == extent_)) {
      throw SliceError("value_mesh: point " + p.to_string() + " is in extent " +
                       p.extent().to_string() + ", not the mesh's extent " + extent_.to_string());
    }
    return p.rank();
  }

  Extent extent_;
  // Sorted by begin; runs_[0].begin == 0; neighbours differ in value. Empty exactly when every
  // rank failed.
  std::vector<Run> runs_;
  // Sorted by rank, unique, non-null errors; usually empty (the fast path checks only that).
  std::vector<Failure> failures_;
};

}  // namespace monarch::ndslice
