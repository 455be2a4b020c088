// npy.hpp — reading and writing NumPy .npy files (docs/spec.md §7).
//
// Only what the tool needs: little-endian, C-order arrays of a fixed set of plain dtypes.
// Every failure is an epx::Error; problems with a file are kIo and name the file and the
// reason, bad arguments to write_npy are kInvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace epx::tools {

/// A whole .npy array in memory. `descr` normalised to one of: "<u2" "|u1" "<f4" "<f8" "<i8" "<i4" "|b1" "<u8" "<i2"
/// "|i1" (little-endian; single-byte types always with '|').
struct NpyArray {
  std::string descr;
  std::vector<std::int64_t> shape;  // empty vector = 0-d scalar
  std::vector<std::byte> data;      // C order, numel * itemsize bytes

  /// Product of `shape` (1 for a 0-d scalar).
  std::int64_t numel() const;
  /// Bytes per element of `descr` (the digits after the type letter), 0 if `descr` is empty.
  std::size_t itemsize() const;
};

/// Reads a .npy file, format version 1.0, 2.0 or 3.0. Parses the header dict properly (keys in any order,
/// Python literal syntax: 'descr', 'fortran_order', 'shape' tuple incl. "(5,)" and "()"), accepts '<' or '=' or '|'
/// byte-order marks for little-endian, and rejects with epx::Error(kIo, message naming the file and the reason):
/// bad magic, truncated file, big-endian ('>'), fortran_order True, unsupported dtype (e.g. '<c8', 'O', structured),
/// data size that does not match the shape.
///
/// Details: a '>' mark on a single-byte type (which has no byte order) is accepted. Keys other than the three
/// above, duplicate keys, a negative dimension and trailing bytes after the data are rejected (kIo).
/// Only regular files are read: a directory, device (/dev/zero) or FIFO is refused (kIo) without blocking.
NpyArray read_npy(const std::filesystem::path& path);

/// read_npy without the data: descr and shape, with every check read_npy makes on the header and on the file's
/// size against the shape (so the data it announces is really there). `data` stays empty. For validating inputs
/// before anything is allocated.
NpyArray read_npy_header(const std::filesystem::path& path);

/// Writes a version 1.0 .npy (header padded with spaces to a multiple of 64 bytes, ending in '\n'; version 2.0 only
/// if the header exceeds 65535 bytes) through write_file_safely (file_io.hpp): a temporary file beside `path`,
/// renamed over it only when every write and the close succeeded; throws kIo on any failure and then leaves `path`
/// as it was (never removes it). `descr` may be any spelling read_npy accepts ('<', '=' or '|'); the normalised one is
/// written. An unsupported `descr`, a negative dimension, or `nbytes` != numel * itemsize is kInvalidArgument.
void write_npy(const std::filesystem::path& path, const std::string& descr, const std::vector<std::int64_t>& shape,
               const void* data, std::size_t nbytes);

/// Normalises a dtype descr to one of the ten supported spellings above; returns "" if it is not one of them
/// (big-endian, complex, object, strings, other sizes...).
std::string normalize_npy_descr(const std::string& descr);

}  // namespace epx::tools
