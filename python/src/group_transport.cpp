#include "group_transport.hpp"

#include <chrono>
#include <cstring>

#include "epx/connect.hpp"
#include "epx/elastic.hpp"
#include "epx/error.hpp"
#include "epx/lb.hpp"

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

namespace {

// Python's signal handlers run while a wait yields (main thread only); once one raised, every
// wait of the group gives up. `who` names the rank in the error.
std::function<void()> make_wait_hook(const std::shared_ptr<Interrupt>& st, const std::string& who) {
  return [st, who] {
    if (!st->requested && std::this_thread::get_id() == g_main_thread) {
      pyb::gil_scoped_acquire gil;
      st->check_signals();
    }
    if (st->requested) throw Error(ErrorCode::kPeerFailed, who + ": interrupted (a signal such as Ctrl-C) while waiting");
  };
}

pyb::dict admission_dict(const Admission& a) {
  pyb::dict d;
  d["round"] = a.round;
  d["old_num_ranks"] = a.old_num_ranks;
  d["joined"] = a.joined;
  d["new_rank"] = a.new_rank;
  d["tag"] = a.tag;
  return d;
}

// A group an admission made keeps the group it came from (members: it reads the first
// group's records through it), destroyed after it.
std::shared_ptr<Transport> chained(std::shared_ptr<Transport> parent, std::unique_ptr<Transport> group) {
  struct Chain {
    std::shared_ptr<Transport> parent;
    std::unique_ptr<Transport> group;
  };
  auto chain = std::make_shared<Chain>(Chain{std::move(parent), std::move(group)});
  return std::shared_ptr<Transport>(chain, chain->group.get());
}

}  // namespace

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
  o.wait_hook = make_wait_hook(interrupt_, "rank " + std::to_string(rank));
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
  // owner holds both, the new one destroyed first, so every shared() handed out keeps the
  // whole chain.
  return std::make_shared<PyTransport>(interrupt_, chained(transport_, std::move(fresh)));
}

std::string PyTransport::open_door(int seats) {
  return interrupt_->released([&] { return epx::open_door(*transport_, seats); });
}

void PyTransport::close_door() { epx::close_door(*transport_); }

void PyTransport::request_ranks(int count) { epx::request_ranks(*transport_, count); }

pyb::tuple PyTransport::admit(int joiners, double wait_s, std::uint64_t tag) {
  AdmitOptions o;
  o.joiners = joiners;
  o.wait = std::chrono::milliseconds(static_cast<std::int64_t>(wait_s * 1000));
  o.tag = tag;
  Admission a;
  std::unique_ptr<Transport> fresh = interrupt_->released([&] { return epx::admit(*transport_, o, &a); });
  if (fresh == nullptr) return pyb::make_tuple(pyb::none(), admission_dict(a));
  return pyb::make_tuple(std::make_shared<PyTransport>(interrupt_, chained(transport_, std::move(fresh))), admission_dict(a));
}

std::vector<int> PyTransport::root_ranks() const { return original_ranks(*transport_); }
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
      .def("sum", &PyTransport::sum, pyb::arg("values"))
      .def("open_door", &PyTransport::open_door, pyb::arg("seats"))
      .def("close_door", &PyTransport::close_door)
      .def("request_ranks", &PyTransport::request_ranks, pyb::arg("count"))
      .def("admit", &PyTransport::admit, pyb::arg("joiners"), pyb::arg("wait_s"), pyb::arg("tag"))
      .def_property_readonly("root_ranks", &PyTransport::root_ranks);
  // The lb layer's replica plan (epx/lb.hpp) for a group of a new size: the plan and the
  // routing through it (epx.heal.ReplicaPlan).
  struct ReplicaPlanHolder {
    DynamicReplicaPlan plan;
  };
  pyb::class_<ReplicaPlanHolder, std::shared_ptr<ReplicaPlanHolder>>(m, "_ReplicaPlan")
      .def_property_readonly("mapping", [](const ReplicaPlanHolder& h) { return h.plan.placement.mapping; })
      .def_property_readonly("ranks", [](const ReplicaPlanHolder& h) { return h.plan.ranks; })
      .def_property_readonly("home_experts", [](const ReplicaPlanHolder& h) { return h.plan.home_experts; })
      .def_property_readonly("slots", [](const ReplicaPlanHolder& h) { return h.plan.slots; })
      .def_property_readonly("replicas_used", [](const ReplicaPlanHolder& h) { return h.plan.replicas_used; })
      .def_property_readonly("rows_with", [](const ReplicaPlanHolder& h) { return h.plan.rows_with; })
      .def_property_readonly("rows_without", [](const ReplicaPlanHolder& h) { return h.plan.rows_without; })
      .def("route", [](const ReplicaPlanHolder& h, int rank, const std::vector<std::int64_t>& idx, int k) {
        return route_through_replicas(h.plan, rank, idx, k);
      });
  m.def(
      "plan_replicas",
      [](const std::vector<std::int64_t>& counts, int ranks, int home_experts, int slots) {
        return std::make_shared<ReplicaPlanHolder>(ReplicaPlanHolder{plan_dynamic_replicas(counts, ranks, home_experts, slots)});
      },
      pyb::arg("counts"), pyb::arg("ranks"), pyb::arg("home_experts"), pyb::arg("slots"));
  // A process outside the group joins it through its door: (transport or None, admission).
  m.def(
      "join_door",
      [](const std::string& name, double timeout_s) {
        auto interrupt = std::make_shared<Interrupt>();
        JoinOptions o;
        o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
        o.wait_hook = make_wait_hook(interrupt, "joiner");
        Admission a;
        std::unique_ptr<Transport> group = interrupt->released([&] { return epx::join_door(name, o, &a); });
        if (group == nullptr) return pyb::make_tuple(pyb::none(), admission_dict(a));
        return pyb::make_tuple(std::make_shared<PyTransport>(interrupt, std::shared_ptr<Transport>(std::move(group))),
                               admission_dict(a));
      },
      pyb::arg("name"), pyb::arg("timeout_s"));
}

}  // namespace epx::py
