// epx/sim/units.hpp — strong unit types of the simulator, so times, byte counts and
// bandwidths cannot be mixed up. Time is integer picoseconds (exact, deterministic ordering).
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>

namespace epx::sim {

/// A point or span of simulated time, in picoseconds.
struct Picoseconds {
  std::int64_t ps = 0;
  constexpr auto operator<=>(const Picoseconds&) const = default;
  constexpr Picoseconds operator+(Picoseconds o) const { return {ps + o.ps}; }
  constexpr Picoseconds operator-(Picoseconds o) const { return {ps - o.ps}; }
  constexpr Picoseconds& operator+=(Picoseconds o) {
    ps += o.ps;
    return *this;
  }
  constexpr Picoseconds operator*(std::int64_t n) const { return {ps * n}; }
  constexpr double us() const { return static_cast<double>(ps) * 1e-6; }
  constexpr double seconds() const { return static_cast<double>(ps) * 1e-12; }
};

/// Nanoseconds as the parameter files give them; converts exactly-enough to picoseconds.
struct Nanoseconds {
  double ns = 0;
  Picoseconds to_ps() const { return {std::llround(ns * 1000.0)}; }
};
constexpr Picoseconds max(Picoseconds a, Picoseconds b) { return a < b ? b : a; }
constexpr Picoseconds min(Picoseconds a, Picoseconds b) { return b < a ? b : a; }

struct Bytes {
  std::uint64_t n = 0;
  constexpr auto operator<=>(const Bytes&) const = default;
  constexpr Bytes operator+(Bytes o) const { return {n + o.n}; }
};

/// Bandwidth in GB/s (1e9 bytes per second).
struct GBps {
  double gbps = 0;
  /// Time to move `b` at this rate (0 bandwidth = infinitely fast).
  Picoseconds time_for(Bytes b) const {
    if (gbps <= 0) return {0};
    return {std::llround(static_cast<double>(b.n) * 1000.0 / gbps)};  // bytes / (GB/s) = ns
  }
};

/// Bytes moved in a span, as GB/s.
inline double rate_gbps(Bytes b, Picoseconds t) {
  return t.ps > 0 ? static_cast<double>(b.n) * 1000.0 / static_cast<double>(t.ps) : 0.0;
}

}  // namespace epx::sim
