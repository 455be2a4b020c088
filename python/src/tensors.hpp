// Tensors between Python and epx by DLPack (no framework at build time): any object with
// __dlpack__ (torch, numpy >= 1.22) comes in as an epx::TensorView over its own memory
// (zero-copy; CPU, C-contiguous), and every epx::Tensor goes out as an `Exported` object
// with __dlpack__ / __dlpack_device__ that torch.utils.dlpack.from_dlpack and
// numpy.from_dlpack wrap without a copy (the capsule owns the Tensor).
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
enum class Want { kBF16, kFP8, kF32, kI64, kBool };

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

 private:
  std::optional<Tensor> tensor_;
  Flavor flavor_;
};

/// Registers Exported in module `m`.
void bind_tensors(pyb::module_& m);

}  // namespace epx::py
