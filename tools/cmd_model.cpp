// qkv init / import / forward / fit: build a model directory, load PyTorch weights, check a
// model's outputs and gradients from outside, and fit one batch of .npy ids.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "task_util.h"
#include "qkv/qkv.h"
#include "text/hf_export.h"

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;

void make_dir(const std::string& dir, const char* flag) {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error(detail::concat(flag, " ", dir, ": cannot create the directory: ", std::strerror(errno)));
  check(fs::is_directory(dir), flag, " ", dir, ": exists and is not a directory");
}

// Ids from .npy: int32 or int64 (int64 from float arrays holding whole numbers is not guessed).
Tensor read_ids(const std::string& path, const char* flag) {
  Tensor t = read_npy(path);
  check(t.dtype() == DType::I64 || t.dtype() == DType::I32, flag, " ", path,
        ": expected an int32 or int64 array of token ids, got ", t.describe());
  return t;
}

struct BatchFiles {
  std::string input, lengths, decoder_input, target;
  void add(CLI::App* c, bool target_required) {
    c->add_option("--input", input, "Token ids .npy (B, T): the tokens, or the source of an encoder-decoder")
        ->required()
        ->check(CLI::ExistingFile);
    c->add_option("--lengths", lengths, "Real lengths .npy (B) of right-padded rows (default: from pad_id)")
        ->check(CLI::ExistingFile);
    c->add_option("--decoder-input", decoder_input,
                  "Encoder-decoder: decoder input ids .npy (B, T') (default: --target shifted right after bos_id)")
        ->check(CLI::ExistingFile);
    auto* t = c->add_option("--target", target, "Targets .npy: next tokens (B, T) / (B, T'), or labels (B)")
                  ->check(CLI::ExistingFile);
    if (target_required) t->required();
  }
  Batch load(const Model& m) const {
    Batch b;
    b.input = read_ids(input, "--input");
    if (!lengths.empty()) b.input_lengths = read_ids(lengths, "--lengths");
    if (!decoder_input.empty()) b.decoder_input = read_ids(decoder_input, "--decoder-input");
    if (!target.empty()) b.target = read_ids(target, "--target");
    if (m.config().arch == Arch::EncoderDecoder && !b.decoder_input.defined()) {
      check(b.target.defined() && m.config().bos_id >= 0,
            "an encoder-decoder model needs --decoder-input, or --target and a bos_id in config.json (the "
            "decoder input is then the target shifted right)");
      b.decoder_input = shift_right(b.target, m.config().bos_id);
    }
    BatchNames names;
    names.input = "--input " + input;
    names.input_lengths = "--lengths " + lengths;
    names.decoder_input = decoder_input.empty() ? "the decoder input (--target " + target + " shifted right)"
                                                : "--decoder-input " + decoder_input;
    names.target = "--target " + target;
    m.check_batch(b, names);
    return b;
  }
};

// ---- init ----------------------------------------------------------------------------------------

struct InitOptions {
  std::string config, out;
  uint64_t seed = 0;
};

// A model built from --config FILE: the file's own errors name it, and so do the model's (a
// config too large for this machine's memory).
Model model_from_config(const std::string& path) {
  const ModelConfig cfg = ModelConfig::load(path);
  try {
    return Model(cfg);
  } catch (const Error& e) {
    throw Error(detail::concat(path, ": ", e.what()));
  }
}

int run_init(const InitOptions& o) {
  Model m = model_from_config(o.config);
  m.init(o.seed);
  make_dir(o.out, "--out");
  m.save(o.out);
  std::cout << "wrote " << o.out << ": " << arch_name(m.config().arch) << ", " << m.num_parameters()
            << " parameters in " << m.parameters().size() << " tensors (seed " << o.seed << ")\n";
  return 0;
}

// ---- import --------------------------------------------------------------------------------------

struct ImportOptions {
  std::string config, weights, out;
  bool allow_missing = false;
  uint64_t seed = 0;
};

int run_import(const ImportOptions& o) {
  Model m = model_from_config(o.config);
  m.init(o.seed);  // what --allow-missing leaves in place
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (fs::is_directory(o.weights)) {
    for (const auto& e : fs::directory_iterator(o.weights)) {
      if (!e.is_regular_file() || e.path().extension() != ".npy") continue;
      tensors.emplace_back(e.path().stem().string(), read_npy(e.path().string()));
    }
    check(!tensors.empty(), "--weights ", o.weights, ": no .npy files in the directory");
  } else {
    tensors = read_safetensors(o.weights).tensors;
  }
  try {
    m.load_state_dict(tensors, o.allow_missing);
  } catch (const Error& e) {
    throw Error(detail::concat("--weights ", o.weights, ": ", e.what()));
  }
  make_dir(o.out, "--out");
  m.save(o.out);
  std::cout << "imported " << tensors.size() << " tensors into " << o.out << " (" << arch_name(m.config().arch) << ", "
            << m.num_parameters() << " parameters)\n";
  return 0;
}

// ---- forward -------------------------------------------------------------------------------------

struct ForwardCmd {
  std::string model, out, grads, generated, attention, dtype, precision = "f32";
  BatchFiles batch;
  float label_smoothing = 0;
  int64_t generate = 0;
};

// Greedy decoding with the key/value cache from the batch's ids: each row of --input (up to its
// length) continued, or, for an encoder-decoder, translated. (B, n) int64, -1 after an eos.
Tensor greedy_tokens(const Model& m, const Batch& b, int64_t n) {
  const Tensor ids = ops::as_ids(b.input, "--input");
  const Tensor len = b.input_lengths.defined() ? ops::as_ids(b.input_lengths, "--lengths") : m.lengths_of(ids);
  const int64_t B = ids.size(0), T = ids.size(1);
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < len.data<int64_t>()[r]; ++i) rows[r].push_back(static_cast<int32_t>(ids.data<int64_t>()[r * T + i]));
  GenerateConfig g;
  g.max_new_tokens = n;
  const std::vector<Generation> out =
      m.config().arch == Arch::EncoderDecoder ? translate(m, rows, g) : generate(m, rows, g);
  Tensor t({B, n}, DType::I64);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < n; ++i)
      t.data<int64_t>()[r * n + i] = i < static_cast<int64_t>(out[r].tokens.size()) ? out[r].tokens[i] : -1;
  return t;
}

// Every attention module's weights on the batch, (B, H, Tq, Tk) each, named
// <stack>.<layer>.<self|cross>.npy; recomputed from the flash kernel's logsumexp head by head.
std::vector<std::pair<std::string, Tensor>> attention_arrays(const Model& m, const Batch& b) {
  const AttentionTrace t = trace_attention(m, b);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const AttentionMap& a : t.maps) {
    const int64_t B = a.q.size(0), H = a.heads(), R = a.rows(), C = a.cols();
    Tensor w = Tensor::empty({B, H, R, C});
    for (int64_t r = 0; r < B; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const std::vector<float> x = a.weights(r, h, 0, R);
        std::copy(x.begin(), x.end(), w.data<float>() + (r * H + h) * R * C);
      }
    out.emplace_back(detail::concat(a.stack, ".", a.layer, ".", a.kind, ".npy"), std::move(w));
  }
  return out;
}

int run_forward(const ForwardCmd& o) {
  const std::optional<WType> dtype = dtype_of(o.dtype);
  check(o.grads.empty() || !dtype || *dtype == WType::F32, "--grads and --dtype ", o.dtype,
        " exclude each other: packed weights are for inference and take no gradient");
  Model m = load_model(o.model, o.dtype);
  check(o.grads.empty() || m.weight_type() == WType::F32, "--grads: ", o.model, " holds weights packed to ",
        wtype_name(m.weight_type()), " (qkv quantize), which are for inference and take no gradient");
  const Batch b = o.batch.load(m);
  check(o.grads.empty() || b.target.defined(), "--grads needs --target (gradients of the loss)");
  if (!o.out.empty()) check(fs::is_directory(fs::absolute(o.out).parent_path()), "--out ", o.out,
                            ": the directory does not exist");
  if (!o.grads.empty()) make_dir(o.grads, "--grads");
  if (!o.attention.empty()) make_dir(o.attention, "--attention");
  check((o.generate > 0) == !o.generated.empty(), "--generate N and --generated FILE go together");
  check(o.generate == 0 || m.config().arch != Arch::EncoderClassifier, "--generate: ", o.model,
        " is a classifier; it generates nothing");
  if (!o.generated.empty()) check(fs::is_directory(fs::absolute(o.generated).parent_path()), "--generated ",
                                  o.generated, ": the directory does not exist");
  check(o.precision == "f32" || m.weight_type() == WType::F32, "--precision ", o.precision, " is for float32 weights: ",
        o.model, " holds weights packed to ", wtype_name(m.weight_type()), " (their products have their own arithmetic)");
  // --precision bf16: the logits and the gradients as a training step of qkv train --precision bf16
  // computes them
  std::optional<Bf16Matmul> bf16;
  if (parse_precision(o.precision, "--precision") == Precision::BF16) bf16.emplace();
  Tape tape;
  tape.recording = !o.grads.empty();
  Var logits = m.logits(tape, b);
  // everything is computed before anything is printed or written, so an error leaves no half line
  std::string line = "logits " + shape_str(logits->value.shape());
  if (b.target.defined()) {
    int64_t counted = 0;
    Var loss = m.loss(tape, logits, b, o.label_smoothing, &counted);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(loss->value.data<float>()[0]));
    line += detail::concat("  loss ", buf, " over ", counted, " targets");
    if (!o.grads.empty()) {
      tape.backward(loss);
      for (const Parameter& p : m.parameters())
        write_npy(o.grads + "/" + p.name + ".npy", p.var->has_grad ? p.var->grad : Tensor(p.var->value.shape(), DType::F32));
    }
  }
  Tensor generated;
  if (o.generate > 0) {
    generated = greedy_tokens(m, b, o.generate);
    line += detail::concat("  generated ", shape_str(generated.shape()));
  }
  std::vector<std::pair<std::string, Tensor>> maps;
  if (!o.attention.empty()) {
    maps = attention_arrays(m, b);
    line += detail::concat("  attention ", maps.size(), " maps");
  }
  if (bf16) line += bf16_attention_native() ? "  (bf16 products: linear layers and attention)"
                                             : "  (bf16 products: linear layers; attention float32: no AVX512_BF16 in use)";
  if (!o.out.empty()) write_npy(o.out, logits->value);
  if (generated.defined()) write_npy(o.generated, generated);
  for (const auto& [name, t] : maps) write_npy(o.attention + "/" + name, t);
  std::cout << line << "\n";
  return 0;
}

// ---- export ------------------------------------------------------------------------------------

// The model's tokenizer, or nullptr with why in *why (a model without one still exports).
std::unique_ptr<Tokenizer> tokenizer_if_any(const std::string& model, std::string* why) {
  try {
    return load_tokenizer(model);
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

struct ExportCmd {
  std::string model, format = "hf", out;
};

int run_export(const ExportCmd& o) {
  check(o.format == "hf" || o.format == "gguf", "--format ", o.format,
        ": expected hf (a Hugging Face folder) or gguf (a llama.cpp file)");
  if (o.format == "gguf") {
    check(fs::absolute(o.out) != fs::absolute(o.model), "--out ", o.out, ": is the model itself");
    const fs::path parent = fs::absolute(o.out).parent_path();
    check(fs::is_directory(parent), "--out ", o.out, ": the directory ", parent.string(), " does not exist");
    const Model m = load_model(o.model);
    std::string note;
    const std::unique_ptr<Tokenizer> tok = tokenizer_if_any(o.model, &note);
    std::string why;
    save_gguf_model(m, tok.get(), o.out, &why);
    if (tok) note = why;
    std::cout << "exported " << o.model << " as GGUF (llama, " << wtype_name(m.weight_type()) << " weights): " << o.out
              << " (" << m.num_parameters() << " parameters)\n";
    if (!note.empty()) std::cerr << "qkv: note: no tokenizer written into the file: " << note << "\n";
    return 0;
  }
  const Model m = load_model(o.model);
  check(fs::absolute(o.out) != fs::absolute(o.model), "--out ", o.out, ": is the model directory itself");
  std::string type;
  try {
    type = hf_model_type_for(m.config());
  } catch (const Error& e) {
    throw Error(detail::concat(o.model, ": ", e.what()));
  }
  // the tokenizer, when the directory has one, read before anything is written
  std::string no_tokenizer;
  const std::unique_ptr<Tokenizer> tok = tokenizer_if_any(o.model, &no_tokenizer);
  if (tok)
    check(tok->vocab_size() <= m.config().vocab_size, o.model, ": the tokenizer's vocabulary (", tok->vocab_size(),
          ") is larger than the model's (", m.config().vocab_size, ")");
  // a classifier's class names (task.json's labels, or a Hugging Face folder's id2label) become
  // id2label; a classifier without them (qkv init) exports LABEL_0, LABEL_1, ...
  std::vector<std::string> labels;
  std::error_code ec;
  if (m.config().arch == Arch::EncoderClassifier &&
      (fs::exists(o.model + "/task.json", ec) || is_hf_model_dir(o.model))) {
    const TaskInfo info = model_task_info(o.model);
    check(info.task == Task::Classify && static_cast<int64_t>(info.labels.size()) == m.config().num_classes, o.model,
          ": task.json describes ", info.task == Task::Classify ? detail::concat(info.labels.size(), " labels") : "no classifier",
          ", but the model has num_classes = ", m.config().num_classes);
    labels = info.labels;
  }
  save_hf_model(m, o.out, labels);
  std::string files = "config.json, model.safetensors";
  if (tok) {
    for (const std::string& f : tok->save_hf(o.out)) files += ", " + f;
    // a translator's source ends with </s> (source_ids): Hugging Face's tokenizer(text) appends it too
    if (m.config().arch == Arch::EncoderDecoder) text::hf_sources_end_with_eos(o.out, *tok);
  }
  std::cout << "exported " << o.model << " as a Hugging Face " << type << " folder: " << o.out << "/ " << files << " ("
            << m.num_parameters() << " parameters)\n";
  if (!tok) std::cerr << "qkv: note: no tokenizer files written (" << no_tokenizer << ")\n";
  return 0;
}

// ---- quantize ----------------------------------------------------------------------------------

struct QuantizeCmd {
  std::string model, dtype, out;
};

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

int run_quantize(const QuantizeCmd& o) {
  const std::optional<WType> t = dtype_of(o.dtype);
  check(!t || *t != WType::F32, "--dtype ", o.dtype, ": quantize packs to bf16, f16, int8 (q8_0) or q4 (q4_0)");
  check(fs::is_directory(o.model) || is_gguf_file(o.model), "--model ", o.model,
        ": neither a model directory nor a GGUF file");
  check(fs::absolute(o.out).lexically_normal() != fs::absolute(o.model).lexically_normal(), "--out ", o.out,
        ": is the model directory itself");
  std::error_code ec;
  check(!fs::exists(fs::symlink_status(o.out, ec)) || fs::is_directory(fs::symlink_status(o.out, ec)), "--out ", o.out,
        ": exists and is not a directory");
  // everything read before anything is written
  Model m = load_model(o.model, o.dtype);
  // without --dtype: the packing as stored (a GGUF file's types, never re-quantised)
  check(m.weight_type() != WType::F32 || t, "--model ", o.model,
        ": its weights are float32; give --dtype bf16, f16, int8 or q4 (without it, quantize keeps a GGUF file's or "
        "a packed directory's types)");
  std::string no_tokenizer;
  const std::unique_ptr<Tokenizer> tok = tokenizer_if_any(o.model, &no_tokenizer);
  std::optional<TaskInfo> info;
  if (fs::exists(o.model + "/task.json", ec) || is_hf_model_dir(o.model)) info = model_task_info(o.model);
  double f32_bytes = 0, bytes = 0;
  for (const Parameter& p : m.parameters()) {
    const PackedWeight* w = p.var->packed.get();
    f32_bytes += 4.0 * static_cast<double>(w ? w->rows * w->cols : p.var->value.numel());
    bytes += w ? static_cast<double>(w->row_bytes) * static_cast<double>(w->rows) : 4.0 * static_cast<double>(p.var->value.numel());
  }
  fs::create_directories(o.out, ec);
  check(fs::is_directory(o.out), "--out ", o.out, ": cannot create the directory", ec ? ": " + ec.message() : "");
  m.save(o.out);
  if (tok) tok->save(o.out);
  if (info) info->save(o.out);
  // the held-out split qkv eval reads by default
  for (const char* split : {"test.txt", "test.tsv"})
    if (fs::is_regular_file(o.model + "/" + split, ec))
      write_file_atomic(o.out + "/" + split, read_file(o.model + "/" + split, split));
  std::cout << "wrote " << o.out << ": " << wtype_name(m.weight_type()) << " weights, " << mib(bytes) << " (float32: "
            << mib(f32_bytes) << "), " << m.num_parameters() << " parameters\n";
  if (!tok) std::cerr << "qkv: note: no tokenizer written (" << no_tokenizer << ")\n";
  return 0;
}

// ---- train (on one batch) ----------------------------------------------------------------------

struct TrainCmd {
  std::string model, out, losses, checkpoint, resume;
  BatchFiles batch;
  int64_t steps = 100;
  TrainConfig cfg;
  std::string schedule = "constant";
  double lr = 1e-3;
  int64_t warmup = 0, total = 0;
  double min_lr = 0;
  int64_t accumulate = 1;
  std::string precision = "f32";
};

int run_train(TrainCmd& o) {
  Model m = o.resume.empty() ? load_model(o.model) : Model(checkpoint_model_config(o.resume));
  o.cfg.schedule.kind = parse_schedule_kind(o.schedule);
  o.cfg.schedule.lr = o.lr;
  o.cfg.schedule.warmup = o.warmup;
  o.cfg.schedule.total = o.total > 0 ? o.total : o.steps;
  o.cfg.schedule.min_lr = o.min_lr;
  o.cfg.precision = parse_precision(o.precision, "--precision");
  Trainer trainer(m, o.cfg);
  // A resumed run continues with the checkpoint's own settings (schedule, AdamW, clipping, seed).
  if (!o.resume.empty()) trainer.load_checkpoint(o.resume);
  const Batch b = o.batch.load(m);
  check(b.target.defined(), "--target is required");
  if (!o.losses.empty()) check(fs::is_directory(fs::absolute(o.losses).parent_path()), "--losses ", o.losses,
                               ": the directory does not exist");
  const std::vector<Batch> micro(static_cast<size_t>(o.accumulate), b);
  std::vector<double> losses;
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = trainer.steps_done();
  for (int64_t s = 0; s < o.steps; ++s) {
    const StepReport r = trainer.step(micro);
    losses.push_back(r.loss);
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char line[256];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.6f  lr %.3g  grad_norm %.4g%s",
                  static_cast<long long>(r.step), static_cast<long long>(first + o.steps),
                  r.loss, r.lr, r.grad_norm, r.skipped ? "  SKIPPED (non-finite loss or gradient)" : "");
    if (tty) {
      const double eta = el / static_cast<double>(s + 1) * static_cast<double>(o.steps - s - 1);
      std::fprintf(stderr, "\r%s  [%.0fs, ETA %.0fs]\033[K", line, el, eta);
      if (s + 1 == o.steps || r.skipped) std::fprintf(stderr, "\n");
    }
    if (!tty || r.skipped) std::cout << line << "\n";
  }
  std::cout << "trained " << o.steps << " steps (" << trainer.skipped_steps() << " skipped); final loss "
            << (losses.empty() ? 0.0 : losses.back()) << "\n";
  if (!o.losses.empty()) write_npy(o.losses, Tensor::from<double>({static_cast<int64_t>(losses.size())}, losses));
  if (!o.checkpoint.empty()) trainer.save_checkpoint(o.checkpoint);
  if (!o.out.empty()) {
    make_dir(o.out, "--out");
    m.save(o.out);
  }
  return 0;
}

}  // namespace

Runner add_init(CLI::App& app) {
  auto o = std::make_shared<InitOptions>();
  CLI::App* c = app.add_subcommand("init", "Create a model directory (config.json + model.safetensors) with random weights");
  c->add_option("--config", o->config, "config.json describing the model (docs/formats.md)")->required()->check(CLI::ExistingFile);
  c->add_option("--out", o->out, "Model directory to write")->required();
  c->add_option("--seed", o->seed, "Initialisation seed")->transform(seed_number());
  return [o] { return run_init(*o); };
}

Runner add_import(CLI::App& app) {
  auto o = std::make_shared<ImportOptions>();
  CLI::App* c = app.add_subcommand(
      "import", "Make a model directory from PyTorch-named weights: a directory of <name>.npy files or a .safetensors file");
  c->add_option("--config", o->config, "config.json describing the model")->required()->check(CLI::ExistingFile);
  c->add_option("--weights", o->weights, "Directory of <state_dict name>.npy, or a .safetensors file")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--out", o->out, "Model directory to write")->required();
  c->add_flag("--allow-missing", o->allow_missing,
              "Parameters absent from --weights keep a random initialisation (e.g. embeddings around an nn.Transformer)");
  c->add_option("--seed", o->seed, "Seed for parameters left to initialisation")->transform(seed_number());
  return [o] { return run_import(*o); };
}

Runner add_forward(CLI::App& app) {
  auto o = std::make_shared<ForwardCmd>();
  CLI::App* c = app.add_subcommand("forward", "Run a model on token ids: logits, loss, and gradients of the loss");
  c->add_option("--model", o->model, "Model directory")->required();
  c->add_option("--dtype", o->dtype, kDtypeHelp);
  o->batch.add(c, false);
  c->add_option("--out", o->out, "Write the logits here (.npy)");
  c->add_option("--grads", o->grads, "Write d(loss)/d(parameter) as <name>.npy into this directory (needs --target)");
  c->add_option("--precision", o->precision,
                "The logits and gradients' matrix products: f32, or bf16 as qkv train --precision bf16 computes them "
                "(float32 weights only)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  c->add_option("--label-smoothing", o->label_smoothing, "Label smoothing of the loss")->transform(finite(0, 1));
  c->add_option("--generate", o->generate,
                "Also decode N tokens greedily with the key/value cache from each row of --input (encoder-decoder: "
                "translate it)")
      ->transform(whole(1, int64_t{1} << 20));
  c->add_option("--generated", o->generated, "Write the --generate tokens here (.npy int64 (B, N), -1 after an eos)");
  c->add_option("--attention", o->attention,
                "Write every attention module's weights into this directory: <encoder|decoder>.<layer>.<self|cross>.npy, "
                "float32 (B, H, Tq, Tk), rows over the allowed keys summing to 1");
  return [o] { return run_forward(*o); };
}

Runner add_export(CLI::App& app) {
  auto o = std::make_shared<ExportCmd>();
  CLI::App* c = app.add_subcommand(
      "export",
      "Write a model as a Hugging Face folder (config.json, model.safetensors and its tokenizer's files: gpt2, llama, "
      "bert or marian) or as a GGUF file (Llama-shaped models, packed weights as they are)");
  c->add_option("--model", o->model, "Model directory (qkv's own, or a Hugging Face folder)")->required();
  c->add_option("--format", o->format, "Output format: hf (default) or gguf");
  c->add_option("--out", o->out, "Folder to write (hf), or the .gguf file (gguf)")->required();
  return [o] { return run_export(*o); };
}

Runner add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeCmd>();
  CLI::App* c = app.add_subcommand(
      "quantize",
      "Write a model directory whose weights are packed to bf16, f16, int8 or q4 (loads without re-quantising)");
  c->add_option("--model", o->model, "Model directory (qkv's own, or a Hugging Face folder) or GGUF file")->required();
  c->add_option("--dtype", o->dtype,
                "bf16, f16, int8 (GGUF's Q8_0) or q4 (Q4_0); the output layer and token embeddings at 8 bits or more "
                "(docs/formats.md). Without it, a GGUF file's types are kept as they are (never re-quantised)");
  c->add_option("--out", o->out,
                "Directory to write: config.json, model.safetensors, the tokenizer, task.json and the test split")
      ->required();
  return [o] { return run_quantize(*o); };
}

Runner add_fit(CLI::App& app) {
  auto o = std::make_shared<TrainCmd>();
  CLI::App* c = app.add_subcommand("fit", "Train a model on one batch of .npy token ids with AdamW (overfitting, optimiser and parity checks)");
  c->add_option("--model", o->model, "Model directory to start from");
  c->add_option("--resume", o->resume,
                "Resume from a checkpoint instead of --model (its schedule and optimiser settings are used)")
      ->check(CLI::ExistingFile);
  o->batch.add(c, true);
  c->add_option("--steps", o->steps, "Optimiser steps")->transform(whole(0, int64_t{1} << 40));
  c->add_option("--lr", o->lr, "Peak learning rate")->transform(finite(0));
  c->add_option("--schedule", o->schedule, "constant, inverse-sqrt or cosine");
  c->add_option("--warmup", o->warmup, "Warmup steps")->transform(whole(0, int64_t{1} << 40));
  c->add_option("--total", o->total, "Cosine: the step where the rate reaches --min-lr (default --steps)")
      ->transform(whole(0, int64_t{1} << 40));
  c->add_option("--min-lr", o->min_lr, "Cosine floor")->transform(finite(0));
  c->add_option("--weight-decay", o->cfg.weight_decay, "AdamW decoupled weight decay")->transform(finite(0));
  c->add_flag("--decay-all", o->cfg.decay_all, "Decay every parameter (torch.optim.AdamW(model.parameters()))");
  c->add_option("--beta1", o->cfg.beta1, "AdamW beta1")->transform(finite(0, 1, "[)"));
  c->add_option("--beta2", o->cfg.beta2, "AdamW beta2")->transform(finite(0, 1, "[)"));
  c->add_option("--eps", o->cfg.eps, "AdamW eps")->transform(finite(0, kMaxDouble, "(]"));
  c->add_option("--clip", o->cfg.clip_norm, "Clip gradients to this global L2 norm (0: off)")->transform(finite(0));
  c->add_option("--accumulate", o->accumulate, "Micro-batches per step (gradient accumulation)")
      ->transform(whole(1, int64_t{1} << 20));
  c->add_option("--label-smoothing", o->cfg.label_smoothing, "Label smoothing")->transform(finite(0, 1));
  c->add_option("--seed", o->cfg.seed, "Seed for dropout")->transform(seed_number());
  c->add_option("--precision", o->precision,
                "Matrix products: f32, or bf16 (inputs rounded to bfloat16, sums in float32; as qkv train "
                "--precision). --resume keeps the checkpoint's")
      ->check(CLI::IsMember({"f32", "bf16"}));
  c->add_option("--losses", o->losses, "Write the loss of every step here (.npy, float64)");
  c->add_option("--checkpoint", o->checkpoint, "Write a checkpoint (weights, optimiser, step, RNG) here at the end");
  c->add_option("--out", o->out, "Write the trained model directory here");
  return [o] {
    check(!o->model.empty() || !o->resume.empty(), "fit: give --model DIR or --resume CHECKPOINT");
    return run_train(*o);
  };
}

}  // namespace qkv::cli
