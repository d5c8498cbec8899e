#include "monarch/error.hpp"

namespace monarch {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::Error:
      return "error";
    case ErrorCode::Usage:
      return "usage";
    case ErrorCode::Timeout:
      return "timeout";
    case ErrorCode::Deadlock:
      return "deadlock";
    case ErrorCode::Config:
      return "config";
    case ErrorCode::Slice:
      return "slice";
    case ErrorCode::SelectionParse:
      return "selection_parse";
    case ErrorCode::Frame:
      return "frame";
    case ErrorCode::Decode:
      return "decode";
    case ErrorCode::Channel:
      return "channel";
    case ErrorCode::Actor:
      return "actor";
    case ErrorCode::Delivery:
      return "delivery";
    case ErrorCode::Supervision:
      return "supervision";
    case ErrorCode::Rdma:
      return "rdma";
    case ErrorCode::Quorum:
      return "quorum";
    case ErrorCode::Allreduce:
      return "allreduce";
    case ErrorCode::Slurm:
      return "slurm";
    case ErrorCode::Hostlist:
      return "hostlist";
    case ErrorCode::Kubernetes:
      return "kubernetes";
  }
  return "unknown";
}

std::string Origin::to_string() const {
  std::string out;
  auto add = [&out](std::string_view what, const std::string& value) {
    if (!out.empty()) out += ", ";
    out += what;
    out += ' ';
    out += value;
  };
  if (!actor.empty()) add("actor", actor);
  if (rank) add("rank", std::to_string(*rank));
  if (!address.empty()) add("address", address);
  return out;
}

}  // namespace monarch
