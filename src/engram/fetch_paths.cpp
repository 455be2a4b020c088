#include "fetch_paths.hpp"

#include <cstring>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/wait.hpp"

namespace epx::engram {

namespace {

constexpr int kPrefetchRows = 16;  // rows read ahead of the copy (random rows miss every cache)
/// A layer's output of at least this many bytes is written with streaming stores (it does not
/// fit the cache: reading its lines before overwriting them would cost a third of the traffic).
constexpr std::size_t kStreamOutputBytes = std::size_t{1} << 20;

const std::int32_t* layer_indices(const FetchState& s, int l) {
  const Layout& L = *s.core.layout;
  return s.indices + static_cast<std::size_t>(l) * static_cast<std::size_t>(s.num_tokens * L.per_token());
}

std::size_t layer_rows(const FetchState& s) {
  return static_cast<std::size_t>(s.num_tokens * s.core.layout->per_token());
}

/// The row's first line: the hardware prefetchers fetch the rest once it is touched
/// (prefetching every line of a row ahead fills the line-fill buffers and stalls the copy).
void prefetch_row(const std::byte* p) { __builtin_prefetch(p, 0, 3); }

}  // namespace

void plan_rows(FetchState& s) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  const int P = L.num_ranks();
  s.bases.assign(static_cast<std::size_t>(P), nullptr);
  for (int p = 0; p < P; ++p)
    if (p == c.rank) s.bases[static_cast<std::size_t>(p)] = c.window;
    else if (c.path == Path::kMapped) s.bases[static_cast<std::size_t>(p)] = c.endpoint->peer_window(p);
  EngramFetchStats& st = s.stats;
  st.path = to_string(c.path);
  const std::size_t n = layer_rows(s), sb = L.sf_row_bytes();
  s.src.assign(static_cast<std::size_t>(L.num_layers()) * n, nullptr);
  s.src_sf.assign(sb ? s.src.size() : 0, nullptr);
  for (int l = 0; l < L.num_layers(); ++l) {
    const std::int32_t* idx = layer_indices(s, l);
    const auto N = static_cast<std::uint32_t>(L.entries(l));  // P * N_l fits int32 (the indices do)
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = static_cast<std::size_t>(l) * n + i;
      st.rows += 1;
      if (idx[i] < 0) {
        st.rows_padding += 1;
        s.src[k] = c.zero_row;
        if (sb) s.src_sf[k] = c.zero_sf;
        continue;
      }
      const std::uint32_t g = static_cast<std::uint32_t>(idx[i]), owner = g / N, row = g % N;
      if (static_cast<int>(owner) == c.rank) st.rows_local += 1;
      else if (c.path == Path::kMapped) st.rows_mapped += 1;
      else if (c.path == Path::kGet) st.rows_get += 1;
      else st.rows_served += 1;
      const std::byte* base = s.bases[owner];
      if (base == nullptr) continue;  // moved by another path
      s.src[k] = base + L.row_offset(c.num_bytes, l, row);
      if (sb) s.src_sf[k] = base + L.sf_offset(c.num_bytes, l, row);
    }
  }
  st.bytes = static_cast<std::uint64_t>(st.rows - st.rows_padding) * (L.row_bytes() + sb);
}

namespace {

/// Copies layer l's rows whose owner's window is readable here (plan_rows found where they
/// lie, and the zero row for -1), reading kPrefetchRows rows ahead.
void copy_readable_rows(FetchState& s, int l) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  const std::size_t rb = L.row_bytes(), sb = L.sf_row_bytes(), n = layer_rows(s);
  const std::byte* const* src = s.src.data() + static_cast<std::size_t>(l) * n;
  const std::byte* const* src_sf = sb ? s.src_sf.data() + static_cast<std::size_t>(l) * n : nullptr;
  std::byte* out = c.window + L.out_offset(l);
  std::byte* out_sf = c.window + L.out_sf_offset(l);
  if (n * rb >= kStreamOutputBytes) {
    stream_copy_rows(out, reinterpret_cast<const void* const*>(src), n, rb);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kPrefetchRows < n && src[i + kPrefetchRows]) prefetch_row(src[i + kPrefetchRows]);
      if (src[i] != nullptr) std::memcpy(out + i * rb, src[i], rb);  // null: moved by the served path
    }
  }
  if (sb)
    for (std::size_t i = 0; i < n; ++i)
      if (src_sf[i] != nullptr) std::memcpy(out_sf + i * sb, src_sf[i], sb);
}

/// Waits for every remote owner's replies of layer l and moves them to their places.
void scatter_replies(FetchState& s, int l) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  for (int p = 0; p < L.num_ranks(); ++p)
    if (p != c.rank)
      spi::await_signal(*c.endpoint, L.reply_signal(p), s.reply_target[static_cast<std::size_t>(l)],
                        {"engram fetch (waiting for a layer's rows)", p}, c.yield);
  const std::size_t rb = L.row_bytes(), sb = L.sf_row_bytes();
  std::byte* out = c.window + L.out_offset(l);
  std::byte* out_sf = c.window + L.out_sf_offset(l);
  const auto& pos = s.served_pos[static_cast<std::size_t>(l)];
  const std::size_t base = s.reply_base[static_cast<std::size_t>(l)];
  for (std::size_t k = 0; k < pos.size(); ++k) {
    const auto i = static_cast<std::size_t>(pos[k]);
    std::memcpy(out + i * rb, c.window + L.reply_offset(base + k), rb);
    if (sb) std::memcpy(out_sf + i * sb, c.window + L.reply_sf_offset(base + k), sb);
  }
}

}  // namespace

void start_gets(FetchState& s) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  const std::size_t rb = L.row_bytes(), sb = L.sf_row_bytes(), n = layer_rows(s);
  bool any = false;
  for (int l = 0; l < L.num_layers(); ++l) {
    const std::int32_t* idx = layer_indices(s, l);
    const auto N = static_cast<std::uint32_t>(L.entries(l));
    std::byte* out = c.window + L.out_offset(l);
    std::byte* out_sf = c.window + L.out_sf_offset(l);
    for (std::size_t i = 0; i < n; ++i) {
      if (idx[i] < 0) continue;
      const std::uint32_t g = static_cast<std::uint32_t>(idx[i]), owner = g / N, row = g % N;
      if (static_cast<int>(owner) == c.rank) continue;
      c.endpoint->get(static_cast<int>(owner), L.row_offset(c.num_bytes, l, row), out + i * rb, rb, 0);
      if (sb) c.endpoint->get(static_cast<int>(owner), L.sf_offset(c.num_bytes, l, row), out_sf + i * sb, sb, 0);
      any = true;
    }
  }
  if (any) *s.gets_pending = true;
}

void finish_layer(FetchState& s, int l) {
  if (s.core.path == Path::kGet && *s.gets_pending) {
    s.core.endpoint->quiet(0);
    *s.gets_pending = false;
  }
  copy_readable_rows(s, l);
  if (s.core.path == Path::kServed) scatter_replies(s, l);
}

namespace {

/// This rank's requests, one block per owner (layout.hpp's RequestHeader, then per layer
/// count and reply base, then the local rows), and where each served row goes.
void build_requests(FetchState& s, ServedState& st) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  const int P = L.num_ranks(), NL = L.num_layers();
  const std::size_t meta = Layout::request_meta_bytes(NL), n = layer_rows(s);
  st.requests.resize(static_cast<std::size_t>(P));
  std::vector<std::vector<std::int32_t>> rows(static_cast<std::size_t>(P));
  std::vector<std::uint32_t> counts(static_cast<std::size_t>(P) * static_cast<std::size_t>(NL));
  s.served_pos.assign(static_cast<std::size_t>(NL), {});
  s.reply_base.assign(static_cast<std::size_t>(NL), 0);
  std::size_t next_reply = 0;
  for (int l = 0; l < NL; ++l) {
    const std::int32_t* idx = layer_indices(s, l);
    const std::int64_t N = L.entries(l);
    s.reply_base[static_cast<std::size_t>(l)] = next_reply;
    for (int p = 0; p < P; ++p) {
      if (p == c.rank) continue;
      for (std::size_t i = 0; i < n; ++i)
        if (idx[i] >= 0 && idx[i] / N == p) {
          rows[static_cast<std::size_t>(p)].push_back(static_cast<std::int32_t>(idx[i] % N));
          s.served_pos[static_cast<std::size_t>(l)].push_back(static_cast<std::int32_t>(i));
          counts[static_cast<std::size_t>(p * NL + l)] += 1;
        }
    }
    next_reply += s.served_pos[static_cast<std::size_t>(l)].size();
  }
  for (int p = 0; p < P; ++p) {
    if (p == c.rank) continue;
    auto& b = st.requests[static_cast<std::size_t>(p)];
    const auto& r = rows[static_cast<std::size_t>(p)];
    b.assign(meta + r.size() * 4, std::byte{0});
    RequestHeader h{st.fetches + 1, static_cast<std::uint32_t>(NL), 0};
    std::memcpy(b.data(), &h, sizeof h);
    for (int l = 0; l < NL; ++l) {
      // this owner's replies of layer l follow those of the lower owners
      std::uint32_t before = 0;
      for (int q = 0; q < p; ++q) before += counts[static_cast<std::size_t>(q * NL + l)];
      const std::uint32_t pair[2] = {counts[static_cast<std::size_t>(p * NL + l)],
                                     static_cast<std::uint32_t>(s.reply_base[static_cast<std::size_t>(l)] + before)};
      std::memcpy(b.data() + sizeof h + 8 * static_cast<std::size_t>(l), pair, 8);
    }
    if (!r.empty()) std::memcpy(b.data() + meta, r.data(), r.size() * 4);
  }
}

/// Layer l's request of one requester: how many rows, where its replies go.
struct LayerAsk {
  std::uint32_t count, reply_base;
};
static_assert(sizeof(LayerAsk) == 8);  // as build_requests writes them

/// Serves requester q's block of this fetch: the rows it asked for, layer by layer, into its
/// reply rows, each layer's signal after its rows (staged in st.replies[q], kept until the
/// quiet after every requester was served).
void serve(FetchState& s, ServedState& st, int q) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  Transport& t = *c.endpoint;
  const std::uint64_t fetch = st.fetches + 1;
  spi::await_signal(t, Layout::request_signal(q), fetch, {"engram fetch (waiting for a rank's requests)", q}, c.yield);
  const std::byte* block = c.window + L.request_offset(q);
  RequestHeader h;
  std::memcpy(&h, block, sizeof h);
  if (h.fetch != fetch || static_cast<int>(h.num_layers) != L.num_layers())
    throw Error(ErrorCode::kInternal, "rank " + std::to_string(c.rank) + ": engram.fetch: rank " + std::to_string(q) +
                                          "'s requests are of fetch " + std::to_string(h.fetch) + ", expected " +
                                          std::to_string(fetch), c.rank);
  std::vector<LayerAsk> asks(static_cast<std::size_t>(L.num_layers()));
  std::memcpy(asks.data(), block + sizeof h, 8 * asks.size());
  const std::size_t rb = L.row_bytes(), sb = L.sf_row_bytes();
  std::size_t total = 0;
  for (const LayerAsk& a : asks) total += a.count;
  auto& staging = st.replies[static_cast<std::size_t>(q)];
  staging.resize(total * (rb + sb));
  const std::byte* rows = block + Layout::request_meta_bytes(L.num_layers());
  std::byte* at = staging.data();
  for (int l = 0; l < L.num_layers(); ++l) {
    const std::size_t count = asks[static_cast<std::size_t>(l)].count;
    for (std::size_t k = 0; k < count; ++k) {
      std::int32_t r;
      std::memcpy(&r, rows + 4 * k, 4);
      std::memcpy(at + k * rb, c.window + L.row_offset(c.num_bytes, l, r), rb);
      if (sb) std::memcpy(at + count * rb + k * sb, c.window + L.sf_offset(c.num_bytes, l, r), sb);
    }
    rows += 4 * count;
    if (count > 0) {
      t.put(q, L.reply_offset(asks[static_cast<std::size_t>(l)].reply_base), at, count * rb, 0);
      if (sb) t.put(q, L.reply_sf_offset(asks[static_cast<std::size_t>(l)].reply_base), at + count * rb, count * sb, 0);
    }
    if (c.served_protocol == Protocol::kExplicit) t.quiet(0);
    t.signal(q, L.reply_signal(c.rank), st.layers + static_cast<std::uint64_t>(l) + 1, 0);
    at += count * (rb + sb);
  }
}

}  // namespace

void start_served(FetchState& s, ServedState& st) {
  const Core& c = s.core;
  const Layout& L = *c.layout;
  Transport& t = *c.endpoint;
  const int P = L.num_ranks();
  for (int p = 0; p < P; ++p)  // the previous fetch's requests and replies are done with
    if (p != c.rank)
      spi::await_signal(t, L.reply_signal(p), st.layers, {"engram fetch (the previous fetch's rows)", p}, c.yield);
  build_requests(s, st);
  for (int p = 0; p < P; ++p) {
    if (p == c.rank) continue;
    const auto& b = st.requests[static_cast<std::size_t>(p)];
    t.put(p, L.request_offset(c.rank), b.data(), b.size(), 0);
    if (c.served_protocol == Protocol::kExplicit) t.quiet(0);
    t.signal(p, Layout::request_signal(c.rank), st.fetches + 1, 0);
  }
  t.quiet(0);
  st.replies.resize(static_cast<std::size_t>(P));
  for (int k = 1; k < P; ++k) serve(s, st, (c.rank + k) % P);
  t.quiet(0);  // the replies' staging may be reused from here on
  s.reply_target.resize(static_cast<std::size_t>(L.num_layers()));
  for (int l = 0; l < L.num_layers(); ++l)
    s.reply_target[static_cast<std::size_t>(l)] = st.layers + static_cast<std::uint64_t>(l) + 1;
  st.fetches += 1;
  st.layers += static_cast<std::uint64_t>(L.num_layers());
}

}  // namespace epx::engram
