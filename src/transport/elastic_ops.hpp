// A transport that runs the elastic calls itself (epx/elastic.hpp): the shmem transport,
// whose survivors agree, sum and meet through symmetric words of their own and rebuild over
// the same symmetric heap (src/transport/shmem/shmem_elastic.cpp), and which admits the
// job's spare PEs (shmem_join.cpp). elastic.cpp hands agree_survivors, rebuild_group and
// sum_over_group to it, joins.cpp request_ranks and admit; the shm transport's are
// elastic.cpp's and joins.cpp's own (through the control block). Both read the agreement's decision with
// decided_membership. Internal to epx_transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epx/elastic.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

class ElasticOps {
 public:
  virtual Membership agree_survivors() = 0;
  virtual std::unique_ptr<Transport> rebuild_group(const Membership& membership) = 0;
  virtual std::vector<std::int64_t> sum_over_group(const std::vector<std::int64_t>& values) = 0;
  virtual void request_ranks(int count) = 0;
  virtual std::unique_ptr<Transport> admit(const AdmitOptions& options, Admission* admission) = 0;

 protected:
  ~ElasticOps() = default;
};

/// How this process was admitted into a group of such a transport (a spare PE), for
/// joined_admission(); empty in the ranks a group started with.
inline std::optional<Admission> g_transport_joined;

/// The membership that agreement round `round` decided over `old_num_ranks` ranks: rank p
/// is in when bit p % 64 of `member_word(p / 64)` is set. kPeerFailed if the decision left
/// `me` out (it arrived after the others decided); `who` begins the message ("rank 2:
/// agree_survivors").
Membership decided_membership(std::uint64_t round, int old_num_ranks, int me, const std::string& who,
                              const std::function<std::uint64_t(std::size_t)>& member_word);

}  // namespace epx::detail
