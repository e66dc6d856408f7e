// The Jinja2 subset of chat templates (qkv/chat_template.h): a lexer with Jinja's whitespace rules
// (trim_blocks, lstrip_blocks, "-" and "+" markers, one trailing newline dropped), a recursive-descent
// parser with Jinja's operator precedence, and a tree-walking renderer whose values print as Python
// prints them (True, None, 1.0, ['a']), since a template's output is Python's str() of its values.
#include "qkv/chat_template.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/gguf.h"

namespace qkv {

namespace {

using OJson = nlohmann::ordered_json;

// ---- values -------------------------------------------------------------------------------------

struct Node;
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum class K { Undefined, None, Bool, Int, Float, Str, Seq, Map, Ns, Macro };
  K k = K::Undefined;
  bool b = false;
  bool tuple = false;  // a Seq that Python would hold as a tuple (prints as (a, b))
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; for Undefined, the name that was missing (for errors)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Ns
  std::shared_ptr<const Node> macro;

  static Value none() { return make(K::None); }
  static Value boolean(bool v) { Value x = make(K::Bool); x.b = v; return x; }
  static Value integer(int64_t v) { Value x = make(K::Int); x.i = v; return x; }
  static Value real(double v) { Value x = make(K::Float); x.f = v; return x; }
  static Value str(std::string v) { Value x = make(K::Str); x.s = std::move(v); return x; }
  static Value undefined(std::string name) { Value x; x.s = std::move(name); return x; }
  static Value of_list(List v) { Value x = make(K::Seq); x.list = std::make_shared<List>(std::move(v)); return x; }
  static Value of_tuple(List v) { Value x = of_list(std::move(v)); x.tuple = true; return x; }
  static Value of_dict(Dict v, K k = K::Map) { Value x = make(k); x.dict = std::make_shared<Dict>(std::move(v)); return x; }
  static Value make(K k) { Value x; x.k = k; return x; }

  bool is_num() const { return k == K::Int || k == K::Float || k == K::Bool; }
  double num() const { return k == K::Float ? f : k == K::Int ? static_cast<double>(i) : (b ? 1.0 : 0.0); }
  const Value* find(const std::string& key) const {
    if (!dict) return nullptr;
    for (const auto& [k2, v] : *dict)
      if (k2 == key) return &v;
    return nullptr;
  }
};

Value from_json(const OJson& j) {
  switch (j.type()) {
    case OJson::value_t::null: return Value::none();
    case OJson::value_t::boolean: return Value::boolean(j.get<bool>());
    case OJson::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case OJson::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case OJson::value_t::number_float: return Value::real(j.get<double>());
    case OJson::value_t::string: return Value::str(j.get<std::string>());
    case OJson::value_t::array: {
      List l;
      for (const OJson& e : j) l.push_back(from_json(e));
      return Value::of_list(std::move(l));
    }
    case OJson::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(*it));
      return Value::of_dict(std::move(d));
    }
    default: return Value::none();
  }
}

// Python's repr of a float: the shortest digits that read back, fixed notation for decimal
// exponents in [-4, 16), else d.ddde+XX.
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (static_cast<int>(digits.size()) <= exp + 1) {
        out = digits + std::string(static_cast<size_t>(exp + 1 - static_cast<int>(digits.size())), '0') + ".0";
      } else {
        out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return (neg ? "-" : "") + out;
}

std::string py_repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out + static_cast<char>(q);
}

std::string to_str(const Value& v, bool repr = false);

std::string to_str(const Value& v, bool repr) {
  switch (v.k) {
    case Value::K::Undefined: return "";
    case Value::K::None: return "None";
    case Value::K::Bool: return v.b ? "True" : "False";
    case Value::K::Int: return std::to_string(v.i);
    case Value::K::Float: return py_float(v.f);
    case Value::K::Str: return repr ? py_repr_str(v.s) : v.s;
    case Value::K::Seq: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + to_str((*v.list)[i], true);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::K::Map:
    case Value::K::Ns: {
      std::string out = v.k == Value::K::Ns ? "<Namespace {" : "{";
      size_t i = 0;
      for (const auto& [k, e] : *v.dict) out += (i++ ? ", " : "") + py_repr_str(k) + ": " + to_str(e, true);
      return out + (v.k == Value::K::Ns ? "}>" : "}");
    }
    case Value::K::Macro: return "<macro>";
  }
  return "";
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::Undefined:
    case Value::K::None: return false;
    case Value::K::Bool: return v.b;
    case Value::K::Int: return v.i != 0;
    case Value::K::Float: return v.f != 0;
    case Value::K::Str: return !v.s.empty();
    case Value::K::Seq: return !v.list->empty();
    case Value::K::Map: return !v.dict->empty();
    default: return true;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    if (a.k != Value::K::Float && b.k != Value::K::Float)
      return (a.k == Value::K::Int ? a.i : a.b) == (b.k == Value::K::Int ? b.i : b.b);
    return a.num() == b.num();
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::K::Undefined:
    case Value::K::None: return true;
    case Value::K::Str: return a.s == b.s;
    case Value::K::Seq:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::K::Map:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    default: return a.dict == b.dict && a.macro == b.macro;
  }
}

// UTF-8 code point starts of s (and s.size() at the end), for Python's indexing by character.
std::vector<size_t> char_starts(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(s.size());
  return at;
}

// Python's json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort)
// (transformers' tojson filter).
void json_dump(const Value& v, int indent, bool sort, int depth, std::string& out, const std::string& where) {
  const auto nl = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.k) {
    case Value::K::None: out += "null"; return;
    case Value::K::Bool: out += v.b ? "true" : "false"; return;
    case Value::K::Int: out += std::to_string(v.i); return;
    case Value::K::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Value::K::Str: {
      out += '"';
      for (unsigned char c : v.s) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              char b[8];
              std::snprintf(b, sizeof b, "\\u%04x", c);
              out += b;
            } else {
              out += static_cast<char>(c);
            }
        }
      }
      out += '"';
      return;
    }
    case Value::K::Seq: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        nl(depth + 1);
        json_dump((*v.list)[i], indent, sort, depth + 1, out, where);
      }
      nl(depth);
      out += ']';
      return;
    }
    case Value::K::Map: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : *v.dict) items.push_back(&e);
      if (sort) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        nl(depth + 1);
        json_dump(Value::str(items[i]->first), indent, sort, depth + 1, out, where);
        out += ": ";
        json_dump(items[i]->second, indent, sort, depth + 1, out, where);
      }
      nl(depth);
      out += '}';
      return;
    }
    default: fail(where, "tojson: ", v.k == Value::K::Undefined ? "an undefined value" : "a namespace or macro",
                  " is not JSON");
  }
}

// ---- lexer --------------------------------------------------------------------------------------

enum class T { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Int, Float, Str, Op, End };

struct Tok {
  T t;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

class Lexer {
 public:
  Lexer(std::string src, std::string name) : src_(std::move(src)), name_(std::move(name)) {
    // Jinja reads every newline as \n and drops one newline at the very end
    std::string n;
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        n += '\n';
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        n += src_[i];
      }
    }
    if (!n.empty() && n.back() == '\n') n.pop_back();
    src_ = std::move(n);
  }

  std::vector<Tok> run() {
    bool lstrip_next = false;  // a "-" closed the last tag
    while (pos_ < src_.size()) {
      size_t open = pos_;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      std::string data = src_.substr(pos_, open == std::string::npos ? std::string::npos : open - pos_);
      const size_t data_start = pos_;
      if (lstrip_next) {
        size_t k = 0;
        while (k < data.size() && std::isspace(static_cast<unsigned char>(data[k]))) ++k;
        data.erase(0, k);
      }
      if (open == std::string::npos) {
        emit_data(data, data_start);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!data.empty() && std::isspace(static_cast<unsigned char>(data.back()))) data.pop_back();
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: spaces and tabs between a line's start and a block or comment tag
        const size_t nlpos = data.find_last_of('\n');
        const size_t from = nlpos == std::string::npos ? 0 : nlpos + 1;
        const bool line_start = nlpos != std::string::npos || data_start == 0 || src_[data_start - 1] == '\n';
        if (line_start && data.find_first_not_of(" \t", from) == std::string::npos) data.resize(from);
      }
      emit_data(data, data_start);
      pos_ = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail(name_, ":", line_at(open), ": a comment {# is never closed");
        lstrip_next = close > pos_ && src_[close - 1] == '-';
        pos_ = close + 2;
        if (!lstrip_next) trim_newline();
        continue;
      }
      out_.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, "", 0, 0, line_at(open)});
      lstrip_next = tag(kind == '{' ? "}}" : "%}");
      out_.push_back({kind == '{' ? T::VarEnd : T::BlockEnd, "", 0, 0, line_at(pos_)});
      if (kind == '%' && !lstrip_next) trim_newline();
    }
    out_.push_back({T::End, "", 0, 0, line_at(src_.size())});
    return std::move(out_);
  }

 private:
  // The line of byte p; positions are asked for mostly in increasing order, so counting resumes.
  int line_at(size_t p) {
    p = std::min(p, src_.size());
    if (p < seen_) seen_ = 0, seen_line_ = 1;
    seen_line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(seen_),
                                              src_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    seen_ = p;
    return seen_line_;
  }
  void emit_data(const std::string& d, size_t at) {
    if (!d.empty()) out_.push_back({T::Data, d, 0, 0, line_at(at)});
  }
  void trim_newline() {  // trim_blocks
    if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
  }
  // The tokens of a tag up to its closing `close` (outside strings); returns whether it was "-"close.
  // Inside brackets a closing delimiter is brackets closing ("{'y': {}}"), as in Jinja's lexer.
  bool tag(const char* close) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) ++pos_;
      if (pos_ >= src_.size()) fail(name_, ":", line_at(pos_), ": a tag is never closed (expected '", close, "')");
      if (depth == 0 && src_.compare(pos_, 2, close) == 0) {
        pos_ += 2;
        return false;
      }
      if (depth == 0 && src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
        pos_ += 3;
        return true;
      }
      const int line = line_at(pos_);
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out_.push_back({T::Name, src_.substr(pos_, e - pos_), 0, 0, line});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos_;
        bool real = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          real = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            real = true;
            e = x;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string text = src_.substr(pos_, e - pos_);
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        Tok t{real ? T::Float : T::Int, text, 0, 0, line};
        if (real) t.f = std::strtod(text.c_str(), nullptr);
        else if (std::from_chars(text.data(), text.data() + text.size(), t.i).ec != std::errc())
          fail(name_, ":", line, ": the number ", text, " is too large");
        out_.push_back(t);
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t e = pos_ + 1;
        for (;; ++e) {
          if (e >= src_.size()) fail(name_, ":", line, ": a string is never closed");
          if (src_[e] == c) break;
          if (src_[e] == '\\' && e + 1 < src_.size()) {
            const char x = src_[++e];
            switch (x) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '\n': break;
              default: s += '\\', s += x;
            }
          } else {
            s += src_[e];
          }
        }
        out_.push_back({T::Str, s, 0, 0, line});
        pos_ = e + 1;
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                          ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ".", ",", ":", "|"};
        bool found = false;
        for (const char* op : ops)
          if (src_.compare(pos_, std::strlen(op), op) == 0) {
            out_.push_back({T::Op, op, 0, 0, line});
            pos_ += std::strlen(op);
            if (std::strchr("([{", op[0]) && op[1] == '\0') ++depth;
            if (std::strchr(")]}", op[0]) && op[1] == '\0' && depth > 0) --depth;
            found = true;
            break;
          }
        if (!found) fail(name_, ":", line, ": unexpected character '", std::string(1, c), "' in a tag");
      }
    }
  }

  std::string src_, name_;
  size_t pos_ = 0, seen_ = 0;
  int seen_line_ = 1;
  std::vector<Tok> out_;
};

// ---- syntax tree --------------------------------------------------------------------------------

enum class N {
  // expressions
  Lit, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Bin, Cond, ListLit, DictLit,
  // statements
  Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Generation
};

struct Node {
  N n;
  int line = 0;
  std::string s;                            // names, operators, filter/test names, text
  Value lit;                                // Lit
  std::vector<std::shared_ptr<Node>> kids;  // operands and arguments (nullptr: an omitted slice part)
  std::vector<std::string> kw;              // Call / Filter / Test: keyword names of the last args
  bool neg = false;                         // Test: "is not"
  std::vector<std::string> targets;         // For / Set: names (Set on a namespace: "ns.attr")
  std::vector<std::pair<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>>> branches;  // If
  std::vector<std::shared_ptr<Node>> body, orelse;  // For (else), If (else), SetBlock, Macro, Generation
  std::vector<std::string> params;                  // Macro
};
using NodeP = std::shared_ptr<Node>;
using Body = std::vector<NodeP>;

class Parser {
 public:
  Parser(std::vector<Tok> toks, std::string name) : t_(std::move(toks)), name_(std::move(name)) {}

  Body parse() {
    Body b = body({});
    if (peek().t != T::End) err(peek().line, "unexpected tag");
    return b;
  }

 private:
  [[noreturn]] void err(int line, const std::string& what) const { fail(name_, ":", line, ": ", what); }
  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  Tok next() { return t_[std::min(p_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).t == T::Op && peek(k).s == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).t == T::Name && peek(k).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) err(peek().line, detail::concat("expected '", op, "', found ", describe(peek())));
    ++p_;
  }
  std::string describe(const Tok& t) const {
    switch (t.t) {
      case T::Name: return "'" + t.s + "'";
      case T::Op: return "'" + t.s + "'";
      case T::Str: return "a string";
      case T::Int:
      case T::Float: return "a number";
      case T::VarEnd: return "the end of the {{ }}";
      case T::BlockEnd: return "the end of the tag";
      case T::End: return "the end of the template";
      default: return "text";
    }
  }
  std::string name_tok() {
    if (peek().t != T::Name) err(peek().line, "expected a name, found " + describe(peek()));
    return next().s;
  }
  void end_block() {
    if (peek().t != T::BlockEnd) err(peek().line, "expected the end of the tag, found " + describe(peek()));
    ++p_;
  }
  NodeP node(N n, int line) {
    auto x = std::make_shared<Node>();
    x->n = n;
    x->line = line;
    return x;
  }

  // Statements until a block tag whose keyword is in `ends` (left unconsumed: its BlockBegin and name).
  Body body(const std::vector<std::string>& ends) {
    const Deeper guard(*this);
    Body out;
    while (true) {
      const Tok& t = peek();
      if (t.t == T::End) {
        if (!ends.empty()) err(t.line, "the template ends inside a block (expected '" + ends.back() + "')");
        return out;
      }
      if (t.t == T::Data) {
        auto x = node(N::Text, t.line);
        x->s = t.s;
        out.push_back(x);
        ++p_;
      } else if (t.t == T::VarBegin) {
        ++p_;
        auto x = node(N::Output, t.line);
        x->kids.push_back(expr());
        if (peek().t != T::VarEnd) err(peek().line, "expected '}}', found " + describe(peek()));
        ++p_;
        out.push_back(x);
      } else if (t.t == T::BlockBegin) {
        const Tok& kw = peek(1);
        if (kw.t != T::Name) err(kw.line, "expected a statement after '{%'");
        if (std::find(ends.begin(), ends.end(), kw.s) != ends.end()) return out;
        p_ += 2;
        out.push_back(statement(kw));
      } else {
        err(t.line, "unexpected " + describe(t));
      }
    }
  }

  NodeP statement(const Tok& kw) {
    const int line = kw.line;
    const std::string& k = kw.s;
    if (k == "if") {
      auto x = node(N::If, line);
      NodeP cond = expr();
      end_block();
      while (true) {
        Body b = body({"elif", "else", "endif"});
        x->branches.emplace_back(cond, std::move(b));
        const std::string which = peek(1).s;
        p_ += 2;
        if (which == "elif") {
          cond = expr();
          end_block();
          continue;
        }
        if (which == "else") {
          end_block();
          x->orelse = body({"endif"});
          p_ += 2;
        }
        end_block();
        return x;
      }
    }
    if (k == "for") {
      auto x = node(N::For, line);
      x->targets.push_back(name_tok());
      while (is_op(",")) {
        ++p_;
        x->targets.push_back(name_tok());
      }
      if (!is_name("in")) err(peek().line, "expected 'in' in the for loop, found " + describe(peek()));
      ++p_;
      x->kids.push_back(or_expr(false));  // the iterable (no conditional expression: "if" filters)
      if (is_name("if")) {
        ++p_;
        x->kids.push_back(or_expr(true));
      }
      if (is_name("recursive")) err(peek().line, "recursive loops are not supported");
      end_block();
      x->body = body({"else", "endfor"});
      if (peek(1).s == "else") {
        p_ += 2;
        end_block();
        x->orelse = body({"endfor"});
      }
      p_ += 2;
      end_block();
      return x;
    }
    if (k == "set") {
      std::vector<std::string> targets;
      std::string first = name_tok();
      if (is_op(".")) {
        ++p_;
        first += "." + name_tok();
      }
      targets.push_back(first);
      while (is_op(",")) {
        ++p_;
        targets.push_back(name_tok());
      }
      if (peek().t == T::BlockEnd) {
        if (targets.size() != 1) err(line, "a block set assigns one name");
        ++p_;
        auto x = node(N::SetBlock, line);
        x->targets = targets;
        x->body = body({"endset"});
        p_ += 2;
        end_block();
        return x;
      }
      expect_op("=");
      auto x = node(N::Set, line);
      x->targets = targets;
      x->kids.push_back(tuple_or_expr());
      end_block();
      return x;
    }
    if (k == "macro") {
      auto x = node(N::Macro, line);
      x->s = name_tok();
      expect_op("(");
      while (!is_op(")")) {
        x->params.push_back(name_tok());
        NodeP def;
        if (is_op("=")) {
          ++p_;
          def = expr();
        }
        x->kids.push_back(def);
        if (!is_op(")")) expect_op(",");
      }
      ++p_;
      end_block();
      x->body = body({"endmacro"});
      p_ += 2;
      end_block();
      return x;
    }
    if (k == "break" || k == "continue") {
      end_block();
      return node(k == "break" ? N::Break : N::Continue, line);
    }
    if (k == "generation") {  // transformers' AssistantTracker: the body as it is
      end_block();
      auto x = node(N::Generation, line);
      x->body = body({"endgeneration"});
      p_ += 2;
      end_block();
      return x;
    }
    err(line, "the statement '" + k + "' is not supported in chat templates (qkv knows if, for, set, macro, break, "
                                      "continue, generation)");
  }

  NodeP tuple_or_expr() {
    const int line = peek().line;
    NodeP e = expr();
    if (!is_op(",")) return e;
    auto x = node(N::ListLit, line);
    x->s = "tuple";
    x->kids.push_back(e);
    while (is_op(",")) {
      ++p_;
      x->kids.push_back(expr());
    }
    return x;
  }

  // Nesting (of expressions and of blocks) is bounded so that no template overflows the stack.
  struct Deeper {
    Parser& p;
    explicit Deeper(Parser& q) : p(q) {
      if (++p.depth_ > 200) p.err(p.peek().line, "expressions or blocks nested more than 200 deep");
    }
    ~Deeper() { --p.depth_; }
  };

  NodeP expr() {
    const Deeper guard(*this);
    const int line = peek().line;
    NodeP a = or_expr(true);
    if (is_name("if")) {
      ++p_;
      auto x = node(N::Cond, line);
      x->kids.push_back(or_expr(true));
      x->kids.push_back(a);
      if (is_name("else")) {
        ++p_;
        x->kids.push_back(expr());
      } else {
        x->kids.push_back(nullptr);
      }
      return x;
    }
    return a;
  }
  NodeP or_expr(bool) {
    NodeP a = and_expr();
    while (is_name("or")) {
      const int line = next().line;
      auto x = node(N::Or, line);
      x->kids = {a, and_expr()};
      a = x;
    }
    return a;
  }
  NodeP and_expr() {
    NodeP a = not_expr();
    while (is_name("and")) {
      const int line = next().line;
      auto x = node(N::And, line);
      x->kids = {a, not_expr()};
      a = x;
    }
    return a;
  }
  NodeP not_expr() {
    if (is_name("not")) {
      const int line = next().line;
      auto x = node(N::Not, line);
      x->kids = {not_expr()};
      return x;
    }
    return compare();
  }
  NodeP compare() {
    NodeP a = math1();
    while (true) {
      const int line = peek().line;
      std::string op;
      if (peek().t == T::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                peek().s == "<=" || peek().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else {
        return a;
      }
      auto x = node(N::Bin, line);
      x->s = op;
      x->kids = {a, math1()};
      a = x;
    }
  }
  NodeP binary(NodeP (Parser::*sub)(), std::initializer_list<const char*> ops) {
    NodeP a = (this->*sub)();
    while (true) {
      bool hit = false;
      for (const char* op : ops)
        if (is_op(op)) {
          const int line = next().line;
          auto x = node(N::Bin, line);
          x->s = op;
          x->kids = {a, (this->*sub)()};
          a = x;
          hit = true;
          break;
        }
      if (!hit) return a;
    }
  }
  NodeP math1() { return binary(&Parser::concat, {"+", "-"}); }
  NodeP concat() { return binary(&Parser::math2, {"~"}); }
  NodeP math2() { return binary(&Parser::power, {"*", "/", "//", "%"}); }
  NodeP power() { return binary(&Parser::unary_filtered, {"**"}); }
  NodeP unary_filtered() { return filters(unary()); }
  NodeP unary() {
    const Deeper guard(*this);
    if (is_op("-") || is_op("+")) {
      const Tok t = next();
      auto x = node(t.s == "-" ? N::Neg : N::Pos, t.line);
      x->kids = {unary()};
      return x;
    }
    return postfix(primary());
  }
  // f(args): positional then keyword arguments
  void args(Node& x) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().t == T::Name && is_op("=", 1)) {
        x.kw.push_back(next().s);
        ++p_;
        x.kids.push_back(expr());
      } else {
        if (!x.kw.empty()) err(peek().line, "a positional argument after keyword arguments");
        x.kids.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++p_;
  }
  NodeP postfix(NodeP a) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        auto x = node(N::Attr, line);
        if (peek().t == T::Int) x->s = std::to_string(next().i);
        else x->s = name_tok();
        x->kids = {a};
        a = x;
      } else if (is_op("[")) {
        const int line = next().line;
        NodeP parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++p_;
            if (++colons > 2) err(line, "a slice has at most two ':'");
            continue;
          }
          parts[colons] = expr();
        }
        ++p_;
        if (colons == 0) {
          if (!parts[0]) err(line, "an empty subscript []");
          auto x = node(N::Item, line);
          x->kids = {a, parts[0]};
          a = x;
        } else {
          auto x = node(N::Slice, line);
          x->kids = {a, parts[0], parts[1], parts[2]};
          a = x;
        }
      } else if (is_op("(")) {
        auto x = node(N::Call, peek().line);
        x->kids.push_back(a);
        args(*x);
        a = x;
      } else {
        return a;
      }
    }
  }
  NodeP filters(NodeP a) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto x = node(N::Filter, line);
        x->s = name_tok();
        x->kids.push_back(a);
        if (is_op("(")) args(*x);
        a = x;
      } else if (is_name("is")) {
        const int line = next().line;
        auto x = node(N::Test, line);
        if (is_name("not")) {
          ++p_;
          x->neg = true;
        }
        // a test's name: a name, or none/true/false, or an operator's name
        if (peek().t == T::Name) x->s = next().s;
        else if (peek().t == T::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                       peek().s == "<=" || peek().s == ">="))
          x->s = next().s;
        else err(peek().line, "expected a test's name after 'is', found " + describe(peek()));
        x->kids.push_back(a);
        if (is_op("(")) {
          args(*x);
        } else if (peek().t == T::Str || peek().t == T::Int || peek().t == T::Float ||
                   (peek().t == T::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          x->kids.push_back(postfix(primary()));  // "is divisibleby 3", "is sameas none"
        }
        a = x;
      } else {
        return a;
      }
    }
  }
  NodeP primary() {
    const Tok t = next();
    switch (t.t) {
      case T::Name: {
        auto x = node(N::Lit, t.line);
        if (t.s == "true" || t.s == "True") x->lit = Value::boolean(true);
        else if (t.s == "false" || t.s == "False") x->lit = Value::boolean(false);
        else if (t.s == "none" || t.s == "None") x->lit = Value::none();
        else x->n = N::Name, x->s = t.s;
        return x;
      }
      case T::Str: {
        auto x = node(N::Lit, t.line);
        std::string s = t.s;
        while (peek().t == T::Str) s += next().s;  // adjacent strings join
        x->lit = Value::str(s);
        return x;
      }
      case T::Int: {
        auto x = node(N::Lit, t.line);
        x->lit = Value::integer(t.i);
        return x;
      }
      case T::Float: {
        auto x = node(N::Lit, t.line);
        x->lit = Value::real(t.f);
        return x;
      }
      case T::Op:
        if (t.s == "(") {
          if (is_op(")")) {
            ++p_;
            auto x = node(N::ListLit, t.line);
            x->s = "tuple";
            return x;
          }
          NodeP e = expr();
          if (is_op(",")) {
            auto x = node(N::ListLit, t.line);
            x->s = "tuple";
            x->kids.push_back(e);
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              x->kids.push_back(expr());
            }
            e = x;
          }
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          auto x = node(N::ListLit, t.line);
          while (!is_op("]")) {
            x->kids.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          ++p_;
          return x;
        }
        if (t.s == "{") {
          auto x = node(N::DictLit, t.line);
          while (!is_op("}")) {
            x->kids.push_back(expr());
            expect_op(":");
            x->kids.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          ++p_;
          return x;
        }
        [[fallthrough]];
      default: err(t.line, "expected a value, found " + describe(t));
    }
  }

  std::vector<Tok> t_;
  std::string name_;
  size_t p_ = 0;
  int depth_ = 0;
};

// ---- renderer -----------------------------------------------------------------------------------

struct Refused {
  std::string message;
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const std::string& name) : name_(name) {}

  std::string run(const Body& b, const OJson& context) {
    frames_.emplace_back();
    for (auto it = context.begin(); it != context.end(); ++it) frames_.back()[it.key()] = from_json(*it);
    std::string out;
    exec(b, out);
    return out;
  }

 private:
  using Frame = std::map<std::string, Value>;

  [[noreturn]] void err(const Node& n, const std::string& what) const { fail(name_, ":", n.line, ": ", what); }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return f->second;
    return Value::undefined(name);
  }

  Flow exec(const Body& b, std::string& out) {
    for (const NodeP& s : b) {
      const Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  // Budgets, so that no template (a model folder's bytes are hostile too) runs for ever or fills
  // memory: statements executed, and the size of any text or list made.
  static constexpr int64_t kMaxSteps = 5'000'000;
  static constexpr size_t kMaxText = size_t{16} << 20, kMaxList = size_t{1} << 20;
  void text_fits(size_t n, const Node& at) const {
    if (n > kMaxText) err(at, "the template makes more than 16 MiB of text");
  }

  Flow exec(const Node& s, std::string& out) {
    if (++steps_ > kMaxSteps) err(s, "the template runs more than 5,000,000 statements");
    text_fits(out.size(), s);
    switch (s.n) {
      case N::Text: out += s.s; return Flow::Normal;
      case N::Output: out += to_str(eval(*s.kids[0])); return Flow::Normal;
      case N::If:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return exec(body, out);
        return exec(s.orelse, out);
      case N::For: return exec_for(s, out);
      case N::Set: assign(s, eval(*s.kids[0])); return Flow::Normal;
      case N::SetBlock: {
        std::string text;
        exec(s.body, text);
        assign(s, Value::str(text));
        return Flow::Normal;
      }
      case N::Macro: {
        Value m = Value::make(Value::K::Macro);
        m.macro = std::shared_ptr<const Node>(std::shared_ptr<const Node>{}, &s);
        frames_.back()[s.s] = m;
        return Flow::Normal;
      }
      case N::Break: return Flow::Break;
      case N::Continue: return Flow::Continue;
      case N::Generation: return exec(s.body, out);
      default: err(s, "internal: not a statement");
    }
  }

  void assign(const Node& s, const Value& v) {
    if (s.targets.size() == 1) {
      const std::string& t = s.targets[0];
      if (const size_t dot = t.find('.'); dot != std::string::npos) {
        Value ns = lookup(t.substr(0, dot));
        if (ns.k != Value::K::Ns) err(s, "'" + t.substr(0, dot) + "' is not a namespace(): cannot set its attribute");
        const std::string attr = t.substr(dot + 1);
        for (auto& [k, e] : *ns.dict)
          if (k == attr) {
            e = v;
            return;
          }
        ns.dict->emplace_back(attr, v);
        return;
      }
      frames_.back()[t] = v;
      return;
    }
    const List items = iterate(v, s);
    if (items.size() != s.targets.size())
      err(s, detail::concat("cannot unpack ", items.size(), " values into ", s.targets.size(), " names"));
    for (size_t i = 0; i < items.size(); ++i) frames_.back()[s.targets[i]] = items[i];
  }

  List iterate(const Value& v, const Node& at) const {
    switch (v.k) {
      case Value::K::Undefined: return {};
      case Value::K::Seq: return *v.list;
      case Value::K::Map: {
        List keys;
        for (const auto& [k, e] : *v.dict) keys.push_back(Value::str(k));
        return keys;
      }
      case Value::K::Str: {
        List chars;
        const auto at_ = char_starts(v.s);
        for (size_t i = 0; i + 1 < at_.size(); ++i) chars.push_back(Value::str(v.s.substr(at_[i], at_[i + 1] - at_[i])));
        return chars;
      }
      default: err(at, "cannot iterate over " + type_name(v));
    }
  }

  static std::string type_name(const Value& v) {
    switch (v.k) {
      case Value::K::Undefined: return "an undefined value";
      case Value::K::None: return "none";
      case Value::K::Bool: return "a boolean";
      case Value::K::Int: return "an integer";
      case Value::K::Float: return "a float";
      case Value::K::Str: return "a string";
      case Value::K::Seq: return "a list";
      case Value::K::Map: return "a mapping";
      case Value::K::Ns: return "a namespace";
      case Value::K::Macro: return "a macro";
    }
    return "a value";
  }

  Flow exec_for(const Node& s, std::string& out) {
    List items = iterate(eval(*s.kids[0]), s);
    const auto bind = [&](const Value& item) {
      if (s.targets.size() == 1) {
        frames_.back()[s.targets[0]] = item;
        return;
      }
      const List parts = iterate(item, s);
      if (parts.size() != s.targets.size())
        err(s, detail::concat("cannot unpack ", parts.size(), " values into ", s.targets.size(), " loop names"));
      for (size_t i = 0; i < parts.size(); ++i) frames_.back()[s.targets[i]] = parts[i];
    };
    if (s.kids.size() > 1) {  // for x in xs if cond: filtered before the loop counts
      List kept;
      for (const Value& item : items) {
        if (++steps_ > kMaxSteps) err(s, "the template runs more than 5,000,000 statements");
        frames_.emplace_back();
        bind(item);
        if (truthy(eval(*s.kids[1]))) kept.push_back(item);
        frames_.pop_back();
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++steps_ > kMaxSteps) err(s, "the template runs more than 5,000,000 statements");
      frames_.emplace_back();
      Dict loop = {{"index", Value::integer(i + 1)},
                   {"index0", Value::integer(i)},
                   {"revindex", Value::integer(n - i)},
                   {"revindex0", Value::integer(n - i - 1)},
                   {"first", Value::boolean(i == 0)},
                   {"last", Value::boolean(i == n - 1)},
                   {"length", Value::integer(n)},
                   {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem")},
                   {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem")}};
      frames_.back()["loop"] = Value::of_dict(std::move(loop));
      bind(items[static_cast<size_t>(i)]);
      const Flow f = exec(s.body, out);
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
    if (n == 0) return exec(s.orelse, out);
    return Flow::Normal;
  }

  // ---- expressions ----

  Value eval(const Node& e) {
    switch (e.n) {
      case N::Lit: return e.lit;
      case N::Name: return lookup(e.s);
      case N::Attr: return attr(eval(*e.kids[0]), e.s, e);
      case N::Item: return item(eval(*e.kids[0]), eval(*e.kids[1]), e);
      case N::Slice: return slice(e);
      case N::Call: return call(e);
      case N::Filter: return filter(e);
      case N::Test: return Value::boolean(test(e) != e.neg);
      case N::Neg:
      case N::Pos: {
        const Value v = eval(*e.kids[0]);
        if (v.k == Value::K::Int || v.k == Value::K::Bool)
          return Value::integer(e.n == N::Neg ? -(v.k == Value::K::Int ? v.i : v.b) : (v.k == Value::K::Int ? v.i : v.b));
        if (v.k == Value::K::Float) return Value::real(e.n == N::Neg ? -v.f : v.f);
        err(e, "unary " + std::string(e.n == N::Neg ? "-" : "+") + " on " + type_name(v));
      }
      case N::Not: return Value::boolean(!truthy(eval(*e.kids[0])));
      case N::And: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case N::Or: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case N::Cond:
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("the else of a conditional expression");
      case N::ListLit: {
        List l;
        for (const NodeP& k : e.kids) l.push_back(eval(*k));
        return e.s == "tuple" ? Value::of_tuple(std::move(l)) : Value::of_list(std::move(l));
      }
      case N::DictLit: {
        Dict d;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          const Value k = eval(*e.kids[i]);
          if (k.k != Value::K::Str) err(e, "a dict literal's keys must be strings here, not " + type_name(k));
          set_key(d, k.s, eval(*e.kids[i + 1]));
        }
        return Value::of_dict(std::move(d));
      }
      case N::Bin: return binary(e);
      default: err(e, "internal: not an expression");
    }
  }

  static void set_key(Dict& d, const std::string& k, Value v) {
    for (auto& [k2, e] : d)
      if (k2 == k) {
        e = std::move(v);
        return;
      }
    d.emplace_back(k, std::move(v));
  }

  void need_defined(const Value& v, const Node& at) const {
    if (v.k == Value::K::Undefined) err(at, "'" + v.s + "' is undefined");
  }

  Value attr(const Value& obj, const std::string& name, const Node& at) const {
    need_defined(obj, at);
    if (obj.k == Value::K::Map || obj.k == Value::K::Ns) {
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined(name);
    }
    if (obj.k == Value::K::Seq) {  // Jinja: foo.0 is foo[0]
      int64_t i = 0;
      if (std::from_chars(name.data(), name.data() + name.size(), i).ec == std::errc() && i >= 0 &&
          i < static_cast<int64_t>(obj.list->size()))
        return (*obj.list)[static_cast<size_t>(i)];
    }
    return Value::undefined(name);
  }

  Value item(const Value& obj, const Value& key, const Node& at) const {
    need_defined(obj, at);
    if (obj.k == Value::K::Map || obj.k == Value::K::Ns) {
      if (key.k == Value::K::Str) {
        if (const Value* v = obj.find(key.s)) return *v;
        return Value::undefined(key.s);
      }
      return Value::undefined(to_str(key));
    }
    if ((obj.k == Value::K::Seq || obj.k == Value::K::Str) && (key.k == Value::K::Int || key.k == Value::K::Bool)) {
      const int64_t raw = key.k == Value::K::Int ? key.i : key.b;
      if (obj.k == Value::K::Seq) {
        const auto n = static_cast<int64_t>(obj.list->size());
        const int64_t i = raw < 0 ? raw + n : raw;
        if (i < 0 || i >= n) return Value::undefined(detail::concat("item ", raw));
        return (*obj.list)[static_cast<size_t>(i)];
      }
      const auto cs = char_starts(obj.s);
      const auto n = static_cast<int64_t>(cs.size()) - 1;
      const int64_t i = raw < 0 ? raw + n : raw;
      if (i < 0 || i >= n) return Value::undefined(detail::concat("item ", raw));
      return Value::str(obj.s.substr(cs[static_cast<size_t>(i)], cs[static_cast<size_t>(i + 1)] - cs[static_cast<size_t>(i)]));
    }
    if (key.k == Value::K::Str) return attr(obj, key.s, at);
    return Value::undefined(to_str(key));
  }

  Value slice(const Node& e) {
    const Value obj = eval(*e.kids[0]);
    need_defined(obj, e);
    const auto opt = [&](const NodeP& k) -> std::optional<int64_t> {
      if (!k) return std::nullopt;
      const Value v = eval(*k);
      if (v.k == Value::K::None) return std::nullopt;
      if (v.k != Value::K::Int) err(e, "slice indices must be integers, not " + type_name(v));
      return v.i;
    };
    const auto a = opt(e.kids[1]), b = opt(e.kids[2]), c = opt(e.kids[3]);
    const int64_t step = c.value_or(1);
    if (step == 0) err(e, "a slice step cannot be zero");
    std::vector<size_t> cs;
    int64_t n = 0;
    if (obj.k == Value::K::Seq) n = static_cast<int64_t>(obj.list->size());
    else if (obj.k == Value::K::Str) cs = char_starts(obj.s), n = static_cast<int64_t>(cs.size()) - 1;
    else err(e, "cannot slice " + type_name(obj));
    // Python's slice.indices
    const auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t v = *x < 0 ? *x + n : *x;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(a, step > 0 ? 0 : n - 1), stop = clamp(b, step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (obj.k == Value::K::Seq) {
      List l;
      for (int64_t i : idx) l.push_back((*obj.list)[static_cast<size_t>(i)]);
      return Value::of_list(std::move(l));
    }
    std::string s;
    for (int64_t i : idx) s += obj.s.substr(cs[static_cast<size_t>(i)], cs[static_cast<size_t>(i + 1)] - cs[static_cast<size_t>(i)]);
    return Value::str(s);
  }

  Value binary(const Node& e) {
    const std::string& op = e.s;
    const Value a = eval(*e.kids[0]), b = eval(*e.kids[1]);
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") return Value::boolean(contains(b, a, e) == (op == "in"));
    if (op == "~") {
      std::string t = to_str(a) + to_str(b);
      text_fits(t.size(), e);
      return Value::str(std::move(t));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.is_num() && b.is_num()) c = a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
      else if (a.k == Value::K::Str && b.k == Value::K::Str) c = a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
      else err(e, "cannot compare " + type_name(a) + " and " + type_name(b) + " with " + op);
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    need_defined(a, e);
    need_defined(b, e);
    if (op == "+") {
      if (a.k == Value::K::Str && b.k == Value::K::Str) {
        text_fits(a.s.size() + b.s.size(), e);
        return Value::str(a.s + b.s);
      }
      if (a.k == Value::K::Seq && b.k == Value::K::Seq) {
        if (a.list->size() + b.list->size() > kMaxList) err(e, "the template makes a list of more than 2^20 items");
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::of_list(std::move(l));
      }
    }
    if (op == "*" && ((a.k == Value::K::Str && b.k == Value::K::Int) || (a.k == Value::K::Int && b.k == Value::K::Str))) {
      const std::string& s = a.k == Value::K::Str ? a.s : b.s;
      const int64_t times = a.k == Value::K::Int ? a.i : b.i;
      if (times > 1 << 20 || static_cast<double>(s.size()) * static_cast<double>(std::max<int64_t>(times, 0)) > kMaxText)
        err(e, "a string repeated into more than 16 MiB");
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return Value::str(out);
    }
    if (!a.is_num() || !b.is_num()) err(e, "cannot apply '" + op + "' to " + type_name(a) + " and " + type_name(b));
    const bool ints = a.k != Value::K::Float && b.k != Value::K::Float;
    const int64_t ai = a.k == Value::K::Int ? a.i : a.b, bi = b.k == Value::K::Int ? b.i : b.b;
    const double x = a.num(), y = b.num();
    if (op == "+") return ints ? Value::integer(ai + bi) : Value::real(x + y);
    if (op == "-") return ints ? Value::integer(ai - bi) : Value::real(x - y);
    if (op == "*") return ints ? Value::integer(ai * bi) : Value::real(x * y);
    if (op == "/") {
      if (y == 0) err(e, "division by zero");
      return Value::real(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) err(e, op == "//" ? "integer division by zero" : "modulo by zero");
      if (ints) {
        int64_t q = ai / bi, r = ai % bi;
        if (r != 0 && ((r < 0) != (bi < 0))) --q, r += bi;
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(x / y);
      return Value::real(op == "//" ? q : x - q * y);
    }
    if (op == "**") return ints && bi >= 0 ? Value::integer(static_cast<int64_t>(std::llround(std::pow(x, y)))) : Value::real(std::pow(x, y));
    err(e, "unknown operator " + op);
  }

  bool contains(const Value& hay, const Value& needle, const Node& at) const {
    switch (hay.k) {
      case Value::K::Undefined: return false;
      case Value::K::Str:
        if (needle.k != Value::K::Str) err(at, "'in <string>' needs a string on its left, not " + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case Value::K::Seq:
        return std::any_of(hay.list->begin(), hay.list->end(), [&](const Value& v) { return equal(v, needle); });
      case Value::K::Map:
      case Value::K::Ns: return needle.k == Value::K::Str && hay.find(needle.s) != nullptr;
      default: err(at, "'in' needs a string, list or mapping on its right, not " + type_name(hay));
    }
  }

  // Arguments of a call, filter or test: positional (after `skip` leading kids), then keywords.
  struct Args {
    List pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* get(const std::string& name, size_t index) const {
      for (const auto& [k, v] : kw)
        if (k == name) return &v;
      return index < pos.size() ? &pos[index] : nullptr;
    }
  };
  Args collect(const Node& e, size_t skip) {
    Args a;
    const size_t nkw = e.kw.size(), n = e.kids.size();
    for (size_t i = skip; i < n - nkw; ++i) a.pos.push_back(eval(*e.kids[i]));
    for (size_t i = 0; i < nkw; ++i) a.kw.emplace_back(e.kw[i], eval(*e.kids[n - nkw + i]));
    return a;
  }
  void max_args(const Args& a, size_t n, const std::string& what, const Node& at) const {
    if (a.pos.size() > n) err(at, detail::concat(what, " takes at most ", n, " positional arguments, got ", a.pos.size()));
  }
  std::string str_arg(const Args& a, const std::string& name, size_t i, const std::string& what, const Node& at,
                      const std::string& dflt = "") const {
    const Value* v = a.get(name, i);
    if (!v || v->k == Value::K::None) return dflt;
    if (v->k != Value::K::Str) err(at, what + ": '" + name + "' must be a string, not " + type_name(*v));
    return v->s;
  }

  Value call(const Node& e) {
    const Node& callee = *e.kids[0];
    if (callee.n == N::Attr) {
      const Value obj = eval(*callee.kids[0]);
      need_defined(obj, callee);
      if (obj.k == Value::K::Str) return str_method(obj.s, callee.s, collect(e, 1), e);
      if (obj.k == Value::K::Map) {
        const Args a = collect(e, 1);
        if (callee.s == "items" || callee.s == "keys" || callee.s == "values") {
          max_args(a, 0, callee.s + "()", e);
          List l;
          for (const auto& [k, v] : *obj.dict)
            l.push_back(callee.s == "keys" ? Value::str(k) : callee.s == "values" ? v : Value::of_tuple({Value::str(k), v}));
          return Value::of_list(std::move(l));
        }
        if (callee.s == "get") {
          max_args(a, 2, "get()", e);
          if (a.pos.empty() || a.pos[0].k != Value::K::Str) err(e, "get() needs a string key");
          if (const Value* v = obj.find(a.pos[0].s)) return *v;
          return a.pos.size() > 1 ? a.pos[1] : Value::none();
        }
      }
      const Value f = attr(obj, callee.s, callee);
      if (f.k == Value::K::Macro) return call_macro(*f.macro, collect(e, 1), e);
      err(e, "'" + callee.s + "' of " + type_name(obj) + " is not a method qkv's chat templates know");
    }
    if (callee.n == N::Name) {
      const Value f = lookup(callee.s);
      if (f.k == Value::K::Macro) return call_macro(*f.macro, collect(e, 1), e);
      if (f.k == Value::K::Undefined) return global(callee.s, collect(e, 1), e);
    }
    err(e, "this value cannot be called");
  }

  Value call_macro(const Node& m, const Args& a, const Node& at) {
    if (a.pos.size() > m.params.size())
      err(at, detail::concat("macro '", m.s, "' takes ", m.params.size(), " arguments, got ", a.pos.size()));
    Frame f;
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (const Value* v = a.get(m.params[i], i)) f[m.params[i]] = *v;
      else f[m.params[i]] = m.kids[i] ? eval(*m.kids[i]) : Value::undefined(m.params[i]);
    }
    for (const auto& [k, v] : a.kw)
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end())
        err(at, "macro '" + m.s + "' has no argument '" + k + "'");
    if (++depth_ > 64) err(at, "macros nested more than 64 deep");
    // a macro sees the template's top-level names and its arguments
    std::vector<Frame> saved(frames_.begin() + 1, frames_.end());
    frames_.resize(1);
    frames_.push_back(std::move(f));
    std::string out;
    exec(m.body, out);
    frames_.resize(1);
    frames_.insert(frames_.end(), saved.begin(), saved.end());
    --depth_;
    return Value::str(out);
  }

  Value global(const std::string& name, const Args& a, const Node& e) {
    if (name == "raise_exception") {
      const Value* m = a.get("message", 0);
      throw Refused{m ? to_str(*m) : ""};
    }
    if (name == "range") {
      if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) err(e, "range() takes 1 to 3 integers");
      for (const Value& v : a.pos)
        if (v.k != Value::K::Int) err(e, "range() takes integers, not " + type_name(v));
      int64_t start = 0, stop = a.pos[0].i, step = 1;
      if (a.pos.size() > 1) start = a.pos[0].i, stop = a.pos[1].i;
      if (a.pos.size() > 2) step = a.pos[2].i;
      if (step == 0) err(e, "range() step cannot be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (l.size() >= (1u << 20)) err(e, "range() of more than 2^20 values");
        l.push_back(Value::integer(i));
      }
      return Value::of_list(std::move(l));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || a.pos[0].k != Value::K::Map) err(e, name + "() takes one mapping and keywords");
        d = *a.pos[0].dict;
      }
      for (const auto& [k, v] : a.kw) set_key(d, k, v);
      return Value::of_dict(std::move(d), name == "namespace" ? Value::K::Ns : Value::K::Map);
    }
    if (name == "strftime_now") {
      const std::string fmt = str_arg(a, "format", 0, "strftime_now()", e);
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::str(std::string(buf, n));
    }
    err(e, "'" + name + "' is undefined (not a function qkv's chat templates know)");
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    const auto in = [&](char c) { return chars.empty() ? std::isspace(static_cast<unsigned char>(c)) != 0 : chars.find(c) != std::string::npos; };
    if (left) while (b < e && in(s[b])) ++b;
    if (right) while (e > b && in(s[e - 1])) --e;
    return s.substr(b, e - b);
  }
  static std::string ascii_case(std::string s, bool upper) {
    for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string capitalize(const std::string& s) {
    if (s.empty()) return s;
    return ascii_case(s.substr(0, 1), true) + ascii_case(s.substr(1), false);
  }
  static std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    if (from.empty()) {
      std::string out;
      int64_t done = 0;
      const auto cs = char_starts(s);
      for (size_t i = 0; i + 1 < cs.size(); ++i) {
        if (count < 0 || done < count) out += to, ++done;
        out += s.substr(cs[i], cs[i + 1] - cs[i]);
      }
      if (count < 0 || done < count) out += to;
      return out;
    }
    std::string out;
    size_t at = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      const size_t f = s.find(from, at);
      if (f == std::string::npos) break;
      out += s.substr(at, f - at) + to;
      at = f + from.size();
      ++done;
    }
    return out + s.substr(at);
  }

  Value str_method(const std::string& s, const std::string& m, const Args& a, const Node& e) {
    const std::string what = m + "()";
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      max_args(a, 1, what, e);
      return Value::str(strip_chars(s, str_arg(a, "chars", 0, what, e), m != "rstrip", m != "lstrip"));
    }
    if (m == "upper" || m == "lower") return Value::str(ascii_case(s, m == "upper"));
    if (m == "capitalize") return Value::str(capitalize(s));
    if (m == "title") {
      std::string out = s;
      bool prev_alpha = false;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
        if (alpha) c = static_cast<char>(prev_alpha ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)));
        prev_alpha = alpha;
      }
      return Value::str(out);
    }
    if (m == "startswith" || m == "endswith") {
      const Value* p = a.get("prefix", 0);
      if (!p) err(e, what + " needs an argument");
      List options = p->k == Value::K::Seq ? *p->list : List{*p};
      for (const Value& o : options) {
        if (o.k != Value::K::Str) err(e, what + " takes a string or a tuple of strings");
        if (m == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                              : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "split" || m == "rsplit") {
      const std::string sep = str_arg(a, "sep", 0, what, e);
      const Value* mx = a.get("maxsplit", 1);
      const int64_t maxsplit = mx && mx->k == Value::K::Int ? mx->i : -1;
      List parts;
      if (m == "rsplit" && maxsplit >= 0) err(e, "rsplit() with maxsplit is not supported");
      if (sep.empty()) {
        size_t i = 0;
        int64_t done = 0;
        while (true) {
          while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
          if (i >= s.size()) break;
          if (maxsplit >= 0 && done >= maxsplit) {
            parts.push_back(Value::str(strip_chars(s.substr(i), "", false, true)));
            break;
          }
          size_t j = i;
          while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
          parts.push_back(Value::str(s.substr(i, j - i)));
          ++done;
          i = j;
        }
      } else {
        size_t at = 0;
        int64_t done = 0;
        while (maxsplit < 0 || done < maxsplit) {
          const size_t f = s.find(sep, at);
          if (f == std::string::npos) break;
          parts.push_back(Value::str(s.substr(at, f - at)));
          at = f + sep.size();
          ++done;
        }
        parts.push_back(Value::str(s.substr(at)));
      }
      return Value::of_list(std::move(parts));
    }
    if (m == "replace") {
      const Value* c = a.get("count", 2);
      return Value::str(replace_all(s, str_arg(a, "old", 0, what, e), str_arg(a, "new", 1, what, e),
                                    c && c->k == Value::K::Int ? c->i : -1));
    }
    if (m == "find" || m == "count") {
      const std::string sub = str_arg(a, "sub", 0, what, e);
      if (m == "find") {
        const size_t f = s.find(sub);
        if (f == std::string::npos) return Value::integer(-1);
        return Value::integer(static_cast<int64_t>(char_starts(s.substr(0, f)).size()) - 1);
      }
      if (sub.empty()) return Value::integer(static_cast<int64_t>(char_starts(s).size()));
      int64_t n = 0;
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value::integer(n);
    }
    if (m == "join") {
      const Value* l = a.get("iterable", 0);
      if (!l) err(e, "join() needs a list");
      std::string out;
      size_t i = 0;
      for (const Value& v : iterate(*l, e)) {
        if (v.k != Value::K::Str) err(e, "join() joins strings, not " + type_name(v));
        out += (i++ ? s : "") + v.s;
      }
      return Value::str(out);
    }
    if (m == "isdigit" || m == "isalpha" || m == "isspace" || m == "islower" || m == "isupper") {
      if (s.empty()) return Value::boolean(false);
      bool ok = true, cased = false;
      for (unsigned char c : s) {
        if (m == "isdigit") ok = ok && std::isdigit(c);
        else if (m == "isalpha") ok = ok && std::isalpha(c);
        else if (m == "isspace") ok = ok && std::isspace(c);
        else if (m == "islower") ok = ok && !std::isupper(c), cased = cased || std::islower(c);
        else ok = ok && !std::islower(c), cased = cased || std::isupper(c);
      }
      return Value::boolean(ok && (m.rfind("is", 0) == 0 && (m == "islower" || m == "isupper") ? cased : true));
    }
    err(e, "the string method '" + m + "' is not one qkv's chat templates know");
  }

  // ---- filters ----

  static int64_t length_of(const Value& v) {
    switch (v.k) {
      case Value::K::Str: return static_cast<int64_t>(char_starts(v.s).size()) - 1;
      case Value::K::Seq: return static_cast<int64_t>(v.list->size());
      case Value::K::Map:
      case Value::K::Ns: return static_cast<int64_t>(v.dict->size());
      default: return -1;
    }
  }

  // Python's sort key for sort / dictsort / unique: case-folded strings unless case_sensitive
  static Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.k == Value::K::Str) return Value::str(ascii_case(v.s, false));
    return v;
  }
  bool less(const Value& a, const Value& b, const Node& at) const {
    if (a.is_num() && b.is_num()) return a.num() < b.num();
    if (a.k == Value::K::Str && b.k == Value::K::Str) return a.s < b.s;
    err(at, "cannot order " + type_name(a) + " and " + type_name(b));
  }

  Value attr_path(const Value& v, const std::string& path, const Node& at) const {
    Value cur = v;
    size_t from = 0;
    while (true) {
      const size_t dot = path.find('.', from);
      const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
      if (cur.k == Value::K::Undefined) return cur;
      cur = item(cur, Value::str(part), at);
      if (dot == std::string::npos) return cur;
      from = dot + 1;
    }
  }

  Value filter(const Node& e) {
    const std::string& f = e.s;
    const Value v = eval(*e.kids[0]);
    const Args a = collect(e, 1);
    const std::string what = "the filter '" + f + "'";
    if (f == "default" || f == "d") {
      const Value* b = a.get("boolean", 1);
      const bool use = v.k == Value::K::Undefined || (b && truthy(*b) && !truthy(v));
      if (!use) return v;
      const Value* d = a.get("default_value", 0);
      return d ? *d : Value::str("");
    }
    if (f == "length" || f == "count") {
      const int64_t n = length_of(v);
      if (v.k == Value::K::Undefined) return Value::integer(0);
      if (n < 0) err(e, what + " on " + type_name(v));
      return Value::integer(n);
    }
    if (f == "safe" || f == "string") return v.k == Value::K::Str ? v : Value::str(to_str(v));
    if (f == "tojson") {
      const Value* ind = a.get("indent", 0);
      const Value* sk = a.get("sort_keys", 3);
      std::string out;
      json_dump(v, ind && ind->k == Value::K::Int ? static_cast<int>(ind->i) : -1, sk && truthy(*sk), 0, out,
                detail::concat(name_, ":", e.line, ": "));
      return Value::str(out);
    }
    if (f == "items") {
      if (v.k == Value::K::Undefined) return Value::of_list({});
      if (v.k != Value::K::Map) err(e, what + " on " + type_name(v));
      List l;
      for (const auto& [k, x] : *v.dict) l.push_back(Value::of_tuple({Value::str(k), x}));
      return Value::of_list(std::move(l));
    }
    if (f == "list") return Value::of_list(iterate(v, e));
    if (f == "first" || f == "last") {
      const List l = iterate(v, e);
      if (l.empty()) return Value::undefined("the " + f + " item of an empty sequence");
      return f == "first" ? l.front() : l.back();
    }
    if (f == "reverse") {
      if (v.k == Value::K::Str) {
        const auto cs = char_starts(v.s);
        std::string out;
        for (size_t i = cs.size() - 1; i > 0; --i) out += v.s.substr(cs[i - 1], cs[i] - cs[i - 1]);
        return Value::str(out);
      }
      List l = iterate(v, e);
      std::reverse(l.begin(), l.end());
      return Value::of_list(std::move(l));
    }
    if (f == "join") {
      const std::string sep = str_arg(a, "d", 0, what, e);
      const Value* at = a.get("attribute", 1);
      std::string out;
      size_t i = 0;
      for (const Value& x : iterate(v, e)) out += (i++ ? sep : "") + to_str(at ? attr_path(x, to_str(*at), e) : x);
      return Value::str(out);
    }
    if (v.k == Value::K::Undefined && (f == "trim" || f == "upper" || f == "lower" || f == "capitalize" || f == "title"))
      return Value::str("");
    if (f == "trim") return Value::str(strip_chars(to_str(v), str_arg(a, "chars", 0, what, e), true, true));
    if (f == "upper" || f == "lower") return Value::str(ascii_case(to_str(v), f == "upper"));
    if (f == "capitalize") return Value::str(capitalize(to_str(v)));
    if (f == "title") {
      // Jinja's: words split at runs of [-\s({[<], each word's first letter upper and the rest lower
      const std::string s = to_str(v);
      std::string out;
      bool start = true;
      for (char c : s) {
        const bool sep = std::isspace(static_cast<unsigned char>(c)) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) out += c, start = true;
        else out += static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c))), start = false;
      }
      return Value::str(out);
    }
    if (f == "replace") {
      const Value* c = a.get("count", 2);
      return Value::str(replace_all(to_str(v), str_arg(a, "old", 0, what, e), str_arg(a, "new", 1, what, e),
                                    c && c->k == Value::K::Int ? c->i : -1));
    }
    if (f == "int") {
      const Value* d = a.get("default", 0);
      const Value dflt = d ? *d : Value::integer(0);
      if (v.k == Value::K::Int) return v;
      if (v.k == Value::K::Bool) return Value::integer(v.b);
      if (v.k == Value::K::Float) return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
      if (v.k == Value::K::Str) {
        const std::string t = strip_chars(v.s, "", true, true);
        int64_t i = 0;
        const auto r = std::from_chars(t.data(), t.data() + t.size(), i);
        if (!t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size()) return Value::integer(i);
        char* end = nullptr;
        const double x = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(x)) return Value::integer(static_cast<int64_t>(x));
      }
      return dflt;
    }
    if (f == "float") {
      const Value* d = a.get("default", 0);
      if (v.is_num()) return Value::real(v.num());
      if (v.k == Value::K::Str) {
        const std::string t = strip_chars(v.s, "", true, true);
        char* end = nullptr;
        const double x = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Value::real(x);
      }
      return d ? *d : Value::real(0);
    }
    if (f == "abs") {
      if (v.k == Value::K::Int) return Value::integer(std::llabs(v.i));
      if (v.k == Value::K::Float) return Value::real(std::fabs(v.f));
      err(e, what + " on " + type_name(v));
    }
    if (f == "round") {
      const Value* p = a.get("precision", 0);
      const std::string method = str_arg(a, "method", 1, what, e, "common");
      const int digits = p && p->k == Value::K::Int ? static_cast<int>(std::clamp<int64_t>(p->i, 0, 300)) : 0;
      if (!v.is_num()) err(e, what + " on " + type_name(v));
      if (method == "common") {
        // Python's round(): the decimal nearest the exact binary value, ties to even, as printf rounds
        char buf[400];
        std::snprintf(buf, sizeof buf, "%.*f", digits, v.num());
        return Value::real(std::strtod(buf, nullptr));
      }
      const double scale = std::pow(10.0, digits), x = v.num() * scale;
      return Value::real((method == "floor" ? std::floor(x) : std::ceil(x)) / scale);
    }
    if (f == "escape" || f == "e") {
      std::string out;
      for (char c : to_str(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value::str(out);
    }
    if (f == "indent") {
      const Value* w = a.get("width", 0);
      const Value* first = a.get("first", 1);
      const Value* blank = a.get("blank", 2);
      const std::string pad = w && w->k == Value::K::Str ? w->s : std::string(static_cast<size_t>(w && w->k == Value::K::Int ? w->i : 4), ' ');
      const std::string s = to_str(v);
      std::string out;
      size_t at = 0;
      bool firstline = true;
      while (true) {
        const size_t nl = s.find('\n', at);
        const std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        const bool indent = (firstline ? first && truthy(*first) : true) &&
                            (!line.empty() || (blank && truthy(*blank)));
        out += (indent ? pad : "") + line;
        if (nl == std::string::npos) break;
        out += '\n';
        at = nl + 1;
        firstline = false;
      }
      return Value::str(out);
    }
    if (f == "wordcount") {
      int64_t n = 0;
      bool in = false;
      for (unsigned char c : to_str(v)) {
        const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
        if (w && !in) ++n;
        in = w;
      }
      return Value::integer(n);
    }
    if (f == "sort" || f == "unique" || f == "min" || f == "max") {
      const Value* rev = a.get("reverse", f == "sort" ? 0 : 99);
      const Value* cs = a.get("case_sensitive", f == "sort" ? 1 : 0);
      const Value* at = a.get("attribute", f == "sort" ? 2 : 1);
      const bool sensitive = cs && truthy(*cs);
      List l = iterate(v, e);
      const auto key = [&](const Value& x) { return sort_key(at ? attr_path(x, to_str(*at), e) : x, sensitive); };
      if (f == "unique") {
        List out, seen;
        for (const Value& x : l) {
          const Value k = key(x);
          if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); }))
            seen.push_back(k), out.push_back(x);
        }
        return Value::of_list(std::move(out));
      }
      if (f == "min" || f == "max") {
        if (l.empty()) return Value::undefined("the " + f + " of an empty sequence");
        size_t best = 0;
        for (size_t i = 1; i < l.size(); ++i)
          if (f == "min" ? less(key(l[i]), key(l[best]), e) : less(key(l[best]), key(l[i]), e)) best = i;
        return l[best];
      }
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) { return less(key(x), key(y), e); });
      if (rev && truthy(*rev)) {
        // Python's sorted(reverse=True) keeps equal items in their order
        std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) { return less(key(y), key(x), e); });
      }
      return Value::of_list(std::move(l));
    }
    if (f == "dictsort") {
      if (v.k != Value::K::Map) err(e, what + " on " + type_name(v));
      const Value* cs = a.get("case_sensitive", 0);
      const std::string by = str_arg(a, "by", 1, what, e, "key");
      const Value* rev = a.get("reverse", 2);
      List l;
      for (const auto& [k, x] : *v.dict) l.push_back(Value::of_tuple({Value::str(k), x}));
      const size_t idx = by == "value" ? 1 : 0;
      const bool sensitive = cs && truthy(*cs);
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        const Value kx = sort_key((*x.list)[idx], sensitive), ky = sort_key((*y.list)[idx], sensitive);
        return rev && truthy(*rev) ? less(ky, kx, e) : less(kx, ky, e);
      });
      return Value::of_list(std::move(l));
    }
    if (f == "sum") {
      const Value* at = a.get("attribute", 0);
      const Value* start = a.get("start", 1);
      Value total = start ? *start : Value::integer(0);
      for (const Value& x : iterate(v, e)) {
        const Value y = at ? attr_path(x, to_str(*at), e) : x;
        if (!y.is_num() || !total.is_num()) err(e, what + " adds numbers, not " + type_name(y));
        total = total.k == Value::K::Float || y.k == Value::K::Float ? Value::real(total.num() + y.num())
                                                                     : Value::integer(static_cast<int64_t>(total.num()) + static_cast<int64_t>(y.num()));
      }
      return total;
    }
    if (f == "map") {
      List out;
      const Value* at = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "attribute") at = &x;
      for (const Value& x : iterate(v, e)) {
        if (at) {
          Value y = attr_path(x, to_str(*at), e);
          if (y.k == Value::K::Undefined)
            for (const auto& [k, d] : a.kw)
              if (k == "default") y = d;
          out.push_back(y);
          continue;
        }
        if (a.pos.empty() || a.pos[0].k != Value::K::Str) err(e, "map() needs a filter name or attribute=");
        out.push_back(apply_filter_by_name(a.pos[0].s, x, List(a.pos.begin() + 1, a.pos.end()), e));
      }
      return Value::of_list(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr", keep = f == "select" || f == "selectattr";
      size_t k = 0;
      std::string path;
      if (by_attr) {
        if (a.pos.empty() || a.pos[0].k != Value::K::Str) err(e, what + " needs an attribute name");
        path = a.pos[0].s;
        k = 1;
      }
      std::string test_name;
      List targs;
      if (a.pos.size() > k) {
        if (a.pos[k].k != Value::K::Str) err(e, what + " needs a test's name");
        test_name = a.pos[k].s;
        targs.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k) + 1, a.pos.end());
      }
      List out;
      for (const Value& x : iterate(v, e)) {
        const Value y = by_attr ? attr_path(x, path, e) : x;
        const bool t = test_name.empty() ? truthy(y) : run_test(test_name, y, targs, e);
        if (t == keep) out.push_back(x);
      }
      return Value::of_list(std::move(out));
    }
    if (f == "format") {
      // "%s"-style formatting with %s and %d only
      const std::string fmt = to_str(v);
      std::string out;
      size_t argi = 0;
      for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] == '%' && i + 1 < fmt.size()) {
          const char c = fmt[++i];
          if (c == '%') out += '%';
          else if ((c == 's' || c == 'd') && argi < a.pos.size()) out += to_str(a.pos[argi++]);
          else err(e, "format: only %s and %d with enough arguments are supported");
        } else {
          out += fmt[i];
        }
      }
      return Value::str(out);
    }
    err(e, "the filter '" + f + "' is not one qkv's chat templates know");
  }

  Value apply_filter_by_name(const std::string& f, const Value& x, const List& args, const Node& at) {
    // map('upper') and friends: the common filters of one value
    if (f == "upper" || f == "lower") return Value::str(ascii_case(to_str(x), f == "upper"));
    if (f == "trim") return Value::str(strip_chars(to_str(x), "", true, true));
    if (f == "string") return Value::str(to_str(x));
    if (f == "length" || f == "count") return Value::integer(length_of(x));
    if (f == "capitalize") return Value::str(capitalize(to_str(x)));
    if (f == "tojson") {
      std::string out;
      json_dump(x, -1, false, 0, out, detail::concat(name_, ":", at.line, ": "));
      return Value::str(out);
    }
    if (f == "int" && x.is_num()) return Value::integer(static_cast<int64_t>(x.num()));
    (void)args;
    err(at, "map() with the filter '" + f + "' is not supported");
  }

  // ---- tests ----

  bool test(const Node& e) {
    const std::string& t = e.s;
    if (t == "defined" || t == "undefined") {
      const Value v = eval(*e.kids[0]);
      return (v.k == Value::K::Undefined) == (t == "undefined");
    }
    const Value v = eval(*e.kids[0]);
    const Args a = collect(e, 1);
    return run_test(t, v, a.pos, e);
  }

  bool run_test(const std::string& t, const Value& v, const List& args, const Node& e) const {
    const auto arg = [&](size_t i) -> const Value& {
      if (i >= args.size()) err(e, "the test '" + t + "' needs an argument");
      return args[i];
    };
    if (t == "defined") return v.k != Value::K::Undefined;
    if (t == "undefined") return v.k == Value::K::Undefined;
    if (t == "none") return v.k == Value::K::None;
    if (t == "boolean") return v.k == Value::K::Bool;
    if (t == "true") return v.k == Value::K::Bool && v.b;
    if (t == "false") return v.k == Value::K::Bool && !v.b;
    if (t == "integer") return v.k == Value::K::Int;
    if (t == "float") return v.k == Value::K::Float;
    if (t == "number") return v.is_num();
    if (t == "string") return v.k == Value::K::Str;
    if (t == "mapping") return v.k == Value::K::Map;
    if (t == "iterable") return v.k == Value::K::Str || v.k == Value::K::Seq || v.k == Value::K::Map || v.k == Value::K::Undefined;
    if (t == "sequence") return v.k == Value::K::Str || v.k == Value::K::Seq || v.k == Value::K::Map;
    if (t == "callable") return v.k == Value::K::Macro;
    if (t == "even" || t == "odd") {
      if (v.k != Value::K::Int) err(e, "the test '" + t + "' on " + type_name(v));
      return (v.i % 2 == 0) == (t == "even");
    }
    if (t == "divisibleby") {
      const Value& d = arg(0);
      if (v.k != Value::K::Int || d.k != Value::K::Int || d.i == 0) err(e, "divisibleby needs integers");
      return v.i % d.i == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==") return equal(v, arg(0));
    if (t == "ne" || t == "!=") return !equal(v, arg(0));
    if (t == "lt" || t == "<" || t == "lessthan") return less(v, arg(0), e);
    if (t == "gt" || t == ">" || t == "greaterthan") return less(arg(0), v, e);
    if (t == "le" || t == "<=") return !less(arg(0), v, e);
    if (t == "ge" || t == ">=") return !less(v, arg(0), e);
    if (t == "in") return contains(arg(0), v, e);
    if (t == "sameas") return v.k == arg(0).k && equal(v, arg(0));
    if (t == "lower" || t == "upper") {
      const std::string s = to_str(v);
      return s == ascii_case(s, t == "upper");
    }
    err(e, "the test '" + t + "' is not one qkv's chat templates know");
  }

  std::string name_;
  std::vector<Frame> frames_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

struct ChatTemplate::Impl {
  std::string name;
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->body = Parser(Lexer(source, impl_->name).run(), impl_->name).parse();
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(std::string_view context_json) const {
  OJson context;
  try {
    context = OJson::parse(context_json);
  } catch (const OJson::exception& e) {
    fail(impl_->name, ": the context is not valid JSON (", e.what(), ")");
  }
  check(context.is_object(), impl_->name, ": the context must be an object of variables");
  try {
    return Renderer(impl_->name).run(impl_->body, context);
  } catch (const Refused& r) {
    fail(impl_->name, ": the chat template refused: ", r.message);
  }
}

bool find_chat_template(const std::string& dir, ChatTemplateSource* out) {
  namespace fs = std::filesystem;
  *out = {};
  if (is_gguf_file(dir)) {
    // a GGUF file: tokenizer.chat_template, and the special tokens' texts by their ids
    const GgufFile g(dir);
    const GgufValue* t = g.find("tokenizer.chat_template");
    if (!t) return false;
    check(t->kind == GgufValue::String, dir, ": tokenizer.chat_template must be a string");
    out->source = t->s;
    out->name = dir + " (tokenizer.chat_template)";
    const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
    for (const auto& [key, id_key] : {std::pair<const char*, const char*>{"bos_token", "tokenizer.ggml.bos_token_id"},
                                      {"eos_token", "tokenizer.ggml.eos_token_id"},
                                      {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                      {"pad_token", "tokenizer.ggml.padding_token_id"}}) {
      const int64_t id = g.integer_or(id_key, -1, -1, INT32_MAX);
      if (id >= 0 && tokens && tokens->kind == GgufValue::Array && static_cast<size_t>(id) < tokens->strings.size())
        out->special_tokens.emplace_back(key, tokens->strings[static_cast<size_t>(id)]);
    }
    return true;
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  nlohmann::json c = nlohmann::json::object();
  if (fs::is_regular_file(config)) {
    try {
      c = nlohmann::json::parse(read_file(config.string(), "tokenizer_config.json"));
    } catch (const nlohmann::json::exception& e) {
      fail(config.string(), ": not valid JSON (", e.what(), ")");
    }
    check(c.is_object(), config.string(), ": expected a JSON object");
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      if (!c.contains(k) || c[k].is_null()) continue;
      const nlohmann::json& t = c[k];
      if (t.is_string()) out->special_tokens.emplace_back(k, t.get<std::string>());
      else if (t.is_object() && t.contains("content") && t["content"].is_string())
        out->special_tokens.emplace_back(k, t["content"].get<std::string>());
      else fail(config.string(), ": ", k, " must be a string or an object with a string \"content\"");
    }
  }
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::is_regular_file(jinja)) {
    out->source = read_file(jinja.string(), "chat template");
    out->name = jinja.string();
    return true;
  }
  if (!c.contains("chat_template") || c["chat_template"].is_null()) return false;
  const nlohmann::json& t = c["chat_template"];
  out->name = config.string() + " (chat_template)";
  if (t.is_string()) {
    out->source = t.get<std::string>();
    return true;
  }
  if (t.is_array()) {
    for (const nlohmann::json& e : t)
      if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
          e["template"].is_string()) {
        out->source = e["template"].get<std::string>();
        return true;
      }
    fail(config.string(), ": chat_template is a list without a {\"name\": \"default\", \"template\": ...} entry");
  }
  fail(config.string(), ": chat_template must be a string or a list of named templates, not ", t.type_name());
}

}  // namespace qkv
