// qkv/activation.h: the elementwise nonlinearities, one enum for the kernels
// (src/kernels/activations.h), the ops (qkv/ops.h) and the model config (qkv/config.h).
// Gating (GLU variants: f(x W1) * (x W3)) is a property of the feed-forward part, not a separate
// activation: SwiGLU is SiLU, gated; GeGLU is GELU, gated.
#pragma once

namespace qkv {

enum class Activation {
  ReLU,      // max(x, 0); derivative 0 at x = 0 (as PyTorch)
  GeluErf,   // 0.5 x (1 + erf(x / sqrt(2)))                       (PyTorch approximate='none'; HF "gelu")
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (PyTorch approximate='tanh'; HF "gelu_new")
  SiLU,      // x sigmoid(x)                                       (HF "silu" / "swish")
  Tanh,      // tanh(x)                                            (BERT's pooler)
};

// "relu", "gelu", "gelu_tanh", "silu", "tanh": the names config.json uses.
const char* activation_name(Activation a);

}  // namespace qkv
