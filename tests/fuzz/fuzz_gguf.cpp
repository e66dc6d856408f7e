// GGUF: the reader (header, metadata, tensor infos against the file), then, for a file it
// accepts, every tensor's rows as float32, the model and the tokenizer the file describes. Each
// either refuses with qkv::Error or succeeds; a crash, a sanitizer report, a hang or an
// allocation beyond the input's size (the tensors must be in the file) is a finding.
#include "fuzz_util.h"
#include "qkv/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string path = fuzz::put_file("fuzz.gguf", fuzz::bytes(data, size));
  std::unique_ptr<GgufFile> f;
  if (!fuzz::accepts([&] { f = std::make_unique<GgufFile>(path); })) return 0;
  for (const GgufFile::Tensor& t : f->tensors()) {
    if (t.ne[0] > (int64_t{1} << 16)) continue;
    std::vector<float> row(static_cast<size_t>(t.ne[0]));
    for (int64_t r = 0; r < t.rows() && r < 4; ++r) fuzz::accepts([&] { f->read_rows_f32(t, r, 1, row.data()); });
  }
  fuzz::accepts([&] { (void)load_gguf_tokenizer(*f); });
  fuzz::accepts([&] { (void)load_gguf_model(path); });
  return 0;
}
