// qkv/json_constraint.h: structured output. A pushdown automaton over bytes that accepts exactly
// the JSON texts a JSON Schema (the subset below) allows, and the TokenConstraint (qkv/scheduler.h)
// that masks, at each decoding step, the tokens whose bytes cannot continue such a text: what
// OpenAI's response_format {"type": "json_object"} and {"type": "json_schema"} ask of a server.
//
// Schemas: "type" (object, array, string, number, integer, boolean, null, or a list of them),
// "properties", "required", "additionalProperties" (false, or absent: only the listed properties
// are written when there are any), "items", "minItems", "maxItems", "minLength", "maxLength",
// "enum", "const", nesting, and "$defs"/"definitions" with "$ref" to them (not recursive);
// annotations (description, title, default, examples, $schema, format) are ignored. Anything else
// (anyOf, oneOf, pattern, minimum, ...) is a qkv::Error naming the keyword and where it is. The
// output has no whitespace between tokens but single spaces or newlines (at most two in a row);
// strings hold no control characters; numbers at most 15 integer and 15 fraction digits and 2 exponent digits; nesting
// at most 12 deep.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qkv/scheduler.h"

namespace qkv {

class JsonMachine;

// The bytes each token writes (Tokenizer::token_bytes; special tokens left out), arranged as a
// trie so that one walk tests every token. Build once per vocabulary.
class TokenTrie {
 public:
  // bytes[v]: token v's bytes; an empty string leaves v out (never allowed but as eos)
  explicit TokenTrie(const std::vector<std::string>& bytes);
  int64_t vocab_size() const { return vocab_; }
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    std::vector<int32_t> tokens;                          // tokens whose bytes end here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::string& bytes(int32_t v) const { return bytes_[static_cast<size_t>(v)]; }

 private:
  std::vector<Node> nodes_;
  std::vector<std::string> bytes_;
  int64_t vocab_ = 0;
};

// The JSON a schema allows. schema_json: a JSON Schema text, or "" for any JSON object (OpenAI's
// json_object). Throws qkv::Error naming what it does not support.
std::shared_ptr<const JsonMachine> json_machine(const std::string& schema_json);

// The constraint for one request: tokens continue a text the machine accepts; eos only once a
// whole value is written, and then nothing else.
std::shared_ptr<const TokenConstraint> json_constraint(std::shared_ptr<const JsonMachine> machine,
                                                       std::shared_ptr<const TokenTrie> trie, int32_t eos_id);

// For tests: does the machine accept `text` whole (a complete value), and does it accept it as a
// prefix of one?
bool json_machine_accepts(const JsonMachine& m, const std::string& text, bool* prefix_ok = nullptr);

}  // namespace qkv
