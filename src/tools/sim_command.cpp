// `epx sim`: the real engine on simulator ranks, times from the discrete-event model.
//   epx sim [--ep 8,16,32,64,128] [shape] [data plane] [--json FILE] [--svg FILE]
//   epx sim calibrate [--out FILE]     fit the profile's free parameters (docs/sim.md)
//   epx sim experiments                the experiment table at 128 ranks + a search
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.hpp"
#include "epx/error.hpp"
#include "sim_calibrate.hpp"
#include "file_io.hpp"
#include "sim_run.hpp"

namespace epx::tools {

namespace {

void write_file(const std::string& path, const std::string& text) { write_text_file(path, "output", text); }

void add_sim_options(CLI::App* sub, SimOptions& o) {
  sub->add_option("--hardware", o.hardware, "hardware profile name (ascend950-supernode) or JSON file")->capture_default_str();
  sub->add_option("--topology", o.topology,
                  "rank positions for the engine and the model: builtin:flat | builtin:servers:N | builtin:supernode128 | "
                  "FILE.json; auto = builtin:supernode128 at 128 ranks, else builtin:servers:8")
      ->capture_default_str();
  sub->add_option("--ep", o.ep, "EP sizes to simulate, comma-separated")->delimiter(',')->capture_default_str();
  sub->add_option("--tokens", o.tokens, "S: tokens per rank")->capture_default_str();
  sub->add_option("--hidden", o.hidden, "H: hidden size")->capture_default_str();
  sub->add_option("--topk", o.topk, "K: experts per token")->capture_default_str();
  sub->add_option("--experts", o.experts, "E: experts")->capture_default_str();
  sub->add_flag("!--bf16", o.fp8, "dispatch bf16 x (default: FP8 E4M3 with row-major float32 scales)");
  sub->add_flag("--fp8", o.fp8, "dispatch FP8 E4M3 x with float32 scales (the default)");
  sub->add_option("--layout", o.layout, "compact | expanded")->capture_default_str();
  sub->add_option("--alignment", o.alignment, "expert_alignment of the expanded layout")->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the uniform top-k routing (the bench's generator)")->capture_default_str();
  sub->add_option("--schedule", o.schedule, "flat | rotated | grouped:W | hierarchical")->capture_default_str();
  sub->add_option("--queues", o.queues, "queues per rank: 1, 2 or 4")->capture_default_str();
  sub->add_option("--queue-split", o.queue_split, "rr | bytes | a:b[:c...]")->capture_default_str();
  sub->add_option("--aggregate", o.aggregate, "put aggregation limit in bytes (0 = one put per row)")->capture_default_str();
  sub->add_option("--protocol", o.protocol, "explicit | tail | flag")->capture_default_str();
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
  sub->add_option("--sync", o.sync, "extra modelled synchronisation per call: none | barrier | credits:W")->capture_default_str();
  sub->add_flag("!--no-progress", o.progress, "no progress lines on stderr");
}

}  // namespace

void add_sim_command(CLI::App& app) {
  auto o = std::make_shared<SimOptions>();
  auto out = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("sim", "simulate dispatch/combine on a model of a supernode (the real engine, simulated time)");
  add_sim_options(sub, *o);
  sub->add_option("--json", o->json, "write one JSON object per EP size to FILE")->type_name("FILE");
  sub->add_option("--svg", o->svg, "draw GB/s per rank against EP size to FILE")->type_name("FILE");
  sub->require_subcommand(0, 1);

  CLI::App* cal = sub->add_subcommand("calibrate", "fit the profile's free parameters on the published EP8/16/32 points");
  cal->add_option("--out", *out, "write the calibrated hardware JSON to FILE")->type_name("FILE");
  cal->callback([o, out] {
    validate_sim_options(*o);
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    const Calibration c = calibrate(*o, hw);
    std::fputs(calibration_report(c).c_str(), stdout);
    if (!out->empty()) write_file(*out, sim::to_json(c.model) + "\n");
  });

  CLI::App* exp = sub->add_subcommand("experiments", "the data-plane experiment table at 128 ranks, then a search for the best combination");
  exp->callback([o] {
    validate_sim_options(*o);
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    std::fputs(run_experiments(*o, hw).c_str(), stdout);
  });

  sub->callback([o, sub] {
    if (!sub->get_subcommands().empty()) return;
    validate_sim_options(*o);
    const sim::HardwareModel hw = sim::load_hardware(o->hardware);
    const std::vector<SimPoint> points = simulate(*o, hw);
    std::fputs(sim_table(points, hw).c_str(), stdout);
    if (!o->json.empty()) write_file(o->json, sim_json(points));
    if (!o->svg.empty()) write_file(o->svg, sim_svg(points, hw));
  });
}

}  // namespace epx::tools
