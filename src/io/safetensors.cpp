// Hugging Face .safetensors reading and writing (format and validation rules: qkv/safetensors.h).
// The whole header is parsed and checked before any tensor is allocated, and the checked
// ranges tile the data section exactly, so every allocation is bounded by the size of the file.
#include "qkv/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "qkv/files.h"

namespace qkv {

static_assert(std::endian::native == std::endian::little, "safetensors.cpp assumes a little-endian host");

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr uint64_t kMaxDim = uint64_t{1} << 62;
constexpr uint64_t kAlign = 8;  // the writer starts the data section at a multiple of this
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kFields[] = "dtype, shape and data_offsets";
constexpr char kReadable[] = "F32, F64, I32, I64, BOOL, BF16, F16 or U8";

// Text from the file made safe to quote: control bytes become \xNN (UTF-8 passes through), long
// text is cut.
std::string printable(std::string_view s, size_t max_len = 120) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// A JSON value for a message: scalars as written, containers by kind (never dumped: a hostile
// header may nest them deeply).
std::string show(const Json& v) {
  if (v.is_structured()) return std::string("a JSON ") + v.type_name();
  return printable(v.dump());
}

// ---------------------------------------------------------------------------------------------
// dtypes

// No: read as is; BF16, F16: widened to float32; Bytes: raw bytes (U8: packed weights,
// SafetensorsReader::read_bytes), never a Tensor.
enum class Half { No, BF16, F16, Bytes };

struct FileDType {
  const char* name;  // as spelled in the header
  size_t size;       // bytes per element in the file
  DType dtype;       // in memory
  Half half;
};

constexpr FileDType kFileDTypes[] = {
    {"F32", 4, DType::F32, Half::No},  {"F64", 8, DType::F64, Half::No},   {"I32", 4, DType::I32, Half::No},
    {"I64", 8, DType::I64, Half::No},  {"BOOL", 1, DType::Bool, Half::No}, {"BF16", 2, DType::F32, Half::BF16},
    {"F16", 2, DType::F32, Half::F16}, {"U8", 1, DType::Bool, Half::Bytes},
};

// bfloat16 is the top half of a float32.
float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mant << 13);  // inf, NaN
  return std::bit_cast<float>(sign | (exp + 127 - 15) << 23 | mant << 13);
}

// ---------------------------------------------------------------------------------------------
// The header

struct Entry {
  std::string name;
  const FileDType* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

// The header length N from the first min(size, 8) bytes of a file of `size` bytes, checked
// against the file.
uint64_t header_length(std::string_view first, uint64_t size, const std::string& file) {
  if (size < 8)
    fail(file, ": file is ", size, " bytes, too short for a .safetensors file (expected an 8-byte header length)");
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(first[i])) << (8 * i);
  if (n == 0) fail(file, ": header length is 0 (expected a JSON object)");
  if (n > kMaxHeaderBytes) fail(file, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n > size - 8)
    fail(file, ": header length ", n, " runs past the end of the file (", size - 8, " bytes follow the length field)");
  return n;
}

// Parses the header JSON, rejecting a key repeated in any object (nlohmann::json would keep
// the last silently). `top_keys` receives the top-level keys in file order.
Json parse_json(const std::string& text, const std::string& file, std::vector<std::string>& top_keys) {
  // nlohmann::json stops at a NUL byte as if the input ended there; JSON never contains one.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    fail(file, ": header is not valid JSON: NUL byte at offset ", nul, " of the header");
  std::vector<std::set<std::string>> open;  // keys seen so far in each object being parsed
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second) {
        if (depth == 1 && key == kMetadataKey) fail(file, ": __metadata__ appears twice in the header");
        if (depth == 1) fail(file, ": tensor '", printable(key), "' appears twice in the header");
        std::string in = "the header";  // the innermost top-level key names the object
        if (!top_keys.empty() && top_keys.back() == kMetadataKey) {
          in = kMetadataKey;
        } else if (!top_keys.empty()) {
          in = "the entry of tensor '" + printable(top_keys.back()) + "'";
        }
        fail(file, ": duplicate key \"", printable(key), "\" in ", in);
      }
      if (depth == 1) top_keys.push_back(key);
    }
    return true;
  };
  try {
    return Json::parse(text, on_event);
  } catch (const Json::exception& e) {
    fail(file, ": header is not valid JSON: ", e.what());
  }
}

// A non-negative JSON integer (-0 included) no larger than `max`; never a float such as 2.0.
bool get_uint(const Json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) return false;
  *out = v.is_number_unsigned() ? v.get<uint64_t>() : 0;
  return *out <= max;
}

Entry parse_entry(const std::string& name, const Json& v, uint64_t data_size, const std::string& file) {
  const std::string where = detail::concat(file, ": tensor '", printable(name), "': ");
  if (!v.is_object()) fail(where, "entry is ", show(v), " (expected an object with ", kFields, ")");
  for (const auto& item : v.items()) {
    const std::string& key = item.key();
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail(where, "unexpected field \"", printable(key), "\" (expected only ", kFields, ")");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(where, "missing field \"", key, "\" (expected ", kFields, ")");

  Entry e;
  e.name = name;
  const Json& dtype = v.at("dtype");
  if (!dtype.is_string()) fail(where, "dtype is ", show(dtype), " (expected a string: ", kReadable, ")");
  for (const FileDType& f : kFileDTypes)
    if (dtype.get_ref<const std::string&>() == f.name) e.dtype = &f;
  if (e.dtype == nullptr) fail(where, "unsupported dtype ", show(dtype), " (supported: ", kReadable, ")");

  const Json& shape = v.at("shape");
  if (!shape.is_array()) fail(where, "shape is ", show(shape), " (expected an array of non-negative integers)");
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    if (!get_uint(shape[i], kMaxDim, &d))
      fail(where, "shape[", i, "] is ", show(shape[i]), " (expected an integer from 0 to 2^62)");
    e.shape.push_back(static_cast<int64_t>(d));
  }

  const Json& offsets = v.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    fail(where, "data_offsets is ", offsets.is_array() ? detail::concat("an array of ", offsets.size()) : show(offsets),
         offsets.is_array() ? " elements" : "", " (expected [begin, end], two non-negative integers)");
  for (size_t i = 0; i < 2; ++i) {
    if (!get_uint(offsets[i], UINT64_MAX, i == 0 ? &e.begin : &e.end))
      fail(where, "data_offsets[", i, "] is ", show(offsets[i]), " (expected a non-negative integer)");
  }
  const std::string range = detail::concat("data_offsets [", e.begin, ", ", e.end, "]");
  if (e.begin > e.end) fail(where, range, " has begin > end");

  // Bytes = product(shape) x element size, without overflow. Size-0 and size-1 dimensions count
  // as 1 in `span` so that the strides of the tensor are representable too.
  int64_t count = 1, span = 1, bytes = 0;
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span))
      fail(where, "shape ", shape_str(e.shape), " is too large (element count overflows int64)");
    count *= d;  // count <= span, so this cannot overflow
  }
  if (__builtin_mul_overflow(count, static_cast<int64_t>(e.dtype->size), &bytes))
    fail(where, "shape ", shape_str(e.shape), " of ", e.dtype->name, " is too large (byte count overflows int64)");
  if (e.end - e.begin != static_cast<uint64_t>(bytes))
    fail(where, e.dtype->name, " ", shape_str(e.shape), " needs ", bytes, " bytes but ", range, " hold ",
         e.end - e.begin);
  if (e.end > data_size) fail(where, range, " run past the end of the data section (", data_size, " bytes)");
  return e;
}

Header parse_header(const std::string& text, uint64_t data_size, const std::string& file) {
  std::vector<std::string> keys;
  const Json j = parse_json(text, file, keys);
  if (!j.is_object()) fail(file, ": header is ", show(j), " (expected a JSON object)");

  Header h;
  for (const std::string& key : keys) {
    const Json& v = j.at(key);
    if (key == kMetadataKey) {
      if (!v.is_object()) fail(file, ": __metadata__ is ", show(v), " (expected an object of strings)");
      for (const auto& item : v.items()) {
        if (!item.value().is_string())
          fail(file, ": __metadata__ value of \"", printable(item.key()), "\" is ", show(item.value()),
               " (expected a string)");
        h.metadata.emplace(item.key(), item.value().get<std::string>());
      }
      continue;
    }
    if (key.empty()) fail(file, ": a tensor has an empty name in the header");
    h.entries.push_back(parse_entry(key, v, data_size, file));
  }

  // Sorted by offset, the ranges must tile the data section: no gap, no overlap, nothing after.
  // Ties (zero-size tensors) keep their header order.
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < at)
      fail(file, ": tensor '", printable(e.name), "' (data_offsets [", e.begin, ", ", e.end, "]) overlaps tensor '",
           printable(prev->name), "' (data_offsets [", prev->begin, ", ", prev->end, "])");
    if (e.begin > at)
      fail(file, ": gap of ", e.begin - at, " unused bytes before tensor '", printable(e.name), "' (data_offsets [",
           e.begin, ", ", e.end, "]; expected it to begin at ", at, ")");
    at = e.end;
    prev = &e;
  }
  if (at != data_size)
    fail(file, ": ", data_size - at, " trailing bytes after the last tensor (data section is ", data_size,
         " bytes, tensors end at ", at, ")");
  return h;
}

// ---------------------------------------------------------------------------------------------
// Tensors

// The tensor for `e`, filled by read(dst, offset, n), which copies n bytes from `offset` in the
// data section.
template <class Read>
Tensor load(const Entry& e, const std::string& file, Read&& read) {
  const std::string where = detail::concat(file, ": tensor '", printable(e.name), "': ");
  if (e.dtype->half == Half::Bytes)
    fail(where, e.dtype->name, " holds raw bytes (a packed weight: docs/formats.md), not values a tensor can hold");
  Tensor t;
  try {
    t = Tensor(e.shape, e.dtype->dtype);
  } catch (const Error& err) {
    fail(where, err.what());
  }
  char* out = static_cast<char*>(t.raw_data());
  const uint64_t n = e.end - e.begin;
  if (e.dtype->half == Half::No) {
    read(out, e.begin, n);
    if (e.dtype->dtype == DType::Bool) {
      for (uint64_t i = 0; i < n; ++i) {
        const unsigned char b = static_cast<unsigned char>(out[i]);
        if (b > 1) fail(where, "BOOL element ", i, " has byte value ", static_cast<int>(b), " (expected 0 or 1)");
      }
    }
    return t;
  }
  // The n bytes of halves go to the back half of the 2n bytes of floats, then widen front to
  // back: float i (bytes 4i..4i+3) ends before half i+1 (bytes n+2i+2..), so no half is
  // overwritten before it is read.
  char* halves = out + n;
  read(halves, e.begin, n);
  const uint64_t count = n / 2;
  for (uint64_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, halves + 2 * i, 2);
    const float f = e.dtype->half == Half::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    std::memcpy(out + 4 * i, &f, 4);
  }
  return t;
}

template <class Read>
SafetensorsFile load_all(Header&& h, const std::string& file, Read&& read) {
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  out.tensors.reserve(h.entries.size());
  for (const Entry& e : h.entries) out.tensors.emplace_back(e.name, load(e, file, read));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Files

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

uint64_t file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, ": cannot stat .safetensors file: ", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, ": is a directory (expected a .safetensors file)");
  if (!S_ISREG(st.st_mode)) fail(path, ": is not a regular file (expected a .safetensors file)");
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly n bytes at `offset`.
void read_at(int fd, char* dst, uint64_t n, uint64_t offset, const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path, ": read failed at byte ", offset + done, ": ", std::strerror(errno));
    if (got == 0)
      fail(path, ": unexpected end of file at byte ", offset + done, " (the file changed size while being read)");
    done += static_cast<uint64_t>(got);
  }
}

const char* writable_name(DType t) {
  for (const FileDType& f : kFileDTypes)
    if (f.dtype == t && f.half == Half::No) return f.name;
  return nullptr;
}

const FileDType* file_dtype(const std::string& name) {
  for (const FileDType& f : kFileDTypes)
    if (name == f.name) return &f;
  return nullptr;
}

// `s` as a JSON string literal.
std::string quoted(const std::string& s, const std::string& context, const char* what) {
  try {
    return Json(s).dump();
  } catch (const Json::exception&) {
    fail(context, ": ", what, " '", printable(s), "' is not valid UTF-8");
  }
}

// A .safetensors file as pieces: its first 8 + header bytes (returned), then each entry's bytes
// (`data` views them).
std::string safetensors_head(const std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata,
                             const std::string& context, std::vector<std::string_view>* data) {
  // Header: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...}
  std::string header = "{";
  if (!metadata.empty()) {
    header += std::string("\"") + kMetadataKey + "\":{";
    for (const auto& [key, value] : metadata)
      header += quoted(key, context, "metadata key") + ":" + quoted(value, context, "metadata value") + ",";
    header.back() = '}';
    header += ',';
  }
  std::set<std::string_view> seen;
  uint64_t at = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::string& name = e.name;
    if (name.empty()) fail(context, ": a tensor has an empty name (expected a non-empty name)");
    if (name == kMetadataKey) fail(context, ": tensor name \"__metadata__\" is reserved for the metadata");
    if (!seen.insert(name).second) fail(context, ": tensor '", printable(name), "' appears twice");
    const FileDType* f = file_dtype(e.dtype);
    if (f == nullptr) fail(context, ": tensor '", printable(name), "' has dtype '", printable(e.dtype), "' (expected ", kReadable, ")");
    uint64_t n = f->size;
    for (int64_t d : e.shape) {
      if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
        fail(context, ": tensor '", printable(name), "' has shape ", shape_str(e.shape), " (negative or too large)");
    }
    if (n != e.bytes.size())
      fail(context, ": tensor '", printable(name), "' ", e.dtype, " ", shape_str(e.shape), " needs ", n, " bytes, given ",
           e.bytes.size());
    header += quoted(name, context, "tensor name") + ":{\"dtype\":\"" + f->name + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(e.shape[i]);
    }
    header += detail::concat("],\"data_offsets\":[", at, ",", at + n, "]},");
    at += n;
  }
  if (header.back() == ',') header.pop_back();
  header += '}';
  header.append((kAlign - header.size() % kAlign) % kAlign, ' ');  // 8 + N is a multiple of 8

  std::string out;
  for (size_t i = 0; i < 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  data->clear();
  for (const SafetensorsEntry& e : entries)
    if (!e.bytes.empty()) data->push_back(e.bytes);
  return out;
}

// Tensors as entries (contiguous copies, where a tensor is not, kept in *keep).
std::vector<SafetensorsEntry> entries_of(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                         const std::string& context, std::vector<Tensor>* keep) {
  std::vector<SafetensorsEntry> out;
  keep->clear();
  keep->reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) fail(context, ": tensor '", printable(name), "' is undefined");
    const char* dtype = writable_name(t.dtype());
    if (dtype == nullptr)
      fail(context, ": tensor '", printable(name), "' is ", t.describe(),
           ", which .safetensors writing does not support (expected float32, float64, int32, int64 or bool)");
    keep->push_back(t.contiguous());
    out.push_back({name, dtype, t.shape(),
                   std::string_view(static_cast<const char*>(keep->back().raw_data()), keep->back().nbytes())});
  }
  return out;
}

std::string safetensors_head(const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata, const std::string& context,
                             std::vector<Tensor>* keep, std::vector<std::string_view>* data) {
  return safetensors_head(entries_of(tensors, context, keep), metadata, context, data);
}

std::string safetensors_bytes(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata, const std::string& context) {
  std::vector<Tensor> keep;
  std::vector<std::string_view> data;
  std::string out = safetensors_head(tensors, metadata, context, &keep, &data);
  size_t total = out.size();
  for (std::string_view d : data) total += d.size();
  out.reserve(total);
  for (std::string_view d : data) out.append(d);
  return out;
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name_for_errors) {
  const std::string& file = name_for_errors;
  const uint64_t n = header_length(std::string_view(bytes).substr(0, 8), bytes.size(), file);
  const uint64_t data_at = 8 + n;
  Header h = parse_header(bytes.substr(8, n), bytes.size() - data_at, file);
  return load_all(std::move(h), file, [&](char* dst, uint64_t offset, uint64_t len) {
    if (len > 0) std::memcpy(dst, bytes.data() + data_at + offset, len);
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  const int fd = open_regular_file(path, ".safetensors file");  // never waits on a FIFO
  const FdCloser closer{fd};
  const uint64_t size = file_size(fd, path);
  char first[8] = {};
  read_at(fd, first, std::min<uint64_t>(size, 8), 0, path);
  const uint64_t n = header_length(std::string_view(first, 8), size, path);
  std::string text(n, '\0');
  read_at(fd, text.data(), n, 8, path);
  const uint64_t data_at = 8 + n;
  SafetensorsFile out =
      load_all(parse_header(text, size - data_at, path), path,
               [&](char* dst, uint64_t offset, uint64_t len) { read_at(fd, dst, len, data_at + offset, path); });
  const uint64_t now = file_size(fd, path);
  if (now != size) fail(path, ": file changed size while being read (from ", size, " to ", now, " bytes)");
  return out;
}

struct SafetensorsReader::State {
  std::string path;
  int fd = -1;
  uint64_t size = 0, data_at = 0;
  Header header;
  std::vector<Info> infos;
  ~State() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : s_(std::make_unique<State>()) {
  s_->path = path;
  s_->fd = open_regular_file(path, ".safetensors file");  // never waits on a FIFO
  s_->size = file_size(s_->fd, path);
  char first[8] = {};
  read_at(s_->fd, first, std::min<uint64_t>(s_->size, 8), 0, path);
  const uint64_t n = header_length(std::string_view(first, 8), s_->size, path);
  std::string text(n, '\0');
  read_at(s_->fd, text.data(), n, 8, path);
  s_->data_at = 8 + n;
  s_->header = parse_header(text, s_->size - s_->data_at, path);
  for (const Entry& e : s_->header.entries) s_->infos.push_back({e.name, e.dtype->name, e.shape, e.end - e.begin});
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

int64_t SafetensorsReader::Info::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const std::string& SafetensorsReader::path() const { return s_->path; }
const std::vector<SafetensorsReader::Info>& SafetensorsReader::tensors() const { return s_->infos; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return s_->header.metadata; }

const SafetensorsReader::Info* SafetensorsReader::find(const std::string& name) const {
  for (const Info& i : s_->infos)
    if (i.name == name) return &i;
  return nullptr;
}

void SafetensorsReader::read_f32(const std::string& name, float* dst) const {
  const Info* i = find(name);
  if (!i) fail(s_->path, ": has no tensor '", printable(name), "'");
  read_f32_range(name, 0, i->numel(), dst);
}

void SafetensorsReader::read_f32_range(const std::string& name, int64_t first, int64_t count, float* dst) const {
  const Entry* e = nullptr;
  for (const Entry& x : s_->header.entries)
    if (x.name == name) e = &x;
  if (!e) fail(s_->path, ": has no tensor '", printable(name), "'");
  const std::string& path = s_->path;
  const uint64_t n = (e->end - e->begin) / e->dtype->size;
  if (first < 0 || count < 0 || static_cast<uint64_t>(first) > n || static_cast<uint64_t>(count) > n - static_cast<uint64_t>(first))
    fail(path, ": tensor '", printable(name), "' has ", n, " elements; elements [", first, ", ", first, " + ", count,
         ") were asked for");
  const uint64_t at = s_->data_at + e->begin + static_cast<uint64_t>(first) * e->dtype->size,
                 bytes = static_cast<uint64_t>(count) * e->dtype->size;
  const std::string dt = e->dtype->name;
  if (dt == "F32") {
    read_at(s_->fd, reinterpret_cast<char*>(dst), bytes, at, path);
  } else if (dt == "F64" || dt == "F16" || dt == "BF16") {
    // through a small buffer, converting as it goes
    const uint64_t width = e->dtype->size, chunk = uint64_t{1} << 16;
    std::vector<char> buf(static_cast<size_t>(chunk * width));
    const uint64_t elements = bytes / width;
    for (uint64_t i = 0; i < elements; i += chunk) {
      const uint64_t k = std::min(chunk, elements - i);
      read_at(s_->fd, buf.data(), k * width, at + i * width, path);
      for (uint64_t j = 0; j < k; ++j) {
        float f;
        if (dt == "F64") {
          double d;
          std::memcpy(&d, buf.data() + 8 * j, 8);
          f = static_cast<float>(d);
        } else {
          uint16_t h;
          std::memcpy(&h, buf.data() + 2 * j, 2);
          f = dt == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
        }
        dst[i + j] = f;
      }
    }
  } else {
    fail(path, ": tensor '", printable(name), "' is ", dt, "; expected floating point (F32, F64, F16 or BF16)");
  }
  const uint64_t now = file_size(s_->fd, path);
  if (now != s_->size) fail(path, ": file changed size while being read (from ", s_->size, " to ", now, " bytes)");
}

void SafetensorsReader::read_bytes(const std::string& name, void* dst, uint64_t bytes) const {
  const Entry* e = nullptr;
  for (const Entry& x : s_->header.entries)
    if (x.name == name) e = &x;
  if (!e) fail(s_->path, ": has no tensor '", printable(name), "'");
  if (bytes != e->end - e->begin)
    fail(s_->path, ": tensor '", printable(name), "' holds ", e->end - e->begin, " bytes, not ", bytes);
  read_at(s_->fd, static_cast<char*>(dst), bytes, s_->data_at + e->begin, s_->path);
  const uint64_t now = file_size(s_->fd, s_->path);
  if (now != s_->size) fail(s_->path, ": file changed size while being read (from ", s_->size, " to ", now, " bytes)");
}

std::string to_safetensors_bytes(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  return safetensors_bytes(tensors, metadata, "to_safetensors_bytes");
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // streamed from the tensors: no copy of the whole file (a 1.5 GB checkpoint is 1.5 GB of fresh
  // memory and a page fault per 4 KiB of it)
  std::vector<Tensor> keep;
  std::vector<std::string_view> pieces;
  const std::string head = safetensors_head(tensors, metadata, path, &keep, &pieces);
  pieces.insert(pieces.begin(), std::string_view(head));
  write_file_atomic(path, pieces);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::string_view> pieces;
  const std::string head = safetensors_head(entries, metadata, path, &pieces);
  pieces.insert(pieces.begin(), std::string_view(head));
  write_file_atomic(path, pieces);
}

}  // namespace qkv
