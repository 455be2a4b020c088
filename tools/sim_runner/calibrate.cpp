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

#include "epx/error.hpp"
#include "epx/bench/progress.hpp"

namespace epx::tools {

SimOptions series_options(const SimOptions& base, const sim::PublishedSeries& series) {
  SimOptions o = base;
  for (const auto& [k, v] : series.run) set_sim_option(o, k, v);
  o.ep = series.ep;
  return o;
}

double metric_gbps(const SimPoint& p, const std::string& metric, bool combine) {
  if (metric == "deepep") return combine ? p.combine_bottleneck_gbps : p.dispatch_bottleneck_gbps;
  return combine ? p.combine_gbps : p.dispatch_gbps;
}

std::vector<CalibrationTarget> calibration_targets(const SimOptions& base, const sim::HardwareModel& hw) {
  std::vector<CalibrationTarget> out;
  for (const sim::PublishedSeries& s : hw.published)
    for (const sim::PublishedPoint& p : s.points) {
      if (!p.calibrate) continue;
      CalibrationTarget t{s.label, s.metric, series_options(base, s), p};
      t.options.ep = {p.ep};
      validate_sim_options(t.options);
      out.push_back(std::move(t));
    }
  if (out.empty() || hw.calibrate.empty())
    throw Error(ErrorCode::kInvalidArgument, "epx sim calibrate: hardware '" + hw.name +
                                                 "' has no published points marked \"calibrate\" or no \"calibrate\" parameter list");
  return out;
}

namespace {

double mid(double lo, double hi) { return (lo + hi) / 2; }

std::vector<CalibrationPoint> points_of(const std::vector<CalibrationTarget>& targets, const std::vector<SimRun>& runs,
                                        const sim::HardwareModel& hw) {
  std::vector<CalibrationPoint> out;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const CalibrationTarget& t = targets[i];
    const SimPoint p = evaluate_run(runs[i], hw, t.options);
    CalibrationPoint c{t, metric_gbps(p, t.metric, false), metric_gbps(p, t.metric, true), p.dispatch_us, p.combine_us, 0, 0};
    c.dispatch_error_pct = 100 * (c.dispatch_gbps / mid(t.point.dispatch_lo, t.point.dispatch_hi) - 1);
    c.combine_error_pct = 100 * (c.combine_gbps / mid(t.point.combine_lo, t.point.combine_hi) - 1);
    out.push_back(c);
  }
  return out;
}

std::vector<SimRun> calibration_runs(const std::vector<CalibrationTarget>& targets, bool progress) {
  std::vector<SimRun> runs;
  double total = 0;  // an EP size's engine run taken as proportional to its ranks
  for (const CalibrationTarget& t : targets) total += t.point.ep;
  ProgressLine line("[epx sim calibrate]", total, progress);
  double done = 0;
  for (const CalibrationTarget& t : targets) {
    line.update(done, t.series + " EP" + std::to_string(t.point.ep) + ": running the engine");
    runs.push_back(collect_run(t.options, t.point.ep));
    done += t.point.ep;
  }
  return runs;
}

// Nelder-Mead over x (log of the parameters) from `x0`, steps of 0.15; at most `budget`
// evaluations of `cost` (counted by the caller). Returns the best vertex.
std::vector<double> nelder_mead(std::vector<double> x0, const std::function<double(const std::vector<double>&)>& cost,
                                const std::function<bool()>& spent) {
  const std::size_t N = x0.size();
  std::vector<std::vector<double>> s(N + 1, x0);
  std::vector<double> f(N + 1);
  for (std::size_t v = 1; v <= N; ++v) s[v][v - 1] += 0.15;
  for (std::size_t v = 0; v <= N; ++v) f[v] = cost(s[v]);
  while (!spent()) {
    std::vector<std::size_t> order(N + 1);
    for (std::size_t i = 0; i <= N; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return f[a] < f[b]; });
    const std::size_t best = order[0], worst = order[N], second = order[N - 1];
    if (f[worst] - f[best] < 1e-4) break;
    std::vector<double> c(N, 0.0);
    for (std::size_t v = 0; v <= N; ++v)
      if (v != worst)
        for (std::size_t i = 0; i < N; ++i) c[i] += s[v][i] / static_cast<double>(N);
    auto along = [&](double t) {
      std::vector<double> x(N);
      for (std::size_t i = 0; i < N; ++i) x[i] = c[i] + t * (s[worst][i] - c[i]);
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
        for (std::size_t v = 0; v <= N; ++v) {
          if (v == best) continue;
          for (std::size_t i = 0; i < N; ++i) s[v][i] = s[best][i] + 0.5 * (s[v][i] - s[best][i]);
          f[v] = cost(s[v]);
        }
      }
    }
  }
  return s[static_cast<std::size_t>(std::min_element(f.begin(), f.end()) - f.begin())];
}

}  // namespace

std::vector<CalibrationPoint> calibration_points(const SimOptions& o, const sim::HardwareModel& hw) {
  const std::vector<CalibrationTarget> targets = calibration_targets(o, hw);
  return points_of(targets, calibration_runs(targets, o.progress), hw);
}

Calibration calibrate(const SimOptions& o, const sim::HardwareModel& start, int max_evaluations) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CalibrationTarget> targets = calibration_targets(o, start);
  const std::vector<SimRun> runs = calibration_runs(targets, o.progress);
  const std::vector<std::string>& names = start.calibrate;
  Calibration cal;
  ProgressLine progress("[epx sim calibrate]", max_evaluations, o.progress);  // at most this many (the fit may stop sooner)
  auto model_at = [&](const std::vector<double>& x, const std::string& source) {
    sim::HardwareModel m = start;
    for (std::size_t i = 0; i < names.size(); ++i) m.set(names[i], std::exp(x[i]), source);
    return m;
  };
  auto cost = [&](const std::vector<double>& x) {
    ++cal.evaluations;
    double c = 0;
    for (const CalibrationPoint& p : points_of(targets, runs, model_at(x, "calibrating")))
      c += p.dispatch_error_pct * p.dispatch_error_pct + p.combine_error_pct * p.combine_error_pct;
    char what[96];
    std::snprintf(what, sizeof what, "fit: evaluation %d/%d, squared error %.4f %%^2", cal.evaluations, max_evaluations, c);
    progress.update(cal.evaluations, what);
    return c;
  };
  std::vector<double> x0;
  for (const std::string& n : names) x0.push_back(std::log(std::max(start.get(n), 1e-9)));
  const std::vector<double> best = nelder_mead(x0, cost, [&] { return cal.evaluations >= max_evaluations; });
  std::string fitted_on;
  for (const CalibrationTarget& t : targets) fitted_on += (fitted_on.empty() ? "" : ", ") + t.series + " EP" + std::to_string(t.point.ep);
  cal.model = model_at(best, "calibrated: epx sim calibrate (Nelder-Mead on " + fitted_on + ", dispatch+combine, seed " +
                                 std::to_string(o.seed) + ")");
  cal.points = points_of(targets, runs, cal.model);
  cal.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cal;
}

std::string calibration_report(const Calibration& c) {
  std::ostringstream os;
  char line[320];
  os << "calibrated parameters (" << c.model.name << "):\n";
  for (const std::string& n : c.model.calibrate)
    for (const sim::HardwareParam& p : c.model.params)
      if (p.name == n) {
        std::snprintf(line, sizeof line, "  %-22s %10.4g %s\n", n.c_str(), p.value, p.unit.c_str());
        os << line;
      }
  os << "  series               EP | metric | dispatch GB/s  published     error |     us | combine GB/s  published     error |     us\n";
  for (const CalibrationPoint& p : c.points) {
    const sim::PublishedPoint& t = p.target.point;
    std::snprintf(line, sizeof line, "  %-18s %4d | %-6s | %13.1f  %4.0f-%-4.0f %+7.2f%% | %6.1f | %12.1f  %4.0f-%-4.0f %+7.2f%% | %6.1f\n",
                  p.target.series.c_str(), t.ep, p.target.metric.c_str(), p.dispatch_gbps, t.dispatch_lo, t.dispatch_hi,
                  p.dispatch_error_pct, p.dispatch_us, p.combine_gbps, t.combine_lo, t.combine_hi, p.combine_error_pct, p.combine_us);
    os << line;
  }
  std::snprintf(line, sizeof line, "%d model evaluations, %.1f s\n", c.evaluations, c.seconds);
  os << line;
  return os.str();
}

namespace {

std::string engine_key(const SimOptions& o) {
  return std::to_string(o.tokens) + "|" + o.schedule + "|" + std::to_string(o.queues) + "|" + o.queue_split + "|" + std::to_string(o.aggregate) + "|" + o.protocol +
         "|" + o.topology + "|" + std::to_string(o.ring_rows) + "|" + o.send_policy + "|" + o.combine_order + "|" + o.combine_replies + "|" + o.relay_chunk + (o.one_copy ? "|one-copy" : "");
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
  for (const char* sp : {"auto", "whole", "block:256K"})
    add(std::string("send policy ") + sp, "control plane (put count per destination)", [sp](SimOptions& o) { o.send_policy = sp; });
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
  Knob sp{"send-policy", {}};
  for (const char* v : {"auto", "whole", "block:256K"}) sp.values.push_back([v](SimOptions& o) { o.send_policy = v; });
  knobs.push_back(sp);
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
     << base.experts << ", hardware " << hw.name << ", topology " << (base.topology == "auto" ? sim::default_topology_spec(128, hw) : base.topology)
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
  os << "\nsearch (coordinate descent over schedule, queues, aggregation, protocol, send policy; compact plan; hierarchical not searched: "
        "it does not fit in memory at full size):\n";
  for (const ExperimentSearchStep& st : e.search) {
    std::snprintf(line, sizeof line, "  pass %d, %-11s -> schedule %s, queues %d (%s), aggregate %lld, protocol %s, send policy %s: %.1f + %.1f us\n",
                  st.pass, st.knob.c_str(), st.best.schedule.c_str(), st.best.queues, st.best.queue_split.c_str(),
                  static_cast<long long>(st.best.aggregate), st.best.protocol.c_str(), st.best.send_policy.c_str(), st.best_point.dispatch_us,
                  st.best_point.combine_us);
    os << line;
  }
  const SimOptions& best_o = e.best;
  const SimPoint& best_p = e.best_point;
  std::snprintf(line, sizeof line,
                "best: schedule %s, queues %d (%s), aggregate %lld, protocol %s, send policy %s: dispatch %.1f us (%.1f GB/s), "
                "combine %.1f us (%.1f GB/s)\n",
                best_o.schedule.c_str(), best_o.queues, best_o.queue_split.c_str(), static_cast<long long>(best_o.aggregate),
                best_o.protocol.c_str(), best_o.send_policy.c_str(), best_p.dispatch_us, best_p.dispatch_gbps, best_p.combine_us, best_p.combine_gbps);
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
