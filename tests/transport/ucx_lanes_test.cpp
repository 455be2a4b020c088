// The rule that decides whether the ucx transport's puts to another machine go over its own
// links or UCX's puts (src/transport/ucx/ucx_lanes.hpp), on ucp_ep_print_info's text: as
// UCX 1.13 printed it for a TCP-only endpoint, and as it prints lanes on InfiniBand/RoCE.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ucx/ucx_lanes.hpp"

namespace {
using epx::detail::ucx::lane_transports;
using epx::detail::ucx::lanes_verdict;
using epx::detail::ucx::LanesVerdict;

// Printed by UCX 1.13.1 (Debian 12) for an endpoint made with UCX_TLS=tcp: one lane, no RMA lane
// (puts are active messages).
const char* const kTcpEndpoint =
    "#\n"
    "# UCP endpoint \n"
    "#\n"
    "#               peer: <no debug data>\n"
    "#                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 keepalive wireup\n"
    "#\n"
    "#\n"
    "#                  rma_bw: mds #\n"
    "#\n";

// Two machines over eth0 and eth1: two TCP lanes.
const char* const kTwoTcpLanes =
    "#                 lane[0]:  1:tcp/eth0.0 md[0]   -> md[0]/tcp/sysdev[255] am am_bw#0 keepalive wireup\n"
    "#                 lane[1]:  2:tcp/eth1.0 md[0]   -> md[0]/tcp/sysdev[255] am_bw#1\n";

// An InfiniBand endpoint: RMA on rc_mlx5, active messages on rc too, wireup over ud.
const char* const kRcEndpoint =
    "#                 lane[0]:  8:rc_mlx5/mlx5_0:1.0 md[4]   -> md[4]/ib/sysdev[255] rma_bw#0 am am_bw#0\n"
    "#                 lane[1]: 11:ud_mlx5/mlx5_0:1.0 md[4]   -> md[4]/ib/sysdev[255] keepalive wireup\n";

// RoCE with a TCP lane alongside: a single RDMA lane is enough for UCX's puts to be the path.
const char* const kMixed =
    "#                 lane[0]:  3:tcp/eth0.0 md[1]   -> md[1]/tcp/sysdev[255] am keepalive\n"
    "#                 lane[1]:  6:dc_mlx5/mlx5_1:1.0 md[3] -> md[3]/ib/sysdev[255] rma_bw#0 am_bw#0\n";
}  // namespace

TEST(UcxLanes, ReadsTheTransportOfEveryLane) {
  EXPECT_EQ(lane_transports(kTcpEndpoint), std::vector<std::string>{"tcp"});
  EXPECT_EQ(lane_transports(kTwoTcpLanes), (std::vector<std::string>{"tcp", "tcp"}));
  EXPECT_EQ(lane_transports(kRcEndpoint), (std::vector<std::string>{"rc_mlx5", "ud_mlx5"}));
  EXPECT_EQ(lane_transports(kMixed), (std::vector<std::string>{"tcp", "dc_mlx5"}));
}

TEST(UcxLanes, LinksOnlyWhereEveryLaneIsTcp) {
  EXPECT_EQ(lanes_verdict(kTcpEndpoint), LanesVerdict::kTcpOnly);
  EXPECT_EQ(lanes_verdict(kTwoTcpLanes), LanesVerdict::kTcpOnly);
  EXPECT_EQ(lanes_verdict(kRcEndpoint), LanesVerdict::kOther);
  EXPECT_EQ(lanes_verdict(kMixed), LanesVerdict::kOther);
}

TEST(UcxLanes, NoLanesListedIsUnknown) {
  EXPECT_EQ(lanes_verdict(""), LanesVerdict::kUnknown);
  EXPECT_EQ(lanes_verdict("#\n# UCP endpoint \n#\n#               peer: <no debug data>\n"), LanesVerdict::kUnknown);
  EXPECT_EQ(lanes_verdict("#   lane[0]: garbled\n"), LanesVerdict::kUnknown);
}
