#include "rotating_log.hpp"

#include <fstream>
#include <system_error>

#include "epx/error.hpp"

namespace epx::detail {

namespace fs = std::filesystem;

RotatingLog::RotatingLog(const fs::path& dir, const std::string& name, std::uint64_t max_bytes, int backups)
    : path_(dir / name), max_bytes_(max_bytes), backups_(backups) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(ErrorCode::kIo, "diagnose log: cannot create the directory " + dir.string() + ": " + ec.message());
}

namespace {
fs::path numbered(const fs::path& p, int i) { return p.string() + "." + std::to_string(i); }
}  // namespace

void RotatingLog::rotate() {
  std::error_code ec;
  if (backups_ <= 0) {
    fs::remove(path_, ec);
    return;
  }
  fs::remove(numbered(path_, backups_), ec);
  for (int i = backups_ - 1; i >= 1; --i)
    if (fs::exists(numbered(path_, i), ec)) fs::rename(numbered(path_, i), numbered(path_, i + 1), ec);
  fs::rename(path_, numbered(path_, 1), ec);
  if (ec) throw Error(ErrorCode::kIo, "diagnose log: cannot rotate " + path_.string() + ": " + ec.message());
}

void RotatingLog::append(const std::string& text) {
  std::error_code ec;
  const std::uintmax_t size = fs::exists(path_, ec) ? fs::file_size(path_, ec) : 0;
  if (!ec && size > 0 && size + text.size() > max_bytes_) rotate();
  std::ofstream out(path_, std::ios::app);
  out << text;
  if (!out.flush()) throw Error(ErrorCode::kIo, "diagnose log: cannot write " + path_.string());
}

}  // namespace epx::detail
