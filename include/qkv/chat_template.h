// qkv/chat_template.h: the Jinja2 templates that Hugging Face model folders ship to turn a chat
// (system / user / assistant messages) into the one prompt string the model was trained on
// (tokenizer_config.json's "chat_template", or chat_template.jinja).
//
// Not all of Jinja2: the part chat templates use, rendered as transformers' apply_chat_template
// renders it (Jinja2 with trim_blocks, lstrip_blocks and the loop-control extension, no
// autoescaping, its own tojson, raise_exception): statements for (else, `if` filter, loop.index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem), if / elif / else, set
// (names, namespace attributes, tuples, blocks), macro, break / continue, generation; the
// operators and literals of expressions, attribute and item access, slices, conditional
// expressions; the filters and tests listed in docs/serving.md, the string and dict methods
// templates call, and the globals range, namespace, dict, raise_exception and strftime_now.
// Anything else is a qkv::Error naming the template and line, when parsed if it can be known
// then, else when rendered. docs/serving.md, "Chat templates".
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv {

class ChatTemplate {
 public:
  // Parses `source`; `name` (a file name) prefixes every error with its line: "NAME:LINE: ...".
  ChatTemplate(const std::string& source, std::string name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The text for `context_json`, a JSON object whose keys are the template's variables (messages,
  // add_generation_prompt, bos_token, eos_token, ...); objects keep their keys' order, as Python
  // dicts do. A template's raise_exception(message) is a qkv::Error "NAME: the chat template
  // refused: message".
  std::string render(std::string_view context_json) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A model folder's chat template and the special tokens transformers hands it.
struct ChatTemplateSource {
  std::string source, name;  // the template's text, and where it came from (for errors)
  // bos_token, eos_token, unk_token, pad_token as tokenizer_config.json names them (a string or
  // an {"content": ...} object), those it names
  std::vector<std::pair<std::string, std::string>> special_tokens;
};
// The chat template of a model folder: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} from which "default" is taken); of
// a GGUF file: its tokenizer.chat_template, with the special tokens' texts by their ids.
// Returns false when there is none. Errors (unreadable files, a template of the wrong type)
// name the file.
bool find_chat_template(const std::string& dir, ChatTemplateSource* out);

}  // namespace qkv
