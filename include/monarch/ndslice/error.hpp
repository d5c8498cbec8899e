// monarch::ndslice error types and checked rank-space arithmetic.
//
// Every invalid input to the ndslice layer throws `SliceError` (a monarch::Error, code Slice) whose
// message names the offending dimension (by label, or as `#i` where only an index is known) and the
// bound that was violated, e.g. "slice: index 7 out of range for dim 'gpus' of size 4".
// Selection text that cannot be parsed throws `ParseError` (a `SliceError`, code SelectionParse)
// carrying the 1-based column.
#pragma once

#include <cstddef>
#include <string>

#include "monarch/error.hpp"

namespace monarch::ndslice {

/// Invalid argument to any ndslice operation (bad dim name, out-of-range index, overflow, ...).
class SliceError : public monarch::Error {
 public:
  explicit SliceError(const std::string& message) : monarch::Error(ErrorCode::Slice, message) {}

 protected:
  SliceError(ErrorCode code, const std::string& message) : monarch::Error(code, message) {}
};

/// Selection text could not be parsed. `column()` is 1-based (in bytes) into the parsed text; the
/// message contains the column, the input, and what was expected there.
class ParseError : public SliceError {
 public:
  ParseError(const std::string& message, std::size_t column)
      : SliceError(ErrorCode::SelectionParse, message), column_(column) {}
  /// 1-based byte column of the first offending character (input length + 1 at end of input).
  [[nodiscard]] std::size_t column() const noexcept { return column_; }

 private:
  std::size_t column_;
};

namespace detail {

/// a * b, or throws SliceError("<what>: rank-space overflow ...") if the product overflows size_t.
inline std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw SliceError(std::string(what) + ": rank-space overflow computing " + std::to_string(a) +
                     " * " + std::to_string(b));
  }
  return r;
}

/// a + b, or throws SliceError("<what>: rank-space overflow ...") if the sum overflows size_t.
inline std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw SliceError(std::string(what) + ": rank-space overflow computing " + std::to_string(a) +
                     " + " + std::to_string(b));
  }
  return r;
}

}  // namespace detail
}  // namespace monarch::ndslice
