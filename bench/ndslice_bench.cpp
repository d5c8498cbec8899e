// ndslice bench: cost per point of enumerating the global ranks of a strided 3-D view
// (64x64x64 dense, every dim sliced 0:64:2 -> 32x32x32 points) with Slice iteration vs a
// hand-written nested loop over the same offset/strides ("naive_loop").
#include <cstddef>
#include <cstdio>
#include <string>

#include "common/report.hpp"
#include "monarch/ndslice/ndslice.hpp"

namespace {

using monarch::ndslice::Extent;
using monarch::ndslice::Range;
using monarch::ndslice::Shape;
using monarch::ndslice::Slice;

volatile std::size_t g_sink = 0;

template <class F>
double best_ns_per_point(std::size_t points, int reps, F&& pass) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = monarch::bench::Clock::now();
    const std::size_t sum = pass();
    const double us = monarch::bench::us_since(t0);
    g_sink = g_sink + sum;
    best = std::min(best, us * 1000.0 / static_cast<double>(points));
  }
  return best;
}

}  // namespace

int main() {
  const Shape view = Shape(Extent{{"x", 64}, {"y", 64}, {"z", 64}})
                         .slice("x", Range{0, 64, 2})
                         .slice("y", Range{0, 64, 2})
                         .slice("z", Range{0, 64, 2});
  const Slice& s = view.base();
  const std::size_t points = s.len();
  constexpr int kReps = 50;
  const nlohmann::json params = {{"shape", "64x64x64 step 2"}, {"points", points}};

  const double iter = best_ns_per_point(points, kReps, [&] {
    std::size_t sum = 0;
    for (std::size_t r : s) sum += r;
    return sum;
  });
  const double for_each = best_ns_per_point(points, kReps, [&] {
    std::size_t sum = 0;
    s.for_each([&](std::size_t r) { sum += r; });
    return sum;
  });
  const double naive = best_ns_per_point(points, kReps, [&] {
    const std::size_t off = s.offset();
    const std::size_t n0 = s.sizes()[0], n1 = s.sizes()[1], n2 = s.sizes()[2];
    const std::size_t t0 = s.strides()[0], t1 = s.strides()[1], t2 = s.strides()[2];
    std::size_t sum = 0;
    for (std::size_t i = 0; i < n0; ++i)
      for (std::size_t j = 0; j < n1; ++j)
        for (std::size_t k = 0; k < n2; ++k) sum += off + i * t0 + j * t1 + k * t2;
    return sum;
  });

  monarch::bench::report("ndslice_iterate", "monarch", "ns_per_point", iter, "ns", "lower", params);
  nlohmann::json p2 = params;
  p2["api"] = "for_each";
  monarch::bench::report("ndslice_iterate", "monarch_for_each", "ns_per_point", for_each, "ns",
                         "lower", p2);
  monarch::bench::report("ndslice_iterate", "naive_loop", "ns_per_point", naive, "ns", "lower",
                         params);
  return 0;
}
