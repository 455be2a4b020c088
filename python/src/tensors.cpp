#include "tensors.hpp"

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <vector>
#include <memory>

namespace epx::py {
namespace {

const char* want_name(Want w) {
  switch (w) {
    case Want::kBF16: return "bf16 (torch.bfloat16, or uint16 raw bits)";
    case Want::kFP8: return "fp8 e4m3 as uint8 raw bits";
    case Want::kF32: return "float32";
    case Want::kI32: return "int32";
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
    case Want::kI32:
      out = DType::kI32;
      return t.bits == 32 && t.code == kDLInt;
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

/// numpy's __array_interface__ typestr as a DLPack dtype (lanes 0 when unknown).
DLDataType from_typestr(const std::string& t) {
  if (t.size() < 3 || (t[0] != '<' && t[0] != '|' && t[0] != '=')) return {0, 0, 0};
  const auto bits = static_cast<std::uint8_t>(8 * std::stoi(t.substr(2)));
  switch (t[1]) {
    case 'u': return {kDLUInt, bits, 1};
    case 'i': return {kDLInt, bits, 1};
    case 'f': return {kDLFloat, bits, 1};
    case 'b': return {6, bits, 1};
  }
  return {0, 0, 0};
}

std::byte g_empty_storage[64];  // where a zero-element output points

}  // namespace

namespace {

/// The view of C-order memory, or a problem: dtype (`dt`), dims, element strides (empty:
/// C order; `unit` bytes per stride step).
TensorView make_view(const void* data, DLDataType dt, const std::vector<std::int64_t>& shape,
                     const std::vector<std::int64_t>& strides, std::int64_t unit, const std::string& a, Want want,
                     std::string& problem) {
  const int nd = static_cast<int>(shape.size());
  if (nd < 1 || nd > kMaxDims) {
    problem = a + ": expected 1 to " + std::to_string(kMaxDims) + " dimensions, got " + std::to_string(nd);
    return {};
  }
  DType dtype{};
  if (!matches(dt, want, dtype)) {
    problem = a + ": expected " + want_name(want) + ", got " + dl_name(dt);
    return {};
  }
  Shape s;
  s.ndim = nd;
  for (int i = 0; i < nd; ++i) s.dims[static_cast<std::size_t>(i)] = shape[static_cast<std::size_t>(i)];
  if (!strides.empty() && s.numel() != 0) {  // any strides describe an empty tensor
    std::int64_t expect = unit;
    for (int i = nd - 1; i >= 0; --i) {
      if (shape[static_cast<std::size_t>(i)] != 1 && strides[static_cast<std::size_t>(i)] != expect) {
        std::string str = "(";
        for (int j = 0; j < nd; ++j) str += (j ? ", " : "") + std::to_string(strides[static_cast<std::size_t>(j)] / unit);
        problem = a + ": expected a C-contiguous tensor (call .contiguous() / np.ascontiguousarray), got strides " + str + ")";
        return {};
      }
      expect *= shape[static_cast<std::size_t>(i)];
    }
  }
  return TensorView(data, dtype, s);
}

/// numpy arrays (read-only ones too, which numpy's DLPack export refuses) by their
/// __array_interface__: the same zero-copy view, the array kept alive.
Input read_array_interface(pyb::handle obj, const std::string& a, Want want, std::string& problem) {
  Input in;
  pyb::dict ai = obj.attr("__array_interface__");
  const std::string typestr = pyb::str(ai["typestr"]);
  std::vector<std::int64_t> shape, strides;
  for (auto d : pyb::tuple(ai["shape"])) shape.push_back(d.cast<std::int64_t>());
  if (ai.contains("strides") && !ai["strides"].is_none())
    for (auto d : pyb::tuple(ai["strides"])) strides.push_back(d.cast<std::int64_t>());
  const DLDataType dt = from_typestr(typestr);
  if (dt.lanes == 0) {
    problem = a + ": expected " + std::string(want_name(want)) + ", got numpy dtype " + typestr;
    return in;
  }
  const auto ptr = pyb::tuple(ai["data"])[0].cast<std::uintptr_t>();
  in.capsule = pyb::reinterpret_borrow<pyb::object>(obj);
  in.view = make_view(reinterpret_cast<const void*>(ptr), dt, shape, strides, dt.bits / 8, a, want, problem);
  return in;
}

}  // namespace

namespace {

/// torch's C-level DLPack functions, looked up once torch is imported (the binding never
/// imports it): torch._C._to_dlpack / _from_dlpack skip the checks of Tensor.__dlpack__ and
/// torch.utils.dlpack.from_dlpack written in Python (~10 us a call here), which the binding
/// makes itself (CPU, strides) or needs not (its capsules are CPU and contiguous).
struct Torch {
  PyTypeObject* tensor_type = nullptr;
  pyb::object to_dlpack, from_dlpack;
};

const Torch* torch_api() {
  static Torch* api = nullptr;
  if (api != nullptr) return api;
  PyObject* mod = PyImport_GetModule(pyb::str("torch").ptr());  // new reference, or null without error
  if (mod == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  pyb::object torch = pyb::reinterpret_steal<pyb::object>(mod);
  auto* t = new Torch;  // kept for the process: Python objects must not die at exit
  t->tensor_type = reinterpret_cast<PyTypeObject*>(torch.attr("Tensor").ptr());
  Py_INCREF(t->tensor_type);
  pyb::object c = torch.attr("_C");
  t->to_dlpack = c.attr("_to_dlpack");
  t->from_dlpack = c.attr("_from_dlpack");
  api = t;
  return api;
}

}  // namespace

Input read_input(pyb::handle obj, const char* arg, Want want, std::string& problem) {
  Input in;
  if (obj.is_none()) return in;
  const std::string a = arg;
  const Torch* torch = torch_api();
  const bool is_torch = torch != nullptr && PyObject_TypeCheck(obj.ptr(), torch->tensor_type);
  if (!is_torch && pyb::hasattr(obj, "__array_interface__")) return read_array_interface(obj, a, want, problem);
  if (!is_torch && !pyb::hasattr(obj, "__dlpack__")) {
    problem = a + ": expected a tensor with __dlpack__ (torch.Tensor or numpy.ndarray), got " +
              std::string(pyb::str(obj.get_type().attr("__name__")));
    return in;
  }
  try {
    in.capsule = is_torch ? torch->to_dlpack(obj) : obj.attr("__dlpack__")();
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
  std::vector<std::int64_t> shape(t.shape, t.shape + t.ndim), strides;
  if (t.strides != nullptr) strides.assign(t.strides, t.strides + t.ndim);
  in.view = make_view(static_cast<const char*>(t.data) + t.byte_offset, t.dtype, shape, strides, 1, a, want, problem);
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
  if (t.data == nullptr) t.data = g_empty_storage;  // a zero-row tensor still needs a pointer
  m->manager_ctx = ctx.release();
  m->deleter = delete_managed;
  return pyb::reinterpret_steal<pyb::object>(PyCapsule_New(m, "dltensor", capsule_destructor));
}

pyb::object export_tensor(Tensor t, Flavor flavor) {
  if (flavor == Flavor::kTorch) {
    if (const Torch* torch = torch_api()) {
      Exported e(std::move(t), flavor);
      return torch->from_dlpack(e.dlpack(pyb::none()));
    }
  }
  return pyb::cast(Exported(std::move(t), flavor));
}

pyb::tuple Exported::device() const { return pyb::make_tuple(static_cast<int>(kDLCPU), 0); }

pyb::dict Exported::array_interface() {
  if (!tensor_) throw pyb::value_error("this epx tensor was already exported through DLPack");
  const Shape& s = tensor_->shape();
  pyb::tuple shape(s.ndim);
  for (int i = 0; i < s.ndim; ++i) shape[static_cast<std::size_t>(i)] = pyb::int_(s[i]);
  void* data = tensor_->data() != nullptr ? tensor_->data() : g_empty_storage;
  pyb::dict d;
  d["shape"] = shape;
  d["typestr"] = numpy_typestr(tensor_->dtype());
  d["data"] = pyb::make_tuple(reinterpret_cast<std::uintptr_t>(data), false);
  d["strides"] = pyb::none();
  d["version"] = 3;
  return d;
}

void bind_tensors(pyb::module_& m) {
  pyb::class_<Exported>(m, "Exported", "An epx output tensor, handed out once through DLPack.")
      .def("__dlpack__", &Exported::dlpack, pyb::arg("stream") = pyb::none())
      .def("__dlpack_device__", &Exported::device)
      .def_property_readonly("__array_interface__", &Exported::array_interface);
}

}  // namespace epx::py
