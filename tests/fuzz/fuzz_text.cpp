// Plain text for language models: read_lines (the file is the input). Text lines are verbatim
// and never blank; "" marks a paragraph break and sits only between two text lines.
#include "fuzz_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string path = fuzz::put_file("text.txt", fuzz::bytes(data, size));
  std::vector<std::string> lines;
  ReadReport r;
  if (!fuzz::accepts([&] { lines = read_lines(path, &r); })) return 0;
  size_t text_lines = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.empty()) {
      if (i == 0 || i + 1 == lines.size() || lines[i - 1].empty()) fuzz::finding("a paragraph break out of place");
      continue;
    }
    ++text_lines;
    if (l.find_first_not_of(fuzz::kSpace) == std::string::npos) fuzz::finding("a blank line returned as text");
    if (l.find('\n') != std::string::npos || !utf8_problem(l).empty())
      fuzz::finding("a text line holds a newline, a NUL or invalid UTF-8");
  }
  fuzz::check_report(r, text_lines);
  return 0;
}
