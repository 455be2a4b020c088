#include "epx/bench/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace epx::tools {

double progress_eta_seconds(double elapsed_s, double done, double total) noexcept {
  if (!(total > 0) || !(done > 0) || !(elapsed_s >= 0)) return -1;
  if (done >= total) return 0;
  return elapsed_s * (total - done) / done;
}

std::string progress_duration_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[64];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%ld s", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ld min %02ld s", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld h %02ld min", s / 3600, s / 60 % 60);
  return buf;
}

std::string progress_text(const std::string& prefix, const std::string& what, double elapsed_s, double done, double total) {
  std::string text = prefix + ": " + what + "  [";
  if (total > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.0f%%, ", 100 * std::min(1.0, std::max(0.0, done / total)));
    text += pct;
  }
  text += progress_duration_text(elapsed_s) + " so far";
  const double eta = progress_eta_seconds(elapsed_s, done, total);
  if (eta >= 0 && done < total) text += ", ~" + progress_duration_text(eta) + " left";
  return text + "]";
}

ProgressLine::ProgressLine(std::string prefix, double total, bool enabled)
    : prefix_(std::move(prefix)), total_(total), on_(enabled && isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressLine::~ProgressLine() { finish(); }

void ProgressLine::update(double done, const std::string& what) {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && !(total_ > 0 && done >= total_)) return;
  last_draw_ = now;
  last_text_ = progress_text(prefix_, what, std::chrono::duration<double>(now - start_).count(), done, total_);
  std::fprintf(stderr, "\r\033[K%s", last_text_.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::note(const std::string& message) {
  if (!on_) return;
  std::fprintf(stderr, "\r\033[K%s: %s\n", prefix_.c_str(), message.c_str());
  if (drawn_) std::fprintf(stderr, "%s", last_text_.c_str());
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (!on_ || !drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace epx::tools
