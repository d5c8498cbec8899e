// Shape (alias View): labels + Slice, i.e. a possibly strided sub-mesh of a dense rank space.
//
// A Shape built from an Extent is dense: its global ranks are the extent's ranks. Every operation
// returns a new Shape over the SAME global rank space:
//   Extent e{{"hosts", 2}, {"gpus", 4}};
//   Shape s(e);                                   // {hosts=2, gpus=4}, ranks 0..7
//   s.slice("gpus", Range{1, 4, 2})               // {hosts=2, gpus=2}, ranks 1 3 5 7
//   s.slice("hosts", 1)                           // {gpus=4},          ranks 4 5 6 7
// "Local" ranks/points are positions within the shape's own extent(); "global" ranks are
// locations in the base rank space (Slice::location).
#pragma once

#include <cstddef>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/point.hpp"
#include "monarch/ndslice/slice.hpp"

namespace monarch::ndslice {

class Shape {
 public:
  /// Zero-dimensional shape with the single global rank 0.
  Shape() = default;
  /// Dense shape over the extent (global rank == extent rank).
  explicit Shape(const Extent& extent);
  /// Labels for the dims of `slice`. Throws SliceError on mismatched lengths, empty/duplicate
  /// labels.
  Shape(std::vector<std::string> labels, Slice slice);

  [[nodiscard]] const std::vector<std::string>& labels() const noexcept { return extent_.labels(); }
  [[nodiscard]] const std::vector<std::size_t>& sizes() const noexcept { return sl_.sizes(); }
  [[nodiscard]] std::size_t num_dims() const noexcept { return sl_.num_dims(); }
  [[nodiscard]] std::size_t num_ranks() const noexcept { return sl_.len(); }
  /// Labels and sizes of this view (local rank space).
  [[nodiscard]] const Extent& extent() const noexcept { return extent_; }
  /// The underlying slice (offset/sizes/strides into the global rank space).
  [[nodiscard]] const Slice& slice_() const noexcept { return sl_; }
  [[nodiscard]] const Slice& base() const noexcept { return sl_; }

  /// Fixes dim `dim` at `index` and drops it. Throws SliceError for an unknown dim or index >= size
  /// (e.g. "slice: index 7 out of range for dim 'gpus' of size 4").
  [[nodiscard]] Shape slice(std::string_view dim, std::size_t index) const;
  /// Keeps dim `dim`, restricted to r (see Range). Throws SliceError for an unknown dim, step 0,
  /// begin >= size, end > size, or an empty range.
  [[nodiscard]] Shape slice(std::string_view dim, const Range& r) const;
  /// Alias of slice(dim, r).
  [[nodiscard]] Shape select(std::string_view dim, const Range& r) const { return slice(dim, r); }
  /// Replaces dim `dim` by dims `names` with `sizes` (row-major). Throws SliceError when the
  /// lengths differ, the product of sizes != size of dim, a size is 0, or a name duplicates another
  /// dim.
  [[nodiscard]] Shape split(std::string_view dim, const std::vector<std::string>& names,
                            const std::vector<std::size_t>& sizes) const;
  /// One dim `new_name` of size num_ranks(). Throws SliceError unless the view is contiguous
  /// (Slice::is_contiguous) or if new_name is empty.
  [[nodiscard]] Shape flatten(std::string new_name) const;
  /// Renames dim `from` to `to`. Throws SliceError for an unknown `from` or a `to` already in use.
  [[nodiscard]] Shape rename(std::string_view from, std::string to) const;

  /// Global rank of a point of extent(). Throws SliceError if p.extent() != extent().
  [[nodiscard]] std::size_t rank_of(const Point& p) const;
  /// Global rank of local coordinates. Throws SliceError on bad coordinates (names the dim).
  [[nodiscard]] std::size_t rank_of(const std::vector<std::size_t>& coords) const;
  /// Point (in extent()) of a global rank. Throws SliceError if the rank is not in this view.
  [[nodiscard]] Point point_of_rank(std::size_t global) const;
  /// Global rank of the point with local rank `local` (0 <= local < num_ranks(), else SliceError).
  [[nodiscard]] std::size_t global_rank(std::size_t local) const;
  /// Whether the global rank belongs to this view.
  [[nodiscard]] bool contains(std::size_t global) const { return sl_.contains(global); }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return a.extent_ == b.extent_ && a.sl_ == b.sl_;
  }

  /// "{hosts=2, gpus=2} @ Slice{offset=1, sizes=[2, 2], strides=[4, 2]}".
  [[nodiscard]] std::string to_string() const;

  /// Input iterator over the Points of extent() in row-major order (one Point per step).
  class point_iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Point;
    using difference_type = std::ptrdiff_t;
    using pointer = const Point*;
    using reference = Point;

    point_iterator() = default;
    Point operator*() const { return extent_->point(index_); }
    point_iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    point_iterator operator++(int) noexcept {
      point_iterator t = *this;
      ++index_;
      return t;
    }
    friend bool operator==(const point_iterator& a, const point_iterator& b) noexcept {
      return a.index_ == b.index_;
    }

   private:
    friend class Shape;
    const Extent* extent_ = nullptr;
    std::size_t index_ = 0;
  };

  [[nodiscard]] point_iterator begin() const;
  [[nodiscard]] point_iterator end() const;

 private:
  Extent extent_;
  Slice sl_;
};

using View = Shape;

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace monarch::ndslice
