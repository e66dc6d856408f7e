// qkv's Python module (qkv._qkv): what the binding files share. NumPy arrays cross into qkv
// without copies where their layout allows (qkv::Tensor::borrow) and results come back as NumPy
// arrays over qkv's own memory; docs/python.md.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>

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

void bind_attention(py::module_& m);
void bind_model(py::module_& m);
void bind_train(py::module_& m);

}  // namespace qkv::python
