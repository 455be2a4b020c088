// Tensors between Python and epx without a framework at build time: any object with
// __dlpack__ (torch) comes in as an epx::TensorView over its own memory (zero-copy; CPU,
// C-contiguous), numpy arrays by __array_interface__ (the same view; numpy's DLPack export
// refuses read-only arrays). Every epx::Tensor goes out as an `Exported` object: torch
// takes it by __dlpack__ (torch.utils.dlpack.from_dlpack; the capsule owns the Tensor),
// numpy by __array_interface__ (np.asarray; writable, the Exported is the array's base).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "epx/tensor.hpp"

namespace epx::py {

namespace pyb = pybind11;

/// An input tensor: the view, and the capsule that keeps the producer's memory alive.
struct Input {
  pyb::object capsule;
  TensorView view;
};

/// What an input may be. bf16 accepts torch.bfloat16 or uint16 raw bits; fp8 and bool
/// accept uint8 raw bits (and bool).
enum class Want { kBF16, kFP8, kF32, kI32, kI64, kBool };

/// Reads `obj` (None: an empty view) as argument `arg`. Returns the problem in words
/// ("x: expected a CPU tensor, got device type 2") instead of throwing, so that the caller
/// can fail the collective call on every rank.
Input read_input(pyb::handle obj, const char* arg, Want want, std::string& problem);

/// How outputs are labelled: torch gets bfloat16 and bool, numpy uint16 raw bits and uint8.
enum class Flavor { kTorch, kNumpy };

/// An epx::Tensor handed out once through __dlpack__.
class Exported {
 public:
  Exported(Tensor t, Flavor flavor);
  pyb::object dlpack(pyb::object stream);
  pyb::tuple device() const;
  /// numpy's view of the same bytes, writable (numpy marks DLPack imports read-only);
  /// the array keeps this object, and so the Tensor, alive as its base.
  pyb::dict array_interface();

 private:
  std::optional<Tensor> tensor_;
  Flavor flavor_;
};

/// An epx output for Python: with the torch flavour (and torch imported) a torch.Tensor over
/// the Tensor's bytes (zero-copy, by DLPack), else an Exported (numpy takes it by
/// np.asarray).
pyb::object export_tensor(Tensor t, Flavor flavor);

/// Registers Exported in module `m`.
void bind_tensors(pyb::module_& m);

}  // namespace epx::py
