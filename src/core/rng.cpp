#include "qkv/rng.h"

#include <cmath>

#include "qkv/error.h"

namespace qkv {
namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// SplitMix64 (Steele, Lea and Flood): advance the state by the golden gamma, mix it.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& w : s_) w = splitmix64(x);
}

// xoshiro256** 1.0, as published at prng.di.unimi.it.
uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    const double v = spare_;
    has_spare_ = false;
    spare_ = 0.0;  // so state() reports the same State for the same position in the stream
    return v;
  }
  // r <- sqrt(-2 log(1 - u1));  (r cos(2 pi u2), r sin(2 pi u2)) are two independent N(0, 1)
  const double u1 = uniform(), u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(1.0 - u1));
  const double a = kTwoPi * u2;
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}

uint64_t Rng::below(uint64_t n) {
  check(n >= 1, "Rng::below(n): n = 0, expected n >= 1");
  // 2^64 mod n: rejecting x below it leaves 2^64 - (2^64 mod n) values, a multiple of n.
  const uint64_t reject_below = (0 - n) % n;
  uint64_t x = next_u64();
  while (x < reject_below) x = next_u64();
  return x % n;
}

Rng::State Rng::state() const {
  State st{};
  for (int k = 0; k < 4; ++k) st.s[k] = s_[k];
  st.has_spare = has_spare_;
  st.spare = spare_;
  return st;
}

void Rng::set_state(const State& st) {
  check((st.s[0] | st.s[1] | st.s[2] | st.s[3]) != 0,
        "Rng::set_state: state words are all zero (xoshiro256** would output zeros forever)");
  for (int k = 0; k < 4; ++k) s_[k] = st.s[k];
  has_spare_ = st.has_spare;
  spare_ = st.has_spare ? st.spare : 0.0;
}

void Rng::fill_normal(float* out, int64_t n, double mean, double std) {
  // out: (n)
  check(std::isfinite(mean) && std::isfinite(std) && std >= 0, "Rng::fill_normal: mean = ", mean, ", std = ", std,
        ": expected finite values with std >= 0");
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(mean + std * normal());
}

void Rng::fill_uniform(float* out, int64_t n, double lo, double hi) {
  // out: (n)
  check(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && std::isfinite(hi - lo), "Rng::fill_uniform: lo = ", lo,
        ", hi = ", hi, ": expected finite bounds with lo <= hi and a finite hi - lo");
  const double width = hi - lo;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(lo + width * uniform());
}

}  // namespace qkv
