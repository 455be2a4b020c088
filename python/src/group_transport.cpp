#include "group_transport.hpp"

#include <chrono>
#include <cstring>

#include "epx/connect.hpp"
#include "epx/elastic.hpp"
#include "epx/error.hpp"

#include <pybind11/stl.h>

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

PyTransport::PyTransport(std::shared_ptr<Interrupt> interrupt, std::shared_ptr<Transport> transport)
    : interrupt_(std::move(interrupt)), transport_(std::move(transport)) {}

pyb::dict PyTransport::agree_survivors() {
  const Membership m = interrupt_->released([&] { return epx::agree_survivors(*transport_); });
  pyb::dict d;
  d["round"] = m.round;
  d["old_num_ranks"] = m.old_num_ranks;
  d["survivors"] = m.survivors;
  d["lost"] = m.lost;
  d["new_rank"] = m.new_rank;
  return d;
}

std::shared_ptr<PyTransport> PyTransport::rebuild(int round, int old_num_ranks, const std::vector<int>& survivors,
                                                  const std::vector<int>& lost, int new_rank) {
  Membership m;
  m.round = round;
  m.old_num_ranks = old_num_ranks;
  m.survivors = survivors;
  m.lost = lost;
  m.new_rank = new_rank;
  std::unique_ptr<Transport> fresh = interrupt_->released([&] { return rebuild_group(*transport_, m); });
  // The new group reads the first group's control block through the old transport: one
  // owner holds both, the new one destroyed first (members go in reverse order), so every
  // shared() handed out keeps the whole chain.
  struct Chain {
    std::shared_ptr<Transport> parent;
    std::unique_ptr<Transport> group;
  };
  auto chain = std::make_shared<Chain>(Chain{transport_, std::move(fresh)});
  return std::make_shared<PyTransport>(interrupt_, std::shared_ptr<Transport>(chain, chain->group.get()));
}

std::vector<std::int64_t> PyTransport::sum(const std::vector<std::int64_t>& values) {
  return interrupt_->released([&] { return sum_over_group(*transport_, values); });
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
      .def("barrier", &PyTransport::barrier, pyb::arg("phase"))
      .def_property_readonly("timeout_s", &PyTransport::timeout_s)
      .def("agree_survivors", &PyTransport::agree_survivors)
      .def("rebuild", &PyTransport::rebuild, pyb::arg("round"), pyb::arg("old_num_ranks"), pyb::arg("survivors"),
           pyb::arg("lost"), pyb::arg("new_rank"))
      .def("sum", &PyTransport::sum, pyb::arg("values"));
}

}  // namespace epx::py
