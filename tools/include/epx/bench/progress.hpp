// The progress line of epx's long runs (`epx bench` iterations and sweeps, `epx sim` over EP
// sizes, calibration, experiments): one line on stderr, redrawn in place, with what runs now,
// the time so far and an estimate of the time left. Only on a terminal: with stderr a file or
// a pipe (logs, CI) or with --no-progress it prints nothing.
#pragma once

#include <chrono>
#include <string>

namespace epx::tools {

/// The estimate of the time left, in seconds, when `done` of `total` units of work took
/// `elapsed_s` (the rate so far); negative when there is none yet (nothing done, or no total).
double progress_eta_seconds(double elapsed_s, double done, double total) noexcept;

/// A duration as the line shows it: "42 s", "3 min 05 s", "1 h 02 min".
std::string progress_duration_text(double seconds);

/// The line's text (without the terminal's redraw codes): "<prefix>: <what>  [<pct>%, <elapsed>
/// so far, ~<eta> left]" (the estimate once some work is done; the percentage with a total).
std::string progress_text(const std::string& prefix, const std::string& what, double elapsed_s, double done, double total);

class ProgressLine {
 public:
  /// `total`: units of work of the whole run in any unit (iterations, ranks x EP sizes, ...;
  /// <= 0: unknown, no estimate). Shown only if `enabled` and stderr is a terminal.
  ProgressLine(std::string prefix, double total, bool enabled);
  ~ProgressLine();  ///< clears the line
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  /// `done` units finished so far, `what` runs now. Redrawn at most every 100 ms (and always
  /// when done reaches the total).
  void update(double done, const std::string& what);
  /// A message of its own line above the progress line (e.g. a skipped sweep combination).
  void note(const std::string& message);
  /// Clears the line (the destructor does it too).
  void finish();
  bool shown() const noexcept { return on_; }

 private:
  std::string prefix_;
  double total_;
  bool on_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::string last_text_;
};

}  // namespace epx::tools
