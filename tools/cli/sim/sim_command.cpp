// `epx sim`: the real engine on simulator ranks, times from the discrete-event model.
//   epx sim [--ep 8,16,32,64,128] [shape] [data plane] [--json FILE] [--svg FILE]
//   epx sim calibrate [--out FILE]     fit the profile's free parameters (docs/sim.md)
//   epx sim experiments                the experiment table at 128 ranks + a search
//   epx sim ledger [shape] [--json FILE] [--svg FILE]   bytes per layer: closed form vs engine counters
//   epx sim hybridep [--p 0,0.25,...,1] [link, expert]    move tokens or experts across a slow link
//   epx sim published [--hardware all|NAME] [--json F] [--svg F]   a profile's published series, predicted
//   epx sim profile [--hardware NAME]   print a profile's JSON (to copy and edit)
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.hpp"
#include "epx/error.hpp"
#include "epx/sim/runner/calibrate.hpp"
#include "epx/io/file_io.hpp"
#include "epx/sim/runner/hybridep.hpp"
#include "epx/sim/runner/ledger.hpp"
#include "epx/sim/runner/published.hpp"
#include "epx/sim/runner/run.hpp"
#include "html/sim_page.hpp"

namespace epx::tools {

namespace {

void write_file(const std::string& path, const std::string& text) { write_text_file(path, "output", text); }

// S, H, K, E and the dispatch dtype: the shape flags of every `epx sim` command.
void add_shape_flags(CLI::App* sub, std::int64_t& tokens, int& hidden, int& topk, int& experts, bool& fp8, const char* bf16_help,
                     const char* fp8_help) {
  sub->add_option("--tokens", tokens, "S: tokens per rank")->capture_default_str();
  sub->add_option("--hidden", hidden, "H: hidden size")->capture_default_str();
  sub->add_option("--topk", topk, "K: experts per token")->capture_default_str();
  sub->add_option("--experts", experts, "E: experts")->capture_default_str();
  sub->add_flag("!--bf16", fp8, bf16_help);
  sub->add_flag("--fp8", fp8, fp8_help);
}

// The EP sizes and the shape of a run (`epx sim`, `epx sim ledger`).
void add_shape_options(CLI::App* sub, SimOptions& o, const char* ep_help) {
  sub->add_option("--ep", o.ep, ep_help)->delimiter(',')->capture_default_str();
  add_shape_flags(sub, o.tokens, o.hidden, o.topk, o.experts, o.fp8, "dispatch bf16 x (default: FP8 E4M3 with row-major float32 scales)",
                  "dispatch FP8 E4M3 x with float32 scales (the default)");
}

void add_sim_options(CLI::App* sub, SimOptions& o) {
  sub->add_option("--hardware", o.hardware, "hardware profile name (ascend950-supernode, h800-deepep) or JSON file")->capture_default_str();
  sub->add_option("--topology", o.topology,
                  "rank positions for the engine and the model: builtin:flat | builtin:servers:N | builtin:supernode128 | "
                  "FILE.json; auto = builtin:supernode128 at 128 ranks, else builtin:servers:8")
      ->capture_default_str();
  add_shape_options(sub, o, "EP sizes to simulate, comma-separated");
  sub->add_option("--layout", o.layout, "compact | expanded")->capture_default_str();
  sub->add_option("--alignment", o.alignment, "expert_alignment of the expanded layout")->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the generated routing (the bench's generator)")->capture_default_str();
  sub->add_option("--groups", o.groups, "group-limited top-k (DeepSeek-V3): experts in this many groups (0 = uniform top-k)")
      ->capture_default_str();
  sub->add_option("--topk-groups", o.topk_groups, "with --groups: a token's experts come from its best this-many groups")
      ->capture_default_str();
  sub->add_option("--schedule", o.schedule, "flat | rotated | grouped:W | hierarchical")->capture_default_str();
  sub->add_option("--queues", o.queues, "queues per rank: 1, 2 or 4")->capture_default_str();
  sub->add_option("--queue-split", o.queue_split, "rr | bytes | a:b[:c...]")->capture_default_str();
  sub->add_option("--aggregate", o.aggregate, "put aggregation limit in bytes (0 = one put per row)")->capture_default_str();
  sub->add_option("--protocol", o.protocol, "explicit | tail | flag")->capture_default_str();
  sub->add_option("--send-policy", o.send_policy,
                  "dispatch send order: auto (from P, row size and the profile's put costs) | whole | block:BYTES")
      ->capture_default_str();
  sub->add_option("--combine-order", o.combine_order,
                  "flat | node-first (hierarchical: the relays sum a token's partials inside each server)")
      ->capture_default_str();
  sub->add_option("--combine-replies", o.combine_replies,
                  "partials | selections (expanded: every (token, expert) row back, the source forms the partials; DeepEP's "
                  "low-latency combine)")
      ->capture_default_str();
  sub->add_option("--relay-chunk", o.relay_chunk,
                  "hierarchical dispatch and combine: relays forward (sum) chunks of BYTES as their senders signal them "
                  "(the stages overlap); auto (from the profile's put costs) | BYTES | 0 = the serial relay")
      ->capture_default_str();
  sub->add_flag("--one-copy", o.one_copy,
                "keep the output pool in model-only mode: rows land in the receiver's output block (expanded: a row per "
                "(token, expert), DeepEP's low-latency dispatch)");
  sub->add_option("--ring-rows", o.ring_rows, "bounded receive ring of this many rows per source (0 = off; BufferConfig::ring_rows)")
      ->capture_default_str();
  sub->add_flag("--steady", o.steady,
                "time a second dispatch and combine after a first pair (the steady state of a model's layers: rows first)");
  sub->add_flag("--cached", o.cached, "--steady with the second dispatch cached (the first one's handle)");
  sub->add_option("--workers", o.workers, "engine worker threads per simulated rank (the model spreads them over the hardware's workers)")
      ->capture_default_str();
  sub->add_option("--run-hidden", o.run_hidden,
                  "0 = auto: the real H in model-only mode; else run the engine at this H in copy mode and scale payload")
      ->capture_default_str();
  sub->add_flag("--dense-scan", o.dense_scan, "model a dense [S, P] route scan instead of the compact plan");
  sub->add_flag("--attribution", o.attribution, "also time each combine with one modelled mechanism removed (docs/sim.md)");
  sub->add_option("--sync", o.sync, "extra modelled synchronisation per call: none | barrier | credits:W")->capture_default_str();
  sub->add_flag("!--no-progress", o.progress, "no progress lines on stderr");
}

// The subcommands that read the parent's options (`*o`) let an unknown option fall through to
// it, so `epx sim experiments --no-progress` means `epx sim --no-progress experiments`.
void add_calibrate(CLI::App* sub, const std::shared_ptr<SimOptions>& o) {
  auto out = std::make_shared<std::string>();
  CLI::App* cal = sub->add_subcommand("calibrate", "fit the profile's \"calibrate\" parameters on its published points marked \"calibrate\"");
  cal->fallthrough();
  cal->add_option("--hardware", o->hardware, "the profile to fit (name or JSON file; as epx sim --hardware)")->capture_default_str();
  cal->add_option("--out", *out, "write the calibrated hardware JSON to FILE")->type_name("FILE");
  auto evaluations = std::make_shared<int>(110);
  cal->add_option("--evaluations", *evaluations, "at most this many model evaluations")->capture_default_str();
  cal->callback([o, out, evaluations] {
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    const Calibration c = calibrate(*o, hw, *evaluations);
    std::fputs(calibration_report(c).c_str(), stdout);
    if (!out->empty()) write_file(*out, sim::to_json(c.model) + "\n");
  });
}

void add_experiments(CLI::App* sub, const std::shared_ptr<SimOptions>& o) {
  CLI::App* exp = sub->add_subcommand("experiments", "the data-plane experiment table at 128 ranks, then a search for the best combination");
  exp->fallthrough();
  exp->add_option("--hardware", o->hardware, "the profile (name or JSON file; as epx sim --hardware)")->capture_default_str();
  exp->callback([o] {
    validate_sim_options(*o);
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    std::fputs(experiments_report(run_experiments(*o, hw), hw).c_str(), stdout);
  });
}

void add_published(CLI::App* sub, const std::shared_ptr<SimOptions>& o) {
  auto pub_hw = std::make_shared<std::string>("all");
  auto pub_json = std::make_shared<std::string>(), pub_svg = std::make_shared<std::string>();
  CLI::App* pub = sub->add_subcommand("published", "every published series of a profile, predicted at its EP sizes, next to the published points");
  pub->fallthrough();
  pub->add_option("--hardware", *pub_hw, "a profile name or JSON file, or all (every built-in profile)")->capture_default_str();
  pub->add_option("--json", *pub_json, "write the predictions and published points as JSON to FILE")->type_name("FILE");
  pub->add_option("--svg", *pub_svg, "draw each series' predictions against its published points to FILE")->type_name("FILE");
  pub->callback([o, pub_hw, pub_json, pub_svg] {
    std::vector<SystemPrediction> systems;
    for (const std::string& name : *pub_hw == "all" ? sim::builtin_hardware_names() : std::vector<std::string>{*pub_hw})
      systems.push_back(predict_published(*o, sim::load_hardware(name)));
    std::fputs(published_table(systems).c_str(), stdout);
    if (!pub_json->empty()) write_file(*pub_json, published_json(systems));
    if (!pub_svg->empty()) write_file(*pub_svg, published_svg(systems));
  });
}

void add_profile(CLI::App* sub) {
  auto prof_hw = std::make_shared<std::string>("ascend950-supernode");
  CLI::App* prof = sub->add_subcommand("profile", "print a hardware profile as JSON (parameters with unit and source, published series)");
  prof->add_option("--hardware", *prof_hw, "a profile name or JSON file")->capture_default_str();
  prof->callback([prof_hw] { std::fputs((sim::to_json(sim::load_hardware(*prof_hw)) + "\n").c_str(), stdout); });
}

void add_ledger(CLI::App* sub) {
  auto lo = std::make_shared<SimOptions>();
  CLI::App* led = sub->add_subcommand("ledger", "bytes per token and per layer per EP size: closed form vs the engine's counters");
  add_shape_options(led, *lo, "EP sizes, comma-separated");
  led->add_option("--topology", lo->topology, "rank positions (servers for the cross-server columns); auto as for epx sim")
      ->capture_default_str();
  led->add_option("--seed", lo->seed, "seed of the uniform top-k routing")->capture_default_str();
  led->add_flag("!--no-progress", lo->progress, "no progress lines on stderr");
  led->add_option("--json", lo->json, "write one JSON object per EP size to FILE")->type_name("FILE");
  led->add_option("--svg", lo->svg, "draw bytes per layer per rank against EP size to FILE")->type_name("FILE");
  led->callback([lo] {
    validate_sim_options(*lo);
    const std::vector<LedgerRow> rows = ledger(*lo);
    std::fputs(ledger_table(rows, *lo).c_str(), stdout);
    if (!lo->json.empty()) write_file(lo->json, ledger_json(rows));
    if (!lo->svg.empty()) write_file(lo->svg, ledger_svg(rows));
  });
}

void add_hybridep(CLI::App* sub) {
  auto ho = std::make_shared<HybridOptions>();
  auto hw_name = std::make_shared<std::string>("ascend950-supernode");
  CLI::App* hyb = sub->add_subcommand("hybridep", "time per layer when a fraction p of the experts is copied across a slow link instead of sending tokens");
  hyb->add_option("--hardware", *hw_name, "profile of the inside of a domain (link_bandwidth, link_latency)")->capture_default_str();
  hyb->add_option("--ep", ho->ranks, "R: all ranks")->capture_default_str();
  hyb->add_option("--domains", ho->domains, "D: domains joined by the slow link")->capture_default_str();
  add_shape_flags(hyb, ho->tokens, ho->hidden, ho->topk, ho->experts, ho->fp8, "dispatch bf16 rows (default: fp8 + scales)",
                  "dispatch fp8 rows with float32 scales (the default)");
  hyb->add_option("--p", ho->p, "fractions of the other domains' experts copied, comma-separated")->delimiter(',')->capture_default_str();
  hyb->add_option("--cross-bandwidth", ho->cross_bandwidth, "slow link, GB/s per domain each direction")->capture_default_str();
  hyb->add_option("--cross-latency", ho->cross_latency_us, "slow link, one-way latency in us")->capture_default_str();
  hyb->add_option("--expert-intermediate", ho->expert_intermediate, "I: an expert has 3 x H x I weights")->capture_default_str();
  hyb->add_option("--weight-bytes", ho->weight_bytes, "bytes per expert weight (1 = fp8, 2 = bf16)")->capture_default_str();
  hyb->add_option("--compression", ho->compression, "bytes on the link per weight byte (0.25 = 4x compression)")->capture_default_str();
  hyb->add_option("--compute", ho->compute_us, "expert compute per layer the all-gather can hide behind, us")->capture_default_str();
  hyb->add_option("--overlap", ho->overlap, "fraction of --compute usable to hide the all-gather (0..1)")->capture_default_str();
  hyb->add_option("--json", ho->json, "write the sweep as JSON to FILE")->type_name("FILE");
  hyb->callback([ho, hw_name] {
    const sim::HardwareModel hw = sim::load_hardware(*hw_name);
    const std::vector<HybridPoint> points = hybrid_sweep(*ho, hw);
    std::fputs(hybrid_table(points, *ho, hw).c_str(), stdout);
    if (!ho->json.empty()) write_file(ho->json, hybrid_json(points, *ho));
  });
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimOptions>();
  auto html = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("sim", "simulate dispatch/combine on a model of a supernode (the real engine, simulated time)");
  add_sim_options(sub, *o);
  sub->add_option("--json", o->json, "write one JSON object per EP size to FILE")->type_name("FILE");
  sub->add_option("--svg", o->svg, "draw GB/s per rank against EP size to FILE")->type_name("FILE");
  sub->add_option("--html", *html,
                  "write the predictions as one self-contained HTML page to FILE: GB/s against EP size with the published "
                  "points, latency, the time split (no network)")
      ->type_name("FILE");
  sub->require_subcommand(0, 1);
  add_calibrate(sub, o);
  add_experiments(sub, o);
  add_published(sub, o);
  add_profile(sub);
  add_ledger(sub);
  add_hybridep(sub);
  sub->callback([o, sub, html] {
    if (!sub->get_subcommands().empty()) return;
    validate_sim_options(*o);
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    const std::vector<SimPoint> points = simulate(*o, hw);
    const std::string table = sim_table(points, hw);
    std::fputs(table.c_str(), stdout);
    if (!o->json.empty()) write_file(o->json, sim_json(points));
    if (!o->svg.empty()) write_file(o->svg, sim_svg(points, hw));
    if (!html->empty()) {
      write_sim_html(*html, *o, {SimPageProfile{&hw, points, published_points(hw)}}, table);
      std::printf("wrote %s (open it in a browser)\n", html->c_str());
    }
  });
}

}  // namespace epx::tools
