// monarch._native's data plane (python/monarch/rdma.py is the public API, with its argument
// checks): registered memory and its handle (include/monarch/rdma/rdma.hpp, docs/data-plane.md).
//
// Memory is given as (address, bytes): the Python side takes them from a tensor's data pointer or
// a buffer-protocol object (buffer_span below), keeps that object alive while the memory is
// registered or a transfer into or out of it runs, and checks sizes before it gets here. The
// rdma layer checks again (RdmaError: OutOfBounds, InvalidArgument, Dropped), so a bad call here
// still fails with an exception, never a crash.
//
// Threads and the GIL (runtime.hpp): every call that enters the data plane releases the GIL.
// Same-host transfers (shm, cma, in-process) copy on the calling thread before read_into /
// write_from return; the others complete on the data plane's I/O thread.
#include "monarch/rdma/rdma.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "monarch/wire/serialize.hpp"
#include "runtime.hpp"

namespace monarch::python {

/// native.cpp: a Future<void> as a NativeFuture whose result() is None (GIL held).
py::object native_future(Future<void> f);

namespace {

// One buffer as Python sees it: the owner's registration (owned), or a copy of a handle that
// came in a message (owned == nullptr). Transfers go through the handle either way.
struct NativeRdmaBuffer {
  std::shared_ptr<rdma::RdmaBuffer> owned;
  rdma::RdmaHandle handle;
  bool dropped = false;
  bool allocated = false;  // made by allocate(): owned->memory() is the data plane's
  std::shared_ptr<std::mutex> drop_mu = std::make_shared<std::mutex>();

  void check_live(const char* op) const {
    if (dropped) {
      throw rdma::RdmaError(rdma::RdmaErrc::Dropped, std::string("RDMABuffer.") + op + ": buffer " +
                                                         handle.describe() +
                                                         " was dropped by this process");
    }
  }
};

std::span<std::byte> span_at(uint64_t address, uint64_t bytes) {
  return {reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address)),
          static_cast<size_t>(bytes)};
}

rdma::TransferOptions options(int64_t timeout_ms) {
  if (timeout_ms < 0) throw UsageError("RDMABuffer: timeout_ms must be >= 0 (0: rdma.timeout)");
  rdma::TransferOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

NativeRdmaBuffer register_memory(uint64_t address, uint64_t bytes, std::string name,
                                 bool read_only) {
  NoGil nogil;
  auto span = span_at(address, bytes);
  auto b = std::make_shared<rdma::RdmaBuffer>(
      read_only ? rdma::RdmaBuffer::read_only(span, std::move(name))
                : rdma::RdmaBuffer(span, std::move(name)));
  NativeRdmaBuffer out;
  out.handle = b->handle();
  out.owned = std::move(b);
  return out;
}

// A new zeroed buffer in shared memory, owned by the data plane (same-host peers reach it by
// the shm route: their transfers are memcpys).
NativeRdmaBuffer allocate(uint64_t bytes, std::string name) {
  NoGil nogil;
  auto b = std::make_shared<rdma::RdmaBuffer>(rdma::RdmaBuffer::allocate(bytes, std::move(name)));
  NativeRdmaBuffer out;
  out.handle = b->handle();
  out.owned = std::move(b);
  out.allocated = true;
  return out;
}

// The bytes of an allocate()d buffer, for memoryview() (the view keeps the object, hence the
// memory, alive; drop() only ends remote access).
py::buffer_info memory_of(const NativeRdmaBuffer& b) {
  if (!b.allocated) {
    throw UsageError("RDMABuffer.memory(): buffer " + b.handle.describe() +
                     " was not made by RDMABuffer.allocate() in this process");
  }
  auto m = b.owned->memory();
  return py::buffer_info(m.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                         {static_cast<py::ssize_t>(m.size())}, {py::ssize_t{1}},
                         /*readonly=*/false);
}

py::object read_into(const NativeRdmaBuffer& b, uint64_t address, uint64_t bytes, uint64_t offset,
                     int64_t timeout_ms) {
  b.check_live("read_into");
  auto o = options(timeout_ms);
  Future<void> f;
  {
    NoGil nogil;
    f = b.handle.read_into(span_at(address, bytes), offset, o);
  }
  return native_future(std::move(f));
}

py::object write_from(const NativeRdmaBuffer& b, uint64_t address, uint64_t bytes, uint64_t offset,
                      int64_t timeout_ms) {
  b.check_live("write_from");
  auto o = options(timeout_ms);
  Future<void> f;
  {
    NoGil nogil;
    f = b.handle.write_from(span_at(address, bytes), offset, o);
  }
  return native_future(std::move(f));
}

void drop(NativeRdmaBuffer& b) {
  b.dropped = true;
  if (!b.owned) return;
  NoGil nogil;
  // Two threads dropping at once: the second returns once the first's drop did (RD-3 for both).
  std::lock_guard lock(*b.drop_mu);
  b.owned->drop();  // waits for transfers touching the memory now (RD-3)
}

py::bytes encode(const NativeRdmaBuffer& b) {
  b.check_live("__reduce__");
  auto bytes = wire::encode(b.handle);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

NativeRdmaBuffer decode(const std::string& s) {
  NativeRdmaBuffer out;
  out.handle = wire::decode<rdma::RdmaHandle>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  return out;
}

// (address, bytes) of a contiguous buffer-protocol object. The caller keeps an export of it
// (a memoryview) alive for as long as it uses the address.
std::pair<uint64_t, uint64_t> buffer_span(const py::object& obj, bool writable) {
  Py_buffer view;
  int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw py::error_already_set();
  std::pair<uint64_t, uint64_t> out{reinterpret_cast<uintptr_t>(view.buf),
                                    static_cast<uint64_t>(view.len)};
  PyBuffer_Release(&view);
  return out;
}

}  // namespace

void register_rdma(py::module_& m) {
  py::class_<NativeRdmaBuffer>(m, "RdmaBuffer", py::buffer_protocol())
      .def(py::init(&register_memory), py::arg("address"), py::arg("bytes"), py::arg("name"),
           py::arg("read_only") = false,
           "Registers bytes [address, address + bytes) of this process (no copy); read_only: "
           "peers' writes to it are refused.")
      .def_static("allocate", &allocate, py::arg("bytes"), py::arg("name"),
                  "A new zeroed buffer of `bytes` in shared memory (the shm route).")
      .def_buffer(&memory_of)
      .def_property_readonly("allocated", [](const NativeRdmaBuffer& b) { return b.allocated; })
      .def_property_readonly("size", [](const NativeRdmaBuffer& b) { return b.handle.length; })
      .def_property_readonly("name", [](const NativeRdmaBuffer& b) { return b.handle.name; })
      .def_property_readonly("owned", [](const NativeRdmaBuffer& b) { return b.owned != nullptr; })
      .def_property_readonly("dropped", [](const NativeRdmaBuffer& b) { return b.dropped; })
      .def_property_readonly("read_only",
                             [](const NativeRdmaBuffer& b) { return b.handle.read_only; })
      .def("read_into", &read_into, py::arg("address"), py::arg("bytes"), py::arg("offset"),
           py::arg("timeout_ms"),
           "Copies buffer bytes [offset, offset + bytes) to address; a NativeFuture (None).")
      .def("write_from", &write_from, py::arg("address"), py::arg("bytes"), py::arg("offset"),
           py::arg("timeout_ms"),
           "Copies [address, address + bytes) to buffer bytes [offset, ...); a NativeFuture.")
      .def("drop", &drop, "Owner: ends remote access (waits for transfers). Copy: forgets it.")
      .def(
          "route",
          [](const NativeRdmaBuffer& b, bool write) {
            b.check_live("route");
            NoGil nogil;
            return rdma::route_for(b.handle, write);
          },
          py::arg("write") = false, "The route a transfer takes from here: shm, cma, channel...")
      .def("encode", &encode)
      .def("describe", [](const NativeRdmaBuffer& b) { return b.handle.describe(); });
  m.def("decode_rdma", &decode, py::arg("encoded"));
  m.def("buffer_span", &buffer_span, py::arg("obj"), py::arg("writable"),
        "(address, bytes) of a contiguous buffer; raises BufferError otherwise.");
  m.def(
      "rdma_backend", [] { return rdma::active_backend(); }, py::call_guard<NoGil>());
}

}  // namespace monarch::python
