// EngramBuffer: configuration, write, fetch's checks and plan. The rows move in
// fetch_paths.cpp (local / mapped copies, the served path's requests and replies).
#include "epx/engram.hpp"

#include <cstring>
#include <optional>
#include <string>

#include "epx/spi/backoff.hpp"
#include "epx/spi/kind_support.hpp"
#include "fetch_paths.hpp"
#include "fetch_state.hpp"
#include "layout.hpp"

namespace epx {

namespace engram {

const char* to_string(Path p) noexcept {
  switch (p) {
    case Path::kLocal: return "local";
    case Path::kMapped: return "mapped";
    case Path::kGet: return "get";
    case Path::kServed: return "served";
  }
  return "?";
}

}  // namespace engram

namespace {

std::string r_of(int r) { return "rank " + std::to_string(r); }

std::string list_of(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// How remote rows move on `t` (after allocate: peer windows are known then).
engram::Path path_of(Transport& t) {
  if (t.num_ranks() == 1) return engram::Path::kLocal;
  bool mapped = true;
  for (int p = 0; p < t.num_ranks(); ++p) mapped = mapped && t.peer_window(p) != nullptr;
  if (mapped) return engram::Path::kMapped;
  if (t.caps().one_sided_get) return engram::Path::kGet;  // OpenSHMEM across machines
  return engram::Path::kServed;
}

}  // namespace

struct EngramBuffer::Impl {
  std::size_t num_bytes = 0, num_storage_bytes = 0;
  std::optional<engram::Layout> layout;
  bool written = false;
  engram::Path path = engram::Path::kLocal;
  Protocol served_protocol = Protocol::kExplicit;  // the served path's (spi/kind_support.hpp)
  std::shared_ptr<std::uint64_t> live = std::make_shared<std::uint64_t>(0);
  std::vector<std::byte> zero_row, zero_sf;  // the source of -1 entries
  engram::ServedState served;  // fetches and layers served so far (served path)
  // Get path: the gets of the latest fetch may still be in flight (its first hook, a later
  // fetch or destroy completes them with quiet before the outputs are read or reused).
  std::shared_ptr<bool> gets_pending = std::make_shared<bool>(false);
};

EngramSizes EngramBuffer::get_storage_size_hint(int num_ranks, const EngramConfig& config) {
  if (num_ranks < 1) throw Error(ErrorCode::kInvalidArgument, "engram: num_ranks = " + std::to_string(num_ranks));
  const engram::Layout l(num_ranks, config);
  return {l.num_bytes(), l.num_storage_bytes()};
}

EngramBuffer::EngramBuffer(Transport& transport, std::size_t num_bytes, std::size_t num_storage_bytes)
    : BufferBase(transport, "engram"), impl_(std::make_unique<Impl>()) {
  agree({{"num_bytes", std::to_string(num_bytes)}, {"num_storage_bytes", std::to_string(num_storage_bytes)}}, "");
  impl_->num_bytes = num_bytes;
  impl_->num_storage_bytes = num_storage_bytes;
  allocate(num_bytes + num_storage_bytes, 2 * static_cast<std::size_t>(num_ranks()));
  impl_->path = path_of(endpoint("construct"));
  // Only the served path has a sender to complete its puts; the table picks how for this
  // transport (mapped rows need nothing, gets only the requester's quiet).
  impl_->served_protocol =
      spi::pick(spi::Kind::kEngram, "served", endpoint("construct").caps()).value_or(Protocol::kExplicit);
}

EngramBuffer::~EngramBuffer() {
  if (impl_) *impl_->live = 0;  // outstanding hooks are stale (the base's destroy() runs after this)
}

void EngramBuffer::on_destroy() noexcept {
  if (!impl_) return;
  *impl_->live = 0;
  if (*impl_->gets_pending) {  // nothing may still land in the window being released
    try {
      endpoint("destroy").quiet(0);
    } catch (...) {
    }
    *impl_->gets_pending = false;
  }
}

const char* EngramBuffer::path() const noexcept { return engram::to_string(impl_->path); }

void EngramBuffer::set_config(const EngramConfig& config) {
  endpoint("set_config");
  const std::string problem = engram::config_problem(config);
  agree({{"num_entries_per_layer", list_of(config.num_entries_per_layer)},
         {"hidden", std::to_string(config.hidden)},
         {"num_max_tokens", std::to_string(config.num_max_tokens)},
         {"num_entries_per_token", std::to_string(config.num_entries_per_token)},
         {"dtype", to_string(config.dtype)},
         {"num_sf_packs", std::to_string(config.num_sf_packs)}},
        problem.empty() ? "" : "engram.set_config: " + problem);
  engram::Layout l(num_ranks(), config);
  std::optional<CallProblem> fits;
  if (l.num_bytes() > impl_->num_bytes || l.num_storage_bytes() > impl_->num_storage_bytes)
    fits = CallProblem{ErrorCode::kCapacityExceeded,
                       "the config needs num_bytes = " + std::to_string(l.num_bytes()) + " and num_storage_bytes = " +
                           std::to_string(l.num_storage_bytes()) + ", the buffer has " + std::to_string(impl_->num_bytes) +
                           " and " + std::to_string(impl_->num_storage_bytes) +
                           " (get_storage_size_hint gives what a config needs)"};
  agree_call("engram.set_config", fits);
  *impl_->live += 1;  // outstanding fetches refer to the old layout: stale now
  impl_->zero_row.assign(l.row_bytes(), std::byte{0});
  impl_->zero_sf.assign(l.sf_row_bytes(), std::byte{0});
  impl_->layout.emplace(std::move(l));
  impl_->written = false;
  config_ = config;
}

namespace {

/// What is wrong with write's arguments ("" if nothing), and the code to fail with.
std::optional<CallProblem> write_problem(const engram::Layout& l, int P, const std::vector<TensorView>& tables,
                                         const std::vector<TensorView>& sfs) {
  const int L = l.num_layers();
  auto bad = [](ErrorCode c, std::string m) { return std::optional<CallProblem>(CallProblem{c, std::move(m)}); };
  if (static_cast<int>(tables.size()) != L)
    return bad(ErrorCode::kInvalidArgument, std::to_string(tables.size()) + " tables, expected one per layer (" +
                                                std::to_string(L) + ")");
  const bool fp8 = l.dtype() == DType::kFP8E4M3;
  if (!fp8 && !sfs.empty())
    return bad(ErrorCode::kInvalidArgument, "sfs given for bf16 tables (scales are for FP8 only)");
  if (fp8 && static_cast<int>(sfs.size()) != L)
    return bad(ErrorCode::kInvalidArgument, std::to_string(sfs.size()) + " scale tables (sfs), expected one per layer (" +
                                                std::to_string(L) + ") for FP8 tables");
  for (int i = 0; i < L; ++i) {
    const TensorView& t = tables[static_cast<std::size_t>(i)];
    const std::string name = "tables[" + std::to_string(i) + "]";
    if (t.dtype != l.dtype())
      return bad(ErrorCode::kDtypeMismatch, name + " is " + to_string(t.dtype) + ", expected " + to_string(l.dtype()));
    const Shape want{l.entries(i), l.hidden()};
    if (!(t.shape == want))
      return bad(ErrorCode::kShapeMismatch, name + " is " + t.shape.str() + ", expected " + want.str() +
                                                " (this rank's N_l rows of H values)");
    if (t.data == nullptr) return bad(ErrorCode::kInvalidArgument, name + " has no data");
    if (!fp8) continue;
    const TensorView& s = sfs[static_cast<std::size_t>(i)];
    const std::string sname = "sfs[" + std::to_string(i) + "]";
    if (s.dtype != DType::kF32)
      return bad(ErrorCode::kDtypeMismatch, sname + " is " + to_string(s.dtype) + ", expected float32");
    const Shape local{l.entries(i), l.sf_packs()}, global{P * l.entries(i), l.sf_packs()};
    if (!(s.shape == local) && !(s.shape == global))
      return bad(ErrorCode::kShapeMismatch, sname + " is " + s.shape.str() + ", expected " + local.str() + " or " +
                                                global.str() + " (this rank's scale rows, or the whole table's)");
    if (s.data == nullptr) return bad(ErrorCode::kInvalidArgument, sname + " has no data");
  }
  return std::nullopt;
}

}  // namespace

void EngramBuffer::write(const std::vector<TensorView>& tables, const std::vector<TensorView>& sfs) {
  write(tables, sfs, std::nullopt);
}

void EngramBuffer::write(const std::vector<TensorView>& tables, const std::vector<TensorView>& sfs,
                         const std::optional<CallProblem>& caller_problem) {
  Transport& t = endpoint("write");
  if (!impl_->layout)
    throw Error(ErrorCode::kInvalidArgument, r_of(rank()) + ": engram.write: call set_config first", rank());
  const engram::Layout& l = *impl_->layout;
  agree_call("engram.write", caller_problem ? caller_problem : write_problem(l, num_ranks(), tables, sfs));
  *impl_->live += 1;  // views of an earlier fetch would show the new rows: stale
  for (int i = 0; i < l.num_layers(); ++i) {
    const auto n = static_cast<std::size_t>(l.entries(i));
    std::memcpy(window() + l.row_offset(impl_->num_bytes, i, 0), tables[static_cast<std::size_t>(i)].data,
                n * l.row_bytes());
    if (sfs.empty()) continue;
    const TensorView& s = sfs[static_cast<std::size_t>(i)];
    const std::size_t first = s.shape[0] == l.entries(i) ? 0 : static_cast<std::size_t>(rank()) * n;
    std::memcpy(window() + l.sf_offset(impl_->num_bytes, i, 0),
                static_cast<const std::byte*>(s.data) + first * l.sf_row_bytes(), n * l.sf_row_bytes());
  }
  t.barrier("engram write");  // every shard is in place before anyone reads it
  impl_->written = true;
}

namespace {

/// What is wrong with fetch's indices (nullopt: nothing): dtype, shape, then the first
/// value outside [-1, P * N_l).
std::optional<CallProblem> index_problem(const engram::Layout& l, const TensorView& x) {
  auto bad = [](ErrorCode c, std::string m) { return std::optional<CallProblem>(CallProblem{c, std::move(m)}); };
  if (x.dtype != DType::kI32)
    return bad(ErrorCode::kDtypeMismatch, std::string("indices are ") + to_string(x.dtype) + ", expected int32");
  if (x.shape.ndim != 3 || x.shape[0] != l.num_layers() || x.shape[2] != l.per_token() || x.shape[1] > l.tokens())
    return bad(ErrorCode::kShapeMismatch, "indices are " + x.shape.str() + ", expected [" +
                                              std::to_string(l.num_layers()) + ", T, " + std::to_string(l.per_token()) +
                                              "] with T <= num_max_tokens = " + std::to_string(l.tokens()));
  if (x.data == nullptr && x.shape.numel() > 0) return bad(ErrorCode::kInvalidArgument, "indices have no data");
  const std::int64_t T = x.shape[1], E = l.per_token();
  const auto* v = x.as<std::int32_t>();
  for (int L = 0; L < l.num_layers(); ++L) {
    const std::int64_t rows = l.num_ranks() * l.entries(L);
    for (std::int64_t i = 0; i < T * E; ++i) {
      const std::int64_t g = v[L * T * E + i];
      if (g >= -1 && g < rows) continue;
      return bad(ErrorCode::kInvalidArgument,
                 "indices[" + std::to_string(L) + ", " + std::to_string(i / E) + ", " + std::to_string(i % E) + "] = " +
                     std::to_string(g) + " (layer " + std::to_string(L) + ", token " + std::to_string(i / E) +
                     ", entry " + std::to_string(i % E) + ") is outside [-1, " + std::to_string(rows) + "): layer " +
                     std::to_string(L) + " has " + std::to_string(l.entries(L)) + " rows on each of " +
                     std::to_string(l.num_ranks()) + " ranks");
    }
  }
  return std::nullopt;
}

}  // namespace

EngramFetch EngramBuffer::fetch(const TensorView& indices) { return fetch(indices, std::nullopt); }

EngramFetch EngramBuffer::fetch(const TensorView& indices, const std::optional<CallProblem>& caller_problem) {
  Transport& t = endpoint("fetch");
  Impl& m = *impl_;
  if (!m.layout || !m.written)
    throw Error(ErrorCode::kInvalidArgument,
                r_of(rank()) + ": engram.fetch: " + (m.layout ? "write the tables first" : "call set_config and write first"),
                rank());
  const engram::Layout& l = *m.layout;
  const std::optional<CallProblem> problem = caller_problem ? caller_problem : index_problem(l, indices);
  if (m.path == engram::Path::kServed) agree_call("engram.fetch", problem);
  else if (problem) throw Error(problem->code, r_of(rank()) + ": engram.fetch: " + problem->message, rank());
  auto s = std::make_shared<engram::FetchState>();
  s->live = m.live;
  s->generation = ++*m.live;
  s->core = {&t, window(), m.num_bytes, &l, m.path, rank(), m.zero_row.data(), m.zero_sf.data(),
             spi::ranks_outnumber_cpus(num_ranks()), m.served_protocol};
  s->keep = endpoint_ref();
  s->num_tokens = indices.shape[1];
  s->indices = indices.as<std::int32_t>();
  s->done.assign(static_cast<std::size_t>(l.num_layers()), 0);
  s->gets_pending = m.gets_pending;
  if (*m.gets_pending) t.quiet(0), *m.gets_pending = false;  // the previous fetch's gets, into these outputs
  engram::plan_rows(*s);
  if (m.path == engram::Path::kServed) engram::start_served(*s, m.served);
  if (m.path == engram::Path::kGet) engram::start_gets(*s);
  s->indices = nullptr;  // the caller's: the hooks need only the plan
  return EngramFetch(std::move(s));
}

EngramFetch::EngramFetch(std::shared_ptr<engram::FetchState> s) : state_(std::move(s)) {}
EngramFetch::EngramFetch(EngramFetch&&) noexcept = default;
EngramFetch& EngramFetch::operator=(EngramFetch&&) noexcept = default;
EngramFetch::~EngramFetch() = default;

int EngramFetch::num_layers() const noexcept { return state_ ? static_cast<int>(state_->done.size()) : 0; }

EngramFetchStats EngramFetch::stats() const { return state_ ? state_->stats : EngramFetchStats{}; }

EngramLayer EngramFetch::layer(int l) {
  if (!state_) throw Error(ErrorCode::kBadHandle, "engram hook: an empty fetch");
  engram::FetchState& s = *state_;
  const int me = s.core.rank;
  if (s.stale())
    throw Error(ErrorCode::kBadHandle, r_of(me) + ": engram hook " + std::to_string(l) +
                                           ": this fetch is stale (a later fetch, write, set_config or destroy "
                                           "reused its outputs)", me);
  if (l < 0 || l >= num_layers())
    throw Error(ErrorCode::kInvalidArgument, r_of(me) + ": engram hook: layer " + std::to_string(l) +
                                                 " is outside 0.." + std::to_string(num_layers() - 1), me);
  const engram::Layout& L = *s.core.layout;
  if (!s.done[static_cast<std::size_t>(l)]) {
    engram::finish_layer(s, l);
    s.done[static_cast<std::size_t>(l)] = 1;
  }
  const std::int64_t T = s.num_tokens, E = L.per_token();
  EngramLayer r;
  r.keep = s.keep;
  r.data = TensorView(s.core.window + L.out_offset(l), L.dtype(), {T, E * L.hidden()});
  if (L.sf_packs() > 0) r.scales = TensorView(s.core.window + L.out_sf_offset(l), DType::kF32, {T, E * L.sf_packs()});
  return r;
}

}  // namespace epx
