// The qkv command line: one file per subcommand, each registering itself on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace qkv::cli {

// Each subcommand adds itself to `app` and returns the function to run when it was chosen.
// The function returns the process exit code; it may throw qkv::Error (reported by main).
using Runner = std::function<int()>;
Runner add_attend(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_bench_train(CLI::App& bench);  // `qkv bench train`, registered by add_bench
Runner add_bench_decode(CLI::App& bench);  // `qkv bench decode`, likewise
Runner add_bench_gemv(CLI::App& bench);    // `qkv bench gemv`, likewise
Runner add_init(CLI::App& app);
Runner add_import(CLI::App& app);
Runner add_forward(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_quantize(CLI::App& app);
Runner add_fit(CLI::App& app);
Runner add_train(CLI::App& app);  // qkv train --task ...
Runner add_translate(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_classify(CLI::App& app);
Runner add_fill_mask(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_chat_template(CLI::App& app);  // qkv chat-template: a chat's prompt under a model's template
Runner add_explore(CLI::App& app);  // qkv serve that opens the explorer page
Runner add_tour(CLI::App& app);     // the chapter's claims in the terminal
Runner add_eval(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_data(CLI::App& app);
Runner add_plot(CLI::App& app);  // loss curves of runs side by side

}  // namespace qkv::cli
