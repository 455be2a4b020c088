// epx::BucketBuffer: construction, the calls' common steps (local checks, the header
// exchange, the verdicts, then an algorithm's data phase), events.
#include "epx/bucket.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "algorithms.hpp"
#include "check.hpp"
#include "epx/error.hpp"
#include "epx/spi/cpu_relax.hpp"
#include "epx/spi/kind_support.hpp"
#include "epx/topology.hpp"
#include "impl.hpp"

namespace epx {

using detail::BucketCall;
using detail::BucketOp;

std::vector<int> world_ranks(int num_ranks) {
  std::vector<int> r(static_cast<std::size_t>(std::max(num_ranks, 0)));
  for (int i = 0; i < num_ranks; ++i) r[static_cast<std::size_t>(i)] = i;
  return r;
}

const char* to_string(CommPrecision p) noexcept { return p == CommPrecision::kBF16 ? "bf16" : "fp32"; }

CommPrecision parse_comm_precision(std::string_view name) {
  if (name == "fp32") return CommPrecision::kFP32;
  if (name == "bf16") return CommPrecision::kBF16;
  throw Error(ErrorCode::kInvalidArgument, "comm_precision: '" + std::string(name) + "', expected fp32 or bf16");
}

const char* to_string(BucketAlgorithm a) noexcept {
  switch (a) {
    case BucketAlgorithm::kNone: return "none";
    case BucketAlgorithm::kStaged: return "staged";
    case BucketAlgorithm::kMapped: return "mapped";
    case BucketAlgorithm::kPipelined: return "pipelined";
    case BucketAlgorithm::kTwoLevel: return "two-level";
    case BucketAlgorithm::kDirect: return "direct";
    case BucketAlgorithm::kOneShot: return "one-shot";
  }
  return "?";
}

BucketAlgorithm parse_bucket_algorithm(std::string_view name) {
  if (name == "auto") return BucketAlgorithm::kNone;
  for (BucketAlgorithm a : {BucketAlgorithm::kStaged, BucketAlgorithm::kMapped, BucketAlgorithm::kPipelined,
                            BucketAlgorithm::kTwoLevel, BucketAlgorithm::kDirect, BucketAlgorithm::kOneShot})
    if (name == to_string(a)) return a;
  throw Error(ErrorCode::kInvalidArgument, "algorithm: '" + std::string(name) +
                                               "', expected auto, staged, mapped, pipelined, two-level, direct or one-shot");
}

// ---- events ----------------------------------------------------------------------------

BucketEvent::BucketEvent() noexcept = default;
BucketEvent::BucketEvent(BucketEvent&&) noexcept = default;
BucketEvent& BucketEvent::operator=(BucketEvent&& o) noexcept {
  if (this != &o) {
    if (call_) call_->run_or_wait();
    call_ = std::move(o.call_);
  }
  return *this;
}
BucketEvent::~BucketEvent() {
  if (!call_) return;
  call_->run_or_wait();
  std::lock_guard<std::mutex> lock(call_->m);
  call_->waited = true;
}

bool BucketEvent::ready() const noexcept {
  if (!call_) return true;
  std::lock_guard<std::mutex> lock(call_->m);
  return call_->state == BucketCall::State::kDone;
}

bool BucketEvent::wait_for(std::chrono::milliseconds timeout) { return !call_ || call_->run_or_wait_for(timeout); }

const std::vector<MutableView>& BucketEvent::outputs() const {
  static const std::vector<MutableView> none;
  return call_ ? call_->results : none;
}

std::vector<MutableView> BucketEvent::wait() {
  if (!call_) throw Error(ErrorCode::kInvalidArgument, "bucket: wait() on an event that holds no call (waited already?)");
  std::shared_ptr<BucketCall> c = std::move(call_);
  c->run_or_wait();
  {
    std::lock_guard<std::mutex> lock(c->m);
    c->waited = true;
  }
  if (c->error) std::rethrow_exception(c->error);
  return std::move(c->results);
}

namespace detail {

void BucketCall::run_or_wait() {
  while (!run_or_wait_for(std::chrono::hours(24))) {
  }
}

bool BucketCall::run_or_wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(m);
  if (state == State::kQueued) {
    state = State::kRunning;
    lock.unlock();
    try {
      data_phase();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    state = State::kDone;
    cv.notify_all();
    return true;
  }
  return cv.wait_for(lock, timeout, [&] { return state == State::kDone; });
}

}  // namespace detail

// ---- construction ----------------------------------------------------------------------

namespace {

std::string group_text(const std::vector<int>& g) {
  std::string s = "[";
  for (std::size_t i = 0; i < g.size(); ++i) s += (i ? "," : "") + std::to_string(g[i]);
  return s + "]";
}

/// The first problem with the groups, or "".
std::string check_groups(const std::vector<std::vector<int>>& groups, int num_ranks) {
  if (groups.empty() || groups.size() > static_cast<std::size_t>(kBucketMaxGroups))
    return "groups: " + std::to_string(groups.size()) + " groups, expected 1.." + std::to_string(kBucketMaxGroups);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& r = groups[g];
    if (r.empty()) return "groups[" + std::to_string(g) + "]: no ranks";
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (r[i] < 0 || r[i] >= num_ranks)
        return "groups[" + std::to_string(g) + "]: rank " + std::to_string(r[i]) + " outside [0, " + std::to_string(num_ranks) + ")";
      if (i > 0 && r[i] <= r[i - 1])
        return "groups[" + std::to_string(g) + "]: ranks must be ascending and distinct, got " + group_text(r);
    }
  }
  return "";
}

/// Headers go through the one-shot boards where peer windows are readable, unless an
/// algorithm that sends its data with the channel's messages is forced (staged, pipelined,
/// two-level: as before the boards, for A/B runs and the put-only paths' tests).
bool uses_boards(bool mapped_caps, BucketAlgorithm forced) {
  return mapped_caps && forced != BucketAlgorithm::kStaged && forced != BucketAlgorithm::kPipelined &&
         forced != BucketAlgorithm::kTwoLevel;
}

std::size_t auto_chunk_bytes(bool read_peers, int num_ranks) {
  if (read_peers) return std::size_t{64} << 10;
  const std::size_t budget = std::size_t{32} << 20;  // every rank's slots together
  std::size_t c = budget / (2 * static_cast<std::size_t>(std::max(num_ranks, 1)));
  c = std::clamp<std::size_t>(c, std::size_t{16} << 10, std::size_t{1} << 20);
  return c / 4096 * 4096;
}

/// This rank's first problem with the arguments (groups, num_bytes, topology, chunk_bytes),
/// or ""; `machines`: each rank's server from the topology, when one is given.
std::string local_problem(const std::vector<std::vector<int>>& groups, int num_ranks, std::size_t num_bytes,
                          const BucketOptions& options, std::vector<int>& machines) {
  std::string problem = check_groups(groups, num_ranks);
  if (problem.empty() && num_bytes == 0) problem = "num_bytes: 0 (the storage needs at least one byte)";
  if (problem.empty() && !options.topology.empty()) {
    try {
      const Topology topo = load_topology(options.topology, num_ranks);
      for (const RankPlace& p : topo.ranks) machines.push_back(p.server);
    } catch (const Error& e) {
      problem = std::string("topology: ") + e.what();
    }
  }
  if (problem.empty() && options.chunk_bytes != 0 && (options.chunk_bytes < 256 || options.chunk_bytes % 64 != 0))
    problem = "chunk_bytes: " + std::to_string(options.chunk_bytes) + ", expected 0 (auto) or a multiple of 64 >= 256";
  return problem;
}

// The completion protocols of one buffer: the headers' variant ("board" or "channels") and
// its protocol, and the channels' protocol.
struct ProtocolPick {
  const char* variant;
  Protocol protocol;
  Protocol channel_protocol;
};

// The protocol asked for (the options', else EPX_BUCKET_PROTOCOL's), else the table's pick
// for the variant the headers take; refused after the agreement (every rank alike). A bad
// ask becomes `problem` unless there is one already.
ProtocolPick pick_protocols(const TransportCaps& caps, const BucketOptions& options, std::string& problem) {
  const char* variant = uses_boards(caps.peer_memory_mapped, options.algorithm) ? "board" : "channels";
  std::optional<Protocol> asked;
  try {
    asked = spi::asked_protocol(options.protocol, "EPX_BUCKET_PROTOCOL");
  } catch (const Error& e) {
    if (problem.empty()) problem = e.what();
  }
  const Protocol protocol = asked ? *asked : spi::pick(spi::Kind::kBucket, variant, caps).value_or(Protocol::kExplicit);
  // The channels under flag: tail where the transport orders signals, else explicit.
  const Protocol channel_protocol = protocol != Protocol::kFlag
                                        ? protocol
                                        : spi::pick(spi::Kind::kBucket, "channels", caps).value_or(Protocol::kExplicit);
  return {variant, protocol, channel_protocol};
}

// What every rank must pass alike (a plan's tensors follow them).
std::vector<AgreedValue> agreed_values(const std::vector<std::vector<int>>& groups, std::size_t num_bytes,
                                       const BucketOptions& options, Protocol protocol) {
  std::vector<AgreedValue> values;
  for (std::size_t g = 0; g < groups.size(); ++g) values.push_back({"groups[" + std::to_string(g) + "]", group_text(groups[g])});
  values.push_back({"number of groups", std::to_string(groups.size())});
  values.push_back({"num_bytes", std::to_string(num_bytes)});
  values.push_back({"topology", options.topology});
  values.push_back({"chunk_bytes", std::to_string(options.chunk_bytes)});
  values.push_back({"algorithm", to_string(options.algorithm)});
  values.push_back({"protocol", to_string(protocol)});
  return values;
}

// After the agreement: throws kUnsupported if the table refuses the headers' or the
// channels' protocol on this transport.
void refuse_unsupported(const ProtocolPick& pick, const TransportCaps& caps, int rank) {
  std::string refused = spi::refuse_protocol(spi::Kind::kBucket, pick.variant, pick.protocol, caps);
  if (refused.empty()) refused = spi::refuse_protocol(spi::Kind::kBucket, "channels", pick.channel_protocol, caps);
  if (!refused.empty())
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank) + ": bucket.create: " + refused +
                                             (std::string(pick.variant) == "channels" && pick.protocol == Protocol::kFlag
                                                  ? " (flag takes the boards: readable peer windows and no forced staged, "
                                                    "pipelined or two-level algorithm)"
                                                  : ""),
                rank);
}

}  // namespace

std::uint64_t detail::members_hash(const std::vector<int>& ranks) {
  std::uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<std::uint64_t>(r + 1)) * 1099511628211ull;
  return h;
}

BucketBuffer::BucketBuffer(Transport& transport, const std::vector<std::vector<int>>& groups, std::size_t num_bytes,
                           const BucketOptions& options)
    : BufferBase(transport, "bucket") {
  init(groups, num_bytes, nullptr, options);
}

BucketBuffer::BucketBuffer(Transport& transport, const std::vector<std::vector<int>>& groups, const BufferAllocator& plan,
                           const BucketOptions& options)
    : BufferBase(transport, "bucket") {
  init(groups, plan.total_bytes(), &plan, options);
}

// Not destroy(): a destructor may run while this rank unwinds from an error its peers do not
// share, so it never waits for them; the base releases the endpoint locally. A call still
// pending finishes first (or fails by the transport's timeout).
BucketBuffer::~BucketBuffer() {
  if (impl_) impl_->worker.stop();
}

void BucketBuffer::init(const std::vector<std::vector<int>>& groups, std::size_t num_bytes, const BufferAllocator* plan,
                        const BucketOptions& options) {
  Transport& t = endpoint("construct");
  std::vector<int> machines;
  std::string problem = local_problem(groups, num_ranks(), num_bytes, options, machines);
  const bool mapped_caps = t.caps().peer_memory_mapped;
  const ProtocolPick pick = pick_protocols(t.caps(), options, problem);
  std::vector<AgreedValue> values = agreed_values(groups, num_bytes, options, pick.protocol);
  if (plan)
    for (AgreedValue& v : plan_values(*plan)) values.push_back(std::move(v));
  agree(values, problem);
  refuse_unsupported(pick, t.caps(), rank());

  groups_ = groups;
  num_bytes_ = num_bytes;
  if (plan) plan_ = *plan;
  chunk_bytes_ = options.chunk_bytes ? options.chunk_bytes : auto_chunk_bytes(mapped_caps, num_ranks());
  detail::BucketLayout layout{num_ranks(), num_bytes, chunk_bytes_, uses_boards(mapped_caps, options.algorithm) ? num_groups() : 0};
  allocate(layout.window_bytes(), layout.num_signals());

  Transport& ep = endpoint("construct");
  bool read_peers = mapped_caps;
  for (int p = 0; p < num_ranks() && read_peers; ++p) read_peers = ep.peer_window(p) != nullptr;
  if (machines.empty() && read_peers) machines.assign(static_cast<std::size_t>(num_ranks()), 0);
  // More ranks than cores: the waits on the boards yield at once (board.hpp).
  const bool yield = spi::ranks_outnumber_cpus(num_ranks());
  if (pick.protocol == Protocol::kFlag && !read_peers)  // caps said mapped, a window is not: no boards
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank()) +
                                             ": bucket.create: protocol 'flag' takes the boards, but a peer's window is not readable here",
                rank());
  impl_ = std::make_unique<Impl>(ep, layout, read_peers, std::move(machines), options.algorithm, yield, pick.protocol,
                                 pick.channel_protocol);
  const BucketAlgorithm a = options.algorithm;
  if ((a == BucketAlgorithm::kMapped || a == BucketAlgorithm::kOneShot) && !read_peers)
    agree_call("construct", CallProblem{ErrorCode::kUnsupported, std::string("algorithm ") + to_string(a) +
                                                                     ": this transport's peer windows are not readable in place"});
}

void BucketBuffer::on_destroy() noexcept {
  if (!impl_) return;
  if (impl_->pending) impl_->pending->run_or_wait();
  impl_->worker.stop();
  impl_.reset();
}

std::byte* BucketBuffer::storage() noexcept { return destroyed() ? nullptr : window(); }

std::shared_ptr<std::byte> BucketBuffer::storage_ref() const {
  require_alive("storage");
  std::shared_ptr<Transport> ep = endpoint_ref();
  return std::shared_ptr<std::byte>(ep, ep->window());
}

MutableView BucketBuffer::tensor(const std::string& name) {
  const PlannedTensor& p = plan_.at(name, "rank " + std::to_string(rank()) + ": bucket.tensor");
  endpoint("tensor");
  return MutableView{window() + p.offset, p.dtype, p.shape};
}

const std::vector<int>& BucketBuffer::group_ranks(int group) const {
  if (group < 0 || group >= num_groups())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": bucket: group " + std::to_string(group) +
                                                 " unknown (this buffer has " + std::to_string(num_groups()) + ")");
  return groups_[static_cast<std::size_t>(group)];
}

int BucketBuffer::group_rank(int group) const {
  const auto& r = group_ranks(group);
  const auto it = std::find(r.begin(), r.end(), rank());
  return it == r.end() ? -1 : static_cast<int>(it - r.begin());
}

int BucketBuffer::group_machines(int group) const {
  const auto& r = group_ranks(group);
  if (!impl_ || impl_->ctx.machine_of_rank.empty()) return 1;
  std::vector<int> m;
  for (int x : r) m.push_back(impl_->ctx.machine_of_rank[static_cast<std::size_t>(x)]);
  std::sort(m.begin(), m.end());
  return static_cast<int>(std::unique(m.begin(), m.end()) - m.begin());
}

}  // namespace epx
