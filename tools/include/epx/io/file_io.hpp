// file_io.hpp — how the tools write a file without ever losing one: the bytes go to a
// temporary file beside the target, which is renamed over the target only once every write,
// the flush and the close succeeded. On any failure the temporary file (the only thing this
// call created) is removed and the target is untouched. A target that exists and is not a
// regular file (/dev/null, a FIFO, a terminal) is written in place and never removed.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

namespace epx::tools {

/// Calls `body(f)` to write the file's bytes with stdio (its fwrite results are checked here
/// through ferror, so `body` may ignore them) and commits them to `path`. Throws
/// epx::Error(kIo, "<what> <path>: <reason>") on any failure (cannot create, write error such
/// as ENOSPC or EFBIG, close error, rename error such as an existing directory at `path`).
void write_file_safely(const std::filesystem::path& path, const std::string& what,
                       const std::function<void(std::FILE*)>& body);

/// write_file_safely with one string as the whole content.
void write_text_file(const std::filesystem::path& path, const std::string& what, const std::string& text);

}  // namespace epx::tools
