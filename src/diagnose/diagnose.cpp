// epx::Diagnose (epx/diagnose.hpp): the exchange of every rank's PeerWaits totals on an
// endpoint of its own, the matrices and verdicts of each interval, the persistent verdicts
// over the last intervals, the background thread and the log.
//
// The endpoint's window: every rank's identity (pid, node, the instance id), then two
// parities of P records; a record is a rank's stop bit and, per op, its calls and ns waited
// per source, summed over its watched buffers since it started watching them. Exchange k
// (1, 2, ...) writes parity k % 2 and raises every signal slot to k + 1 (the identity
// exchange of the constructor: 1). A rank starts exchange k + 1 only after every rank's
// signal of exchange k, which each raised after reading exchange k - 1's records: so no
// rank overwrites a record a peer has still to read.
#include "epx/diagnose.hpp"

#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "rotating_log.hpp"

namespace epx {

namespace {

struct Identity {
  std::int64_t pid;
  std::uint64_t instance;
  char node[64];
};

using Clock = std::chrono::steady_clock;

void check_options(const DiagnoseOptions& o) {
  auto bad = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "Diagnose: " + what); };
  if (o.interval.count() <= 0) bad("interval must be > 0 ms, got " + std::to_string(o.interval.count()));
  if (!(o.thresholds.row > 0) || !(o.thresholds.col > 0) || !(o.thresholds.point > 0))
    bad("thresholds must be > 0, got row " + std::to_string(o.thresholds.row) + ", col " + std::to_string(o.thresholds.col) +
        ", point " + std::to_string(o.thresholds.point));
  if (!std::isfinite(o.thresholds.floor_us) || o.thresholds.floor_us < 0)
    bad("thresholds.floor_us must be finite and >= 0, got " + std::to_string(o.thresholds.floor_us));
  if (!std::isfinite(o.thresholds.spread) || o.thresholds.spread < 0)
    bad("thresholds.spread must be finite and >= 0, got " + std::to_string(o.thresholds.spread));
  if (o.persist.of < 1 || o.persist.need < 1 || o.persist.need > o.persist.of)
    bad("persist: expected 1 <= need <= of, got need " + std::to_string(o.persist.need) + " of " + std::to_string(o.persist.of));
  if (o.log_backups < 0) bad("log_backups must be >= 0, got " + std::to_string(o.log_backups));
  if (o.log_max_bytes == 0) bad("log_max_bytes must be > 0");
}

Transport& checked(Transport& t, const DiagnoseOptions& o) {
  check_options(o);
  return t;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

struct Diagnose::Impl {
  /// `need_endpoint`: the transport carries a Buffer, so the exchange must have a window of its own.
  Impl(Transport& t, const DiagnoseOptions& o, bool need_endpoint);

  // Window geometry: the one owner of every offset.
  std::size_t record_words() const noexcept { return 1 + static_cast<std::size_t>(kNumWaitOps) * (P + 1); }
  std::size_t record_offset(std::uint64_t exchange, int r) const noexcept {
    return P * sizeof(Identity) + ((exchange % 2) * P + static_cast<std::size_t>(r)) * record_words() * sizeof(std::uint64_t);
  }
  std::size_t window_bytes() const noexcept { return record_offset(0, 0) + 2 * P * record_words() * sizeof(std::uint64_t); }

  void exchange_identity();
  std::vector<std::uint64_t> local_record(bool stop) const;
  bool run_exchange(bool stop);  // true: some rank asked to stop
  void publish(DiagnoseReport&& r);
  void loop();

  Transport& parent;
  std::unique_ptr<Transport> own;  // the endpoint (null: the transport itself)
  Transport* ep;
  DiagnoseOptions options;
  int rank;
  std::size_t P;
  std::uint64_t instance = 0;
  std::optional<detail::RotatingLog> log;

  struct Watched {
    std::shared_ptr<const PeerWaits> waits;
    std::array<PeerWaits::Totals, kNumWaitOps> base;  // its totals when watching began
  };
  mutable std::mutex watch_mutex;
  std::vector<Watched> watched;

  // Exchange state (one thread at a time: the caller's or the background thread).
  std::uint64_t exchanges = 0;
  std::vector<std::uint64_t> previous;  // [P][record_words]: every rank's last record
  Clock::time_point last = Clock::now();
  std::vector<RankInfo> ranks;
  // Per op, the last persist.of intervals' verdicts, oldest first: the persistent verdict's input.
  std::array<std::vector<MatrixVerdict>, kNumWaitOps> history;

  mutable std::mutex mutex;  // report_, error, stop_requested, the thread's state
  std::condition_variable wake;
  DiagnoseReport report_;
  bool stop_requested = false;
  bool started = false;
  bool stopped = false;
  bool failed = false;
  std::thread thread;
};

Diagnose::Impl::Impl(Transport& t, const DiagnoseOptions& o, bool need_endpoint)
    : parent(checked(t, o)), own(t.open_endpoint()), ep(own ? own.get() : &t), options(o), rank(t.rank()),
      P(static_cast<std::size_t>(t.num_ranks())) {
  if (!own && need_endpoint)
    throw Error(ErrorCode::kUnsupported,
                "rank " + std::to_string(rank) + ": Diagnose: the " + t.caps().name +
                    " transport offers no endpoint of its own (Transport::open_endpoint), and its window is the "
                    "Buffer's; give the Diagnose a transport of its own (Diagnose(transport) + watch(buffer))");
  if (!o.log_dir.empty() && rank == 0) log.emplace(o.log_dir, "diagnose.log", o.log_max_bytes, o.log_backups);
  previous.assign(P * record_words(), 0);
  ep->allocate(window_bytes(), P);
  exchange_identity();
  report_.ranks = ranks;
  report_.thresholds = o.thresholds;
  report_.persist = o.persist;
}

void Diagnose::Impl::exchange_identity() {
  Identity mine{};
  mine.pid = static_cast<std::int64_t>(getpid());
  mine.instance = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (gethostname(mine.node, sizeof mine.node - 1) != 0) std::snprintf(mine.node, sizeof mine.node, "?");
  const std::size_t off = static_cast<std::size_t>(rank) * sizeof(Identity);
  for (std::size_t i = 0; i < P; ++i) ep->put(static_cast<int>((rank + i) % P), off, &mine, sizeof mine, 0);
  ep->quiet(0);
  for (std::size_t i = 0; i < P; ++i) ep->signal(static_cast<int>((rank + i) % P), static_cast<std::size_t>(rank), 1, 0);
  for (std::size_t s = 0; s < P; ++s) ep->wait_signal(s, 1, {"diagnose create", static_cast<int>(s)});
  const auto* all = reinterpret_cast<const Identity*>(ep->window());
  instance = all[0].instance;
  for (std::size_t r = 0; r < P; ++r)
    ranks.push_back({static_cast<int>(r), all[r].pid, std::string(all[r].node, strnlen(all[r].node, sizeof all[r].node))});
}

// My record: the stop bit, then per op the calls and ns per source of every watched buffer
// since it was watched.
std::vector<std::uint64_t> Diagnose::Impl::local_record(bool stop) const {
  std::vector<std::uint64_t> rec(record_words(), 0);
  rec[0] = stop ? 1 : 0;
  std::lock_guard<std::mutex> lock(watch_mutex);
  for (const Watched& w : watched)
    for (int op = 0; op < kNumWaitOps; ++op) {
      const PeerWaits::Totals now = w.waits->totals(static_cast<WaitOp>(op));
      const PeerWaits::Totals& base = w.base[static_cast<std::size_t>(op)];
      std::uint64_t* o = rec.data() + 1 + static_cast<std::size_t>(op) * (P + 1);
      o[0] += now.calls - base.calls;
      for (std::size_t s = 0; s < P && s < now.wait_ns.size(); ++s) o[1 + s] += now.wait_ns[s] - base.wait_ns[s];
    }
  return rec;
}

bool Diagnose::Impl::run_exchange(bool stop) {
  const std::uint64_t k = exchanges + 1;
  const std::vector<std::uint64_t> mine = local_record(stop);
  const std::size_t bytes = mine.size() * sizeof(std::uint64_t);
  for (std::size_t i = 0; i < P; ++i) ep->put(static_cast<int>((rank + i) % P), record_offset(k, rank), mine.data(), bytes, 0);
  ep->quiet(0);
  for (std::size_t i = 0; i < P; ++i) ep->signal(static_cast<int>((rank + i) % P), static_cast<std::size_t>(rank), k + 1, 0);
  for (std::size_t s = 0; s < P; ++s) ep->wait_signal(s, k + 1, {"diagnose exchange", static_cast<int>(s)});
  exchanges = k;

  const Clock::time_point now = Clock::now();
  DiagnoseReport r;
  r.exchanges = k;
  r.seconds = std::chrono::duration<double>(now - last).count();
  last = now;
  r.ranks = ranks;
  r.thresholds = options.thresholds;
  r.persist = options.persist;
  bool any_stop = false;
  const std::size_t words = record_words();
  for (std::size_t d = 0; d < P; ++d) {
    const auto* rec = reinterpret_cast<const std::uint64_t*>(ep->window() + record_offset(k, static_cast<int>(d)));
    std::uint64_t* prev = previous.data() + d * words;
    any_stop = any_stop || rec[0] != 0;
    for (std::size_t op = 0; op < static_cast<std::size_t>(kNumWaitOps); ++op) {
      DiagnoseOp& o = r.ops[op];
      o.matrix_us.resize(P * P, 0);
      o.calls.resize(P, 0);
      const std::uint64_t* cur = rec + 1 + op * (P + 1);
      std::uint64_t* was = prev + 1 + op * (P + 1);
      o.calls[d] = cur[0] - was[0];
      for (std::size_t s = 0; s < P && o.calls[d] > 0; ++s)
        o.matrix_us[s * P + d] = static_cast<double>(cur[1 + s] - was[1 + s]) / static_cast<double>(o.calls[d]) / 1e3;
    }
    std::memcpy(prev, rec, words * sizeof(std::uint64_t));
  }
  for (std::size_t op = 0; op < static_cast<std::size_t>(kNumWaitOps); ++op) {
    DiagnoseOp& o = r.ops[op];
    o.verdict = diagnose_matrix(o.matrix_us, static_cast<int>(P), options.thresholds);
    std::vector<MatrixVerdict>& h = history[op];
    h.push_back(o.verdict);
    if (h.size() > static_cast<std::size_t>(options.persist.of)) h.erase(h.begin());
    o.persistent = persistent_verdict(h, options.persist);
    r.window = h.size();
  }
  // The ops' histories have the same length: one verdict of each per exchange.
  std::vector<std::array<MatrixVerdict, kNumWaitOps>> both(history[0].size());
  for (std::size_t k = 0; k < both.size(); ++k)
    for (std::size_t op = 0; op < static_cast<std::size_t>(kNumWaitOps); ++op) both[k][op] = history[op][k];
  r.persistent = persistent_ranks(both, options.persist);
  publish(std::move(r));
  return any_stop;
}

void Diagnose::Impl::publish(DiagnoseReport&& r) {
  std::string text;
  if (log) {
    char head[96];
    std::snprintf(head, sizeof head, "[%s] [Diagnose] instance %016llx\n", now_text().c_str(),
                  static_cast<unsigned long long>(instance));
    text = head + format_report(r);
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    r.error = report_.error;
    report_ = std::move(r);
  }
  if (log) {
    try {
      log->append(text);
    } catch (const Error& e) {
      std::fprintf(stderr, "epx: rank %d: %s\n", rank, e.what());
    }
  }
}

// The background exchange: every interval, or at once when stop() asks (that exchange
// carries the stop bit, and any rank's stop bit ends every rank's thread after it).
void Diagnose::Impl::loop() {
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    wake.wait_for(lock, options.interval, [&] { return stop_requested; });
    const bool stop = stop_requested;
    lock.unlock();
    bool end = false;
    try {
      end = run_exchange(stop);
    } catch (const std::exception& e) {
      lock.lock();
      failed = true;
      report_.error = std::string("rank ") + std::to_string(rank) + ": " + e.what();
      if (log) {
        try {
          log->append("[" + now_text() + "] [Diagnose] the exchange ended: " + report_.error + "\n");
        } catch (const Error&) {
        }
      }
      return;
    }
    lock.lock();
    if (end) return;
  }
}

Diagnose::Diagnose(Transport& transport, const DiagnoseOptions& options)
    : impl_(std::make_unique<Impl>(transport, options, false)) {}

Diagnose::Diagnose(Transport& transport, const Buffer& buffer, const DiagnoseOptions& options)
    : impl_(std::make_unique<Impl>(transport, options, true)) {
  watch(buffer);
}

Diagnose::~Diagnose() {
  try {
    stop();
  } catch (const std::exception&) {
  }
  if (!impl_->failed) {
    try {
      impl_->ep->barrier("diagnose destroy");
    } catch (const std::exception&) {
    }
  }
}

void Diagnose::watch(std::shared_ptr<const PeerWaits> waits) {
  if (!waits || static_cast<std::size_t>(waits->num_ranks()) != impl_->P)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(impl_->rank) + ": Diagnose.watch: the waits of " +
                                                 std::to_string(waits ? waits->num_ranks() : 0) + " ranks, expected " +
                                                 std::to_string(impl_->P));
  Impl::Watched w{waits, {}};
  for (int op = 0; op < kNumWaitOps; ++op) w.base[static_cast<std::size_t>(op)] = waits->totals(static_cast<WaitOp>(op));
  std::lock_guard<std::mutex> lock(impl_->watch_mutex);
  impl_->watched.push_back(std::move(w));
}

void Diagnose::watch(const Buffer& buffer) { watch(buffer.peer_waits()); }

void Diagnose::start() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->started)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(impl_->rank) + ": Diagnose.start: already started (once per Diagnose)");
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->loop(); });
}

void Diagnose::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->started || impl_->stopped) return;
    impl_->stop_requested = true;
    impl_->stopped = true;
  }
  impl_->wake.notify_all();
  impl_->thread.join();
}

void Diagnose::exchange() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->started)
      throw Error(ErrorCode::kInvalidArgument,
                  "rank " + std::to_string(impl_->rank) + ": Diagnose.exchange: the background exchange owns the endpoint (started)");
  }
  try {
    impl_->run_exchange(false);
  } catch (...) {
    impl_->failed = true;  // no barrier at destruction: a peer may be gone
    throw;
  }
}

DiagnoseReport Diagnose::report() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->report_;
}

int Diagnose::rank() const noexcept { return impl_->rank; }
int Diagnose::num_ranks() const noexcept { return static_cast<int>(impl_->P); }

}  // namespace epx
