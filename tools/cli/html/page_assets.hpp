// The report page's script and style sheet (report.js, report.css in this folder), compiled
// in by embed.cmake so a page needs nothing but itself.
#pragma once

namespace epx::tools::page_assets {

extern const char* const kScript;
extern const char* const kStyle;

}  // namespace epx::tools::page_assets
