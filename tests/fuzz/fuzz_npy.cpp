// .npy: parse_npy (what read_npy runs on a file's bytes). An accepted file must write back to
// bytes that read as the same tensor.
#include <cstring>

#include "fuzz_util.h"
#include "qkv/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  Tensor t;
  if (!fuzz::accepts([&] { t = parse_npy(fuzz::bytes(data, size), "fuzz.npy"); })) return 0;
  if (!t.is_contiguous()) fuzz::finding("parse_npy returned a non-contiguous tensor");
  const Tensor back = parse_npy(to_npy_bytes(t), "round trip");
  if (back.shape() != t.shape() || back.dtype() != t.dtype() ||
      (t.nbytes() > 0 && std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) != 0))
    fuzz::finding("an accepted .npy does not survive write + read: " + t.describe() + " vs " + back.describe());
  return 0;
}
