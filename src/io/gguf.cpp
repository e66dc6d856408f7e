// GGUF files: the header, metadata and tensor infos, checked against the file; tensor rows read
// on demand (pread, as the safetensors reader: a file truncated while it loads is an error).
#include "qkv/gguf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "kernels/quant.h"
#include "qkv/error.h"
#include "qkv/files.h"

namespace qkv {

namespace {

constexpr uint64_t kMaxString = uint64_t{1} << 30;  // a key, name or value: at most 1 GiB
constexpr int kMaxDims = 4;

struct TypeInfo {
  uint32_t id;
  const char* name;
  int64_t block;   // weights per block; 0: a type qkv does not read
  uint64_t bytes;  // bytes per block
};

// Every ggml type number, so that an unread one is named.
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},      {1, "F16", 1, 2},     {2, "Q4_0", 32, 18},    {3, "Q4_1", 0, 0},
    {6, "Q5_0", 0, 0},     {7, "Q5_1", 0, 0},    {8, "Q8_0", 32, 34},    {9, "Q8_1", 0, 0},
    {10, "Q2_K", 0, 0},    {11, "Q3_K", 0, 0},   {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 0, 0},  {16, "IQ2_XXS", 0, 0},  {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0}, {19, "IQ1_S", 0, 0},  {20, "IQ4_NL", 0, 0},   {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},   {23, "IQ4_XS", 0, 0}, {24, "I8", 0, 0},       {25, "I16", 0, 0},
    {26, "I32", 0, 0},     {27, "I64", 0, 0},    {28, "F64", 0, 0},      {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},    {34, "TQ1_0", 0, 0},  {35, "TQ2_0", 0, 0},    {39, "MXFP4", 0, 0},
};

const TypeInfo* type_info(uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

constexpr char kReadTypes[] = "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K";

const char* kind_name(uint32_t k) {
  static const char* const names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32", "float32",
                                      "bool",  "string", "array",  "uint64", "int64", "float64"};
  return k < 13 ? names[k] : "unknown";
}

// A buffered reader over the header region: every read bounded by the file's size.
class Cursor {
 public:
  Cursor(int fd, uint64_t size, const std::string& path) : fd_(fd), size_(size), path_(path) {}
  uint64_t at() const { return at_; }
  uint64_t left() const { return size_ - at_; }
  void bytes(void* dst, uint64_t n, const char* what) {
    if (n > left())
      fail(path_, ": ", what, " at byte ", at_, " needs ", n, " bytes, but the file ends ", left(), " bytes later");
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (at_ < buf_at_ || at_ >= buf_at_ + buf_.size()) fill();
      const uint64_t off = at_ - buf_at_, k = std::min<uint64_t>(n, buf_.size() - off);
      std::memcpy(out, buf_.data() + off, k);
      out += k, at_ += k, n -= k;
    }
  }
  template <class T>
  T get(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string string(const char* what) {
    const auto n = get<uint64_t>(what);
    if (n > kMaxString || n > left())
      fail(path_, ": ", what, " at byte ", at_ - 8, " claims ", n, " bytes, but ",
           n > kMaxString ? "strings are at most 1 GiB" : detail::concat("only ", left(), " bytes follow"));
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }

 private:
  void fill() {
    buf_at_ = at_;
    buf_.resize(static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 20, size_ - at_)));
    uint64_t done = 0;
    while (done < buf_.size()) {
      const ssize_t got = ::pread(fd_, buf_.data() + done, buf_.size() - done, static_cast<off_t>(at_ + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail(path_, ": read failed at byte ", at_ + done, got < 0 ? ": " : " (the file shrank)",
                         got < 0 ? std::strerror(errno) : "");
      done += static_cast<uint64_t>(got);
    }
  }
  int fd_;
  uint64_t size_, at_ = 0, buf_at_ = 0;
  std::vector<char> buf_;
  const std::string& path_;
};

uint64_t file_size_of(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, ": is not a regular file (expected a .gguf file)");
  return static_cast<uint64_t>(st.st_size);
}

// The smallest encoding of one value of kind k (for bounding counts by the bytes left).
uint64_t min_size(uint32_t k) {
  switch (k) {
    case GgufValue::U8: case GgufValue::I8: case GgufValue::Bool: return 1;
    case GgufValue::U16: case GgufValue::I16: return 2;
    case GgufValue::U32: case GgufValue::I32: case GgufValue::F32: return 4;
    case GgufValue::String: case GgufValue::U64: case GgufValue::I64: case GgufValue::F64: return 8;
    case GgufValue::Array: return 12;
  }
  return 1;
}

// One scalar of kind k into v (as u, i, f, b or s).
void read_scalar(Cursor& c, uint32_t k, GgufValue& v, const std::string& where) {
  const char* w = where.c_str();
  switch (k) {
    case GgufValue::U8: v.u = c.get<uint8_t>(w); v.f = static_cast<double>(v.u); return;
    case GgufValue::I8: v.i = c.get<int8_t>(w); v.f = static_cast<double>(v.i); return;
    case GgufValue::U16: v.u = c.get<uint16_t>(w); v.f = static_cast<double>(v.u); return;
    case GgufValue::I16: v.i = c.get<int16_t>(w); v.f = static_cast<double>(v.i); return;
    case GgufValue::U32: v.u = c.get<uint32_t>(w); v.f = static_cast<double>(v.u); return;
    case GgufValue::I32: v.i = c.get<int32_t>(w); v.f = static_cast<double>(v.i); return;
    case GgufValue::U64: v.u = c.get<uint64_t>(w); v.f = static_cast<double>(v.u); return;
    case GgufValue::I64: v.i = c.get<int64_t>(w); v.f = static_cast<double>(v.i); return;
    case GgufValue::F32: v.f = c.get<float>(w); return;
    case GgufValue::F64: v.f = c.get<double>(w); return;
    case GgufValue::Bool: {
      const auto b = c.get<uint8_t>(w);
      check(b <= 1, where, ": a bool byte is ", static_cast<int>(b), " (expected 0 or 1)");
      v.u = b;
      v.f = b;
      return;
    }
    case GgufValue::String: v.s = c.string(w); return;
  }
  fail(where, ": unknown value type ", k, " (expected 0..12)");
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* t = type_info(type);
  return t ? t->name : detail::concat("type ", type);
}

uint64_t ggml_row_bytes(GgmlType t, int64_t ne0) {
  const TypeInfo* i = type_info(static_cast<uint32_t>(t));
  check(i && i->block > 0, "ggml type ", static_cast<uint32_t>(t), " is not one qkv reads");
  check(ne0 >= 0 && ne0 % i->block == 0, i->name, " rows hold whole blocks of ", i->block, " weights, but a row has ",
        ne0);
  return static_cast<uint64_t>(ne0 / i->block) * i->bytes;
}

int64_t GgufFile::Tensor::rows() const {
  int64_t r = 1;
  for (size_t d = 1; d < ne.size(); ++d) r *= ne[d];
  return r;
}

struct GgufFile::State {
  std::string path;
  int fd = -1;
  uint64_t size = 0, data_at = 0;
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<Tensor> tensors;
  std::map<std::string, size_t> by_name;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
};

GgufFile::GgufFile(const std::string& path) : s_(std::make_unique<State>()) {
  s_->path = path;
  s_->fd = open_regular_file(path, ".gguf file");
  s_->size = file_size_of(s_->fd, path);
  Cursor c(s_->fd, s_->size, s_->path);
  const std::string& file = s_->path;
  check(s_->size >= 24, file, ": ", s_->size, " bytes, too short for a GGUF file (24 bytes of header at least)");
  char magic[4];
  c.bytes(magic, 4, "the magic");
  check(std::memcmp(magic, "GGUF", 4) == 0, file, ": not a GGUF file (it does not start with \"GGUF\")");
  s_->version = c.get<uint32_t>("the version");
  check(s_->version != 1, file, ": GGUF version 1 (2023's first format) is not read; convert it again with llama.cpp");
  check(s_->version == 2 || s_->version == 3, file, ": GGUF version ", s_->version,
        s_->version > 0xffff ? " (a big-endian file? qkv reads little-endian GGUF)" : "", "; expected 2 or 3");
  const auto n_tensors = c.get<uint64_t>("the tensor count");
  const auto n_kv = c.get<uint64_t>("the metadata count");
  // each key-value pair takes at least 8 + 4 + 1 bytes, each tensor info 8 + 4 + 8 + 4 + 8
  check(n_kv <= c.left() / 13, file, ": the header claims ", n_kv, " metadata entries, more than the ", c.left(),
        " bytes after it can hold");
  check(n_tensors <= c.left() / 32, file, ": the header claims ", n_tensors, " tensors, more than the ", c.left(),
        " bytes after it can hold");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = c.string("a metadata key");
    check(invalid_utf8_offset(key) < 0, file, ": metadata key ", k, " is not valid UTF-8");
    const std::string where = detail::concat(file, ": metadata \"", key, "\"");
    check(!s_->metadata.count(key), where, " appears twice");
    GgufValue v;
    const auto kind = c.get<uint32_t>(where.c_str());
    check(kind <= GgufValue::F64, where, ": unknown value type ", kind, " (expected 0..12)");
    v.kind = static_cast<GgufValue::Kind>(kind);
    if (kind != GgufValue::Array) {
      read_scalar(c, kind, v, where);
    } else {
      const auto elem = c.get<uint32_t>(where.c_str());
      check(elem <= GgufValue::F64, where, ": array of unknown value type ", elem, " (expected 0..12)");
      check(elem != GgufValue::Array, where, ": an array of arrays (qkv reads arrays of numbers or strings)");
      v.elem = static_cast<GgufValue::Kind>(elem);
      v.count = c.get<uint64_t>(where.c_str());
      check(v.count <= c.left() / min_size(elem), where, ": an array of ", v.count, " ", kind_name(elem),
            " values, more than the ", c.left(), " bytes left in the file can hold");
      GgufValue one;
      if (elem == GgufValue::String) {
        v.strings.reserve(static_cast<size_t>(v.count));
        for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.string(where.c_str()));
      } else {
        v.numbers.reserve(static_cast<size_t>(v.count));
        for (uint64_t i = 0; i < v.count; ++i) {
          read_scalar(c, elem, one, where);
          v.numbers.push_back(one.f);
        }
      }
    }
    s_->metadata.emplace(key, std::move(v));
  }

  uint64_t align = 32;
  if (const GgufValue* a = find("general.alignment")) {
    check(a->kind == GgufValue::U32 || a->kind == GgufValue::U64 || a->kind == GgufValue::I32, file,
          ": metadata \"general.alignment\" is a ", kind_name(a->kind), "; expected uint32");
    const uint64_t v = a->kind == GgufValue::I32 ? static_cast<uint64_t>(a->i) : a->u;
    check(v > 0 && v <= (uint64_t{1} << 20) && (v & (v - 1)) == 0, file, ": metadata \"general.alignment\" is ",
          a->kind == GgufValue::I32 ? std::to_string(a->i) : std::to_string(a->u),
          "; expected a power of two up to 2^20");
    align = v;
  }

  for (uint64_t t = 0; t < n_tensors; ++t) {
    Tensor info;
    info.name = c.string("a tensor name");
    check(invalid_utf8_offset(info.name) < 0, file, ": tensor name ", t, " is not valid UTF-8");
    const std::string where = detail::concat(file, ": tensor \"", info.name, "\"");
    check(!s_->by_name.count(info.name), where, " appears twice");
    const auto dims = c.get<uint32_t>(where.c_str());
    check(dims >= 1 && dims <= kMaxDims, where, ": ", dims, " dimensions (expected 1 to ", kMaxDims, ")");
    uint64_t count = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const auto n = c.get<uint64_t>(where.c_str());
      check(n >= 1 && n <= (uint64_t{1} << 40), where, ": dimension ", d, " is ", n, " (expected 1 to 2^40)");
      check(!__builtin_mul_overflow(count, n, &count) && count <= (uint64_t{1} << 50), where,
            ": its element count overflows");
      info.ne.push_back(static_cast<int64_t>(n));
    }
    const auto type = c.get<uint32_t>(where.c_str());
    const TypeInfo* ti = type_info(type);
    check(ti != nullptr, where, ": has unknown type ", type, " (qkv reads ", kReadTypes, ")");
    check(ti->block > 0, where, ": has type ", ti->name, " (", type, "), which qkv does not read (it reads ", kReadTypes,
          ")");
    info.type = static_cast<GgmlType>(type);
    check(info.ne[0] % ti->block == 0, where, ": rows of ", info.ne[0], " weights are not whole ", ti->name,
          " blocks of ", ti->block);
    info.bytes = static_cast<uint64_t>(info.ne[0] / ti->block) * ti->bytes * static_cast<uint64_t>(info.rows());
    info.offset = c.get<uint64_t>(where.c_str());
    check(info.offset % align == 0, where, ": data offset ", info.offset, " is not a multiple of the alignment ", align);
    s_->by_name[info.name] = s_->tensors.size();
    s_->tensors.push_back(std::move(info));
  }

  // the data section: aligned after the infos; every tensor inside it, none overlapping
  s_->data_at = (c.at() + align - 1) / align * align;
  const uint64_t data = s_->size >= s_->data_at ? s_->size - s_->data_at : 0;
  std::vector<const Tensor*> order;
  for (const Tensor& t : s_->tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) { return a->offset < b->offset; });
  uint64_t end = 0;
  const Tensor* prev = nullptr;
  for (const Tensor* t : order) {
    check(t->offset <= data && t->bytes <= data - t->offset, file, ": tensor \"", t->name, "\" (", ggml_type_name(
          static_cast<uint32_t>(t->type)), ", ", t->bytes, " bytes at data offset ", t->offset,
          ") runs past the end of the file (the data section holds ", data, " bytes)");
    check(t->offset >= end, file, ": tensor \"", t->name, "\" (data offset ", t->offset, ") overlaps tensor \"",
          prev ? prev->name : "", "\" (which ends at ", end, ")");
    end = t->offset + t->bytes;
    prev = t;
  }
}

GgufFile::~GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

const std::string& GgufFile::path() const { return s_->path; }
uint32_t GgufFile::version() const { return s_->version; }
const std::map<std::string, GgufValue>& GgufFile::metadata() const { return s_->metadata; }
const std::vector<GgufFile::Tensor>& GgufFile::tensors() const { return s_->tensors; }

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = s_->metadata.find(key);
  return it == s_->metadata.end() ? nullptr : &it->second;
}

const GgufFile::Tensor* GgufFile::tensor(const std::string& name) const {
  auto it = s_->by_name.find(name);
  return it == s_->by_name.end() ? nullptr : &s_->tensors[it->second];
}

int64_t GgufFile::integer(const std::string& key, int64_t lo, int64_t hi) const {
  const GgufValue* v = find(key);
  check(v != nullptr, s_->path, ": metadata \"", key, "\" is missing");
  return integer_or(key, 0, lo, hi);
}

int64_t GgufFile::integer_or(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  const bool is_unsigned = v->kind == GgufValue::U8 || v->kind == GgufValue::U16 || v->kind == GgufValue::U32 ||
                           v->kind == GgufValue::U64;
  const bool is_signed = v->kind == GgufValue::I8 || v->kind == GgufValue::I16 || v->kind == GgufValue::I32 ||
                         v->kind == GgufValue::I64;
  check(is_unsigned || is_signed, s_->path, ": metadata \"", key, "\" is a ", kind_name(v->kind),
        "; expected an integer");
  const bool in = is_unsigned ? v->u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(v->u) >= lo
                              : v->i >= lo && v->i <= hi;
  check(in, s_->path, ": metadata \"", key, "\" is ", is_unsigned ? std::to_string(v->u) : std::to_string(v->i),
        "; expected ", lo, " to ", hi);
  return is_unsigned ? static_cast<int64_t>(v->u) : v->i;
}

double GgufFile::number_or(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  check(v->kind != GgufValue::String && v->kind != GgufValue::Array && v->kind != GgufValue::Bool, s_->path,
        ": metadata \"", key, "\" is a ", kind_name(v->kind), "; expected a number");
  check(std::isfinite(v->f), s_->path, ": metadata \"", key, "\" is ", v->f, "; expected a finite number");
  return v->f;
}

std::string GgufFile::string_or(const std::string& key, const std::string& fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  check(v->kind == GgufValue::String, s_->path, ": metadata \"", key, "\" is a ", kind_name(v->kind),
        "; expected a string");
  return v->s;
}

bool GgufFile::boolean_or(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  check(v->kind == GgufValue::Bool, s_->path, ": metadata \"", key, "\" is a ", kind_name(v->kind),
        "; expected a bool");
  return v->u != 0;
}

void GgufFile::read_rows(const Tensor& t, int64_t first, int64_t n, void* dst) const {
  const uint64_t rb = ggml_row_bytes(t.type, t.ne[0]);
  check(first >= 0 && n >= 0 && first + n <= t.rows(), s_->path, ": tensor \"", t.name, "\" has ", t.rows(),
        " rows; rows [", first, ", ", first + n, ") were asked for");
  const uint64_t at = s_->data_at + t.offset + static_cast<uint64_t>(first) * rb, bytes = static_cast<uint64_t>(n) * rb;
  uint64_t done = 0;
  auto* out = static_cast<char*>(dst);
  while (done < bytes) {
    const ssize_t got = ::pread(s_->fd, out + done, bytes - done, static_cast<off_t>(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(s_->path, ": read failed at byte ", at + done, ": ", std::strerror(errno));
    if (got == 0) fail(s_->path, ": unexpected end of file at byte ", at + done, " (the file changed while being read)");
    done += static_cast<uint64_t>(got);
  }
}

void GgufFile::read_rows_f32(const Tensor& t, int64_t first, int64_t n, float* dst) const {
  const uint64_t rb = ggml_row_bytes(t.type, t.ne[0]);
  const int64_t K = t.ne[0];
  // float32 rows are the floats themselves: read straight into place (a copy of the whole tensor
  // first would put its size on the load's peak memory: a float32 output layer is 100s of MiB)
  if (t.type == GgmlType::F32) {
    read_rows(t, first, n, dst);
    return;
  }
  // the other types through a buffer of about 1 MiB of rows at a time
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((uint64_t{1} << 20) / std::max<uint64_t>(rb, 1)));
  std::vector<uint8_t> raw(static_cast<size_t>(rb * static_cast<uint64_t>(std::min(n, chunk))));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t m = std::min(chunk, n - r0);
    read_rows(t, first + r0, m, raw.data());
    for (int64_t r = 0; r < m; ++r) {
      const uint8_t* row = raw.data() + static_cast<size_t>(r) * rb;
      float* out = dst + (r0 + r) * K;
      switch (t.type) {
        case GgmlType::F32: break;  // read in place above
        case GgmlType::F16: kernels::dequantize_row(WType::F16, row, K, out); break;
        case GgmlType::BF16: kernels::dequantize_row(WType::BF16, row, K, out); break;
        case GgmlType::Q8_0: kernels::dequantize_row(WType::Q8_0, row, K, out); break;
        case GgmlType::Q4_0: kernels::dequantize_row(WType::Q4_0, row, K, out); break;
        case GgmlType::Q4_K: kernels::dequantize_q4_k(row, K, out); break;
        case GgmlType::Q5_K: kernels::dequantize_q5_k(row, K, out); break;
        case GgmlType::Q6_K: kernels::dequantize_q6_k(row, K, out); break;
      }
    }
  }
}

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 4) return false;
  const int fd = open_regular_file(path, ".gguf file");
  char magic[4] = {};
  const ssize_t got = ::pread(fd, magic, 4, 0);
  ::close(fd);
  return got == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string gguf_chat_template(const GgufFile& file) { return file.string_or("tokenizer.chat_template", ""); }

}  // namespace qkv

namespace qkv {

namespace {

void put_u32(std::string& o, uint32_t v) { o.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& o, uint64_t v) { o.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& o, const std::string& s) {
  put_u64(o, s.size());
  o += s;
}

// One value of kind k (a scalar from v, or element i of v's array).
void put_scalar(std::string& o, uint32_t k, double f, uint64_t u, int64_t i, const std::string& s, const char* key) {
  switch (k) {
    case GgufValue::U32: put_u32(o, static_cast<uint32_t>(u)); return;
    case GgufValue::I32: {
      const auto v = static_cast<int32_t>(i);
      o.append(reinterpret_cast<const char*>(&v), 4);
      return;
    }
    case GgufValue::F32: {
      const auto v = static_cast<float>(f);
      o.append(reinterpret_cast<const char*>(&v), 4);
      return;
    }
    case GgufValue::Bool: o += static_cast<char>(u ? 1 : 0); return;
    case GgufValue::String: put_str(o, s); return;
  }
  fail("write_gguf: metadata \"", key, "\": value kind ", k, " is not written (U32, I32, F32, Bool, String or arrays)");
}

}  // namespace

void write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<GgufTensorBytes>& tensors) {
  constexpr uint64_t kAlign = 32;
  std::string head = "GGUF";
  put_u32(head, 3);
  put_u64(head, tensors.size());
  put_u64(head, metadata.size());
  std::set<std::string> keys;
  for (const auto& [key, v] : metadata) {
    check(keys.insert(key).second, path, ": metadata \"", key, "\" given twice");
    put_str(head, key);
    put_u32(head, v.kind);
    if (v.kind != GgufValue::Array) {
      put_scalar(head, v.kind, v.f, v.u, v.i, v.s, key.c_str());
      continue;
    }
    put_u32(head, v.elem);
    const size_t n = v.elem == GgufValue::String ? v.strings.size() : v.numbers.size();
    put_u64(head, n);
    for (size_t e = 0; e < n; ++e)
      if (v.elem == GgufValue::String)
        put_str(head, v.strings[e]);
      else
        put_scalar(head, v.elem, v.numbers[e], static_cast<uint64_t>(v.numbers[e]), static_cast<int64_t>(v.numbers[e]),
                   "", key.c_str());
  }
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const GgufTensorBytes& t : tensors) {
    check(names.insert(t.name).second, path, ": tensor \"", t.name, "\" given twice");
    check(!t.ne.empty() && t.ne.size() <= 4, path, ": tensor \"", t.name, "\" has ", t.ne.size(), " dimensions");
    int64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
    check(ggml_row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(rows) == t.bytes.size(), path, ": tensor \"",
          t.name, "\": ", t.bytes.size(), " bytes do not hold ", shape_str(t.ne), " of ",
          ggml_type_name(static_cast<uint32_t>(t.type)));
    put_str(head, t.name);
    put_u32(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) put_u64(head, static_cast<uint64_t>(n));
    put_u32(head, static_cast<uint32_t>(t.type));
    put_u64(head, offset);
    offset += (t.bytes.size() + kAlign - 1) / kAlign * kAlign;
  }
  head.append((kAlign - head.size() % kAlign) % kAlign, '\0');
  static const std::string zeros(kAlign, '\0');
  std::vector<std::string_view> pieces{head};
  for (const GgufTensorBytes& t : tensors) {
    pieces.emplace_back(t.bytes);
    pieces.emplace_back(zeros.data(), (kAlign - t.bytes.size() % kAlign) % kAlign);
  }
  write_file_atomic(path, pieces);
}

}  // namespace qkv
