// Call headers on the wire: what every member sends every other member first.
#include <algorithm>
#include <cstring>

#include "call.hpp"
#include "channels.hpp"
#include "epx/error.hpp"

namespace epx::detail {

namespace {

constexpr std::uint32_t kMagic = 0x314b4342;  // "BCK1"

struct WireFixed {
  std::uint32_t magic;
  std::uint8_t op, precision, algorithm, has_problem;
  std::uint8_t problem_code, pad[3];
  std::int32_t group;
  float scale;
  std::uint32_t num_tensors;  ///< as the caller gave them (the array holds at most kBucketMaxTensors)
  std::uint32_t problem_len;
  std::uint64_t members_hash;
  std::uint64_t payload_bytes;
};

struct WireTensor {
  std::uint64_t bytes, in_off, out_off;
  std::uint8_t dtype, pad[7];
};

constexpr std::size_t kTensorsAt = sizeof(WireFixed);
constexpr std::size_t kProblemAt = kTensorsAt + kBucketMaxTensors * sizeof(WireTensor);
static_assert(kProblemAt + 256 <= kHeaderWireBytes, "room for a problem text");

}  // namespace

const char* op_name(BucketOp op) noexcept {
  switch (op) {
    case BucketOp::kAllGather: return "all_gather";
    case BucketOp::kReduceScatter: return "reduce_scatter";
    case BucketOp::kAllReduce: return "all_reduce";
  }
  return "?";
}

std::size_t encode_header(const CallHeader& h, std::byte* out) {
  WireFixed f{};
  f.magic = kMagic;
  f.op = static_cast<std::uint8_t>(h.op);
  f.precision = static_cast<std::uint8_t>(h.precision);
  f.algorithm = static_cast<std::uint8_t>(h.algorithm);
  f.has_problem = h.problem ? 1 : 0;
  f.problem_code = h.problem ? static_cast<std::uint8_t>(h.problem->code) : 0;
  f.group = h.group;
  f.scale = h.scale;
  f.num_tensors = static_cast<std::uint32_t>(h.tensors.size());
  f.members_hash = h.members_hash;
  f.payload_bytes = h.payload_bytes;
  const std::size_t shown = std::min<std::size_t>(h.tensors.size(), kBucketMaxTensors);
  const std::string text = h.problem ? h.problem->message.substr(0, kHeaderWireBytes - kProblemAt) : std::string();
  f.problem_len = static_cast<std::uint32_t>(text.size());
  std::memcpy(out, &f, sizeof f);
  for (std::size_t i = 0; i < shown; ++i) {
    WireTensor w{};
    w.bytes = h.tensors[i].bytes;
    w.in_off = h.tensors[i].in_off;
    w.out_off = h.tensors[i].out_off;
    w.dtype = static_cast<std::uint8_t>(h.tensors[i].dtype);
    std::memcpy(out + kTensorsAt + i * sizeof w, &w, sizeof w);
  }
  if (!text.empty()) {
    std::memcpy(out + kProblemAt, text.data(), text.size());
    return kProblemAt + text.size();
  }
  return kTensorsAt + shown * sizeof(WireTensor);
}

CallHeader decode_header(const std::byte* in, int from) {
  WireFixed f;
  std::memcpy(&f, in, sizeof f);
  if (f.magic != kMagic || f.op < 1 || f.op > 3 || f.problem_len > kHeaderWireBytes - kProblemAt)
    throw Error(ErrorCode::kInternal, "bucket: the call header from rank " + std::to_string(from) + " is not one", from);
  CallHeader h;
  h.op = static_cast<BucketOp>(f.op);
  h.precision = static_cast<CommPrecision>(f.precision);
  h.algorithm = static_cast<BucketAlgorithm>(f.algorithm);
  h.group = f.group;
  h.scale = f.scale;
  h.members_hash = f.members_hash;
  h.payload_bytes = f.payload_bytes;
  const std::size_t shown = std::min<std::size_t>(f.num_tensors, kBucketMaxTensors);
  h.tensors.resize(shown);  // more than kBucketMaxTensors is the sender's own problem
  for (std::size_t i = 0; i < shown; ++i) {
    WireTensor w;
    std::memcpy(&w, in + kTensorsAt + i * sizeof w, sizeof w);
    h.tensors[i] = TensorDesc{w.bytes, w.in_off, w.out_off, static_cast<DType>(w.dtype)};
  }
  if (f.has_problem) {
    const char* text = reinterpret_cast<const char*>(in + kProblemAt);
    h.problem = CallProblem{static_cast<ErrorCode>(f.problem_code), std::string(text, f.problem_len)};
  }
  return h;
}

}  // namespace epx::detail
