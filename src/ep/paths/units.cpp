// The path units by the support table's name for them (spi::Path): the one list a new
// path's unit joins.
#include "../path.hpp"

namespace epx::detail {

const DispatchPath& direct_dispatch();
const DispatchPath& rows_first_dispatch();
const DispatchPath& relay_dispatch();
const DispatchPath& ring_dispatch();
const CombinePath& push_combine();
const CombinePath& replies_first_combine();
const CombinePath& relay_combine();
const CombinePath& ring_combine();
const CombinePath& pull_combine();

const DispatchPath& dispatch_unit(spi::Path p) {
  switch (p) {
    case spi::Path::kRowsFirst: return rows_first_dispatch();
    case spi::Path::kRelay: return relay_dispatch();
    case spi::Path::kRing: return ring_dispatch();
    case spi::Path::kDirect: return direct_dispatch();
    case spi::Path::kPull: break;  // combine only
  }
  throw Error(ErrorCode::kInternal, "no dispatch unit for path " + std::to_string(static_cast<int>(p)) + " (pull is combine only)");
}

const CombinePath& combine_unit(spi::Path p) {
  switch (p) {
    case spi::Path::kRowsFirst: return replies_first_combine();
    case spi::Path::kRelay: return relay_combine();
    case spi::Path::kRing: return ring_combine();
    case spi::Path::kPull: return pull_combine();
    case spi::Path::kDirect: return push_combine();
  }
  throw Error(ErrorCode::kInternal, "no combine unit for path " + std::to_string(static_cast<int>(p)));
}

}  // namespace epx::detail
