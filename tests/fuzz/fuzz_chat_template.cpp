// A chat template (qkv/chat_template.h): a model folder's Jinja2 is untrusted bytes too. Parsing
// and rendering a conversation either succeed or throw qkv::Error; never a crash, a hang (the
// statement budget) or unbounded memory (the text and list budgets). A rendered prompt is the
// same when rendered again.
#include "fuzz_util.h"
#include "qkv/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  static const std::string ctx =
      R"({"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi\n"},)"
      R"( {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},)"
      R"( {"role": "user", "content": "é 🙂 \"quoted\""}], "add_generation_prompt": true, "bos_token": "<s>",)"
      R"( "eos_token": "</s>", "tools": [{"type": "function", "function": {"name": "f"}}]})";
  std::unique_ptr<ChatTemplate> t;
  if (!fuzz::accepts([&] { t = std::make_unique<ChatTemplate>(in, "t.jinja"); })) return 0;
  std::string a, b;
  if (!fuzz::accepts([&] { a = t->render(ctx); })) return 0;
  b = t->render(ctx);
  if (a != b) fuzz::finding("a template rendered twice gives two texts");
  return 0;
}
