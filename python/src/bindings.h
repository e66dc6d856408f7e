// qkv's Python module (qkv._qkv): what the binding files share. NumPy arrays cross into qkv
// without copies where their layout allows (qkv::Tensor::borrow) and results come back as NumPy
// arrays over qkv's own memory; docs/python.md.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>

#include "qkv/tensor.h"

namespace qkv::python {

namespace py = pybind11;

// Input arrays that had to be converted (another dtype, not C-contiguous), since the start: the
// tests hold the binding to "C-contiguous float32 is not copied" with it.
extern std::atomic<int64_t> g_input_copies;

// `a` as a qkv tensor of `dtype` (F32, F64, Bool, I64): the array's own memory when it already has
// that dtype and is C-contiguous (kept alive by the tensor), else a converted C-contiguous copy.
Tensor tensor_of(const py::handle& a, DType dtype, const char* name);

// A NumPy array over the tensor's memory (its base owns the storage): no copy.
py::array numpy_of(const Tensor& t);

// Held while qkv computes without the GIL. Besides releasing the GIL, it blocks the asynchronous
// signals (Ctrl-C's SIGINT, SIGTERM, SIGUSR1, SIGALRM, ...) in this thread and in its OpenMP
// threads: oneDNN's AVX-512 GEMM kernels point the stack pointer into heap memory while they run,
// so a signal handler (Python's C handler included) running on a computing thread corrupts the
// heap (qkv/signals.h). A signal that arrives meanwhile is pending, and Python's handler takes it
// when the computation ends (KeyboardInterrupt then), or at a callback (qkv.train's, via
// SignalsOpen).
class Computing {
 public:
  Computing();
  ~Computing();
  Computing(const Computing&) = delete;
  Computing& operator=(const Computing&) = delete;
  const sigset_t& outside() const { return outside_; }  // this thread's mask before

 private:
  py::gil_scoped_release nogil_;
  sigset_t outside_;
};

// Within a Computing, for a call back into Python (the GIL taken by the caller): this thread's
// signals as they were outside, so that a pending Ctrl-C is taken here, on a thread that is not
// computing; blocked again at the end.
class SignalsOpen {
 public:
  explicit SignalsOpen(const Computing& c);
  ~SignalsOpen();
  SignalsOpen(const SignalsOpen&) = delete;
  SignalsOpen& operator=(const SignalsOpen&) = delete;

 private:
  sigset_t inside_;
};

// For GenerateConfig::on_step within a Computing: between decoding steps, a pending signal (Ctrl-C)
// is taken on this thread with the GIL, and its Python handler's exception (KeyboardInterrupt)
// ends the generation; a handler that returns lets it go on. A step with nothing pending costs a
// sigpending call.
std::function<void(int64_t)> signals_between_steps(const Computing& c);

void bind_attention(py::module_& m);
void bind_model(py::module_& m);
void bind_train(py::module_& m);

}  // namespace qkv::python
