// epx._epx.EngramBuffer: the binding of epx/engram.hpp (python/epx/engram.py wraps it).
// Tables, scales and indices come in zero-copy (tensors.hpp); a tensor the binding cannot
// read fails the collective call on every rank (the buffer's caller_problem). The hooks'
// outputs go out as views of the window (torch by DLPack, numpy by __array_interface__),
// valid until the next fetch. Every call releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "epx/engram.hpp"
#include "buffer_holder.hpp"
#include "group_transport.hpp"
#include "tensors.hpp"

namespace epx::py {

namespace {

DType engram_dtype(const std::string& name) { return name == "fp8" ? DType::kFP8E4M3 : DType::kBF16; }

std::optional<CallProblem> problem_of(const std::string& problem) {
  if (problem.empty()) return std::nullopt;
  const bool dtype = problem.find("expected") != std::string::npos && problem.find("dtype") != std::string::npos;
  return CallProblem{dtype ? ErrorCode::kDtypeMismatch : ErrorCode::kInvalidArgument, problem};
}

/// A view of the window as a tensor of `flavor` (zero-copy; keeps the window mapped).
pyb::object export_view(const TensorView& v, const std::shared_ptr<const void>& keep, Flavor flavor) {
  std::shared_ptr<std::byte> at(static_cast<std::byte*>(const_cast<void*>(v.data)), [keep](std::byte*) {});
  return export_tensor(Tensor::adopt(std::move(at), v.dtype, v.shape), flavor);
}

class PyFetch {
 public:
  PyFetch(EngramFetch f, std::shared_ptr<PyTransport> g) : fetch_(std::move(f)), group_(std::move(g)) {}
  int num_layers() const { return fetch_.num_layers(); }
  pyb::tuple layer(int l, const std::string& flavor) {
    const EngramLayer out = group_->interrupt()->released([&] { return fetch_.layer(l); });
    const Flavor f = flavor == "torch" ? Flavor::kTorch : Flavor::kNumpy;
    pyb::object scales = out.scales.empty() ? pyb::none() : export_view(out.scales, out.keep, f);
    return pyb::make_tuple(export_view(out.data, out.keep, f), scales);
  }
  pyb::dict stats() const {
    const EngramFetchStats s = fetch_.stats();
    pyb::dict d;
    d["rows"] = s.rows, d["rows_padding"] = s.rows_padding, d["rows_local"] = s.rows_local;
    d["rows_mapped"] = s.rows_mapped, d["rows_get"] = s.rows_get, d["rows_served"] = s.rows_served;
    d["bytes"] = s.bytes, d["path"] = s.path;
    return d;
  }

 private:
  EngramFetch fetch_;
  std::shared_ptr<PyTransport> group_;
};

class PyEngram : public BufferHolder<EngramBuffer> {
 public:
  PyEngram(std::shared_ptr<PyTransport> group, std::size_t num_bytes, std::size_t num_storage_bytes)
      : BufferHolder(std::move(group)) {
    pyb::gil_scoped_release nogil;
    buffer_ = std::make_unique<EngramBuffer>(group_->transport(), num_bytes, num_storage_bytes);
  }

  void set_config(std::vector<std::int64_t> N, std::int64_t H, std::int64_t T, std::int64_t E, const std::string& dtype,
                  std::int64_t sf_packs) {
    EngramConfig c{std::move(N), H, T, E, engram_dtype(dtype), sf_packs};
    call([&](EngramBuffer& b) { b.set_config(c); });
  }

  void write(const pyb::list& tables, const std::optional<pyb::list>& sfs) {
    std::string problem;
    std::vector<pyb::object> keep;
    auto take = [&](pyb::handle o, const std::string& name, Want w) {
      Input in = read_input(o, name.c_str(), w, problem);
      if (in.capsule) keep.push_back(in.capsule);
      return in.view;
    };
    const Want w = buffer_->config().dtype == DType::kFP8E4M3 ? Want::kFP8 : Want::kBF16;
    std::vector<TensorView> tv, sv;
    for (std::size_t i = 0; i < tables.size(); ++i) tv.push_back(take(tables[i], "tables[" + std::to_string(i) + "]", w));
    if (sfs)
      for (std::size_t i = 0; i < sfs->size(); ++i) sv.push_back(take((*sfs)[i], "sfs[" + std::to_string(i) + "]", Want::kF32));
    const auto caller = problem_of(problem);
    call([&](EngramBuffer& b) { b.write(tv, sv, caller); });
  }

  PyFetch fetch(pyb::handle indices) {
    std::string problem;
    Input in = read_input(indices, "indices", Want::kI32, problem);
    const auto caller = problem_of(problem);
    EngramFetch f = call([&](EngramBuffer& b) { return b.fetch(in.view, caller); });
    return PyFetch(std::move(f), group_);
  }

  std::string path() const { return buffer_->path(); }
};

}  // namespace

void bind_engram(pyb::module_& m) {
  pyb::class_<PyFetch>(m, "EngramFetch")
      .def_property_readonly("num_layers", &PyFetch::num_layers)
      .def("layer", &PyFetch::layer)
      .def("stats", &PyFetch::stats);
  pyb::class_<PyEngram> engram(m, "EngramBuffer");
  bind_buffer_basics(engram)
      .def(pyb::init<std::shared_ptr<PyTransport>, std::size_t, std::size_t>(), pyb::arg("transport"),
           pyb::arg("num_bytes"), pyb::arg("num_storage_bytes"))
      .def("set_config", &PyEngram::set_config)
      .def("write", &PyEngram::write, pyb::arg("tables"), pyb::arg("sfs") = pyb::none())
      .def("fetch", &PyEngram::fetch)
      .def_property_readonly("path", &PyEngram::path);
  m.def("engram_size_hint", [](int P, std::vector<std::int64_t> N, std::int64_t H, std::int64_t T, std::int64_t E,
                               const std::string& dtype, std::int64_t sf_packs) {
    const EngramSizes z = EngramBuffer::get_storage_size_hint(P, EngramConfig{std::move(N), H, T, E, engram_dtype(dtype), sf_packs});
    return pyb::make_tuple(z.num_bytes, z.num_storage_bytes);
  });
}

}  // namespace epx::py
