#include "monarch/ndslice/slice.hpp"

#include <algorithm>
#include <numeric>

namespace monarch::ndslice {

namespace {

std::string dim_num(std::size_t d) {
  return "#" + std::to_string(d);
}

std::string join(const std::vector<std::size_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace

std::string Range::to_string() const {
  if (end && *end == begin + 1 && step == 1) return std::to_string(begin);
  std::string s = std::to_string(begin) + ":";
  if (end) s += std::to_string(*end);
  if (step != 1) s += ":" + std::to_string(step);
  return s;
}

Slice::Slice(std::size_t offset, std::vector<std::size_t> sizes, std::vector<std::size_t> strides)
    : offset_(offset), sizes_(std::move(sizes)), strides_(std::move(strides)) {
  if (sizes_.size() != strides_.size()) {
    throw SliceError("slice: " + std::to_string(sizes_.size()) + " sizes but " +
                     std::to_string(strides_.size()) + " strides");
  }
  std::size_t n = 1;
  std::size_t last = offset_;
  for (std::size_t d = 0; d < sizes_.size(); ++d) {
    if (sizes_[d] == 0)
      throw SliceError("slice: dim " + dim_num(d) + " has size 0; sizes must be >= 1");
    n = detail::checked_mul(n, sizes_[d], "slice: number of points");
    last = detail::checked_add(last,
                               detail::checked_mul(sizes_[d] - 1, strides_[d], "slice: location"),
                               "slice: location");
  }
  len_ = n;
}

Slice Slice::dense(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> strides(sizes.size());
  std::size_t s = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 0)
      throw SliceError("slice: dim " + dim_num(d) + " has size 0; sizes must be >= 1");
    strides[d] = s;
    s = detail::checked_mul(s, sizes[d], "slice: number of points");
  }
  return Slice(0, sizes, std::move(strides));
}

std::size_t Slice::location(const std::vector<std::size_t>& coords) const {
  if (coords.size() != sizes_.size()) {
    throw SliceError("slice: " + std::to_string(coords.size()) + " coordinates for a slice of " +
                     std::to_string(sizes_.size()) + " dims");
  }
  std::size_t r = offset_;
  for (std::size_t d = 0; d < coords.size(); ++d) {
    if (coords[d] >= sizes_[d]) {
      throw SliceError("slice: index " + std::to_string(coords[d]) + " out of range for dim " +
                       dim_num(d) + " of size " + std::to_string(sizes_[d]));
    }
    r += coords[d] * strides_[d];
  }
  return r;
}

std::optional<std::vector<std::size_t>> Slice::try_coordinates(std::size_t global) const {
  if (global < offset_) return std::nullopt;
  const std::size_t n = sizes_.size();
  // Dims with size > 1, by descending stride.
  std::vector<std::size_t> order;
  order.reserve(n);
  for (std::size_t d = 0; d < n; ++d) {
    if (sizes_[d] > 1) order.push_back(d);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return strides_[a] > strides_[b]; });
  // Greedy decomposition is exact when the strides are nested (each stride is at least the
  // extent spanned by the smaller ones) -- true of every slice derived from a dense one.
  bool nested = true;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    const std::size_t a = order[i];
    const std::size_t b = order[i + 1];
    std::size_t span = 0;
    if (__builtin_mul_overflow(strides_[b], sizes_[b], &span) || strides_[a] < span ||
        strides_[b] == 0) {
      nested = false;
      break;
    }
  }
  if (!order.empty() && strides_[order.back()] == 0) nested = false;
  std::vector<std::size_t> c(n, 0);
  if (nested) {
    std::size_t r = global - offset_;
    for (std::size_t d : order) {
      c[d] = std::min(r / strides_[d], sizes_[d] - 1);
      r -= c[d] * strides_[d];
    }
    if (r != 0) return std::nullopt;
    return c;
  }
  // Irregular strides: linear search in row-major order.
  std::size_t i = 0;
  for (auto it = begin(); it != end(); ++it, ++i) {
    if (*it == global) {
      std::size_t k = i;
      for (std::size_t d = n; d-- > 0;) {
        c[d] = k % sizes_[d];
        k /= sizes_[d];
      }
      return c;
    }
  }
  return std::nullopt;
}

std::vector<std::size_t> Slice::coordinates(std::size_t global) const {
  auto c = try_coordinates(global);
  if (!c) throw SliceError("slice: rank " + std::to_string(global) + " is not in " + to_string());
  return std::move(*c);
}

std::size_t Slice::index(std::size_t global) const {
  const auto c = coordinates(global);
  std::size_t i = 0;
  for (std::size_t d = 0; d < c.size(); ++d) i = i * sizes_[d] + c[d];
  return i;
}

bool Slice::contains(std::size_t global) const {
  return try_coordinates(global).has_value();
}

std::size_t Slice::at_index(std::size_t i) const {
  if (i >= len_) {
    throw SliceError("slice: index " + std::to_string(i) + " out of range for a slice of " +
                     std::to_string(len_) + " points");
  }
  std::size_t r = offset_;
  for (std::size_t d = sizes_.size(); d-- > 0;) {
    r += (i % sizes_[d]) * strides_[d];
    i /= sizes_[d];
  }
  return r;
}

bool Slice::is_contiguous() const noexcept {
  std::size_t expected = 1;
  for (std::size_t d = sizes_.size(); d-- > 0;) {
    if (sizes_[d] > 1 && strides_[d] != expected) return false;
    expected *= sizes_[d];  // cannot overflow: len_ was checked
  }
  return true;
}

void Slice::check_dim(std::size_t dim) const {
  if (dim >= sizes_.size()) {
    throw SliceError("slice: dim " + dim_num(dim) + " out of range for a slice of " +
                     std::to_string(sizes_.size()) + " dims");
  }
}

Slice Slice::at_impl(std::size_t dim, std::size_t index, const std::string& dim_name) const {
  check_dim(dim);
  if (index >= sizes_[dim]) {
    throw SliceError("slice: index " + std::to_string(index) + " out of range for dim " + dim_name +
                     " of size " + std::to_string(sizes_[dim]));
  }
  std::vector<std::size_t> sizes = sizes_;
  std::vector<std::size_t> strides = strides_;
  const auto pos = static_cast<std::ptrdiff_t>(dim);
  sizes.erase(sizes.begin() + pos);
  strides.erase(strides.begin() + pos);
  return Slice(offset_ + index * strides_[dim], std::move(sizes), std::move(strides));
}

Slice Slice::range_impl(std::size_t dim, const Range& r, const std::string& dim_name) const {
  check_dim(dim);
  const std::size_t size = sizes_[dim];
  const std::string where = " for dim " + dim_name + " of size " + std::to_string(size);
  if (r.step == 0) throw SliceError("slice: range " + r.to_string() + " has step 0" + where);
  if (r.begin >= size) {
    throw SliceError("slice: range begin " + std::to_string(r.begin) + " out of range" + where);
  }
  const std::size_t end = r.end.value_or(size);
  if (end > size) {
    throw SliceError("slice: range end " + std::to_string(end) + " out of range" + where);
  }
  if (r.begin >= end) {
    throw SliceError("slice: empty range " + r.to_string() + where + " (begin must be < end)");
  }
  const std::size_t n = (end - r.begin - 1) / r.step + 1;
  std::vector<std::size_t> sizes = sizes_;
  std::vector<std::size_t> strides = strides_;
  sizes[dim] = n;
  if (n > 1) strides[dim] = detail::checked_mul(strides_[dim], r.step, "slice: stride");
  return Slice(offset_ + r.begin * strides_[dim], std::move(sizes), std::move(strides));
}

Slice Slice::split_impl(std::size_t dim, const std::vector<std::size_t>& sizes,
                        const std::string& dim_name) const {
  check_dim(dim);
  std::size_t prod = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      throw SliceError("slice: split of dim " + dim_name + ": size #" + std::to_string(i) +
                       " is 0; sizes must be >= 1");
    }
    prod = detail::checked_mul(prod, sizes[i], "slice: split");
  }
  if (prod != sizes_[dim]) {
    throw SliceError("slice: split of dim " + dim_name + " of size " + std::to_string(sizes_[dim]) +
                     " into " + join(sizes) + ": product " + std::to_string(prod) +
                     " != " + std::to_string(sizes_[dim]));
  }
  std::vector<std::size_t> new_sizes;
  std::vector<std::size_t> new_strides;
  new_sizes.reserve(sizes_.size() + sizes.size());
  new_strides.reserve(sizes_.size() + sizes.size());
  for (std::size_t d = 0; d < sizes_.size(); ++d) {
    if (d != dim) {
      new_sizes.push_back(sizes_[d]);
      new_strides.push_back(strides_[d]);
      continue;
    }
    std::vector<std::size_t> st(sizes.size());
    std::size_t s = strides_[d];
    for (std::size_t i = sizes.size(); i-- > 0;) {
      st[i] = s;
      if (i > 0) s *= sizes[i];  // bounded by strides_[d] * sizes_[d]: already checked
    }
    new_sizes.insert(new_sizes.end(), sizes.begin(), sizes.end());
    new_strides.insert(new_strides.end(), st.begin(), st.end());
  }
  return Slice(offset_, std::move(new_sizes), std::move(new_strides));
}

Slice Slice::at(std::size_t dim, std::size_t index) const {
  return at_impl(dim, index, dim_num(dim));
}
Slice Slice::range(std::size_t dim, const Range& r) const {
  return range_impl(dim, r, dim_num(dim));
}
Slice Slice::split(std::size_t dim, const std::vector<std::size_t>& sizes) const {
  return split_impl(dim, sizes, dim_num(dim));
}

Slice Slice::flatten() const {
  if (!is_contiguous()) {
    throw SliceError("slice: cannot flatten non-contiguous " + to_string() +
                     " (strides must be row-major dense)");
  }
  return Slice(offset_, {len_}, {1});
}

bool operator==(const Slice& a, const Slice& b) noexcept {
  if (a.offset_ != b.offset_ || a.sizes_ != b.sizes_) return false;
  for (std::size_t d = 0; d < a.sizes_.size(); ++d) {
    if (a.sizes_[d] > 1 && a.strides_[d] != b.strides_[d]) return false;
  }
  return true;
}

std::string Slice::to_string() const {
  return "Slice{offset=" + std::to_string(offset_) + ", sizes=" + join(sizes_) +
         ", strides=" + join(strides_) + "}";
}

Slice::iterator Slice::begin() const {
  iterator it;
  it.sizes_ = &sizes_;
  it.strides_ = &strides_;
  // coords_ holds the outer dims only; the last dim is tracked by inner_left_.
  it.coords_.assign(sizes_.size(), 0);
  it.rank_ = offset_;
  it.index_ = 0;
  it.len_ = len_;
  it.inner_left_ = sizes_.empty() ? 1 : sizes_.back();
  it.inner_stride_ = sizes_.empty() ? 0 : strides_.back();
  return it;
}

Slice::iterator Slice::end() const {
  iterator it;
  it.index_ = len_;
  it.len_ = len_;
  return it;
}

std::ostream& operator<<(std::ostream& os, const Slice& s) {
  return os << s.to_string();
}
std::ostream& operator<<(std::ostream& os, const Range& r) {
  return os << r.to_string();
}

}  // namespace monarch::ndslice
