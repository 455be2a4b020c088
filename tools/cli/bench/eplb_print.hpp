// `epx bench --eplb`: what the command prints and writes of an EplbReport.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

#include "epx/bench/eplb.hpp"

namespace epx::tools {

/// The EPLB section of the text report.
void print_eplb_report(std::FILE* f, const EplbReport& e);

/// The "eplb" object of --json.
nlohmann::ordered_json eplb_json(const EplbReport& e);

}  // namespace epx::tools
