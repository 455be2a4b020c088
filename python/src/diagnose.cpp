// The binding of epx::Diagnose over a group's transport (epx.group.transport_of: an
// endpoint of it of its own), watching the engine Buffers given to watch(). Every call that waits releases the GIL; the
// background exchange is C++ only (no Python callback ever runs on its thread).
#include "diagnose.hpp"

#include <pybind11/stl.h>

#include "group_transport.hpp"

#include <cstring>
#include <optional>

#include "epx/diagnose.hpp"
#include "epx/error.hpp"

namespace epx::py {
namespace {

namespace pyb = pybind11;

DiagnoseOptions make_options(double interval_s, double row, double col, double point, bool links, double floor_us, double spread,
                             int persist_of, int persist_need, const std::string& log_dir, std::uint64_t log_max_bytes,
                             int log_backups) {
  if (!(interval_s > 0) || interval_s > 86400.0 * 365)
    throw Error(ErrorCode::kInvalidArgument, "Diagnose: interval must be > 0 seconds, got " + std::to_string(interval_s));
  DiagnoseOptions o;
  o.interval = std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(interval_s * 1000)));
  o.thresholds = {row, col, point, links, floor_us, spread};
  o.persist = {persist_of, persist_need};
  o.log_dir = log_dir;
  o.log_max_bytes = log_max_bytes;
  o.log_backups = log_backups;
  return o;
}

pyb::dict verdict_dict(const MatrixVerdict& v, const std::vector<RankInfo>& ranks) {
  pyb::list points, nodes;
  for (const AbnormalPoint& p : v.points) {
    points.append(pyb::make_tuple(p.src, p.dst, p.value_us, p.ratio));
    auto node = [&](int r) { return static_cast<std::size_t>(r) < ranks.size() ? ranks[static_cast<std::size_t>(r)].node : ""; };
    nodes.append(pyb::make_tuple(node(p.src), node(p.dst)));
  }
  pyb::dict d;
  d["abnormal_rows"] = v.rows;
  d["abnormal_cols"] = v.cols;
  d["abnormal_points"] = points;
  d["point_nodes"] = nodes;
  return d;
}

pyb::dict report_dict(const DiagnoseReport& r) {
  pyb::dict d;
  d["exchanges"] = r.exchanges;
  d["seconds"] = r.seconds;
  d["error"] = r.error;
  pyb::list ranks;
  for (const RankInfo& i : r.ranks) {
    pyb::dict x;
    x["rank"] = i.rank;
    x["pid"] = i.pid;
    x["node"] = i.node;
    ranks.append(x);
  }
  d["ranks"] = ranks;
  pyb::dict t;
  t["row"] = r.thresholds.row;
  t["col"] = r.thresholds.col;
  t["point"] = r.thresholds.point;
  t["links"] = r.thresholds.links;
  t["floor_us"] = r.thresholds.floor_us;
  t["spread"] = r.thresholds.spread;
  d["thresholds"] = t;
  pyb::dict persist;
  persist["of"] = r.persist.of;
  persist["need"] = r.persist.need;
  d["persist"] = persist;
  d["window"] = r.window;
  for (int op = 0; op < kNumWaitOps; ++op) {
    const DiagnoseOp& o = r.ops[static_cast<std::size_t>(op)];
    pyb::dict od = verdict_dict(o.verdict, r.ranks);
    od["persistent"] = verdict_dict(o.persistent, r.ranks);
    od["matrix_us"] = o.matrix_us;  // flat, [src * P + dst]: the Python side reshapes
    od["calls"] = o.calls;
    d[to_string(static_cast<WaitOp>(op))] = od;
  }
  pyb::list links;
  for (const AbnormalPoint& p : r.persistent.links) links.append(pyb::make_tuple(p.src, p.dst, p.value_us, p.ratio));
  pyb::dict both;
  both["ranks"] = r.persistent.ranks;
  both["links"] = links;
  d["persistent_ranks"] = both;
  d["text"] = format_report(r);
  return d;
}

class PyDiagnose {
 public:
  /// Over a group's transport (epx.group.transport_of): an endpoint of it; watch() adds buffers.
  PyDiagnose(std::shared_ptr<PyTransport> group, const DiagnoseOptions& o) : group_(std::move(group)) {
    transport_ = group_->shared();
    pyb::gil_scoped_release nogil;
    diag_ = std::make_unique<Diagnose>(*transport_, o);
  }
  ~PyDiagnose() { close(); }

  void watch(std::shared_ptr<const PeerWaits> waits) {
    if (!waits) throw Error(ErrorCode::kInvalidArgument, "Diagnose.watch: the buffer was destroyed");
    live().watch(std::move(waits));
  }
  void start() { live().start(); }
  void stop() {
    Diagnose& d = live();
    pyb::gil_scoped_release nogil;
    d.stop();
  }
  void exchange() {
    Diagnose& d = live();
    pyb::gil_scoped_release nogil;
    d.exchange();
  }
  pyb::dict report() { return report_dict(live().report()); }
  void close() {
    pyb::gil_scoped_release nogil;  // stop() and the barrier wait for the peers
    diag_.reset();
    transport_.reset();
  }
  bool closed() const { return diag_ == nullptr; }

 private:
  Diagnose& live() {
    if (!diag_) throw Error(ErrorCode::kInvalidArgument, "Diagnose: closed");
    return *diag_;
  }
  std::shared_ptr<PyTransport> group_;  // the group form: keeps the group's transport
  std::shared_ptr<Transport> transport_;
  std::unique_ptr<Diagnose> diag_;
};

}  // namespace

void bind_diagnose(pyb::module_& m, WaitsOf waits_of) {
  pyb::class_<PyDiagnose>(m, "Diagnose")
      .def_static(
          "over_transport",
          [](std::shared_ptr<PyTransport> group, double interval_s, double row, double col, double point,
             bool links, double floor_us, double spread, int persist_of, int persist_need, const std::string& log_dir,
             std::uint64_t log_max_bytes, int log_backups) {
            return std::make_unique<PyDiagnose>(
                std::move(group), make_options(interval_s, row, col, point, links, floor_us, spread, persist_of, persist_need,
                                               log_dir, log_max_bytes, log_backups));
          },
          pyb::arg("transport"), pyb::arg("interval_s"), pyb::arg("row"), pyb::arg("col"), pyb::arg("point"),
          pyb::arg("links"), pyb::arg("floor_us"), pyb::arg("spread"), pyb::arg("persist_of"), pyb::arg("persist_need"),
          pyb::arg("log_dir"), pyb::arg("log_max_bytes"), pyb::arg("log_backups"))
      .def("watch", [waits_of](PyDiagnose& d, pyb::handle buffer) { d.watch(waits_of(buffer)); })
      .def("start", &PyDiagnose::start)
      .def("stop", &PyDiagnose::stop)
      .def("exchange", &PyDiagnose::exchange)
      .def("report", &PyDiagnose::report)
      .def("close", &PyDiagnose::close)
      .def_property_readonly("closed", &PyDiagnose::closed);
  m.def(
      "diagnose_matrix",
      [](const std::vector<double>& flat, int num_ranks, double row, double col, double point, bool links, double floor_us,
         double spread) {
        return verdict_dict(diagnose_matrix(flat, num_ranks, {row, col, point, links, floor_us, spread}), {});
      },
      pyb::arg("matrix"), pyb::arg("num_ranks"), pyb::arg("row"), pyb::arg("col"), pyb::arg("point"), pyb::arg("links"),
      pyb::arg("floor_us"), pyb::arg("spread"));
}

}  // namespace epx::py
