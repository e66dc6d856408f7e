// Structured output (qkv/json_constraint.h): a schema compiled into nodes, a pushdown automaton
// over bytes whose state is a small stack of frames (copied cheaply: only the frames in use), and
// a walk of the vocabulary's trie that tests every token from one state.
#include "qkv/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "qkv/error.h"

namespace qkv {

namespace {

using Json = nlohmann::json;

enum : uint8_t { kObj = 1, kArr = 2, kStr = 4, kNum = 8, kInt = 16, kBool = 32, kNull = 64, kAll = 127 };
constexpr int kMaxFrames = 26;  // the root, then at most 12 nested containers with their values
constexpr int kMaxWs = 2;       // whitespace characters in a row
constexpr int kMaxDigits = 15;
constexpr int kMaxExpDigits = 2;  // exponents up to 99: no number overflows a double

struct SNode {
  uint8_t types = kAll;
  std::vector<std::string> literals;  // enum / const: the compact JSON of each allowed value
  bool any_keys = true;               // object: any keys (no properties given)
  std::vector<std::string> props;
  std::vector<int32_t> prop_node;
  uint64_t required = 0;
  int32_t items = 0;  // array: the items' node (0: any value)
  int64_t min_items = 0, max_items = std::numeric_limits<int64_t>::max();
  int64_t min_len = 0, max_len = std::numeric_limits<int64_t>::max();
};

}  // namespace

class JsonMachine {
 public:
  std::vector<SNode> nodes;  // nodes[0]: any JSON value
  int32_t root = 0;
  std::vector<std::string> booleans = {"true", "false"}, nulls = {"null"};
};

namespace {

enum Mode : uint8_t { Root, Value, Literal, String, Number, Object, Array };
// Object phases
enum : uint8_t { O_START, O_KEY, O_COLON, O_VALUE, O_AFTER, O_COMMA };
// Array phases
enum : uint8_t { A_START, A_VALUE, A_AFTER, A_COMMA };
// Number phases
enum : uint8_t { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
// Literal sources
enum : uint8_t { L_NODE, L_BOOL, L_NULL };

struct Frame {
  int32_t node = 0;
  Mode mode = Root;
  uint8_t phase = 0;
  uint8_t ws = 0;     // whitespace in a row here
  uint8_t esc = 0;    // string: 1 after a backslash, 2..5: hex digits of \u left + 1
  uint8_t utf8 = 0;   // string: continuation bytes expected
  uint8_t u8lo = 0x80, u8hi = 0xBF;  // the next continuation byte's range (UTF-8's well-formed table)
  uint8_t lit = 0;    // literal: where its candidates are
  uint64_t cand = 0;  // literal candidates; object: keys still matching
  uint64_t seen = 0;  // object: properties written
  int32_t count = 0;  // literal / key: bytes matched; string: characters; array: items; number: digits of the part
  int32_t prop = -1;  // object: the property whose value comes
};

struct State {
  int depth = 0;
  Frame f[kMaxFrames];
  State() = default;
  State(const State& o) : depth(o.depth) { std::memcpy(f, o.f, sizeof(Frame) * static_cast<size_t>(depth)); }
  State& operator=(const State& o) {
    depth = o.depth;
    std::memcpy(f, o.f, sizeof(Frame) * static_cast<size_t>(depth));
    return *this;
  }
  Frame& top() { return f[depth - 1]; }
  const Frame& top() const { return f[depth - 1]; }
};

bool is_ws(unsigned char c) { return c == ' ' || c == '\n'; }

// A UTF-8 lead byte: the continuation bytes it needs and the first one's range (Unicode's table of
// well-formed sequences: no overlong forms, no surrogates, nothing past U+10FFFF); false if c
// leads nothing.
bool utf8_lead(unsigned char c, uint8_t* need, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80, *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) return *need = 1, true;
  if (c == 0xE0) return *need = 2, *lo = 0xA0, true;
  if (c == 0xED) return *need = 2, *hi = 0x9F, true;
  if (c >= 0xE1 && c <= 0xEF) return *need = 2, true;
  if (c == 0xF0) return *need = 3, *lo = 0x90, true;
  if (c >= 0xF1 && c <= 0xF3) return *need = 3, true;
  if (c == 0xF4) return *need = 3, *hi = 0x8F, true;
  return false;
}
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

class Runner {
 public:
  explicit Runner(const JsonMachine& m) : m_(m) {}

  State start() const {
    State s;
    s.depth = 1;
    s.f[0] = Frame{};
    s.f[0].node = m_.root;
    s.f[0].mode = Root;
    return s;
  }

  bool complete(const State& s) const {
    if (s.depth == 1) return s.f[0].phase == 1;
    if (s.depth == 2) {
      const Frame& t = s.f[1];
      if (t.mode == Number) return number_complete(t);
      if (t.mode == Literal) return literal_complete(t);
    }
    return false;
  }

  bool feed(State& s, unsigned char c) const {
    for (int guard = 0; guard < 2 * kMaxFrames + 4; ++guard) {
      switch (step(s, c)) {
        case R::Accept: return true;
        case R::Reject: return false;
        case R::Retry: break;  // the top frame changed: offer c again
      }
    }
    return false;
  }

 private:
  enum class R { Accept, Reject, Retry };

  const std::vector<std::string>& literals(const Frame& f) const {
    return f.lit == L_BOOL ? m_.booleans : f.lit == L_NULL ? m_.nulls : m_.nodes[static_cast<size_t>(f.node)].literals;
  }
  bool literal_complete(const Frame& f) const {
    const auto& l = literals(f);
    for (size_t i = 0; i < l.size(); ++i)
      if ((f.cand >> i & 1) && static_cast<int32_t>(l[i].size()) == f.count) return true;
    return false;
  }
  static bool number_complete(const Frame& f) {
    return f.phase == N_ZERO || f.phase == N_INT || f.phase == N_FRAC || f.phase == N_EXP;
  }

  bool push(State& s, const Frame& f) const {
    if (s.depth >= kMaxFrames) return false;
    s.f[s.depth++] = f;
    return true;
  }
  // the top frame's value is complete: pop it, and its parent moves on
  void done(State& s) const {
    --s.depth;
    Frame& p = s.top();
    switch (p.mode) {
      case Root: p.phase = 1; break;
      case Object: p.phase = O_AFTER, p.ws = 0; break;
      case Array: p.phase = A_AFTER, p.ws = 0, ++p.count; break;
      default: break;
    }
  }
  // Inside a string, after a backslash (an escape's letter, \\u's hex digits) or a UTF-8 lead byte
  // (its continuation bytes, the first in the lead's range).
  static R pending(Frame& f, unsigned char c) {
    if (f.esc == 1) {
      if (!std::strchr("\"\\/bfnrtu", c) || c == 0) return R::Reject;
      f.esc = c == 'u' ? 5 : 0;
      return R::Accept;
    }
    if (f.esc > 1) {
      if (!is_hex(c)) return R::Reject;
      f.esc = f.esc == 2 ? 0 : static_cast<uint8_t>(f.esc - 1);
      return R::Accept;
    }
    if (c < f.u8lo || c > f.u8hi) return R::Reject;
    --f.utf8, f.u8lo = 0x80, f.u8hi = 0xBF;
    return R::Accept;
  }
  R ws(Frame& f, unsigned char c) const {
    if (!is_ws(c) || f.ws >= kMaxWs) return R::Reject;
    ++f.ws;
    return R::Accept;
  }

  R step(State& s, unsigned char c) const {
    Frame& f = s.top();
    const SNode& n = m_.nodes[static_cast<size_t>(f.node)];
    switch (f.mode) {
      case Root: {
        if (f.phase == 1) return R::Reject;  // one value, then nothing
        if (is_ws(c)) return ws(f, c);
        Frame v;
        v.node = f.node;
        v.mode = Value;
        return push(s, v) ? R::Retry : R::Reject;
      }
      case Value: {
        if (is_ws(c)) return ws(f, c);
        f.ws = 0;
        if (!n.literals.empty()) {
          f.mode = Literal, f.lit = L_NODE, f.count = 0;
          f.cand = n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
          return R::Retry;
        }
        if (c == '{' && (n.types & kObj)) {
          f.mode = Object, f.phase = O_START, f.seen = 0;
          return R::Accept;
        }
        if (c == '[' && (n.types & kArr)) {
          f.mode = Array, f.phase = A_START, f.count = 0;
          return R::Accept;
        }
        if (c == '"' && (n.types & kStr)) {
          f.mode = String, f.count = 0, f.esc = 0, f.utf8 = 0;
          return R::Accept;
        }
        if ((c == '-' || is_digit(c)) && (n.types & (kNum | kInt))) {
          f.mode = Number;
          f.count = 0;
          f.phase = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
          if (c != '-') f.count = 1;
          return R::Accept;
        }
        if ((c == 't' || c == 'f') && (n.types & kBool)) {
          f.mode = Literal, f.lit = L_BOOL, f.count = 0, f.cand = 3;
          return R::Retry;
        }
        if (c == 'n' && (n.types & kNull)) {
          f.mode = Literal, f.lit = L_NULL, f.count = 0, f.cand = 1;
          return R::Retry;
        }
        return R::Reject;
      }
      case Literal: {
        const auto& l = literals(f);
        uint64_t next = 0;
        for (size_t i = 0; i < l.size() && i < 64; ++i)
          if ((f.cand >> i & 1) && static_cast<int32_t>(l[i].size()) > f.count &&
              static_cast<unsigned char>(l[i][static_cast<size_t>(f.count)]) == c)
            next |= uint64_t{1} << i;
        if (next) {
          f.cand = next;
          ++f.count;
          return R::Accept;
        }
        if (literal_complete(f)) {
          done(s);
          return R::Retry;
        }
        return R::Reject;
      }
      case String: {
        if (f.esc || f.utf8) return pending(f, c);
        if (c == '"') {
          if (f.count < n.min_len) return R::Reject;
          done(s);
          return R::Accept;
        }
        if (f.count >= n.max_len || c < 0x20 || c == 0x7f) return R::Reject;
        if (c == '\\') {
          f.esc = 1;
        } else if (c >= 0x80 && !utf8_lead(c, &f.utf8, &f.u8lo, &f.u8hi)) {
          return R::Reject;
        }
        ++f.count;
        return R::Accept;
      }
      case Number: {
        const bool real = n.types & kNum;
        switch (f.phase) {
          case N_MINUS:
            if (c == '0') return f.phase = N_ZERO, f.count = 1, R::Accept;
            if (is_digit(c)) return f.phase = N_INT, f.count = 1, R::Accept;
            return R::Reject;
          case N_ZERO:
          case N_INT:
            if (f.phase == N_INT && is_digit(c) && f.count < kMaxDigits) return ++f.count, R::Accept;
            if (real && c == '.') return f.phase = N_DOT, f.count = 0, R::Accept;
            if (real && (c == 'e' || c == 'E')) return f.phase = N_E, f.count = 0, R::Accept;
            break;
          case N_DOT:
            if (is_digit(c)) return f.phase = N_FRAC, f.count = 1, R::Accept;
            return R::Reject;
          case N_FRAC:
            if (is_digit(c) && f.count < kMaxDigits) return ++f.count, R::Accept;
            if (c == 'e' || c == 'E') return f.phase = N_E, f.count = 0, R::Accept;
            break;
          case N_E:
            if (c == '+' || c == '-') return f.phase = N_ESIGN, R::Accept;
            [[fallthrough]];
          case N_ESIGN:
            if (is_digit(c)) return f.phase = N_EXP, f.count = 1, R::Accept;
            return R::Reject;
          case N_EXP:
            if (is_digit(c) && f.count < kMaxExpDigits) return ++f.count, R::Accept;
            break;
        }
        if (!number_complete(f)) return R::Reject;
        done(s);
        return R::Retry;
      }
      case Object: return object_step(s, f, n, c);
      case Array: {
        if (f.phase == A_START || f.phase == A_AFTER || f.phase == A_COMMA) {
          if (is_ws(c)) return ws(f, c);
          if (c == ']' && f.phase != A_COMMA && f.count >= n.min_items) {
            done(s);
            return R::Accept;
          }
          if (c == ',' && f.phase == A_AFTER && f.count < n.max_items) {
            f.phase = A_COMMA, f.ws = 0;
            return R::Accept;
          }
          if (f.phase == A_AFTER || f.count >= n.max_items) return R::Reject;
          f.phase = A_VALUE, f.ws = 0;
          Frame v;
          v.node = n.items;
          v.mode = Value;
          return push(s, v) ? R::Retry : R::Reject;
        }
        return R::Reject;
      }
    }
    return R::Reject;
  }

  R object_step(State& s, Frame& f, const SNode& n, unsigned char c) const {
    switch (f.phase) {
      case O_START:
      case O_AFTER:
      case O_COMMA: {
        if (is_ws(c)) return ws(f, c);
        const bool all_required = (f.seen & n.required) == n.required;
        if (c == '}' && f.phase != O_COMMA && all_required) {
          done(s);
          return R::Accept;
        }
        if (c == ',' && f.phase == O_AFTER) {
          const bool more = n.any_keys || (f.seen != ((n.props.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.props.size()) - 1)));
          if (!more) return R::Reject;
          f.phase = O_COMMA, f.ws = 0;
          return R::Accept;
        }
        if (c == '"' && f.phase != O_AFTER) {
          f.phase = O_KEY, f.ws = 0, f.count = 0, f.esc = 0, f.utf8 = 0;
          f.cand = 0;
          for (size_t i = 0; i < n.props.size() && i < 64; ++i)
            if (!(f.seen >> i & 1)) f.cand |= uint64_t{1} << i;
          if (!n.any_keys && !f.cand) return R::Reject;
          return R::Accept;
        }
        return R::Reject;
      }
      case O_KEY: {
        if (n.any_keys) {
          // a free key: a string without limits
          if (f.esc || f.utf8) return pending(f, c);
          if (c == '"') {
            f.phase = O_COLON, f.prop = -1, f.ws = 0;
            return R::Accept;
          }
          if (c < 0x20 || c == 0x7f) return R::Reject;
          if (c == '\\') f.esc = 1;
          else if (c >= 0x80 && !utf8_lead(c, &f.utf8, &f.u8lo, &f.u8hi)) return R::Reject;
          return R::Accept;
        }
        if (c == '"') {
          for (size_t i = 0; i < n.props.size() && i < 64; ++i)
            if ((f.cand >> i & 1) && static_cast<int32_t>(n.props[i].size()) == f.count) {
              f.prop = static_cast<int32_t>(i);
              f.seen |= uint64_t{1} << i;
              f.phase = O_COLON, f.ws = 0;
              return R::Accept;
            }
          return R::Reject;
        }
        uint64_t next = 0;
        for (size_t i = 0; i < n.props.size() && i < 64; ++i)
          if ((f.cand >> i & 1) && static_cast<int32_t>(n.props[i].size()) > f.count &&
              static_cast<unsigned char>(n.props[i][static_cast<size_t>(f.count)]) == c)
            next |= uint64_t{1} << i;
        if (!next) return R::Reject;
        f.cand = next;
        ++f.count;
        return R::Accept;
      }
      case O_COLON: {
        if (is_ws(c)) return ws(f, c);
        if (c != ':') return R::Reject;
        f.phase = O_VALUE, f.ws = 0;
        Frame v;
        v.node = f.prop >= 0 ? n.prop_node[static_cast<size_t>(f.prop)] : 0;
        v.mode = Value;
        return push(s, v) ? R::Accept : R::Reject;
      }
      default: return R::Reject;
    }
  }

  const JsonMachine& m_;
};

// ---- schemas ------------------------------------------------------------------------------------

class Compiler {
 public:
  explicit Compiler(const Json& root) : root_(root) {}

  int32_t compile(const Json& s, const std::string& at, JsonMachine& m) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("response_format schema: ", at, " is false (allows nothing)");
      return 0;
    }
    if (!s.is_object()) fail("response_format schema: ", at, " must be an object, not ", s.type_name());
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) fail("response_format schema: ", at, ".$ref must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      std::string name;
      for (const char* prefix : {"#/$defs/", "#/definitions/"})
        if (ref.rfind(prefix, 0) == 0) name = ref.substr(std::strlen(prefix));
      const char* where = ref.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
      if (name.empty() || !root_.contains(where) || !root_[where].is_object() || !root_[where].contains(name))
        fail("response_format schema: ", at, ".$ref '", ref, "' names no definition (#/$defs/NAME or #/definitions/NAME)");
      if (visiting_.count(ref)) fail("response_format schema: ", at, ".$ref '", ref, "' is recursive (not supported)");
      visiting_.insert(ref);
      const int32_t id = compile(root_[where][name], ref, m);
      visiting_.erase(ref);
      return id;
    }
    static const std::set<std::string> ignored = {"description", "title", "default", "examples", "$schema", "$id",
                                                  "format", "$defs", "definitions", "$comment", "strict", "name"};
    static const std::set<std::string> known = {"type", "properties", "required", "additionalProperties", "items",
                                                "minItems", "maxItems", "minLength", "maxLength", "enum", "const"};
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!ignored.count(it.key()) && !known.count(it.key()))
        fail("response_format schema: ", at, " uses '", it.key(), "', which qkv's structured output does not support "
             "(it knows type, properties, required, additionalProperties false, items, minItems, maxItems, "
             "minLength, maxLength, enum, const, $ref)");
    SNode n;
    if (s.contains("type")) {
      n.types = 0;
      const Json& t = s["type"];
      std::vector<std::string> names;
      if (t.is_string()) names.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const Json& e : t) names.push_back(e.is_string() ? e.get<std::string>() : "?");
      else fail("response_format schema: ", at, ".type must be a string or a list of strings");
      for (const std::string& nm : names) {
        if (nm == "object") n.types |= kObj;
        else if (nm == "array") n.types |= kArr;
        else if (nm == "string") n.types |= kStr;
        else if (nm == "number") n.types |= kNum | kInt;
        else if (nm == "integer") n.types |= kInt;
        else if (nm == "boolean") n.types |= kBool;
        else if (nm == "null") n.types |= kNull;
        else fail("response_format schema: ", at, ".type '", nm, "' is not a JSON Schema type");
      }
    }
    for (const char* k : {"enum", "const"}) {
      if (!s.contains(k)) continue;
      const Json vals = std::string(k) == "const" ? Json::array({s[k]}) : s[k];
      if (!vals.is_array() || vals.empty() || vals.size() > 64)
        fail("response_format schema: ", at, ".", k, " must be a list of 1 to 64 values");
      for (const Json& v : vals) {
        if (v.is_object() || v.is_array()) fail("response_format schema: ", at, ".", k, " holds ", v.dump(),
                                                 "; qkv's enums are strings, numbers, booleans or null");
        const std::string lit = v.dump(-1, ' ', false, Json::error_handler_t::strict);
        if (v.is_string() && (lit.find('\\') != std::string::npos))
          fail("response_format schema: ", at, ".", k, " holds ", lit, ": strings that need escapes are not supported");
        n.literals.push_back(lit);
      }
    }
    const auto whole = [&](const char* k, int64_t lo) {
      if (!s.contains(k)) return int64_t{-1};
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < lo)
        fail("response_format schema: ", at, ".", k, " must be a whole number >= ", lo);
      return s[k].get<int64_t>();
    };
    if (const int64_t v = whole("minLength", 0); v >= 0) n.min_len = v;
    if (const int64_t v = whole("maxLength", 0); v >= 0) n.max_len = v;
    if (const int64_t v = whole("minItems", 0); v >= 0) n.min_items = v;
    if (const int64_t v = whole("maxItems", 0); v >= 0) n.max_items = v;
    if (n.min_len > n.max_len || n.min_items > n.max_items)
      fail("response_format schema: ", at, ": a minimum above its maximum");
    if (s.contains("additionalProperties") && !(s["additionalProperties"].is_boolean()))
      fail("response_format schema: ", at, ".additionalProperties must be true or false (a schema is not supported)");
    const bool closed = s.contains("additionalProperties") && s["additionalProperties"] == false;
    std::vector<std::pair<std::string, Json>> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object() || s["properties"].size() > 64)
        fail("response_format schema: ", at, ".properties must be an object of at most 64 properties");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        const std::string& k = it.key();
        for (unsigned char ch : k)
          if (ch == '"' || ch == '\\' || ch < 0x20)
            fail("response_format schema: ", at, ".properties has the name ", Json(k).dump(),
                 ": names that need escapes are not supported");
        props.emplace_back(k, *it);
      }
    }
    // the node's children first (their ids), then the node
    std::vector<int32_t> kids;
    for (const auto& [k, v] : props) kids.push_back(compile(v, at + ".properties." + k, m));
    n.any_keys = props.empty() && !closed;
    for (size_t i = 0; i < props.size(); ++i) {
      n.props.push_back(props[i].first);
      n.prop_node.push_back(kids[i]);
    }
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("response_format schema: ", at, ".required must be a list of names");
      for (const Json& r : s["required"]) {
        const auto pos = std::find(n.props.begin(), n.props.end(), r.is_string() ? r.get<std::string>() : "");
        if (pos == n.props.end())
          fail("response_format schema: ", at, ".required names ", r.dump(), ", which is not one of its properties");
        n.required |= uint64_t{1} << (pos - n.props.begin());
      }
    }
    if (s.contains("items")) n.items = compile(s["items"], at + ".items", m);
    if (m.nodes.size() >= 4096) fail("response_format schema: more than 4096 schemas");
    m.nodes.push_back(std::move(n));
    return static_cast<int32_t>(m.nodes.size() - 1);
  }

 private:
  const Json& root_;
  std::set<std::string> visiting_;
};

class JsonTokenConstraint : public TokenConstraint {
 public:
  JsonTokenConstraint(std::shared_ptr<const JsonMachine> m, std::shared_ptr<const TokenTrie> t, int32_t eos)
      : m_(std::move(m)), trie_(std::move(t)), eos_(eos), state_(Runner(*m_).start()) {}
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<JsonTokenConstraint>(*this); }

  void allowed(std::vector<char>& mask) const override {
    const Runner r(*m_);
    if (r.complete(state_) && eos_ >= 0 && eos_ < static_cast<int64_t>(mask.size())) mask[static_cast<size_t>(eos_)] = 1;
    walk(r, 0, state_, mask);
  }

  bool allows(int32_t token) const override {
    const Runner r(*m_);
    if (token == eos_) return r.complete(state_);
    if (token < 0 || token >= trie_->vocab_size() || trie_->bytes(token).empty()) return false;
    State t = state_;
    for (unsigned char c : trie_->bytes(token))
      if (!r.feed(t, c)) return false;
    return true;
  }

  void advance(int32_t token) override {
    const Runner r(*m_);
    if (token == eos_ || token < 0 || token >= trie_->vocab_size()) return;
    for (unsigned char c : trie_->bytes(token))
      check(r.feed(state_, c), "json constraint: internal: token ", token, " was not allowed");
  }

 private:
  void walk(const Runner& r, int32_t node, const State& s, std::vector<char>& mask) const {
    for (const auto& [c, child] : trie_->nodes()[static_cast<size_t>(node)].next) {
      State t = s;
      if (!r.feed(t, c)) continue;
      for (int32_t v : trie_->nodes()[static_cast<size_t>(child)].tokens)
        if (v < static_cast<int64_t>(mask.size())) mask[static_cast<size_t>(v)] = 1;
      walk(r, child, t, mask);
    }
  }

  std::shared_ptr<const JsonMachine> m_;
  std::shared_ptr<const TokenTrie> trie_;
  int32_t eos_;
  State state_;
};

}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string>& bytes) : bytes_(bytes), vocab_(static_cast<int64_t>(bytes.size())) {
  nodes_.emplace_back();
  for (size_t v = 0; v < bytes.size(); ++v) {
    if (bytes[v].empty()) continue;
    int32_t at = 0;
    for (unsigned char c : bytes[v]) {
      auto& next = nodes_[static_cast<size_t>(at)].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
      if (it != next.end() && it->first == c) {
        at = it->second;
        continue;
      }
      const auto id = static_cast<int32_t>(nodes_.size());
      next.insert(it, {c, id});
      nodes_.emplace_back();
      at = id;
    }
    nodes_[static_cast<size_t>(at)].tokens.push_back(static_cast<int32_t>(v));
  }
}

std::shared_ptr<const JsonMachine> json_machine(const std::string& schema_json) {
  auto m = std::make_shared<JsonMachine>();
  m->nodes.emplace_back();  // 0: any value (objects with any keys, arrays of any values)
  if (schema_json.empty()) {
    SNode obj;
    obj.types = kObj;
    m->nodes.push_back(obj);
    m->root = 1;
    return m;
  }
  Json s;
  try {
    s = Json::parse(schema_json);
  } catch (const Json::exception& e) {
    fail("response_format schema: not valid JSON (", e.what(), ")");
  }
  m->root = Compiler(s).compile(s, "schema", *m);
  return m;
}

std::shared_ptr<const TokenConstraint> json_constraint(std::shared_ptr<const JsonMachine> machine,
                                                       std::shared_ptr<const TokenTrie> trie, int32_t eos_id) {
  return std::make_shared<JsonTokenConstraint>(std::move(machine), std::move(trie), eos_id);
}

bool json_machine_accepts(const JsonMachine& m, const std::string& text, bool* prefix_ok) {
  const Runner r(m);
  State s = r.start();
  bool ok = true;
  for (unsigned char c : text)
    if (!r.feed(s, c)) {
      ok = false;
      break;
    }
  if (prefix_ok) *prefix_ok = ok;
  return ok && r.complete(s);
}

}  // namespace qkv
