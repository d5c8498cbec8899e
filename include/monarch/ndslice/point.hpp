// Point: coordinates in an Extent, e.g. {hosts=1, gpus=3}; point.rank() is its row-major rank
// within that extent (here 7 for {hosts=2, gpus=4}).
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"

namespace monarch::ndslice {

class Point {
 public:
  /// The single point of the zero-dimensional extent.
  Point() = default;

  /// Throws SliceError if coords.size() != extent.num_dims() or a coordinate is out of range for
  /// its dim (the message names the dim and its size).
  Point(std::vector<std::size_t> coords, Extent extent);

  [[nodiscard]] const Extent& extent() const noexcept { return extent_; }
  [[nodiscard]] const std::vector<std::size_t>& coords() const noexcept { return coords_; }
  [[nodiscard]] std::size_t num_dims() const noexcept { return coords_.size(); }

  /// Row-major rank within extent() (0 <= rank < extent().num_ranks()).
  [[nodiscard]] std::size_t rank() const;

  /// Coordinate of the named dim. Throws SliceError for an unknown dim name.
  [[nodiscard]] std::size_t operator[](std::string_view name) const;
  /// Coordinate of the i-th dim. Throws SliceError if i >= num_dims().
  [[nodiscard]] std::size_t at(std::size_t i) const;

  /// Same extent and same coordinates.
  friend bool operator==(const Point& a, const Point& b) noexcept;

  /// "{hosts=1, gpus=3}"; "{}" when zero-dimensional.
  [[nodiscard]] std::string to_string() const;

 private:
  std::vector<std::size_t> coords_;
  Extent extent_;
};

std::ostream& operator<<(std::ostream& os, const Point& p);

}  // namespace monarch::ndslice
