// Text forms of the data-plane options (command line, JSON, error messages).
#include <charconv>

#include "epx/dataplane.hpp"
#include "epx/error.hpp"

namespace epx {

namespace {
[[noreturn]] void bad(const std::string& what, const std::string& text, const char* accepted) {
  throw Error(ErrorCode::kInvalidArgument, what + " '" + text + "' is not one of: " + accepted);
}

bool parse_positive(std::string_view s, int& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out > 0;
}
}  // namespace

Schedule parse_schedule(const std::string& text) {
  constexpr const char* kAccepted = "flat, rotated, grouped:W (W a positive integer), hierarchical";
  if (text == "flat") return {ScheduleKind::kFlat, 0};
  if (text == "rotated") return {ScheduleKind::kRotated, 0};
  if (text == "hierarchical") return {ScheduleKind::kHierarchical, 0};
  if (text.rfind("grouped:", 0) == 0) {
    int w = 0;
    if (parse_positive(std::string_view(text).substr(8), w)) return {ScheduleKind::kGrouped, w};
  }
  bad("schedule", text, kAccepted);
}

std::string to_string(const Schedule& s) {
  switch (s.kind) {
    case ScheduleKind::kFlat: return "flat";
    case ScheduleKind::kRotated: return "rotated";
    case ScheduleKind::kGrouped: return "grouped:" + std::to_string(s.group_width);
    case ScheduleKind::kHierarchical: return "hierarchical";
  }
  return "?";
}

QueueSplit parse_queue_split(const std::string& text) {
  constexpr const char* kAccepted = "rr, bytes, or a ratio a:b[:c...] of positive integers (1:1, 3:1, 1:3)";
  if (text == "rr") return {QueueSplitKind::kRoundRobin, {}};
  if (text == "bytes") return {QueueSplitKind::kBytes, {}};
  QueueSplit split{QueueSplitKind::kRatio, {}};
  std::string_view rest(text);
  while (true) {
    const auto colon = rest.find(':');
    int w = 0;
    if (!parse_positive(rest.substr(0, colon), w)) bad("queue split", text, kAccepted);
    split.ratio.push_back(w);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (split.ratio.size() < 2) bad("queue split", text, kAccepted);
  return split;
}

std::string to_string(const QueueSplit& s) {
  if (s.kind == QueueSplitKind::kRoundRobin) return "rr";
  if (s.kind == QueueSplitKind::kBytes) return "bytes";
  std::string out;
  for (std::size_t i = 0; i < s.ratio.size(); ++i) out += (i ? ":" : "") + std::to_string(s.ratio[i]);
  return out;
}

Protocol parse_protocol(const std::string& text) {
  if (text == "explicit") return Protocol::kExplicit;
  if (text == "tail") return Protocol::kTail;
  if (text == "flag") return Protocol::kFlag;
  bad("protocol", text, "explicit, tail, flag");
}

const char* to_string(Protocol p) noexcept {
  switch (p) {
    case Protocol::kExplicit: return "explicit";
    case Protocol::kTail: return "tail";
    case Protocol::kFlag: return "flag";
  }
  return "?";
}

CombineOrder parse_combine_order(const std::string& text) {
  if (text == "flat") return CombineOrder::kFlat;
  if (text == "node-first") return CombineOrder::kNodeFirst;
  bad("combine order", text, "flat, node-first");
}

const char* to_string(CombineOrder o) noexcept {
  switch (o) {
    case CombineOrder::kFlat: return "flat";
    case CombineOrder::kNodeFirst: return "node-first";
  }
  return "?";
}

CombineReplies parse_combine_replies(const std::string& text) {
  if (text == "partials") return CombineReplies::kPartials;
  if (text == "selections") return CombineReplies::kSelections;
  bad("combine replies", text, "partials, selections");
}

const char* to_string(CombineReplies r) noexcept {
  switch (r) {
    case CombineReplies::kPartials: return "partials";
    case CombineReplies::kSelections: return "selections";
  }
  return "?";
}

}  // namespace epx
