// `epx bench --elastic` (epx/bench/elastic.hpp): an elastic launch runs dispatch + combine
// pairs; the schedule kills ranks (the victim SIGKILLs itself just before its dispatch of
// the given iteration, so its peers fail inside theirs) and admits new ranks. Each group's
// rank 0 records, in a mapping shared with this process, the events' times and the
// throughput of each stretch; this process prints them once the launch returned.
//
// Routing: every token picks K distinct experts uniformly among the live ones, E/P0 per
// rank whatever the group's size (seeded by iteration and rank), and combine takes the
// dispatched rows back unchanged (the identity expert): the bench times the transport and
// its recovery, not the experts.
#include "epx/bench/elastic.hpp"

#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "epx/buffer.hpp"
#include "epx/elastic.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

int parse_int(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || v < 0) bad(what);
  return v;
}

constexpr int kMaxEvents = 32;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// What the ranks record for this process (a MAP_SHARED mapping made before the launch).
struct Shared {
  struct Event {
    int kind = 0, iter = 0, ranks_before = 0, ranks_after = 0;
    double detect_ms = 0, agree_ms = 0, rebuild_ms = 0, buffer_ms = 0, admit_ms = 0;
  };
  struct Stretch {
    int first_iter = 0, iters = 0, ranks = 0;
    double seconds = 0;
  };
  std::atomic<std::int64_t> killed_at_ns[kMaxEvents];
  Event events[kMaxEvents];
  Stretch stretches[kMaxEvents + 1];
  std::atomic<int> num_events{0}, num_stretches{0};
};

/// One rank's routing of iteration `it` in a group of P ranks.
void make_inputs(const BenchOptions& o, int experts, int it, int rank, std::vector<std::uint16_t>& x,
                 std::vector<std::int64_t>& idx, std::vector<float>& w) {
  const auto S = static_cast<std::size_t>(o.tokens), K = static_cast<std::size_t>(o.topk), H = static_cast<std::size_t>(o.hidden);
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(it + 1) + 7919ull * static_cast<std::uint64_t>(rank + 1);
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(s >> 33);
  };
  x.resize(S * H);
  for (auto& v : x) v = static_cast<std::uint16_t>(0x3c00 + next() % 0x200);  // bf16 values in [2^-7, 2^-6)
  idx.assign(S * K, -1);
  w.assign(S * K, 1.0f / static_cast<float>(K));
  for (std::size_t t = 0; t < S; ++t)
    for (std::size_t k = 0; k < K; ++k) {
      std::int64_t e = 0;
      bool again = true;
      while (again) {
        e = static_cast<std::int64_t>(next() % static_cast<std::uint32_t>(experts));
        again = std::find(idx.begin() + static_cast<std::ptrdiff_t>(t * K), idx.begin() + static_cast<std::ptrdiff_t>(t * K + k), e) !=
                idx.begin() + static_cast<std::ptrdiff_t>(t * K + k);
      }
      idx[t * K + k] = e;
    }
}

BufferConfig config_of(const BenchOptions& o, int experts) {
  BufferConfig c;
  c.num_experts = experts;
  c.hidden = o.hidden;
  c.num_topk = o.topk;
  c.max_tokens_per_rank = o.tokens;
  return c;
}

double ms_between(std::int64_t a, std::int64_t b) { return static_cast<double>(b - a) / 1e6; }

/// One rank's run (the launched ranks and the joiners alike): its group, Buffer and the
/// stretch of iterations since the last event.
class RankRun {
 public:
  RankRun(Transport& t, const BenchOptions& o, const std::vector<ElasticEventSpec>& schedule, Shared* sh)
      : o_(o), schedule_(schedule), sh_(sh), per_rank_(o.experts / o.ranks), joined_(joined_admission()),
        orig_(joined_ != nullptr ? -1 : t.rank()),  // joiners are never victims
        it_(joined_ != nullptr ? static_cast<int>(joined_->tag) : 0), now_(&t), stretch_first_(it_) {
    new_buffer();
    stretch_start_ = now_ns();  // the first stretch starts with its Buffer made
  }

  void run() {
    while (it_ < o_.iters) {
      int joins = 0;
      for (const ElasticEventSpec& ev : schedule_) joins += ev.kind == ElasticEventSpec::kJoin && ev.iter == it_;
      if (joins > 0 && !(joined_ != nullptr && it_ == static_cast<int>(joined_->tag) && stretch_first_ == it_)) admit_joiners(joins);
      try {
        one_pair();
      } catch (const Error& e) {
        if (!is_peer_loss(e)) throw;
        heal();
      }
    }
    close_stretch(it_, now_ns(), now_->rank() == 0);
  }

 private:
  void new_buffer() { buffer_ = std::make_unique<Buffer>(*now_, config_of(o_, per_rank_ * now_->num_ranks())); }

  void close_stretch(int end_iter, std::int64_t end_ns, bool recorder) {
    if (!recorder || end_iter <= stretch_first_) return;
    const int n = sh_->num_stretches.load();
    if (n > kMaxEvents) return;
    sh_->stretches[n] = {stretch_first_, end_iter - stretch_first_, now_->num_ranks(),
                         static_cast<double>(end_ns - stretch_start_) / 1e9};
    sh_->num_stretches.store(n + 1);
  }

  void record(const Shared::Event& ev) {
    const int n = sh_->num_events.load();
    if (n >= kMaxEvents) return;
    sh_->events[n] = ev;
    sh_->num_events.store(n + 1);
  }

  void new_stretch() {
    stretch_start_ = now_ns();
    stretch_first_ = it_;
  }

  // The schedule's joins at this iteration: rank 0 asks for them, every member admits them.
  void admit_joiners(int joins) {
    const std::int64_t t0 = now_ns();
    close_stretch(it_, t0, now_->rank() == 0);
    buffer_.reset();
    if (now_->rank() == 0) request_ranks(*now_, joins);
    Admission a;
    std::unique_ptr<Transport> bigger = admit(*now_, {joins, std::chrono::milliseconds(0), static_cast<std::uint64_t>(it_)}, &a);
    const std::int64_t t1 = now_ns();
    const int before = now_->num_ranks();
    if (bigger) {
      groups_.push_back(std::move(bigger));
      now_ = groups_.back().get();
    }
    new_buffer();
    const std::int64_t t2 = now_ns();
    if (now_->rank() == 0) {
      Shared::Event ev;
      ev.kind = ElasticEventSpec::kJoin;
      ev.iter = it_;
      ev.ranks_before = before;
      ev.ranks_after = now_->num_ranks();
      ev.admit_ms = ms_between(t0, t1);
      ev.buffer_ms = ms_between(t1, t2);
      record(ev);
    }
    new_stretch();
  }

  // The schedule's kill of this rank at this iteration, else one dispatch + combine pair.
  void one_pair() {
    for (int k = 0; k < static_cast<int>(schedule_.size()); ++k) {
      const ElasticEventSpec& ev = schedule_[static_cast<std::size_t>(k)];
      if (ev.kind == ElasticEventSpec::kKill && ev.iter == it_ && ev.rank == orig_) {
        sh_->killed_at_ns[k].store(now_ns());
        raise(SIGKILL);
      }
    }
    make_inputs(o_, per_rank_ * now_->num_ranks(), it_, now_->rank(), x_, idx_, w_);
    DispatchArgs d;
    d.x = TensorView(x_.data(), DType::kBF16, {o_.tokens, o_.hidden});
    d.topk_idx = TensorView(idx_.data(), DType::kI64, {o_.tokens, o_.topk});
    d.topk_weights = TensorView(w_.data(), DType::kF32, {o_.tokens, o_.topk});
    DispatchResult r = buffer_->dispatch(d);
    CombineArgs c;
    c.y = r.recv_x.view();
    c.handle = &r.handle;
    buffer_->combine(c);
    ++it_;
  }

  // A peer was lost: agree on the survivors, rebuild, and resume after the victim's iteration.
  void heal() {
    const std::int64_t t_detect = now_ns();
    // The kill this loss comes from: the latest one scheduled at or before this iteration
    // (a survivor may have finished the victim's iteration and failed in the next).
    int k = -1;
    for (int j = 0; j < static_cast<int>(schedule_.size()); ++j)
      if (schedule_[static_cast<std::size_t>(j)].kind == ElasticEventSpec::kKill && schedule_[static_cast<std::size_t>(j)].iter <= it_)
        k = j;
    buffer_.reset();
    const int before = now_->num_ranks();
    const Membership m = agree_survivors(*now_);
    const std::int64_t t_agree = now_ns();
    close_stretch(k >= 0 ? schedule_[static_cast<std::size_t>(k)].iter : it_, t_detect, m.new_rank == 0);
    groups_.push_back(rebuild_group(*now_, m));
    now_ = groups_.back().get();
    const std::int64_t t_rebuild = now_ns();
    new_buffer();
    const std::int64_t t_buffer = now_ns();
    // Every survivor resumes after the victim's iteration (its interrupted pair is dropped).
    it_ = (k >= 0 ? schedule_[static_cast<std::size_t>(k)].iter : it_) + 1;
    if (now_->rank() == 0) {
      Shared::Event ev;
      ev.kind = ElasticEventSpec::kKill;
      ev.iter = k >= 0 ? schedule_[static_cast<std::size_t>(k)].iter : it_ - 1;
      ev.ranks_before = before;
      ev.ranks_after = now_->num_ranks();
      const std::int64_t killed = k >= 0 ? sh_->killed_at_ns[k].load() : 0;
      ev.detect_ms = killed > 0 ? ms_between(killed, t_detect) : -1;
      ev.agree_ms = ms_between(t_detect, t_agree);
      ev.rebuild_ms = ms_between(t_agree, t_rebuild);
      ev.buffer_ms = ms_between(t_rebuild, t_buffer);
      record(ev);
    }
    new_stretch();
  }

  const BenchOptions& o_;
  const std::vector<ElasticEventSpec>& schedule_;
  Shared* sh_;
  const int per_rank_;
  const Admission* joined_;
  const int orig_;
  int it_;
  std::vector<std::unique_ptr<Transport>> groups_;  // each made from the one before: kept alive
  Transport* now_;
  std::unique_ptr<Buffer> buffer_;
  std::vector<std::uint16_t> x_;
  std::vector<std::int64_t> idx_;
  std::vector<float> w_;
  std::int64_t stretch_start_ = 0;
  int stretch_first_;
};

void run_rank(Transport& t, const BenchOptions& o, const std::vector<ElasticEventSpec>& schedule, Shared* sh) {
  RankRun(t, o, schedule, sh).run();
}

}  // namespace

std::vector<ElasticEventSpec> parse_elastic_schedule(const ElasticBenchOptions& e, const BenchOptions& o) {
  std::vector<ElasticEventSpec> events;
  if (!e.enabled) {
    if (!e.kill.empty() || !e.join.empty()) bad("--kill and --join need --elastic");
    return events;
  }
  for (const std::string& k : e.kill) {
    const auto at = k.find('@');
    const std::string what = "--kill takes RANK@ITER (a launched rank in [0, " + std::to_string(o.ranks) +
                             ") and an iteration in [0, " + std::to_string(o.iters) + ")), got '" + k + "'";
    if (at == std::string::npos) bad(what);
    ElasticEventSpec ev;
    ev.rank = parse_int(k.substr(0, at), what);
    ev.iter = parse_int(k.substr(at + 1), what);
    if (ev.rank >= o.ranks || ev.iter >= o.iters) bad(what);
    events.push_back(ev);
  }
  for (const std::string& j : e.join) {
    const std::string what = "--join takes @ITER (an iteration in [1, " + std::to_string(o.iters) + ")), got '" + j + "'";
    if (j.empty() || j[0] != '@') bad(what);
    ElasticEventSpec ev;
    ev.kind = ElasticEventSpec::kJoin;
    ev.iter = parse_int(j.substr(1), what);
    if (ev.iter < 1 || ev.iter >= o.iters) bad(what);
    events.push_back(ev);
  }
  std::stable_sort(events.begin(), events.end(), [](const ElasticEventSpec& a, const ElasticEventSpec& b) { return a.iter < b.iter; });
  if (static_cast<int>(events.size()) > kMaxEvents) bad("--elastic: at most " + std::to_string(kMaxEvents) + " events");
  int live = o.ranks;
  std::vector<bool> killed(static_cast<std::size_t>(o.ranks), false);
  for (std::size_t i = 0; i < events.size(); ++i) {
    const ElasticEventSpec& ev = events[i];
    if (ev.kind == ElasticEventSpec::kJoin) {
      ++live;
      continue;
    }
    if (killed[static_cast<std::size_t>(ev.rank)]) bad("--kill " + std::to_string(ev.rank) + "@...: that rank is killed twice");
    killed[static_cast<std::size_t>(ev.rank)] = true;
    if (--live < 1) bad("--kill: no rank would be left");
    // A loss is detected in the victim's iteration or the next: the next event must come later.
    if (i + 1 < events.size() && events[i + 1].iter <= ev.iter + 1)
      bad("--elastic: leave at least one iteration between a --kill and the next event (the loss surfaces in the victim's "
          "iteration or the next one)");
  }
  return events;
}

namespace {

/// The shapes --elastic can keep while ranks come and go (the experts per rank stay E/P).
void check_elastic_shape(const BenchOptions& o) {
  if (o.transport != "shm") bad("--elastic needs --transport shm (a process per rank: a rank that dies takes no other with it)");
  if (o.ranks < 1 || o.experts % o.ranks != 0 || o.topk < 1 || o.topk > o.experts / o.ranks || o.tokens < 1 || o.hidden < 1)
    bad("--elastic: E must be a multiple of P and K at most E/P (the experts per rank stay E/P as ranks come and go), got P = " +
        std::to_string(o.ranks) + ", E = " + std::to_string(o.experts) + ", K = " + std::to_string(o.topk));
}

/// An elastic shm launch with a spare rank for each join of the schedule; the lost ranks land in `lost`.
LaunchOptions elastic_launch(const BenchOptions& o, const std::vector<ElasticEventSpec>& schedule, std::vector<int>& lost) {
  int joins = 0;
  for (const ElasticEventSpec& ev : schedule) joins += ev.kind == ElasticEventSpec::kJoin;
  LaunchOptions lo;
  lo.num_ranks = o.ranks;
  lo.transport = TransportKind::kShm;
  lo.timeout = checked_timeout(o.timeout_ms);
  lo.elastic = true;
  lo.lost = &lost;
  lo.spare_ranks = joins;
  return lo;
}

void print_elastic_header(std::FILE* out, const BenchOptions& o, const std::vector<ElasticEventSpec>& schedule) {
  std::fprintf(out, "epx bench --elastic: P = %d (shm), S = %lld tokens, H = %d, K = %d, E/P = %d, %d iterations\n", o.ranks,
               static_cast<long long>(o.tokens), o.hidden, o.topk, o.experts / o.ranks, o.iters);
  std::fprintf(out, "schedule:");
  for (const ElasticEventSpec& ev : schedule)
    if (ev.kind == ElasticEventSpec::kKill)
      std::fprintf(out, " kill rank %d @%d;", ev.rank, ev.iter);
    else
      std::fprintf(out, " join @%d;", ev.iter);
  std::fprintf(out, "%s\n", schedule.empty() ? " (none)" : "");
  std::fflush(out);
}

/// A milliseconds cell, "-" where the event has no such step.
std::string ms_cell(double v) {
  char b[32];
  if (v < 0) return std::string("-");
  std::snprintf(b, sizeof b, "%.2f", v);
  return std::string(b);
}

/// One line per event: a lost rank's detect, agree, rebuild and Buffer times; a join's Buffer and admit.
void print_events(std::FILE* out, const Shared& sh) {
  std::fprintf(out, "\n%-14s %5s %8s %10s %9s %11s %10s %9s\n", "event", "iter", "ranks", "detect ms", "agree ms", "rebuild ms",
               "buffer ms", "admit ms");
  for (int i = 0; i < sh.num_events.load(); ++i) {
    const Shared::Event& ev = sh.events[i];
    const bool kill = ev.kind == ElasticEventSpec::kKill;
    const std::string ranks = std::to_string(ev.ranks_before) + "->" + std::to_string(ev.ranks_after);
    std::fprintf(out, "%-14s %5d %8s %10s %9s %11s %10s %9s\n", kill ? "rank lost" : "join", ev.iter, ranks.c_str(),
                 kill ? ms_cell(ev.detect_ms).c_str() : "-", kill ? ms_cell(ev.agree_ms).c_str() : "-",
                 kill ? ms_cell(ev.rebuild_ms).c_str() : "-", ms_cell(ev.buffer_ms).c_str(),
                 kill ? "-" : ms_cell(ev.admit_ms).c_str());
  }
}

/// One line per stretch of iterations over one group: its pace and throughput; then the lost ranks.
void print_stretches(std::FILE* out, const BenchOptions& o, const Shared& sh, const std::vector<int>& lost) {
  std::fprintf(out, "\n%-10s %6s %6s %10s %14s\n", "stretch", "iters", "ranks", "ms/iter", "tokens/s");
  for (int i = 0; i < sh.num_stretches.load(); ++i) {
    const Shared::Stretch& s = sh.stretches[i];
    const std::string span = std::to_string(s.first_iter) + "-" + std::to_string(s.first_iter + s.iters - 1);
    const double tokens = static_cast<double>(s.iters) * s.ranks * static_cast<double>(o.tokens);
    std::fprintf(out, "%-10s %6d %6d %10.3f %14.0f\n", span.c_str(), s.iters, s.ranks, s.seconds * 1e3 / s.iters,
                 s.seconds > 0 ? tokens / s.seconds : 0.0);
  }
  std::fprintf(out, "(a stretch's time includes its first pair after a new Buffer; tokens/s = pairs x ranks x S / time; "
                    "lost ranks:");
  for (int r : lost) std::fprintf(out, " %d", r);
  std::fprintf(out, "%s)\n", lost.empty() ? " none" : "");
}

}  // namespace

int run_elastic_bench(const BenchOptions& o, const ElasticBenchOptions& e, std::FILE* out) {
  check_elastic_shape(o);
  const std::vector<ElasticEventSpec> schedule = parse_elastic_schedule(e, o);
  // The ranks' record, shared with every rank process (one of which may die).
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw Error(ErrorCode::kIo, "epx bench --elastic: cannot map the ranks' record");
  auto* sh = new (mem) Shared();
  std::vector<int> lost;
  const LaunchOptions lo = elastic_launch(o, schedule, lost);
  print_elastic_header(out, o, schedule);
  try {
    launch(lo, [&](Transport& t) { run_rank(t, o, schedule, sh); });
  } catch (...) {
    munmap(mem, sizeof(Shared));
    throw;
  }
  print_events(out, *sh);
  print_stretches(out, o, *sh, lost);
  munmap(mem, sizeof(Shared));
  return 0;
}

}  // namespace epx::tools
