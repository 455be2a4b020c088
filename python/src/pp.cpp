// epx._epx.PPBuffer: the binding of epx/pp.hpp (python/epx/pp.py wraps it). Tensors come as
// (address, nbytes) of the caller's CPU memory (pp.py checks contiguity and writability);
// every call releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "epx/pp.hpp"
#include "bucket.hpp"
#include "buffer_holder.hpp"
#include "group_transport.hpp"
#include "tensors.hpp"

namespace epx::py {

namespace {

TensorView bytes_at(std::uintptr_t address, std::size_t n) {
  return TensorView(reinterpret_cast<const void*>(address), DType::kFP8E4M3, {static_cast<std::int64_t>(n)});
}

/// A slot view for Python: the view, and its bytes as a uint8 tensor of `flavor` (torch /
/// numpy, zero-copy; it keeps the window mapped while it lives).
struct PyPPView {
  PPView view;
  pyb::object bytes(const std::string& flavor) const {
    auto keep = view.keep;
    std::shared_ptr<std::byte> at(static_cast<std::byte*>(view.data), [keep](std::byte*) {});
    return export_tensor(Tensor::adopt(std::move(at), DType::kFP8E4M3, {static_cast<std::int64_t>(view.nbytes)}),
                         flavor == "torch" ? Flavor::kTorch : Flavor::kNumpy);
  }
};

class PyPP : public BufferHolder<PPBuffer> {
 public:
  PyPP(std::shared_ptr<PyTransport> group, std::size_t bytes, int inflight, std::vector<std::pair<int, int>> links,
       std::size_t chunk_bytes, const std::vector<Planned>& plan, std::size_t plan_bytes)
      : BufferHolder(std::move(group)) {
    pyb::gil_scoped_release nogil;
    const PPConfig config{bytes, inflight, std::move(links), chunk_bytes};
    if (plan.empty()) buffer_ = std::make_unique<PPBuffer>(group_->transport(), config);
    else buffer_ = std::make_unique<PPBuffer>(group_->transport(), config, plan_of(plan, plan_bytes, "pp"));
  }
  /// The planned tensors' storage as a uint8 tensor of `flavor` (it keeps the window mapped).
  pyb::object storage(const std::string& flavor) {
    std::shared_ptr<std::byte> ref = buffer().storage_ref();
    const auto n = static_cast<std::int64_t>(buffer().storage_bytes());
    return export_tensor(Tensor::adopt(std::move(ref), DType::kFP8E4M3, {n}), flavor == "torch" ? Flavor::kTorch : Flavor::kNumpy);
  }
  void send(std::uintptr_t address, std::size_t n, int dst) {
    call([&](PPBuffer& b) { b.send(bytes_at(address, n), dst); });
  }
  void recv(std::uintptr_t address, std::size_t n, int src) {
    call([&](PPBuffer& b) {
      b.recv(MutableView{reinterpret_cast<void*>(address), DType::kFP8E4M3, {static_cast<std::int64_t>(n)}}, src);
    });
  }
  PyPPView recv_view(int src, std::int64_t want) {
    return call([&](PPBuffer& b) {
      return PyPPView{b.recv_view(src, want < 0 ? PPBuffer::kAnyBytes : static_cast<std::size_t>(want))};
    });
  }
  void release(PyPPView& v) {
    call([&](PPBuffer& b) { b.release(v.view); });
  }
  pyb::dict stats(int peer) {
    const PPPeerStats s = buffer_->stats(peer);
    pyb::dict d;
    d["sent"] = s.sent, d["received"] = s.received, d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received, d["send_wait_ns"] = s.send_wait_ns, d["recv_wait_ns"] = s.recv_wait_ns;
    d["streamed"] = s.streamed, d["direct"] = s.direct;
    return d;
  }
  std::uint64_t in_flight(int dst) {
    return call([&](PPBuffer& b) { return b.in_flight(dst); });
  }
};

}  // namespace

void bind_pp(pyb::module_& m) {
  pyb::class_<PyPPView>(m, "PPView")
      .def("bytes", &PyPPView::bytes)
      .def_property_readonly("nbytes", [](const PyPPView& v) { return v.view.nbytes; })
      .def_property_readonly("src", [](const PyPPView& v) { return v.view.src; })
      .def_property_readonly("seq", [](const PyPPView& v) { return v.view.seq; });
  pyb::class_<PyPP> pp(m, "PPBuffer");
  bind_buffer_basics(pp)
      .def(pyb::init<std::shared_ptr<PyTransport>, std::size_t, int, std::vector<std::pair<int, int>>, std::size_t,
                     const std::vector<Planned>&, std::size_t>(),
           pyb::arg("transport"), pyb::arg("num_max_tensor_bytes"), pyb::arg("num_max_inflight_tensors"),
           pyb::arg("links"), pyb::arg("chunk_bytes"), pyb::arg("plan"), pyb::arg("plan_bytes"))
      .def("storage", &PyPP::storage)
      .def("send", &PyPP::send)
      .def("recv", &PyPP::recv)
      .def("recv_view", &PyPP::recv_view)
      .def("release", &PyPP::release)
      .def("stats", &PyPP::stats)
      .def("in_flight", &PyPP::in_flight);
  m.def("pp_buffer_size_hint", [](int P, std::size_t bytes, int inflight, std::vector<std::pair<int, int>> links,
                                  std::size_t chunk_bytes) {
    return PPBuffer::get_buffer_size_hint(P, PPConfig{bytes, inflight, std::move(links), chunk_bytes});
  });
}

}  // namespace epx::py
