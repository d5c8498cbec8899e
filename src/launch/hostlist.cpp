#include "monarch/launch/hostlist.hpp"
namespace monarch::launch {
std::vector<std::string> expand_hostlist(std::string_view) { return {}; }
}
