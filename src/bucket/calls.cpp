// The steps every bucket call shares: this rank's checks, the header exchange (with the
// staged payload), the verdicts of every member, then the chosen algorithm's data phase.
#include <algorithm>
#include <chrono>

#include "algorithms.hpp"
#include "check.hpp"
#include "epx/bucket.hpp"
#include "epx/error.hpp"
#include "impl.hpp"

namespace epx {

using detail::BucketCall;
using detail::BucketOp;

std::shared_ptr<BucketCall> BucketBuffer::begin_call(int op, int group, const char* call) {
  const std::string where = "rank " + std::to_string(rank()) + ": bucket." + call + ": ";
  endpoint(call);
  if (impl_->pending) {
    bool done;  // pending until its event's wait() returned (or the event was dropped), done or not
    {
      std::lock_guard<std::mutex> lock(impl_->pending->m);
      done = impl_->pending->state == BucketCall::State::kDone && impl_->pending->waited;
    }
    if (!done)
      throw Error(ErrorCode::kInvalidArgument, where + "a call is pending on this buffer (" + impl_->pending->name() +
                                                   "): wait() for its event first");
    impl_->pending.reset();
  }
  if (group == -1 && num_groups() > 1)
    throw Error(ErrorCode::kInvalidArgument, where + "group: this buffer has " + std::to_string(num_groups()) +
                                                 " groups, the call must name one");
  if (group == -1) group = 0;
  if (group < 0 || group >= num_groups())
    throw Error(ErrorCode::kInvalidArgument, where + "group " + std::to_string(group) + " unknown (this buffer has " +
                                                 std::to_string(num_groups()) + " groups)");
  auto c = std::make_shared<BucketCall>();
  c->op = static_cast<BucketOp>(op);
  c->group = group;
  c->members = groups_[static_cast<std::size_t>(group)];
  c->me = group_rank(group);
  if (c->me < 0)
    throw Error(ErrorCode::kInvalidArgument, where + "this rank is not a member of group " + std::to_string(group) + " " +
                                                 "(ranks " + std::to_string(c->members.front()) + ".." +
                                                 std::to_string(c->members.back()) + ")");
  c->mine.op = c->op;
  c->mine.group = group;
  c->mine.members_hash = detail::members_hash(c->members);
  return c;
}

BucketEvent BucketBuffer::all_gather_async(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts,
                                           int group) {
  return gather(srcs, dsts, group, true);
}
std::vector<MutableView> BucketBuffer::all_gather(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts,
                                                  int group) {
  return gather(srcs, dsts, group, false).wait();
}
BucketEvent BucketBuffer::reduce_scatter_async(const std::vector<MutableView>& xs, CommPrecision precision, float scale,
                                               int group) {
  return reduce(static_cast<int>(BucketOp::kReduceScatter), xs, precision, scale, group, true);
}
std::vector<MutableView> BucketBuffer::reduce_scatter(const std::vector<MutableView>& xs, CommPrecision precision,
                                                      float scale, int group) {
  return reduce(static_cast<int>(BucketOp::kReduceScatter), xs, precision, scale, group, false).wait();
}
BucketEvent BucketBuffer::all_reduce_async(const std::vector<MutableView>& xs, float scale, int group) {
  return reduce(static_cast<int>(BucketOp::kAllReduce), xs, CommPrecision::kFP32, scale, group, true);
}
std::vector<MutableView> BucketBuffer::all_reduce(const std::vector<MutableView>& xs, float scale, int group) {
  return reduce(static_cast<int>(BucketOp::kAllReduce), xs, CommPrecision::kFP32, scale, group, false).wait();
}

BucketEvent BucketBuffer::gather(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts, int group,
                                 bool async) {
  auto c = begin_call(static_cast<int>(BucketOp::kAllGather), group, "all_gather");
  c->mine.problem = detail::describe_all_gather(*c, srcs, dsts, {window(), num_bytes_});
  for (const TensorView& v : srcs) c->in_views.push_back(v);
  return start(std::move(c), async);
}

BucketEvent BucketBuffer::reduce(int op, const std::vector<MutableView>& xs, CommPrecision precision, float scale,
                                 int group, bool async) {
  auto c = begin_call(op, group, op == static_cast<int>(BucketOp::kAllReduce) ? "all_reduce" : "reduce_scatter");
  c->precision = c->mine.precision = precision;
  c->scale = c->mine.scale = scale;
  c->mine.problem = detail::describe_reduction(*c, xs, {window(), num_bytes_});
  for (const MutableView& x : xs) c->in_views.push_back(x.view());
  return start(std::move(c), async);
}

void BucketBuffer::exchange(BucketCall& c) {
  Impl& im = *impl_;
  if (im.ctx.board && c.group >= 0) return detail::exchange_on_board(im.board, c);
  Transport& t = im.ctx.t;
  const int n = c.n();
  const std::size_t hb = detail::encode_header(c.mine, im.header.data());
  std::vector<std::vector<std::uint16_t>> scratch;  // packed bf16 payloads, alive until the quiet
  const bool payload = c.mine.algorithm == BucketAlgorithm::kStaged && !c.mine.problem;
  for (int s = 1; s < n; ++s) {
    const int k = (c.me + s) % n, peer = c.members[static_cast<std::size_t>(k)];
    im.channels.wait_credit(peer, "bucket header credit");
    const std::size_t off = im.channels.out_slot(peer);
    t.put(peer, off, im.header.data(), hb, 0);
    if (payload) detail::put_staged_payload(im.ctx, c, k, off + detail::kHeaderBytes, scratch);
  }
  for (int s = 1; s < n; ++s) im.channels.send(c.members[static_cast<std::size_t>((c.me + s) % n)]);
  if (!t.caps().put_completes_on_return) t.quiet(0);
  c.headers.assign(static_cast<std::size_t>(n), {});
  c.slots.assign(static_cast<std::size_t>(n), nullptr);
  c.headers[static_cast<std::size_t>(c.me)] = c.mine;
  for (int s = 1; s < n; ++s) {
    const int j = (c.me + n - s) % n, peer = c.members[static_cast<std::size_t>(j)];
    const std::byte* slot = im.channels.receive(peer, "bucket header");
    c.slots[static_cast<std::size_t>(j)] = slot;
    c.headers[static_cast<std::size_t>(j)] = detail::decode_header(slot, peer);
  }
}

void BucketBuffer::check_verdicts(BucketCall& c) {
  std::vector<std::optional<CallProblem>> by_member =
      c.n() == 1 ? std::vector<std::optional<CallProblem>>{c.mine.problem} : detail::cross_check(c);
  if (std::none_of(by_member.begin(), by_member.end(), [](const auto& v) { return v.has_value(); })) return;
  for (int j = 0; j < c.n() && !c.via_board; ++j)  // the slots go back before the throw: the channels stay in step
    if (j != c.me) impl_->channels.consume(c.members[static_cast<std::size_t>(j)]);
  // By world rank, as the rule takes them; when every member has the same problem the ranks
  // outside the group get it too, so that the rule's "every rank" case covers the group.
  const bool alike = std::all_of(by_member.begin(), by_member.end(), [&](const auto& v) {
    return v && v->code == by_member[0]->code && v->message == by_member[0]->message;
  });
  std::vector<std::optional<CallProblem>> by_rank(static_cast<std::size_t>(num_ranks()), alike ? by_member[0] : std::nullopt);
  for (int j = 0; j < c.n(); ++j) by_rank[static_cast<std::size_t>(c.members[static_cast<std::size_t>(j)])] = by_member[static_cast<std::size_t>(j)];
  resolve_call_problems(c.name(), by_rank);
  throw Error(ErrorCode::kInternal, "bucket: a verdict was not raised");
}

namespace {

std::vector<MutableView> result_views(const BucketCall& c) {
  std::vector<MutableView> r;
  const auto n = static_cast<std::int64_t>(c.n());
  for (int t = 0; t < c.num_tensors(); ++t) {
    const TensorView& v = c.in_views[static_cast<std::size_t>(t)];
    std::byte* out = c.out[static_cast<std::size_t>(t)];
    if (c.op == BucketOp::kAllGather)
      r.push_back({out, v.dtype, Shape{n * v.shape.numel()}});
    else if (c.op == BucketOp::kReduceScatter)
      r.push_back({out + static_cast<std::uint64_t>(c.me) * detail::shard_bytes(c, t), DType::kF32, Shape{v.shape.numel() / n}});
    else
      r.push_back({out, DType::kF32, v.shape});
  }
  return r;
}

std::function<void()> data_phase(detail::BucketContext& ctx, const std::shared_ptr<BucketCall>& c) {
  BucketCall* call = c.get();
  switch (c->mine.algorithm) {
    case BucketAlgorithm::kStaged: return [&ctx, call] { detail::run_staged(ctx, *call); };
    case BucketAlgorithm::kMapped: return [&ctx, call] { detail::run_mapped(ctx, *call); };
    case BucketAlgorithm::kPipelined: return [&ctx, call] { detail::run_pipelined(ctx, *call); };
    case BucketAlgorithm::kTwoLevel: return [&ctx, call] { detail::run_two_level(ctx, *call); };
    case BucketAlgorithm::kDirect: return [&ctx, call] { detail::run_direct(ctx, *call); };
    case BucketAlgorithm::kOneShot: return [&ctx, call] { detail::run_one_shot(ctx, *call); };
    case BucketAlgorithm::kNone: break;
  }
  throw Error(ErrorCode::kInternal, "bucket: no algorithm chosen");
}

}  // namespace

BucketEvent BucketBuffer::start(std::shared_ptr<BucketCall> c, bool async) {
  Impl& im = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  if (!c->mine.problem) c->mine.algorithm = c->n() == 1 ? BucketAlgorithm::kStaged
                                                        : detail::choose_algorithm(*c, im.ctx, chunk_bytes_, im.forced);
  c->mine.payload_bytes = detail::staged_payload_bytes(*c, 0);
  if (c->n() > 1) exchange(*c);
  check_verdicts(*c);
  const bool staged = c->mine.algorithm == BucketAlgorithm::kStaged;
  if (c->n() > 1 && !staged && !c->via_board)
    for (int j = 0; j < c->n(); ++j)
      if (j != c->me) im.channels.consume(c->members[static_cast<std::size_t>(j)]);
  c->results = result_views(*c);
  c->stats.algorithm = c->mine.algorithm;
  c->stats.exchange_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  BucketCall* call = c.get();
  std::function<void()> run = c->n() == 1 ? std::function<void()>([call] { detail::run_local(*call); }) : data_phase(im.ctx, c);
  c->data_phase = [call, run = std::move(run), &ch = im.channels, sink = &stats_] {
    const auto d0 = std::chrono::steady_clock::now();
    ch.done_wait_us = 0;
    run();
    call->stats.data_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - d0).count();
    call->stats.done_us = ch.done_wait_us;
    *sink = call->stats;
  };
  last_algorithm_ = c->mine.algorithm;
  c->state = BucketCall::State::kQueued;
  BucketEvent ev;
  ev.call_ = c;
  if (async) {
    im.pending = c;
    im.worker.post(std::move(c));
  } else {
    c->run_or_wait();
  }
  return ev;
}

void BucketBuffer::fail_call(const std::vector<int>& ranks, const char* call, const std::string& problem) {
  endpoint(call);
  auto c = std::make_shared<BucketCall>();
  c->members = ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), rank());
  const bool valid = std::all_of(ranks.begin(), ranks.end(), [&](int r) { return r >= 0 && r < num_ranks(); }) &&
                     std::adjacent_find(ranks.begin(), ranks.end(), std::greater_equal<int>()) == ranks.end();
  if (it == ranks.end() || !valid)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": bucket." + call + ": " + problem);
  c->me = static_cast<int>(it - ranks.begin());
  c->mine.members_hash = detail::members_hash(ranks);
  // Ranks that are a group of this buffer: the members calling that group meet this call
  // where they exchange headers (its board); any other list meets only fail_call's (channels).
  const auto g = std::find(groups_.begin(), groups_.end(), ranks);
  c->group = c->mine.group = g == groups_.end() ? -1 : static_cast<int>(g - groups_.begin());
  c->call_name = call;
  c->mine.problem = CallProblem{ErrorCode::kInvalidArgument, problem};
  if (c->n() > 1) exchange(*c);
  check_verdicts(*c);
  throw Error(ErrorCode::kInternal, "bucket: fail_call did not fail");
}

}  // namespace epx
