// source<TAB>target TSV: read_parallel_tsv (the file is the input).
#include "fuzz_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string path = fuzz::put_file("pairs.tsv", fuzz::bytes(data, size));
  std::vector<TextPair> pairs;
  ReadReport r;
  if (!fuzz::accepts([&] { pairs = read_parallel_tsv(path, &r); })) return 0;
  for (const TextPair& p : pairs) {
    fuzz::check_field(p.source, "source");
    fuzz::check_field(p.target, "target");
  }
  fuzz::check_report(r, pairs.size());
  return 0;
}
