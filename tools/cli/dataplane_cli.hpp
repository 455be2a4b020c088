// The data-plane flags of `epx bench` and `epx replay` (CLI11), over the text forms of
// epx/bench/dataplane_options.hpp (one parser per option, shared with --sweep).
#pragma once

#include <CLI/CLI.hpp>

#include "epx/dataplane.hpp"

namespace epx::tools {

/// Registers the data-plane flags (--topology, --schedule, --queues, ..., --path: one per
/// dataplane_option_names()) on `sub`, writing into `d`; a bad value is a CLI parse error naming the option.
void add_dataplane_options(CLI::App* sub, DataPlaneOptions& d);

}  // namespace epx::tools
