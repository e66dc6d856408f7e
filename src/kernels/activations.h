// Elementwise activations and gated activations (SwiGLU, GeGLU), forward and backward side by side. Each element is
// computed in double and rounded once to float, so results are within half an ulp or so of
// the exact value and never overflow in an intermediate (x^3 in tanh-GELU, exp in sigmoid)
// for any finite input. Results do not depend on the thread count.
//
// All pointers are contiguous arrays of n elements; outputs must not alias inputs. n == 0 is
// allowed.
#pragma once
#include <cstdint>

#include "qkv/activation.h"

namespace qkv::kernels {

using qkv::Activation;  // qkv/activation.h: one enum for kernels, ops and config

// y <- f(x)
// x, y: (n)
void activation_forward(Activation a, const float* x, float* y, int64_t n, int threads);

// dx <- dy * f'(x)   (dx overwritten)
// x, dy, dx: (n)
void activation_backward(Activation a, const float* x, const float* dy, float* dx, int64_t n, int threads);

// y <- f(x) and dydx <- f'(x), each rounded once to float (y bitwise as activation_forward).
// For training: the backward pass is then multiply(dy, dydx, dx), which costs no exponential.
// x, y, dydx: (n)
void activation_forward_grad(Activation a, const float* x, float* y, float* dydx, int64_t n, int threads);

// c <- a * b, elementwise
// a, b, c: (n)
void multiply(const float* a, const float* b, float* c, int64_t n, int threads);

// Gated (GLU variants): y <- f(a) * b; SwiGLU is f = SiLU, GeGLU f = GELU. f(a) * b is computed
// in double and rounded once.
// a, b, y: (n)
void gated_forward(Activation f, const float* a, const float* b, float* y, int64_t n, int threads);

// da <- dy * b * f'(a);  db <- dy * f(a)   (both overwritten)
// a, b, dy, da, db: (n)
void gated_backward(Activation f, const float* a, const float* b, const float* dy, float* da, float* db, int64_t n,
                    int threads);

}  // namespace qkv::kernels
