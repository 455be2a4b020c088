// Shared by the fuzz targets: turn the fuzzer's bytes into files epx reads.
//
// A directory input (replay input sets, bench routing directories) is one byte string:
// chunks separated by the 4 bytes "EPX|"; chunk 0 is meta.json, then for rank 0, 1, ...
// in turn topk_idx.npy, topk_weights.npy, x.npy (missing chunks = missing files). The seed
// corpus (make_corpus.py) writes valid sets in this form; the fuzzer mutates them.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace epx::fuzz {

/// A private directory for this fuzzing process (removed at exit).
inline const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() / ("epx-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

inline std::vector<std::string_view> split_chunks(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string_view> out;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  for (;;) {
    const std::size_t next = all.find("EPX|", at);
    out.push_back(all.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) break;
    at = next + 4;
  }
  return out;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Writes the chunks as an input directory (fresh each call); returns its path.
inline std::filesystem::path make_input_dir(const std::uint8_t* data, std::size_t size, int max_ranks = 4) {
  const std::filesystem::path dir = work_dir() / "in";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  const auto chunks = split_chunks(data, size);
  write_file(dir / "meta.json", chunks[0]);
  const char* names[] = {"topk_idx.npy", "topk_weights.npy", "x.npy"};
  for (std::size_t i = 1; i < chunks.size() && i <= static_cast<std::size_t>(3 * max_ranks); ++i) {
    const std::filesystem::path rd = dir / ("rank" + std::to_string((i - 1) / 3));
    std::filesystem::create_directories(rd);
    write_file(rd / names[(i - 1) % 3], chunks[i]);
  }
  return dir;
}

}  // namespace epx::fuzz
