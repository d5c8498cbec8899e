// Selection algebra over the dimensions of a Shape.
//
// A Selection is an immutable tree. Dimension-consuming nodes select coordinates of the CURRENT
// dimension and hand the remaining dimensions to their `inner` selection:
//   all(inner)          every coordinate                          text: *
//   first(inner)        coordinate 0                              text: ?
//   range(r, inner)     coordinates in r (clipped to the dim)     text: 3   1:4   1:   :4   0:8:2
//   label(ls, inner)    every coordinate if the dim's LABEL is    text: @gpus   @gpus+cpus
//                       one of ls, otherwise nothing (a guard on the dim name)
// Terminal / combining nodes:
//   true_()             every point of the remaining dims         text: true
//   false_()            nothing                                   text: false
//   union_(a, b)        points in a or b                          text: a|b
//   intersection(a, b)  points in a and b                         text: a&b
// Text form: comma-separated components address successive dimensions: "*,0,1:4" is
// all(range(0, range(1:4, true))). Missing trailing components mean "all" ("*,1:3" on a 3-dim shape
// also takes every coordinate of the 3rd dim). A parenthesised selection covers the dimensions from
// its position on, and what follows the group applies to each of its branches:
// "(0|1:3),*" == union_(range(0, all()), range(1:3, all())). Precedence: ',' > '&' > '|'.
// Whitespace between tokens is ignored. Grammar:
//   sel   := inter ('|' inter)*
//   inter := seq ('&' seq)*
//   seq   := atom (',' atom)*
//   atom  := '*' | '?' | 'true' | 'false' | '@' ident ('+' ident)* | range | '(' sel ')'
//   range := int | int? ':' int? (':' int)?        (step >= 1; begin < end when end is given)
// Ranges in a selection are clipped to the dimension (a range past the end selects nothing), unlike
// Shape::slice, which rejects them. Evaluating a selection with more dimension components than the
// shape has dims throws SliceError.
#pragma once

#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/region.hpp"
#include "monarch/ndslice/shape.hpp"
#include "monarch/ndslice/slice.hpp"

namespace monarch::ndslice {

class Selection {
 public:
  enum class Kind { True, False, All, First, Range, Label, Union, Intersection };

  /// true_(): selects everything.
  Selection();

  static Selection true_();
  static Selection false_();
  static Selection all(Selection inner = Selection());
  static Selection first(Selection inner = Selection());
  /// Throws SliceError if r.step == 0 or r is empty (end given and begin >= end).
  static Selection range(const Range& r, Selection inner = Selection());
  /// range(Range::single(i), inner).
  static Selection index(std::size_t i, Selection inner = Selection());
  /// Throws SliceError if labels is empty or a label is not an identifier [A-Za-z_][A-Za-z0-9_]*.
  static Selection label(std::vector<std::string> labels, Selection inner = Selection());
  static Selection union_(Selection a, Selection b);
  static Selection intersection(Selection a, Selection b);

  [[nodiscard]] Kind kind() const noexcept;
  /// For All/First/Range/Label: the selection of the remaining dims; else SliceError.
  [[nodiscard]] const Selection& inner() const;
  /// For Union/Intersection: the operands; else SliceError.
  [[nodiscard]] const Selection& lhs() const;
  [[nodiscard]] const Selection& rhs() const;
  /// For Range: the range; else SliceError.
  [[nodiscard]] const Range& range_value() const;
  /// For Label: the labels; else SliceError.
  [[nodiscard]] const std::vector<std::string>& labels() const;

  /// Structural equality (same tree).
  friend bool operator==(const Selection& a, const Selection& b) noexcept;

  /// Replaces every `true` leaf by `rest` (i.e. `rest` selects the dims after this selection's).
  [[nodiscard]] Selection then(const Selection& rest) const;

 private:
  struct Node;
  explicit Selection(std::shared_ptr<const Node> n) : n_(std::move(n)) {}
  std::shared_ptr<const Node> n_;
};

/// Parses the text form (see above). Throws ParseError (with 1-based column() and a message
/// saying what was expected) on malformed text, a zero step, an empty range or integer overflow.
Selection parse(std::string_view text);

/// Canonical text form; parse(to_string(s)) == s for every selection s.
std::string to_string(const Selection& s);

/// Global ranks (in shape's base space) of the selected points, as a Region.
/// Throws SliceError if the selection addresses more dims than shape has.
Region eval(const Selection& s, const Shape& shape);

/// eval() as a sorted vector of global ranks.
std::vector<std::size_t> eval_ranks(const Selection& s, const Shape& shape);

std::ostream& operator<<(std::ostream& os, const Selection& s);

}  // namespace monarch::ndslice
