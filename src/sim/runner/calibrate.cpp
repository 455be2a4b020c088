#include "epx/sim/runner/calibrate.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "epx/bench/progress.hpp"
#include "epx/error.hpp"

namespace epx::tools {

const std::vector<CalibrationTarget>& ascend950_targets() {
  static const std::vector<CalibrationTarget> t = {
      {8, 373, 375, 345, 347},
      {16, 348, 352, 338, 341},
      {32, 335, 340, 320, 324},
  };
  return t;
}

const std::vector<std::string>& calibration_free_parameters() {
  static const std::vector<std::string> p = {"link_bandwidth", "memory_bandwidth", "queue_wr_time", "reduce_bandwidth",
                                             "combine_peer_release"};
  return p;
}

namespace {

double mid(double lo, double hi) { return (lo + hi) / 2; }

std::vector<CalibrationPoint> points_of(const std::vector<SimRun>& runs, const sim::HardwareModel& hw, const SimOptions& o) {
  std::vector<CalibrationPoint> out;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const CalibrationTarget& t = ascend950_targets()[i];
    const SimPoint p = evaluate_run(runs[i], hw, o);
    CalibrationPoint c{t, p.dispatch_gbps, p.combine_gbps, 0, 0};
    c.dispatch_error_pct = 100 * (p.dispatch_gbps / mid(t.dispatch_lo, t.dispatch_hi) - 1);
    c.combine_error_pct = 100 * (p.combine_gbps / mid(t.combine_lo, t.combine_hi) - 1);
    out.push_back(c);
  }
  return out;
}

std::vector<SimRun> calibration_runs(const SimOptions& o) {
  std::vector<SimRun> runs;
  double total = 0;  // an EP size's engine run taken as proportional to its ranks
  for (const CalibrationTarget& t : ascend950_targets()) total += t.ep;
  ProgressLine progress("[epx sim calibrate]", total, o.progress);
  for (const CalibrationTarget& t : ascend950_targets()) {
    double done = 0;
    for (const SimRun& r : runs) done += r.ep;
    progress.update(done, "EP" + std::to_string(t.ep) + ": running the engine");
    runs.push_back(collect_run(o, t.ep));
  }
  return runs;
}

}  // namespace

std::vector<CalibrationPoint> calibration_points(const SimOptions& o, const sim::HardwareModel& hw) {
  return points_of(calibration_runs(o), hw, o);
}

Calibration calibrate(const SimOptions& o, const sim::HardwareModel& start, int max_evaluations) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<SimRun> runs = calibration_runs(o);
  const std::vector<std::string>& names = calibration_free_parameters();
  constexpr int N = 5;
  if (names.size() != N) throw Error(ErrorCode::kInternal, "epx sim calibrate: the fit moves exactly 5 parameters");
  Calibration cal;
  cal.model = start;
  ProgressLine progress("[epx sim calibrate]", max_evaluations, o.progress);  // at most this many (the fit may stop sooner)
  auto model_at = [&](const std::array<double, N>& x) {
    sim::HardwareModel m = start;
    for (int i = 0; i < N; ++i) m.set(names[static_cast<std::size_t>(i)], std::exp(x[static_cast<std::size_t>(i)]), "calibrating");
    return m;
  };
  auto cost = [&](const std::array<double, N>& x) {
    ++cal.evaluations;
    double c = 0;
    for (const CalibrationPoint& p : points_of(runs, model_at(x), o))
      c += p.dispatch_error_pct * p.dispatch_error_pct + p.combine_error_pct * p.combine_error_pct;
    char what[96];
    std::snprintf(what, sizeof what, "fit: evaluation %d/%d, squared error %.4f %%^2", cal.evaluations, max_evaluations, c);
    progress.update(cal.evaluations, what);
    return c;
  };
  // Nelder-Mead over log(parameter).
  std::array<std::array<double, N>, N + 1> s{};
  std::array<double, N + 1> f{};
  for (int i = 0; i < N; ++i) s[0][static_cast<std::size_t>(i)] = std::log(start.get(names[static_cast<std::size_t>(i)]));
  for (int v = 1; v <= N; ++v) {
    s[static_cast<std::size_t>(v)] = s[0];
    s[static_cast<std::size_t>(v)][static_cast<std::size_t>(v - 1)] += 0.15;
  }
  for (int v = 0; v <= N; ++v) f[static_cast<std::size_t>(v)] = cost(s[static_cast<std::size_t>(v)]);
  while (cal.evaluations < max_evaluations) {
    std::array<int, N + 1> order{};
    for (int i = 0; i <= N; ++i) order[static_cast<std::size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return f[static_cast<std::size_t>(a)] < f[static_cast<std::size_t>(b)]; });
    const auto best = static_cast<std::size_t>(order[0]), worst = static_cast<std::size_t>(order[N]),
               second = static_cast<std::size_t>(order[N - 1]);
    if (f[worst] - f[best] < 1e-4) break;
    std::array<double, N> c{};
    for (int v = 0; v <= N; ++v)
      if (static_cast<std::size_t>(v) != worst)
        for (int i = 0; i < N; ++i) c[static_cast<std::size_t>(i)] += s[static_cast<std::size_t>(v)][static_cast<std::size_t>(i)] / N;
    auto along = [&](double t) {
      std::array<double, N> x{};
      for (int i = 0; i < N; ++i)
        x[static_cast<std::size_t>(i)] = c[static_cast<std::size_t>(i)] + t * (s[worst][static_cast<std::size_t>(i)] - c[static_cast<std::size_t>(i)]);
      return x;
    };
    const auto xr = along(-1.0);
    const double fr = cost(xr);
    if (fr < f[best]) {
      const auto xe = along(-2.0);
      const double fe = cost(xe);
      if (fe < fr) s[worst] = xe, f[worst] = fe;
      else s[worst] = xr, f[worst] = fr;
    } else if (fr < f[second]) {
      s[worst] = xr, f[worst] = fr;
    } else {
      const auto xc = along(0.5);
      const double fc = cost(xc);
      if (fc < f[worst]) {
        s[worst] = xc, f[worst] = fc;
      } else {  // shrink towards the best
        for (int v = 0; v <= N; ++v) {
          if (static_cast<std::size_t>(v) == best) continue;
          for (int i = 0; i < N; ++i)
            s[static_cast<std::size_t>(v)][static_cast<std::size_t>(i)] =
                s[best][static_cast<std::size_t>(i)] + 0.5 * (s[static_cast<std::size_t>(v)][static_cast<std::size_t>(i)] - s[best][static_cast<std::size_t>(i)]);
          f[static_cast<std::size_t>(v)] = cost(s[static_cast<std::size_t>(v)]);
        }
      }
    }
  }
  std::size_t best = 0;
  for (std::size_t v = 1; v <= N; ++v)
    if (f[v] < f[best]) best = v;
  cal.model = start;
  for (int i = 0; i < N; ++i)
    cal.model.set(names[static_cast<std::size_t>(i)], std::exp(s[best][static_cast<std::size_t>(i)]),
                  "calibrated: epx sim calibrate (Nelder-Mead on EP8/16/32 dispatch+combine, seed " + std::to_string(o.seed) + ")");
  cal.points = points_of(runs, cal.model, o);
  cal.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cal;
}

std::string calibration_report(const Calibration& c) {
  std::ostringstream os;
  char line[256];
  os << "calibrated parameters:\n";
  for (const std::string& n : calibration_free_parameters()) {
    for (const sim::HardwareParam& p : c.model.params)
      if (p.name == n) {
        std::snprintf(line, sizeof line, "  %-18s %10.4g %s\n", n.c_str(), p.value, p.unit.c_str());
        os << line;
      }
  }
  os << "  EP | dispatch GB/s  published     error | combine GB/s  published     error\n";
  for (const CalibrationPoint& p : c.points) {
    std::snprintf(line, sizeof line, "%4d | %13.1f  %4.0f-%-4.0f %+7.2f%% | %12.1f  %4.0f-%-4.0f %+7.2f%%\n", p.target.ep,
                  p.dispatch_gbps, p.target.dispatch_lo, p.target.dispatch_hi, p.dispatch_error_pct, p.combine_gbps,
                  p.target.combine_lo, p.target.combine_hi, p.combine_error_pct);
    os << line;
  }
  std::snprintf(line, sizeof line, "%d model evaluations, %.1f s\n", c.evaluations, c.seconds);
  os << line;
  return os.str();
}

namespace {

std::string engine_key(const SimOptions& o) {
  return std::to_string(o.tokens) + "|" + o.schedule + "|" + std::to_string(o.queues) + "|" + o.queue_split + "|" + std::to_string(o.aggregate) + "|" + o.protocol +
         "|" + o.topology + "|" + std::to_string(o.ring_rows);
}

std::string variant_key(const SimOptions& o) { return engine_key(o) + "|" + (o.dense_scan ? "dense" : "compact") + "|" + o.sync; }

// Engine runs are the expensive part (~20-30 s each at 128 ranks) and a trace at 128
// ranks takes ~1 GB, so runs are not kept: every variant that needs the same engine run
// (same engine key; model-only knobs like the dense scan or the modelled sync differ)
// is evaluated on it while it exists, then it is dropped.
class ExperimentPoints {
 public:
  ExperimentPoints(const sim::HardwareModel& hw, bool progress) : hw_(hw), progress_(progress) {}

  void evaluate_all(const std::vector<SimOptions>& todo) {
    std::map<std::string, std::vector<SimOptions>> by_engine;
    std::vector<std::string> order;
    std::set<std::string> queued;
    for (const SimOptions& o : todo) {
      if (points_.count(variant_key(o)) || !queued.insert(variant_key(o)).second) continue;
      const std::string k = engine_key(o);
      if (!by_engine.count(k)) order.push_back(k);
      by_engine[k].push_back(o);
    }
    ProgressLine line("[epx sim experiments]", static_cast<double>(order.size()), progress_);
    for (std::size_t i = 0; i < order.size(); ++i) {
      line.update(static_cast<double>(i), "engine run " + std::to_string(engine_runs_ + 1) + " at 128 ranks (" + std::to_string(i + 1) +
                                              "/" + std::to_string(order.size()) + " of this step): " + order[i]);
      run_group(order[i], by_engine[order[i]], line);
    }
  }
  const SimPoint& point(const SimOptions& o) {
    if (!points_.count(variant_key(o))) evaluate_all({o});
    return points_.at(variant_key(o));
  }
  int engine_runs() const { return engine_runs_; }
  std::size_t evaluations() const { return points_.size(); }

 private:
  // One engine run at 128 ranks, every variant of `group` evaluated on it (a failed run:
  // latencies -1).
  void run_group(const std::string& k, const std::vector<SimOptions>& group, ProgressLine& line) {
    ++engine_runs_;
    try {
      const SimRun run = collect_run(group.front(), 128);
      for (const SimOptions& o : group) points_[variant_key(o)] = evaluate_run(run, hw_, o);
    } catch (const std::exception& e) {
      line.note("failed " + k + ": " + e.what());
      for (const SimOptions& o : group) {
        SimPoint failed;
        failed.dispatch_us = failed.combine_us = -1;
        points_[variant_key(o)] = failed;
      }
    }
  }

  const sim::HardwareModel& hw_;
  bool progress_;
  std::map<std::string, SimPoint> points_;  // by variant key (engine key + model knobs)
  int engine_runs_ = 0;
};

// The experiment table's rows, the baseline first (points not filled in yet).
std::vector<ExperimentVariant> experiment_variants(const SimOptions& base) {
  std::vector<ExperimentVariant> v;
  auto add = [&](const std::string& name, const std::string& plane, auto change) {
    SimOptions o = base;
    change(o);
    v.push_back({name, plane, o, {}});
  };
  add("baseline (rotated, 1 queue, aggregate 1 MiB, explicit)", "-", [](SimOptions&) {});
  for (int w : {8, 16, 32, 128})
    add("group width " + std::to_string(w), "data plane (incast / port contention)",
        [w](SimOptions& o) { o.schedule = "grouped:" + std::to_string(w); });
  add("queues 1", "control plane (WR processing)", [](SimOptions& o) { o.queues = 1; });
  for (const char* r : {"1:1", "3:1", "1:3"})
    add(std::string("queues 2 (") + r + ")", "control plane (WR processing)", [r](SimOptions& o) {
      o.queues = 2;
      o.queue_split = r;
    });
  add("queues 4 rr", "control plane (WR processing)", [](SimOptions& o) {
    o.queues = 4;
    o.queue_split = "rr";
  });
  add("aggregation on (1 MiB)", "control plane (put count)", [](SimOptions& o) { o.aggregate = 1 << 20; });
  add("aggregation off", "control plane (put count)", [](SimOptions& o) { o.aggregate = 0; });
  add("compact plan", "control plane (planning)", [](SimOptions& o) { o.dense_scan = false; });
  add("dense [S,P] route scan", "control plane (planning)", [](SimOptions& o) { o.dense_scan = true; });
  add("global barrier per call", "synchronisation", [](SimOptions& o) { o.sync = "barrier"; });
  add("per-group credits (16)", "synchronisation", [](SimOptions& o) { o.sync = "credits:16"; });
  for (const char* s : {"flat", "rotated", "grouped:16"})
    add(std::string("schedule ") + s, "data plane (arrival order at the receivers)", [s](SimOptions& o) { o.schedule = s; });
  // Hierarchical at 128 ranks x 16384 tokens does not fit this machine: a relay's records
  // (per relayed row: a slot and the metadata for each of the 8 lanes) are control data,
  // really written, ~14 GB over 128 ranks plus the senders' staged copies (the full-size run
  // was OOM-killed at 20 GB). It runs at a quarter of the tokens; GB/s per rank compare,
  // latencies roughly scale by 4.
  const std::int64_t hier_tokens = std::max<std::int64_t>(1, base.tokens / 4);
  add("schedule hierarchical (at " + std::to_string(hier_tokens) + " tokens/rank)", "data plane (arrival order at the receivers)",
      [hier_tokens](SimOptions& o) {
        o.schedule = "hierarchical";
        o.tokens = hier_tokens;
      });
  return v;
}

// Search: coordinate descent over the engine's data-plane knobs (a full grid is 48
// engine runs at 128 ranks, ~30 min on 2 cores): from the baseline, try every value of one
// knob with the others fixed, keep the best (dispatch + combine latency), next knob; stop
// after a pass that changes nothing. Compact plan, no modelled sync during the search
// (the modelled per-group credits add the same constant to every candidate, so they do
// not change the ranking and would need their own engine runs); the winner is then also
// reported with per-group credits (16), the synchronisation a reusable buffer needs.
struct Knob {
  const char* name;
  std::vector<std::function<void(SimOptions&)>> values;
};

std::vector<Knob> search_knobs() {
  std::vector<Knob> knobs;
  Knob k{"schedule", {}};
  for (const char* s : {"rotated", "flat", "grouped:8", "grouped:16", "grouped:32", "grouped:128"})  // hierarchical: see above
    k.values.push_back([s](SimOptions& o) { o.schedule = s; });
  knobs.push_back(k);
  Knob q{"queues", {}};
  q.values.push_back([](SimOptions& o) { o.queues = 1, o.queue_split = "rr"; });
  for (const char* r : {"1:1", "3:1", "1:3"}) q.values.push_back([r](SimOptions& o) { o.queues = 2, o.queue_split = r; });
  q.values.push_back([](SimOptions& o) { o.queues = 4, o.queue_split = "rr"; });
  knobs.push_back(q);
  Knob a{"aggregate", {}};
  for (std::int64_t agg : {std::int64_t{0}, std::int64_t{1} << 18, std::int64_t{1} << 20, std::int64_t{4} << 20})
    a.values.push_back([agg](SimOptions& o) { o.aggregate = agg; });
  knobs.push_back(a);
  Knob p{"protocol", {}};
  for (const char* pr : {"explicit", "tail"}) p.values.push_back([pr](SimOptions& o) { o.protocol = pr; });
  knobs.push_back(p);
  return knobs;
}

// The coordinate descent from `e.base`: e.search, e.best, e.best_point, e.candidates.
void coordinate_search(ExperimentPoints& points, Experiments& e) {
  const std::vector<Knob> knobs = search_knobs();
  auto total = [](const SimPoint& p) { return p.dispatch_us < 0 ? 1e300 : p.dispatch_us + p.combine_us; };
  e.best = e.base;
  e.best_point = points.point(e.best);
  std::set<std::string> tried = {variant_key(e.best)};
  for (int pass = 0; pass < 3; ++pass) {
    bool changed = false;
    for (const Knob& k : knobs) {
      std::vector<SimOptions> cands;
      for (const auto& set : k.values) {
        SimOptions o = e.best;
        set(o);
        cands.push_back(o);
      }
      points.evaluate_all(cands);
      for (const SimOptions& o : cands) {
        const SimPoint& p = points.point(o);
        tried.insert(variant_key(o));
        if (total(p) + 0.05 < total(e.best_point)) e.best = o, e.best_point = p, changed = true;
      }
      e.search.push_back({pass + 1, k.name, e.best, e.best_point});
    }
    if (!changed) break;
  }
  e.candidates = tried.size();
}

std::string variant_table(const Experiments& e, const sim::HardwareModel& hw) {
  const SimOptions& base = e.base;
  std::ostringstream os;
  char line[512];
  os << "epx sim experiments: 128 ranks, " << base.tokens << " tokens/rank, H=" << base.hidden << ", top-" << base.topk << " of "
     << base.experts << ", hardware " << hw.name << ", topology " << (base.topology == "auto" ? sim::default_topology_spec(128) : base.topology)
     << "\n";
  os << "variant                                              | dispatch us  GB/s | combine us  GB/s | moves\n";
  const SimPoint& ref = e.variants.front().point;
  for (const ExperimentVariant& x : e.variants) {
    const SimPoint& p = x.point;
    const double dd = p.dispatch_us - ref.dispatch_us, dc = p.combine_us - ref.combine_us;
    std::string verdict = x.plane;
    if (p.dispatch_us < 0)
      verdict += ": the engine run failed (see stderr)";
    else if (x.options.tokens != base.tokens) {
      char b[128];
      std::snprintf(b, sizeof b, ": %+.1f / %+.1f GB/s vs baseline (fewer tokens: compare GB/s, not us)",
                    p.dispatch_gbps - ref.dispatch_gbps, p.combine_gbps - ref.combine_gbps);
      verdict += b;
    }
    else if (std::fabs(dd) < 0.5 && std::fabs(dc) < 0.5)
      verdict += ": no measurable effect in the model";
    else {
      char b[96];
      std::snprintf(b, sizeof b, ": %+.1f / %+.1f us vs baseline", dd, dc);
      verdict += b;
    }
    std::snprintf(line, sizeof line, "%-52s | %8.1f %6.1f | %8.1f %6.1f | %s\n", x.name.c_str(), p.dispatch_us, p.dispatch_gbps,
                  p.combine_us, p.combine_gbps, verdict.c_str());
    os << line;
  }
  return os.str();
}

std::string search_text(const Experiments& e, const sim::HardwareModel& hw) {
  std::ostringstream os;
  char line[512];
  os << "\nsearch (coordinate descent over schedule, queues, aggregation, protocol; compact plan; hierarchical not searched: "
        "it does not fit in memory at full size):\n";
  for (const ExperimentSearchStep& st : e.search) {
    std::snprintf(line, sizeof line, "  pass %d, %-9s -> schedule %s, queues %d (%s), aggregate %lld, protocol %s: %.1f + %.1f us\n",
                  st.pass, st.knob.c_str(), st.best.schedule.c_str(), st.best.queues, st.best.queue_split.c_str(),
                  static_cast<long long>(st.best.aggregate), st.best.protocol.c_str(), st.best_point.dispatch_us,
                  st.best_point.combine_us);
    os << line;
  }
  const SimOptions& best_o = e.best;
  const SimPoint& best_p = e.best_point;
  std::snprintf(line, sizeof line,
                "best: schedule %s, queues %d (%s), aggregate %lld, protocol %s: dispatch %.1f us (%.1f GB/s), combine %.1f us "
                "(%.1f GB/s)\n",
                best_o.schedule.c_str(), best_o.queues, best_o.queue_split.c_str(), static_cast<long long>(best_o.aggregate),
                best_o.protocol.c_str(), best_p.dispatch_us, best_p.dispatch_gbps, best_p.combine_us, best_p.combine_gbps);
  os << line;
  const SimPoint& c = e.best_with_credits;
  std::snprintf(line, sizeof line, "best with per-group credits (16): dispatch %.1f us (%.1f GB/s), combine %.1f us (%.1f GB/s)\n",
                c.dispatch_us, c.dispatch_gbps, c.combine_us, c.combine_gbps);
  os << line;
  std::snprintf(line, sizeof line,
                "physical payload limit %.0f-%.0f GB/s per rank: the best dispatch reaches %.0f-%.0f%%, combine %.0f-%.0f%% of it\n",
                hw.payload_limit_low.gbps, hw.payload_limit_high.gbps, 100 * best_p.dispatch_gbps / hw.payload_limit_high.gbps,
                100 * best_p.dispatch_gbps / hw.payload_limit_low.gbps, 100 * best_p.combine_gbps / hw.payload_limit_high.gbps,
                100 * best_p.combine_gbps / hw.payload_limit_low.gbps);
  os << line;
  std::snprintf(line, sizeof line, "(%d engine runs at 128 ranks, %zu model evaluations, %zu search candidates, %.0f s)\n", e.engine_runs,
                e.evaluations, e.candidates, e.seconds);
  os << line;
  return os.str();
}

}  // namespace

Experiments run_experiments(const SimOptions& base_in, const sim::HardwareModel& hw) {
  const auto t_start = std::chrono::steady_clock::now();
  Experiments e;
  e.base = base_in;
  e.base.ep = {128};
  ExperimentPoints points(hw, e.base.progress);
  e.variants = experiment_variants(e.base);
  {
    std::vector<SimOptions> all;
    for (const ExperimentVariant& x : e.variants) all.push_back(x.options);
    points.evaluate_all(all);
  }
  for (ExperimentVariant& x : e.variants) x.point = points.point(x.options);
  coordinate_search(points, e);
  SimOptions with_credits = e.best;
  with_credits.sync = "credits:16";
  e.best_with_credits = points.point(with_credits);
  e.engine_runs = points.engine_runs();
  e.evaluations = points.evaluations();
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return e;
}

std::string experiments_report(const Experiments& e, const sim::HardwareModel& hw) {
  return variant_table(e, hw) + search_text(e, hw);
}

}  // namespace epx::tools
