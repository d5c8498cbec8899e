// ChannelAddr: where a channel listens or dials.
//
//   inproc://NAME            in this process only (no socket)
//   unix:///abs/path         Unix domain socket file (created with mode 0600)
//   unix://@name             abstract Unix socket (Linux; no file)
//   tcp://127.0.0.1:26600    TCP over IPv4; tcp://[::1]:26600 over IPv6; port 0 = any free port
//   DIAL@BIND                e.g. tcp://gw.example:7000@tcp://0.0.0.0:26600: listen on BIND,
//                            tell peers to dial DIAL (hosts behind NAT or port forwarding)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "monarch/error.hpp"

namespace monarch::channel {

/// Every channel-layer failure the caller can act on (bad address, bind/listen failure, bad
/// secret configuration, oversize message). The message names the address or setting at fault.
/// Origin: the address at fault, where the thrower passes it.
class ChannelError : public monarch::Error {
 public:
  explicit ChannelError(const std::string& message, Origin origin = {})
      : monarch::Error(ErrorCode::Channel, message, std::move(origin)) {}
};

enum class Transport : uint8_t { Inproc, Unix, Tcp };

struct ChannelAddr {
  Transport transport = Transport::Inproc;
  std::string name;  ///< inproc name, unix path, or abstract name (without the '@')
  bool abstract = false;
  std::string host;   ///< tcp: host name or IP literal (IPv6 without brackets)
  uint16_t port = 0;  ///< tcp
  /// For DIAL@BIND: the address peers should dial (this struct is the BIND part).
  std::shared_ptr<const ChannelAddr> dial;

  /// Parses the forms above. Throws ChannelError naming the input and what was expected.
  static ChannelAddr parse(std::string_view text);
  /// Canonical text (parse(to_string()) == *this). DIAL@BIND prints both parts.
  std::string to_string() const;
  /// The address peers should connect to: `dial` when set, else this address.
  ChannelAddr dial_addr() const { return dial ? *dial : without_dial(); }
  ChannelAddr without_dial() const {
    ChannelAddr a = *this;
    a.dial = nullptr;
    return a;
  }
  bool operator==(const ChannelAddr& o) const {
    return transport == o.transport && name == o.name && abstract == o.abstract && host == o.host &&
           port == o.port && (dial == nullptr) == (o.dial == nullptr) &&
           (dial == nullptr || *dial == *o.dial);
  }
};

}  // namespace monarch::channel
