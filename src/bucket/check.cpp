// What a bucket call checks: each member its own inputs (before anything moves), then
// every member the headers of all (the same verdicts on every member).
#include "check.hpp"

#include <algorithm>
#include <string>

#include "epx/error.hpp"

namespace epx::detail {

namespace {

std::string arg(const char* name, std::size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

CallProblem bad(const std::string& message, ErrorCode code = ErrorCode::kInvalidArgument) {
  return CallProblem{code, message};
}

/// Element alignment and non-null data: the problem with tensor `name`, or "".
std::optional<CallProblem> check_pointer(const std::string& name, const void* data, std::size_t bytes, DType dtype) {
  if (data == nullptr && bytes > 0) return bad(name + ": no data");
  const std::size_t align = dtype_size(dtype);
  const auto addr = reinterpret_cast<std::uintptr_t>(data);
  if (addr % align != 0)
    return bad(name + ": misaligned: its address is " + std::to_string(addr % align) + " bytes past a multiple of its " +
               std::to_string(align) + "-byte " + to_string(dtype) + " elements");
  return std::nullopt;
}

std::optional<CallProblem> check_count(std::size_t count, const char* name) {
  if (count == 0) return bad(std::string(name) + ": no tensors (a call takes 1.." + std::to_string(kBucketMaxTensors) + ")");
  if (count > static_cast<std::size_t>(kBucketMaxTensors))
    return bad(std::string(name) + ": " + std::to_string(count) + " tensors, at most " + std::to_string(kBucketMaxTensors) +
               " per call");
  return std::nullopt;
}

std::string outside(const std::string& name, std::size_t bytes, const StorageRange& s) {
  return name + ": " + std::to_string(bytes) + " bytes outside the buffer's storage of " + std::to_string(s.bytes) +
         " bytes (outside a session, tensors must be views of the storage)";
}

/// Ranges [off, off + bytes) of the call's storage tensors: the first two that overlap, or "".
std::optional<CallProblem> check_overlaps(const std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>>& r) {
  for (std::size_t a = 0; a < r.size(); ++a)
    for (std::size_t b = a + 1; b < r.size(); ++b) {
      const auto [a0, a1] = r[a].second;
      const auto [b0, b1] = r[b].second;
      if (a0 < b1 && b0 < a1 && a1 > a0 && b1 > b0)
        return bad(r[a].first + " and " + r[b].first + " overlap (storage bytes [" + std::to_string(std::max(a0, b0)) +
                   ", " + std::to_string(std::min(a1, b1)) + "))");
    }
  return std::nullopt;
}

}  // namespace

std::uint64_t StorageRange::offset_of(const void* p, std::size_t n) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  const std::byte* e = begin + bytes;
  if (begin == nullptr || b < begin || b > e || n > static_cast<std::size_t>(e - b)) return kOutside;
  return static_cast<std::uint64_t>(b - begin);
}

std::optional<CallProblem> describe_all_gather(BucketCall& c, const std::vector<TensorView>& srcs,
                                               const std::vector<MutableView>& dsts, const StorageRange& s) {
  if (auto p = check_count(srcs.size(), "srcs")) return p;
  if (!dsts.empty() && dsts.size() != srcs.size())
    return bad("dsts: " + std::to_string(dsts.size()) + " tensors for " + std::to_string(srcs.size()) + " srcs");
  const std::uint64_t n = static_cast<std::uint64_t>(c.n()), me = static_cast<std::uint64_t>(c.me);
  std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>> ranges;
  for (std::size_t i = 0; i < srcs.size(); ++i) {
    const TensorView& v = srcs[i];
    const std::uint64_t bytes = static_cast<std::uint64_t>(v.shape.numel()) * dtype_size(v.dtype);
    TensorDesc d{bytes, s.offset_of(v.data, bytes), kOutside, v.dtype};
    if (auto p = check_pointer(arg("srcs", i), v.data, bytes, v.dtype)) return p;
    if (dsts.empty()) {
      if (d.in_off == kOutside) return bad(outside(arg("srcs", i), bytes, s) + "; in place, a src is a shard of a storage tensor");
      if (d.in_off < me * bytes || d.in_off - me * bytes + n * bytes > s.bytes)
        return bad(arg("srcs", i) + ": in place, member " + std::to_string(me) + "'s shard starts " + std::to_string(me * bytes) +
                   " bytes into a tensor of " + std::to_string(n * bytes) + " bytes, which would not lie inside the storage (" +
                   "the src is at offset " + std::to_string(d.in_off) + " of " + std::to_string(s.bytes) + ")");
      d.out_off = d.in_off - me * bytes;
    } else {
      const MutableView& o = dsts[i];
      if (o.dtype != v.dtype)
        return CallProblem{ErrorCode::kDtypeMismatch, arg("dsts", i) + ": " + to_string(o.dtype) + ", its src is " + to_string(v.dtype)};
      if (o.nbytes() != n * bytes)
        return CallProblem{ErrorCode::kShapeMismatch, arg("dsts", i) + ": " + std::to_string(o.nbytes()) + " bytes, expected " +
                                                          std::to_string(n) + " x " + std::to_string(bytes) + " (group size x src bytes)"};
      if (auto p = check_pointer(arg("dsts", i), o.data, o.nbytes(), o.dtype)) return p;
      d.out_off = s.offset_of(o.data, o.nbytes());
      if (d.out_off == kOutside) return bad(outside(arg("dsts", i), o.nbytes(), s));
      if (d.in_off != kOutside && d.in_off != d.out_off + me * bytes) ranges.push_back({arg("srcs", i), {d.in_off, d.in_off + bytes}});
      ranges.push_back({arg("dsts", i), {d.out_off, d.out_off + n * bytes}});
    }
    c.mine.tensors.push_back(d);
    c.in.push_back(static_cast<const std::byte*>(v.data));
    c.out.push_back(s.begin + (d.out_off == kOutside ? 0 : d.out_off));
  }
  return check_overlaps(ranges);
}

std::optional<CallProblem> describe_reduction(BucketCall& c, const std::vector<MutableView>& xs, const StorageRange& s) {
  if (auto p = check_count(xs.size(), "srcs")) return p;
  std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>> ranges;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const MutableView& x = xs[i];
    if (x.dtype != DType::kF32)
      return CallProblem{ErrorCode::kDtypeMismatch,
                         arg("srcs", i) + ": " + c.name() + " reduces float32 tensors, got " + to_string(x.dtype)};
    const std::uint64_t bytes = x.nbytes();
    if (auto p = check_pointer(arg("srcs", i), x.data, bytes, x.dtype)) return p;
    TensorDesc d{bytes, s.offset_of(x.data, bytes), kOutside, x.dtype};
    if (d.in_off == kOutside) return bad(outside(arg("srcs", i), bytes, s));
    d.out_off = d.in_off;
    if (c.op == BucketOp::kReduceScatter && x.shape.numel() % c.n() != 0)
      return CallProblem{ErrorCode::kShapeMismatch, arg("srcs", i) + ": " + std::to_string(x.shape.numel()) +
                                                        " elements do not split into " + std::to_string(c.n()) +
                                                        " equal shards (numel % group size must be 0)"};
    ranges.push_back({arg("srcs", i), {d.in_off, d.in_off + bytes}});
    c.mine.tensors.push_back(d);
    c.in.push_back(static_cast<const std::byte*>(x.data));
    c.out.push_back(static_cast<std::byte*>(x.data));
  }
  return check_overlaps(ranges);
}

namespace {

/// How member `h` differs from the reference `r` (as seen by every member), or "".
std::string difference(const CallHeader& h, const CallHeader& r, int ref_rank) {
  const std::string on = " on rank " + std::to_string(ref_rank);
  if (h.members_hash != r.members_hash || h.group != r.group)
    return "group " + std::to_string(h.group) + " here, group " + std::to_string(r.group) + on +
           " (every member names the same group)";
  if (h.op != r.op) return std::string("this rank calls ") + op_name(h.op) + ", rank " + std::to_string(ref_rank) + " " + op_name(r.op);
  if (h.tensors.size() != r.tensors.size())
    return "srcs: " + std::to_string(h.tensors.size()) + " tensors, " + std::to_string(r.tensors.size()) + on +
           " (every member passes the same number)";
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    if (h.tensors[i].bytes != r.tensors[i].bytes)
      return arg("srcs", i) + ": " + std::to_string(h.tensors[i].bytes) + " bytes, " + std::to_string(r.tensors[i].bytes) + on +
             " (every member passes the same sizes)";
    if (h.tensors[i].dtype != r.tensors[i].dtype)
      return arg("srcs", i) + ": " + to_string(h.tensors[i].dtype) + ", " + to_string(r.tensors[i].dtype) + on;
  }
  if (h.precision != r.precision)
    return std::string("comm_precision ") + to_string(h.precision) + ", " + to_string(r.precision) + on;
  if (!(h.scale == r.scale) && !(h.scale != h.scale && r.scale != r.scale))
    return "scale " + std::to_string(h.scale) + ", " + std::to_string(r.scale) + on + " (every member passes the same scale)";
  if (h.algorithm != r.algorithm) return "internal: another algorithm than" + on;
  return "";
}

/// The member every other one is compared with: the first without a problem of its own if
/// every such member agrees with it (the usual case, n comparisons), else the one most others
/// agree with (lowest on ties), so that the odd one out is named, not the others. -1: none.
int reference_member(const BucketCall& c) {
  const auto& hs = c.headers;
  std::vector<int> ok;
  for (int j = 0; j < c.n(); ++j)
    if (!hs[static_cast<std::size_t>(j)].problem) ok.push_back(j);
  if (ok.empty()) return -1;
  auto same = [&](int a, int b) { return difference(hs[static_cast<std::size_t>(a)], hs[static_cast<std::size_t>(b)], 0).empty(); };
  if (std::all_of(ok.begin(), ok.end(), [&](int j) { return same(j, ok[0]); })) return ok[0];
  int best = ok[0], best_count = -1;
  for (int a : ok) {
    const int count = static_cast<int>(std::count_if(ok.begin(), ok.end(), [&](int b) { return same(a, b); }));
    if (count > best_count) best = a, best_count = count;
  }
  return best;
}

}  // namespace

std::vector<std::optional<CallProblem>> cross_check(const BucketCall& c) {
  std::vector<std::optional<CallProblem>> verdicts(static_cast<std::size_t>(c.n()));
  const int ref = reference_member(c);
  for (int j = 0; j < c.n(); ++j) {
    const CallHeader& h = c.headers[static_cast<std::size_t>(j)];
    if (h.problem) {
      verdicts[static_cast<std::size_t>(j)] = h.problem;
      continue;
    }
    const std::string d = difference(h, c.headers[static_cast<std::size_t>(ref)], c.members[static_cast<std::size_t>(ref)]);
    if (!d.empty()) {
      const bool sizes = d.find("bytes,") != std::string::npos;
      verdicts[static_cast<std::size_t>(j)] = CallProblem{sizes ? ErrorCode::kShapeMismatch : ErrorCode::kInvalidArgument, d};
    }
  }
  return verdicts;
}

}  // namespace epx::detail
