#include "monarch/wire/serialize.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace monarch::wire {

std::string demangle(const std::type_info& ti) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(
      abi::__cxa_demangle(ti.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && p ? std::string(p.get()) : std::string(ti.name());
}

namespace detail {

void throw_decode_error(const std::string& type, const std::string& what) {
  throw DecodeError("wire: cannot decode " + type + ": " + what);
}

void throw_trailing(const std::string& type, std::size_t trailing, std::size_t total) {
  throw DecodeError("wire: cannot decode " + type + ": " + std::to_string(trailing) +
                    " trailing bytes after the value (input has " + std::to_string(total) +
                    " bytes)");
}

}  // namespace detail
}  // namespace monarch::wire
