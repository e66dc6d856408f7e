// qkv/safetensors.h: Hugging Face .safetensors files.
//
// Layout: an 8-byte little-endian uint64 N, then N bytes of UTF-8 JSON (an object), then the data
// section. Every key of the object except "__metadata__" names a tensor:
//   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with [begin, end) a byte range relative to the start of the data section, holding the tensor
// in C order, little-endian. "__metadata__", when present, is an object of string values.
//
// Reading accepts the dtypes F32, F64, I32, I64, BOOL, BF16, F16 and U8. BF16 and F16 tensors are
// converted to F32 (exactly: every half value is a float32 value), so a loaded tensor always
// has one of the dtypes the library computes with. U8 holds raw bytes (qkv's packed Q8_0 / Q4_0
// weights, docs/formats.md): SafetensorsReader::read_bytes reads it, read_safetensors refuses it.
// Writing tensors accepts F32, F64, I32, I64 and BOOL; writing entries (bytes with a dtype and
// shape) every dtype above.
//
// The file is never trusted. A qkv::Error naming the file (and the tensor, where there is one)
// is thrown for: a file under 8 bytes; N of 0, over 100 MiB or past the end of the file; a
// header that is not a JSON object, or that repeats a key in any object; an entry that is not an
// object with exactly the fields dtype (a supported dtype string), shape (non-negative integers,
// each at most 2^62) and data_offsets (two non-negative integers, begin <= end); a byte range
// whose length differs from shape x dtype size (computed with overflow checks) or that leaves
// the data section; ranges that, sorted by begin, leave a gap, overlap, or stop short of the
// end of the file; "__metadata__" that is not an object of strings; an empty tensor name; and a
// BOOL byte other than 0 or 1.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in the order of their data offsets
  std::map<std::string, std::string> metadata;          // the "__metadata__" object
  const Tensor* find(const std::string& name) const;    // nullptr if absent
};

// Reads each tensor's bytes from the file straight into its storage (no copy of the whole file).
SafetensorsFile read_safetensors(const std::string& path);
// The same from the bytes of a whole file; `name_for_errors` stands for the file in messages.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name_for_errors);

// An open .safetensors file whose header has been read and checked (as read_safetensors checks
// it), its tensors read one at a time on demand, straight into memory the caller owns: loading a
// model this way holds its parameters once, never a second copy of the file. (Read with pread,
// not mmap: the same single copy, and a file truncated while it loads is an error, not SIGBUS.)
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  struct Info {
    std::string name;
    std::string dtype;            // as the file spells it: "F32", "BF16", ...
    std::vector<int64_t> shape;
    uint64_t bytes = 0;           // in the file
    int64_t numel() const;
  };
  const std::string& path() const;
  const std::vector<Info>& tensors() const;  // in the order of their data offsets
  const Info* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const;
  // The tensor's values as float32 into dst (numel floats): F32 copied, F64, F16 and BF16
  // converted. An integer or BOOL tensor, or an unknown name, is an error naming the file.
  void read_f32(const std::string& name, float* dst) const;
  // Elements [first, first + count) of the tensor in C order, as read_f32 converts them.
  void read_f32_range(const std::string& name, int64_t first, int64_t count, float* dst) const;
  // The tensor's bytes as the file holds them (any dtype); `bytes` must be its size in the file.
  void read_bytes(const std::string& name, void* dst, uint64_t bytes) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Writes atomically: a temporary file in the same directory, fsync, rename, so `path` never
// holds a half-written file. Tensors are written in the order given, each as a contiguous copy;
// the header is padded with spaces so the data section starts at a multiple of 8 bytes. Names
// must be unique, non-empty and not "__metadata__"; dtypes F32, F64, I32, I64 or BOOL.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// A tensor given as its bytes: dtype as the file spells it (F32, F64, I32, I64, BOOL, BF16, F16,
// U8), `bytes` exactly shape x the dtype's size, little-endian, C order.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string_view bytes;
};
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});
// The bytes write_safetensors would write.
std::string to_safetensors_bytes(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
