#pragma once
// SLURM hostlist expressions -> host names.

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "monarch/error.hpp"

namespace monarch::launch {

/// Thrown by expand_hostlist on malformed input; what() names the bad text.
struct HostlistError : monarch::Error {
  explicit HostlistError(const std::string& message)
      : monarch::Error(ErrorCode::Hostlist, message) {}
};

/// Expands a SLURM hostlist ("node[01-04,07]", "a[1-2]b", "n[001-003],m5") into names, in order,
/// keeping zero padding (the width of a range's lower bound). Several bracket groups in one name
/// expand as a cartesian product, left to right. Throws HostlistError naming the bad text.
std::vector<std::string> expand_hostlist(std::string_view hostlist);

}  // namespace monarch::launch
