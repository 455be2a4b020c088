// What every buffer binding (bucket.cpp, pp.cpp, engram.cpp) holds: the group's transport and
// the buffer, the GIL-free call that turns the group's interrupt (Ctrl-C while a call waited)
// into Python's KeyboardInterrupt, and the members every kind binds alike (destroy, rank,
// num_ranks, window_bytes).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <utility>

#include "epx/error.hpp"
#include "group_transport.hpp"

namespace epx::py {

template <class B>
class BufferHolder {
 public:
  explicit BufferHolder(std::shared_ptr<PyTransport> group) : group_(std::move(group)) {}
  ~BufferHolder() {
    pyb::gil_scoped_release nogil;  // a buffer not destroyed releases its endpoint
    buffer_.reset();
  }
  BufferHolder(const BufferHolder&) = delete;
  BufferHolder& operator=(const BufferHolder&) = delete;

  /// f(buffer) without the GIL; an epx::Error caused by an interrupt becomes the interrupt.
  template <class F>
  auto call(F&& f) {
    return group_->interrupt()->released([&] { return f(*buffer_); });
  }
  /// Collective, idempotent (BufferBase::destroy): later calls throw "the buffer was destroyed".
  void destroy() {
    call([](B& b) { b.destroy(); });
  }
  B& buffer() { return *buffer_; }

 protected:
  std::shared_ptr<PyTransport> group_;
  std::unique_ptr<B> buffer_;  // made by the kind's constructor
};

/// Binds destroy and the read-only rank, num_ranks and window_bytes of a BufferHolder kind.
template <class H>
pyb::class_<H>& bind_buffer_basics(pyb::class_<H>& c) {
  c.def("destroy", [](H& h) { h.destroy(); });
  c.def_property_readonly("rank", [](H& h) { return h.buffer().rank(); });
  c.def_property_readonly("num_ranks", [](H& h) { return h.buffer().num_ranks(); });
  c.def_property_readonly("window_bytes", [](H& h) { return h.buffer().window_bytes(); });
  return c;
}

}  // namespace epx::py
