#include "monarch/ndslice/extent.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "monarch/ndslice/point.hpp"

namespace monarch::ndslice {

namespace {

std::string quote(std::string_view s) {
  return "'" + std::string(s) + "'";
}

}  // namespace

bool is_dim_label(std::string_view s) noexcept {
  if (s.empty()) return false;
  if (std::isalpha(static_cast<unsigned char>(s[0])) == 0 && s[0] != '_') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
  });
}

Extent::Extent() : d_(std::make_shared<const Data>()) {}

Extent::Extent(std::initializer_list<std::pair<std::string, std::size_t>> dims) {
  std::vector<std::string> labels;
  std::vector<std::size_t> sizes;
  labels.reserve(dims.size());
  sizes.reserve(dims.size());
  for (const auto& [l, s] : dims) {
    labels.push_back(l);
    sizes.push_back(s);
  }
  *this = Extent(std::move(labels), std::move(sizes));
}

Extent::Extent(std::vector<std::string> labels, std::vector<std::size_t> sizes) {
  if (labels.size() != sizes.size()) {
    throw SliceError("extent: " + std::to_string(labels.size()) + " labels but " +
                     std::to_string(sizes.size()) + " sizes");
  }
  std::size_t n = 1;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i].empty())
      throw SliceError("extent: dim #" + std::to_string(i) + " has an empty label");
    if (!is_dim_label(labels[i])) {
      throw SliceError("extent: dim label " + quote(labels[i]) +
                       " is not an identifier ([A-Za-z_][A-Za-z0-9_]*)");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (labels[j] == labels[i]) {
        throw SliceError("extent: duplicate dim " + quote(labels[i]) + " (at #" +
                         std::to_string(j) + " and #" + std::to_string(i) + ")");
      }
    }
    if (sizes[i] == 0) {
      throw SliceError("extent: dim " + quote(labels[i]) + " has size 0; sizes must be >= 1");
    }
    std::size_t r = 0;
    if (__builtin_mul_overflow(n, sizes[i], &r)) {
      throw SliceError("extent: rank-space overflow at dim " + quote(labels[i]) + " of size " +
                       std::to_string(sizes[i]) + ": product of sizes exceeds size_t");
    }
    n = r;
  }
  d_ = std::make_shared<const Data>(Data{std::move(labels), std::move(sizes), n});
}

const std::vector<std::string>& Extent::labels() const noexcept {
  return d_->labels;
}
const std::vector<std::size_t>& Extent::sizes() const noexcept {
  return d_->sizes;
}
std::size_t Extent::num_dims() const noexcept {
  return d_->sizes.size();
}
std::size_t Extent::num_ranks() const noexcept {
  return d_->num_ranks;
}

std::optional<std::size_t> Extent::find(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < d_->labels.size(); ++i) {
    if (d_->labels[i] == name) return i;
  }
  return std::nullopt;
}

std::size_t Extent::index_of(std::string_view name) const {
  if (auto i = find(name)) return *i;
  throw SliceError("extent: unknown dim " + quote(name) + " in " + to_string());
}

std::size_t Extent::size(std::string_view name) const {
  return d_->sizes[index_of(name)];
}

std::vector<std::size_t> Extent::coords_of(std::size_t rank) const {
  if (rank >= d_->num_ranks) {
    throw SliceError("extent: rank " + std::to_string(rank) + " out of range for extent " +
                     to_string() + " of " + std::to_string(d_->num_ranks) + " ranks");
  }
  std::vector<std::size_t> c(d_->sizes.size());
  for (std::size_t d = c.size(); d-- > 0;) {
    c[d] = rank % d_->sizes[d];
    rank /= d_->sizes[d];
  }
  return c;
}

Point Extent::point(std::size_t rank) const {
  return Point(coords_of(rank), *this);
}

std::size_t Extent::rank(const std::vector<std::size_t>& coords) const {
  if (coords.size() != d_->sizes.size()) {
    throw SliceError("extent: " + std::to_string(coords.size()) + " coordinates for extent " +
                     to_string() + " of " + std::to_string(d_->sizes.size()) + " dims");
  }
  std::size_t r = 0;
  for (std::size_t d = 0; d < coords.size(); ++d) {
    if (coords[d] >= d_->sizes[d]) {
      throw SliceError("extent: index " + std::to_string(coords[d]) + " out of range for dim " +
                       quote(d_->labels[d]) + " of size " + std::to_string(d_->sizes[d]));
    }
    r = r * d_->sizes[d] + coords[d];
  }
  return r;
}

bool operator==(const Extent& a, const Extent& b) noexcept {
  return a.d_ == b.d_ || (a.d_->sizes == b.d_->sizes && a.d_->labels == b.d_->labels);
}

std::string Extent::to_string() const {
  std::string s = "{";
  for (std::size_t i = 0; i < d_->labels.size(); ++i) {
    if (i > 0) s += ", ";
    s += d_->labels[i] + "=" + std::to_string(d_->sizes[i]);
  }
  return s + "}";
}

std::ostream& operator<<(std::ostream& os, const Extent& e) {
  return os << e.to_string();
}

// ---- Point ----

Point::Point(std::vector<std::size_t> coords, Extent extent)
    : coords_(std::move(coords)), extent_(std::move(extent)) {
  (void)extent_.rank(coords_);  // validates count and bounds, naming the dim
}

std::size_t Point::rank() const {
  std::size_t r = 0;
  const auto& sizes = extent_.sizes();
  for (std::size_t d = 0; d < coords_.size(); ++d) r = r * sizes[d] + coords_[d];
  return r;
}

std::size_t Point::operator[](std::string_view name) const {
  return coords_[extent_.index_of(name)];
}

std::size_t Point::at(std::size_t i) const {
  if (i >= coords_.size()) {
    throw SliceError("point: dim #" + std::to_string(i) + " out of range for point " + to_string() +
                     " of " + std::to_string(coords_.size()) + " dims");
  }
  return coords_[i];
}

bool operator==(const Point& a, const Point& b) noexcept {
  return a.coords_ == b.coords_ && a.extent_ == b.extent_;
}

std::string Point::to_string() const {
  std::string s = "{";
  const auto& labels = extent_.labels();
  for (std::size_t i = 0; i < coords_.size(); ++i) {
    if (i > 0) s += ", ";
    s += labels[i] + "=" + std::to_string(coords_[i]);
  }
  return s + "}";
}

std::ostream& operator<<(std::ostream& os, const Point& p) {
  return os << p.to_string();
}

}  // namespace monarch::ndslice
