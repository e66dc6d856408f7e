// Aligned source and target files: read_parallel_files. The input up to its first NUL byte is
// the source file, the rest the target file (so only the target side ever holds a NUL).
#include <algorithm>

#include "fuzz_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  const size_t cut = std::min(in.find('\0'), in.size());
  const std::string src = fuzz::put_file("source.txt", in.substr(0, cut));
  const std::string tgt = fuzz::put_file("target.txt", cut < in.size() ? in.substr(cut + 1) : std::string());
  std::vector<TextPair> pairs;
  ReadReport r;
  if (!fuzz::accepts([&] { pairs = read_parallel_files(src, tgt, &r); })) return 0;
  for (const TextPair& p : pairs) {
    // Tabs are kept: these files are not TSV.
    for (const std::string* s : {&p.source, &p.target}) {
      if (s->empty() || s->find('\n') != std::string::npos || !utf8_problem(*s).empty())
        fuzz::finding("a parallel-files side is empty, holds a newline, or is not valid UTF-8");
      if (std::string(fuzz::kSpace).find(s->front()) != std::string::npos ||
          std::string(fuzz::kSpace).find(s->back()) != std::string::npos)
        fuzz::finding("a parallel-files side is not trimmed");
    }
  }
  fuzz::check_report(r, pairs.size());
  return 0;
}
