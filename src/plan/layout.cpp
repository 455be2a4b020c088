#include <cstring>

#include "epx/plan.hpp"

namespace epx {

DispatchLayout make_dispatch_layout(const RoutingPlan& plan) {
  const RoutingShape& s = plan.shape;
  DispatchLayout out;
  out.num_tokens_per_rank.resize(static_cast<std::size_t>(s.num_ranks));
  for (int d = 0; d < s.num_ranks; ++d) out.num_tokens_per_rank[static_cast<std::size_t>(d)] = plan.tokens_to(d);
  out.num_tokens_per_expert = plan.slots_per_expert;
  out.is_token_in_rank = Tensor::zeros(DType::kBool, {s.num_tokens, s.num_ranks});
  auto* in_rank = out.is_token_in_rank.as<std::uint8_t>();
  for (std::int64_t t = 0; t < s.num_tokens; ++t)
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i)
      in_rank[t * s.num_ranks + plan.entry_rank[static_cast<std::size_t>(i)]] = 1;
  return out;
}

}  // namespace epx
