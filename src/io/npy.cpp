// NumPy .npy reading and writing. The file is never trusted: magic, version, header length,
// the header dict, dtype, shape and data size are all checked before anything is allocated.
#include "qkv/npy.h"

#include "qkv/files.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace qkv {

static_assert(std::endian::native == std::endian::little, "npy.cpp assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;         // data starts at a multiple of this (what NumPy writes)
constexpr size_t kGrowthDigits = 21;  // NumPy leaves room for the first axis to grow to this many digits

// Header text made safe to quote in a message: non-printable bytes become \xNN, long text is cut.
std::string printable(const std::string& s, size_t max_len = 80) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
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

// Throws qkv::Error(concat(args...)). Unlike check(), callers build the message only on failure.
// ---------------------------------------------------------------------------------------------
// The header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  Header parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<std::vector<int64_t>> shape;
    skip_ws();
    expect('{', "'{' opening the header dict");
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      const size_t key_pos = pos_;
      const std::string key = parse_string("a quoted key");
      skip_ws();
      expect(':', "':' after the key");
      skip_ws();
      if (key == "descr") {
        check_new(descr.has_value(), key);
        descr = parse_descr();
      } else if (key == "fortran_order") {
        check_new(fortran.has_value(), key);
        fortran = parse_bool();
      } else if (key == "shape") {
        check_new(shape.has_value(), key);
        shape = parse_shape();
      } else {
        pos_ = key_pos;
        fail("unexpected key '" + printable(key) + "' (expected only 'descr', 'fortran_order' and 'shape')");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') break;
      fail("expected ',' or '}' after the value of '" + key + "'");
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the header dict (expected only spaces and a newline)");
    if (!descr) missing("descr");
    if (!fortran) missing("fortran_order");
    if (!shape) missing("shape");
    return Header{*descr, *fortran, *shape};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(detail::concat(name_, ": malformed .npy header at offset ", pos_, ": ", what, "; header is \"",
                               printable(s_), "\""));
  }
  [[noreturn]] void missing(const char* key) const {
    throw Error(detail::concat(name_, ": .npy header has no '", key,
                               "' key (expected 'descr', 'fortran_order' and 'shape'); header is \"", printable(s_),
                               "\""));
  }
  void check_new(bool seen, const std::string& key) const {
    if (seen) fail("duplicate key '" + key + "'");
  }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= s_.size(); }
  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c, const char* what) {
    if (at_end() || s_[pos_] != c) fail(std::string("expected ") + what);
    ++pos_;
  }

  // 'text' or "text", without escapes (no valid key or descr needs one).
  std::string parse_string(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(std::string("expected ") + what);
    const size_t start = ++pos_;
    while (!at_end() && s_[pos_] != q) {
      if (s_[pos_] == '\\') fail("escape sequences in strings are not supported");
      if (s_[pos_] == '\n') fail("unterminated string");
      ++pos_;
    }
    if (at_end()) fail("unterminated string");
    return s_.substr(start, pos_++ - start);
  }

  std::string parse_descr() {
    if (peek() == '[') {
      throw Error(detail::concat(name_, ": unsupported dtype (a structured dtype ", printable(s_.substr(pos_), 40),
                                 ") (expected little-endian float32, float64, int32, int64 or bool)"));
    }
    return parse_string("a quoted dtype string for 'descr'");
  }

  bool parse_bool() {
    for (const char* word : {"True", "False"}) {
      const size_t n = std::strlen(word);
      if (s_.compare(pos_, n, word) == 0) {
        const size_t end = pos_ + n;
        const char next = end < s_.size() ? s_[end] : '\0';
        if (!(std::isalnum(static_cast<unsigned char>(next)) || next == '_')) {
          pos_ = end;
          return word[0] == 'T';
        }
      }
    }
    fail("expected True or False for 'fortran_order'");
  }

  // A tuple of non-negative integers: (), (3,), (2, 3), (2, 3, ).
  std::vector<int64_t> parse_shape() {
    expect('(', "a tuple such as (2, 3) for 'shape'");
    std::vector<int64_t> shape;
    bool trailing_comma = false;
    for (;;) {
      skip_ws();
      if (peek() == ')') break;
      shape.push_back(parse_dim());
      skip_ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        continue;
      }
      if (peek() != ')') fail("expected ',' or ')' in 'shape'");
    }
    ++pos_;  // ')'
    if (shape.size() == 1 && !trailing_comma) fail("'shape' is not a tuple (a 1-d shape is written (n,))");
    return shape;
  }

  int64_t parse_dim() {
    const size_t start = pos_;
    if (peek() == '-') {
      ++pos_;
      while (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      throw Error(detail::concat(name_, ": negative dimension ", s_.substr(start, pos_ - start),
                                 " in 'shape' (expected non-negative integers); header is \"", printable(s_), "\""));
    }
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative integer in 'shape'");
    int64_t v = 0;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[pos_] - '0', &v)) {
        throw Error(
            detail::concat(name_, ": dimension in 'shape' does not fit in int64; header is \"", printable(s_), "\""));
      }
      ++pos_;
    }
    if (std::isalpha(static_cast<unsigned char>(peek())) || peek() == '_' || peek() == '.') {
      fail("expected a non-negative integer in 'shape'");
    }
    return v;
  }

  const std::string& s_;
  const std::string& name_;
  size_t pos_ = 0;
};

// '<f4' and friends. '=' (native order) is little-endian on every host this builds for.
std::optional<DType> dtype_from_descr(const std::string& d) {
  if (d == "|b1") return DType::Bool;
  if (d.size() != 3 || (d[0] != '<' && d[0] != '=')) return std::nullopt;
  const std::string code = d.substr(1);
  if (code == "f4") return DType::F32;
  if (code == "f8") return DType::F64;
  if (code == "i4") return DType::I32;
  if (code == "i8") return DType::I64;
  return std::nullopt;
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::Bool: return "|b1";
    case DType::BF16: break;
  }
  return nullptr;
}

void put_le(std::string& out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const std::string& s, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string npy_bytes(const Tensor& t, const std::string& context) {
  if (!t.defined()) fail(context, ": cannot write an undefined tensor to .npy");
  const char* descr = descr_of(t.dtype());
  if (descr == nullptr)
    fail(context, ": cannot write ", t.describe(),
         " to .npy (expected float32, float64, int32, int64 or bool; .npy has no bfloat16)");

  // The dict exactly as NumPy writes it: sorted keys, repr'd values, then room for the first
  // axis to grow in place.
  std::string dict =
      detail::concat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape_str(t.shape()), ", }");
  if (t.dim() > 0) {
    const size_t digits = std::to_string(t.shape()[0]).size();
    dict.append(kGrowthDigits - digits, ' ');
  }

  // magic + version + length + dict + spaces + '\n', a multiple of kAlign bytes. Like NumPy, an
  // already aligned length still gets a full line of padding. Version 2.0 only when 1.0's
  // 16-bit header length cannot hold it.
  const size_t hlen = dict.size() + 1;
  size_t len_bytes = 2;
  size_t pad = kAlign - (kMagicLen + 2 + len_bytes + hlen) % kAlign;
  if (hlen + pad > 0xffff) {
    len_bytes = 4;
    pad = kAlign - (kMagicLen + 2 + len_bytes + hlen) % kAlign;
    if (hlen + pad > 0xffffffffu) fail(context, ": .npy header for ", t.describe(), " is too long");
  }

  const Tensor c = t.contiguous();
  const size_t nbytes = c.nbytes();
  std::string out;
  out.reserve(kMagicLen + 2 + len_bytes + hlen + pad + nbytes);
  out.append(kMagic, kMagicLen);
  out += static_cast<char>(len_bytes == 2 ? 1 : 2);
  out += '\0';
  put_le(out, hlen + pad, len_bytes);
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  if (nbytes > 0) out.append(static_cast<const char*>(c.raw_data()), nbytes);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reading

Tensor parse_npy(const std::string& bytes, const std::string& name) {
  // Magic string and version.
  const size_t n = bytes.size();
  if (n == 0) fail(name, ": empty file (expected a .npy file starting with the magic string \\x93NUMPY)");
  const bool magic_ok = bytes.compare(0, kMagicLen, kMagic, std::min(n, kMagicLen)) == 0;
  if (!magic_ok)
    fail(name, ": not a .npy file (expected the magic string \\x93NUMPY, found \"",
         printable(bytes.substr(0, kMagicLen)), "\")");
  if (n < kMagicLen + 2)
    fail(name, ": truncated .npy header (file is ", n, " bytes, expected the magic string and a format version)");
  const int major = static_cast<unsigned char>(bytes[kMagicLen]);
  const int minor = static_cast<unsigned char>(bytes[kMagicLen + 1]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(name, ": unsupported .npy format version ", major, ".", minor, " (expected 1.0, 2.0 or 3.0)");

  // Header length: 16 bits in version 1, 32 bits later.
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t len_at = kMagicLen + 2;
  if (n < len_at + len_bytes)
    fail(name, ": truncated .npy header (file is ", n, " bytes, expected at least ", len_at + len_bytes, ")");
  const uint64_t hlen = get_le(bytes, len_at, len_bytes);
  const size_t header_at = len_at + len_bytes;
  if (hlen > n - header_at)
    fail(name, ": .npy header length ", hlen, " runs past the end of the file (", n - header_at,
         " bytes follow the length field)");
  const std::string text = bytes.substr(header_at, hlen);
  const size_t data_at = header_at + hlen;

  // Header dict. Version 3 is UTF-8 rather than latin-1; every accepted value is ASCII either way.
  const Header h = HeaderParser(text, name).parse();
  const std::optional<DType> dt = dtype_from_descr(h.descr);
  if (!dt.has_value())
    fail(name, ": unsupported dtype '", printable(h.descr),
         "' (expected little-endian float32, float64, int32, int64 or bool: '<f4', '<f8', '<i4', '<i8' or '|b1')");

  // Size: computed without overflow and required to match the rest of the file exactly. Zero-size
  // dimensions count as 1 here so the tensor's strides are representable too.
  const int64_t item = static_cast<int64_t>(dtype_size(*dt));
  const std::string what = detail::concat(dtype_name(*dt), " ", shape_str(h.shape));
  int64_t count = 1, span = 1;
  for (int64_t d : h.shape) {
    if (__builtin_mul_overflow(count, d, &count) || __builtin_mul_overflow(span, d > 1 ? d : 1, &span))
      fail(name, ": shape ", shape_str(h.shape), " is too large (element count overflows int64)");
  }
  int64_t need = 0, span_bytes = 0;
  if (__builtin_mul_overflow(count, item, &need) || __builtin_mul_overflow(span, item, &span_bytes))
    fail(name, ": shape ", shape_str(h.shape), " of ", dtype_name(*dt), " is too large (byte count overflows int64)");
  const size_t have = n - data_at;
  if (static_cast<uint64_t>(need) > have)
    fail(name, ": truncated data: ", what, " needs ", need, " bytes, file has ", have, " after the header");
  if (static_cast<uint64_t>(need) != have)
    fail(name, ": ", have - static_cast<size_t>(need), " trailing bytes after the data of ", what,
         " (expected exactly ", need, " bytes)");

  const char* data = bytes.data() + data_at;
  if (*dt == DType::Bool) {
    for (int64_t i = 0; i < count; ++i) {
      const unsigned char b = static_cast<unsigned char>(data[i]);
      if (b > 1)
        fail(name, ": bool element ", i, " of ", what, " has byte value ", static_cast<int>(b), " (expected 0 or 1)");
    }
  }

  // Fortran order: the bytes are a C-order array of the reversed shape; reverse the axes back
  // and make it C-contiguous.
  std::vector<int64_t> stored_shape = h.shape;
  if (h.fortran_order) stored_shape.assign(h.shape.rbegin(), h.shape.rend());
  Tensor t(stored_shape, *dt);
  if (need > 0) std::memcpy(t.raw_data(), data, static_cast<size_t>(need));
  if (!h.fortran_order || h.shape.size() < 2) return t;
  std::vector<int64_t> order(h.shape.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  return t.permute(order).clone();
}

Tensor read_npy(const std::string& path) { return parse_npy(read_file(path, ".npy file"), path); }

// ---------------------------------------------------------------------------------------------
// Writing

std::string to_npy_bytes(const Tensor& t) { return npy_bytes(t, "to_npy_bytes"); }

void write_npy(const std::string& path, const Tensor& t) { write_file_atomic(path, npy_bytes(t, path)); }

}  // namespace qkv
