#include "monarch/channel/address.hpp"

#include <charconv>

namespace monarch::channel {

namespace {

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw ChannelError("bad channel address '" + std::string(text) + "': " + why +
                         " (expected inproc://NAME, unix:///path, unix://@name, tcp://host:port, "
                         "tcp://[v6]:port, or DIAL@BIND)",
                     Origin{.address = std::string(text)});
}

bool starts_with_scheme(std::string_view s) {
  return s.starts_with("inproc://") || s.starts_with("unix://") || s.starts_with("tcp://");
}

ChannelAddr parse_one(std::string_view whole, std::string_view s) {
  ChannelAddr a;
  if (s.starts_with("inproc://")) {
    a.transport = Transport::Inproc;
    a.name = std::string(s.substr(9));
    if (a.name.empty()) bad(whole, "empty inproc name");
    return a;
  }
  if (s.starts_with("unix://")) {
    a.transport = Transport::Unix;
    auto rest = s.substr(7);
    if (rest.starts_with("@")) {
      a.abstract = true;
      a.name = std::string(rest.substr(1));
      if (a.name.empty()) bad(whole, "empty abstract socket name");
      if (a.name.size() > 100) bad(whole, "abstract name longer than 100 bytes");
      return a;
    }
    if (!rest.starts_with("/")) bad(whole, "unix path must be absolute (unix:///path)");
    if (rest.size() > 107) bad(whole, "unix socket path longer than 107 bytes");
    a.name = std::string(rest);
    return a;
  }
  if (s.starts_with("tcp://")) {
    a.transport = Transport::Tcp;
    auto rest = s.substr(6);
    std::string_view host, port;
    if (rest.starts_with("[")) {
      auto close = rest.find(']');
      if (close == std::string_view::npos) bad(whole, "missing ']' after IPv6 address");
      host = rest.substr(1, close - 1);
      if (close + 1 >= rest.size() || rest[close + 1] != ':') bad(whole, "missing ':port'");
      port = rest.substr(close + 2);
    } else {
      auto colon = rest.rfind(':');
      if (colon == std::string_view::npos) bad(whole, "missing ':port'");
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      if (host.find(':') != std::string_view::npos) bad(whole, "IPv6 addresses need brackets");
    }
    if (host.empty()) bad(whole, "empty host");
    if (port.find('@') != std::string_view::npos || host.find('@') != std::string_view::npos) {
      bad(whole, "'@' must be followed by the BIND address (DIAL@BIND)");
    }
    unsigned p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || p > 65535) {
      bad(whole, "port '" + std::string(port) + "' is not a number in 0..65535");
    }
    a.host = std::string(host);
    a.port = static_cast<uint16_t>(p);
    return a;
  }
  bad(whole, "unknown scheme");
}

}  // namespace

ChannelAddr ChannelAddr::parse(std::string_view text) {
  for (unsigned char c : text) {
    if (c <= 0x20 || c == 0x7f) bad(text, "whitespace or control characters are not allowed");
  }
  // DIAL@BIND: split at an '@' that is followed by a scheme (unix://@name also contains '@').
  for (size_t at = text.find('@'); at != std::string_view::npos; at = text.find('@', at + 1)) {
    if (at > 0 && starts_with_scheme(text.substr(at + 1)) && starts_with_scheme(text)) {
      auto rest = text.substr(at + 1);
      for (size_t more = rest.find('@'); more != std::string_view::npos;
           more = rest.find('@', more + 1)) {
        if (starts_with_scheme(rest.substr(more + 1)))
          bad(text, "more than one '@' between addresses");
      }
      auto dial = parse_one(text, text.substr(0, at));
      auto bind = parse_one(text, rest);
      if (dial.transport != bind.transport) bad(text, "DIAL and BIND must use the same transport");
      bind.dial = std::make_shared<const ChannelAddr>(std::move(dial));
      return bind;
    }
  }
  return parse_one(text, text);
}

std::string ChannelAddr::to_string() const {
  std::string s;
  switch (transport) {
    case Transport::Inproc:
      s = "inproc://" + name;
      break;
    case Transport::Unix:
      s = abstract ? "unix://@" + name : "unix://" + name;
      break;
    case Transport::Tcp:
      s = host.find(':') != std::string::npos ? "tcp://[" + host + "]:" : "tcp://" + host + ":";
      s += std::to_string(port);
      break;
  }
  return dial ? dial->to_string() + "@" + s : s;
}

}  // namespace monarch::channel
