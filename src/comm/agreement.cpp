#include "epx/spi/agreement.hpp"

namespace epx::spi {

void throw_agreed_error(const char* call, const std::vector<std::optional<CallProblem>>& all, int me) {
  int origin = -1;
  bool same = all.size() > 1;
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (!all[p]) {
      same = false;
      continue;
    }
    if (origin < 0) origin = static_cast<int>(p);
    const CallProblem& first = *all[static_cast<std::size_t>(origin)];
    same = same && all[p]->code == first.code && all[p]->message == first.message;
  }
  if (origin < 0) return;
  const CallProblem& o = *all[static_cast<std::size_t>(origin)];
  const std::string what = (call != nullptr && *call != '\0' ? std::string(call) + ": " : std::string()) + o.message;
  if (same) throw Error(o.code, "every rank: " + what, -1);
  std::string msg = "rank " + std::to_string(origin) + ": " + what;
  const std::optional<CallProblem>& own = me >= 0 && me < static_cast<int>(all.size()) ? all[static_cast<std::size_t>(me)] : std::nullopt;
  if (me != origin && own && own->message != o.message) msg += "; rank " + std::to_string(me) + "'s own problem: " + own->message;
  throw Error(o.code, msg, origin);
}

}  // namespace epx::spi
