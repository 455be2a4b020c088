// BufferBase: the endpoint, the lifecycle, and the agreement rounds every buffer kind uses.
//
// The base's agreement area lies after the kind's bytes (page aligned): two parities of P
// slots of kSlotBytes, one slot per source rank. One round (epoch e): every rank puts its
// message into slot [e % 2][rank] of every peer, then signals the base's slot `rank` with e,
// then waits for every peer's signal >= e and reads the P messages from its own window. Two
// parities suffice: a rank reaches round e + 2 (parity of e again) only after every peer
// signalled round e + 1, i.e. after every peer finished reading round e.
#include "epx/buffer_base.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

namespace epx {

namespace {

constexpr std::size_t kSlotBytes = 8192;
constexpr std::size_t kPage = 4096;
constexpr std::int32_t kOk = -1;

struct SlotHeader {
  std::uint32_t length;  // bytes of text after the header
  std::int32_t code;     // kOk, or an ErrorCode
  std::uint32_t flags;   // round-specific bits (destroy: 1 = sole owner of the endpoint)
  std::uint32_t pad;
};
constexpr std::size_t kTextBytes = kSlotBytes - sizeof(SlotHeader);

std::size_t page_up(std::size_t v) { return (v + kPage - 1) / kPage * kPage; }

// "name=value\n" lines; values too long for a slot are replaced by their hash ("#...").
std::string encode_values(const std::vector<AgreedValue>& values, std::size_t room) {
  std::string s;
  for (const AgreedValue& v : values) s += v.name + "=" + v.value + "\n";
  if (s.size() <= room) return s;
  s.clear();
  for (const AgreedValue& v : values) s += v.name + "=#" + std::to_string(std::hash<std::string>{}(v.value)) + "\n";
  return s;
}

std::vector<std::pair<std::string, std::string>> decode_values(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t end = s.find('\n', at);
    const std::string line = s.substr(at, end - at);
    const std::size_t eq = line.find('=');
    out.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
    at = end == std::string::npos ? s.size() : end + 1;
  }
  return out;
}

}  // namespace

using Message = detail::RoundMessage;

// One round of the agreement protocol over the endpoint: every rank's message, by rank.
class AgreementRound {
 public:
  AgreementRound(Transport& t, std::size_t area, std::size_t signal_base, std::uint64_t epoch, const char* phase)
      : t_(t), area_(area), signal_base_(signal_base), epoch_(epoch), phase_(phase) {}

  std::vector<Message> run(const Message& mine) {
    const int P = t_.num_ranks(), me = t_.rank();
    std::vector<std::byte> bytes(sizeof(SlotHeader) + std::min(mine.text.size(), kTextBytes));
    SlotHeader h{static_cast<std::uint32_t>(bytes.size() - sizeof(SlotHeader)), mine.code, mine.flags, 0};
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, mine.text.data(), h.length);
    for (int p = 0; p < P; ++p) t_.put(p, slot(me), bytes.data(), bytes.size(), 0);
    t_.quiet(0);
    for (int p = 0; p < P; ++p) t_.signal(p, signal_base_ + static_cast<std::size_t>(me), epoch_, 0);
    for (int p = 0; p < P; ++p) t_.wait_signal(signal_base_ + static_cast<std::size_t>(p), epoch_, {phase_, p});
    std::vector<Message> all(static_cast<std::size_t>(P));
    for (int p = 0; p < P; ++p) {
      const std::byte* at = t_.window() + slot(p);
      SlotHeader ph;
      std::memcpy(&ph, at, sizeof ph);
      Message& m = all[static_cast<std::size_t>(p)];
      m.code = ph.code, m.flags = ph.flags;
      m.text.assign(reinterpret_cast<const char*>(at + sizeof ph), std::min<std::size_t>(ph.length, kTextBytes));
    }
    return all;
  }

 private:
  std::size_t slot(int src) const {
    const std::size_t P = static_cast<std::size_t>(t_.num_ranks());
    return area_ + ((epoch_ % 2) * P + static_cast<std::size_t>(src)) * kSlotBytes;
  }
  Transport& t_;
  std::size_t area_, signal_base_;
  std::uint64_t epoch_;
  const char* phase_;
};

namespace {
std::size_t area_bytes(int P) { return 2 * static_cast<std::size_t>(P) * kSlotBytes; }
}  // namespace

BufferBase::BufferBase(Transport& transport, const char* kind)
    : transport_(&transport), kind_(kind), rank_(transport.rank()), num_ranks_(transport.num_ranks()) {
  std::unique_ptr<Transport> own = transport.open_endpoint();
  if (own != nullptr)
    endpoint_ = std::shared_ptr<Transport>(std::move(own));
  else
    endpoint_ = std::shared_ptr<Transport>(std::shared_ptr<Transport>{}, &transport);  // not owned
  allocate(0, 0);
}

BufferBase::~BufferBase() {
  // Local: a destructor may run while this rank unwinds from an error its peers do not share,
  // so it must not wait for them. The endpoint releases what it can on its own (a mapped
  // window is unmapped; OpenSHMEM's collective free is left to the job's end).
  endpoint_.reset();
}

std::size_t BufferBase::window_bytes() const noexcept { return endpoint_ ? endpoint_->window_bytes() : 0; }

std::byte* BufferBase::window() noexcept { return endpoint_ ? endpoint_->window() : nullptr; }

void BufferBase::require_alive(const char* call) const {
  if (destroyed_)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(rank_) + ": " + kind_ + "." + call + ": the buffer was destroyed", rank_);
}

Transport& BufferBase::endpoint(const char* call) {
  require_alive(call);
  return *endpoint_;
}

std::shared_ptr<Transport> BufferBase::endpoint_ref() const noexcept { return endpoint_; }

const Transport& BufferBase::transport() const {
  require_alive("transport");
  return *endpoint_;
}

void BufferBase::allocate(std::size_t bytes, std::size_t num_signals) {
  Transport& t = endpoint("allocate");
  user_bytes_ = bytes;
  user_signals_ = num_signals;
  t.allocate(page_up(bytes) + area_bytes(num_ranks_), num_signals + static_cast<std::size_t>(num_ranks_));
}

std::vector<detail::RoundMessage> BufferBase::round(const detail::RoundMessage& mine, const char* phase) {
  Transport& t = endpoint(phase);
  AgreementRound r(t, page_up(user_bytes_), user_signals_, ++agree_epoch_, phase);
  return r.run(mine);
}

std::vector<AgreedValue> BufferBase::plan_values(const BufferAllocator& plan) {
  std::vector<AgreedValue> v;
  v.push_back({"plan entries", std::to_string(plan.tensors().size())});
  for (std::size_t i = 0; i < plan.tensors().size(); ++i)
    v.push_back({"plan entry " + std::to_string(i), to_string(plan.tensors()[i])});
  return v;
}

void BufferBase::agree(const std::vector<AgreedValue>& values, const std::string& problem) {
  const std::string phase = std::string(kind_) + " create";
  Message mine;
  mine.code = problem.empty() ? kOk : static_cast<std::int32_t>(ErrorCode::kInvalidArgument);
  mine.text = problem.empty() ? encode_values(values, kTextBytes) : problem.substr(0, kTextBytes);
  const std::vector<Message> all = round(mine, phase.c_str());
  for (int p = 0; p < num_ranks_; ++p)
    if (all[static_cast<std::size_t>(p)].code != kOk)
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(p) + ": " + all[static_cast<std::size_t>(p)].text, p);
  const auto base = decode_values(all[0].text);
  for (int p = 1; p < num_ranks_; ++p) {
    const auto theirs = decode_values(all[static_cast<std::size_t>(p)].text);
    for (std::size_t i = 0; i < std::max(base.size(), theirs.size()); ++i) {
      const std::string name = i < theirs.size() ? theirs[i].first : base[i].first;
      const std::string a = i < theirs.size() ? theirs[i].second : "(missing)";
      const std::string b = i < base.size() ? base[i].second : "(missing)";
      if (i < theirs.size() && i < base.size() && theirs[i].first != base[i].first)
        throw Error(ErrorCode::kInvalidArgument,
                    "rank " + std::to_string(p) + ": " + kind_ + " config differs from rank 0's: entry " +
                        std::to_string(i) + " is '" + theirs[i].first + "' vs '" + base[i].first + "'",
                    p);
      if (a != b) {
        const bool hashed = a.starts_with("#") && b.starts_with("#");
        throw Error(ErrorCode::kInvalidArgument,
                    "rank " + std::to_string(p) + ": " + kind_ + " config differs from rank 0's: " + name +
                        (hashed ? " (too long to show)" : " = " + a + " vs " + b),
                    p);
      }
    }
  }
}

void BufferBase::agree_call(const char* call, const std::optional<CallProblem>& mine) {
  Message m;
  if (mine) m.code = static_cast<std::int32_t>(mine->code), m.text = mine->message.substr(0, kTextBytes);
  const std::vector<Message> all = round(m, call);
  std::vector<std::optional<CallProblem>> problems(all.size());
  for (std::size_t p = 0; p < all.size(); ++p)
    if (all[p].code != kOk) problems[p] = CallProblem{static_cast<ErrorCode>(all[p].code), all[p].text};
  resolve_call_problems(call, problems);
}

void BufferBase::destroy() {
  if (destroyed_) return;
  on_destroy();
  std::shared_ptr<Transport> ep = endpoint_;
  // Every rank stops using the buffer (the round is a barrier). The window goes collectively
  // where no rank still holds a tensor over it (allocate(0, 0): OpenSHMEM frees there);
  // otherwise each rank's endpoint goes with the last tensor over its window.
  const bool owned = ep.use_count() == 2 && ep.get() != transport_;  // ours and this copy
  Message m;
  m.flags = owned ? 1u : 0u;
  std::vector<Message> all;
  try {
    all = round(m, (std::string(kind_) + " destroy").c_str());
  } catch (...) {
    destroyed_ = true;
    endpoint_.reset();
    throw;
  }
  destroyed_ = true;
  const bool all_owned = std::all_of(all.begin(), all.end(), [](const Message& x) { return x.flags == 1u; });
  if (all_owned || ep.get() == transport_) ep->allocate(0, 0);
  endpoint_.reset();
}

}  // namespace epx
