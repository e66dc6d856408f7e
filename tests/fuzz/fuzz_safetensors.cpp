// safetensors: parse_safetensors (bytes) and read_safetensors (the same bytes as a file, read
// with pread straight into each tensor) must agree: both refuse, or both return the same
// tensors and metadata.
#include <cstring>
#include <map>

#include "fuzz_util.h"
#include "qkv/safetensors.h"

namespace {

// Same names, tensors and metadata. Names are unique; the order of zero-size tensors that share
// an offset follows the header's key order, which a rewrite need not keep, so compare by name.
bool same(const qkv::SafetensorsFile& a, const qkv::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  auto by_name = [](const qkv::SafetensorsFile& f) {
    std::map<std::string, const qkv::Tensor*> m;
    for (const auto& [name, t] : f.tensors) m.emplace(name, &t);
    return m;
  };
  const auto ma = by_name(a), mb = by_name(b);
  if (ma.size() != a.tensors.size() || mb.size() != b.tensors.size()) return false;  // a repeated name
  for (auto ia = ma.begin(), ib = mb.begin(); ia != ma.end(); ++ia, ++ib) {
    const qkv::Tensor &x = *ia->second, &y = *ib->second;
    if (ia->first != ib->first || x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
    if (x.nbytes() > 0 && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  SafetensorsFile parsed, read;
  const bool parsed_ok = fuzz::accepts([&] { parsed = parse_safetensors(in, "fuzz.safetensors"); });
  const std::string path = fuzz::put_file("fuzz.safetensors", in);
  const bool read_ok = fuzz::accepts([&] { read = read_safetensors(path); });
  if (parsed_ok != read_ok)
    fuzz::finding(std::string("parse_safetensors ") + (parsed_ok ? "accepts" : "refuses") + " what read_safetensors " +
                  (read_ok ? "accepts" : "refuses"));
  if (parsed_ok && !same(parsed, read))
    fuzz::finding("parse_safetensors and read_safetensors return different tensors");
  if (parsed_ok) {
    // What was accepted writes back (BF16/F16 now as F32) and reads again as the same.
    std::vector<std::pair<std::string, Tensor>> tensors = parsed.tensors;
    const SafetensorsFile again = parse_safetensors(to_safetensors_bytes(tensors, parsed.metadata), "round trip");
    if (!same(parsed, again)) fuzz::finding("an accepted .safetensors does not survive write + read");
  }
  return 0;
}
