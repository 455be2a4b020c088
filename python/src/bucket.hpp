// _epx.BucketBuffer and _epx.BucketEvent (python/src/bucket.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace epx::py {

/// Registers the bucket buffer's classes in module `m`.
void bind_bucket(pybind11::module_& m);

}  // namespace epx::py
