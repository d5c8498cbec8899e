// Built when UCX's headers or library were absent at configure time: only the channel backend.
#include "engine.hpp"

namespace monarch::rdma::detail {

std::unique_ptr<UcxPlane> make_ucx_plane(StatusTable&, std::string& why) {
  why = "monarch-cpp was built without UCX (libucx-dev not found at configure time)";
  return nullptr;
}

}  // namespace monarch::rdma::detail
