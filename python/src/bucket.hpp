// _epx.BucketBuffer and _epx.BucketEvent (python/src/bucket.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "epx/buffer_allocator.hpp"

namespace epx::py {

/// A planned tensor from Python (BufferAllocator._entries): name, shape, dtype name
/// ("float32", "bfloat16", ...), bytes.
using Planned = std::tuple<std::string, std::vector<std::int64_t>, std::string, std::size_t>;

/// The C++ plan of Python's entries (a dtype epx does not have is planned as raw bytes, its
/// name in the entry's name); kInternal when its bytes differ from Python's `num_bytes`.
BufferAllocator plan_of(const std::vector<Planned>& plan, std::size_t num_bytes, const char* kind);

/// Registers the bucket buffer's classes in module `m`.
void bind_bucket(pybind11::module_& m);

}  // namespace epx::py
