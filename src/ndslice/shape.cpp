#include "monarch/ndslice/shape.hpp"

namespace monarch::ndslice {

namespace {

std::string quote(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::size_t dim_index(const Extent& e, std::string_view op, std::string_view dim) {
  if (auto i = e.find(dim)) return *i;
  throw SliceError(std::string(op) + ": unknown dim " + quote(dim) + " in " + e.to_string());
}

}  // namespace

Shape::Shape(const Extent& extent) : extent_(extent), sl_(Slice::dense(extent.sizes())) {}

Shape::Shape(std::vector<std::string> labels, Slice slice)
    : extent_(std::move(labels), slice.sizes()), sl_(std::move(slice)) {}

Shape Shape::slice(std::string_view dim, std::size_t index) const {
  const std::size_t d = dim_index(extent_, "slice", dim);
  Shape out;
  out.sl_ = sl_.at_impl(d, index, quote(dim));
  std::vector<std::string> labels = extent_.labels();
  labels.erase(labels.begin() + static_cast<std::ptrdiff_t>(d));
  out.extent_ = Extent(std::move(labels), out.sl_.sizes());
  return out;
}

Shape Shape::slice(std::string_view dim, const Range& r) const {
  const std::size_t d = dim_index(extent_, "slice", dim);
  return Shape(extent_.labels(), sl_.range_impl(d, r, quote(dim)));
}

Shape Shape::split(std::string_view dim, const std::vector<std::string>& names,
                   const std::vector<std::size_t>& sizes) const {
  const std::size_t d = dim_index(extent_, "split", dim);
  if (names.size() != sizes.size()) {
    throw SliceError("split: dim " + quote(dim) + " into " + std::to_string(names.size()) +
                     " names but " + std::to_string(sizes.size()) + " sizes");
  }
  if (names.empty()) throw SliceError("split: dim " + quote(dim) + " into zero dims");
  Slice s = sl_.split_impl(d, sizes, quote(dim));
  std::vector<std::string> labels;
  labels.reserve(extent_.num_dims() + names.size());
  const auto& old = extent_.labels();
  labels.insert(labels.end(), old.begin(), old.begin() + static_cast<std::ptrdiff_t>(d));
  labels.insert(labels.end(), names.begin(), names.end());
  labels.insert(labels.end(), old.begin() + static_cast<std::ptrdiff_t>(d) + 1, old.end());
  return Shape(std::move(labels), std::move(s));  // rejects duplicate names
}

Shape Shape::flatten(std::string new_name) const {
  if (!sl_.is_contiguous()) {
    throw SliceError("flatten: view " + extent_.to_string() + " is not contiguous (" +
                     sl_.to_string() + "); only dense views can be flattened");
  }
  if (new_name.empty()) throw SliceError("flatten: new dim name is empty");
  return Shape({std::move(new_name)}, sl_.flatten());
}

Shape Shape::rename(std::string_view from, std::string to) const {
  const std::size_t d = dim_index(extent_, "rename", from);
  if (to != from && extent_.find(to)) {
    throw SliceError("rename: dim " + quote(from) + " -> " + quote(to) + ": " + quote(to) +
                     " already exists in " + extent_.to_string());
  }
  std::vector<std::string> labels = extent_.labels();
  labels[d] = std::move(to);
  return Shape(std::move(labels), sl_);
}

std::size_t Shape::rank_of(const Point& p) const {
  if (!(p.extent() == extent_)) {
    throw SliceError("shape: point " + p.to_string() + " of extent " + p.extent().to_string() +
                     " does not belong to view " + extent_.to_string());
  }
  return sl_.location(p.coords());
}

std::size_t Shape::rank_of(const std::vector<std::size_t>& coords) const {
  (void)extent_.rank(coords);  // validates, naming the dim
  return sl_.location(coords);
}

Point Shape::point_of_rank(std::size_t global) const {
  auto c = sl_.try_coordinates(global);
  if (!c) {
    throw SliceError("shape: rank " + std::to_string(global) + " is not in view " + to_string());
  }
  return Point(std::move(*c), extent_);
}

std::size_t Shape::global_rank(std::size_t local) const {
  if (local >= num_ranks()) {
    throw SliceError("shape: local rank " + std::to_string(local) + " out of range for view " +
                     extent_.to_string() + " of " + std::to_string(num_ranks()) + " ranks");
  }
  return sl_.at_index(local);
}

std::string Shape::to_string() const {
  return extent_.to_string() + " @ " + sl_.to_string();
}

Shape::point_iterator Shape::begin() const {
  point_iterator it;
  it.extent_ = &extent_;
  return it;
}

Shape::point_iterator Shape::end() const {
  point_iterator it;
  it.extent_ = &extent_;
  it.index_ = num_ranks();
  return it;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << s.to_string();
}

}  // namespace monarch::ndslice
