// SentencePiece models: a thin wrapper over sentencepiece::SentencePieceProcessor, plus training
// in memory (sentences from a vector, the model returned as a serialized proto, no files).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "io/json_strict.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/tokenizer.h"
#include "text/hf_export.h"

namespace qkv {

namespace {

using Json = nlohmann::json;

// A SentencePiece status as words for a user: its message without the code name and the
// "./src/file.cc(232) [condition] " place that SentencePiece's checks put in front of it.
std::string status_text(const sentencepiece::util::Status& st, const char* if_empty) {
  std::string m = st.error_message() ? st.error_message() : "";
  if (const size_t cc = m.find(".cc("); cc != std::string::npos) {
    const size_t close = m.find(')', cc);
    m.erase(0, close == std::string::npos ? m.size() : close + 1);
    while (!m.empty() && m.front() == ' ') m.erase(0, 1);
    if (!m.empty() && m.front() == '[') {
      const size_t end = m.find("] ");
      m.erase(0, end == std::string::npos ? m.size() : end + 2);
    }
  }
  while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
  return m.empty() ? if_empty : m;
}

// What tokenizer.json needs of a ModelProto besides its pieces (read by read_spec, below).
struct SpmSpec {
  int model_type = 1;  // TrainerSpec.model_type: 1 unigram, 2 BPE, 3 word, 4 char
  bool byte_fallback = false, add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  std::string normalizer_name, charsmap;
};
SpmSpec read_spec(std::string_view bytes, const std::string& name);

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp, bool add_bos, bool add_eos)
      : sp_(std::move(sp)), add_bos_(add_bos), add_eos_(add_eos) {}

  std::string sentencepiece_vocab(std::vector<std::string>* pieces, std::vector<float>* scores,
                                  std::vector<int32_t>* types, bool* add_bos, bool* add_space_prefix) const override {
    const SpmSpec spec = read_spec(sp_->serialized_model_proto(), "tokenizer.model");
    if (spec.model_type != 2) return "a SentencePiece unigram model (GGUF's \"llama\" tokenizer merges by score, as BPE)";
    if (!spec.charsmap.empty() || spec.remove_extra_whitespaces || !spec.escape_whitespaces)
      return "a SentencePiece model that normalises its text (GGUF's \"llama\" tokenizer does not)";
    *add_space_prefix = spec.add_dummy_prefix;
    const int n = sp_->GetPieceSize();
    for (int i = 0; i < n; ++i) {
      pieces->push_back(sp_->IdToPiece(i));
      scores->push_back(sp_->GetScore(i));
      types->push_back(sp_->IsUnknown(i) ? 2 : sp_->IsControl(i) ? 3 : sp_->IsUnused(i) ? 5 : sp_->IsByte(i) ? 6 : 1);
    }
    *add_bos = add_bos_;
    return "";
  }

  // bos before and eos after, where the model asks for them (a GGUF file's add_bos_token)
  std::vector<int32_t> with_special_tokens(const std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    if (add_bos_ && bos_id() >= 0) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_eos_ && eos_id() >= 0) out.push_back(eos_id());
    return out;
  }

  std::string type() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_->GetPieceSize(); }
  int32_t pad_id() const override { return sp_->pad_id(); }
  int32_t bos_id() const override { return sp_->bos_id(); }
  int32_t eos_id() const override { return sp_->eos_id(); }

  std::vector<int32_t> encode(std::string_view text) const override {
    check_utf8(text, "SentencePiece tokenizer: text to encode");
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    check(status.ok(), "SentencePiece tokenizer: encode failed: ", status_text(status, "no reason given"));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // SentencePiece draws from a generator of each thread's own, seeded from the process-wide
  // SetRandomGeneratorSeed when the thread first samples: so each call samples on a new thread,
  // after setting the seed, and its draws depend on `seed` alone.
  std::vector<std::vector<int32_t>> encode_sampled(const std::vector<std::string>& texts, double alpha,
                                                   uint32_t seed) const override {
    check(std::isfinite(alpha) && alpha > 0 && alpha <= 1, "SentencePiece tokenizer: sampling alpha ", alpha,
          " is outside (0, 1]");
    for (const std::string& t : texts) check_utf8(t, "SentencePiece tokenizer: text to encode");
    std::vector<std::vector<int32_t>> out(texts.size());
    std::string failure;
    static std::mutex one_at_a_time;  // the seed is process-wide
    const std::lock_guard<std::mutex> lock(one_at_a_time);
    // (SentencePiece takes the seed 2^32 - 1 as "none given")
    sentencepiece::SetRandomGeneratorSeed(seed == 0xffffffffu ? 0u : seed);
    std::thread worker([&] {
      std::vector<int> ids;
      for (size_t i = 0; i < texts.size() && failure.empty(); ++i) {
        // nbest_size -1: sample from every segmentation of the lattice (unigram); BPE: merge dropout
        const auto status = sp_->SampleEncode(texts[i], -1, static_cast<float>(alpha), &ids);
        if (!status.ok()) failure = status_text(status, "no reason given");
        out[i].assign(ids.begin(), ids.end());
      }
    });
    worker.join();
    check(failure.empty(), "SentencePiece tokenizer: sampled encode failed: ", failure);
    return out;
  }
  bool can_sample() const override { return true; }

  // The piece with its word-start mark "▁" as a space; a byte piece "<0xNN>" as that byte;
  // control and unknown pieces as themselves.
  std::string token_bytes(int32_t id) const override {
    check(id >= 0 && id < vocab_size(), "SentencePiece tokenizer: token id ", id, " is outside [0, ", vocab_size(), ")");
    const std::string p = sp_->IdToPiece(id);
    if (sp_->IsControl(id) || sp_->IsUnknown(id) || sp_->IsUnused(id)) return p;
    if (sp_->IsByte(id) && p.size() == 6 && p.compare(0, 3, "<0x") == 0)
      return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
    std::string out;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p.compare(i, 3, "\xE2\x96\x81") == 0) out += ' ', i += 2;
      else out += p[i];
    }
    return out;
  }

  // SentencePiece drops control pieces (pad, bos, eos) itself and joins byte pieces.
  std::string decode(const std::vector<int32_t>& ids) const override {
    const int64_t n = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i)
      check(ids[i] >= 0 && ids[i] < n, "SentencePiece tokenizer: decode: id ", ids[i], " at position ", i,
            " is outside [0, ", n, ")");
    std::string text;
    const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    check(status.ok(), "SentencePiece tokenizer: decode failed: ", status_text(status, "no reason given"));
    return utf8_replace_invalid(text);
  }

  std::string piece(int32_t id) const override {
    check(id >= 0 && id < vocab_size(), "SentencePiece tokenizer: piece id ", id, " is outside [0, ", vocab_size(), ")");
    return sp_->IdToPiece(id);
  }

  // tokenizer.model, and tokenizer.json as Hugging Face's converters write a SentencePiece model
  // with identity normalisation (the Llama-2 form): Prepend "▁" (the dummy prefix) and spaces as
  // "▁", the pieces as a Unigram model or as BPE with merges from the pieces, byte fallback, the
  // control and unknown pieces as special tokens. A model with any other normalisation gets
  // tokenizer.model alone: its normalisation rules have no exact tokenizer.json form here.
  std::vector<std::string> save_hf(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    const std::string proto = sp_->serialized_model_proto();
    write_file_atomic((d / "tokenizer.model").string(), proto);
    write_file_atomic((d / "tokenizer_config.json").string(), text::hf_tokenizer_config(*this));
    const SpmSpec spec = read_spec(proto, "tokenizer.model");
    if (!spec.charsmap.empty() || spec.remove_extra_whitespaces || !spec.escape_whitespaces ||
        (spec.model_type != 1 && spec.model_type != 2))
      return {"tokenizer.model", "tokenizer_config.json"};
    const int n = sp_->GetPieceSize();
    Json added = Json::array();
    for (int i = 0; i < n; ++i)
      if (sp_->IsControl(i) || sp_->IsUnknown(i)) added.push_back(text::hf_added_token(i, sp_->IdToPiece(i), true));
    Json model;
    if (spec.model_type == 1) {
      Json vocab = Json::array();
      for (int i = 0; i < n; ++i) vocab.push_back({sp_->IdToPiece(i), sp_->GetScore(i)});
      model = {{"type", "Unigram"}, {"unk_id", sp_->unk_id()}, {"vocab", vocab}, {"byte_fallback", spec.byte_fallback}};
    } else {
      // merges: every split of a normal piece into two pieces, the merged piece's score first
      // (higher merges earlier, as SentencePiece's BPE picks), then the halves' ids
      Json vocab = Json::object();
      std::unordered_map<std::string, int> id;
      for (int i = 0; i < n; ++i) vocab[sp_->IdToPiece(i)] = i, id[sp_->IdToPiece(i)] = i;
      std::vector<std::tuple<float, int, int, int>> ranked;  // (-score, a, b, merged)
      for (int i = 0; i < n; ++i) {
        if (sp_->IsControl(i) || sp_->IsUnknown(i) || sp_->IsByte(i) || sp_->IsUnused(i)) continue;
        const std::string p = sp_->IdToPiece(i);
        for (size_t k = 1; k < p.size(); ++k) {
          if ((static_cast<unsigned char>(p[k]) & 0xc0) == 0x80) continue;  // inside a character
          const auto a = id.find(p.substr(0, k)), b = id.find(p.substr(k));
          if (a != id.end() && b != id.end()) ranked.emplace_back(-sp_->GetScore(i), a->second, b->second, i);
        }
      }
      std::sort(ranked.begin(), ranked.end());
      Json merges = Json::array();
      for (const auto& [score, a, b, m] : ranked) merges.push_back({sp_->IdToPiece(a), sp_->IdToPiece(b)});
      model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", sp_->IdToPiece(sp_->unk_id())},
               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
               {"byte_fallback", spec.byte_fallback}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}};
    }
    Json norms = Json::array();
    if (spec.add_dummy_prefix) norms.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    norms.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    const Json decoder = {{"type", "Sequence"},
                          {"decoders",
                           {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                            {{"type", "ByteFallback"}},
                            {{"type", "Fuse"}},
                            {{"type", "Strip"}, {"content", " "}, {"start", spec.add_dummy_prefix ? 1 : 0}, {"stop", 0}}}}};
    write_file_atomic((d / "tokenizer.json").string(),
                      text::hf_tokenizer_file(model, added, {{"type", "Sequence"}, {"normalizers", norms}}, nullptr, decoder));
    return {"tokenizer.model", "tokenizer.json", "tokenizer_config.json"};
  }

  void save(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "tokenizer.model").string(), sp_->serialized_model_proto());
    Json j = {{"type", "sentencepiece"}, {"model", "tokenizer.model"}};
    if (add_bos_) j["add_bos"] = true;
    if (add_eos_) j["add_eos"] = true;
    write_file_atomic((d / kTokenizerFile).string(), j.dump(2) + "\n");
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool add_bos_ = false, add_eos_ = false;
};

// The training sentences, handed to SentencePiece one by one without copying.
class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }  // OK

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

// A double as text that reads back as the same value.
std::string exact(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The protocol-buffer wire format, just far enough to check ModelProto's pieces and maps before
// SentencePiece sees them (check_model below).
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& name) : s_(bytes), name_(name) {}
  bool done() const { return i_ >= s_.size(); }
  size_t offset() const { return i_; }
  // field <- the next field's number, wire_type <- its wire type (0 varint, 1 fixed64,
  // 2 length-delimited, 5 fixed32; groups are never written by SentencePiece).
  void key(uint64_t& field, int& wire_type) {
    const uint64_t k = varint();
    field = k >> 3;
    wire_type = static_cast<int>(k & 7);
    if (field == 0 || (wire_type != 0 && wire_type != 1 && wire_type != 2 && wire_type != 5))
      bad(detail::concat("field ", field, " has wire type ", wire_type));
  }
  // The value of a varint field (wire type 0), after key().
  uint64_t varint_value() { return varint(); }
  // The value of a field of `wire_type`: a length-delimited field's bytes, else "".
  std::string_view value(int wire_type) {
    if (wire_type == 0) {
      varint();
      return {};
    }
    const uint64_t len = wire_type == 1 ? 8 : wire_type == 5 ? 4 : varint();
    if (len > s_.size() - i_) bad(detail::concat("a field of ", len, " bytes runs past the end"));
    const std::string_view v = s_.substr(i_, static_cast<size_t>(len));
    i_ += static_cast<size_t>(len);
    return wire_type == 2 ? v : std::string_view();
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) bad("a varint runs past the end");
      const unsigned char b = static_cast<unsigned char>(s_[i_++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("a varint longer than 10 bytes");
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(name_, ": not a SentencePiece model: malformed protocol buffer at byte ", i_, " (", what, ")");
  }

  std::string_view s_;
  const std::string& name_;
  size_t i_ = 0;
};

// A precompiled normalisation map (NormalizerSpec.precompiled_charsmap): a uint32 n, n bytes of a
// darts-clone double array, then NUL-terminated replacement strings. SentencePiece walks the
// array with the bytes of each text as darts-clone's commonPrefixSearch does, without a bounds
// check, and keeps the first 32 matches in a stack array while reading as many as it counted. So
// the walk is made here first, from the root over all 256 bytes at every node: each unit it can
// read lies in the array (a node's 256 children are a whole 256-unit block), each match's string
// lies in the string part, the trie has no cycle, and no path holds more than 32 matches.
void check_charsmap(std::string_view blob, const char* which, const std::string& name) {
  if (blob.empty()) return;  // no map: SentencePiece normalises nothing
  const auto bad = [&](const std::string& what) {
    fail(name, ": SentencePiece model: the ", which, " map (precompiled_charsmap) is malformed: ", what);
  };
  if (blob.size() < 4) bad(detail::concat(blob.size(), " bytes, less than its 4-byte length field"));
  uint32_t trie_bytes = 0;
  for (int i = 0; i < 4; ++i) trie_bytes |= static_cast<uint32_t>(static_cast<unsigned char>(blob[i])) << (8 * i);
  if (trie_bytes > blob.size() - 4)
    bad(detail::concat("a trie of ", trie_bytes, " bytes in ", blob.size() - 4, " bytes after the length"));
  const std::string_view trie = blob.substr(4, trie_bytes), strings = blob.substr(4 + trie_bytes);
  const size_t n = trie.size() / 4;  // units
  const auto unit = [&](size_t i) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<unsigned char>(trie[4 * i + k])) << (8 * k);
    return u;
  };
  // darts-clone's DoubleArrayUnit
  const auto offset = [](uint32_t u) -> size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  const auto label = [](uint32_t u) { return u & ((1u << 31) | 0xffu); };
  const auto has_leaf = [](uint32_t u) { return ((u >> 8) & 1) != 0; };
  const auto whole_block = [&](size_t q) {
    if ((q | 0xff) >= n) bad(detail::concat("a node's children at unit ", q, " run past the ", n, "-unit trie"));
  };
  if (n == 0) bad("an empty trie");
  constexpr int kMaxMatches = 32;  // SentencePiece's kMaxTrieResultsSize
  // most[q] <- the most matches on a path from the node whose children are at q
  // (-1: not yet visited, -2: on the current path)
  std::vector<int> most(n, -1);
  struct Frame {
    size_t q;
    int c, best, leaf;  // next byte to try, most matches so far, whether the edge into q matched
  };
  std::vector<Frame> stack;
  const size_t root = offset(unit(0));
  whole_block(root);
  most[root] = -2;
  stack.push_back({root, 0, 0, 0});
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.c == 256) {
      const Frame done = f;
      most[done.q] = done.best;
      stack.pop_back();
      if (stack.empty()) break;
      stack.back().best = std::max(stack.back().best, done.leaf + done.best);
      if (stack.back().best > kMaxMatches) bad(detail::concat("a path with more than ", kMaxMatches, " matches"));
      continue;
    }
    const uint32_t c = static_cast<uint32_t>(f.c++);
    const size_t r = f.q ^ c;
    const uint32_t u = unit(r);
    if (label(u) != c) continue;  // no child for byte c
    const size_t child = r ^ offset(u);
    whole_block(child);
    const int leaf = has_leaf(u) ? 1 : 0;
    if (leaf) {
      const uint32_t v = unit(child) & 0x7fffffffu;
      if (v >= strings.size() || strings.find('\0', v) == std::string_view::npos)
        bad(detail::concat("a match's replacement at byte ", v, " is not a NUL-terminated string inside the ",
                           strings.size(), " bytes of strings"));
    }
    if (most[child] == -2) bad("the trie has a cycle");
    if (most[child] >= 0) {
      f.best = std::max(f.best, leaf + most[child]);
      if (f.best > kMaxMatches) bad(detail::concat("a path with more than ", kMaxMatches, " matches"));
      continue;
    }
    most[child] = -2;
    stack.push_back({child, 0, 0, leaf});
  }
  if (most[root] > kMaxMatches) bad(detail::concat("a path with more than ", kMaxMatches, " matches"));
}

// Checks what SentencePiece 0.1.97 would trust in the ModelProto `bytes`: each piece (field 1)
// is non-empty and free of NUL bytes (its trie of pieces throws on either), and the maps of
// normalizer_spec (field 3) and denormalizer_spec (field 5) pass check_charsmap. A singular
// message field that appears twice is merged by protobuf, so the last precompiled_charsmap
// (field 2 of either spec) seen is the one that counts.
void check_model(std::string_view bytes, const std::string& name) {
  WireReader top(bytes, name);
  std::string_view maps[2];  // normalizer, denormalizer
  for (int64_t id = 0; !top.done();) {
    uint64_t field;
    int type;
    const size_t at = top.offset();
    top.key(field, type);
    const std::string_view v = top.value(type);
    if (type != 2 || (field != 1 && field != 3 && field != 5)) continue;
    // x <- the last field 1 (a piece's text) or field 2 (a spec's map) of the message
    WireReader sub(v, name);
    std::optional<std::string_view> x;
    while (!sub.done()) {
      uint64_t f;
      int t;
      sub.key(f, t);
      const std::string_view y = sub.value(t);
      if (t == 2 && f == (field == 1 ? 1u : 2u)) x = y;
    }
    if (field != 1) {
      if (x) maps[field == 3 ? 0 : 1] = *x;
      continue;
    }
    if (!x || x->empty()) fail(name, ": SentencePiece model: piece ", id, " (at byte ", at, ") is empty");
    if (x->find('\0') != std::string_view::npos)
      fail(name, ": SentencePiece model: piece ", id, " (at byte ", at, ") holds a NUL byte");
    ++id;
  }
  check_charsmap(maps[0], "normalisation", name);
  check_charsmap(maps[1], "denormalisation", name);
}

SpmSpec read_spec(std::string_view bytes, const std::string& name) {
  SpmSpec spec;
  WireReader top(bytes, name);
  while (!top.done()) {
    uint64_t field;
    int type;
    top.key(field, type);
    const std::string_view v = top.value(type);
    if (type != 2 || (field != 2 && field != 3)) continue;
    // TrainerSpec (2): model_type 3, byte_fallback 35; NormalizerSpec (3): name 1,
    // precompiled_charsmap 2, add_dummy_prefix 3, remove_extra_whitespaces 4, escape_whitespaces 5
    WireReader sub(v, name);
    while (!sub.done()) {
      uint64_t f;
      int t;
      sub.key(f, t);
      if (t != 0) {
        const std::string_view y = sub.value(t);
        if (field == 3 && t == 2 && f == 1) spec.normalizer_name = std::string(y);
        if (field == 3 && t == 2 && f == 2) spec.charsmap = std::string(y);
        continue;
      }
      const uint64_t x = sub.varint_value();
      if (field == 2 && f == 3) spec.model_type = static_cast<int>(x);
      if (field == 2 && f == 35) spec.byte_fallback = x != 0;
      if (field == 3 && f == 3) spec.add_dummy_prefix = x != 0;
      if (field == 3 && f == 4) spec.remove_extra_whitespaces = x != 0;
      if (field == 3 && f == 5) spec.escape_whitespaces = x != 0;
    }
  }
  return spec;
}

// A SentencePiece processor from a serialized ModelProto, checked first (check_model).
std::unique_ptr<sentencepiece::SentencePieceProcessor> load_processor(const std::string& model_proto,
                                                                      const std::string& name) {
  check(!model_proto.empty(), name, ": empty file (expected a serialized SentencePiece model)");
  check_model(model_proto, name);
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  sentencepiece::util::Status status;
  try {
    status = sp->LoadFromSerializedProto(model_proto);
  } catch (const std::exception& e) {
    // Not expected after check_model; SentencePiece's own checks return a Status.
    fail(name, ": not a SentencePiece model: the SentencePiece library threw: ", e.what());
  }
  check(status.ok(), name, ": not a SentencePiece model (", status_text(status, "its bytes are not a serialized ModelProto"), ")");
  check(sp->GetPieceSize() > 0, name, ": SentencePiece model has no pieces");
  return sp;
}

// Marian (OPUS-MT) as transformers' MarianTokenizer reads it: the source text's pieces from
// source.spm, the target's from target.spm, each piece's id from the shared vocab.json (<unk>
// for a piece it lacks), and </s> after the sequence. A leading language code ">>xx<<" stays one
// token. Decoding maps ids to pieces through vocab.json, drops the special tokens and joins the
// pieces with the target model.
class MarianTokenizer final : public Tokenizer {
 public:
  MarianTokenizer(const std::string& source_spm, const std::string& target_spm, const std::string& vocab_json,
                  const std::string& dir)
      : source_bytes_(source_spm), target_bytes_(target_spm), vocab_bytes_(vocab_json) {
    const std::string vname = dir + "/vocab.json";
    source_ = load_processor(source_spm, dir + "/source.spm");
    target_ = load_processor(target_spm, dir + "/target.spm");
    const Json v = detail::parse_json_object(vocab_json, vname);
    int64_t most = -1;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() >= INT32_MAX)
        fail(vname, ": token \"", it.key(), "\" maps to ", it->dump(), " (expected an id 0 <= id < 2^31 - 1)");
      const auto id = static_cast<int32_t>(it->get<int64_t>());
      check(ids_.emplace(it.key(), id).second, vname, ": token \"", it.key(), "\" appears twice");
      const auto [at, fresh] = pieces_.emplace(id, it.key());
      check(fresh, vname, ": id ", id, " is used by both \"", at->second, "\" and \"", it.key(), "\"");
      most = std::max<int64_t>(most, id);
    }
    vocab_size_ = most + 1;
    unk_ = find("<unk>");
    eos_ = find("</s>");
    pad_ = find("<pad>");
    check(unk_ >= 0, vname, ": no \"<unk>\" token (Marian's unknown token)");
    check(eos_ >= 0, vname, ": no \"</s>\" token (Marian's end of sequence)");
  }

  std::string type() const override { return "marian"; }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t pad_id() const override { return pad_; }
  int32_t bos_id() const override { return pad_; }  // the decoder starts from the pad token
  int32_t eos_id() const override { return eos_; }

  std::vector<int32_t> encode(std::string_view text) const override { return encode_with(*source_, text, "source"); }
  std::vector<int32_t> encode_target(std::string_view text) const override {
    return encode_with(*target_, text, "target");
  }
  std::vector<int32_t> with_special_tokens(const std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out = ids;
    out.push_back(eos_);
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < ids.size(); ++i) {
      check(ids[i] >= 0 && ids[i] < vocab_size_, "Marian tokenizer: decode: id ", ids[i], " at position ", i,
            " is outside [0, ", vocab_size_, ")");
      if (ids[i] == eos_ || ids[i] == pad_ || ids[i] == unk_) continue;  // skip_special_tokens
      const auto it = pieces_.find(ids[i]);
      if (it != pieces_.end()) pieces.push_back(it->second);
    }
    std::string text;
    const auto status = target_->Decode(pieces, &text);
    check(status.ok(), "Marian tokenizer: decode failed: ", status_text(status, "no reason given"));
    // convert_tokens_to_string: any "▁" left becomes a space, and the ends are stripped
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 3, "\xE2\x96\x81") == 0) out += ' ', i += 2;
      else out += text[i];
    }
    const size_t b = out.find_first_not_of(" \t\n\r\f\v");
    if (b == std::string::npos) return "";
    return utf8_replace_invalid(out.substr(b, out.find_last_not_of(" \t\n\r\f\v") + 1 - b));
  }

  std::string piece(int32_t id) const override {
    check(id >= 0 && id < vocab_size_, "Marian tokenizer: piece id ", id, " is outside [0, ", vocab_size_, ")");
    const auto it = pieces_.find(id);
    return it == pieces_.end() ? "<unused " + std::to_string(id) + ">" : it->second;
  }

  std::vector<std::string> save_hf(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "source.spm").string(), source_bytes_);
    write_file_atomic((d / "target.spm").string(), target_bytes_);
    write_file_atomic((d / "vocab.json").string(), vocab_bytes_);
    const Json c = {{"tokenizer_class", "MarianTokenizer"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
                    {"pad_token", "<pad>"}, {"separate_vocabs", false}};
    write_file_atomic((d / "tokenizer_config.json").string(), c.dump(2) + "\n");
    return {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json"};
  }

  void save(const std::string& dir) const override {
    const std::filesystem::path d(dir);
    write_file_atomic((d / "source.spm").string(), source_bytes_);
    write_file_atomic((d / "target.spm").string(), target_bytes_);
    write_file_atomic((d / "vocab.json").string(), vocab_bytes_);
    const Json j = {{"type", "marian"}, {"source", "source.spm"}, {"target", "target.spm"}, {"vocab", "vocab.json"}};
    write_file_atomic((d / kTokenizerFile).string(), j.dump(2) + "\n");
  }

 private:
  int32_t find(const std::string& piece) const {
    const auto it = ids_.find(piece);
    return it == ids_.end() ? -1 : it->second;
  }

  std::vector<int32_t> encode_with(const sentencepiece::SentencePieceProcessor& sp, std::string_view text,
                                   const char* side) const {
    check_utf8(text, std::string("Marian tokenizer: ") + side + " text to encode");
    std::vector<int32_t> ids;
    // remove_language_code: a text starting ">>" keeps everything up to the first "<<" as one token
    if (text.size() >= 2 && text.substr(0, 2) == ">>") {
      if (const size_t end = text.find("<<"); end != std::string_view::npos) {
        const int32_t id = find(std::string(text.substr(0, end + 2)));
        ids.push_back(id >= 0 ? id : unk_);
        text.remove_prefix(end + 2);
      }
    }
    std::vector<std::string> pieces;
    const auto status = sp.Encode(text, &pieces);
    check(status.ok(), "Marian tokenizer: encode failed: ", status_text(status, "no reason given"));
    for (const std::string& p : pieces) {
      const int32_t id = find(p);
      ids.push_back(id >= 0 ? id : unk_);
    }
    return ids;
  }

  std::string source_bytes_, target_bytes_, vocab_bytes_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> source_, target_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<int32_t, std::string> pieces_;
  int64_t vocab_size_ = 0;
  int32_t unk_ = -1, eos_ = -1, pad_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& model_proto, const std::string& name, bool add_bos,
                                               bool add_eos) {
  return std::make_unique<SentencePieceTokenizer>(load_processor(model_proto, name), add_bos, add_eos);
}

std::unique_ptr<Tokenizer> load_marian_tokenizer(const std::string& dir, const std::string& source,
                                                 const std::string& target, const std::string& vocab) {
  const std::filesystem::path d(dir);
  return std::make_unique<MarianTokenizer>(read_file((d / source).string(), "Marian source.spm"),
                                           read_file((d / target).string(), "Marian target.spm"),
                                           read_file((d / vocab).string(), "Marian vocab.json"), dir);
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& sentences,
                                               const SentencePieceTrainOptions& opt) {
  // Options and sentences, checked before SentencePiece sees them.
  const char* ctx = "train_sentencepiece: ";
  check(opt.model_type == "unigram" || opt.model_type == "bpe", ctx, "model_type \"", opt.model_type,
        "\" (expected \"unigram\" or \"bpe\")");
  check(opt.vocab_size > 4 && opt.vocab_size <= INT32_MAX, ctx, "vocab_size ", opt.vocab_size,
        " (expected 5 .. 2^31-1: four specials and at least one piece)");
  check(opt.character_coverage > 0 && opt.character_coverage <= 1, ctx, "character_coverage ",
        opt.character_coverage, " (expected a value in (0, 1])");
  check(opt.max_sentences > 0, ctx, "max_sentences ", opt.max_sentences, " (expected at least 1)");
  check(opt.threads >= 1 && opt.threads <= 128, ctx, "threads ", opt.threads, " (expected 1 .. 128)");
  check(!sentences.empty(), ctx, "no sentences to train on");
  for (size_t i = 0; i < sentences.size(); ++i) check_utf8(sentences[i], detail::concat(ctx, "sentence ", i));
  // SentencePiece skips, without a word, every sentence longer than its max_sentence_length; with
  // none left it failed with no reason given (a corpus that is one 10 MB line).
  constexpr size_t kMaxSentenceBytes = 4192;  // SentencePiece's default, passed explicitly below
  size_t longest = 0;
  bool any_fits = false;
  for (size_t i = 0; i < sentences.size(); ++i) {
    any_fits = any_fits || sentences[i].size() <= kMaxSentenceBytes;
    if (sentences[i].size() > sentences[longest].size()) longest = i;
  }
  check(any_fits, ctx, "every sentence is longer than the ", kMaxSentenceBytes,
        " bytes SentencePiece trains on (the longest is sentence ", longest, ", ", sentences[longest].size(),
        " bytes): split the text into shorter lines, or use a byte tokenizer");

  // Lossless by construction: identity normalisation, spaces kept, unknown characters as bytes.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opt.model_type},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", exact(opt.character_coverage)},
      {"input_sentence_size", std::to_string(opt.max_sentences)},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(opt.threads)},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      // A small corpus may not support the requested size: unigram then stops below it rather
      // than failing ("Vocabulary size too high").
      {"hard_vocab_limit", "false"},
      {"minloglevel", "100"},  // no INFO, WARNING or ERROR lines on stderr: failures come back as a Status
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(opt.seed));
  VectorIterator it(sentences);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  check(status.ok(), ctx, "SentencePiece training failed: ", status_text(status, "no reason given"));
  return parse_sentencepiece(model, "the trained SentencePiece model");
}

}  // namespace qkv
