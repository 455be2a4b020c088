// epx._epx: the thin pybind11 layer over the public C++ API (epx/buffer.hpp, epx/connect.hpp,
// epx/bootstrap.hpp, epx/launch.hpp). Everything Python-specific (torch / numpy flavours,
// the DeepEP-shaped tuples, EPHandle, EventOverlap, groups) lives in python/epx/*.py.
//
// Threading: every collective call releases the GIL. An asynchronous call (`mode` 1 =
// Completion::kBackground, async_with_compute_stream; 2 = kAtFinish, defer_epilogue) is the
// engine's Buffer::dispatch_async / combine_async: the front half runs here, the outputs go
// out at once, and the binding's Pending object finishes it (the engine refuses any other
// call on the Buffer meanwhile). Ctrl-C: while a call waits, the transport's wait hook
// (ConnectOptions::wait_hook, every 50 ms of a yielding wait) checks Python's signals on the
// main thread, and Pending.wait checks them while it blocks; a signal abandons the wait with
// an epx::Error on this rank and the Python exception of the handler (KeyboardInterrupt) is
// raised. The other ranks then fail naming this rank once its process exits or its buffer
// is destroyed.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

#include "epx/bootstrap.hpp"
#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/sim/launch.hpp"
#include "epx/lb.hpp"
#include "epx/plan.hpp"
#include "bucket.hpp"
#include "diagnose.hpp"
#include "group_transport.hpp"
#include "tensors.hpp"

namespace epx::py {
void bind_pp(pybind11::module_& m);      // pp.cpp
void bind_engram(pybind11::module_& m);  // engram.cpp
namespace {

/// Everything a call's inputs need to stay alive while it runs.
struct Keep {
  std::vector<pyb::object> objects;
  void add(const Input& in) {
    if (in.capsule) objects.push_back(in.capsule);
  }
};

std::string code_name(ErrorCode c) { return to_string(c); }

/// The code named `name` ("bad_handle", ...); kInvalidArgument for an unknown name.
ErrorCode code_of(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(ErrorCode::kInternal); ++i)
    if (name == to_string(static_cast<ErrorCode>(i))) return static_cast<ErrorCode>(i);
  return ErrorCode::kInvalidArgument;
}

/// The code of a problem read_input found (it names the argument and what was expected).
ErrorCode input_code(const std::string& problem) {
  if (problem.find("C-contiguous") != std::string::npos || problem.find("dimensions") != std::string::npos)
    return ErrorCode::kShapeMismatch;
  if (problem.find("expected a CPU") != std::string::npos || problem.find("cannot be exported") != std::string::npos)
    return ErrorCode::kUnsupported;  // another device (a meta or CUDA tensor)
  return ErrorCode::kDtypeMismatch;
}

Flavor flavor_of(const std::string& f) { return f == "numpy" ? Flavor::kNumpy : Flavor::kTorch; }

/// An output (shared with the engine's tensor: an asynchronous call's still fills it).
/// `owner`, when set, lives as long as the exported tensor: a dispatch's recv_x may be a
/// block of the Buffer's window (the one-copy output pool), so the tensor keeps the
/// transport (the window's mapping) alive after destroy() until it is dropped. The Buffer
/// itself goes at destroy() (a pending call's wait then fails); its pool's blocks outlive it.
pyb::object out(const Tensor& t, Flavor f, const std::shared_ptr<const void>& owner = nullptr) {
  if (!t.defined()) return pyb::none();
  if (!owner) return export_tensor(t.alias(), f);
  auto holder = std::make_shared<std::pair<Tensor, std::shared_ptr<const void>>>(t.alias(), owner);
  std::shared_ptr<std::byte> bytes(holder, static_cast<std::byte*>(holder->first.data()));
  return export_tensor(Tensor::adopt(std::move(bytes), t.dtype(), t.shape()), f);
}

template <class T>
pyb::object out_vector(const std::vector<T>& v, DType dtype, Flavor f) {
  Tensor t(dtype, {static_cast<std::int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(T));
  return export_tensor(std::move(t), f);
}

class PyHandle {
 public:
  explicit PyHandle(DispatchHandle h) : handle(std::move(h)) {}
  DispatchHandle handle;
};

pyb::dict dispatch_dict(const DispatchResult& d, Flavor f, const std::shared_ptr<const void>& owner) {
  pyb::dict r;
  r["recv_x"] = out(d.recv_x, f, owner);
  r["recv_x_scales"] = out(d.recv_x_scales, f, owner);
  r["recv_topk_idx"] = out(d.recv_topk_idx, f);
  r["recv_topk_weights"] = out(d.recv_topk_weights, f);
  r["recv_weights"] = out(d.recv_weights, f);
  r["recv_src"] = out(d.recv_src, f);
  r["num_recv_tokens_per_expert"] = d.num_recv_tokens_per_expert;
  r["num_recv_tokens_per_expert_aligned"] = d.num_recv_tokens_per_expert_aligned;
  r["expert_offsets"] = d.expert_offsets;
  r["handle"] = PyHandle(d.handle);
  return r;
}

pyb::dict combine_dict(const CombineResult& c, Flavor f, const std::shared_ptr<const void>& owner) {
  pyb::dict r;
  r["combined_x"] = out(c.combined_x, f, owner);
  r["combined_topk_weights"] = out(c.topk_weights, f);
  return r;
}

/// An asynchronous call (PendingDispatch or PendingCombine) and the inputs it reads.
/// wait() finishes it (GIL released; signals checked every 50 ms) and returns None.
class Pending {
 public:
  using Call = std::variant<PendingDispatch, PendingCombine>;
  Pending(Call call, Keep keep, std::shared_ptr<Interrupt> interrupt)
      : call_(std::move(call)), keep_(std::move(keep)), interrupt_(std::move(interrupt)) {}
  Pending(Pending&&) = default;
  // An event dropped unwaited: the call is finished without the GIL (its error dropped).
  ~Pending() {
    pyb::gil_scoped_release nogil;
    call_.reset();
  }
  bool done() const {
    return !call_ || std::visit([](const auto& p) { return p.ready(); }, *call_);
  }
  void wait() {
    if (!call_) return;
    try {
      {
        pyb::gil_scoped_release nogil;
        auto ready = [&] { return std::visit([](auto& p) { return p.wait_for(std::chrono::milliseconds(50)); }, *call_); };
        while (!ready()) {
          pyb::gil_scoped_acquire gil;
          interrupt_->check_signals();  // the call's wait hook sees `requested` and gives up
        }
        std::visit([](auto& p) { p.finish(); }, *call_);
      }
      done_();
    } catch (const Error&) {
      done_();
      interrupt_->rethrow_if_interrupted();
      throw;
    }
  }

 private:
  void done_() {
    {
      pyb::gil_scoped_release nogil;
      call_.reset();
    }
    keep_.objects.clear();
  }
  std::optional<Call> call_;
  Keep keep_;
  std::shared_ptr<Interrupt> interrupt_;
};

/// The EP Buffer on its own endpoint of the group's transport (PyTransport).
class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<PyTransport> group, const BufferConfig& config)
      : interrupt_(group->interrupt()), group_(std::move(group)) {
    transport_ = group_->shared();
    pyb::gil_scoped_release nogil;
    buffer_ = std::make_unique<Buffer>(*transport_, config);
    owner_ = transport_;
  }

  ~PyBuffer() { close_all(); }

  void close() { close_all(); }

  bool closed() const { return buffer_ == nullptr; }
  int rank() const { return transport_ ? transport_->rank() : -1; }
  int num_ranks() const { return transport_ ? transport_->num_ranks() : 0; }
  std::size_t window_bytes() const { return buffer_ ? buffer_->window_bytes() : 0; }
  std::string transport_name() const { return transport_ ? transport_->caps().name : ""; }
  std::shared_ptr<const PeerWaits> peer_waits() const { return buffer_ ? buffer_->peer_waits() : nullptr; }

  pyb::object dispatch(pyb::handle x, pyb::handle x_scales, pyb::handle topk_idx, pyb::handle topk_weights,
                       std::optional<PyHandle*> handle, bool expanded, int alignment, std::int64_t worst,
                       bool deterministic, bool zero_padding, const std::string& flavor, int mode,
                       const std::string& py_problem, const std::string& py_code) {
    live();
    std::string problem;
    const bool fp8 = !x_scales.is_none();
    Keep keep;
    DispatchArgs a;
    auto take = [&](pyb::handle o, const char* name, Want w) {
      Input in = read_input(o, name, w, problem);
      keep.add(in);
      return in.view;
    };
    a.x = take(x, fp8 ? "x[0] (fp8 data)" : "x", fp8 ? Want::kFP8 : Want::kBF16);
    a.x_scales = take(x_scales, "x[1] (fp8 scales)", Want::kF32);
    if (!handle) {
      a.topk_idx = take(topk_idx, "topk_idx", Want::kI64);
      a.topk_weights = take(topk_weights, "topk_weights", Want::kF32);
    }
    a.layout = expanded ? RecvLayout::kExpanded : RecvLayout::kCompact;
    a.expert_alignment = alignment;
    a.num_worst_tokens = worst;
    a.deterministic = deterministic;
    a.zero_padding = zero_padding;
    DispatchHandle cached = handle ? (*handle)->handle : DispatchHandle{};
    a.handle = handle ? &cached : nullptr;
    const std::optional<Error> mine = caller_error(py_problem, py_code, problem);
    a.caller_error = mine ? &*mine : nullptr;
    const Flavor f = flavor_of(flavor);
    if (mode == 0) {
      DispatchResult d;
      call([&] { d = buffer_->dispatch(a); });
      return dispatch_dict(d, f, owner_);
    }
    PendingDispatch p;
    call([&] { p = buffer_->dispatch_async(a, completion_of(mode)); });
    pyb::dict r = dispatch_dict(p.outputs(), f, owner_);
    r["pending"] = make_pending(std::move(p), std::move(keep));
    return r;
  }

  pyb::object combine(pyb::handle y, std::optional<PyHandle*> handle, pyb::handle bias0, pyb::handle bias1, bool weighted,
                      const std::string& flavor, int mode, const std::string& py_problem,
                      const std::string& py_code) {
    live();
    std::string problem;
    Keep keep;
    auto take = [&](pyb::handle o, const char* name, Want w) {
      Input in = read_input(o, name, w, problem);
      keep.add(in);
      return in.view;
    };
    CombineArgs a;
    a.y = take(y, "x", Want::kBF16);
    a.bias0 = take(bias0, "bias[0]", Want::kBF16);
    a.bias1 = take(bias1, "bias[1]", Want::kBF16);
    a.weighted = weighted;
    DispatchHandle h = handle ? (*handle)->handle : DispatchHandle{};
    a.handle = &h;
    const std::optional<Error> mine = caller_error(py_problem, py_code, problem);
    a.caller_error = mine ? &*mine : nullptr;
    const Flavor f = flavor_of(flavor);
    if (mode == 0) {
      CombineResult c;
      call([&] { c = buffer_->combine(a); });
      return combine_dict(c, f, owner_);
    }
    PendingCombine p;
    call([&] { p = buffer_->combine_async(a, completion_of(mode)); });
    pyb::dict r = combine_dict(p.outputs(), f, owner_);
    r["pending"] = make_pending(std::move(p), std::move(keep));
    return r;
  }

  /// lb_prefetch_weights (reduce = false) / lb_reduce_grads (reduce = true), epx/lb.hpp:
  /// `slots` and `homes` are one (address, bytes per expert) per weight kind, their memory
  /// kept alive by the caller for the call; `mapping` [P, B] row-major. A problem the Python
  /// layer found (`py_problem`) still fails the collective on every rank: this rank runs it
  /// with an invalid placement (the others fail naming it) and raises the problem.
  void lb(bool reduce, const std::vector<std::pair<std::uintptr_t, std::size_t>>& slots,
          const std::vector<std::pair<std::uintptr_t, std::size_t>>& homes, int home_experts, int num_slots,
          const std::vector<std::int64_t>& mapping, const std::string& py_problem, const std::string& py_code) {
    Buffer& b = live();
    auto kinds = [](const std::vector<std::pair<std::uintptr_t, std::size_t>>& v) {
      std::vector<ExpertTensors> out;
      for (const auto& [address, bytes] : v) out.push_back({reinterpret_cast<void*>(address), bytes});
      return out;
    };
    const auto s = kinds(slots), h = kinds(homes);
    auto run = [&](const LbPlacement& pl) {
      if (reduce) reduce_grads(b, s, h, pl);
      else prefetch_weights(b, s, h, pl);
    };
    if (!py_problem.empty()) {
      // The peers are in the transfer's first dispatch: this rank's fails it for all.
      const std::optional<Error> mine = caller_error(py_problem, py_code, "");
      DispatchArgs a;
      a.caller_error = &*mine;
      call([&] { b.dispatch(a); });
      throw *mine;  // (not reached: the dispatch fails)
    }
    try {
      pyb::gil_scoped_release nogil;
      run(LbPlacement{home_experts, num_slots, mapping});
    } catch (const Error&) {
      interrupt_->rethrow_if_interrupted();
      throw;
    }
  }

 private:
  Buffer& live() {
    if (!buffer_) throw Error(ErrorCode::kBadHandle, "this EPBuffer was destroyed (destroy() was called)");
    if (interrupt_->requested)
      throw Error(ErrorCode::kPeerFailed, "rank " + std::to_string(rank()) + ": this EPBuffer was interrupted by a signal; destroy it", rank());
    return *buffer_;
  }

  // GIL held on entry: the group's transport (its bootstrap holds a Python callable) is
  // released with it, the rest without.
  void close_all() {
    {
      pyb::gil_scoped_release nogil;
      // Outputs still held keep the transport (owner_) and the buffer's window until dropped.
      owner_.reset();
      buffer_.reset();  // a pending call's thread is joined first (its wait then fails)
      transport_.reset();
    }
    group_.reset();
  }

  // A problem the binding found in this rank's inputs (`py_problem` from the Python layer,
  // else `problem` from read_input) still fails the call on every rank: the engine call
  // carries it as its caller_error, and every rank raises it (or a lower rank's) with the
  // same code, origin and message.
  std::optional<Error> caller_error(const std::string& py_problem, const std::string& py_code,
                                    const std::string& problem) const {
    if (py_problem.empty() && problem.empty()) return std::nullopt;
    const std::string& what = py_problem.empty() ? problem : py_problem;
    const ErrorCode code = py_problem.empty() ? input_code(problem) : code_of(py_code);
    return Error(code, "rank " + std::to_string(rank()) + ": " + what, rank());
  }

  /// Runs an engine call without the GIL (a Ctrl-C seen meanwhile is raised instead of its error).
  template <class Call>
  void call(Call c) {
    try {
      pyb::gil_scoped_release nogil;
      c();
    } catch (const Error&) {
      interrupt_->rethrow_if_interrupted();
      throw;
    }
  }

  static Completion completion_of(int mode) { return mode == 2 ? Completion::kAtFinish : Completion::kBackground; }

  pyb::object make_pending(Pending::Call p, Keep keep) {
    return pyb::cast(Pending(std::move(p), std::move(keep), interrupt_),
                     pyb::return_value_policy::move);
  }

  std::shared_ptr<Interrupt> interrupt_;
  std::shared_ptr<PyTransport> group_;
  std::shared_ptr<Transport> transport_;
  std::shared_ptr<Buffer> buffer_;
  // What an exported recv_x / combined_x keeps alive: the transport (its window). Not the
  // bootstrap: it holds a Python callable.
  std::shared_ptr<const void> owner_;
};

/// docs/spec.md §2 for `topk_idx` ([S, K] int64) on `num_ranks` ranks with `num_experts` experts,
/// local (no Buffer needed): the checks and the layout are the routing plan's own
/// (epx/plan.hpp). Outputs in topk_idx's flavour.
pyb::dict dispatch_layout(pyb::handle topk_idx, int num_experts, int num_ranks, int rank, const std::string& flavor) {
  std::string problem;
  Input idx = read_input(topk_idx, "topk_idx", Want::kI64, problem);
  const std::string who = "rank " + std::to_string(rank) + ": get_dispatch_layout: ";
  if (!problem.empty()) throw Error(input_code(problem), who + problem, rank);
  const TensorView& v = idx.view;
  if (v.shape.ndim != 2)
    throw Error(ErrorCode::kShapeMismatch, who + "topk_idx must be [S, K] int64, got " + v.shape.str(), rank);
  if (num_ranks <= 0 || num_experts <= 0 || num_experts % num_ranks != 0)
    throw Error(ErrorCode::kInvalidArgument,
                who + "num_experts = " + std::to_string(num_experts) + " is not a positive multiple of the " +
                    std::to_string(num_ranks) + " ranks",
                rank);
  const RoutingShape shape{v.shape[0], static_cast<int>(v.shape[1]), num_experts, num_ranks};
  if (auto issue = check_topk_idx(v.as<std::int64_t>(), shape)) throw Error(ErrorCode::kInvalidArgument, who + issue->message, rank);
  DispatchLayout l;
  {
    pyb::gil_scoped_release nogil;
    l = make_dispatch_layout(build_routing_plan(v.as<std::int64_t>(), shape));
  }
  const Flavor f = flavor_of(flavor);
  pyb::dict r;
  r["num_tokens_per_rank"] = out_vector(l.num_tokens_per_rank, DType::kI32, f);
  r["num_tokens_per_expert"] = out_vector(l.num_tokens_per_expert, DType::kI32, f);
  r["is_token_in_rank"] = out(l.is_token_in_rank, f);
  return r;
}

/// `pool_rows` > 0: an output pool for one output of that many rows (bf16, or FP8 rows and
/// scales, whichever is bigger), e.g. an expanded one; 0: the engine's auto pool.
BufferConfig make_config(int num_experts, int hidden, int num_topk, std::int64_t max_tokens, std::int64_t max_recv_rows,
                         int num_workers, std::int64_t pool_rows) {
  BufferConfig c;
  c.num_experts = num_experts;
  c.hidden = hidden;
  c.num_topk = num_topk;
  c.max_tokens_per_rank = max_tokens;
  c.max_recv_rows = max_recv_rows;
  c.num_workers = num_workers;
  if (pool_rows > 0)
    c.output_pool_bytes = static_cast<std::int64_t>(std::max(output_block_bytes(pool_rows, hidden, DType::kBF16),
                                                             output_block_bytes(pool_rows, hidden, DType::kFP8E4M3)));
  return c;
}

/// The window a Buffer of this config allocates per rank, rounded up to 2 MiB: measured by
/// building the Buffer on P simulator ranks in model-only mode (no payload is touched), so
/// the number is the constructor's own.
std::size_t size_hint(int num_ranks, const BufferConfig& c) {
  std::size_t bytes = 0;
  LaunchOptions o;
  o.num_ranks = num_ranks;
  o.transport = TransportKind::kSim;
  sim::SimTransportOptions so;
  so.model_only = true;
  {
    pyb::gil_scoped_release nogil;
    sim::launch(o, so, [&](Transport& t) {
      Buffer b(t, c);
      if (t.rank() == 0) bytes = b.window_bytes();
    });
  }
  constexpr std::size_t kAlign = std::size_t{2} << 20;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace
}  // namespace epx::py

PYBIND11_MODULE(_epx, m) {
  namespace pyb = pybind11;
  using namespace epx::py;
  g_main_thread = std::this_thread::get_id();
  m.doc() = "epx's C++ core; use the `epx` package (EPBuffer) rather than this module";
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const epx::Error& e) {
      pyb::object cls = pyb::module_::import("epx.errors").attr("Error");
      pyb::object exc = cls(e.what(), code_name(e.code()), e.origin_rank());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
  bind_tensors(m);
  bind_diagnose(m, [](pyb::handle b) { return b.cast<const PyBuffer&>().peer_waits(); });
  pyb::class_<PyHandle>(m, "Handle").def_property_readonly("num_recv_rows", [](const PyHandle& h) {
    return h.handle.num_recv_rows();
  });
  pyb::class_<Pending>(m, "Pending").def("wait", &Pending::wait).def("done", &Pending::done);
  bind_transport(m);
  bind_bucket(m);
  bind_pp(m);
  bind_engram(m);
  pyb::class_<PyBuffer>(m, "Buffer")
      .def(pyb::init([](std::shared_ptr<PyTransport> group, int num_experts, int hidden, int num_topk,
                        std::int64_t max_tokens, std::int64_t max_recv_rows, int num_workers, std::int64_t pool_rows) {
             return std::make_unique<PyBuffer>(std::move(group), make_config(num_experts, hidden, num_topk, max_tokens,
                                                                             max_recv_rows, num_workers, pool_rows));
           }),
           pyb::arg("group_transport"), pyb::arg("num_experts"), pyb::arg("hidden"), pyb::arg("num_topk"), pyb::arg("max_tokens_per_rank"),
           pyb::arg("max_recv_rows"), pyb::arg("num_workers"), pyb::arg("output_pool_rows") = 0)
      .def("close", &PyBuffer::close)
      .def_property_readonly("closed", &PyBuffer::closed)
      .def_property_readonly("rank", &PyBuffer::rank)
      .def_property_readonly("num_ranks", &PyBuffer::num_ranks)
      .def_property_readonly("window_bytes", &PyBuffer::window_bytes)
      .def_property_readonly("transport", &PyBuffer::transport_name)
      .def("dispatch", &PyBuffer::dispatch, pyb::arg("x"), pyb::arg("x_scales"), pyb::arg("topk_idx"),
           pyb::arg("topk_weights"), pyb::arg("handle"), pyb::arg("expanded"), pyb::arg("alignment"), pyb::arg("worst"),
           pyb::arg("deterministic"), pyb::arg("zero_padding"), pyb::arg("flavor"), pyb::arg("mode"),
           pyb::arg("problem") = "", pyb::arg("problem_code") = "")
      .def("lb", &PyBuffer::lb, pyb::arg("reduce"), pyb::arg("slots"), pyb::arg("homes"), pyb::arg("home_experts"),
           pyb::arg("num_slots"), pyb::arg("mapping"), pyb::arg("problem") = "", pyb::arg("problem_code") = "")
      .def("combine", &PyBuffer::combine, pyb::arg("y"), pyb::arg("handle"), pyb::arg("bias0"), pyb::arg("bias1"),
           pyb::arg("weighted"), pyb::arg("flavor"), pyb::arg("mode"), pyb::arg("problem") = "",
           pyb::arg("problem_code") = "");
  m.def("dispatch_layout", &dispatch_layout, pyb::arg("topk_idx"), pyb::arg("num_experts"), pyb::arg("num_ranks"),
        pyb::arg("rank"), pyb::arg("flavor"));
  m.def(
      "size_hint",
      [](int num_ranks, int num_experts, int hidden, int num_topk, std::int64_t max_tokens, std::int64_t max_recv_rows,
         int num_workers, std::int64_t pool_rows) {
        return size_hint(num_ranks, make_config(num_experts, hidden, num_topk, max_tokens, max_recv_rows, num_workers,
                                                pool_rows));
      },
      pyb::arg("num_ranks"), pyb::arg("num_experts"), pyb::arg("hidden"), pyb::arg("num_topk"),
      pyb::arg("max_tokens_per_rank"), pyb::arg("max_recv_rows"), pyb::arg("num_workers"), pyb::arg("output_pool_rows") = 0);
}
