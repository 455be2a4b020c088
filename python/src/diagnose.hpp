// epx._epx.Diagnose: the binding of epx::Diagnose (epx/diagnose.hpp) and diagnose_matrix;
// python/epx/diagnose.py is the Python face. module.cpp registers it with one call.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

#include "epx/stats.hpp"
#include "epx/transport.hpp"

namespace epx::py {

/// What a Diagnose over an EPBuffer needs of its binding object: the transport it was built
/// on (kept alive by the Diagnose) and its PeerWaits.
struct DiagnoseTarget {
  std::shared_ptr<Transport> transport;
  std::shared_ptr<const PeerWaits> waits;
};
using DiagnoseTargetOf = std::function<DiagnoseTarget(pybind11::handle)>;

/// Adds class Diagnose and function diagnose_matrix to `m`; `target_of` reads a _epx.Buffer.
void bind_diagnose(pybind11::module_& m, DiagnoseTargetOf target_of);

}  // namespace epx::py
