// fuzz_make_corpus DIR: writes the seed corpora, DIR/<target>/<seed>, a few small valid inputs
// per fuzz target, made with qkv's own writers where there is one. The committed
// tests/fuzz/corpus/ is this program's output; rerun it when a format changes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_trainer.h>

#include "qkv/model.h"
#include "qkv/npy.h"
#include "qkv/safetensors.h"
#include "qkv/task.h"
#include "qkv/tensor.h"
#include "tiny_tokenizers.h"

namespace {

namespace fs = std::filesystem;
using namespace qkv;

std::string g_root;

// Sentences for SentencePiece's trainer, one by one.
class SentenceVector final : public sentencepiece::SentenceIterator {
 public:
  explicit SentenceVector(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

void put(const std::string& target, const std::string& name, const std::string& bytes);

// Small Hugging Face tokenizer.json files, one per family's shape, each followed (after a NUL)
// by a text to encode.
void hf_tokenizers() {
  using Json = nlohmann::json;
  const auto file = [](Json model, Json added, Json normalizer, Json pre, Json post, Json decoder) {
    return Json{{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
                {"normalizer", normalizer}, {"pre_tokenizer", pre}, {"post_processor", post}, {"decoder", decoder},
                {"model", model}}.dump();
  };
  const auto special = [](int id, const char* content) {
    return Json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                {"normalized", false}, {"special", true}};
  };
  const std::string text = std::string(1, '\0') + "Hello world, the cat's caf\xc3\xa9!";
  // byte-level BPE (GPT-2): the letters h e l o, "\u0120", merges to "he", "ll", "hell", "hello"
  const Json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const Json bpe = {{"type", "BPE"},
                    {"vocab", {{"h", 0}, {"e", 1}, {"l", 2}, {"o", 3}, {"\u0120", 4}, {"he", 5}, {"ll", 6}, {"hell", 7},
                               {"hello", 8}, {"<|endoftext|>", 9}}},
                    {"merges", {"h e", "l l", "he ll", "hell o"}}};
  put("hf_tokenizer", "gpt2", file(bpe, {special(9, "<|endoftext|>")}, nullptr, bl, bl, bl) + text);
  // WordPiece (BERT): BertNormalizer, BertPreTokenizer, [CLS] $A [SEP]
  const Json wp = {{"type", "WordPiece"},
                   {"unk_token", "[UNK]"},
                   {"vocab", {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3}, {"[MASK]", 4}, {"hello", 5},
                              {"world", 6}, {"##s", 7}, {",", 8}}}};
  const Json cls = {{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}}, seq = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
             sep = {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}};
  const Json tmpl = {{"type", "TemplateProcessing"},
                     {"single", {cls, seq, sep}},
                     {"pair", Json::array()},
                     {"special_tokens", {{"[CLS]", {{"id", "[CLS]"}, {"ids", {2}}, {"tokens", {"[CLS]"}}}},
                                         {"[SEP]", {{"id", "[SEP]"}, {"ids", {3}}, {"tokens", {"[SEP]"}}}}}}};
  put("hf_tokenizer", "bert",
      file(wp, {special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"), special(3, "[SEP]"), special(4, "[MASK]")},
           {{"type", "BertNormalizer"}, {"lowercase", true}}, {{"type", "BertPreTokenizer"}}, tmpl,
           {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}) +
          text);
  // Unigram with Metaspace and byte fallback (SentencePiece-converted)
  Json pieces = Json::array({Json::array({"<unk>", 0.0}), Json::array({"\u2581", -2.0}), Json::array({"\u2581hello", -3.0}),
                             Json::array({"o", -4.0}), Json::array({"<0xC3>", 0.0}), Json::array({"<0xA9>", 0.0})});
  put("hf_tokenizer", "unigram",
      file({{"type", "Unigram"}, {"unk_id", 0}, {"byte_fallback", true}, {"vocab", pieces}}, {special(0, "<unk>")},
           {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}},
           {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}}, nullptr,
           {{"type", "Sequence"}, {"decoders", {{{"type", "Metaspace"}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}) +
          text);
  // Llama-3's Split regex in front of a byte-level BPE
  const Json split = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "Split"},
                         {"pattern", {{"Regex", "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s+(?!\\S)|\\s+"}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  Json bpe3 = bpe;
  bpe3["ignore_merges"] = true;
  put("hf_tokenizer", "llama3", file(bpe3, {special(9, "<|endoftext|>")}, nullptr, split, nullptr, bl) + text);
}

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_root + "/" + target);
  std::ofstream f(g_root + "/" + target + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error("cannot write seed " + target + "/" + name);
}

// A .safetensors file from its header JSON and data section, as written by hand.
std::string safetensors(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

void npy() {
  put("npy", "f32_2x3.npy", to_npy_bytes(Tensor::from<float>({2, 3}, {1, -2, 3.5f, 0, 1e-3f, -1e30f})));
  put("npy", "f64_3.npy", to_npy_bytes(Tensor::from<double>({3}, {1, 2, 3})));
  put("npy", "i32_scalar.npy", to_npy_bytes(Tensor::from<int32_t>({}, {7})));
  put("npy", "i64_2x2.npy", to_npy_bytes(Tensor::from<int64_t>({2, 2}, {1, 2, 3, 4})));
  put("npy", "bool_4.npy", to_npy_bytes(Tensor::from<bool>({4}, {true, false, true, true})));
  put("npy", "f32_0x3.npy", to_npy_bytes(Tensor::zeros({0, 3})));
  // Fortran order and format 2.0 (32-bit header length), as NumPy writes them.
  std::string f = to_npy_bytes(Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  f.replace(f.find("False"), 5, "True ");
  put("npy", "f32_2x3_fortran.npy", f);
  std::string v2 = to_npy_bytes(Tensor::from<int32_t>({3}, {1, 2, 3}));
  const uint16_t hlen =
      static_cast<uint16_t>(static_cast<unsigned char>(v2[8]) | static_cast<unsigned char>(v2[9]) << 8);
  v2[6] = 2;
  v2.replace(8, 2, std::string{static_cast<char>(hlen & 0xff), static_cast<char>(hlen >> 8), '\0', '\0'});
  put("npy", "i32_3_v2.npy", v2);
}

void safetensors_seeds() {
  put("safetensors", "f32_i64_meta.safetensors",
      to_safetensors_bytes(
          {{"w", Tensor::from<float>({2, 2}, {1, 2, 3, 4})}, {"ids", Tensor::from<int64_t>({3}, {0, 1, 2})}},
          {{"format", "pt"}}));
  put("safetensors", "bool_f64_empty.safetensors",
      to_safetensors_bytes({{"mask", Tensor::from<bool>({3}, {true, false, true})},
                            {"x", Tensor::from<double>({1}, {0.5})},
                            {"empty", Tensor::zeros({0, 4})}}));
  put("safetensors", "i32_scalar.safetensors", to_safetensors_bytes({{"step", Tensor::from<int32_t>({}, {42})}}));
  // Half precision (read only): BF16 1.0, -2.0; F16 1.0, 65504, a subnormal, -inf.
  put("safetensors", "bf16_f16.safetensors",
      safetensors(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F16","shape":[2,2],"data_offsets":[4,12]}})",
                  std::string("\x80\x3f\x00\xc0\x00\x3c\xff\x7b\x01\x00\x00\xfc", 12)));
  put("safetensors", "no_tensors.safetensors", safetensors(R"({"__metadata__":{"k":"v"}})", ""));
}

void configs() {
  ModelConfig d;
  d.vocab_size = 50;
  d.d_model = 64;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.d_ff = 128;
  d.n_layers = 2;
  d.norm_first = true;
  d.positional = Positional::Rope;
  d.activation = Activation::SiLU;
  d.gated = true;
  d.norm = NormKind::RMSNorm;
  d.pad_id = 0;
  put("config", "decoder.json", d.to_json());
  ModelConfig ed;
  ed.arch = Arch::EncoderDecoder;
  ed.vocab_size = 100;
  ed.src_vocab_size = 120;
  ed.d_model = 32;
  ed.n_heads = 2;
  ed.d_ff = 64;
  ed.n_encoder_layers = 1;
  ed.n_decoder_layers = 2;
  ed.tie_embeddings = true;
  ed.scale_embeddings = true;
  ed.bos_id = 1;
  ed.eos_id = 2;
  put("config", "encoder_decoder.json", ed.to_json());
  ModelConfig c;
  c.arch = Arch::EncoderClassifier;
  c.vocab_size = 259;
  c.d_model = 16;
  c.n_heads = 2;
  c.d_k = 6;
  c.d_v = 4;
  c.d_ff = 32;
  c.n_layers = 1;
  c.num_classes = 3;
  c.pooling = Pooling::First;
  c.positional = Positional::Learned;
  c.max_len = 64;
  c.activation = Activation::GeluTanh;
  put("config", "encoder_classifier.json", c.to_json());
  put("config", "minimal.json",
      R"({"arch": "decoder", "vocab_size": 8, "d_model": 8, "n_heads": 2, "d_ff": 8,)"
      R"( "n_layers": 1, "positional": "alibi", "activation": "gelu", "dropout": 0.1})"
      "\n");
}

void task_and_train_json() {
  put("task_json", "translate.json", "{\n  \"max_len\": 64,\n  \"task\": \"translate\"\n}\n");
  put("task_json", "lm.json", "{\"task\": \"lm\", \"max_len\": 128}\n");
  put("task_json", "classify.json",
      "{\"labels\": [\"new\", \"old\", \"\\u00e9\"], \"max_len\": 64, \"task\": \"classify\"}\n");
  // As `qkv train` writes it (options_json in src/train/train_run.cpp).
  const nlohmann::json j = {{"task", "translate"},
                            {"data", "ding.tsv"},
                            {"source", ""},
                            {"target", ""},
                            {"preset", "tiny"},
                            {"config", ""},
                            {"tokenizer", ""},
                            {"spm_type", "unigram"},
                            {"vocab", 0},
                            {"max_tokens", 2500},
                            {"max_len", 64},
                            {"valid_fraction", 0.02},
                            {"test_fraction", 0.02},
                            {"seed", 1},
                            {"lr", 0.0},
                            {"warmup", -1},
                            {"dropout", -1.0},
                            {"label_smoothing", -1.0},
                            {"eval_every", 0}};
  put("train_json", "translate.json", j.dump(2) + "\n");
  put("train_json", "lm.json",
      R"({"task": "lm", "data": "kjv.txt", "preset": "small", "max_tokens": 6144, "max_len": 256,)"
      R"( "seed": 18446744073709551615, "eval_every": 500, "valid_fraction": 0.5, "test_fraction": 0})");
}

void tokenizers() {
  put("tokenizer_json", "byte.json", "{\"type\": \"byte\"}\n");
  put("tokenizer_json", "gpt2.json",
      "{\n  \"encoder\": \"encoder.json\",\n  \"type\": \"gpt2\",\n  \"vocab\": \"vocab.bpe\"\n}\n");
  put("tokenizer_json", "sentencepiece.json", "{\"type\": \"sentencepiece\", \"model\": \"tokenizer.model\"}\n");

  const auto [enc, bpe] = fuzz::tiny_gpt2();
  put("gpt2", "tiny", enc + std::string(1, '\0') + bpe);
  const auto [enc0, bpe0] = fuzz::tiny_gpt2({});
  put("gpt2", "bytes_only", enc0 + std::string(1, '\0') + bpe0);
  hf_tokenizers();

  const std::string tmp = g_root + "/.spm";
  fs::create_directories(tmp);
  put("sentencepiece", "unigram.model", fuzz::tiny_sentencepiece("unigram", 320, tmp));
  put("sentencepiece", "bpe.model", fuzz::tiny_sentencepiece("bpe", 320, tmp));
  // A model with a precompiled normalisation map (a darts-clone trie inside the model file,
  // which SentencePiece uses as it is): three rules from a TSV, so the map stays small.
  {
    put(".spm", "rules.tsv", "41\t61\nC9\t65 301\nFB01\t66 69\n");  // A -> a, É -> e + accent, ﬁ -> fi
    std::string model;
    const std::unordered_map<std::string, std::string> args = {
        {"model_type", "unigram"}, {"vocab_size", "320"}, {"normalization_rule_tsv", tmp + "/rules.tsv"},
        {"byte_fallback", "true"}, {"hard_vocab_limit", "false"},  {"minloglevel", "100"}};
    const std::vector<std::string> sentences = fuzz::tiny_sentences();
    SentenceVector it(sentences);
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (!status.ok()) throw Error("SentencePiece training with rules failed: " + status.ToString());
    put("sentencepiece", "unigram_rules.model", model);
  }
  fs::remove_all(tmp);
}

void data() {
  put("tsv", "pairs.tsv", "Hello.\tHallo.\nHow are you?\tWie geht es dir?\n\n  Thanks. \t Danke. \n");
  put("tsv", "crlf_bom_malformed.tsv",
      "\xEF\xBB\xBFYes.\tJa.\r\nno tab here\r\nA\tB\tC\r\n\tempty source\r\nCaf\xc3\xa9\tKaffee\r\n");
  put("labeled_tsv", "labels.tsv", "old\tIn the beginning God created the heaven and the earth.\nnew\tJesus wept.\n");
  put("labeled_tsv", "malformed.tsv", "\xEF\xBB\xBFpos\tgood\r\nneg\t\nneu\tbad \xff byte\n\nneg\tbad\n");
  put("text", "verses.txt", "In the beginning was the Word.\n\nAnd the Word was with God.\nAmen.\n");
  put("text", "paragraphs.txt", "\xEF\xBB\xBF\n\nfirst line\r\n   \r\nsecond\tline \xe6\x97\xa5\n\n\nlast\n\n");
  put("parallel_files", "aligned",
      "Hello.\nHow are you?\n\nYes.\n" + std::string(1, '\0') + "Hallo.\nWie geht es?\n\nJa.\n");
  put("parallel_files", "unequal", "a\nb\n" + std::string(1, '\0') + "x\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus DIR\n");
    return 2;
  }
  g_root = argv[1];
  try {
    npy();
    safetensors_seeds();
    configs();
    task_and_train_json();
    tokenizers();
    data();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
