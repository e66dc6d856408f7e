// Using a trained model directory: qkv translate, generate, classify, eval, tokenize.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "io/json_strict.h"
#include "qkv/files.h"
#include "qkv/qkv.h"
#include "qkv/metrics.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"
#include "qkv/viz.h"
#include "task_util.h"
#include "train/train_json.h"

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;

// A model directory with what `qkv train` wrote: weights, tokenizer, task.
struct Loaded {
  Model model;
  std::unique_ptr<Tokenizer> tok;
  TaskInfo info;
  std::string dir;
};

Loaded load_model_dir(const std::string& dir, Task want, const char* command, const std::string& dtype = "") {
  check(fs::is_directory(dir) || is_gguf_file(dir), "--model ", dir, ": neither a model directory nor a GGUF file");
  TaskInfo info = model_task_info(dir);
  check(info.task == want, "--model ", dir, ": the model was trained for --task ", task_name(info.task), ", but qkv ",
        command, " needs a ", task_name(want), " model");
  Model m = load_model(dir, dtype);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);
  // A directory from qkv train: the tokenizer the run trained with (train.json's tokenizer_vocab),
  // or, for a run that did not fine-tune a model with a padded table, exactly the model's vocabulary.
  // (A smaller one loaded, then failed mid-translation naming neither.)
  const std::string tj = dir + "/train.json";
  if (!is_hf_model_dir(dir) && fs::exists(tj)) {
    RunOptions run;
    read_train_json(read_file(tj, "train.json"), tj, run);
    const int64_t trained = run.tokenizer_vocab > 0 ? run.tokenizer_vocab
                         : run.init_recorded.empty() ? m.config().vocab_size : 0;
    check(trained == 0 || tok->vocab_size() == trained, "--model ", dir, ": its tokenizer has ", tok->vocab_size(),
          " tokens, but the model was trained with ", trained,
          run.tokenizer_vocab > 0 ? " (train.json's tokenizer_vocab)" : " (its vocab_size)",
          ": the tokenizer does not belong to the model (config.json's vocab_size is ", m.config().vocab_size, ")");
  }
  // a Hugging Face model's embedding table may have rows no token uses (padded to a multiple of 64)
  check(tok->vocab_size() <= m.config().vocab_size, "--model ", dir, ": the tokenizer's vocabulary (",
        tok->vocab_size(), ") is larger than config.json's vocab_size (", m.config().vocab_size, ")");
  check(info.task != Task::Classify || static_cast<int64_t>(info.labels.size()) == m.config().num_classes, "--model ",
        dir, ": task.json lists ", info.labels.size(), " labels, but config.json's num_classes is ",
        m.config().num_classes);
  return {std::move(m), std::move(tok), std::move(info), dir};
}

// Input lines: --input FILE, or standard input, one output per line (none is skipped, so the
// outputs stay aligned). Each must be valid UTF-8: an error names the input and the line.
std::vector<std::string> input_lines(const std::string& input) {
  std::vector<std::string> lines;
  const std::string name = input.empty() ? std::string("standard input") : "--input " + input;
  auto take = [&](std::string l, int64_t n) {
    if (const std::string why = utf8_problem(l); !why.empty()) fail(name, ", line ", n, ": ", why);
    lines.push_back(std::move(l));
  };
  std::string l;
  if (!input.empty()) {
    LineReader in(input);
    while (in.next(l)) take(std::move(l), in.line_number());
  } else {
    for (int64_t n = 1; std::getline(std::cin, l); ++n) {
      if (!l.empty() && l.back() == '\r') l.pop_back();
      take(std::move(l), n);
    }
  }
  return lines;
}

// A text given on the command line, checked like an input line.
const std::string& checked_text(const std::string& text, const char* option) {
  if (const std::string why = utf8_problem(text); !why.empty()) fail(option, ": ", why);
  return text;
}

struct DecodeOptions {
  int64_t beam = 4, max_len = 0, top_k = 0, batch = 16, layer = -1, head = 0;
  double length_penalty = 1.0, temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  uint64_t seed = 0;
  bool sample = false;
  std::string attention_map, dtype;
  // the options given, for the combinations resolve() refuses
  CLI::Option *beam_opt = nullptr, *length_penalty_opt = nullptr, *repetition_opt = nullptr, *layer_opt = nullptr,
              *head_opt = nullptr;
  std::vector<CLI::Option*> sampling_opts;
  CLI::App* app = nullptr;
  void add(CLI::App* c, bool lm) {
    app = c;
    beam_opt = c->add_option("--beam", beam,
                             lm ? "Beam size (1: greedy or sampling; default 1)"
                                : "Beam size (1: greedy; default 4, or 1 with --sample)")
                   ->transform(whole(1, 256));
    length_penalty_opt = c->add_option("--length-penalty", length_penalty, "Beams rank by logprob / length^this (default 1)")
                             ->transform(finite(-100, 100));
    c->add_option("--max-len", max_len, lm ? "Tokens to generate (default 100)" : "Longest output in tokens (default: 2 x source + 10)")
        ->transform(whole(1, 1 << 20));
    c->add_flag("--sample", sample, "Sample instead of taking the most probable token (no beam search)");
    sampling_opts.push_back(
        c->add_option("--temperature", temperature, "Sampling temperature (default 1)")->transform(finite(1e-4, 100)));
    sampling_opts.push_back(
        c->add_option("--top-k", top_k, "Sample from the k most probable tokens only")->transform(whole(0, 1 << 30)));
    sampling_opts.push_back(c->add_option("--top-p", top_p, "Sample from the smallest set with probability >= p")
                                ->transform(finite(1e-6, 1)));
    repetition_opt = c->add_option("--repetition-penalty", repetition_penalty,
                                   "Penalise tokens already present (1: off; greedy and sampling)")
                         ->transform(finite(0.01, 100));
    sampling_opts.push_back(
        c->add_option("--seed", seed, "Sampling seed: the same seed gives the same text")->transform(seed_number()));
    c->add_option("--attention-map", attention_map,
                  lm ? "Write the self-attention of --layer/--head over prompt and output as SVG"
                     : "Write the cross-attention of --layer/--head for the first input as an SVG heatmap");
    layer_opt = c->add_option("--layer", layer, "Attention map layer (default -1: the last)")->transform(whole(-4096, 4096));
    head_opt = c->add_option("--head", head, "Attention map head (default 0)")->transform(whole(0, 4096));
    c->add_option("--dtype", dtype, kDtypeHelp);
  }
  // --dtype: the model's projection matrices packed as they load (checked before loading).
  std::optional<WType> weight_type() const { return dtype_of(dtype); }
  // Settles the beam and refuses options that would be silently ignored: sampling draws one
  // token at a time, so --sample turns the default beam off and refuses an explicit --beam N > 1;
  // the sampling options need --sample; beam search ranks by --length-penalty and applies no
  // --repetition-penalty.
  void resolve() {
    (void)weight_type();
    if (sample) {
      check(beam_opt->count() == 0 || beam == 1, "--sample and --beam ", beam,
            " exclude each other: sampling draws one token at a time, beam search keeps the most probable "
            "continuations (use --beam 1 with --sample, or leave --sample out)");
      beam = 1;
    } else {
      for (const CLI::Option* o : sampling_opts)
        check(o->count() == 0, o->get_name(), " applies to sampling only: add --sample");
    }
    check(beam == 1 || repetition_opt->count() == 0,
          "--repetition-penalty applies to greedy decoding and sampling, not to beam search (--beam ", beam, ")");
    check(beam > 1 || length_penalty_opt->count() == 0, "--length-penalty ranks the hypotheses of beam search: give --beam N >= 2");
    check(!attention_map.empty() || (layer_opt->count() == 0 && head_opt->count() == 0),
          "--layer and --head choose the attention of --attention-map FILE.svg: give it too");
  }
  // eval of a language model or classifier decodes nothing: a decoding option given there would
  // be ignored, so it is refused.
  void refuse_for(const char* what) const {
    for (const char* name : {"--beam", "--length-penalty", "--max-len", "--sample", "--temperature", "--top-k", "--top-p",
                             "--repetition-penalty", "--seed", "--attention-map", "--layer", "--head", "--batch"})
      check(app->get_option(name)->count() == 0, name, " applies to decoding translations; this is ", what, " model");
  }
  // --layer and --head against the model: `layers` of the attention drawn (decoder layers), n_heads.
  void check_map(int64_t layers, int64_t heads) const {
    if (attention_map.empty()) return;
    check(layer >= -layers && layer < layers, "--layer ", layer, ": the model has ", layers,
          " layers with this attention (give 0 .. ", layers - 1, ", or -1 .. -", layers, " from the last)");
    check(head < heads, "--head ", head, ": the model has ", heads, " heads (give 0 .. ", heads - 1, ")");
  }
  GenerateConfig config(int64_t max_new) const {
    GenerateConfig g;
    g.max_new_tokens = max_new;
    g.beam_size = beam;
    g.length_penalty = length_penalty;
    g.sampling.greedy = !sample;
    g.sampling.temperature = static_cast<float>(temperature);
    g.sampling.top_k = top_k;
    g.sampling.top_p = static_cast<float>(top_p);
    g.sampling.repetition_penalty = static_cast<float>(repetition_penalty);
    g.sampling.seed = seed;
    g.attention_layer = layer;
    g.attention_head = head;
    return g;
  }
};

// Decoding errors are about the model (non-finite logits, an attention layer it lacks): the
// message names it.
template <class F>
auto naming_model(const std::string& dir, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(detail::concat("--model ", dir, ": ", e.what()));
  }
}

std::vector<std::string> pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<std::string> p;
  for (int32_t id : ids) p.push_back(tok.piece(id));
  return p;
}

// Translations of `sources`, in batches. `first_map` gets the first sentence's cross-attention.
// A line with no tokens (an empty line) translates to an empty line, keeping the lines aligned.
std::vector<std::string> translate_all(const Loaded& L, const std::vector<std::string>& sources,
                                       const DecodeOptions& d, Generation* first_map,
                                       std::vector<int32_t>* first_src, Progress* bar) {
  std::vector<std::string> out(sources.size());
  const ModelConfig& mc = L.model.config();
  d.check_map(mc.n_decoder_layers, mc.n_heads);
  // ids <- each line's tokens + eos (or the tokenizer's own special tokens: Marian's </s>);
  // lines with no tokens stay empty and are not decoded
  std::vector<std::vector<int32_t>> ids(sources.size());
  std::vector<size_t> rows;  // the lines that have tokens
  for (size_t i = 0; i < sources.size(); ++i) {
    ids[i] = L.tok->encode(sources[i]);
    if (ids[i].empty()) continue;
    ids[i] = source_ids(*L.tok, std::move(ids[i]));
    rows.push_back(i);
  }
  int64_t cut = 0, cut_at = 0;  // translations stopped by the learned positions, not by eos
  for (size_t b0 = 0; b0 < rows.size(); b0 += static_cast<size_t>(d.batch)) {
    const size_t b1 = std::min(rows.size(), b0 + static_cast<size_t>(d.batch));
    std::vector<std::vector<int32_t>> src;
    int64_t longest = 0;
    for (size_t k = b0; k < b1; ++k) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(ids[rows[k]].size()));
      src.push_back(ids[rows[k]]);
    }
    const int64_t want = d.max_len > 0 ? d.max_len : 2 * longest + 10;
    GenerateConfig g = d.config(want);
    g.sampling.vocab_limit = L.tok->vocab_size();  // never an id the tokenizer cannot decode
    if (mc.positional == Positional::Learned) g.max_new_tokens = std::min(g.max_new_tokens, mc.max_len);
    g.capture_attention = b0 == 0 && first_map != nullptr;  // the first line that has tokens
    if (g.capture_attention) g.beam_search = g.beam_size > 1;
    const std::vector<Generation> gen = naming_model(L.dir, [&] { return translate(L.model, src, g); });
    for (size_t k = b0; k < b1; ++k) {
      const Generation& r = gen[k - b0];
      if (!r.finished && g.max_new_tokens < want && static_cast<int64_t>(r.tokens.size()) == g.max_new_tokens)
        ++cut, cut_at = g.max_new_tokens;
      out[rows[k]] = output_text(*L.tok, r.tokens);
    }
    if (g.capture_attention) {
      *first_map = gen[0];
      *first_src = src[0];
    }
    if (bar) bar->update(static_cast<double>(b1) / static_cast<double>(rows.size()),
                         std::to_string(b1) + "/" + std::to_string(rows.size()) + " sentences");
  }
  if (cut > 0)
    std::fprintf(stderr, "qkv: %lld translation%s stopped at %lld tokens, the end of the model's learned positions "
                 "(max_len %lld), before an end-of-sequence\n",
                 static_cast<long long>(cut), cut == 1 ? "" : "s", static_cast<long long>(cut_at),
                 static_cast<long long>(mc.max_len));
  return out;
}

void write_map(const std::string& path, const Generation& g, const std::vector<std::string>& rows,
               const std::vector<std::string>& cols, const std::string& title) {
  check(g.attention_rows > 0, "--attention-map ", path, ": nothing to draw (no input line has any tokens)");
  // rows: the generated (or fed) tokens; columns: this input's own tokens (a batch pads the
  // others' to its longest, and padding gets no weight)
  const int64_t R = std::min<int64_t>(g.attention_rows, static_cast<int64_t>(rows.size()));
  const int64_t C = std::min<int64_t>(g.attention_cols, static_cast<int64_t>(cols.size()));
  std::vector<float> w(static_cast<size_t>(R * C));
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) w[i * C + j] = g.attention[i * g.attention_cols + j];
  const std::vector<std::string> r(rows.begin(), rows.begin() + R), c(cols.begin(), cols.begin() + C);
  viz::write_svg(path, viz::heatmap_svg(w.data(), R, C, r, c, title));
  std::fprintf(stderr, "qkv: attention map (%lld x %lld) written to %s\n", static_cast<long long>(R),
               static_cast<long long>(C), path.c_str());
}

std::string map_title(const char* kind, const DecodeOptions& d, int64_t layers) {
  const int64_t layer = d.layer < 0 ? layers + d.layer : d.layer;
  return std::string(kind) + " attention, layer " + std::to_string(layer) + ", head " + std::to_string(d.head) +
         " (one head of one layer: a hint of what the model used, not an explanation)";
}

}  // namespace

Runner add_translate(CLI::App& app) {
  struct O {
    std::string model, input;
    DecodeOptions d;
  };
  auto o = std::make_shared<O>();
  CLI::App* c = app.add_subcommand("translate", "Translate lines (stdin or --input) with a model from qkv train --task translate");
  c->add_option("--model", o->model, "Model directory")->required();
  c->add_option("--input", o->input, "Source sentences, one per line (default: standard input)")->check(CLI::ExistingFile);
  c->add_option("--batch", o->d.batch, "Sentences per batch (default 16)")->transform(whole(1, 4096));
  o->d.add(c, false);
  return [o] {
    o->d.resolve();
    Loaded L = load_model_dir(o->model, Task::Translate, "translate", o->d.dtype);
    const std::vector<std::string> lines = input_lines(o->input);
    Generation map;
    std::vector<int32_t> src0;
    Progress bar(10);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> out =
        translate_all(L, lines, o->d, o->d.attention_map.empty() ? nullptr : &map, &src0, lines.size() > 64 ? &bar : nullptr);
    bar.finish();
    for (const std::string& s : out) std::printf("%s\n", s.c_str());
    if (lines.size() > 64)
      std::fprintf(stderr, "qkv translate: %zu sentences in %s\n", lines.size(),
                   fmt_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).c_str());
    if (!o->d.attention_map.empty() && !lines.empty())
      write_map(o->d.attention_map, map, pieces(*L.tok, map.tokens), pieces(*L.tok, src0),
                map_title("cross", o->d, L.model.config().n_decoder_layers));
    return 0;
  };
}

Runner add_generate(CLI::App& app) {
  struct O {
    std::string model, prompt;
    int64_t n = 1;
    DecodeOptions d;
  };
  auto o = std::make_shared<O>();
  o->d.beam = 1;
  CLI::App* c = app.add_subcommand("generate", "Continue a prompt with a model from qkv train --task lm");
  c->add_option("--model", o->model, "Model directory")->required();
  c->add_option("--prompt", o->prompt, "The text to continue")->required();
  c->add_option("-n,--num", o->n,
                "Continuations to write: with --sample different samples, with --beam N the n best (n <= N)")
      ->transform(whole(1, 1000));
  o->d.add(c, true);
  return [o] {
    o->d.resolve();
    const int64_t n = o->n, beam = o->d.beam;
    check(n == 1 || o->d.sample || beam >= n, "-n ", n,
          beam > 1 ? detail::concat(" with --beam ", beam, ": beam search returns at most its ", beam,
                                    " best continuations (give -n <= --beam)")
                   : std::string(" without --sample: greedy decoding has one continuation (add --sample for "
                                 "different samples, or --beam N >= -n for the N best)"));
    Loaded L = load_model_dir(o->model, Task::LanguageModel, "generate", o->d.dtype);
    const ModelConfig& mc = L.model.config();
    o->d.check_map(mc.n_layers, mc.n_heads);
    std::vector<int32_t> prompt = prompt_ids(*L.tok, checked_text(o->prompt, "--prompt"));
    const int64_t want = o->d.max_len > 0 ? o->d.max_len : 100;
    int64_t max_new = want;
    if (mc.positional == Positional::Learned) {
      // learned positions end at max_len: the prompt and its continuation must fit the table
      const int64_t room = mc.max_len - static_cast<int64_t>(prompt.size()) + 1;
      check(room >= 1, "--prompt: ", prompt.size(), " tokens do not fit the model's max_len ", mc.max_len,
            " (its learned positions)");
      max_new = std::min(max_new, room);
    }
    GenerateConfig g = o->d.config(max_new);
    g.sampling.vocab_limit = L.tok->vocab_size();  // never an id the tokenizer cannot decode
    g.capture_attention = !o->d.attention_map.empty();
    if (g.capture_attention) g.beam_search = g.beam_size > 1;
    if (beam > 1) g.num_return = n;
    const std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o->d.sample ? n : 1), prompt);
    const std::vector<Generation> out = naming_model(L.dir, [&] { return generate(L.model, prompts, g); });
    int64_t cut = 0;
    for (const Generation& gen : out)
      cut += !gen.finished && max_new < want && static_cast<int64_t>(gen.tokens.size()) == max_new;
    if (cut > 0)
      std::fprintf(stderr, "qkv: generate stopped after %lld new tokens at the end of the model's learned positions "
                   "(max_len %lld, the prompt included), short of --max-len %lld\n",
                   static_cast<long long>(max_new), static_cast<long long>(mc.max_len), static_cast<long long>(want));
    for (const Generation& gen : out) {
      // prompt and continuation decoded together: a tokenizer may mark word starts on the
      // token that follows (SentencePiece's "▁"), which a separate decode would drop
      std::vector<int32_t> t = prompt;
      t.insert(t.end(), gen.tokens.begin(), gen.tokens.end());
      std::printf("%s\n", output_text(*L.tok, std::move(t)).c_str());
    }
    if (g.capture_attention) {
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), out[0].tokens.begin(), out[0].tokens.end());
      const std::vector<std::string> p = pieces(*L.tok, all);
      write_map(o->d.attention_map, out[0], p, p, map_title("self", o->d, mc.n_layers));
    }
    return 0;
  };
}

Runner add_classify(CLI::App& app) {
  struct O {
    std::string model, input, dtype;
  };
  auto o = std::make_shared<O>();
  CLI::App* c = app.add_subcommand("classify", "Label lines (stdin or --input) with a model from qkv train --task classify");
  c->add_option("--model", o->model, "Model directory")->required();
  c->add_option("--input", o->input, "Texts, one per line (default: standard input)")->check(CLI::ExistingFile);
  c->add_option("--dtype", o->dtype, kDtypeHelp);
  return [o] {
    (void)dtype_of(o->dtype);
    Loaded L = load_model_dir(o->model, Task::Classify, "classify", o->dtype);
    for (const std::string& line : input_lines(o->input)) {
      const Tensor z = logits_of(L.model, classifier_ids(*L.tok, line, L.info.max_len));
      const int64_t C = z.size(-1);
      const float* p = z.data<float>();
      for (int64_t k = 0; k < C; ++k)
        check(std::isfinite(p[k]), "--model ", L.dir, ": the model's logits are not finite (class ", k, " is ", p[k],
              " for the line '", line, "'): its weights hold NaN or infinity, or its activations overflow");
      const int64_t best = std::max_element(p, p + C) - p;
      double s = 0;
      for (int64_t k = 0; k < C; ++k) s += std::exp(static_cast<double>(p[k] - p[best]));
      std::printf("%s\t%.3f\t%s\n", L.info.labels.at(static_cast<size_t>(best)).c_str(), 1.0 / s, line.c_str());
    }
    return 0;
  };
}

Runner add_fill_mask(CLI::App& app) {
  struct O {
    std::string model, text;
    int64_t top_k = 5;
    bool json = false;
    std::string dtype;
  };
  auto o = std::make_shared<O>();
  CLI::App* c = app.add_subcommand(
      "fill-mask", "The most probable tokens for each mask token of a text, with a masked-language model (BERT)");
  c->add_option("--model", o->model, "A masked-language model: a Hugging Face BertForMaskedLM folder, or qkv's encoder-mlm")
      ->required();
  c->add_option("--text", o->text, "The text, with the tokenizer's mask token ([MASK]) (default: standard input, line by line)");
  c->add_option("--top-k", o->top_k, "Tokens to show per mask (default 5)")->transform(whole(1, 1000));
  c->add_flag("--json", o->json, "One JSON object per text: for each mask, the tokens with id, logit and probability");
  c->add_option("--dtype", o->dtype, kDtypeHelp);
  return [o] {
    (void)dtype_of(o->dtype);
    check(fs::is_directory(o->model), "--model ", o->model, ": not a directory");
    Model m = load_model(o->model, o->dtype);
    const ModelConfig& mc = m.config();
    check(mc.arch == Arch::EncoderMLM, "--model ", o->model, ": its architecture is ", arch_name(mc.arch),
          "; fill-mask needs a masked-language model (encoder-mlm: BertForMaskedLM)");
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(o->model);
    check(tok->vocab_size() <= mc.vocab_size, "--model ", o->model, ": the tokenizer's vocabulary (", tok->vocab_size(),
          ") is larger than config.json's vocab_size (", mc.vocab_size, ")");
    const int32_t mask = tok->mask_id();
    check(mask >= 0, "--model ", o->model, ": the tokenizer has no mask token (expected [MASK] or a mask_token in "
          "tokenizer_config.json)");
    std::vector<std::string> lines;
    if (!o->text.empty()) lines.push_back(checked_text(o->text, "--text"));
    else lines = input_lines("");
    const int64_t limit = mc.positional == Positional::Learned ? mc.max_len : 0;
    for (const std::string& line : lines) {
      const std::vector<int32_t> ids = encode_input(*tok, line, limit);
      std::vector<size_t> at;
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == mask) at.push_back(i);
      check(!at.empty(), "'", line, "': no mask token ", tok->piece(mask), " in the text",
            limit > 0 ? detail::concat(" (or not within the model's ", limit, " positions)") : std::string());
      const Tensor z = logits_of(m, ids);  // (1, T, V)
      const std::vector<std::vector<TokenChoice>> top = top_tokens(z, at, o->top_k, "--model " + o->model);
      nlohmann::json masks = nlohmann::json::array();
      if (!o->json) std::printf("%s\n", line.c_str());
      for (size_t k = 0; k < at.size(); ++k) {
        nlohmann::json cands = nlohmann::json::array();
        if (!o->json && at.size() > 1) std::printf("  mask %zu of %zu (token %zu):\n", k + 1, at.size(), at[k]);
        for (size_t r = 0; r < top[k].size(); ++r) {
          const auto [id, logit, p] = top[k][r];
          // the token as text, and the text with this mask filled (as the pipeline shows them)
          const std::string word = id < tok->vocab_size() ? tok->decode({id}) : "<id " + std::to_string(id) + ">";
          std::vector<int32_t> filled = ids;
          filled[at[k]] = id < tok->vocab_size() ? id : mask;
          const std::string seq = tok->decode(filled);
          if (o->json) {
            cands.push_back({{"id", id}, {"token", word}, {"logit", logit}, {"prob", p}, {"sequence", seq}});
          } else {
            std::printf("  %2lld  %.4f  %-16s  %s\n", static_cast<long long>(r + 1), p, word.c_str(), seq.c_str());
          }
        }
        masks.push_back({{"position", at[k]}, {"top", cands}});
      }
      if (o->json) {
        const nlohmann::json j = {{"text", line}, {"ids", ids}, {"masks", masks}};
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      }
    }
    return 0;
  };
}

Runner add_eval(CLI::App& app) {
  struct O {
    std::string model, data, hyp_out;
    int64_t limit = 0, max_tokens = 4096;
    DecodeOptions d;
  };
  auto o = std::make_shared<O>();
  CLI::App* c = app.add_subcommand(
      "eval", "Score a model on held-out data: BLEU and chrF (translate), perplexity (lm), accuracy (classify)");
  c->add_option("--model", o->model, "Model directory")->required();
  c->add_option("--data", o->data, "The task's data file (default: the model directory's test split)");
  c->add_option("--limit", o->limit, "Score only the first N records")->transform(whole(1, 1 << 30));
  CLI::Option* hyp_out = c->add_option("--hyp-out", o->hyp_out, "translate: also write the translations here");
  CLI::Option* max_tokens =
      c->add_option("--max-tokens", o->max_tokens, "lm, classify: tokens per batch when scoring (default 4096)")
          ->transform(whole(1, 1 << 24));
  c->add_option("--batch", o->d.batch, "translate: sentences per batch (default 16)")->transform(whole(1, 4096));
  o->d.add(c, false);
  return [o, hyp_out, max_tokens] {
    const TaskInfo info = model_task_info(o->model);
    if (info.task == Task::Translate) {
      o->d.resolve();
      check(max_tokens->count() == 0, "--max-tokens batches the scoring of language models and classifiers; "
            "translations are decoded --batch sentences at a time");
    } else {
      o->d.refuse_for(info.task == Task::LanguageModel ? "a language" : "a classification");
      check(hyp_out->count() == 0, "--hyp-out writes translations; this is not a translation model");
    }
    (void)o->d.weight_type();
    Loaded L = load_model_dir(o->model, info.task, "eval", o->d.dtype);
    std::string data = o->data;
    if (data.empty()) {
      data = o->model + (info.task == Task::LanguageModel ? "/test.txt" : "/test.tsv");
      check(fs::exists(data), "--model ", o->model, " has no held-out test split (", data,
            " is missing: trained with --test-fraction 0?); give --data FILE");
    }
    RawData raw = read_task_data(info.task, data, "", "");
    // the file as read, then what --limit keeps of it
    std::string summary = raw.report.summary(data);
    if (o->limit > 0 && raw.size() > o->limit) {
      std::vector<int64_t> idx(static_cast<size_t>(o->limit));
      for (int64_t i = 0; i < o->limit; ++i) idx[i] = i;
      raw = subset(raw, idx);
      summary += detail::concat("; scoring the first ", o->limit, " (--limit)");
    }
    std::fprintf(stderr, "qkv eval: %s\n", summary.c_str());
    if (info.task == Task::Translate) {
      std::vector<std::string> src, ref;
      for (const TextPair& p : raw.pairs) src.push_back(p.source), ref.push_back(p.target);
      Progress bar(10);
      Generation map;
      std::vector<int32_t> src0;
      const std::vector<std::string> hyp =
          translate_all(L, src, o->d, o->d.attention_map.empty() ? nullptr : &map, &src0, &bar);
      bar.finish();
      if (!o->hyp_out.empty()) {
        std::string s;
        for (const auto& h : hyp) s += h + "\n";
        write_file_atomic(o->hyp_out, s);
      }
      const BleuResult bleu = corpus_bleu(hyp, ref);
      const ChrfResult chrf = corpus_chrf(hyp, ref);
      std::printf("%s\n%s\n", bleu.str().c_str(), chrf.str().c_str());
      std::printf("qkv eval: %zu sentences, BLEU %.2f, chrF %.2f (%s)\n", hyp.size(), bleu.score, chrf.score,
                  bleu.signature().c_str());
      if (!o->d.attention_map.empty() && !src.empty())
        write_map(o->d.attention_map, map, pieces(*L.tok, map.tokens), pieces(*L.tok, src0),
                  map_title("cross", o->d, L.model.config().n_decoder_layers));
      return 0;
    }
    const int64_t max_len = info.task == Task::LanguageModel ? L.model.config().max_len : info.max_len;
    const Encoded enc = encode_task(info.task, raw, *L.tok, info.task == Task::LanguageModel ? info.max_len : max_len,
                                    info.labels);
    const EvalResult r = evaluate(L.model, info.task, enc.examples, o->max_tokens);
    check(std::isfinite(r.loss), "--model ", o->model, ": the model's loss on ", data, " is ", r.loss,
          ": its weights hold NaN or infinity, or its activations overflow");
    if (info.task == Task::LanguageModel) {
      std::printf("qkv eval: %lld tokens, loss %.4f nats/token, perplexity %s, next-token accuracy %.1f%%\n",
                  static_cast<long long>(r.count), r.loss, fmt_perplexity(r.loss).c_str(), 100 * r.accuracy);
    } else {
      std::printf("qkv eval: %lld examples, accuracy %.2f%%, loss %.4f\n", static_cast<long long>(r.count),
                  100 * r.accuracy, r.loss);
    }
    return 0;
  };
}

Runner add_tokenize(CLI::App& app) {
  struct O {
    std::string model, text;
    bool ids_only = false, special = false, json = false;
  };
  auto o = std::make_shared<O>();
  CLI::App* c = app.add_subcommand("tokenize", "Show how a model's tokenizer splits text: id and piece per token");
  c->add_option("--model", o->model,
                "A model or tokenizer directory: qkv's (qkv_tokenizer.json) or a Hugging Face folder")
      ->required();
  c->add_option("--text", o->text, "The text (default: standard input, line by line)");
  c->add_flag("--ids", o->ids_only, "Print only the ids, space-separated");
  c->add_flag("--special", o->special,
              "Add the special tokens the tokenizer puts around a model's input ([CLS] ... [SEP], <s> ...)");
  c->add_flag("--json", o->json,
              "JSON Lines: each input line a JSON string (so texts may hold newlines); each output line "
              "{\"ids\", \"pieces\", \"decoded\"}, the ids decoded back to text");
  return [o] {
    check(!(o->ids_only && o->json), "--ids and --json exclude each other");
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(o->model);
    std::vector<std::string> lines;
    if (!o->text.empty()) {
      lines.push_back(checked_text(o->text, "--text"));
    } else {
      lines = input_lines("");
    }
    if (o->json && o->text.empty()) {
      for (size_t i = 0; i < lines.size(); ++i) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(lines[i]);
        } catch (const nlohmann::json::exception& e) {
          fail("standard input, line ", i + 1, ": not JSON (", e.what(), "); --json reads one JSON string per line");
        }
        check(j.is_string(), "standard input, line ", i + 1, ": ", j.type_name(),
              " (--json reads one JSON string per line)");
        lines[i] = checked_text(j.get<std::string>(), "--json input");
      }
    }
    for (const std::string& l : lines) {
      std::vector<int32_t> ids = tok->encode(l);
      if (o->special) ids = tok->with_special_tokens(ids);
      if (o->json) {
        nlohmann::json j = {{"ids", ids}, {"pieces", pieces(*tok, ids)}, {"decoded", tok->decode(ids)}};
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        continue;
      }
      if (o->ids_only) {
        for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
        std::printf("\n");
        continue;
      }
      std::printf("%zu tokens:", ids.size());
      for (int32_t id : ids) std::printf(" %d:%s", id, tok->piece(id).c_str());
      std::printf("\n");
    }
    return 0;
  };
}

}  // namespace qkv::cli
