// A transport that runs the elastic calls itself (epx/elastic.hpp): the shmem transport,
// whose survivors agree, sum and meet through symmetric words of their own and rebuild over
// the same symmetric heap (src/transport/shmem/shmem_elastic.cpp). elastic.cpp hands
// agree_survivors, rebuild_group and sum_over_group to it; the shm transport's are
// elastic.cpp's own (through the control block). Internal to epx_transport.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "epx/elastic.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

class ElasticOps {
 public:
  virtual Membership agree_survivors() = 0;
  virtual std::unique_ptr<Transport> rebuild_group(const Membership& membership) = 0;
  virtual std::vector<std::int64_t> sum_over_group(const std::vector<std::int64_t>& values) = 0;

 protected:
  ~ElasticOps() = default;
};

}  // namespace epx::detail
