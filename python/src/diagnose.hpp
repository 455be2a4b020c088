// epx._epx.Diagnose: the binding of epx::Diagnose (epx/diagnose.hpp) and diagnose_matrix;
// python/epx/diagnose.py is the Python face. module.cpp registers it with one call.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

#include "epx/stats.hpp"

namespace epx::py {

/// A _epx.Buffer's PeerWaits (null once it was closed).
using WaitsOf = std::function<std::shared_ptr<const PeerWaits>(pybind11::handle)>;

/// Adds class Diagnose and function diagnose_matrix to `m`; `waits_of` reads a _epx.Buffer.
void bind_diagnose(pybind11::module_& m, WaitsOf waits_of);

}  // namespace epx::py
