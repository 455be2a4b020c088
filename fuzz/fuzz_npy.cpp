// Fuzz target: the .npy reader (read_npy and read_npy_header) on arbitrary bytes.
#include <cstddef>
#include <cstdint>

#include "epx/error.hpp"
#include "fuzz_support.hpp"
#include "epx/io/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = epx::fuzz::work_dir() / "a.npy";
  epx::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  try {
    const epx::tools::NpyArray h = epx::tools::read_npy_header(path);
    const epx::tools::NpyArray a = epx::tools::read_npy(path);
    // What the reader returns is consistent: the data is exactly numel * itemsize bytes.
    if (a.data.size() != static_cast<std::size_t>(a.numel()) * a.itemsize() || h.shape != a.shape) __builtin_trap();
  } catch (const epx::Error&) {
  }
  return 0;
}
