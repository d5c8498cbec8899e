// Slice: offset + sizes + strides over a dense rank space.
//
// A slice with sizes [s0..sn-1] and strides [t0..tn-1] maps local coordinates c (0 <= ci < si) to
// the global rank  offset + sum(ci * ti).  Its points are enumerated in row-major order of local
// coordinates (last dim fastest); `index(global)` is that local row-major position.
// Slice::dense({2, 4}) is offset 0, strides {4, 1}.  All arithmetic is checked: constructing a
// slice whose largest rank, or whose number of points, does not fit in size_t throws SliceError.
// Operations taking a dim take its position (0-based); messages name it as "#i".
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "monarch/ndslice/error.hpp"

namespace monarch::ndslice {

/// Half-open strided range [begin, end) with a positive step; an absent end means "to the end of
/// the dimension". Range{1, 4, 2} selects 1 and 3; Range{2} selects 2..size-1.
struct Range {
  /// 0: (everything).
  Range() = default;
  /// begin: (to the end).
  explicit Range(std::size_t b) : begin(b) {}
  /// begin:end:step; end == nullopt means to the end.
  Range(std::size_t b, std::optional<std::size_t> e, std::size_t s = 1)
      : begin(b), end(e), step(s) {}

  std::size_t begin = 0;
  std::optional<std::size_t> end;
  std::size_t step = 1;

  /// The one-element range {i, i+1, 1}.
  static Range single(std::size_t i) { return Range{i, i + 1, 1}; }

  friend bool operator==(const Range&, const Range&) = default;
  /// "1:4:2", "2:", "3" (for a single index), "0::2".
  [[nodiscard]] std::string to_string() const;
};

class Slice {
 public:
  /// Zero-dimensional slice at offset 0 (one point, global rank 0).
  Slice() = default;

  /// Throws SliceError when sizes.size() != strides.size(), any size is 0, or the number of points
  /// or the largest location (offset + sum((si-1)*ti)) overflows size_t.
  Slice(std::size_t offset, std::vector<std::size_t> sizes, std::vector<std::size_t> strides);

  /// Row-major dense slice over sizes (offset 0). Throws SliceError on a zero size or overflow.
  static Slice dense(const std::vector<std::size_t>& sizes);

  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }
  [[nodiscard]] const std::vector<std::size_t>& sizes() const noexcept { return sizes_; }
  [[nodiscard]] const std::vector<std::size_t>& strides() const noexcept { return strides_; }
  [[nodiscard]] std::size_t num_dims() const noexcept { return sizes_.size(); }
  /// Number of points (product of sizes; 1 when zero-dimensional).
  [[nodiscard]] std::size_t len() const noexcept { return len_; }

  /// Global rank of local coordinates. Throws SliceError on a wrong number of coordinates or a
  /// coordinate out of range (message names the dim "#i" and its size).
  [[nodiscard]] std::size_t location(const std::vector<std::size_t>& coords) const;
  /// Local coordinates of a global rank. Throws SliceError if the rank is not in the slice.
  [[nodiscard]] std::vector<std::size_t> coordinates(std::size_t global) const;
  /// Like coordinates(), but nullopt instead of throwing.
  [[nodiscard]] std::optional<std::vector<std::size_t>> try_coordinates(std::size_t global) const;
  /// Local row-major index (0 <= index < len()) of a global rank. Throws SliceError if not in
  /// slice.
  [[nodiscard]] std::size_t index(std::size_t global) const;
  /// Whether the global rank is one of this slice's points.
  [[nodiscard]] bool contains(std::size_t global) const;
  /// Global rank of the local row-major index i (0 <= i < len(), else SliceError).
  [[nodiscard]] std::size_t at_index(std::size_t i) const;

  /// True when strides are the row-major dense strides of sizes (size-1 dims are ignored), i.e.
  /// the points are exactly offset .. offset+len()-1 in order.
  [[nodiscard]] bool is_contiguous() const noexcept;

  /// Fixes dim `dim` at `index` and drops it. Throws SliceError if dim or index is out of range.
  [[nodiscard]] Slice at(std::size_t dim, std::size_t index) const;
  /// Restricts dim `dim` to r. Throws SliceError if dim is out of range, r.step == 0, r.begin >=
  /// size, r.end > size, or the range is empty (begin >= end).
  [[nodiscard]] Slice range(std::size_t dim, const Range& r) const;
  /// Replaces dim `dim` by dims of `sizes` (row-major); their product must equal the dim's size
  /// and none may be 0, else SliceError.
  [[nodiscard]] Slice split(std::size_t dim, const std::vector<std::size_t>& sizes) const;
  /// One-dimensional slice over the same ranks. Throws SliceError unless is_contiguous().
  [[nodiscard]] Slice flatten() const;

  /// Same offset and sizes, and the same strides in every dim of size > 1 (strides of size-1
  /// dims never affect a location, so they are not compared).
  friend bool operator==(const Slice& a, const Slice& b) noexcept;

  /// "Slice{offset=0, sizes=[2, 4], strides=[4, 1]}".
  [[nodiscard]] std::string to_string() const;

  /// Forward iterator over the global ranks in local row-major order. Allocates once (the
  /// coordinate odometer) when created; incrementing does not allocate.
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
      ++index_;
      if (inner_left_ > 1) {  // fast path: step along the last dim
        --inner_left_;
        rank_ += inner_stride_;
        return *this;
      }
      if (index_ == len_) return *this;
      carry();
      return *this;
    }
    iterator operator++(int) {
      iterator t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.index_ == b.index_;
    }

   private:
    friend class Slice;
    // Last dim wrapped: rewind it and carry into the outer dims (odometer).
    void carry() noexcept {
      const std::size_t last = coords_.size() - 1;
      rank_ -= ((*sizes_)[last] - 1) * inner_stride_;
      inner_left_ = (*sizes_)[last];
      for (std::size_t d = last; d-- > 0;) {
        rank_ += (*strides_)[d];
        if (++coords_[d] < (*sizes_)[d]) return;
        rank_ -= coords_[d] * (*strides_)[d];
        coords_[d] = 0;
      }
    }

    const std::vector<std::size_t>* sizes_ = nullptr;
    const std::vector<std::size_t>* strides_ = nullptr;
    std::vector<std::size_t> coords_;
    std::size_t rank_ = 0;
    std::size_t index_ = 0;  // local index of the current point
    std::size_t len_ = 0;
    std::size_t inner_left_ = 0;    // points left in the current run of the last dim (incl. this)
    std::size_t inner_stride_ = 0;  // stride of the last dim
  };

  [[nodiscard]] iterator begin() const;
  [[nodiscard]] iterator end() const;

  /// Calls f(global_rank) for every point in row-major order (no allocation).
  template <class F>
  void for_each(F&& f) const {
    for_each_rec(0, offset_, f);
  }

 private:
  friend class Shape;
  // Implementations; `dim_name` is how error messages name the dim (e.g. "'gpus'" or "#1").
  Slice at_impl(std::size_t dim, std::size_t index, const std::string& dim_name) const;
  Slice range_impl(std::size_t dim, const Range& r, const std::string& dim_name) const;
  Slice split_impl(std::size_t dim, const std::vector<std::size_t>& sizes,
                   const std::string& dim_name) const;
  void check_dim(std::size_t dim) const;

  template <class F>
  void for_each_rec(std::size_t d, std::size_t base, F& f) const {
    if (d == sizes_.size()) {
      f(base);
      return;
    }
    const std::size_t n = sizes_[d];
    const std::size_t s = strides_[d];
    if (d + 1 == sizes_.size()) {
      for (std::size_t i = 0; i < n; ++i) f(base + i * s);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) for_each_rec(d + 1, base + i * s, f);
  }

  std::size_t offset_ = 0;
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> strides_;
  std::size_t len_ = 1;
};

std::ostream& operator<<(std::ostream& os, const Slice& s);
std::ostream& operator<<(std::ostream& os, const Range& r);

}  // namespace monarch::ndslice
