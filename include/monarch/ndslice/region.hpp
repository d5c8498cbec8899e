// Region: a possibly sparse set of ranks, stored as sorted, disjoint, non-adjacent half-open runs
// [begin, end). Ranks are interpreted in whatever rank space produced them: Region(shape) and
// eval(selection, shape) give GLOBAL ranks of the shape's base space; Region(extent) gives the
// extent's ranks 0..num_ranks-1.
#pragma once

#include <cstddef>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/point.hpp"
#include "monarch/ndslice/shape.hpp"

namespace monarch::ndslice {

class Region {
 public:
  /// Half-open run of consecutive ranks [begin, end), begin < end.
  struct Run {
    std::size_t begin;
    std::size_t end;
    friend bool operator==(const Run&, const Run&) = default;
  };

  /// The empty region.
  Region() = default;
  /// Global ranks of every point of the shape.
  explicit Region(const Shape& shape);
  /// All ranks 0 .. extent.num_ranks()-1.
  explicit Region(const Extent& extent);

  /// From any ranks (unsorted, duplicates allowed).
  static Region from_ranks(std::vector<std::size_t> ranks);
  /// From runs (any order, may overlap/touch; they are normalised). Throws SliceError if a run has
  /// begin >= end.
  static Region from_runs(std::vector<Run> runs);

  [[nodiscard]] bool contains(std::size_t rank) const noexcept;
  /// contains(p.rank()): the point's rank within its own extent.
  [[nodiscard]] bool contains(const Point& p) const { return contains(p.rank()); }
  /// Number of ranks.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] const std::vector<Run>& runs() const noexcept { return runs_; }
  /// All ranks, ascending.
  [[nodiscard]] std::vector<std::size_t> ranks() const;

  /// Set union / intersection / difference (linear in the number of runs).
  [[nodiscard]] Region union_(const Region& other) const;
  [[nodiscard]] Region intersection(const Region& other) const;
  [[nodiscard]] Region difference(const Region& other) const;

  friend bool operator==(const Region&, const Region&) = default;

  /// "{0..3, 8, 10..11}" (inclusive bounds), "{}" when empty.
  [[nodiscard]] std::string to_string() const;

  /// Forward iterator over ranks in ascending order.
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::size_t;
    using difference_type = std::ptrdiff_t;
    using pointer = const std::size_t*;
    using reference = std::size_t;

    iterator() = default;
    std::size_t operator*() const noexcept { return rank_; }
    iterator& operator++() noexcept {
      if (++rank_ == (*runs_)[run_].end) {
        ++run_;
        rank_ = run_ < runs_->size() ? (*runs_)[run_].begin : 0;
      }
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.run_ == b.run_ && a.rank_ == b.rank_;
    }

   private:
    friend class Region;
    const std::vector<Run>* runs_ = nullptr;
    std::size_t run_ = 0;
    std::size_t rank_ = 0;
  };

  [[nodiscard]] iterator begin() const noexcept;
  [[nodiscard]] iterator end() const noexcept;

 private:
  // Merges runs sorted by begin (overlapping or adjacent ones join) into a Region.
  static Region coalesce(const std::vector<Run>& sorted);
  std::vector<Run> runs_;
  std::size_t size_ = 0;
};

/// Free-function forms of the set operations.
inline Region union_(const Region& a, const Region& b) {
  return a.union_(b);
}
inline Region intersection(const Region& a, const Region& b) {
  return a.intersection(b);
}

std::ostream& operator<<(std::ostream& os, const Region& r);

}  // namespace monarch::ndslice
