// A text log rotated by size (DiagnoseOptions::log_dir): file.log -> file.log.1 -> ... ->
// file.log.<backups>, the oldest dropped. Private to src/diagnose.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace epx::detail {

class RotatingLog {
 public:
  /// Creates `dir` if needed; throws kIo if it cannot.
  RotatingLog(const std::filesystem::path& dir, const std::string& name, std::uint64_t max_bytes, int backups);
  /// Appends `text`, rotating first if the file would pass max_bytes. Throws kIo on failure.
  void append(const std::string& text);
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void rotate();
  std::filesystem::path path_;
  std::uint64_t max_bytes_;
  int backups_;
};

}  // namespace epx::detail
