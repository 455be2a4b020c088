// `epx replay`: one dispatch and one combine over P ranks on this machine, from .npy
// inputs to .npy outputs (docs/spec.md §7), with the fixed expert function in between.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "dataplane_cli.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/shmem.hpp"
#include "epx/spi/janitor.hpp"
#include "epx/bench/options.hpp"
#include "epx/bench/launched_job.hpp"
#include "epx/io/replay.hpp"
#include "epx/io/tensor_io.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

struct ReplayOptions {
  std::string in, out;
  std::string layout = "compact";
  int alignment = 1;
  std::int64_t worst = 0;
  bool deterministic = false, zero_padding = false, weighted = false;
  std::string transport = "shm";
  int workers = 0;
  std::int64_t ring_rows = 0;  ///< bounded receive area (BufferConfig::ring_rows)
  std::int64_t timeout_ms = 60000;
  DataPlaneOptions dataplane;  ///< --topology, --schedule, ... (results are the same for every choice)
};

std::string rank_dir(int r) { return "rank" + std::to_string(r); }

// Reads IN/rank<r>/<name>, naming the rank in any error.
NpyArray read_rank_file(const fs::path& dir, int r, const std::string& name) {
  try {
    return read_npy(dir / rank_dir(r) / name);
  } catch (const Error& e) {
    throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what(), r);
  }
}

// The Buffer of a replay: meta.json's shape, the options' workers and data plane.
BufferConfig replay_config(const ReplayMeta& meta, const ReplayOptions& o) {
  BufferConfig cfg;
  cfg.num_experts = meta.num_experts;
  cfg.hidden = meta.hidden;
  cfg.num_topk = meta.num_topk;
  cfg.max_tokens_per_rank = meta.max_tokens_per_rank;
  cfg.num_workers = o.workers;
  cfg.dataplane = o.dataplane;
  cfg.ring_rows = o.ring_rows;
  return cfg;
}

// The dispatch's outputs in rank r's staging directory (docs/spec.md §7's names).
void write_dispatch_outputs(const fs::path& dir, const DispatchResult& d, RecvLayout layout, bool fp8) {
  fs::create_directories(dir);
  auto widen = [](const std::vector<std::int32_t>& v) { return std::vector<std::int64_t>(v.begin(), v.end()); };
  write_i64(dir / "num_tokens_per_rank.npy", widen(d.layout.num_tokens_per_rank));
  write_i64(dir / "num_tokens_per_expert.npy", widen(d.layout.num_tokens_per_expert));
  write_tensor(dir / "is_token_in_rank.npy", d.layout.is_token_in_rank);
  write_tensor(dir / (fp8 ? "recv_x_fp8.npy" : "recv_x.npy"), d.recv_x);
  if (fp8) write_tensor(dir / "recv_x_scales.npy", d.recv_x_scales);
  write_tensor(dir / "recv_src.npy", d.recv_src);
  write_i64(dir / "num_recv_tokens_per_expert.npy", d.num_recv_tokens_per_expert);
  if (layout == RecvLayout::kCompact) {
    write_tensor(dir / "recv_topk_idx.npy", d.recv_topk_idx);
    write_tensor(dir / "recv_topk_weights.npy", d.recv_topk_weights);
  } else {
    write_tensor(dir / "recv_weights.npy", d.recv_weights);
    write_i64(dir / "expert_offsets.npy", d.expert_offsets);
  }

}

// The rank's part of a replay: load, dispatch, write, expert, combine, write.
void replay_rank(Transport& t, const ReplayMeta& meta, const ReplayOptions& o, const fs::path& staging) {
  const int r = t.rank();
  const fs::path in(o.in);
  const NpyArray idx = read_rank_file(in, r, "topk_idx.npy");
  const NpyArray wts = read_rank_file(in, r, "topk_weights.npy");
  const bool fp8 = fs::exists(in / rank_dir(r) / "x_fp8.npy");
  const NpyArray x = read_rank_file(in, r, fp8 ? "x_fp8.npy" : "x.npy");
  NpyArray scales;
  if (fp8) scales = read_rank_file(in, r, "x_scales.npy");
  auto view = [&](const NpyArray& a, const char* what) {
    try {
      return view_npy(a, what);
    } catch (const Error& e) {
      throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what(), r);
    }
  };

  Buffer buffer(t, replay_config(meta, o));

  DispatchArgs args;
  args.x = view(x, fp8 ? "x_fp8.npy" : "x.npy");
  if (fp8) args.x_scales = view(scales, "x_scales.npy");
  args.topk_idx = view(idx, "topk_idx.npy");
  args.topk_weights = view(wts, "topk_weights.npy");
  args.layout = o.layout == "expanded" ? RecvLayout::kExpanded : RecvLayout::kCompact;
  args.expert_alignment = o.alignment;
  args.num_worst_tokens = o.worst;
  args.deterministic = o.deterministic;
  args.zero_padding = o.zero_padding;
  DispatchResult d = buffer.dispatch(args);

  const fs::path dir = staging / rank_dir(r);
  write_dispatch_outputs(dir, d, args.layout, fp8);

  const Tensor y = replay_expert(d, args.layout, meta.hidden, meta.num_topk);
  CombineArgs c;
  c.y = y.view();
  c.handle = &d.handle;
  c.weighted = o.weighted;
  const CombineResult out = buffer.combine(c);
  write_tensor(dir / "combined_x.npy", out.combined_x);
}

// Every file `epx replay` writes into OUT/rank<r>/ (docs/spec.md §7): an old OUT/rank<r> holding
// anything else was not made by epx and is never replaced or removed.
const char* const kReplayOutputs[] = {
    "num_tokens_per_rank.npy", "num_tokens_per_expert.npy", "is_token_in_rank.npy", "recv_x.npy",
    "recv_x_fp8.npy",          "recv_x_scales.npy",         "recv_src.npy",         "num_recv_tokens_per_expert.npy",
    "recv_topk_idx.npy",       "recv_topk_weights.npy",     "recv_weights.npy",     "expert_offsets.npy",
    "combined_x.npy"};

bool is_replay_output(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(dir, ec))) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) return false;
    const std::string name = e.path().filename().string();
    if (std::find(std::begin(kReplayOutputs), std::end(kReplayOutputs), name) == std::end(kReplayOutputs)) return false;
  }
  return !ec;
}

// IN and OUT must not overlap: OUT/rank<r> would be IN/rank<r> (or inside IN), and a failed
// run's cleanup would remove the inputs.
void check_in_out(const fs::path& in, const fs::path& out) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(fs::absolute(in), ec);
  const fs::path b = fs::weakly_canonical(fs::absolute(out), ec);
  auto within = [](const fs::path& inner, const fs::path& outer) {
    auto i = inner.begin(), o = outer.begin();
    for (; o != outer.end() && !o->empty(); ++i, ++o)
      if (i == inner.end() || *i != *o) return false;
    return true;
  };
  if (within(a, b) || within(b, a))
    throw Error(ErrorCode::kInvalidArgument, "--in " + in.string() + " and --out " + out.string() +
                                                 " overlap (one is, or is inside, the other): OUT/rank<r> would replace or "
                                                 "remove the inputs; give an output directory apart from the inputs");
}

// The options that depend on nothing else (either launcher).
void check_replay_options(const ReplayOptions& o) {
  if (o.layout != "compact" && o.layout != "expanded")
    throw Error(ErrorCode::kInvalidArgument, "--layout must be 'compact' or 'expanded', got '" + o.layout + "'");
  if (o.worst < 0) throw Error(ErrorCode::kInvalidArgument, "--worst must be >= 0 (0 = off), got " + std::to_string(o.worst));
}

// An old OUT/rank<r> that epx replay did not write is never replaced.
void check_old_output(const fs::path& out, int r) {
  const fs::path old = out / rank_dir(r);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(old, ec)) && !is_replay_output(old))
    throw Error(ErrorCode::kInvalidArgument, old.string() +
                                                 " exists and holds something epx replay does not write; refusing to "
                                                 "replace it (remove it or choose another --out)");
}

// OUT/rank<r> := the staged results of rank r (an earlier epx replay output is replaced).
void publish_rank(const fs::path& staging, const fs::path& out, int r) {
  if (is_replay_output(out / rank_dir(r))) fs::remove_all(out / rank_dir(r));
  fs::rename(staging / rank_dir(r), out / rank_dir(r));
}

void run_replay_shmem(const ReplayOptions& o);

void run_replay(const ReplayOptions& o) {
  if (o.transport == "shmem") return run_replay_shmem(o);
  const fs::path in(o.in), out(o.out);
  check_in_out(in, out);
  const ReplayMeta meta = read_replay_meta(in);
  check_replay_options(o);
  LaunchOptions lo;
  lo.transport = parse_transport_kind(o.transport);
  lo.timeout = checked_timeout(o.timeout_ms);
  check_ranks(meta.num_ranks, o.transport, (in / "meta.json").string());
  check_workers(o.workers, meta.num_ranks, "epx replay");
  check_dataplane(o.dataplane, meta.num_ranks);
  // Sizes against the inputs first (every header against meta.json), then the memory.
  const std::vector<std::int64_t> tokens = check_replay_inputs(in, meta, false);
  check_footprint("epx replay: ",
                  rank_footprint(meta.num_ranks, meta.hidden, meta.num_topk,
                                 *std::max_element(tokens.begin(), tokens.end()), meta.max_tokens_per_rank, o.worst,
                                 -1),  // replay's Buffers have the default output pool
                  meta.num_ranks, lo.transport == TransportKind::kShm);
  lo.num_ranks = meta.num_ranks;
  for (int r = 0; r < meta.num_ranks; ++r) check_old_output(out, r);

  // Results appear as OUT/rank<r> only when every rank succeeded; a failed run leaves no
  // OUT/rank<r> (an earlier run's results, which epx wrote, are removed) that could pass for
  // its result. Only the staging directory this run created and epx's own outputs are removed.
  fs::create_directories(out);
  const fs::path staging = out / (".epx-replay-" + std::to_string(getpid()));
  {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(staging, ec)))
      throw Error(ErrorCode::kIo, staging.string() + " already exists; refusing to use it as this run's staging directory");
  }
  fs::create_directory(staging);
  detail::remove_at_exit(fs::absolute(staging).string());
  auto drop_results = [&] {
    std::error_code ec;
    fs::remove_all(staging, ec);
    for (int r = 0; r < meta.num_ranks; ++r)
      if (is_replay_output(out / rank_dir(r))) fs::remove_all(out / rank_dir(r), ec);
  };
  try {
    launch(lo, [&](Transport& t) { replay_rank(t, meta, o, staging); });
  } catch (...) {
    drop_results();
    throw;
  }
  for (int r = 0; r < meta.num_ranks; ++r) publish_rank(staging, out, r);
  fs::remove_all(staging);
  std::printf("epx replay: %d ranks (%s), %s layout, %s; wrote %s/rank0..rank%d\n", meta.num_ranks, o.transport.c_str(),
              o.layout.c_str(), describe_dataplane(o.dataplane).c_str(), o.out.c_str(), meta.num_ranks - 1);
}

// C defaults to the largest S_r (when meta.json does not give it); every rank's x is of one
// kind (bf16 or FP8), else kDtypeMismatch naming the rank. Collective.
void agree_on_tokens_and_dtype(Bootstrap& boot, ReplayMeta& meta, bool c_given, std::int64_t S, bool fp8) {
  const int P = boot.size();
  const auto facts = allgather_strings(boot, std::to_string(S) + (fp8 ? " fp8" : " bf16"));
  for (int r = 0; r < P; ++r) {
    const std::string& f = facts[static_cast<std::size_t>(r)];
    if (!c_given) meta.max_tokens_per_rank = std::max<std::int64_t>(meta.max_tokens_per_rank, std::stoll(f));
    if (f.substr(f.find(' ')) != facts[0].substr(facts[0].find(' ')))
      throw Error(ErrorCode::kDtypeMismatch, "rank " + std::to_string(r) + ": its x is " + f.substr(f.find(' ') + 1) +
                                                 ", rank 0's is " + facts[0].substr(facts[0].find(' ') + 1) +
                                                 " (every rank has x.npy, bf16, or every rank x_fp8.npy + x_scales.npy)",
                  r);
  }
}

// The replay over the OpenSHMEM transport, then every rank's OUT/rank<r> published (a
// failure on any rank removes this rank's staged and published results). Returns the
// ranks' layout over the nodes, for the summary line. Collective.
std::string replay_and_publish(Bootstrap& boot, const NodeMap& nodes, const ReplayMeta& meta, const ReplayOptions& o,
                               const fs::path& staging, const fs::path& out) {
  const int me = boot.rank();
  auto drop = [&] {
    std::error_code ec;
    fs::remove_all(staging, ec);
    if (is_replay_output(out / rank_dir(me))) fs::remove_all(out / rank_dir(me), ec);
  };
  try {
    const std::string layout = describe_nodes(boot, nodes);
    ConnectOptions co;
    co.kind = ConnectKind::kShmem;
    co.timeout = checked_timeout(o.timeout_ms);
    auto t = connect(boot, co);
    // Collective errors (a bad topk_idx on one rank) are agreed; a timed-out or dead peer is not (it may be gone).
    agree_on_step(boot, [&] { replay_rank(*t, meta, o, staging); });
    agree_on_step(boot, [&] {
      publish_rank(staging, out, me);
      fs::remove_all(staging);
    });
    return layout;
  } catch (...) {
    drop();
    throw;
  }
}

// --transport shmem: this process is rank PE of a job oshrun / mpirun started (epx forks
// nothing). Every rank reads IN/meta.json and its own IN/rank<r> (so IN may be a copy per
// machine), writes OUT/rank<r> (staged, renamed once every rank succeeded); an input error
// on any rank fails every rank with that rank's message. Rank 0 prints the summary line.
void run_replay_shmem(const ReplayOptions& given) {
  const fs::path in(given.in), out(given.out);
  // Staged under a name of this process, removed however it ends (the janitor is forked
  // here, before the OpenSHMEM runtime starts).
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const fs::path staging = out / (".epx-replay-" + std::string(host) + "-" + std::to_string(getpid()));
  detail::remove_at_exit(fs::absolute(staging).string());
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  const int me = boot->rank(), P = boot->size();
  const int local = static_cast<int>(nodes.ranks_of(nodes.node_of_rank[static_cast<std::size_t>(me)]).size());
  ReplayOptions o = given;
  ReplayMeta meta;
  bool c_given = false, fp8 = false;
  std::int64_t S = 0;
  // Options, meta.json and this rank's input headers: an error on any rank fails all of them.
  agree_on_step(*boot, [&] {
    check_in_out(in, out);
    check_replay_options(o);
    checked_timeout(o.timeout_ms);
    meta = read_replay_meta_file(in, &c_given);
    if (meta.num_ranks != P)
      throw Error(ErrorCode::kInvalidArgument, (in / "meta.json").string() + ": num_ranks is " +
                                                   std::to_string(meta.num_ranks) + " but the launcher started " +
                                                   std::to_string(P) + " ranks");
    check_workers(o.workers, local, "epx replay");
    fp8 = fs::exists(in / rank_dir(me) / "x_fp8.npy");
    ReplayMeta bound = meta;
    if (!c_given) bound.max_tokens_per_rank = INT64_MAX;  // the default C is the largest S_r, known below
    S = check_replay_rank_inputs(in, bound, me, fp8, false);
    check_old_output(out, me);
  });
  agree_on_tokens_and_dtype(*boot, meta, c_given, S, fp8);
  default_topology_from_nodes(o.dataplane, *boot, nodes, "epx replay");
  agree_on_step(*boot, [&] {
    check_dataplane(o.dataplane, P);
    check_footprint("epx replay: rank " + std::to_string(me) + ": ",
                    rank_footprint(P, meta.hidden, meta.num_topk, S, meta.max_tokens_per_rank, o.worst, -1), local, false);
    fs::create_directories(out);
    fs::create_directory(staging);
  });
  const std::string layout = replay_and_publish(*boot, nodes, meta, o, staging, out);
  if (me == 0)
    std::printf("epx replay: %d ranks (shmem, ranks from the launcher: %s), %s layout, %s; wrote %s/rank0..rank%d\n", P,
                layout.c_str(), o.layout.c_str(), describe_dataplane(o.dataplane).c_str(), o.out.c_str(), P - 1);
  std::fflush(stdout);
  boot->barrier();
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* sub = app.add_subcommand(
      "replay",
      "Run one dispatch and one combine over P ranks from .npy inputs (docs/spec.md §7): IN/meta.json and "
      "IN/rank<r>/{topk_idx,topk_weights,x | x_fp8,x_scales}.npy -> OUT/rank<r>/*.npy. "
      "On failure exits non-zero, prints the error naming the rank at fault, and leaves no OUT/rank<r>.");
  sub->add_option("--in", o->in, "input directory")->required();
  sub->add_option("--out", o->out, "output directory (created)")->required();
  sub->add_option("--layout", o->layout, "compact | expanded")->capture_default_str();
  sub->add_option("--alignment", o->alignment, "expert_alignment A >= 1")->capture_default_str();
  sub->add_option("--worst", o->worst, "num_worst_tokens W (0 = off)")->capture_default_str();
  sub->add_flag("--deterministic", o->deterministic, "expanded rows sorted by (s, t) in each expert (always the case in epx)");
  sub->add_flag("--zero-padding", o->zero_padding, "zero recv_x's padding rows (off by default here: they are then unspecified, as docs/spec.md §3.2 allows; the library zeroes them by default)");
  sub->add_flag("--weighted", o->weighted, "weighted combine (expanded layout only)");
  sub->add_option("--transport", o->transport, "shm (ranks are processes) | threads | shmem (one rank per process, started by "
                  "oshrun / mpirun: README 'Across machines')")->capture_default_str();
  sub->add_option("--workers", o->workers, "worker threads per rank (0 = auto)")->capture_default_str();
  sub->add_option("--ring-rows", o->ring_rows, "bounded receive area: a ring of N rows per source (0 = a slot per row)")
      ->capture_default_str();
  sub->add_option("--timeout-ms", o->timeout_ms, "a rank that waits longer than this fails")->capture_default_str();
  add_dataplane_options(sub, o->dataplane);
  sub->callback([o] { run_replay(*o); });
}

}  // namespace epx::tools
