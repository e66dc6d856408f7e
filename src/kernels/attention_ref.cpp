#include "kernels/attention_ref.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/quant.h"

namespace qkv::kernels {
namespace {

// x rounded to bfloat16 (through float32, nearest even) where the inputs ask for bf16 products
// (AttnInputs::bf16), else x: the operands the flash kernel rounds are rounded here too.
template <class T>
T rb(const AttnInputs<T>& in, T x) {
  return in.bf16 ? static_cast<T>(bf16_to_f32(f32_to_bf16(static_cast<float>(x)))) : x;
}

// P <- softmax(Q K^T * scale + bias) for one (b, h), written densely as (Tq, Tk); the row's
// logsumexp goes to lse[i] (and the max its exponentials were shifted by to mrow[i], if given).
// Blocked pairs get probability 0; a row with none allowed is all 0. With bf16 the scores are
// bf16(scale q) . bf16(k), as the flash kernel multiplies them.
template <class T>
void probabilities(const AttnInputs<T>& in, int64_t b, int64_t h, T* P, T* lse, T* mrow = nullptr) {
  const AttnShape& s = in.s;
  const int64_t hk = h / (s.H / s.Hkv);
  const T* q = in.q + b * in.qs.b + h * in.qs.h;
  const T* k = in.k + b * in.ks.b + hk * in.ks.h;
  const T scale = static_cast<T>(in.scale);
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < s.Tq; ++i) {
    T* row = P + i * s.Tk;
    const KeyRange r = key_range(s, in.m, b, i);
    const int64_t p = query_pos(s, in.m, i);
    // s_ij <- scale * q_i . k_j + bias_ij     (blocked: -inf)
    T mx = ninf;
    for (int64_t j = 0; j < s.Tk; ++j) {
      if (j < r.lo || j >= r.hi) {
        row[j] = ninf;
        continue;
      }
      T bias = in.m.elementwise() ? elementwise_bias<T>(in.m, b, h, i, j, p) : T(0);
      if (bias == ninf) {
        row[j] = ninf;
        continue;
      }
      T dot = 0;
      if (in.bf16) {
        for (int64_t d = 0; d < s.Dk; ++d)
          dot += rb(in, static_cast<T>(static_cast<float>(q[i * in.qs.t + d]) * static_cast<float>(scale))) *
                 rb(in, k[j * in.ks.t + d]);
        row[j] = dot + bias;
      } else {
        for (int64_t d = 0; d < s.Dk; ++d) dot += q[i * in.qs.t + d] * k[j * in.ks.t + d];
        row[j] = dot * scale + bias;
      }
      if (row[j] > mx) mx = row[j];  // NaN never wins a comparison: it reaches the sum below
    }
    // p_ij <- exp(s_ij - max) / sum_r exp(s_ir - max). A row whose every score is -inf (no
    // allowed key) gets zeros and lse -inf; a NaN score makes the sum NaN, and NaN propagates.
    const T m_use = mx == ninf ? T(0) : mx;
    if (mrow) mrow[i] = m_use;
    T sum = 0;
    for (int64_t j = 0; j < s.Tk; ++j) {
      row[j] = row[j] == ninf ? T(0) : std::exp(row[j] - m_use);
      sum += row[j];
    }
    if (sum == T(0)) {
      std::fill(row, row + s.Tk, T(0));
      lse[i] = ninf;
      continue;
    }
    for (int64_t j = 0; j < s.Tk; ++j) row[j] /= sum;
    lse[i] = m_use + std::log(sum);
  }
}

}  // namespace

template <class T>
void attention_ref_forward(const AttnInputs<T>& in, T* out, T* lse, int threads) {
  const AttnShape& s = in.s;
  const int64_t BH = s.B * s.H;
#pragma omp parallel num_threads(threads)
  {
    std::vector<T> P(static_cast<size_t>(s.Tq * s.Tk)), mrow(static_cast<size_t>(s.Tq));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H, hk = h / (s.H / s.Hkv);
      probabilities(in, b, h, P.data(), lse + bh * s.Tq, mrow.data());
      // out_i <- sum_j p_ij v_j. With bf16, as the kernel: sum_j bf16(e_ij) bf16(v_j) / sum_j e_ij
      // with e_ij = exp(s_ij - max_i) unrounded in the sum (= p_ij c_i, c_i = exp(lse_i - max_i)).
      const T* v = in.v + b * in.vs.b + hk * in.vs.h;
      T* o = out + bh * s.Tq * s.Dv;
      for (int64_t i = 0; i < s.Tq; ++i) {
        T* orow = o + i * s.Dv;
        std::fill(orow, orow + s.Dv, T(0));
        const T c = in.bf16 && lse[bh * s.Tq + i] != -std::numeric_limits<T>::infinity()
                        ? std::exp(lse[bh * s.Tq + i] - mrow[i])
                        : T(1);
        for (int64_t j = 0; j < s.Tk; ++j) {
          const T pij = P[i * s.Tk + j];
          if (pij == T(0)) continue;  // blocked keys' values are never read
          const T w = in.bf16 ? rb(in, pij * c) / c : pij;
          for (int64_t d = 0; d < s.Dv; ++d) orow[d] += w * rb(in, v[j * in.vs.t + d]);
        }
      }
    }
  }
}

template <class T>
void attention_ref_backward(const AttnInputs<T>& in, const T* dout, T* dq, T* dk, T* dv, int threads) {
  const AttnShape& s = in.s;
  const int64_t group = s.H / s.Hkv;
  const T scale = static_cast<T>(in.scale);
  std::fill(dk, dk + s.B * s.Hkv * s.Tk * s.Dk, T(0));
  std::fill(dv, dv + s.B * s.Hkv * s.Tk * s.Dv, T(0));
  // One (b, kv-head) per task: the heads sharing it accumulate into its dk, dv in order.
#pragma omp parallel num_threads(threads)
  {
    std::vector<T> P(static_cast<size_t>(s.Tq * s.Tk)), dP(static_cast<size_t>(s.Tq * s.Tk));
    std::vector<T> lse(static_cast<size_t>(s.Tq)), mrow(static_cast<size_t>(s.Tq)), o(static_cast<size_t>(s.Dv));
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < s.B * s.Hkv; ++bk) {
      const int64_t b = bk / s.Hkv, hk = bk % s.Hkv;
      const T* k = in.k + b * in.ks.b + hk * in.ks.h;
      const T* v = in.v + b * in.vs.b + hk * in.vs.h;
      T* dkb = dk + bk * s.Tk * s.Dk;
      T* dvb = dv + bk * s.Tk * s.Dv;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t bh = b * s.H + h;
        const T* q = in.q + b * in.qs.b + h * in.qs.h;
        const T* dO = dout + bh * s.Tq * s.Dv;
        T* dqb = dq + bh * s.Tq * s.Dk;
        probabilities(in, b, h, P.data(), lse.data(), mrow.data());
        for (int64_t i = 0; i < s.Tq; ++i) {
          const T* Pi = P.data() + i * s.Tk;
          T* dPi = dP.data() + i * s.Tk;
          // dP_ij <- dO_i . v_j ;  D_i <- sum_j P_ij dP_ij
          T Di = 0;
          for (int64_t j = 0; j < s.Tk; ++j) {
            if (Pi[j] == T(0)) {
              dPi[j] = 0;
              continue;
            }
            T acc = 0;
            for (int64_t d = 0; d < s.Dv; ++d) acc += rb(in, dO[i * s.Dv + d]) * rb(in, v[j * in.vs.t + d]);
            dPi[j] = acc;
            Di += Pi[j] * acc;
          }
          if (in.bf16 && lse[i] != -std::numeric_limits<T>::infinity()) {
            // D_i <- dO_i . O_i with O_i the bf16 forward's output (as the flash kernel forms D;
            // with bf16 products the two ways differ by about one rounding of P and dO)
            const T c = std::exp(lse[i] - mrow[i]);
            std::fill(o.begin(), o.end(), T(0));
            for (int64_t j = 0; j < s.Tk; ++j)
              if (Pi[j] != T(0))
                for (int64_t d = 0; d < s.Dv; ++d) o[d] += rb(in, Pi[j] * c) / c * rb(in, v[j * in.vs.t + d]);
            Di = 0;
            for (int64_t d = 0; d < s.Dv; ++d) Di += dO[i * s.Dv + d] * o[d];
          }
          // dS_ij <- P_ij (dP_ij - D_i);  dV_j += P_ij dO_i;  dQ_i = scale sum_j dS_ij k_j;  dK_j += scale dS_ij q_i
          // (bf16: each product's operands rounded as the kernel rounds them, the scale inside
          // bf16(scale q_i) for dK and applied after the sum for dQ)
          T* dqi = dqb + i * s.Dk;
          std::fill(dqi, dqi + s.Dk, T(0));
          for (int64_t j = 0; j < s.Tk; ++j) {
            if (Pi[j] == T(0)) continue;
            if (in.bf16) {
              const T dS = rb(in, Pi[j] * (dPi[j] - Di)), p = rb(in, Pi[j]);
              for (int64_t d = 0; d < s.Dv; ++d) dvb[j * s.Dv + d] += p * rb(in, dO[i * s.Dv + d]);
              for (int64_t d = 0; d < s.Dk; ++d) {
                dqi[d] += scale * (dS * rb(in, k[j * in.ks.t + d]));
                dkb[j * s.Dk + d] +=
                    dS * rb(in, static_cast<T>(static_cast<float>(q[i * in.qs.t + d]) * static_cast<float>(scale)));
              }
              continue;
            }
            const T dS = Pi[j] * (dPi[j] - Di) * scale;
            for (int64_t d = 0; d < s.Dv; ++d) dvb[j * s.Dv + d] += Pi[j] * dO[i * s.Dv + d];
            for (int64_t d = 0; d < s.Dk; ++d) {
              dqi[d] += dS * k[j * in.ks.t + d];
              dkb[j * s.Dk + d] += dS * q[i * in.qs.t + d];
            }
          }
        }
      }
    }
  }
}

template void attention_ref_forward<float>(const AttnInputs<float>&, float*, float*, int);
template void attention_ref_forward<double>(const AttnInputs<double>&, double*, double*, int);
template void attention_ref_backward<float>(const AttnInputs<float>&, const float*, float*, float*, float*, int);
template void attention_ref_backward<double>(const AttnInputs<double>&, const double*, double*, double*, double*, int);

}  // namespace qkv::kernels
