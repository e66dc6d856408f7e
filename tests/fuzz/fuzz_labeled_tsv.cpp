// label<TAB>text TSV: read_labeled_tsv (the file is the input).
#include "fuzz_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string path = fuzz::put_file("labeled.tsv", fuzz::bytes(data, size));
  std::vector<LabeledText> texts;
  ReadReport r;
  if (!fuzz::accepts([&] { texts = read_labeled_tsv(path, &r); })) return 0;
  for (const LabeledText& t : texts) {
    fuzz::check_field(t.label, "label");
    fuzz::check_field(t.text, "text");
  }
  fuzz::check_report(r, texts.size());
  return 0;
}
