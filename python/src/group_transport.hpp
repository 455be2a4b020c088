// The group's transport in Python: one per torch.distributed group (and transport kind and
// timeout) per process, made by epx.group.transport_of and shared by every buffer of the
// group — EPBuffer, BucketBuffer, ... — each of which opens its own endpoint of it
// (Transport::open_endpoint, epx/buffer_base.hpp). Bindings of buffer kinds take a
// `PyTransport&` and build their C++ buffer over transport().
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/error.hpp"
#include "epx/transport.hpp"

namespace epx::py {

namespace pyb = pybind11;

/// The module's main thread (set at import): only it runs Python's signal handlers.
extern std::thread::id g_main_thread;

/// A Ctrl-C seen while a call of the group's buffers waited: the Python exception to raise.
/// Once requested, every wait of the group's transport gives up (the rank left a collective).
struct Interrupt {
  std::atomic<bool> requested{false};
  std::mutex mutex;
  std::optional<pyb::error_already_set> exception;

  /// With the GIL held: runs Python's signal handlers; true if one raised.
  bool check_signals();
  /// Raises the handler's exception if there was one (GIL held).
  void rethrow_if_interrupted();
  /// f() without the GIL (GIL held on entry); an epx::Error caused by an interrupt becomes
  /// the interrupt's Python exception.
  template <class F>
  auto released(F&& f) {
    try {
      pyb::gil_scoped_release nogil;
      return f();
    } catch (const Error&) {
      rethrow_if_interrupted();
      throw;
    }
  }
};

class PyTransport {
 public:
  /// Collective over the group (every rank, the same kind and timeout): a bootstrap over
  /// `allgather` (Python: bytes -> every rank's bytes), then epx::connect. GIL held.
  PyTransport(int rank, int size, pyb::function allgather, const std::string& kind, double timeout_s);
  ~PyTransport();
  PyTransport(const PyTransport&) = delete;
  PyTransport& operator=(const PyTransport&) = delete;

  Transport& transport() noexcept { return *transport_; }
  /// What an exported output keeps alive: the transport (every endpoint's window needs it).
  std::shared_ptr<Transport> shared() const noexcept { return transport_; }
  const std::shared_ptr<Interrupt>& interrupt() const noexcept { return interrupt_; }
  int rank() const noexcept { return transport_->rank(); }
  int num_ranks() const noexcept { return transport_->num_ranks(); }
  std::string name() const { return transport_->caps().name; }
  /// Collective: epx's barrier over the transport (shared memory: no socket round trip),
  /// GIL released; `phase` names it in a timeout's error. Between calls, not during one.
  void barrier(const std::string& phase);

  // After a lost rank (epx/elastic.hpp; epx.agree_and_rebuild in Python). GIL released.
  /// Collective over the survivors: epx::agree_survivors, as a dict (round, old_num_ranks,
  /// survivors, lost, new_rank).
  pyb::dict agree_survivors();
  /// Collective over the survivors: epx::rebuild_group of the agreed membership; the new
  /// group's transport, which keeps this one's (it reads the first group's records through
  /// it) and shares its interrupt state.
  std::shared_ptr<PyTransport> rebuild(int round, int old_num_ranks, const std::vector<int>& survivors,
                                       const std::vector<int>& lost, int new_rank);
  /// Collective: epx::sum_over_group.
  std::vector<std::int64_t> sum(const std::vector<std::int64_t>& values);
  double timeout_s() const noexcept { return static_cast<double>(transport_->timeout().count()) / 1000.0; }

  // Joins (epx/elastic.hpp; epx.admit / epx.request_ranks / epx.join in Python). GIL released.
  /// Collective: epx::open_door; the door's name.
  std::string open_door(int seats);
  /// Local: epx::close_door.
  void close_door();
  /// Local: epx::request_ranks.
  void request_ranks(int count);
  /// Collective over the members: epx::admit. (the new group's transport or None, the
  /// Admission as a dict: round, old_num_ranks, joined, new_rank, tag).
  pyb::tuple admit(int joiners, double wait_s, std::uint64_t tag);
  /// The first group's number of each rank of this group (Transport's root ranks).
  std::vector<int> root_ranks() const;

  /// A rebuilt group's transport (rebuild()).
  PyTransport(std::shared_ptr<Interrupt> interrupt, std::shared_ptr<Transport> transport);

 private:
  std::shared_ptr<Interrupt> interrupt_;
  std::unique_ptr<Bootstrap> bootstrap_;  // holds a Python callable: reset with the GIL
  std::shared_ptr<Transport> transport_;
};

/// Registers `_epx.Transport`.
void bind_transport(pyb::module_& m);

}  // namespace epx::py
