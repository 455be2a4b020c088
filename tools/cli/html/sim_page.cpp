#include "html/sim_page.hpp"

#include "html/html_page.hpp"

namespace epx::tools {

using nlohmann::ordered_json;

std::vector<sim::PublishedPoint> published_points(const sim::HardwareModel& hw) {
  std::vector<sim::PublishedPoint> out;
  for (const sim::PublishedSeries& s : hw.published)
    if (s.metric == "epx")  // the page's GB/s; DeepEP's bottleneck bandwidth: `epx sim published`
      out.insert(out.end(), s.points.begin(), s.points.end());
  return out;
}

namespace {

ordered_json options_json(const SimOptions& o) {
  return {{"tokens", o.tokens}, {"hidden", o.hidden},       {"topk", o.topk},         {"experts", o.experts},
          {"fp8", o.fp8},       {"layout", o.layout},       {"alignment", o.alignment}, {"topology", o.topology},
          {"schedule", o.schedule}, {"queues", o.queues},   {"aggregate", o.aggregate}, {"protocol", o.protocol},
          {"ring_rows", o.ring_rows}, {"steady", o.steady}, {"cached", o.cached},   {"workers", o.workers},
          {"sync", o.sync},     {"seed", o.seed}};
}

// The published points were measured at the calibration shape, SimOptions' defaults.
std::string published_note(const SimOptions& o) {
  const SimOptions d;
  const bool same = o.tokens == d.tokens && o.hidden == d.hidden && o.topk == d.topk && o.experts == d.experts && o.fp8 == d.fp8 &&
                    o.layout == d.layout && o.alignment == d.alignment;
  return std::string("published at S=") + std::to_string(d.tokens) + " H=" + std::to_string(d.hidden) + " K=" + std::to_string(d.topk) +
         " E=" + std::to_string(d.experts) + (d.fp8 ? " fp8" : " bf16") + " " + d.layout + " A=" + std::to_string(d.alignment) +
         (same ? ", the shape of this run" : "; this run's shape differs: compare the trends, not the values");
}

ordered_json profile_json(const SimPageProfile& p, const SimOptions& o) {
  ordered_json j;
  j["hardware"] = p.hardware->name;
  j["payload_limit_gbps"] = {{"low", p.hardware->payload_limit_low.gbps}, {"high", p.hardware->payload_limit_high.gbps}};
  ordered_json published = ordered_json::array();
  for (const sim::PublishedPoint& t : p.published)
    published.push_back({{"ep", t.ep},
                         {"dispatch_gbps", {{"low", t.dispatch_lo}, {"high", t.dispatch_hi}}},
                         {"combine_gbps", {{"low", t.combine_lo}, {"high", t.combine_hi}}}});
  j["published"] = published;
  if (!p.published.empty()) j["published_note"] = published_note(o);
  // The very objects `epx sim --json` writes.
  j["points"] = ordered_json::parse(sim_json(p.points));
  return j;
}

}  // namespace

ordered_json sim_page_json(const SimOptions& o, const std::vector<SimPageProfile>& profiles) {
  ordered_json j;
  j["tool"] = "epx sim";
  j["options"] = options_json(o);
  ordered_json list = ordered_json::array();
  for (const SimPageProfile& p : profiles) list.push_back(profile_json(p, o));
  j["profiles"] = list;
  return j;
}

void write_sim_html(const std::filesystem::path& path, const SimOptions& o, const std::vector<SimPageProfile>& profiles,
                    const std::string& text) {
  std::string title = "epx sim:";
  for (const SimPageProfile& p : profiles) title += " " + p.hardware->name;
  title += ", S=" + std::to_string(o.tokens) + " H=" + std::to_string(o.hidden) + " K=" + std::to_string(o.topk) + " E=" + std::to_string(o.experts);
  write_html_page(path, PageKind::kSim, title, sim_page_json(o, profiles), text);
}

}  // namespace epx::tools
