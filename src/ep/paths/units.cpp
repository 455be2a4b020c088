// The registry of data paths: every path's unit with its row of the support table
// (spi::PathRule), both defined in the path's own file. The built-in ones are named below
// once each — the library is a static archive, and the linker takes a path's file only if
// something names it — and a path from outside registers itself the same way (add_path, or
// RegisteredPath for a scope: tests/recipes/toy_path_test.cpp).
#include <algorithm>
#include <string>

#include "../path.hpp"

namespace epx::detail {
namespace {

struct Registry {
  std::vector<const PathUnit*> order;     // registration order (base_path asks the last first)
  std::vector<const spi::PathRule*> rows;  // by Path value (spi::kPaths)
};

void add_to(Registry& r, const PathUnit& unit) {
  const spi::PathRule& row = unit.rule;
  const std::string key = row.key;
  for (const PathUnit* u : r.order)
    if (u->rule.path == row.path || key == u->rule.key)
      throw Error(ErrorCode::kInvalidArgument, "path '" + key + "' (value " + std::to_string(static_cast<int>(row.path)) +
                                                   "): a path with that value or key ('" + u->rule.key + "') is registered");
  if (row.dispatch != (unit.dispatch != nullptr) || unit.combine == nullptr)
    throw Error(ErrorCode::kInvalidArgument, "path '" + key + "': its row says dispatch = " + (row.dispatch ? "true" : "false") +
                                                 ", but its unit has " + (unit.dispatch ? "a" : "no") +
                                                 " dispatch side (and every path needs a combine side)");
  r.order.push_back(&unit);
  r.rows.insert(std::upper_bound(r.rows.begin(), r.rows.end(), &row,
                                 [](const spi::PathRule* a, const spi::PathRule* b) { return a->path < b->path; }),
                &row);
}

Registry& registry() {
  static Registry r = [] {
    Registry built_in;
    // The base paths' order does not matter (their base_of never overlap); a path added
    // later is asked before them.
    for (const PathUnit* unit : {&direct_path(), &relay_path(), &ring_path(), &rows_first_path(), &pull_path()})
      add_to(built_in, *unit);
    return built_in;
  }();
  return r;
}

const PathUnit* find_unit(spi::Path p) noexcept {
  for (const PathUnit* u : registry().order)
    if (u->rule.path == p) return u;
  return nullptr;
}

std::string path_name(spi::Path p) {
  const spi::PathRule* row = spi::find_rule(p);
  return row ? std::string("'") + row->key + "'" : std::to_string(static_cast<int>(p)) + " (not registered)";
}

}  // namespace

void add_path(const PathUnit& unit) { add_to(registry(), unit); }

void remove_path(spi::Path p) {
  Registry& r = registry();
  std::erase_if(r.order, [p](const PathUnit* u) { return u->rule.path == p; });
  std::erase_if(r.rows, [p](const spi::PathRule* row) { return row->path == p; });
}

const DispatchPath& dispatch_unit(spi::Path p) {
  const PathUnit* u = find_unit(p);
  if (u == nullptr || u->dispatch == nullptr)
    throw Error(ErrorCode::kInternal, "no dispatch unit for path " + path_name(p) + " (combine only)");
  return *u->dispatch;
}

const CombinePath& combine_unit(spi::Path p) {
  const PathUnit* u = find_unit(p);
  if (u == nullptr) throw Error(ErrorCode::kInternal, "no combine unit for path " + path_name(p));
  return *u->combine;
}

}  // namespace epx::detail

namespace epx::spi {

RowIterator<PathRule> PathRows::begin() const { return RowIterator<PathRule>(detail::registry().rows.data()); }
RowIterator<PathRule> PathRows::end() const {
  const auto& rows = detail::registry().rows;
  return RowIterator<PathRule>(rows.data() + rows.size());
}
std::size_t PathRows::size() const { return detail::registry().rows.size(); }

const PathRule* find_rule(Path p) noexcept {
  for (const PathRule* row : detail::registry().rows)
    if (row->path == p) return row;
  return nullptr;
}

const PathRule& rule(Path p) {
  if (const PathRule* row = find_rule(p)) return *row;
  throw Error(ErrorCode::kInternal, "path " + std::to_string(static_cast<int>(p)) + " is not registered");
}

namespace {

// The registered path whose key is `name` and which can be a base path (has a base_of).
const PathRule* named_base(const std::string& name) noexcept {
  for (const PathRule* row : detail::registry().rows)
    if (row->base_of != nullptr && name == row->key) return row;
  return nullptr;
}

// The last registered path whose base_of takes the config.
const PathRule* first_taker(const BufferConfig& c) noexcept {
  const auto& order = detail::registry().order;
  for (auto u = order.rbegin(); u != order.rend(); ++u)
    if ((*u)->rule.base_of != nullptr && (*u)->rule.base_of(c)) return &(*u)->rule;
  return nullptr;
}

}  // namespace

std::string refuse_path_name(const std::string& name) {
  if (name.empty() || named_base(name) != nullptr) return {};
  std::string bases, variants;
  for (const PathRule* row : detail::registry().rows)
    (row->base_of != nullptr ? bases : variants) += std::string(", '") + row->key + "'";
  return "data-plane path '" + name + "' is not a registered base path; the registered ones: " + bases.substr(2) +
         (variants.empty() ? std::string() : " (" + variants.substr(2) + ": per-call variants, which the calls choose)");
}

std::string refuse_path(const BufferConfig& c) {
  const std::string& name = c.dataplane.path;
  if (std::string why = refuse_path_name(name); !why.empty()) return why;
  if (name.empty() || named_base(name)->base_of(c)) return {};
  const PathRule& row = *named_base(name);
  const PathRule* taker = first_taker(c);
  return "data-plane path '" + name + "'" + (name == row.name ? std::string() : std::string(" (") + row.name + ")") +
         " does not take this buffer's config" +
         (taker ? std::string("; its own base path is '") + taker->key + "'" : std::string());
}

Path base_path(const BufferConfig& c) {
  if (!c.dataplane.path.empty()) {
    if (std::string why = refuse_path(c); !why.empty()) throw Error(ErrorCode::kInvalidArgument, why);
    return named_base(c.dataplane.path)->path;
  }
  if (const PathRule* row = first_taker(c)) return row->path;
  throw Error(ErrorCode::kInternal, "no registered path is the base path of this config");
}

}  // namespace epx::spi
