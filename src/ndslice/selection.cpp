#include "monarch/ndslice/selection.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <limits>

namespace monarch::ndslice {

struct Selection::Node {
  Kind kind = Kind::True;
  Range range;                      // Range
  std::vector<std::string> labels;  // Label
  // Null until set (a default Selection would recurse into the shared True node).
  Selection a{std::shared_ptr<const Node>()};  // inner (All/First/Range/Label) or lhs
  Selection b{std::shared_ptr<const Node>()};  // rhs (Union/Intersection)
};

namespace {

const char* kind_name(Selection::Kind k) {
  switch (k) {
    case Selection::Kind::True:
      return "true";
    case Selection::Kind::False:
      return "false";
    case Selection::Kind::All:
      return "all";
    case Selection::Kind::First:
      return "first";
    case Selection::Kind::Range:
      return "range";
    case Selection::Kind::Label:
      return "label";
    case Selection::Kind::Union:
      return "union";
    case Selection::Kind::Intersection:
      return "intersection";
  }
  return "?";
}

bool is_dim_kind(Selection::Kind k) {
  return k == Selection::Kind::All || k == Selection::Kind::First || k == Selection::Kind::Range ||
         k == Selection::Kind::Label;
}

void check_range(const Range& r) {
  if (r.step == 0) throw SliceError("selection: range " + r.to_string() + " has step 0");
  if (r.end && r.begin >= *r.end) {
    throw SliceError("selection: empty range " + std::to_string(r.begin) + ":" +
                     std::to_string(*r.end) + " (begin must be < end)");
  }
}

}  // namespace

// A single shared True node keeps default construction cheap and allocation-free after startup.
Selection::Selection() {
  static const std::shared_ptr<const Node> kTrue = [] {
    auto n = std::make_shared<Node>();
    n->kind = Kind::True;
    return std::shared_ptr<const Node>(std::move(n));
  }();
  n_ = kTrue;
}

Selection Selection::true_() {
  return Selection();
}

Selection Selection::false_() {
  auto n = std::make_shared<Node>();
  n->kind = Kind::False;
  return Selection(std::move(n));
}

Selection Selection::all(Selection inner) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::All;
  n->a = std::move(inner);
  return Selection(std::move(n));
}

Selection Selection::first(Selection inner) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::First;
  n->a = std::move(inner);
  return Selection(std::move(n));
}

Selection Selection::range(const Range& r, Selection inner) {
  check_range(r);
  auto n = std::make_shared<Node>();
  n->kind = Kind::Range;
  n->range = r;
  n->a = std::move(inner);
  return Selection(std::move(n));
}

Selection Selection::index(std::size_t i, Selection inner) {
  return range(Range::single(i), std::move(inner));
}

Selection Selection::label(std::vector<std::string> labels, Selection inner) {
  if (labels.empty()) throw SliceError("selection: label() needs at least one dim label");
  for (const auto& l : labels) {
    if (!is_dim_label(l)) {
      throw SliceError("selection: label '" + l +
                       "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)");
    }
  }
  auto n = std::make_shared<Node>();
  n->kind = Kind::Label;
  n->labels = std::move(labels);
  n->a = std::move(inner);
  return Selection(std::move(n));
}

Selection Selection::union_(Selection a, Selection b) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::Union;
  n->a = std::move(a);
  n->b = std::move(b);
  return Selection(std::move(n));
}

Selection Selection::intersection(Selection a, Selection b) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::Intersection;
  n->a = std::move(a);
  n->b = std::move(b);
  return Selection(std::move(n));
}

Selection::Kind Selection::kind() const noexcept {
  return n_->kind;
}

const Selection& Selection::inner() const {
  if (!is_dim_kind(n_->kind)) {
    throw SliceError(std::string("selection: inner() of a ") + kind_name(n_->kind) + " node");
  }
  return n_->a;
}

const Selection& Selection::lhs() const {
  if (n_->kind != Kind::Union && n_->kind != Kind::Intersection) {
    throw SliceError(std::string("selection: lhs() of a ") + kind_name(n_->kind) + " node");
  }
  return n_->a;
}

const Selection& Selection::rhs() const {
  if (n_->kind != Kind::Union && n_->kind != Kind::Intersection) {
    throw SliceError(std::string("selection: rhs() of a ") + kind_name(n_->kind) + " node");
  }
  return n_->b;
}

const Range& Selection::range_value() const {
  if (n_->kind != Kind::Range) {
    throw SliceError(std::string("selection: range_value() of a ") + kind_name(n_->kind) + " node");
  }
  return n_->range;
}

const std::vector<std::string>& Selection::labels() const {
  if (n_->kind != Kind::Label) {
    throw SliceError(std::string("selection: labels() of a ") + kind_name(n_->kind) + " node");
  }
  return n_->labels;
}

bool operator==(const Selection& x, const Selection& y) noexcept {
  if (x.n_ == y.n_) return true;
  const auto& a = *x.n_;
  const auto& b = *y.n_;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Selection::Kind::True:
    case Selection::Kind::False:
      return true;
    case Selection::Kind::All:
    case Selection::Kind::First:
      return a.a == b.a;
    case Selection::Kind::Range:
      return a.range == b.range && a.a == b.a;
    case Selection::Kind::Label:
      return a.labels == b.labels && a.a == b.a;
    case Selection::Kind::Union:
    case Selection::Kind::Intersection:
      return a.a == b.a && a.b == b.b;
  }
  return false;
}

Selection Selection::then(const Selection& rest) const {
  if (rest.kind() == Kind::True) return *this;
  switch (n_->kind) {
    case Kind::True:
      return rest;
    case Kind::False:
      return *this;
    case Kind::All:
      return all(n_->a.then(rest));
    case Kind::First:
      return first(n_->a.then(rest));
    case Kind::Range:
      return range(n_->range, n_->a.then(rest));
    case Kind::Label:
      return label(n_->labels, n_->a.then(rest));
    case Kind::Union:
      return union_(n_->a.then(rest), n_->b.then(rest));
    case Kind::Intersection:
      return intersection(n_->a.then(rest), n_->b.then(rest));
  }
  return *this;
}

// ---------------------------------------------------------------- printing

namespace {

void print(const Selection& s, std::string& out);

void print_operand(const Selection& s, bool paren, std::string& out) {
  if (paren) out += '(';
  print(s, out);
  if (paren) out += ')';
}

void print(const Selection& s, std::string& out) {
  using K = Selection::Kind;
  switch (s.kind()) {
    case K::True:
      out += "true";
      return;
    case K::False:
      out += "false";
      return;
    case K::Union:
      print(s.lhs(), out);
      out += '|';
      print_operand(s.rhs(), s.rhs().kind() == K::Union, out);
      return;
    case K::Intersection:
      print_operand(s.lhs(), s.lhs().kind() == K::Union, out);
      out += '&';
      print_operand(s.rhs(), s.rhs().kind() == K::Union || s.rhs().kind() == K::Intersection, out);
      return;
    case K::All:
      out += '*';
      break;
    case K::First:
      out += '?';
      break;
    case K::Range:
      out += s.range_value().to_string();
      break;
    case K::Label: {
      out += '@';
      const auto& ls = s.labels();
      for (std::size_t i = 0; i < ls.size(); ++i) {
        if (i > 0) out += '+';
        out += ls[i];
      }
      break;
    }
  }
  const Selection& in = s.inner();
  if (in.kind() == K::True) return;
  out += ',';
  print_operand(in, in.kind() == K::Union || in.kind() == K::Intersection, out);
}

}  // namespace

std::string to_string(const Selection& s) {
  std::string out;
  print(s, out);
  return out;
}

std::ostream& operator<<(std::ostream& os, const Selection& s) {
  return os << to_string(s);
}

// ---------------------------------------------------------------- parsing

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : t_(text) {}

  Selection parse_all() {
    skip_ws();
    if (pos_ == t_.size()) fail("a selection");
    Selection s = parse_union();
    skip_ws();
    if (pos_ != t_.size()) fail("',', '|', '&' or end of input");
    return s;
  }

 private:
  // Quotes input for an error message: at most kQuote characters around the error column,
  // control and non-ASCII bytes escaped, so a hostile input cannot flood or garble the message.
  static constexpr std::size_t kQuote = 60;
  static std::string escaped(std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
      if (c >= 0x20 && c < 0x7f) {
        out += static_cast<char>(c);
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
    return out;
  }
  std::string quoted_input(std::size_t pos) const {
    if (t_.size() <= kQuote) return escaped(t_);
    std::size_t from = pos > kQuote / 2 ? pos - kQuote / 2 : 0;
    from = std::min(from, t_.size() - kQuote);
    return (from > 0 ? "..." : "") + escaped(t_.substr(from, kQuote)) +
           (from + kQuote < t_.size() ? "..." : "");
  }
  [[noreturn]] void fail_at(std::size_t pos, const std::string& what) const {
    throw ParseError("selection parse error at column " + std::to_string(pos + 1) + " in \"" +
                         quoted_input(pos) + "\": " + what,
                     pos + 1);
  }
  [[noreturn]] void fail(const std::string& expected) const {
    std::string got = pos_ < t_.size() ? "'" + escaped(t_.substr(pos_, 1)) + "'" : "end of input";
    fail_at(pos_, "expected " + expected + ", got " + got);
  }

  // Limits that keep every later recursion over the tree (printing, evaluation) shallow.
  static constexpr std::size_t kMaxNesting = 64;
  static constexpr std::size_t kMaxComponents = 256;
  std::size_t depth_ = 0;

  void skip_ws() {
    while (pos_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[pos_])) != 0) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool peek_digit() {
    skip_ws();
    return pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_])) != 0;
  }

  Selection parse_union() {
    Selection s = parse_inter();
    while (eat('|')) s = Selection::union_(std::move(s), parse_inter());
    return s;
  }

  Selection parse_inter() {
    Selection s = parse_seq();
    while (eat('&')) s = Selection::intersection(std::move(s), parse_seq());
    return s;
  }

  Selection parse_seq() {
    std::vector<Selection> atoms;
    atoms.push_back(parse_atom());
    while (eat(',')) {
      if (atoms.size() == kMaxComponents) {
        fail_at(pos_, "more than " + std::to_string(kMaxComponents) + " dimension components");
      }
      atoms.push_back(parse_atom());
    }
    Selection s = atoms.back();
    for (std::size_t i = atoms.size() - 1; i-- > 0;) s = atoms[i].then(s);
    return s;
  }

  std::size_t parse_int(const char* what) {
    skip_ws();
    const std::size_t start = pos_;
    if (!peek_digit()) fail(what);
    std::size_t v = 0;
    while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_])) != 0) {
      const auto digit = static_cast<std::size_t>(t_[pos_] - '0');
      if (__builtin_mul_overflow(v, std::size_t{10}, &v) || __builtin_add_overflow(v, digit, &v)) {
        fail_at(start, "integer overflows size_t");
      }
      ++pos_;
    }
    return v;
  }

  std::string parse_ident() {
    skip_ws();
    const std::size_t start = pos_;
    if (pos_ < t_.size() &&
        (std::isalpha(static_cast<unsigned char>(t_[pos_])) != 0 || t_[pos_] == '_')) {
      ++pos_;
      while (pos_ < t_.size() &&
             (std::isalnum(static_cast<unsigned char>(t_[pos_])) != 0 || t_[pos_] == '_')) {
        ++pos_;
      }
    }
    if (pos_ == start) fail("a dim label (identifier)");
    return std::string(t_.substr(start, pos_ - start));
  }

  Selection parse_atom() {
    skip_ws();
    const std::size_t start = pos_;
    if (eat('*')) return Selection::all();
    if (eat('?')) return Selection::first();
    if (eat('(')) {
      if (++depth_ > kMaxNesting) {
        fail_at(pos_ - 1, "parentheses nested deeper than " + std::to_string(kMaxNesting));
      }
      Selection s = parse_union();
      if (!eat(')')) fail("')' or an operator ('|', '&', ',')");
      --depth_;
      return s;
    }
    if (eat('@')) {
      std::vector<std::string> labels{parse_ident()};
      while (eat('+')) labels.push_back(parse_ident());
      return Selection::label(std::move(labels));
    }
    if (t_.substr(pos_, 4) == "true") {
      pos_ += 4;
      return Selection::true_();
    }
    if (t_.substr(pos_, 5) == "false") {
      pos_ += 5;
      return Selection::false_();
    }
    if (peek_digit() || (pos_ < t_.size() && t_[pos_] == ':')) {
      Range r;
      if (peek_digit()) r.begin = parse_int("an integer");
      if (!eat(':')) {
        if (r.begin == std::numeric_limits<std::size_t>::max()) {
          fail_at(start, "index " + std::to_string(r.begin) + " is too large");
        }
        return Selection::index(r.begin);
      }
      if (peek_digit()) {
        const std::size_t end_pos = pos_;
        r.end = parse_int("an integer");
        if (r.begin >= *r.end) {
          fail_at(end_pos, "empty range " + std::to_string(r.begin) + ":" + std::to_string(*r.end) +
                               " (end must be > begin)");
        }
      }
      if (eat(':')) {
        const std::size_t step_pos = pos_;
        r.step = parse_int("an integer step");
        if (r.step == 0) fail_at(step_pos, "range step must be >= 1, got 0");
      }
      return Selection::range(r);
    }
    pos_ = start;
    fail("'*', '?', an integer, a range 'a:b[:s]', '(', '@label', 'true' or 'false'");
  }

  std::string_view t_;
  std::size_t pos_ = 0;
};

}  // namespace

Selection parse(std::string_view text) {
  return Parser(text).parse_all();
}

// ---------------------------------------------------------------- evaluation

namespace {

void sort_unique(std::vector<std::size_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

void eval_into(const Selection& s, const Shape& shape, std::size_t dim, std::size_t base,
               std::vector<std::size_t>& out) {
  using K = Selection::Kind;
  const Slice& sl = shape.base();
  if (is_dim_kind(s.kind()) && dim >= sl.num_dims()) {
    throw SliceError("selection: " + to_string(s) + " addresses dim #" + std::to_string(dim) +
                     " but view " + shape.extent().to_string() + " has only " +
                     std::to_string(sl.num_dims()) + " dims");
  }
  switch (s.kind()) {
    case K::True: {
      // Every point of the remaining dims.
      Slice rest(base,
                 std::vector<std::size_t>(sl.sizes().begin() + static_cast<std::ptrdiff_t>(dim),
                                          sl.sizes().end()),
                 std::vector<std::size_t>(sl.strides().begin() + static_cast<std::ptrdiff_t>(dim),
                                          sl.strides().end()));
      rest.for_each([&](std::size_t r) { out.push_back(r); });
      return;
    }
    case K::False:
      return;
    case K::All:
      for (std::size_t i = 0; i < sl.sizes()[dim]; ++i) {
        eval_into(s.inner(), shape, dim + 1, base + i * sl.strides()[dim], out);
      }
      return;
    case K::First:
      eval_into(s.inner(), shape, dim + 1, base, out);
      return;
    case K::Range: {
      const Range& r = s.range_value();
      const std::size_t n = sl.sizes()[dim];
      const std::size_t end = std::min(r.end.value_or(n), n);
      for (std::size_t i = r.begin; i < end; i += r.step) {
        eval_into(s.inner(), shape, dim + 1, base + i * sl.strides()[dim], out);
        if (end - i <= r.step) break;  // avoid overflow of i += step
      }
      return;
    }
    case K::Label: {
      const auto& ls = s.labels();
      if (std::find(ls.begin(), ls.end(), shape.labels()[dim]) == ls.end()) return;
      for (std::size_t i = 0; i < sl.sizes()[dim]; ++i) {
        eval_into(s.inner(), shape, dim + 1, base + i * sl.strides()[dim], out);
      }
      return;
    }
    case K::Union:
    case K::Intersection: {
      std::vector<std::size_t> a;
      std::vector<std::size_t> b;
      eval_into(s.lhs(), shape, dim, base, a);
      eval_into(s.rhs(), shape, dim, base, b);
      sort_unique(a);
      sort_unique(b);
      if (s.kind() == K::Union) {
        std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
      } else {
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
      }
      return;
    }
  }
}

}  // namespace

std::vector<std::size_t> eval_ranks(const Selection& s, const Shape& shape) {
  std::vector<std::size_t> out;
  eval_into(s, shape, 0, shape.base().offset(), out);
  sort_unique(out);
  return out;
}

Region eval(const Selection& s, const Shape& shape) {
  return Region::from_ranks(eval_ranks(s, shape));
}

}  // namespace monarch::ndslice
