// qkv/gguf.h: llama.cpp's GGUF files (read).
//
// Layout (little-endian; docs/formats.md, "GGUF"):
//   "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count,
//   metadata: key (uint64 length + UTF-8 bytes), uint32 value type, value,
//   tensor infos: name, uint32 n_dims, n_dims x uint64 ne (ne[0] the innermost: a row's length),
//                 uint32 ggml type, uint64 offset (relative to the data section),
//   padding to general.alignment (default 32), then the data section.
// Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array (uint32
// element type, uint64 count, elements), 10 u64, 11 i64, 12 f64.
//
// The file is never trusted. One qkv::Error naming the file (and the key or tensor) for: a bad
// magic, a version other than 2 or 3 (a big-endian file reads as a huge version, and says so),
// counts or lengths that the bytes left in the file cannot hold (checked before anything is
// allocated, so a count near 2^64 costs nothing), an unknown value type, nested arrays, a key or
// tensor name twice, a string that is not UTF-8 in a key or name, a bool byte other than 0 or 1,
// more than 4 dimensions or a dimension of 0, an element count that overflows, a row length that
// is not whole blocks of the type, a tensor type qkv does not read (named: Q4_1, IQ2_XXS, ...),
// an offset that is not a multiple of the alignment, tensor data past the end of the file or
// overlapping another tensor's, and an alignment that is not a power of two.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qkv/model.h"
#include "qkv/tokenizer.h"

namespace qkv {

// The tensor types qkv reads (ggml's numbering). K-quants are super-blocks of 256 weights.
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };
// "F32", "Q4_K", ...; for any ggml type number (unknown: "type 99").
std::string ggml_type_name(uint32_t type);

struct GgufValue {
  enum Kind : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64 };
  Kind kind = U8;
  Kind elem = U8;                   // an array's element kind
  uint64_t u = 0;                   // unsigned integers and bool
  int64_t i = 0;                    // signed integers
  double f = 0;                     // floats
  std::string s;                    // a string
  std::vector<std::string> strings;  // an array of strings
  std::vector<double> numbers;      // an array of numbers or bools (integers up to 2^53 exactly)
  uint64_t count = 0;               // an array's element count
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;

  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;  // ggml order: ne[0] is a row's length
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;      // in the data section
    uint64_t bytes = 0;
    int64_t rows() const;     // the product of ne[1..]
  };

  const std::string& path() const;
  uint32_t version() const;
  const std::map<std::string, GgufValue>& metadata() const;
  const std::vector<Tensor>& tensors() const;  // in the file's order
  const GgufValue* find(const std::string& key) const;  // nullptr if absent
  const Tensor* tensor(const std::string& name) const;  // nullptr if absent

  // Typed metadata, each an error naming the file and key when the value has another kind or is
  // out of range; the _or forms give `fallback` for an absent key.
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  double number_or(const std::string& key, double fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;

  // Rows [first, first + n) of a tensor's data as the file holds them (n x the row's bytes).
  void read_rows(const Tensor& t, int64_t first, int64_t n, void* dst) const;
  // The same rows as float32 (every type dequantised; n x ne[0] floats).
  void read_rows_f32(const Tensor& t, int64_t first, int64_t n, float* dst) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Bytes of one row of `ne0` weights of type `t` (an error when ne0 is not whole blocks).
uint64_t ggml_row_bytes(GgmlType t, int64_t ne0);

// True when `path` is a regular file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

struct GgufLoadReport {
  std::string architecture;
  std::vector<std::string> converted;  // matrices whose type qkv does not compute with, and what they became
  std::vector<std::string> unused;     // tensors the model does not use
};

// The model a GGUF file holds (architecture "llama": Llama, Mistral-shaped and TinyLlama files;
// others refused by name). Hyper-parameters come from the metadata; the Q and K rows, which
// llama.cpp's converter reorders for its RoPE layout, are put back in the rotate-half order qkv
// (and Hugging Face) uses. Without opt.dtype, F16, BF16, Q8_0 and Q4_0 matrices are used as the
// file holds them, F32 ones stay float32, and Q4_K, Q5_K and Q6_K matrices (and a matrix whose
// parts differ in type) are dequantised and packed to Q8_0 (named in the report). With opt.dtype
// every matrix is dequantised and packed to it, as for a float32 model.
Model load_gguf_model(const std::string& path, const LoadOptions& opt = {}, GgufLoadReport* report = nullptr);

// The tokenizer a GGUF file holds: tokenizer.ggml.model "llama" (SentencePiece BPE: tokens,
// scores and token types, byte fallback when every byte has its token, the dummy prefix unless
// tokenizer.ggml.add_space_prefix is false; bos, eos, unknown and padding ids from
// tokenizer.ggml.*_token_id; <s> before a model's input unless tokenizer.ggml.add_bos_token is
// false), run by the SentencePiece library; "gpt2" (byte-level BPE, tokenizer.ggml.merges, the
// pre-tokenizer tokenizer.ggml.pre names: default, gpt2, smollm or llama-bpe), run as the
// equivalent tokenizer.json. Other models and pre-tokenizers are refused by name.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& file);

// tokenizer.chat_template, or "" when the file has none.
std::string gguf_chat_template(const GgufFile& file);

// A tensor to write: ggml shape (ne[0] a row's length), type, and its bytes.
struct GgufTensorBytes {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::F32;
  std::string bytes;
};
// Writes a GGUF version 3 file atomically: `metadata` in order (kinds U32, I32, F32, Bool, String,
// arrays of String, F32 or I32), then the tensors, each aligned to 32 bytes.
void write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<GgufTensorBytes>& tensors);

// Writes a Llama-shaped model (one that maps onto Hugging Face's llama without biases: qkv's
// Llama, TinyLlama, a Llama folder) as a GGUF file that llama.cpp and qkv read: the metadata
// above, the tensors under llama.cpp's names with the Q and K rows in its order, float32
// parameters as F32 and packed ones (--dtype, qkv quantize) as their GGUF type, byte for byte.
// With a SentencePiece tokenizer, its pieces, scores and types as tokenizer.ggml.* ("llama");
// `tokenizer_note` (when given) receives why none was written otherwise. A model that does not
// map is refused, naming the setting.
void save_gguf_model(const Model& model, const Tokenizer* tok, const std::string& path,
                     std::string* tokenizer_note = nullptr);

}  // namespace qkv
