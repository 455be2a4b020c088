// _epx.BucketBuffer: the pybind11 layer over epx::BucketBuffer (epx/bucket.hpp) on an
// endpoint of the group's transport (_epx.Transport). python/epx/bucket.py holds the
// DeepEP-shaped API (groups, plans, sessions, torch / numpy views); this file only moves
// pointers: a tensor comes in as (data pointer, bytes, item size) of memory the Python
// layer keeps alive, results go out as (pointer, bytes) inside the storage, which Python
// views through storage(). Every call releases the GIL; waits check Python's signals.
#include "bucket.hpp"

#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <tuple>

#include "collective_data.hpp"
#include "epx/bucket.hpp"
#include "epx/error.hpp"
#include "buffer_holder.hpp"
#include "group_transport.hpp"
#include "tensors.hpp"

namespace epx::py {

static bool epx_dtype(const std::string& name, DType& d) {
  static const std::pair<const char*, DType> known[] = {{"float32", DType::kF32}, {"bfloat16", DType::kBF16},
                                                       {"int32", DType::kI32},   {"int64", DType::kI64},
                                                       {"bool", DType::kBool},   {"uint8", DType::kFP8E4M3}};
  for (const auto& [n, t] : known)
    if (name == n) return d = t, true;
  return false;
}

/// The plan entry's dtype where epx has it, else raw bytes (the entry's name then carries
/// the dtype: Python puts it there, so that the ranks' agreement still compares it).
static DType planned_dtype(const std::string& name) {
  DType d = DType::kFP8E4M3;
  epx_dtype(name, d);
  return d;
}

/// The entry's shape (up to 3 dimensions with a dtype epx knows), else its bytes as one dimension.
static Shape planned_shape(const std::vector<std::int64_t>& shape, const std::string& dtype, std::size_t nbytes) {
  DType d;
  Shape s;
  if (!epx_dtype(dtype, d) || shape.empty() || shape.size() > static_cast<std::size_t>(kMaxDims))
    return Shape{static_cast<std::int64_t>(nbytes / dtype_size(d = planned_dtype(dtype)))};
  s.ndim = static_cast<int>(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) s.dims[i] = shape[i];
  return s;
}

BufferAllocator plan_of(const std::vector<Planned>& plan, std::size_t num_bytes, const char* kind) {
  BufferAllocator a;
  for (const auto& [name, shape, dtype, nbytes] : plan) a.allocate(name, planned_shape(shape, dtype, nbytes), planned_dtype(dtype));
  if (a.total_bytes() != num_bytes)
    throw Error(ErrorCode::kInternal, std::string(kind) + ": the plan's bytes differ between Python and C++ (" +
                                          std::to_string(a.total_bytes()) + " vs " + std::to_string(num_bytes) + ")");
  return a;
}


namespace {

/// (pointer, bytes, item size) from Python.
using Desc = std::tuple<std::uintptr_t, std::size_t, std::size_t>;

DType dtype_of_size(std::size_t itemsize) {
  switch (itemsize) {
    case 2: return DType::kBF16;
    case 4: return DType::kF32;
    case 8: return DType::kI64;
    default: return DType::kFP8E4M3;  // raw bytes
  }
}

std::int64_t elems(const Desc& d) {
  const std::size_t item = std::max<std::size_t>(std::get<2>(d), 1);
  return static_cast<std::int64_t>(std::get<1>(d) / item);
}

std::vector<TensorView> views(const std::vector<Desc>& ds) {
  std::vector<TensorView> v;
  for (const Desc& d : ds)
    v.emplace_back(reinterpret_cast<const void*>(std::get<0>(d)), dtype_of_size(std::get<2>(d)), Shape{elems(d)});
  return v;
}

std::vector<MutableView> mutable_views(const std::vector<Desc>& ds, bool f32) {
  std::vector<MutableView> v;
  for (const Desc& d : ds)
    v.push_back({reinterpret_cast<void*>(std::get<0>(d)), f32 ? DType::kF32 : dtype_of_size(std::get<2>(d)),
                 Shape{f32 ? static_cast<std::int64_t>(std::get<1>(d) / 4) : elems(d)}});
  return v;
}

class PyBucketEvent {
 public:
  PyBucketEvent(BucketEvent ev, std::shared_ptr<Interrupt> interrupt) : ev_(std::move(ev)), interrupt_(std::move(interrupt)) {}
  PyBucketEvent(PyBucketEvent&&) noexcept = default;
  // An event dropped unwaited: the call finishes without the GIL (its error dropped).
  ~PyBucketEvent() {
    pyb::gil_scoped_release nogil;
    ev_ = BucketEvent();
  }
  bool done() const { return !ev_.valid() || ev_.ready(); }
  /// (pointer, bytes) of each result; known before wait().
  std::vector<std::pair<std::uintptr_t, std::size_t>> results() const { return results_of(ev_.valid() ? ev_.outputs() : waited_); }
  void wait() {
    if (!ev_.valid()) return;
    try {
      pyb::gil_scoped_release nogil;
      while (!ev_.wait_for(std::chrono::milliseconds(50))) {
        pyb::gil_scoped_acquire gil;
        interrupt_->check_signals();
      }
      waited_ = ev_.wait();
    } catch (const Error&) {
      interrupt_->rethrow_if_interrupted();
      throw;
    }
  }

 private:
  static std::vector<std::pair<std::uintptr_t, std::size_t>> results_of(const std::vector<MutableView>& v) {
    std::vector<std::pair<std::uintptr_t, std::size_t>> r;
    for (const MutableView& m : v) r.emplace_back(reinterpret_cast<std::uintptr_t>(m.data), m.nbytes());
    return r;
  }
  BucketEvent ev_;
  std::vector<MutableView> waited_;
  std::shared_ptr<Interrupt> interrupt_;
};

class PyBucket : public BufferHolder<BucketBuffer> {
 public:
  PyBucket(std::shared_ptr<PyTransport> group, const std::vector<std::vector<int>>& groups, std::size_t num_bytes,
           const std::vector<Planned>& plan, std::size_t chunk,
           const std::string& algorithm)
      : BufferHolder(std::move(group)) {
    BucketOptions o;
    o.chunk_bytes = chunk;
    o.algorithm = parse_bucket_algorithm(algorithm);
    pyb::gil_scoped_release nogil;
    if (plan.empty()) {
      buffer_ = std::make_unique<BucketBuffer>(group_->transport(), groups, num_bytes, o);
      return;
    }
    buffer_ = std::make_unique<BucketBuffer>(group_->transport(), groups, plan_of(plan, num_bytes, "bucket"), o);
  }
  BucketBuffer& b() { return buffer(); }
  pyb::object storage(const std::string& flavor) {
    std::shared_ptr<std::byte> ref = b().storage_ref();
    Tensor t = Tensor::adopt(std::move(ref), DType::kFP8E4M3, Shape{static_cast<std::int64_t>(b().num_bytes())});
    return export_tensor(std::move(t), flavor == "numpy" ? Flavor::kNumpy : Flavor::kTorch);
  }
  std::uintptr_t storage_ptr() { return reinterpret_cast<std::uintptr_t>(b().storage()); }

  PyBucketEvent all_gather(const std::vector<Desc>& srcs, const std::vector<Desc>& dsts, int group) {
    pyb::gil_scoped_release nogil;
    return {b().all_gather_async(views(srcs), mutable_views(dsts, false), group), group_->interrupt()};
  }
  PyBucketEvent reduce_scatter(const std::vector<Desc>& xs, const std::string& precision, float scale, int group) {
    const CommPrecision p = parse_comm_precision(precision);
    pyb::gil_scoped_release nogil;
    return {b().reduce_scatter_async(mutable_views(xs, true), p, scale, group), group_->interrupt()};
  }
  PyBucketEvent all_reduce(const std::vector<Desc>& xs, float scale, int group) {
    pyb::gil_scoped_release nogil;
    return {b().all_reduce_async(mutable_views(xs, true), scale, group), group_->interrupt()};
  }
  void fail_call(const std::vector<int>& ranks, const std::string& call, const std::string& problem) {
    pyb::gil_scoped_release nogil;
    b().fail_call(ranks, call.c_str(), problem);
  }
  pyb::dict last_stats() {
    const BucketStats& s = b().last_stats();
    pyb::dict d;
    d["algorithm"] = to_string(s.algorithm);
    d["exchange_us"] = s.exchange_us;
    d["data_us"] = s.data_us;
    d["done_us"] = s.done_us;
    return d;
  }
};

}  // namespace

void bind_bucket(pyb::module_& m) {
  pyb::class_<PyBucketEvent>(m, "BucketEvent")
      .def("wait", &PyBucketEvent::wait)
      .def("done", &PyBucketEvent::done)
      .def("results", &PyBucketEvent::results);
  pyb::class_<PyBucket> bucket(m, "BucketBuffer");
  bind_buffer_basics(bucket)
      .def(pyb::init<std::shared_ptr<PyTransport>, const std::vector<std::vector<int>>&, std::size_t,
                     const std::vector<Planned>&, std::size_t,
                     const std::string&>(),
           pyb::arg("group_transport"), pyb::arg("groups"), pyb::arg("num_bytes"), pyb::arg("plan"), pyb::arg("chunk_bytes"),
           pyb::arg("algorithm"))
      .def("storage", &PyBucket::storage, pyb::arg("flavor"))
      .def_property_readonly("storage_ptr", &PyBucket::storage_ptr)
      .def_property_readonly("chunk_bytes", [](PyBucket& p) { return p.b().chunk_bytes(); })
      .def_property_readonly("last_algorithm", [](PyBucket& p) { return std::string(to_string(p.b().last_algorithm())); })
      .def_property_readonly("last_stats", &PyBucket::last_stats)
      .def("all_gather", &PyBucket::all_gather, pyb::arg("srcs"), pyb::arg("dsts"), pyb::arg("group"))
      .def("reduce_scatter", &PyBucket::reduce_scatter, pyb::arg("srcs"), pyb::arg("precision"), pyb::arg("scale"),
           pyb::arg("group"))
      .def("all_reduce", &PyBucket::all_reduce, pyb::arg("srcs"), pyb::arg("scale"), pyb::arg("group"))
      .def("fail_call", &PyBucket::fail_call, pyb::arg("ranks"), pyb::arg("call"), pyb::arg("problem"));
  // The inputs and checks of epx bench --op <collective> (baselines/collective_data.hpp), for its
  // gloo baseline (python -m epx.bench_collective): the same numbers as the C++ side.
  m.def("collective_input", [](std::uint64_t seed, int rank, int tensor, std::size_t nbytes) {
    Tensor t(DType::kFP8E4M3, Shape{static_cast<std::int64_t>(nbytes)});
    epx_collective::fill_bytes(t.data(), nbytes, seed, rank, tensor);
    return export_tensor(std::move(t), Flavor::kNumpy);
  });
  m.def("collective_hash", [](std::uintptr_t ptr, std::size_t nbytes, std::uint64_t h) {
    pyb::gil_scoped_release nogil;
    return epx_collective::fnv1a(reinterpret_cast<const void*>(ptr), nbytes, h);
  }, pyb::arg("ptr"), pyb::arg("nbytes"), pyb::arg("h") = 1469598103934665603ull);
  m.def("collective_sample_indices", [](std::size_t count) { return epx_collective::sample_indices(count); });
  m.def("collective_tensor_bytes", &epx_collective::tensor_bytes);
}

}  // namespace epx::py
