// attention_ref: the plain O(Tq*Tk) attention that materialises the whole score matrix of each
// (batch, head). Instantiated for double (the oracle every fast kernel is judged against) and
// for float (the "plain float32 implementation" whose error sets the bound for fused kernels).
#pragma once
#include <cstddef>

#include "kernels/attention_params.h"

namespace qkv::kernels {

// out: (B, H, Tq, Dv) contiguous   lse: (B, H, Tq) contiguous (-inf for a row with no allowed key)
template <class T>
void attention_ref_forward(const AttnInputs<T>& in, T* out, T* lse, int threads);

// dout: (B, H, Tq, Dv) contiguous. dq: (B, H, Tq, Dk), dk: (B, Hkv, Tk, Dk), dv: (B, Hkv, Tk, Dv),
// all contiguous and overwritten. Recomputes the probabilities from q and k.
template <class T>
void attention_ref_backward(const AttnInputs<T>& in, const T* dout, T* dq, T* dk, T* dv, int threads);


}  // namespace qkv::kernels
