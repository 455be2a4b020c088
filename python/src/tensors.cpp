#include "tensors.hpp"

#include <dlpack/dlpack.h>

#include <array>
#include <memory>

namespace epx::py {
namespace {

const char* want_name(Want w) {
  switch (w) {
    case Want::kBF16: return "bf16 (torch.bfloat16, or uint16 raw bits)";
    case Want::kFP8: return "fp8 e4m3 as uint8 raw bits";
    case Want::kF32: return "float32";
    case Want::kI64: return "int64";
    case Want::kBool: return "uint8 or bool";
  }
  return "?";
}

std::string dl_name(DLDataType t) {
  const char* code = t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : t.code == kDLFloat ? "float"
                     : t.code == kDLBfloat ? "bfloat" : t.code == 6 ? "bool" : "code";
  return code + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

bool matches(DLDataType t, Want w, DType& out) {
  if (t.lanes != 1) return false;
  switch (w) {
    case Want::kBF16:
      out = DType::kBF16;
      return t.bits == 16 && (t.code == kDLBfloat || t.code == kDLUInt || t.code == kDLInt);
    case Want::kFP8:
      out = DType::kFP8E4M3;
      return t.bits == 8 && (t.code == kDLUInt || t.code == kDLInt);
    case Want::kBool:
      out = DType::kBool;
      return t.bits == 8 && (t.code == kDLUInt || t.code == kDLInt || t.code == 6);
    case Want::kF32:
      out = DType::kF32;
      return t.bits == 32 && t.code == kDLFloat;
    case Want::kI64:
      out = DType::kI64;
      return t.bits == 64 && t.code == kDLInt;
  }
  return false;
}

struct ExportCtx {
  Tensor tensor;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};
};

void delete_managed(DLManagedTensor* m) {
  delete static_cast<ExportCtx*>(m->manager_ctx);
  delete m;
}

void capsule_destructor(PyObject* capsule) {
  // Not consumed (still named "dltensor"): the producer frees it.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}

}  // namespace

Input read_input(pyb::handle obj, const char* arg, Want want, std::string& problem) {
  Input in;
  if (obj.is_none()) return in;
  const std::string a = arg;
  if (!pyb::hasattr(obj, "__dlpack__")) {
    problem = a + ": expected a tensor with __dlpack__ (torch.Tensor or numpy.ndarray), got " +
              std::string(pyb::str(obj.get_type().attr("__name__")));
    return in;
  }
  try {
    in.capsule = obj.attr("__dlpack__")();
  } catch (pyb::error_already_set& e) {
    problem = a + ": cannot be exported by DLPack (" + e.what() + ")";
    return in;
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(in.capsule.ptr(), "dltensor"));
  if (m == nullptr) {
    PyErr_Clear();
    problem = a + ": __dlpack__ did not return a DLPack capsule";
    return in;
  }
  const DLTensor& t = m->dl_tensor;
  if (t.device.device_type != kDLCPU) {
    problem = a + ": expected a CPU tensor, got DLPack device type " + std::to_string(t.device.device_type);
    return in;
  }
  if (t.ndim < 1 || t.ndim > kMaxDims) {
    problem = a + ": expected 1 to " + std::to_string(kMaxDims) + " dimensions, got " + std::to_string(t.ndim);
    return in;
  }
  DType dtype{};
  if (!matches(t.dtype, want, dtype)) {
    problem = a + ": expected " + want_name(want) + ", got " + dl_name(t.dtype);
    return in;
  }
  Shape shape;
  shape.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) shape.dims[static_cast<std::size_t>(i)] = t.shape[i];
  const bool empty = shape.numel() == 0;  // any strides describe an empty tensor
  if (t.strides != nullptr && !empty) {
    std::int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect) {
        std::string s = "(";
        for (int j = 0; j < t.ndim; ++j) s += (j ? ", " : "") + std::to_string(t.strides[j]);
        problem = a + ": expected a C-contiguous tensor (call .contiguous() / np.ascontiguousarray), got strides " + s + ")";
        return in;
      }
      expect *= t.shape[i];
    }
  }
  in.view = TensorView(static_cast<const char*>(t.data) + t.byte_offset, dtype, shape);
  return in;
}

Exported::Exported(Tensor t, Flavor flavor) : tensor_(std::move(t)), flavor_(flavor) {}

pyb::object Exported::dlpack(pyb::object /*stream*/) {
  if (!tensor_) throw pyb::value_error("this epx tensor was already exported once");
  auto ctx = std::make_unique<ExportCtx>();
  ctx->tensor = std::move(*tensor_);
  tensor_.reset();
  const Shape& s = ctx->tensor.shape();
  const int nd = s.ndim;
  for (int i = 0; i < nd; ++i) ctx->shape[static_cast<std::size_t>(i)] = s[i];
  std::int64_t stride = 1;
  for (int i = nd - 1; i >= 0; --i) ctx->strides[static_cast<std::size_t>(i)] = stride, stride *= std::max<std::int64_t>(s[i], 1);
  auto* m = new DLManagedTensor{};
  DLTensor& t = m->dl_tensor;
  t.data = ctx->tensor.data();
  t.device = {kDLCPU, 0};
  t.ndim = nd;
  DLDataType dt{kDLUInt, 8, 1};
  switch (ctx->tensor.dtype()) {
    case DType::kBF16: dt = flavor_ == Flavor::kTorch ? DLDataType{kDLBfloat, 16, 1} : DLDataType{kDLUInt, 16, 1}; break;
    case DType::kFP8E4M3: dt = {kDLUInt, 8, 1}; break;
    case DType::kF32: dt = {kDLFloat, 32, 1}; break;
    case DType::kI32: dt = {kDLInt, 32, 1}; break;
    case DType::kI64: dt = {kDLInt, 64, 1}; break;
    case DType::kBool: dt = {kDLUInt, 8, 1}; break;  // torch 1.13's DLPack has no bool
  }
  t.dtype = dt;
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  static std::byte empty_storage[64];
  if (t.data == nullptr) t.data = empty_storage;  // a zero-row tensor still needs a pointer
  m->manager_ctx = ctx.release();
  m->deleter = delete_managed;
  return pyb::reinterpret_steal<pyb::object>(PyCapsule_New(m, "dltensor", capsule_destructor));
}

pyb::tuple Exported::device() const { return pyb::make_tuple(static_cast<int>(kDLCPU), 0); }

void bind_tensors(pyb::module_& m) {
  pyb::class_<Exported>(m, "Exported", "An epx output tensor, handed out once through DLPack.")
      .def("__dlpack__", &Exported::dlpack, pyb::arg("stream") = pyb::none())
      .def("__dlpack_device__", &Exported::device);
}

}  // namespace epx::py
