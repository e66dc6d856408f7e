// qkv chat-template: the prompt a chat becomes under a model's chat template (qkv/chat_template.h),
// the text that qkv serve's /v1/chat/completions feeds the model.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "qkv/chat_template.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "commands.h"

namespace qkv::cli {

namespace {

struct ChatTemplateOptions {
  std::string model, template_file, messages, contexts;
  bool no_generation_prompt = false;
};

using OJson = nlohmann::ordered_json;

OJson parse(const std::string& path, const char* what) {
  try {
    return OJson::parse(read_file(path, what));
  } catch (const OJson::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace

Runner add_chat_template(CLI::App& app) {
  auto o = std::make_shared<ChatTemplateOptions>();
  CLI::App* c = app.add_subcommand(
      "chat-template", "Print the prompt a chat becomes under a model's chat template (Jinja2, as transformers' "
                       "apply_chat_template renders it): what qkv serve's /v1/chat/completions feeds the model");
  c->add_option("--model", o->model,
                "A model folder (chat_template.jinja or tokenizer_config.json's chat_template) or GGUF file "
                "(tokenizer.chat_template)");
  c->add_option("--template", o->template_file, "A Jinja2 template file instead of the model's");
  c->add_option("--messages", o->messages, "A JSON file: the list of messages ({\"role\", \"content\"})");
  c->add_flag("--no-generation-prompt", o->no_generation_prompt,
              "add_generation_prompt false (the chat as it stands, without the assistant's turn opened)");
  c->add_option("--contexts", o->contexts,
                "A JSON file holding a list of whole contexts (objects of the template's variables); prints a JSON "
                "list of {\"text\"} or {\"error\"}, one per context");
  return [o] {
    check(o->model.empty() != o->template_file.empty(), "chat-template: give --model DIR or --template FILE (one)");
    check(o->messages.empty() != o->contexts.empty(), "chat-template: give --messages FILE or --contexts FILE (one)");
    ChatTemplateSource src;
    if (!o->model.empty()) {
      check(std::filesystem::exists(o->model), "chat-template: --model ", o->model, ": no such file or directory");
      check(find_chat_template(o->model, &src), "chat-template: ", o->model,
            " has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json); give --template");
    } else {
      src.source = read_file(o->template_file, "--template");
      src.name = o->template_file;
    }
    const ChatTemplate t(src.source, src.name);
    if (!o->contexts.empty()) {
      const OJson all = parse(o->contexts, "--contexts");
      check(all.is_array(), o->contexts, ": expected a list of context objects");
      OJson out = OJson::array();
      for (const OJson& ctx : all) {
        try {
          out.push_back({{"text", t.render(ctx.dump())}});
        } catch (const Error& e) {
          out.push_back({{"error", e.what()}});
        }
      }
      std::printf("%s\n", out.dump(-1, ' ', false, OJson::error_handler_t::replace).c_str());
      return 0;
    }
    const OJson messages = parse(o->messages, "--messages");
    check(messages.is_array(), o->messages, ": expected a list of messages");
    OJson ctx = {{"messages", messages}, {"add_generation_prompt", !o->no_generation_prompt}};
    for (const auto& [k, v] : src.special_tokens) ctx[k] = v;
    const std::string text = t.render(ctx.dump());
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
}

}  // namespace qkv::cli
