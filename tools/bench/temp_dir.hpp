// epx_bench's private temp dirs (the ranks' records, the baseline's input): removed when
// the object dies, and by the janitor if the process dies without unwinding.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "epx/error.hpp"
#include "epx/spi/janitor.hpp"

namespace epx::tools {

// A private temp dir for the ranks' records (and the baseline's input), removed on exit.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/epx-bench-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw Error(ErrorCode::kIo, "cannot create a temporary directory " + templ);
    path_ = templ;
    // Removed by the janitor too if this process dies without unwinding (SIGKILL, SIGINT).
    detail::remove_at_exit(path_.string());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace epx::tools
