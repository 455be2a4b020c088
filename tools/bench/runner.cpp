#include "epx/bench/runner.hpp"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <type_traits>

#include "epx/bench/progress.hpp"
#include "epx/bench/report.hpp"
#include "epx/buffer.hpp"
#include "epx/diagnose.hpp"
#include "epx/error.hpp"
#include "epx/spi/copy.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

double bench_now_us() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

std::uint64_t fnv1a64(const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

namespace {

// Rank 0's progress line (epx/bench/progress.hpp): the iteration running and the time left
// over every iteration of the run (warmup, timed, the counters-overhead blocks).
class Progress {
 public:
  Progress(bool on, int total) : line_("epx bench", total, on) {}
  void update(const char* what, int done, int of, double d_us, double c_us) {
    ++step_;
    if (line_.shown())
      line_.update(step_, fmt("%s %d/%d  rank 0: dispatch %.0f us, combine %.0f us", what, done, of, d_us, c_us));
  }
  void done() { line_.finish(); }

 private:
  ProgressLine line_;
  int step_ = 0;
};

// The memcpy reference: the same rows as the op moves (RouteCount::moved_*), row by row,
// between pre-faulted buffers: dispatch, x's row for each (token, rank) of my tokens — or,
// expanded, for each slot of my tokens (the expanded output has a row per slot); combine,
// the rows of my y — one per (token, rank) received, or, expanded, one per slot received.
// One source and one destination buffer serve every copy (dispatch reads x itself): at 4096
// tokens per-copy buffers took ~2.5 GB per rank and 8 ranks ran out of memory.
struct MemcpyRef {
  std::vector<std::int32_t> send_tokens;  // one entry per row the dispatch moves
  std::vector<std::byte> src, dst;
  std::size_t data_row = 0, scale_row = 0, y_row = 0;
  std::int64_t combine_rows = 0;

  MemcpyRef(const BenchProblem& p, const RouteCount& rc, int r) {
    const BenchRankInput& in = p.rank[static_cast<std::size_t>(r)];
    const int K = p.topk, L = p.local_experts();
    std::vector<int> seen(static_cast<std::size_t>(p.ranks), -1);
    for (std::int64_t t = 0; t < in.tokens; ++t)
      for (int k = 0; k < K; ++k) {
        const std::int64_t e = in.topk_idx[static_cast<std::size_t>(t * K + k)];
        if (e < 0) continue;
        const auto d = static_cast<std::size_t>(e / L);
        if (!rc.expanded && seen[d] == static_cast<int>(t)) continue;
        seen[d] = static_cast<int>(t);
        send_tokens.push_back(static_cast<std::int32_t>(t));
      }
    data_row = static_cast<std::size_t>(p.hidden) * (p.fp8 ? 1 : 2);
    scale_row = p.fp8 ? static_cast<std::size_t>(p.hidden / 128) * sizeof(float) : 0;
    y_row = p.y_row_bytes();
    combine_rows = rc.moved_combine_bytes(r) / static_cast<std::int64_t>(y_row);
    const std::size_t combine_bytes = static_cast<std::size_t>(combine_rows) * y_row;
    src.assign(combine_bytes, std::byte{2});  // pre-faulted
    dst.assign(std::max(send_tokens.size() * (data_row + scale_row), combine_bytes), std::byte{3});
  }

  // `copy`: std::memcpy (glibc) or epx::stream_copy (streaming stores), row by row.
  using Copy = void* (*)(void*, const void*, std::size_t);
  static void* streamed(void* d, const void* s, std::size_t n) {
    stream_copy(d, s, n);
    return d;
  }
  static void* plain(void* d, const void* s, std::size_t n) { return std::memcpy(d, s, n); }
  void dispatch(const BenchRankInput& in, Copy copy) {
    const auto* x = static_cast<const std::byte*>(in.x.data());
    const auto* s = static_cast<const std::byte*>(in.x_scales.data());
    std::byte* out = dst.data();
    for (const std::int32_t t : send_tokens) {
      copy(out, x + static_cast<std::size_t>(t) * data_row, data_row);
      out += data_row;
      if (scale_row) {
        copy(out, s + static_cast<std::size_t>(t) * scale_row, scale_row);
        out += scale_row;
      }
    }
  }
  void combine(Copy copy) {
    for (std::int64_t i = 0; i < combine_rows; ++i)
      copy(dst.data() + static_cast<std::size_t>(i) * y_row, src.data() + static_cast<std::size_t>(i) * y_row, y_row);
  }
};

}  // namespace

BufferConfig bench_buffer_config(const BenchOptions& o, const BenchProblem& p) {
  BufferConfig cfg;
  cfg.num_experts = p.experts;
  cfg.hidden = p.hidden;
  cfg.num_topk = p.topk;
  cfg.max_tokens_per_rank = p.max_tokens;
  cfg.num_workers = o.workers;
  cfg.dataplane = o.dataplane;
  cfg.ring_rows = o.ring_rows;
  cfg.output_pool_bytes = o.output_pool_bytes();
  if (o.expanded() && cfg.output_pool_bytes == -1) {
    // Auto sizes the pool for a compact output of max_recv_rows; an expanded output has a
    // row per slot (plus padding): room for the largest rank's.
    const RouteCount rc = count_routes(p, true, o.alignment);
    const std::int64_t rows = *std::max_element(rc.out_rows.begin(), rc.out_rows.end());
    cfg.output_pool_bytes = static_cast<std::int64_t>(output_block_bytes(rows, p.hidden, p.fp8 ? DType::kFP8E4M3 : DType::kBF16));
  }
  return cfg;
}

namespace {

// One rank's bench: the timed dispatch/combine loop, the interleaved memcpy and streaming
// copy reference, the counters comparison blocks; fills the rank's record.
class RankBench {
 public:
  RankBench(Transport& t, const BenchProblem& p, const RouteCount& rc, const BenchOptions& o)
      : t_(t), p_(p), o_(o), r_(t.rank()), in_(p.rank[static_cast<std::size_t>(r_)]), cfg_(bench_buffer_config(o, p)),
        fresh_(fresh_args()), ref_(p, rc, r_), progress_(o.progress && r_ == 0, o.warmup + o.iters + 2 * o.overhead_iters) {
    rec_.rank = r_;
    rec_.pid = static_cast<std::int64_t>(getpid());
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) rec_.node = host;
  }

  BenchRankRecord run() {
    comparison_block(0);
    timed_loop();
    comparison_block(1);
    progress_.done();
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) == 0) rec_.peak_rss_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
    return std::move(rec_);
  }

 private:
  // The memcpy reference, right after each epx iteration, in the same processes.
  // The streaming-store copy of the same bytes right after each memcpy: the limit the
  // report compares with is the faster of the two.
  struct MemcpyTimes {
    double d0, d_us, c0, c_us, sd_us, sc_us;
  };

  DispatchArgs fresh_args() const {
    DispatchArgs a;
    a.x = in_.x.view();
    if (p_.fp8) a.x_scales = in_.x_scales.view();
    a.topk_idx = TensorView(in_.topk_idx.data(), DType::kI64, {in_.tokens, p_.topk});
    a.topk_weights = TensorView(in_.topk_weights.data(), DType::kF32, {in_.tokens, p_.topk});
    a.layout = o_.expanded() ? RecvLayout::kExpanded : RecvLayout::kCompact;
    a.expert_alignment = o_.alignment;
    a.zero_padding = true;  // the hashes compare padding rows too
    a.recv_in_window = o_.zero_copy;
    return a;
  }

  void record_call(Buffer& buf, BenchCall& call, double t0, double t1) {
    call.start_us = t0;
    call.lat_us = t1 - t0;
    call.workers = buf.last_stats().workers;
    call.data_first = buf.last_stats().data_first;
  }

  // One dispatch + combine on `buf`; returns the two latencies; records into dr/cr if given.
  std::pair<double, double> round(Buffer& buf, BenchCall* dr, BenchCall* cr, bool hash) {
    DispatchArgs a = fresh_;
    if (o_.cached) a.handle = &cached_handle_;
    t_.barrier("bench: dispatch");
    const double t0 = bench_now_us();
    DispatchResult d = buf.dispatch(a);
    const double t1 = bench_now_us();
    if (dr) {
      record_call(buf, *dr, t0, t1);
      const OutputKind kind = buf.last_stats().output;
      ++(kind == OutputKind::kOneCopy ? rec_.one_copy_calls : kind == OutputKind::kView ? rec_.view_calls : rec_.copy_calls);
      if (kind == OutputKind::kCopy) rec_.copy_why = buf.last_stats().output_why;
    }
    if (!buf.last_stats().workers.empty()) rec_.workers = static_cast<int>(buf.last_stats().workers.size());
    rec_.window_bytes = buf.window_bytes();
    rec_.out_rows = d.recv_x.shape()[0];
    CombineArgs c;
    if (p_.fp8) {
      // The experts' bf16 output, written where the window holds it (Buffer::combine_buffer):
      // combine reads it in place as it reads a bf16 y over recv_x. Its values do not matter
      // (zeros, written outside the timed calls, as an expert would write them).
      y_fp8_ = buf.combine_buffer(d.handle);
      if (y_fp8_.nbytes() > 0) std::memset(y_fp8_.data(), 0, y_fp8_.nbytes());
      c.y = y_fp8_.view();
    } else {
      c.y = d.recv_x.view();  // the identity expert
    }
    c.handle = &d.handle;
    c.weighted = o_.weighted;
    t_.barrier("bench: combine");
    const double t2 = bench_now_us();
    const CombineResult out = buf.combine(c);
    const double t3 = bench_now_us();
    if (cr) record_call(buf, *cr, t2, t3);
    if (hash) {
      rec_.hashed = true;
      rec_.dispatch_hash = fnv1a64(d.recv_x.data(), d.recv_x.nbytes());
      rec_.combine_hash = fnv1a64(out.combined_x.data(), out.combined_x.nbytes());
    }
    return {t1 - t0, t3 - t2};
  }

  // `on`: the setting the counters-overhead blocks compare (--overhead-of) is on.
  std::unique_ptr<Buffer> make_buffer(bool on) {
    BufferConfig c = cfg_;
    const bool waits = o_.overhead_of == "waits";
    c.collect_stats = waits ? o_.counters : on;
    c.record_waits = waits ? on : true;
    auto buf = std::make_unique<Buffer>(t_, c);
    if (o_.cached) cached_handle_ = buf->dispatch(fresh_).handle;
    return buf;
  }

  MemcpyTimes memcpy_round() {
    MemcpyTimes m{};
    t_.barrier("bench: memcpy dispatch");
    m.d0 = bench_now_us();
    ref_.dispatch(in_, MemcpyRef::plain);
    m.d_us = bench_now_us() - m.d0;
    t_.barrier("bench: streaming copy dispatch");
    double s0 = bench_now_us();
    ref_.dispatch(in_, MemcpyRef::streamed);
    m.sd_us = bench_now_us() - s0;
    t_.barrier("bench: memcpy combine");
    m.c0 = bench_now_us();
    ref_.combine(MemcpyRef::plain);
    m.c_us = bench_now_us() - m.c0;
    t_.barrier("bench: streaming copy combine");
    s0 = bench_now_us();
    ref_.combine(MemcpyRef::streamed);
    m.sc_us = bench_now_us() - s0;
    return m;
  }

  // Counters off vs on, in the same run with the same iteration structure: a block of
  // iterations with the other setting before the timed loop and one after it (a fresh
  // Buffer each: a transport holds one window), so a linear drift of the machine cancels.
  void comparison_block(int block) {
    if (o_.overhead_iters <= 0 || interleaved()) return;
    const bool other_mode = !o_.overhead_main_on();
    auto& other_d = other_mode ? rec_.on_dispatch_us : rec_.off_dispatch_us;
    auto& other_c = other_mode ? rec_.on_combine_us : rec_.off_combine_us;
    const std::string other_label = o_.overhead_of + (other_mode ? " on" : " off") + " comparison";
    std::unique_ptr<Buffer> buf = make_buffer(other_mode);
    round(*buf, nullptr, nullptr, false);  // warm the new window
    memcpy_round();
    for (int it = 0; it < o_.overhead_iters; ++it) {
      const auto [d_us, c_us] = round(*buf, nullptr, nullptr, false);
      memcpy_round();
      other_d.push_back(d_us);
      other_c.push_back(c_us);
      progress_.update(other_label.c_str(), block * o_.overhead_iters + it + 1, 2 * o_.overhead_iters, d_us, c_us);
    }
  }

  // --overhead-of waits: the waits-off Buffer runs next to each timed iteration (after it,
  // then before the next: neither always goes first), on the same transport (its own
  // endpoint), so that the machine's drift cancels pair by pair.
  bool interleaved() const noexcept { return o_.overhead_of == "waits" && o_.overhead_iters > 0; }
  void other_round(Buffer& other) {
    const auto [d_us, c_us] = round(other, nullptr, nullptr, false);
    memcpy_round();
    rec_.off_dispatch_us.push_back(d_us);
    rec_.off_combine_us.push_back(c_us);
  }

  void timed_loop() {
    const bool want_hash = o_.baseline == "mpi" && !p_.fp8;
    auto& main_d = o_.overhead_main_on() ? rec_.on_dispatch_us : rec_.off_dispatch_us;
    auto& main_c = o_.overhead_main_on() ? rec_.on_combine_us : rec_.off_combine_us;
    const int total = o_.warmup + o_.iters;
    std::unique_ptr<Buffer> buf = make_buffer(o_.overhead_main_on());
    std::unique_ptr<Buffer> other;  // --overhead-of waits: waits off, interleaved
    if (interleaved()) {
      other = make_buffer(false);
      round(*other, nullptr, nullptr, false);  // warm its window
    }
    std::optional<Diagnose> diag;  // --diagnose: on an endpoint of its own
    if (o_.diagnose) {
      diag.emplace(t_, *buf);
      if (o_.progress && r_ == 0) announce_ranks(diag->report().ranks);
    }
    int interval = 0;  // --diagnose: the timed loop's intervals ended so far
    for (int it = 0; it < total; ++it) {
      const bool timed = it >= o_.warmup;
      if (diag && it == o_.warmup) diag->exchange();  // the matrices cover the timed calls only
      BenchCall dc, cc;
      if (timed && other && it % 2 == 1) other_round(*other);  // before and after the timed call in turn
      const auto [d_us, c_us] = round(*buf, timed ? &dc : nullptr, timed ? &cc : nullptr, want_hash && it == total - 1);
      const MemcpyTimes m = memcpy_round();
      if (timed) {
        rec_.dispatch.push_back(std::move(dc));
        rec_.combine.push_back(std::move(cc));
        rec_.memcpy_dispatch_start_us.push_back(m.d0);
        rec_.memcpy_dispatch_us.push_back(m.d_us);
        rec_.memcpy_combine_start_us.push_back(m.c0);
        rec_.memcpy_combine_us.push_back(m.c_us);
        rec_.stream_dispatch_us.push_back(m.sd_us);
        rec_.stream_combine_us.push_back(m.sc_us);
        main_d.push_back(d_us);
        main_c.push_back(c_us);
      }
      if (timed && other && it % 2 == 0) other_round(*other);
      progress_.update(timed ? "iter" : "warmup", timed ? it - o_.warmup + 1 : it + 1, timed ? o_.iters : o_.warmup, d_us, c_us);
      // Interval k (1-based) ends after k * iters / K timed iterations: every rank exchanges there.
      if (diag && timed &&
          static_cast<std::int64_t>(it - o_.warmup + 1) * o_.diagnose_intervals >=
              static_cast<std::int64_t>(interval + 1) * o_.iters) {
        keep_diagnose(*diag);
        ++interval;
      }
    }
    // Private memory while the timed Buffer (and its heap output pool) still lives.
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("RssAnon:", 0) == 0) rec_.anon_rss_bytes = std::strtoull(line.c_str() + 8, nullptr, 10) * 1024;
  }

  // Where each rank runs, before the loop: what to attach a debugger or a profiler to.
  static void announce_ranks(const std::vector<RankInfo>& ranks) {
    std::string line = "epx bench: diagnose: rank pids:";
    for (const RankInfo& i : ranks) line += " " + std::to_string(i.rank) + "=" + std::to_string(i.pid) + "@" + i.node;
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }

  // One interval's exchange: its matrices (the verdicts are the report's, over all intervals).
  void keep_diagnose(Diagnose& diag) {
    diag.exchange();
    const DiagnoseReport r = diag.report();
    rec_.diagnosed = true;
    rec_.diagnose_seconds.push_back(r.seconds);
    rec_.diagnose_us.emplace_back();
    rec_.diagnose_calls.emplace_back();
    for (std::size_t op = 0; op < r.ops.size(); ++op) {
      rec_.diagnose_us.back()[op] = r.ops[op].matrix_us;
      rec_.diagnose_calls.back()[op] = r.ops[op].calls;
    }
  }

  Transport& t_;
  const BenchProblem& p_;
  const BenchOptions& o_;
  const int r_;
  const BenchRankInput& in_;
  const BufferConfig cfg_;
  const DispatchArgs fresh_;
  MemcpyRef ref_;
  Tensor y_fp8_;  // the combine input when x is fp8 (combine is bf16; its values do not matter)
  DispatchHandle cached_handle_;
  Progress progress_;
  BenchRankRecord rec_;
};

}  // namespace

void run_bench_rank(Transport& t, const BenchProblem& p, const RouteCount& rc, const BenchOptions& o,
                    const fs::path& record_dir) {
  write_bench_record(bench_record_path(record_dir, t.rank()), RankBench(t, p, rc, o).run());
}

// ---- the record file: a private binary format (same binary writes and reads it) --------

namespace {

constexpr std::uint64_t kMagic = 0x3330484342585045ULL;  // "EPXBCH03"

class Out {
 public:
  explicit Out(const fs::path& p) : f_(p, std::ios::binary | std::ios::trunc) {}
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    f_.write(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(static_cast<std::uint64_t>(v.size()));
    f_.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  }
  bool ok() { return static_cast<bool>(f_.flush()); }

 private:
  std::ofstream f_;
};

class In {
 public:
  explicit In(const fs::path& p) : path_(p), f_(p, std::ios::binary) {
    if (!f_) throw Error(ErrorCode::kIo, path_.string() + ": cannot open the rank's bench record");
  }
  template <class T>
  T pod() {
    T v{};
    read(&v, sizeof v);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const auto n = pod<std::uint64_t>();
    if (n > (std::uint64_t{1} << 32)) throw Error(ErrorCode::kIo, path_.string() + ": corrupt bench record");
    std::vector<T> v(static_cast<std::size_t>(n));
    read(v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  void read(void* p, std::size_t n) {
    if (!f_.read(static_cast<char*>(p), static_cast<std::streamsize>(n)))
      throw Error(ErrorCode::kIo, path_.string() + ": truncated bench record");
  }
  fs::path path_;
  std::ifstream f_;
};

void write_calls(Out& o, const std::vector<BenchCall>& calls) {
  o.pod(static_cast<std::uint64_t>(calls.size()));
  for (const BenchCall& c : calls) {
    o.pod(c.start_us);
    o.pod(c.lat_us);
    o.vec(c.workers);
    o.pod(c.data_first);
  }
}

std::vector<BenchCall> read_calls(In& in) {
  std::vector<BenchCall> calls(static_cast<std::size_t>(in.pod<std::uint64_t>()));
  for (BenchCall& c : calls) {
    c.start_us = in.pod<double>();
    c.lat_us = in.pod<double>();
    c.workers = in.vec<WorkerStats>();
    c.data_first = in.pod<bool>();
  }
  return calls;
}

}  // namespace

fs::path bench_record_path(const fs::path& record_dir, int rank) {
  return record_dir / ("rank" + std::to_string(rank) + ".bin");
}

void write_bench_record(const fs::path& path, const BenchRankRecord& r) {
  const fs::path tmp = path.string() + ".tmp";
  {
    Out o(tmp);
    o.pod(kMagic);
    o.pod(r.rank);
    o.pod(r.workers);
    o.pod(r.window_bytes);
    write_calls(o, r.dispatch);
    write_calls(o, r.combine);
    for (const auto* v : {&r.memcpy_dispatch_start_us, &r.memcpy_dispatch_us, &r.memcpy_combine_start_us,
                          &r.memcpy_combine_us, &r.stream_dispatch_us, &r.stream_combine_us, &r.off_dispatch_us,
                          &r.off_combine_us, &r.on_dispatch_us, &r.on_combine_us})
      o.vec(*v);
    o.pod(r.out_rows);
    o.pod(r.hashed);
    o.pod(r.dispatch_hash);
    o.pod(r.combine_hash);
    o.pod(r.one_copy_calls);
    o.pod(r.copy_calls);
    o.pod(r.view_calls);
    o.vec(std::vector<char>(r.copy_why.begin(), r.copy_why.end()));
    o.pod(r.peak_rss_bytes);
    o.pod(r.anon_rss_bytes);
    o.pod(r.pid);
    o.vec(std::vector<char>(r.node.begin(), r.node.end()));
    o.pod(r.diagnosed);
    o.vec(r.diagnose_seconds);
    for (std::size_t k = 0; k < r.diagnose_seconds.size(); ++k)
      for (std::size_t op = 0; op < static_cast<std::size_t>(kNumWaitOps); ++op) {
        o.vec(r.diagnose_us[k][op]);
        o.vec(r.diagnose_calls[k][op]);
      }
    if (!o.ok()) throw Error(ErrorCode::kIo, tmp.string() + ": cannot write the rank's bench record", r.rank);
  }
  fs::rename(tmp, path);
}

BenchRankRecord read_bench_record(const fs::path& path) {
  In in(path);
  if (in.pod<std::uint64_t>() != kMagic) throw Error(ErrorCode::kIo, path.string() + ": not a bench record");
  BenchRankRecord r;
  r.rank = in.pod<int>();
  r.workers = in.pod<int>();
  r.window_bytes = in.pod<std::uint64_t>();
  r.dispatch = read_calls(in);
  r.combine = read_calls(in);
  for (auto* v : {&r.memcpy_dispatch_start_us, &r.memcpy_dispatch_us, &r.memcpy_combine_start_us, &r.memcpy_combine_us,
                  &r.stream_dispatch_us, &r.stream_combine_us, &r.off_dispatch_us, &r.off_combine_us, &r.on_dispatch_us, &r.on_combine_us})
    *v = in.vec<double>();
  r.out_rows = in.pod<std::int64_t>();
  r.hashed = in.pod<bool>();
  r.dispatch_hash = in.pod<std::uint64_t>();
  r.combine_hash = in.pod<std::uint64_t>();
  r.one_copy_calls = in.pod<std::uint64_t>();
  r.copy_calls = in.pod<std::uint64_t>();
  r.view_calls = in.pod<std::uint64_t>();
  const std::vector<char> why = in.vec<char>();
  r.copy_why.assign(why.begin(), why.end());
  r.peak_rss_bytes = in.pod<std::uint64_t>();
  r.anon_rss_bytes = in.pod<std::uint64_t>();
  r.pid = in.pod<std::int64_t>();
  const std::vector<char> node = in.vec<char>();
  r.node.assign(node.begin(), node.end());
  r.diagnosed = in.pod<bool>();
  r.diagnose_seconds = in.vec<double>();
  r.diagnose_us.resize(r.diagnose_seconds.size());
  r.diagnose_calls.resize(r.diagnose_seconds.size());
  for (std::size_t k = 0; k < r.diagnose_seconds.size(); ++k)
    for (std::size_t op = 0; op < static_cast<std::size_t>(kNumWaitOps); ++op) {
      r.diagnose_us[k][op] = in.vec<double>();
      r.diagnose_calls[k][op] = in.vec<std::uint64_t>();
    }
  return r;
}

}  // namespace epx::tools
