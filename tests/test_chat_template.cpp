// qkv/chat_template.h: what Jinja2 parity (tests/chat_template_parity.py) cannot show: errors name
// the template and line, raise_exception's message reaches the caller, model folders' templates
// are found where transformers looks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "error_testing.h"
#include "qkv/chat_template.h"

namespace {

using qkv::ChatTemplate;
using qkv::testing::error_of;

std::string render(const std::string& src, const std::string& ctx = "{}") { return ChatTemplate(src, "t.jinja").render(ctx); }

TEST(ChatTemplate, RendersWithJinjasWhitespaceRules) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before it;
  // "-" strips all whitespace on its side; one newline at the very end is dropped
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb\n"), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %}"), "xy");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // not after {{ }}
  EXPECT_EQ(render("{% for m in messages %}{{ m.role }}:{{ m['content'] }};{% endfor %}",
                   R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"),
            "user:hi;assistant:yo;");
  EXPECT_EQ(render("{{ {'y': {}} | tojson }}"), "{\"y\": {}}");  // "}}" inside braces closes them
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  const auto err = [](const std::string& src, const std::string& ctx = "{}") {
    return error_of([&] { (void)render(src, ctx); });
  };
  EXPECT_NE(err("a\nb\n{% if x %}").find("t.jinja:3: the template ends inside a block (expected 'endif')"), std::string::npos);
  EXPECT_NE(err("line1\n{{ 1 + }}").find("t.jinja:2: expected a value"), std::string::npos);
  EXPECT_NE(err("\n\n{% include 'x' %}").find("t.jinja:3: the statement 'include' is not supported"), std::string::npos);
  EXPECT_NE(err("{{ 'a' | frobnicate }}").find("t.jinja:1: the filter 'frobnicate' is not one"), std::string::npos);
  EXPECT_NE(err("\n{{ nothing.here }}").find("t.jinja:2: 'nothing' is undefined"), std::string::npos);
  EXPECT_NE(err("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(err("{{ raise_exception('Roles must alternate') }}").find("t.jinja: the chat template refused: Roles must alternate"),
            std::string::npos);
  EXPECT_NE(err("{{ x }}", "[1]").find("the context must be an object"), std::string::npos);
  EXPECT_NE(err("{{ x }}", "{").find("the context is not valid JSON"), std::string::npos);
  EXPECT_NE(err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("macros nested more than 64 deep"),
            std::string::npos);
  EXPECT_NE(err("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("nested more than 200 deep"),
            std::string::npos);
  EXPECT_NE(err(std::string(5000, '-') + "{{ " + std::string(100000, '-') + "1 }}").find("nested more than 200 deep"),
            std::string::npos);
  EXPECT_NE(err("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}")
                .find("runs more than 5,000,000 statements"),
            std::string::npos);
  // (a namespace carries values across iterations)
  EXPECT_NE(err("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("more than 2^20 items"),
            std::string::npos);
  EXPECT_NE(err("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("16 MiB"),
            std::string::npos);
  EXPECT_NE(err("{{ 'abc' * 10000000 }}").find("16 MiB"), std::string::npos);
  EXPECT_NE(err("{{ range(100000000) | length }}").find("range() of more than 2^20 values"), std::string::npos);
}

TEST(ChatTemplate, FindsAModelFoldersTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qkv_chat_template_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  qkv::ChatTemplateSource src;
  EXPECT_FALSE(qkv::find_chat_template(dir.string(), &src));
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  ASSERT_TRUE(qkv::find_chat_template(dir.string(), &src));
  EXPECT_EQ(src.source, "D");
  ASSERT_EQ(src.special_tokens.size(), 2u);
  EXPECT_EQ(src.special_tokens[0], (std::pair<std::string, std::string>{"bos_token", "<s>"}));
  EXPECT_EQ(src.special_tokens[1], (std::pair<std::string, std::string>{"eos_token", "</s>"}));
  std::ofstream(dir / "chat_template.jinja") << "J";  // chat_template.jinja wins, as in transformers
  ASSERT_TRUE(qkv::find_chat_template(dir.string(), &src));
  EXPECT_EQ(src.source, "J");
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": 3})";
  EXPECT_NE(error_of([&] { qkv::find_chat_template(dir.string(), &src); }).find("chat_template must be a string"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
