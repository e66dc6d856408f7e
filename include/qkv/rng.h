// qkv/rng.h: a small deterministic random number generator for parameter initialisation and data
// shuffling: xoshiro256** (Blackman and Vigna), its state seeded from one 64-bit seed by
// SplitMix64. The same seed gives the same numbers on every platform and compiler (only integer
// arithmetic and the double functions log, sqrt, cos, sin are used, the last three only by
// normal()). Not for cryptography, and not thread-safe: give each thread its own Rng.
//
// (Dropout does not use this class: its mask is a pure function of (seed, stream, index), see
// src/kernels/dropout.h.)
#pragma once
#include <cstdint>

namespace qkv {

class Rng {
 public:
  // The full state: xoshiro's four words and the Box-Muller value normal() has in hand.
  struct State {
    uint64_t s[4];
    bool has_spare;
    double spare;
  };

  // s[0..3] <- the first four outputs of SplitMix64 started at `seed`; no spare normal.
  explicit Rng(uint64_t seed = 0);

  // The next xoshiro256** output.
  uint64_t next_u64();
  // Uniform on [0, 1) with 53 random bits: (next_u64() >> 11) * 2^-53.
  double uniform();
  // Standard normal by Box-Muller in double. Each pair of uniforms (u1, u2) gives two values,
  // r cos(2 pi u2) returned now and r sin(2 pi u2) kept as the spare and returned by the next
  // call, with r = sqrt(-2 log(1 - u1)) (1 - u1 lies in (0, 1], so r is finite).
  double normal();
  // Uniform integer in [0, n), unbiased: draws x until x >= 2^64 mod n, returns x mod n.
  // Throws qkv::Error if n == 0.
  uint64_t below(uint64_t n);

  State state() const;
  // Throws qkv::Error if s is all zero (xoshiro's one fixed point, never reached from a seed).
  void set_state(const State& st);

  // out_i <- float(mean + std * normal()) for i = 0, 1, ..., n - 1 (the stream in index order).
  // Throws qkv::Error unless mean and std are finite and std >= 0.
  // out: (n)
  void fill_normal(float* out, int64_t n, double mean, double std);
  // out_i <- float(lo + (hi - lo) * uniform()) in index order. The double lies in [lo, hi); once
  // rounded, values lie in [float(lo), float(hi)]: one just below hi can round up to float(hi)
  // (for U(0, 1), with probability about 2^-25).
  // Throws qkv::Error unless lo, hi and hi - lo are finite and lo <= hi.
  // out: (n)
  void fill_uniform(float* out, int64_t n, double lo, double hi);

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace qkv
