// qkv._qkv: the module's entry point and the array conversions every binding uses.
#include <pybind11/stl.h>
#include <pthread.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::python {

std::atomic<int64_t> g_input_copies{0};

namespace {

// The asynchronous signals: all but those a fault raises on its own thread (and SIGKILL / SIGSTOP,
// which nothing blocks).
sigset_t async_signals() {
  sigset_t s;
  sigfillset(&s);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&s, sig);
  return s;
}

// A Python object as a keep-alive owner: released with the GIL held, whichever thread drops it.
std::shared_ptr<void> hold(py::object o) {
  auto* p = new py::object(std::move(o));
  return std::shared_ptr<void>(p, [](void* x) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(x);
  });
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::F32: return py::dtype::of<float>();
    case DType::F64: return py::dtype::of<double>();
    case DType::I32: return py::dtype::of<int32_t>();
    case DType::I64: return py::dtype::of<int64_t>();
    case DType::Bool: return py::dtype::of<bool>();
    default: throw Error(detail::concat("numpy: qkv's ", dtype_name(t), " has no NumPy type"));
  }
}

}  // namespace

Computing::Computing() {
  const sigset_t set = async_signals();
  pthread_sigmask(SIG_BLOCK, &set, &outside_);
  // ... and in the OpenMP threads this thread computes with: the pool may hold threads made before
  // (by PyTorch, say) with the signals open. Threads the pool makes from now on inherit this mask.
  const int n = std::max(1, num_threads());
#pragma omp parallel num_threads(n)
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Computing::~Computing() { pthread_sigmask(SIG_SETMASK, &outside_, nullptr); }

SignalsOpen::SignalsOpen(const Computing& c) { pthread_sigmask(SIG_SETMASK, &c.outside(), &inside_); }

SignalsOpen::~SignalsOpen() { pthread_sigmask(SIG_SETMASK, &inside_, nullptr); }

std::function<void(int64_t)> signals_between_steps(const Computing& c) {
  return [&c](int64_t) {
    sigset_t pending;
    if (sigpending(&pending) != 0) return;
    const sigset_t watched = async_signals();
    bool any = false;
    for (int s = 1; s < NSIG && !any; ++s) any = sigismember(&watched, s) == 1 && sigismember(&pending, s) == 1;
    if (!any) return;
    py::gil_scoped_acquire gil;
    const SignalsOpen open(c);  // the pending signal is delivered here, on a thread between steps
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

Tensor tensor_of(const py::handle& obj, DType dtype, const char* name) {
  if (!py::isinstance<py::array>(obj) && !py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj) &&
      !py::isinstance<py::float_>(obj) && !py::isinstance<py::int_>(obj) && !py::isinstance<py::bool_>(obj))
    throw py::type_error(std::string(name) + ": expected a NumPy array, got " +
                         py::str(py::type::of(obj)).cast<std::string>());
  py::array given = py::array::ensure(obj);
  if (!given) throw py::type_error(std::string(name) + ": cannot be read as an array");
  const char kind = given.dtype().kind();
  if (dtype == DType::Bool ? kind != 'b' : (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b'))
    throw py::type_error(std::string(name) + ": expected " +
                         (dtype == DType::Bool ? "a bool array (True = may attend)" : "an array of numbers") +
                         ", got dtype " + py::str(given.dtype()).cast<std::string>());
  const py::dtype want = numpy_dtype(dtype);
  py::array arr = given;
  // (an array over a buffer at an odd offset is not aligned to its items: copied too)
  if (!given.dtype().is(want) || !(given.flags() & py::array::c_style) ||
      !given.attr("flags").attr("aligned").cast<bool>()) {
    // a C-contiguous copy in the wanted type (NumPy's own conversion)
    arr = py::module_::import("numpy").attr("array")(given, py::arg("dtype") = want, py::arg("order") = "C",
                                                       py::arg("copy") = true);
    ++g_input_copies;
  }
  // C-contiguous by now: qkv's own contiguous strides (NumPy's may differ for size-1 dimensions)
  std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim()), strides(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  void* data = const_cast<void*>(arr.data());
  return Tensor::borrow(data, std::move(shape), std::move(strides), dtype, hold(arr));
}

py::array numpy_of(const Tensor& t) {
  const size_t item = dtype_size(t.dtype());
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s * static_cast<int64_t>(item)));
  auto* keep = new std::shared_ptr<void>(t.keep_alive());
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  return py::array(numpy_dtype(t.dtype()), shape, strides, t.raw_data(), base);
}

}  // namespace qkv::python

namespace py = pybind11;

PYBIND11_MODULE(_qkv, m) {
  namespace qp = qkv::python;
  m.doc() = "qkv's C++ core: attention kernels and models (use the qkv package, not this module)";
  py::register_exception<qkv::Error>(m, "Error", PyExc_ValueError);
  m.def("input_copies", [] { return qp::g_input_copies.load(); },
        "Input arrays converted (another dtype, or not C-contiguous) since the start");
  m.def("set_num_threads", &qkv::set_num_threads, py::arg("n"), "Threads qkv's kernels use (OpenMP)");
  m.def("num_threads", &qkv::num_threads);
  qp::bind_attention(m);
  qp::bind_model(m);
  qp::bind_train(m);
}
