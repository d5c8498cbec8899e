#pragma once
// monarch::wire serialisation of user messages, on cereal's binary archives.
//
// Portability: cereal's BinaryOutputArchive writes arithmetic values in the host's native byte
// order and sizes (size tags are uint64). Peers must therefore share architecture/ABI (endianness,
// sizeof(long), ...), which holds for our same-arch clusters. The frame layer (frame.hpp) is
// explicitly little-endian and does not depend on this.
//
// A type is serialisable when cereal can save and load it with the binary archives: give it a
// `template <class Archive> void serialize(Archive&)` member (or save/load pair, or free
// functions), or use a std type whose cereal header is included. This header includes the common
// ones (string, vector, map, unordered_map, set, unordered_set, optional, tuple, utility/pair,
// memory, chrono, array, variant, deque, list), so they work by default. decode<T> requires T to be
// default-constructible.
//
// Untrusted input: decode() never reads out of bounds and reports truncation and trailing bytes,
// but cereal allocates a container from its size prefix before reading the elements, so a
// malicious size prefix can cause one large allocation (std::bad_alloc/std::length_error are
// reported as DecodeError). Frames bound a message at DecoderLimits::max_frame_bytes.
#include <array>
#include <cereal/archives/binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/chrono.hpp>
#include <cereal/types/deque.hpp>
#include <cereal/types/list.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/memory.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/set.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/unordered_set.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>
#include <cstddef>
#include <deque>
#include <istream>
#include <list>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "monarch/error.hpp"

namespace monarch::wire {

// Malformed, truncated or over-long bytes for the requested type. The message names the type,
// e.g. "wire: cannot decode std::vector<int>: truncated input (...)".
class DecodeError : public monarch::Error {
 public:
  explicit DecodeError(const std::string& message) : monarch::Error(ErrorCode::Decode, message) {}
};

// Demangled name of a type ("std::vector<int, std::allocator<int> >").
std::string demangle(const std::type_info& ti);
template <class T>
std::string type_name() {
  return demangle(typeid(T));
}

namespace detail {

template <class T>
inline constexpr bool cereal_serializable_v =
    cereal::traits::is_output_serializable<T, cereal::BinaryOutputArchive>::value&&
        cereal::traits::is_input_serializable<T, cereal::BinaryInputArchive>::value;

// cereal's std-container serialisers are unconstrained templates, so cereal's own trait says
// std::vector<X> is serialisable even when X is not (and the error then comes from deep inside
// cereal). Recurse into the std templates whose headers we include.
template <class T>
struct elements_serializable : std::true_type {};

template <class T>
inline constexpr bool deep_serializable_v =
    cereal_serializable_v<T>&& elements_serializable<T>::value;

template <template <class...> class C, class... Ts>
struct elements_serializable_all : std::bool_constant<(deep_serializable_v<Ts> && ...)> {};

template <class T, class A>
struct elements_serializable<std::vector<T, A>> : elements_serializable_all<std::vector, T> {};
template <class T, class A>
struct elements_serializable<std::deque<T, A>> : elements_serializable_all<std::deque, T> {};
template <class T, class A>
struct elements_serializable<std::list<T, A>> : elements_serializable_all<std::list, T> {};
template <class T, class C, class A>
struct elements_serializable<std::set<T, C, A>> : elements_serializable_all<std::set, T> {};
template <class T, class H, class E, class A>
struct elements_serializable<std::unordered_set<T, H, E, A>>
    : elements_serializable_all<std::unordered_set, T> {};
template <class K, class V, class C, class A>
struct elements_serializable<std::map<K, V, C, A>> : elements_serializable_all<std::map, K, V> {};
template <class K, class V, class H, class E, class A>
struct elements_serializable<std::unordered_map<K, V, H, E, A>>
    : elements_serializable_all<std::unordered_map, K, V> {};
template <class T>
struct elements_serializable<std::optional<T>> : elements_serializable_all<std::optional, T> {};
template <class A, class B>
struct elements_serializable<std::pair<A, B>> : elements_serializable_all<std::pair, A, B> {};
template <class... Ts>
struct elements_serializable<std::tuple<Ts...>> : elements_serializable_all<std::tuple, Ts...> {};
template <class... Ts>
struct elements_serializable<std::variant<Ts...>> : elements_serializable_all<std::variant, Ts...> {
};
template <class T, std::size_t N>
struct elements_serializable<std::array<T, N>> : elements_serializable_all<std::tuple, T> {};
template <class T, class D>
struct elements_serializable<std::unique_ptr<T, D>> : elements_serializable_all<std::tuple, T> {};
template <class T>
struct elements_serializable<std::shared_ptr<T>> : elements_serializable_all<std::tuple, T> {};

}  // namespace detail

// True when T (and, for the std containers/wrappers above, every element type) can be saved and
// loaded with cereal's binary archives.
template <class T>
inline constexpr bool is_serializable_v = detail::deep_serializable_v<std::remove_cvref_t<T>>;

namespace detail {

template <class>
inline constexpr bool dependent_false_v = false;

// Appends to a std::vector<std::byte> with no intermediate string copy.
class VectorSink final : public std::streambuf {
 public:
  explicit VectorSink(std::vector<std::byte>& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const auto* b = reinterpret_cast<const std::byte*>(s);
    out_.insert(out_.end(), b, b + n);
    return n;
  }
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    out_.push_back(static_cast<std::byte>(traits_type::to_char_type(ch)));
    return ch;
  }

 private:
  std::vector<std::byte>& out_;
};

// Reads from a span without copying it (the get area points into the caller's bytes; nothing
// writes through it).
class SpanSource final : public std::streambuf {
 public:
  explicit SpanSource(std::span<const std::byte> in) {
    // streambuf's get area is char* but is only read from here.
    char* b = const_cast<char*>(reinterpret_cast<const char*>(in.data()));
    setg(b, b, b + in.size());
  }
  std::size_t remaining() const { return static_cast<std::size_t>(egptr() - gptr()); }
};

[[noreturn]] void throw_decode_error(const std::string& type, const std::string& what);
[[noreturn]] void throw_trailing(const std::string& type, std::size_t trailing, std::size_t total);

template <class F>
void decode_with(std::span<const std::byte> bytes, std::string (*name)(), F&& load) {
  SpanSource src(bytes);
  std::istream is(&src);
  try {
    cereal::BinaryInputArchive ar(is);
    load(ar);
  } catch (const cereal::Exception& e) {
    throw_decode_error(name(), std::string("truncated or malformed input: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw_decode_error(name(), "malformed input (allocation failed)");
  } catch (const std::length_error& e) {
    throw_decode_error(name(), std::string("malformed input (") + e.what() + ")");
  }
  if (src.remaining() != 0) throw_trailing(name(), src.remaining(), bytes.size());
}

}  // namespace detail

// Appends the encoding of `value` to `out`.
template <class T>
void encode_into(const T& value, std::vector<std::byte>& out) {
  if constexpr (!is_serializable_v<T>) {
    static_assert(detail::dependent_false_v<T>,
                  "monarch::wire: type T is not serialisable: add a serialize(Archive&) member or "
                  "free function (cereal), or use a supported std type (include the matching "
                  "<cereal/types/...> header)");
  } else {
    detail::VectorSink sink(out);
    std::ostream os(&sink);
    cereal::BinaryOutputArchive ar(os);
    ar(value);
  }
}

template <class T>
std::vector<std::byte> encode(const T& value) {
  std::vector<std::byte> out;
  encode_into(value, out);
  return out;
}

// Decodes exactly one T from `bytes`. Throws DecodeError naming T on truncated or malformed input
// or when bytes remain after the value.
template <class T>
T decode(std::span<const std::byte> bytes) {
  if constexpr (!is_serializable_v<T>) {
    static_assert(detail::dependent_false_v<T>,
                  "monarch::wire: type T is not serialisable: add a serialize(Archive&) member or "
                  "free function (cereal), or use a supported std type (include the matching "
                  "<cereal/types/...> header)");
  } else {
    static_assert(std::is_default_constructible_v<T>,
                  "monarch::wire: decode<T> needs a default-constructible T");
    T value{};
    detail::decode_with(bytes, &type_name<T>, [&](cereal::BinaryInputArchive& ar) { ar(value); });
    return value;
  }
}

// Several values back to back (endpoint arguments). The encoding equals that of
// std::tuple<std::decay_t<Args>...>.
template <class... Args>
void encode_tuple_into(std::vector<std::byte>& out, const Args&... args) {
  if constexpr (!(is_serializable_v<Args> && ...)) {
    static_assert(detail::dependent_false_v<std::tuple<Args...>>,
                  "monarch::wire: type T is not serialisable: add a serialize(Archive&) member or "
                  "free function (cereal), or use a supported std type (include the matching "
                  "<cereal/types/...> header)");
  } else {
    detail::VectorSink sink(out);
    std::ostream os(&sink);
    cereal::BinaryOutputArchive ar(os);
    if constexpr (sizeof...(Args) > 0) ar(args...);
  }
}

template <class... Args>
std::vector<std::byte> encode_tuple(const Args&... args) {
  std::vector<std::byte> out;
  encode_tuple_into(out, args...);
  return out;
}

template <class... Args>
std::tuple<Args...> decode_tuple(std::span<const std::byte> bytes) {
  using Tuple = std::tuple<Args...>;
  if constexpr (!(is_serializable_v<Args> && ...)) {
    static_assert(detail::dependent_false_v<Tuple>,
                  "monarch::wire: type T is not serialisable: add a serialize(Archive&) member or "
                  "free function (cereal), or use a supported std type (include the matching "
                  "<cereal/types/...> header)");
  } else {
    static_assert((std::is_default_constructible_v<Args> && ...),
                  "monarch::wire: decode_tuple<Args...> needs default-constructible Args");
    Tuple values{};
    detail::decode_with(bytes, &type_name<Tuple>, [&](cereal::BinaryInputArchive& ar) {
      std::apply(
          [&](auto&... v) {
            if constexpr (sizeof...(v) > 0) ar(v...);
          },
          values);
    });
    return values;
  }
}

}  // namespace monarch::wire
