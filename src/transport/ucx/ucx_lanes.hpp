// Which way the ucx transport sends puts to a peer on another machine: UCX's own, or the
// group's links (ucx_group.hpp). Decided by what UCX says of its endpoint to that peer: the
// lanes ucp_ep_print_info lists, each "lane[N]:  R:<transport>/<device> md[M] -> ... <uses>".
// Plain text in, no UCX call: the rule can be tested on any machine.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace epx::detail::ucx {

/// The transport of every lane in ucp_ep_print_info's text ("tcp", "rc_mlx5", "ud_verbs", ...),
/// in order; empty when the text lists no lanes (another UCX's format, or no endpoint).
inline std::vector<std::string> lane_transports(const std::string& info) {
  std::vector<std::string> out;
  std::istringstream in(info);
  for (std::string line; std::getline(in, line);) {
    const auto lane = line.find("lane[");
    const auto colon = lane == std::string::npos ? lane : line.find("]:", lane);
    if (colon == std::string::npos) continue;
    std::istringstream rest(line.substr(colon + 2));
    std::string resource;  // "0:tcp/eth0.0": resource index, transport, device
    if (!(rest >> resource)) continue;
    const auto from = resource.find(':');
    const auto to = resource.find('/');
    if (from == std::string::npos || to == std::string::npos || to <= from + 1) continue;
    out.push_back(resource.substr(from + 1, to - from - 1));
  }
  return out;
}

enum class LanesVerdict {
  kTcpOnly,  // every lane is UCX's TCP transport: puts are active messages over TCP, links are faster
  kOther,    // some lane is another transport (rc, dc, ud: InfiniBand or RoCE): UCX's puts are the path
  kUnknown,  // no lanes in the text: the caller decides otherwise (RDMA devices present or not)
};

inline LanesVerdict lanes_verdict(const std::string& info) {
  const std::vector<std::string> tls = lane_transports(info);
  if (tls.empty()) return LanesVerdict::kUnknown;
  for (const std::string& tl : tls)
    if (tl != "tcp") return LanesVerdict::kOther;
  return LanesVerdict::kTcpOnly;
}

}  // namespace epx::detail::ucx
