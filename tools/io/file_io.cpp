#include "epx/io/file_io.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "epx/error.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

void write_file_safely(const fs::path& path, const std::string& what, const std::function<void(std::FILE*)>& body) {
  auto fail = [&](const std::string& why) { throw Error(ErrorCode::kIo, what + " " + path.string() + ": " + why); };
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) fail("is a directory");
  if (exists && !S_ISREG(st.st_mode)) {
    // A device or FIFO: written in place, never replaced or removed.
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) fail(std::string("cannot open for writing: ") + std::strerror(errno));
    body(f);
    const bool bad = std::ferror(f) != 0 || std::fflush(f) != 0;
    const int err = errno;
    if (std::fclose(f) != 0 || bad) fail(std::string("write error: ") + std::strerror(bad ? err : errno));
    return;
  }
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string templ = (dir / ("." + path.filename().string() + ".epx-tmp-XXXXXX")).string();
  const int fd = mkstemp(templ.data());
  if (fd < 0) fail(std::string("cannot create a file in ") + dir.string() + ": " + std::strerror(errno));
  // mkstemp makes 0600; a new output gets the usual mode (0666 & ~umask), a replaced one keeps its own.
  mode_t mode = exists ? st.st_mode & 07777 : 0;
  if (!exists) {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  ::fchmod(fd, mode);
  std::FILE* f = fdopen(fd, "wb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(templ.c_str());
    fail(std::string("cannot open for writing: ") + std::strerror(err));
  }
  auto abandon = [&](const std::string& why) {
    ::unlink(templ.c_str());  // only the temporary file this call created
    fail(why);
  };
  try {
    body(f);
  } catch (...) {
    std::fclose(f);
    ::unlink(templ.c_str());
    throw;
  }
  int err = 0;
  if (std::ferror(f) != 0 || std::fflush(f) != 0) err = errno ? errno : EIO;
  if (std::fclose(f) != 0 && err == 0) err = errno ? errno : EIO;
  if (err != 0) abandon(std::string("write error: ") + std::strerror(err));
  if (::rename(templ.c_str(), path.c_str()) != 0) abandon(std::string("cannot rename the written file into place: ") + std::strerror(errno));
}

void write_text_file(const fs::path& path, const std::string& what, const std::string& text) {
  write_file_safely(path, what, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

}  // namespace epx::tools
