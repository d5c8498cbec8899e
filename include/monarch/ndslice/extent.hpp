// Extent: an ordered list of named dimensions with sizes, e.g. {hosts=2, gpus=4}.
//
// Ranks within an extent are row-major: the last dimension varies fastest, so in {hosts=2, gpus=4}
// the point {hosts=1, gpus=3} has rank 1*4 + 3 = 7. An extent with zero dimensions has one rank
// (0). Extents are immutable and cheap to copy (shared storage).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "monarch/ndslice/error.hpp"

namespace monarch::ndslice {

class Point;

/// Whether `s` can label a dim: an identifier, [A-Za-z_][A-Za-z0-9_]* (what selection text can
/// name, and what a Python keyword argument such as `mesh.slice(hosts=0)` can be).
bool is_dim_label(std::string_view s) noexcept;

class Extent {
 public:
  /// Zero-dimensional extent: num_ranks() == 1.
  Extent();

  /// Extent{{"hosts", 2}, {"gpus", 4}}.
  /// Throws SliceError on: a label that is not an identifier (is_dim_label), a duplicate label, a
  /// zero size, num_ranks overflowing size_t.
  Extent(std::initializer_list<std::pair<std::string, std::size_t>> dims);

  /// Labels and sizes in parallel. Throws SliceError additionally when the lengths differ.
  Extent(std::vector<std::string> labels, std::vector<std::size_t> sizes);

  [[nodiscard]] const std::vector<std::string>& labels() const noexcept;
  [[nodiscard]] const std::vector<std::size_t>& sizes() const noexcept;
  [[nodiscard]] std::size_t num_dims() const noexcept;
  /// Product of all sizes (1 for a zero-dimensional extent).
  [[nodiscard]] std::size_t num_ranks() const noexcept;

  /// Size of the named dim. Throws SliceError("... unknown dim 'x' ...") if absent.
  [[nodiscard]] std::size_t size(std::string_view name) const;
  /// Position of the named dim. Throws SliceError if absent.
  [[nodiscard]] std::size_t index_of(std::string_view name) const;
  /// Position of the named dim, or nullopt.
  [[nodiscard]] std::optional<std::size_t> find(std::string_view name) const noexcept;

  /// Point with the given rank (0 <= rank < num_ranks(), else SliceError).
  [[nodiscard]] Point point(std::size_t rank) const;
  /// Row-major coordinates of a rank (0 <= rank < num_ranks(), else SliceError).
  [[nodiscard]] std::vector<std::size_t> coords_of(std::size_t rank) const;
  /// Row-major rank of coordinates. Throws SliceError if coords.size() != num_dims() or a
  /// coordinate is out of range for its dim (the message names the dim and its size).
  [[nodiscard]] std::size_t rank(const std::vector<std::size_t>& coords) const;

  /// Same labels and sizes, in order.
  friend bool operator==(const Extent& a, const Extent& b) noexcept;

  /// "{hosts=2, gpus=4}"; "{}" when zero-dimensional.
  [[nodiscard]] std::string to_string() const;

 private:
  struct Data {
    std::vector<std::string> labels;
    std::vector<std::size_t> sizes;
    std::size_t num_ranks = 1;
  };
  std::shared_ptr<const Data> d_;
};

std::ostream& operator<<(std::ostream& os, const Extent& e);

}  // namespace monarch::ndslice

// Point's definition is needed by every user of Extent::point(); keep this header self-contained.
#include "monarch/ndslice/point.hpp"
