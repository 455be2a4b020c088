// The registry of completion protocols: every protocol's unit with its row of the support
// table (spi::ProtocolRule), both defined in the protocol's own file. The built-in ones are
// named below once each (the library is a static archive: the linker takes a protocol's
// file only if something names it); one from outside registers itself the same way
// (add_protocol, or RegisteredProtocol for a scope: tests/recipes/toy_protocol_test.cpp).
#include <algorithm>
#include <string>

#include "../protocol.hpp"

namespace epx::detail {
namespace {

struct Registry {
  std::vector<const ProtocolUnit*> units;  // by Protocol value (spi::kProtocols)
  std::vector<const spi::ProtocolRule*> rows;
};

void add_to(Registry& r, const ProtocolUnit& protocol) {
  const spi::ProtocolRule& row = protocol.rule;
  for (const ProtocolUnit* u : r.units)
    if (u->rule.protocol == row.protocol || std::string(u->rule.name) == row.name)
      throw Error(ErrorCode::kInvalidArgument, std::string("protocol '") + row.name + "' (value " +
                                                   std::to_string(static_cast<int>(row.protocol)) +
                                                   "): a protocol with that value or name ('" + u->rule.name + "') is registered");
  if (static_cast<int>(row.paths_as) < 0 || static_cast<int>(row.paths_as) > static_cast<int>(Protocol::kFlag))
    throw Error(ErrorCode::kInvalidArgument, std::string("protocol '") + row.name + "': paths_as must name explicit, tail or flag");
  const auto at = std::upper_bound(r.units.begin(), r.units.end(), &protocol, [](const ProtocolUnit* a, const ProtocolUnit* b) {
    return a->rule.protocol < b->rule.protocol;
  });
  r.rows.insert(r.rows.begin() + (at - r.units.begin()), &row);
  r.units.insert(at, &protocol);
}

Registry& registry() {
  static Registry r = [] {
    Registry built_in;
    for (const ProtocolUnit* p : {&explicit_protocol(), &tail_protocol(), &flag_protocol()}) add_to(built_in, *p);
    return built_in;
  }();
  return r;
}

}  // namespace

void add_protocol(const ProtocolUnit& protocol) { add_to(registry(), protocol); }

void remove_protocol(Protocol p) {
  Registry& r = registry();
  std::erase_if(r.units, [p](const ProtocolUnit* u) { return u->rule.protocol == p; });
  std::erase_if(r.rows, [p](const spi::ProtocolRule* row) { return row->protocol == p; });
}

const CompletionProtocol& protocol_unit(Protocol p) {
  for (const ProtocolUnit* u : registry().units)
    if (u->rule.protocol == p) return u->unit;
  throw Error(ErrorCode::kInternal, "no completion protocol registered as " + std::to_string(static_cast<int>(p)));
}

}  // namespace epx::detail

namespace epx::spi {

RowIterator<ProtocolRule> ProtocolRows::begin() const { return RowIterator<ProtocolRule>(detail::registry().rows.data()); }
RowIterator<ProtocolRule> ProtocolRows::end() const {
  const auto& rows = detail::registry().rows;
  return RowIterator<ProtocolRule>(rows.data() + rows.size());
}
std::size_t ProtocolRows::size() const { return detail::registry().rows.size(); }

const ProtocolRule* find_rule(Protocol p) noexcept {
  for (const ProtocolRule* row : detail::registry().rows)
    if (row->protocol == p) return row;
  return nullptr;
}

const ProtocolRule& rule(Protocol p) {
  if (const ProtocolRule* row = find_rule(p)) return *row;
  throw Error(ErrorCode::kInternal, "protocol " + std::to_string(static_cast<int>(p)) + " is not registered");
}

}  // namespace epx::spi
