// qkv/json_constraint.h: the byte automaton accepts what the schema allows and nothing else, and
// the token mask is the automaton applied to every token's bytes. (Random schemas through the
// server, validated by python3-jsonschema: tests/serve_test.py.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_testing.h"
#include "qkv/json_constraint.h"

namespace {

using qkv::json_machine;
using qkv::json_machine_accepts;
using qkv::testing::error_of;

bool accepts(const std::string& schema, const std::string& text) { return json_machine_accepts(*json_machine(schema), text); }
bool prefix(const std::string& schema, const std::string& text) {
  bool ok = false;
  json_machine_accepts(*json_machine(schema), text, &ok);
  return ok;
}

TEST(JsonConstraint, AcceptsWhatTheSchemaAllows) {
  const std::string person = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "bc", 3, null]}, "maxItems": 2},
      "ok": {"type": "boolean"}, "w": {"type": ["number", "null"]}}, "required": ["name", "age"]})";
  EXPECT_TRUE(accepts(person, R"({"name": "Ann", "age": 30})"));
  EXPECT_TRUE(accepts(person, R"({"age":-7,"name":"","tags":["bc",3],"ok":false,"w":null})"));
  EXPECT_TRUE(accepts(person, "{\n \"name\": \"x\",\n \"age\": 0, \"w\": -1.5e+3}"));
  EXPECT_FALSE(accepts(person, R"({"name": "Ann"})"));                      // age is required
  EXPECT_FALSE(prefix(person, R"({"name": "Annabel")"));                    // maxLength 5
  EXPECT_FALSE(prefix(person, R"({"nick")"));                               // not a property
  EXPECT_FALSE(prefix(person, R"({"name": "A", "name")"));                  // no property twice
  EXPECT_FALSE(prefix(person, R"({"name": "A", "age": 1.5)"));              // an integer
  EXPECT_FALSE(prefix(person, R"({"name": "A", "age": 01)"));               // JSON's numbers
  EXPECT_FALSE(prefix(person, R"({"name": "A", "age": 1, "tags": ["b"])")); // the enum
  EXPECT_FALSE(prefix(person, R"({"name": "A", "age": 1, "tags": [3, 3, 3)"));  // maxItems 2
  EXPECT_FALSE(prefix(person, R"({"name": "A", "age": 1}  )"));             // nothing after the value
  EXPECT_FALSE(prefix(person, "{     \"name\""));                           // at most 2 spaces in a row
  EXPECT_TRUE(prefix(person, R"({"name": "A", "age": 1)"));
  EXPECT_FALSE(accepts(person, R"({"name": "A", "age": 1)"));               // a prefix, not complete
  // json_object: any object, any values; strings with escapes and UTF-8
  EXPECT_TRUE(accepts("", R"({"a": [1, {"b": null}], "é\"\u00e9": "x\n"})"));
  EXPECT_FALSE(prefix("", "[1]"));
  EXPECT_FALSE(prefix("", "{\"a\": \"\x01"));
  EXPECT_FALSE(prefix("", "{\"a\": \"\xC0"));  // not a UTF-8 lead byte
  EXPECT_FALSE(prefix("", "{\"a\": \"\xE0\x80"));      // overlong
  EXPECT_FALSE(prefix("", "{\"a\": \"\xED\xA0"));      // a surrogate
  EXPECT_FALSE(prefix("", "{\"a\": \"\xF4\x90"));      // past U+10FFFF
  EXPECT_TRUE(prefix("", "{\"a\": \"\xE2\x82\xAC\xF0\x9F\x98\x80"));  // a euro sign, an emoji
  // a bare number at the root is complete when it is one
  EXPECT_TRUE(accepts(R"({"type": "number"})", "12.5"));
  EXPECT_FALSE(accepts(R"({"type": "number"})", "12."));
  EXPECT_TRUE(accepts(R"({"$defs": {"p": {"type": "string"}}, "type": "array", "items": {"$ref": "#/$defs/p"}})",
                      R"(["a", "b"])"));
}

TEST(JsonConstraint, RefusesWhatItDoesNotSupport) {
  const auto err = [](const std::string& s) { return error_of([&] { json_machine(s); }); };
  EXPECT_NE(err(R"({"anyOf": [{"type": "string"}]})").find("uses 'anyOf'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "properties": {"a": {"pattern": "x"}}})").find("schema.properties.a uses 'pattern'"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "thing"})").find("'thing' is not a JSON Schema type"), std::string::npos);
  EXPECT_NE(err(R"({"required": ["x"], "properties": {}})").find("\"x\", which is not one of its properties"),
            std::string::npos);
  EXPECT_NE(err(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})").find("recursive"), std::string::npos);
  EXPECT_NE(err("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(err(R"({"minLength": 3, "maxLength": 2})").find("a minimum above its maximum"), std::string::npos);
}

TEST(JsonConstraint, MaskIsTheAutomatonOnEveryToken) {
  // a vocabulary of byte strings; eos id 0; one token left out (empty)
  const std::vector<std::string> vocab = {"", "{", "}", "{\"", "\"", "a", "\":", " ", "1", "12", "\"a\"", "x", "},", ""};
  auto trie = std::make_shared<qkv::TokenTrie>(vocab);
  const auto m = json_machine(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  auto c = qkv::json_constraint(m, trie, 0)->clone();
  std::string text;
  const std::vector<int32_t> plan = {3, 5, 6, 7, 9, 2};  // {" a ": " " 12 }
  for (int32_t t : plan) {
    std::vector<char> mask(vocab.size(), 0);
    c->allowed(mask);
    for (size_t v = 1; v < vocab.size(); ++v) {
      bool ok = false;
      json_machine_accepts(*m, text + vocab[v], &ok);
      EXPECT_EQ(mask[v] != 0, ok && !vocab[v].empty()) << "after '" << text << "', token '" << vocab[v] << "'";
      EXPECT_EQ(c->allows(static_cast<int32_t>(v)), mask[v] != 0) << "allows() of token '" << vocab[v] << "'";
    }
    EXPECT_EQ(mask[0], 0) << "eos before the value is whole";
    ASSERT_TRUE(mask[static_cast<size_t>(t)]);
    c->advance(t);
    text += vocab[static_cast<size_t>(t)];
  }
  std::vector<char> mask(vocab.size(), 0);
  c->allowed(mask);
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 1), 1);
  EXPECT_EQ(mask[0], 1) << "once whole: only eos";
}

}  // namespace
