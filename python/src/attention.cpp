// qkv._qkv.attention / attention_backward / attention_weights: qkv/attention.h on NumPy arrays.
// Every mask kind, either causal alignment, windows, ALiBi, grouped-query heads, Dk != Dv; the
// flash kernel (float32), the float64 oracle (float32 or float64 in, the same type out) or the
// plain float32 reference. The kernels run with the GIL released.
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/attention.h"

namespace qkv::python {
namespace {

// The keyword arguments every attention call takes, as qkv's AttentionSpec. The arrays are
// borrowed (or converted) here, with the GIL held.
AttentionSpec spec_of(const py::object& mask, const py::object& bool_mask, const py::object& key_lengths,
                      const py::object& causal, const py::object& window, const py::object& alibi,
                      const py::object& scale, const std::string& impl, int threads) {
  AttentionSpec s;
  if (!mask.is_none()) s.mask = tensor_of(mask, DType::F32, "mask");
  if (!bool_mask.is_none()) s.bool_mask = tensor_of(bool_mask, DType::Bool, "bool_mask");
  if (!key_lengths.is_none()) s.key_lengths = tensor_of(key_lengths, DType::I64, "key_lengths");
  if (py::isinstance<py::bool_>(causal)) {
    s.causal = causal.cast<bool>();
  } else if (py::isinstance<py::str>(causal)) {
    const std::string c = causal.cast<std::string>();
    if (c != "bottom-right" && c != "top-left")
      throw py::value_error("causal: '" + c + "'; expected False, True, 'bottom-right' or 'top-left'");
    s.causal = true;
    s.align = c == "top-left" ? Align::TopLeft : Align::BottomRight;
  } else if (!causal.is_none()) {
    throw py::type_error("causal: expected False, True, 'bottom-right' or 'top-left'");
  }
  if (!window.is_none()) {
    if (!py::isinstance<py::int_>(window) || py::isinstance<py::bool_>(window))
      throw py::type_error("window: expected a whole number of keys (or None)");
    s.window = window.cast<int64_t>();
    if (s.window < 1) throw py::value_error("window: " + std::to_string(s.window) + "; expected >= 1 (or None: no window)");
  }
  if (py::isinstance<py::bool_>(alibi)) {
    s.alibi = alibi.cast<bool>();
  } else if (!alibi.is_none()) {
    s.alibi_slopes = alibi.cast<std::vector<float>>();  // one slope per query head
    s.alibi = true;
  }
  if (!scale.is_none()) s.scale = scale.cast<double>();
  if (impl == "flash") s.impl = AttentionImpl::Flash;
  else if (impl == "reference") s.impl = AttentionImpl::Reference;
  else if (impl == "reference32") s.impl = AttentionImpl::ReferenceFloat32;
  else throw py::value_error("impl: '" + impl + "'; expected 'flash', 'reference' (float64) or 'reference32'");
  if (threads < 0) throw py::value_error("threads: " + std::to_string(threads) + "; expected >= 0 (0: qkv's default)");
  s.threads = threads;
  return s;
}

// float64 in, float64 out on the float64 reference; float32 everywhere else
DType compute_type(const py::object& q, const std::string& impl) {
  if (impl != "reference") return DType::F32;
  py::array a = py::array::ensure(q);
  return a && a.dtype().is(py::dtype::of<double>()) ? DType::F64 : DType::F32;
}

#define QKV_ATTENTION_KWARGS                                                                                     \
  py::kw_only(), py::arg("mask") = py::none(), py::arg("bool_mask") = py::none(),                                 \
      py::arg("key_lengths") = py::none(), py::arg("causal") = false, py::arg("window") = py::none(),             \
      py::arg("alibi") = false, py::arg("scale") = py::none(), py::arg("impl") = "flash", py::arg("threads") = 0

}  // namespace

void bind_attention(py::module_& m) {
  m.def(
      "attention",
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& mask,
         const py::object& bool_mask, const py::object& key_lengths, const py::object& causal, const py::object& window,
         const py::object& alibi, const py::object& scale, const std::string& impl, int threads) {
        const DType t = compute_type(q, impl);
        const Tensor qt = tensor_of(q, t, "q"), kt = tensor_of(k, t, "k"), vt = tensor_of(v, t, "v");
        const AttentionSpec s = spec_of(mask, bool_mask, key_lengths, causal, window, alibi, scale, impl, threads);
        AttentionOutput o;
        {
          Computing computing;
          o = attention(qt, kt, vt, s);
        }
        return py::make_tuple(numpy_of(o.out), numpy_of(o.lse));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), QKV_ATTENTION_KWARGS,
      "(out, lse) = softmax(q k^T * scale + masks) v and its log-sum-exp per query row (qkv/attention.h)");
  m.def(
      "attention_backward",
      [](const py::object& q, const py::object& k, const py::object& v, const py::object& out, const py::object& lse,
         const py::object& dout, const py::object& mask, const py::object& bool_mask, const py::object& key_lengths,
         const py::object& causal, const py::object& window, const py::object& alibi, const py::object& scale,
         const std::string& impl, int threads) {
        const DType t = compute_type(q, impl);
        const Tensor qt = tensor_of(q, t, "q"), kt = tensor_of(k, t, "k"), vt = tensor_of(v, t, "v"),
                     ot = tensor_of(out, t, "out"), lt = tensor_of(lse, t, "lse"), dt = tensor_of(dout, t, "dout");
        const AttentionSpec s = spec_of(mask, bool_mask, key_lengths, causal, window, alibi, scale, impl, threads);
        AttentionGrads g;
        {
          Computing computing;
          g = attention_backward(qt, kt, vt, ot, lt, dt, s);
        }
        return py::make_tuple(numpy_of(g.dq), numpy_of(g.dk), numpy_of(g.dv));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"), QKV_ATTENTION_KWARGS,
      "(dq, dk, dv): the gradients of sum(out * dout), from attention()'s out and lse");
  m.def(
      "attention_weights",
      [](const py::object& q, const py::object& k, const py::object& lse, int64_t row_begin, int64_t row_end,
         const py::object& mask, const py::object& bool_mask, const py::object& key_lengths, const py::object& causal,
         const py::object& window, const py::object& alibi, const py::object& scale, const std::string& impl,
         int threads) {
        const Tensor qt = tensor_of(q, DType::F32, "q"), kt = tensor_of(k, DType::F32, "k"),
                     lt = tensor_of(lse, DType::F32, "lse");
        const AttentionSpec s = spec_of(mask, bool_mask, key_lengths, causal, window, alibi, scale, impl, threads);
        Tensor w;
        {
          Computing computing;
          w = attention_weights(qt, kt, lt, s, row_begin, row_end);
        }
        return numpy_of(w);
      },
      py::arg("q"), py::arg("k"), py::arg("lse"), py::arg("row_begin"), py::arg("row_end"), QKV_ATTENTION_KWARGS,
      "The attention weights of query rows [row_begin, row_end), recomputed from the saved lse");
  m.def("alibi_slopes", &alibi_slopes, py::arg("heads"), "The standard ALiBi slopes for this many heads");
  m.def(
      "_time_attention",
      [](const py::object& q, const py::object& k, const py::object& v, bool causal, int reps) {
        // seconds per call of qkv::attention on these arrays, timed in C++ (the binding's overhead
        // is what a Python loop over qkv.attention adds to this)
        const Tensor qt = tensor_of(q, DType::F32, "q"), kt = tensor_of(k, DType::F32, "k"),
                     vt = tensor_of(v, DType::F32, "v");
        AttentionSpec s;
        s.causal = causal;
        Computing computing;
        attention(qt, kt, vt, s);  // warm
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) attention(qt, kt, vt, s);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(reps, 1);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("reps") = 100);
  m.def("_address", [](const py::object& a) {
    // the memory a float32 array's tensor reads (tests: the same as the array's when borrowed)
    return reinterpret_cast<uintptr_t>(tensor_of(a, DType::F32, "a").raw_data());
  });
}

}  // namespace qkv::python
