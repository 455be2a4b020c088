#include "group_transport.hpp"

#include <chrono>
#include <cstring>

#include "epx/connect.hpp"
#include "epx/error.hpp"

namespace epx::py {

std::thread::id g_main_thread;

bool Interrupt::check_signals() {
  if (PyErr_CheckSignals() == 0) return false;
  std::lock_guard<std::mutex> lock(mutex);
  exception.emplace();  // fetches (and clears) the handler's exception
  requested = true;
  return true;
}

void Interrupt::rethrow_if_interrupted() {
  std::lock_guard<std::mutex> lock(mutex);
  if (exception) {
    pyb::error_already_set e = std::move(*exception);
    exception.reset();
    throw e;
  }
}

PyTransport::PyTransport(int rank, int size, pyb::function allgather, const std::string& kind, double timeout_s)
    : interrupt_(std::make_shared<Interrupt>()) {
  auto fn = [allgather](const void* in, void* outp, std::size_t bytes) {
    pyb::gil_scoped_acquire gil;
    try {
      pyb::bytes r = allgather(pyb::bytes(static_cast<const char*>(in), bytes));
      const std::string s = r;
      if (s.size() % bytes != 0 || s.empty())
        throw Error(ErrorCode::kInternal, "bootstrap all-gather returned " + std::to_string(s.size()) + " bytes");
      std::memcpy(outp, s.data(), s.size());
    } catch (pyb::error_already_set& e) {
      throw Error(ErrorCode::kPeerFailed, std::string("bootstrap all-gather (torch.distributed) failed: ") + e.what());
    }
  };
  bootstrap_ = std::make_unique<FunctionBootstrap>(rank, size, fn, "torch");
  ConnectOptions o;
  o.kind = parse_connect_kind(kind);
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  const int me = rank;
  auto st = interrupt_;
  o.wait_hook = [st, me] {
    if (!st->requested && std::this_thread::get_id() == g_main_thread) {
      pyb::gil_scoped_acquire gil;
      st->check_signals();
    }
    if (st->requested)
      throw Error(ErrorCode::kPeerFailed, "rank " + std::to_string(me) + ": interrupted (a signal such as Ctrl-C) while waiting", me);
  };
  pyb::gil_scoped_release nogil;
  transport_ = connect(*bootstrap_, o);
}

void PyTransport::barrier(const std::string& phase) {
  interrupt_->released([&] { transport_->barrier(phase.c_str()); });
}

PyTransport::~PyTransport() {
  {
    pyb::gil_scoped_release nogil;
    transport_.reset();  // outputs still held keep it (shared()) until they are dropped
  }
  bootstrap_.reset();
}

void bind_transport(pyb::module_& m) {
  pyb::class_<PyTransport, std::shared_ptr<PyTransport>>(m, "Transport")
      .def(pyb::init<int, int, pyb::function, const std::string&, double>(), pyb::arg("rank"), pyb::arg("size"),
           pyb::arg("allgather"), pyb::arg("transport"), pyb::arg("timeout_s"))
      .def_property_readonly("rank", &PyTransport::rank)
      .def_property_readonly("num_ranks", &PyTransport::num_ranks)
      .def_property_readonly("name", &PyTransport::name)
      .def("barrier", &PyTransport::barrier, pyb::arg("phase"));
}

}  // namespace epx::py
