// `qkv train` as a function (qkv/train_run.h): reads and checks everything, prepares the data,
// the tokenizer and the model, then runs run_training (qkv/task.h) into the model directory.
#include "qkv/train_run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "io/json_strict.h"
#include "models/model_dir.h"
#include "qkv/files.h"
#include "qkv/gemm.h"
#include "qkv/qkv.h"
#include "qkv/task.h"
#include "qkv/tokenizer.h"
#include "train/task_data.h"
#include "train/train_json.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using Options = RunOptions;

bool given(const Options& o, const char* name) {
  return std::find(o.given.begin(), o.given.end(), name) != o.given.end();
}

// What the run says, printf-style: each line to TrainHooks::log, or to stderr after "qkv train: ".
class Say {
 public:
  explicit Say(std::function<void(const std::string&)> log) : log_(std::move(log)) {}
  [[gnu::format(printf, 2, 3)]] void operator()(const char* fmt, ...) const {
    va_list ap;
    va_start(ap, fmt);
    va_list again;
    va_copy(again, ap);
    const int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string line(static_cast<size_t>(std::max(n, 0)), '\0');
    std::vsnprintf(line.data(), line.size() + 1, fmt, again);
    va_end(again);
    if (log_) {
      log_(line);
    } else {
      std::fprintf(stderr, "qkv train: %s\n", line.c_str());
    }
  }

 private:
  std::function<void(const std::string&)> log_;
};

// The options a run would not use, refused by name rather than ignored: --resume takes its run's
// options from train.json and its model and schedule from the checkpoint (only the limits and
// the batch's partition are new); a model from --config or --init has no use for --preset's
// sizes; a tokenizer that is given (or comes with --init) is not trained, so --vocab and
// --spm-type do nothing.
void refuse_unused_options(const Options& o) {
  if (o.resume) {
    std::string unused;
    for (const std::string& n : o.given)
      if (n != "--out" && n != "--resume" && n != "--task" && n != "--steps" && n != "--epochs" && n != "--minutes" &&
          n != "--parts" && n != "--bucket-mb")
        unused += (unused.empty() ? "" : ", ") + n;
    check(unused.empty(), "--resume continues the run in ", o.out, " with the options it started with (", o.out,
          "/train.json) and its checkpoint's model, learning-rate schedule and tokenizer: ", unused,
          " would be ignored. Give only the limits (--steps, --epochs, --minutes), or start a new run with another --out");
  }
  check(!given(o, "--preset") || (o.config.empty() && o.init.empty()), "--preset ", o.preset, " and ",
        o.config.empty() ? "--init " + o.init : "--config " + o.config,
        " exclude each other: the model's size comes from ", o.config.empty() ? "the model to fine-tune" : "the config",
        " (give --max-tokens, --max-len and --warmup for the other things a preset sets)");
  for (const char* spm : {"--vocab", "--spm-type"})
    check(!given(o, spm) || (o.tokenizer.empty() && o.init.empty()), spm, " ",
          std::string(spm) == "--vocab" ? std::to_string(o.vocab) : o.spm_type,
          " applies to the SentencePiece vocabulary qkv trains, but the tokenizer is given (",
          o.tokenizer.empty() ? "--init " + o.init + "'s own" : "--tokenizer " + o.tokenizer,
          "): leave it out", o.tokenizer.empty() ? "" : ", or leave out --tokenizer to train one");
}


// The presets: sizes that train in minutes (tiny), tens of minutes (small), or hours (base: the
// 2017 base model) on two cores.
struct Preset {
  int64_t d_model, heads, d_ff, layers, vocab, max_tokens, max_len, warmup;
};
Preset preset_of(const std::string& name, Task task) {
  const bool lm = task == Task::LanguageModel;
  if (name == "tiny") return {128, 4, 512, lm ? 4 : 2, 4000, 2500, lm ? 128 : 64, 400};
  if (name == "small") return {256, 4, 1024, lm ? 6 : 3, 8000, 6144, lm ? 256 : 96, 2000};
  if (name == "base") return {512, 8, 2048, 6, 16000, 8192, lm ? 512 : 128, 4000};
  throw Error("--preset " + name + ": expected tiny, small or base");
}

// --config's model with `vocab` tokens: the tokenizer's size is the model's vocab_size, so the
// file may leave it out, and a file that says otherwise is told so (when `say` is given)
ModelConfig config_file(const std::string& path, int64_t vocab, const Say* say) {
  const std::string text = read_file(path, "config.json");
  check(text.size() < (64u << 20), path, ": larger than 64 MiB; not a config file");
  nlohmann::json j = detail::parse_json_object(text, path);
  if (const auto it = j.find("vocab_size"); it == j.end()) {
    j["vocab_size"] = vocab;
  } else if (!it->is_number_integer() || it->get<int64_t>() < 1) {
    throw Error(detail::concat(path, ": \"vocab_size\" is ", it->dump(), " (expected a positive integer, or leave it out)"));
  } else if (it->get<int64_t>() != vocab) {
    if (say)
      (*say)("note: %s says vocab_size %s; the model has the tokenizer's %lld", path.c_str(), it->dump().c_str(),
             static_cast<long long>(vocab));
    *it = vocab;
  }
  return ModelConfig::from_json(j.dump(), path);
}

ModelConfig model_config(const Options& o, Task task, const Preset& p, const Tokenizer& tok, int64_t classes,
                         const Say& say) {
  ModelConfig c;
  if (!o.config.empty()) {
    c = config_file(o.config, tok.vocab_size(), &say);
  } else {
    c.d_model = p.d_model;
    c.n_heads = p.heads;
    c.d_ff = p.d_ff;
    c.n_layers = p.layers;
    c.n_encoder_layers = c.n_decoder_layers = p.layers;
    c.norm_first = true;  // pre-norm: stable from the first step without a long warmup
    c.dropout = 0.1;
    switch (task) {
      case Task::Translate:
        c.arch = Arch::EncoderDecoder;
        // the paper's sinusoids with all sines before all cosines (a permutation of the model's
        // dimensions, so it learns the same), as Hugging Face's Marian and Pegasus lay them out:
        // `qkv export --format hf` then writes a Pegasus folder
        c.positional = Positional::SinusoidalSplitHalf;
        c.scale_embeddings = true;
        c.tie_embeddings = true;
        // one vocabulary for both languages, one table: the encoder's and the decoder's embedding
        // and the output layer (names, numbers and shared subwords are learned once)
        c.share_embeddings = true;
        break;
      case Task::LanguageModel:
        c.arch = Arch::Decoder;
        c.positional = Positional::Learned;
        c.activation = Activation::GeluErf;
        c.tie_embeddings = true;
        c.max_len = o.max_len;  // the learned table holds exactly the window (--max-len)
        break;
      case Task::Classify:
        c.arch = Arch::EncoderClassifier;
        c.positional = Positional::Sinusoidal;
        c.pooling = Pooling::Mean;
        c.num_classes = classes;
        break;
    }
  }
  if (o.dropout >= 0) c.dropout = o.dropout;
  c.vocab_size = tok.vocab_size();
  c.src_vocab_size = 0;
  c.pad_id = tok.pad_id();
  c.bos_id = tok.bos_id();
  c.eos_id = tok.eos_id();
  if (task == Task::Classify) c.num_classes = classes;
  c.validate();
  return c;
}

// Fine-tuning (--init DIR): the config of the model in DIR (qkv's own or a Hugging Face folder),
// made fit for the task. A classifier from an encoder (BertModel, BertForMaskedLM), or from a
// classifier with another number of labels, gets a new head; *new_head says so.
ModelConfig init_config(const Options& o, Task task, const ModelConfig& from, const Tokenizer& tok, int64_t classes,
                        bool* new_head) {
  ModelConfig c = from;
  *new_head = false;
  const std::string where = "--init " + o.init;
  switch (task) {
    case Task::LanguageModel:
      check(c.arch == Arch::Decoder, where, ": is ", arch_name(c.arch), "; --task lm fine-tunes a decoder");
      break;
    case Task::Translate:
      check(c.arch == Arch::EncoderDecoder, where, ": is ", arch_name(c.arch),
            "; --task translate fine-tunes an encoder-decoder");
      break;
    case Task::Classify:
      check(c.arch == Arch::EncoderClassifier || c.arch == Arch::EncoderMLM || c.arch == Arch::Encoder, where, ": is ",
            arch_name(c.arch), "; --task classify fine-tunes an encoder");
      if (c.arch != Arch::EncoderClassifier || c.num_classes != classes) {
        *new_head = true;
        if (c.arch != Arch::EncoderClassifier) {
          // BERT's sequence classifier: the first token through a tanh pooler (embedding-normed
          // encoders), else mean pooling
          c.pooling = c.embed_norm ? Pooling::First : Pooling::Mean;
          c.pooler = c.embed_norm;
        }
        c.arch = Arch::EncoderClassifier;
        c.num_classes = classes;
        c.tie_embeddings = false;
        c.logits_bias = false;
      }
      break;
  }
  // a Hugging Face model's table may have rows no token uses (padded to a multiple of 64)
  check(tok.vocab_size() <= c.vocab_size, where, ": the tokenizer has ", tok.vocab_size(),
        " tokens but the model's vocab_size is ", c.vocab_size,
        o.tokenizer.empty() ? " (the tokenizer came from the same directory)" : " (give the model's own tokenizer)");
  // padding must be ignored by the loss: the tokenizer's pad token when the model names none
  if (c.pad_id < 0 && tok.pad_id() >= 0) c.pad_id = tok.pad_id();
  if (c.bos_id < 0 && tok.bos_id() >= 0) c.bos_id = tok.bos_id();
  if (c.eos_id < 0 && tok.eos_id() >= 0) c.eos_id = tok.eos_id();
  if (o.dropout >= 0) c.dropout = o.dropout;
  c.validate();
  return c;
}

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec && fs::is_directory(dir), "--out ", dir, ": cannot create the directory", ec ? ": " + ec.message() : "");
}

// What identifies a data file: its size and a 64-bit FNV-1a hash of its bytes. A resumed run
// needs the very same data (the split and the batches are functions of it).
json file_identity(const std::string& path) {
  const std::string bytes = read_file(path, "data file");
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return {{"path", path}, {"bytes", bytes.size()}, {"fnv1a64", hex}};
}

json data_identity(const Options& o) {
  json files = json::array();
  for (const std::string* p : {&o.data, &o.source, &o.target, &o.train_only})
    if (!p->empty()) files.push_back(file_identity(*p));
  return files;
}

// --precision: auto is bf16 where the CPU has bf16 dot products, else f32.
Precision resolve_precision(const std::string& s) {
  if (s == "auto") return bf16_gemm_native() ? Precision::BF16 : Precision::F32;
  return parse_precision(s, "--precision");
}

std::string precision_label(Precision p) {
  if (p == Precision::F32) return "float32";
  return bf16_gemm_native() ? "bf16" : "bf16 (no bf16 dot products on this CPU: rounded, then multiplied in float32)";
}

json options_json(const Options& o, int64_t tokenizer_vocab) {
  return {{"task", o.task},         {"data", o.data},         {"source", o.source},
          {"target", o.target},     {"train_only", o.train_only}, {"train_only_ratio", o.train_only_ratio},
          {"subword_alpha", o.subword_alpha},
          {"preset", o.preset},     {"config", o.config},
          {"tokenizer", o.tokenizer}, {"spm_type", o.spm_type}, {"vocab", o.vocab},
          {"max_tokens", o.max_tokens}, {"max_len", o.max_len}, {"valid_fraction", o.valid_fraction},
          {"test_fraction", o.test_fraction}, {"seed", o.seed}, {"lr", o.lr},
          {"warmup", o.warmup},     {"dropout", o.dropout},   {"label_smoothing", o.label_smoothing},
          {"eval_every", o.eval_every}, {"average", o.average}, {"init", o.init}, {"tokenizer_vocab", tokenizer_vocab},
          {"precision", o.precision},
          {"data_files", data_identity(o)}};
}

// The data must be what the run started with (train.json's data_files), or the split and the
// batches of the resumed run would differ.
void check_data_unchanged(const Options& o, const std::string& path, const Say& say) {
  if (!o.data_files_given) {
    say("note: %s records no data identity (written by an older qkv); the data "
                 "cannot be checked for changes", path.c_str());
    return;
  }
  // the files train.json names must be the ones it recorded (an edited "data" once trained on
  // another file, unchecked)
  std::string named, recorded;
  for (const std::string* p : {&o.data, &o.source, &o.target, &o.train_only})
    if (!p->empty()) named += (named.empty() ? "" : ", ") + *p;
  for (const DataFile& f : o.data_files) recorded += (recorded.empty() ? "" : ", ") + f.path;
  check(named == recorded, "--resume: ", path, " names the data ", named.empty() ? "(none)" : named,
        " but records the run's data files as ", recorded.empty() ? "(none)" : recorded,
        ": the file was edited. Restore it, or start a new run with another --out");
  for (const DataFile& f : o.data_files) {
    const json now = file_identity(f.path);
    check(now["bytes"].get<uint64_t>() == f.bytes && now["fnv1a64"].get<std::string>() == f.fnv1a64, "--resume: ",
          f.path, " has changed since the run started (", f.bytes, " bytes, FNV-1a ", f.fnv1a64, "; now ",
          now["bytes"].get<uint64_t>(), " bytes, ", now["fnv1a64"].get<std::string>(),
          "): the split and the batches would differ. Restore the file, or start a new run with another --out");
  }
}

// A resumed run writes its directory at every evaluation: one it cannot write in is refused
// before training (it trained until its first write). Tried by creating a file, as the writes do
// (a temporary file, then a rename), so that permissions, a read-only mount or ACLs all count.
void check_writable(const std::string& dir) {
  const std::string probe = detail::concat(dir, "/.qkv_write_test.", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    fail("--resume: cannot write in ", dir, " (", std::strerror(errno),
         "): the run saves its checkpoint, model and metrics there");
  ::close(fd);
  ::unlink(probe.c_str());
}

// Removes a model directory this run created if setup fails before the first checkpoint, so
// that no half-made directory is left behind.
struct NewDirGuard {
  std::string dir, checkpoint;
  bool armed = false;
  ~NewDirGuard() {
    std::error_code ec;
    if (armed && !fs::exists(checkpoint, ec)) fs::remove_all(dir, ec);
  }
};

// The learned position table must hold every position training will use.
void check_positions(const ModelConfig& c, int64_t max_len, const std::string& where) {
  check(c.positional != Positional::Learned || c.max_len >= max_len, where, ": max_len ", c.max_len,
        " (the learned position table) is below --max-len ", max_len, ": give --max-len ", c.max_len,
        " or less, or a config with max_len >= ", max_len);
}

// SentencePiece's own failures, told in qkv's terms.
std::unique_ptr<Tokenizer> train_tokenizer(const RawData& train_raw, const SentencePieceTrainOptions& so) {
  try {
    return train_sentencepiece(all_texts(train_raw), so);
  } catch (const Error& e) {
    const std::string what = e.what();
    const size_t at = what.find("smaller than required_chars. ");
    if (at != std::string::npos) {
      long long vocab = 0, chars = 0;
      if (std::sscanf(what.c_str() + at + 29, "%lld vs %lld", &vocab, &chars) == 2)
        fail("--vocab ", so.vocab_size, " is too small for ", train_raw.describe(), ": its characters alone need ",
             chars, " pieces; give --vocab ", chars, " or more (or --tokenizer byte)");
    }
    if (what.find("every sentence is longer than") != std::string::npos)
      fail(train_raw.describe(), ": ", what, " (--tokenizer byte)");
    throw;
  }
}

// Rank 0's parameters to every rank, then a checksum of every rank's: they start equal.
void share_weights(Communicator& comm, Model& model, const char* when) {
  uint64_t h = fnv1a(nullptr, 0);
  for (Parameter& p : model.parameters()) {
    float* d = p.var->value.data<float>();
    comm.broadcast(d, p.var->value.numel() * static_cast<int64_t>(sizeof(float)), 0);
    h = fnv1a(d, static_cast<size_t>(p.var->value.numel()) * sizeof(float), h);
  }
  check(same_on_every_rank(comm, h), "train: the ranks' weights differ ", when, " (checksums)");
}

// What rank 0 (or the one process) prepares before training: the data as token ids, the
// tokenizer and the model. The other ranks read no file: they get the model's config and weights,
// then the examples of their parts, from rank 0.
struct Prepared {
  Task task = Task::Translate;
  ModelConfig cfg;
  std::unique_ptr<Model> model;
  Encoded train, valid;
  RawData test_raw, valid_raw;
  size_t n_test = 0;
  int64_t core = 0, pool_per_epoch = 0;  // --train-only-ratio: the split's examples, and the pool's per epoch
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::string> labels;
  std::function<std::vector<Example>(int64_t, const std::vector<Example>&)> resample;  // --subword-alpha
};

// --subword-alpha: epoch e's training pairs segmented afresh by the tokenizer's sampling, from a
// seed of (--seed, e); the training split's pairs only (--train-only's stay as they are), and a
// pair whose sampled tokens exceed max_len keeps its usual ones.
std::function<std::vector<Example>(int64_t, const std::vector<Example>&)> subword_sampler(
    const RawData& train_raw, const std::vector<size_t>& kept, const Tokenizer& tok, int64_t max_len, double alpha,
    uint64_t seed) {
  auto texts = std::make_shared<std::vector<std::string>>();  // the kept pairs' sources, then their targets
  for (size_t i : kept) texts->push_back(train_raw.pairs[i].source);
  for (size_t i : kept) texts->push_back(train_raw.pairs[i].target);
  return [texts, &tok, max_len, alpha, seed](int64_t epoch, const std::vector<Example>& given) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(epoch + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const std::vector<std::vector<int32_t>> ids = tok.encode_sampled(*texts, alpha, static_cast<uint32_t>(z));
    const size_t n = texts->size() / 2;
    std::vector<Example> out(given);
    for (size_t i = 0; i < n && i < out.size(); ++i) {
      Example e;
      e.src = source_ids(tok, ids[i]);
      e.tgt = ids[n + i];
      e.tgt.push_back(tok.eos_id());
      if (static_cast<int64_t>(std::max(e.src.size(), e.tgt.size())) <= max_len) out[i] = std::move(e);
    }
    return out;
  };
}

// True (and says so) when a stop was asked for before training began.
bool stopped_before_training(const std::atomic<bool>* stop, const Say& say) {
  if (!stop || !stop->load()) return false;
  say("interrupted before training began; nothing was written");
  return true;
}

// Reads and checks everything the run needs; 130 when a stop was asked for on the way (nothing
// written), else 0.
int prepare(Options& o, const std::atomic<bool>* stop, const Communicator* comm, const Say& say, Prepared& out) {
  auto stop_requested = [&] { return stopped_before_training(stop, say); };
  const std::string ckpt = o.out + "/checkpoint.safetensors";
  check(o.data.empty() || (o.source.empty() && o.target.empty()),
        "give either --data FILE or --source and --target files, not both");
  check(o.source.empty() == o.target.empty(), "--source and --target go together (aligned files, one sentence per line)");
  std::error_code ec;
  if (o.resume) {
    check(fs::exists(ckpt), "--resume: ", ckpt, " not found (nothing to resume in ", o.out, ")");
    check(o.data.empty() && o.source.empty() && o.train_only.empty(), "--resume continues with the data the run started with (",
          o.out, "/train.json); --data, --source, --target and --train-only are not taken");
    // The run's data options come from train.json, so `qkv train --out DIR --resume` is enough.
    const std::string path = o.out + "/train.json";
    const Options given_options = o;
    read_train_json(read_file(path, "train.json"), path, o);
    check_writable(o.out);
    check_data_unchanged(o, path, say);
    check(!given(given_options, "--task") || given_options.task == o.task, "--resume: ", o.out, " was trained for --task ", o.task);
  } else {
    check(!fs::exists(ckpt), "--out ", o.out, " already holds a training run (", ckpt,
          "); use --resume to continue it, or another --out");
    check(!fs::exists(o.out, ec) || fs::is_directory(o.out, ec), "--out ", o.out,
          ": exists and is not a directory");
  }
  check(o.valid_fraction + o.test_fraction < 1, "--valid-fraction ", o.valid_fraction, " and --test-fraction ",
        o.test_fraction, " hold out the whole corpus, leaving nothing to train on: together they must be below 1");
  check(o.init.empty() || o.config.empty(), "--init ", o.init, " and --config ", o.config,
        " exclude each other: the model to fine-tune brings its own config");
  check(o.init.empty() || !o.resume, "--resume continues a run from its checkpoint; --init starts one");
  check(o.train_only_ratio == 0 || !o.train_only.empty(), "--train-only-ratio ", o.train_only_ratio,
        " applies to --train-only records, and none are given");
  refuse_unused_options(o);
  std::unique_ptr<Model> init_model;
  if (!o.init.empty()) {
    init_model = std::make_unique<Model>(load_model(o.init));
    init_model->check_not_packed(detail::concat("--init ", o.init).c_str());
    // weights that are not finite train nothing: every step would be skipped, the run "trained"
    for (const Parameter& prm : init_model->parameters()) {
      const Tensor& t = prm.var->value;
      const float* v = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i)
        check(std::isfinite(v[i]), "--init ", o.init, ": its weights are not finite (", prm.name, " ",
              shape_str(t.shape()), " holds ", v[i], " at flat index ", i, "): there is nothing to fine-tune");
    }
  }
  const Task task = parse_task(o.task);
  const Preset p = preset_of(o.preset, task);
  if (o.max_tokens <= 0) o.max_tokens = p.max_tokens;
  if (o.max_len <= 0) o.max_len = p.max_len;
  check(o.steps > 0 || o.epochs > 0 || o.minutes > 0, "give a limit: --steps N, --epochs N or --minutes M");
  // A config's learned position table is checked before any work.
  // (the vocabulary asked for stands in for the tokenizer's size, not known yet)
  if (!o.config.empty())
    check_positions(config_file(o.config, o.vocab > 0 ? o.vocab : p.vocab, nullptr), o.max_len, "--config " + o.config);
  if (o.resume) check_positions(checkpoint_model_config(ckpt), o.max_len, ckpt);

  // data -> split
  const RawData all = read_task_data(task, o.data, o.source, o.target);
  say("%s", all.report.summary(all.path).c_str());
  // A corpus too small for its held-out splits trains on what it has: the test split goes
  // first, then the validation split (train.json keeps what was used, so --resume agrees).
  const int64_t n_all = all.size();
  if (o.test_fraction > 0 && held_out_count(n_all, o.valid_fraction) + held_out_count(n_all, o.test_fraction) >= n_all) {
    say("note: %s has %lld records, too few to hold out a test split as well: no test split",
                 all.path.c_str(), static_cast<long long>(n_all));
    o.test_fraction = 0;
  }
  if (o.valid_fraction > 0 && held_out_count(n_all, o.valid_fraction) >= n_all) {
    say("note: %s has %lld record(s), too few to hold out a validation split: none",
                 all.path.c_str(), static_cast<long long>(n_all));
    o.valid_fraction = 0;
  }
  // Translation pairs that are near-copies of each other (the same source or target but for case
  // and punctuation) fall into one split, so that no held-out sentence is trained on.
  const SplitIndices split = task == Task::Translate
                                 ? split_groups(near_copy_groups(all.pairs), o.valid_fraction, o.test_fraction, o.seed)
                                 : split_indices(n_all, o.valid_fraction, o.test_fraction, o.seed);
  for (auto [part, got, fraction] : {std::tuple{"validation", split.valid.size(), o.valid_fraction},
                                     std::tuple{"test", split.test.size(), o.test_fraction}}) {
    const int64_t asked = held_out_count(n_all, fraction);
    if (fraction > 0 && static_cast<int64_t>(got) < asked)
      say("note: the %s split holds %lld pairs, not %lld: the groups of near-copies left "
          "(pairs sharing a source or a target) were too big for the room left, and train",
                   part, static_cast<long long>(got), static_cast<long long>(asked));
  }
  RawData train_raw = subset(all, split.train), valid_raw = subset(all, split.valid), test_raw = subset(all, split.test);
  train_raw.part = "training split";
  valid_raw.part = "validation split";
  test_raw.part = "test split";

  // tokenizer: given, saved by an earlier run, or trained now on the training split
  std::unique_ptr<Tokenizer> tok;
  if (o.resume) {
    tok = load_tokenizer(o.out);
  } else if (!o.init.empty() && o.tokenizer.empty()) {
    try {
      tok = load_tokenizer(o.init);  // the model's own tokenizer
    } catch (const Error& e) {
      throw Error(detail::concat("--init ", o.init, ": ", e.what(), "; or give --tokenizer"));
    }
  } else if (o.tokenizer == "byte") {
    tok = make_byte_tokenizer();
  } else if (o.tokenizer.rfind("gpt2:", 0) == 0) {
    const std::string dir = o.tokenizer.substr(5);
    tok = load_gpt2_tokenizer(dir + "/encoder.json", dir + "/vocab.bpe");
  } else if (o.tokenizer.size() > 6 && o.tokenizer.compare(o.tokenizer.size() - 6, 6, ".model") == 0) {
    tok = load_sentencepiece(o.tokenizer);  // an existing SentencePiece model file
  } else if (!o.tokenizer.empty()) {
    tok = load_tokenizer(o.tokenizer);
  } else {
    SentencePieceTrainOptions so;
    so.vocab_size = o.vocab > 0 ? o.vocab : p.vocab;
    so.model_type = o.spm_type;
    so.seed = o.seed;
    so.threads = std::max(1, num_threads());
    say("training a SentencePiece %s vocabulary of %lld on the training split...",
                 so.model_type.c_str(), static_cast<long long>(so.vocab_size));
    tok = train_tokenizer(train_raw, so);
    if (tok->vocab_size() < so.vocab_size)
      say("note: the training split supports only %lld SentencePiece pieces, not the "
                   "%lld asked for: the vocabulary has %lld", static_cast<long long>(tok->vocab_size()),
                   static_cast<long long>(so.vocab_size), static_cast<long long>(tok->vocab_size()));
  }

  if (stop_requested()) return 130;

  // --train-only: records for the training split only (after the tokenizer, which learns the
  // main data's training split), less any near-copy of a held-out one
  RawData extra;
  if (!o.train_only.empty()) {
    const RawData extra_all = read_task_data(task, o.train_only, "", "");
    say("--train-only %s", extra_all.report.summary(extra_all.path).c_str());
    int64_t dropped = 0;
    extra = without_near_copies(extra_all, {&valid_raw, &test_raw}, &dropped);
    extra.part = "--train-only records";
    say("--train-only: %lld records added to the training split, %lld left out as "
                 "near-copies of held-out ones", static_cast<long long>(extra.size()), static_cast<long long>(dropped));
  }
  if (stop_requested()) return 130;

  // labels (classify): the training split's, sorted
  std::vector<std::string> labels;
  if (task == Task::Classify) {
    if (o.resume) {
      labels = TaskInfo::load(o.out).labels;
    } else {
      std::set<std::string> s;
      for (const auto& l : train_raw.labeled) s.insert(l.label);
      labels.assign(s.begin(), s.end());
      check(labels.size() >= 2, train_raw.describe(), ": classification needs at least 2 labels, got ", labels.size());
    }
  }
  Encoded train = encode_task(task, train_raw, *tok, o.max_len, labels);
  check(!train.examples.empty(), train_raw.describe(), ": no training examples left (all longer than --max-len ",
        o.max_len, "?)");
  if (o.subword_alpha > 0) {
    check(task == Task::Translate, "--subword-alpha: subword sampling is for --task translate");
    check(comm == nullptr, "--subword-alpha: subword sampling runs in one process, not under "
          "mpirun (rank 0 alone holds the data)");
    check(tok->can_sample(), "--subword-alpha: a ", tok->type(),
          " tokenizer cannot sample segmentations; it needs a SentencePiece model (qkv's own, the default)");
    out.resample = subword_sampler(train_raw, train.kept, *tok, o.max_len, o.subword_alpha, o.seed);
  }
  if (!train.note.empty()) say("note: %s", train.note.c_str());
  // --train-only's examples follow the split's: out.core counts the split's
  out.core = static_cast<int64_t>(train.examples.size());
  if (extra.size() > 0) {
    Encoded more = encode_task(task, extra, *tok, o.max_len, labels, /*skip_unknown_labels=*/true);
    if (!more.note.empty()) say("note: %s", more.note.c_str());
    if (more.unknown_labels > 0)
      say("note: %lld --train-only records have labels the training split lacks; left out",
                   static_cast<long long>(more.unknown_labels));
    train.dropped += more.dropped;
    for (Example& e : more.examples) train.examples.push_back(std::move(e));
    if (o.train_only_ratio > 0) {
      out.pool_per_epoch = std::min<int64_t>(static_cast<int64_t>(more.examples.size()),
                                             std::llround(o.train_only_ratio * static_cast<double>(out.core)));
      say("each epoch: the %lld examples of the training split and the next %lld of the "
                   "%zu --train-only ones (--train-only-ratio %g)", static_cast<long long>(out.core),
                   static_cast<long long>(out.pool_per_epoch), more.examples.size(), o.train_only_ratio);
    }
  }
  // A language model trains on windows of one length: a short text shrinks --max-len to its window.
  if (task == Task::LanguageModel && train.window < o.max_len) o.max_len = train.window;
  // The validation split: records whose labels the training split lacks are left out; a split
  // too small for one window is one shorter window, or none.
  Encoded valid;
  if (valid_raw.size() > 0) {
    try {
      valid = encode_task(task, valid_raw, *tok, o.max_len, labels, /*skip_unknown_labels=*/true);
    } catch (const Error& e) {
      if (task != Task::LanguageModel) throw;
      say("note: %s; training without validation", e.what());
    }
    if (!valid.note.empty()) say("note: %s", valid.note.c_str());
    if (valid.unknown_labels > 0)
      say("note: %lld validation records have labels the training split lacks; left out",
                   static_cast<long long>(valid.unknown_labels));
  }
  int64_t train_tokens = 0;
  for (const Example& e : train.examples) train_tokens += example_length(task, e);
  const size_t n_test = test_raw.pairs.size() + test_raw.labeled.size() + test_raw.lines.size();
  // units: translation pairs, classified texts; a language model trains and validates on windows
  // of its text (a window: --max-len + 1 tokens, the last one's shorter) and tests on lines
  const std::string unit = task == Task::Translate ? "pairs"
                           : task == Task::Classify ? "texts"
                                                    : detail::concat("windows of up to ", o.max_len + 1, " tokens");
  say("%zu training %s (%lld tokens), %zu validation %s, %zu test %s%s",
               train.examples.size(), unit.c_str(), static_cast<long long>(train_tokens), valid.examples.size(),
               task == Task::LanguageModel ? "windows" : unit.c_str(), n_test,
               task == Task::LanguageModel ? "lines" : unit.c_str(),
               train.dropped ? (", " + std::to_string(train.dropped) + " training pairs over --max-len dropped").c_str() : "");
  if (valid.examples.empty())
    say("note: no validation split: the model directory keeps the last weights");

  // model and trainer
  bool new_head = false;
  ModelConfig cfg = o.resume         ? checkpoint_model_config(ckpt)
                    : init_model ? init_config(o, task, init_model->config(), *tok, static_cast<int64_t>(labels.size()),
                                               &new_head)
                                     : model_config(o, task, p, *tok, static_cast<int64_t>(labels.size()), say);
  check_positions(cfg, o.max_len, init_model ? "--init " + o.init
                                  : o.config.empty() ? "--preset " + o.preset
                                                     : "--config " + o.config);
  check(!o.resume || tok->vocab_size() <= cfg.vocab_size, o.out, "/qkv_tokenizer.json: the tokenizer's vocabulary (",
        tok->vocab_size(), ") does not match the checkpoint's vocab_size (", cfg.vocab_size, ")");
  // a tokenizer swapped for one of another size would train on other ids: the run's own size
  // (train.json), or, for a run that did not fine-tune, the model's vocab_size
  if (o.resume) {
    const int64_t started = o.tokenizer_vocab > 0 ? o.tokenizer_vocab : o.init_recorded.empty() ? cfg.vocab_size : 0;
    check(started == 0 || tok->vocab_size() == started, o.out, "/qkv_tokenizer.json: the tokenizer has ",
          tok->vocab_size(), " tokens, but the run started with ", started,
          o.tokenizer_vocab > 0 ? " (train.json's tokenizer_vocab)" : " (the checkpoint's vocab_size)",
          ": it was replaced. Restore the run's own tokenizer");
  }
  check(task != Task::Classify || static_cast<int64_t>(labels.size()) == cfg.num_classes, o.out, "/task.json: ",
        labels.size(), " labels, but the model has ", cfg.num_classes, " classes");
  out.model = std::make_unique<Model>(cfg);
  Model& model = *out.model;
  model.init(o.seed);
  if (init_model) {
    // the weights of --init; a new classification head keeps its initialisation from --seed
    std::vector<std::pair<std::string, Tensor>> keep;
    int64_t dropped = 0;
    for (auto& [name, t] : init_model->state_dict()) {
      const Parameter* q = model.find(name);
      if (q && (!new_head || q->var->value.shape() == t.shape())) {
        keep.emplace_back(name, t);
      } else {
        ++dropped;  // the head the task replaces (a masked-LM head, another classifier)
      }
    }
    model.load_state_dict(keep, /*allow_missing=*/new_head);
    init_model.reset();
    say("fine-tuning %s (%lld parameters)%s", o.init.c_str(),
                 static_cast<long long>(model.num_parameters()),
                 new_head ? detail::concat(": a new ", cfg.num_classes, "-class head (", cfg.pooler ? "pooler + " : "",
                                           "classifier) initialised from --seed",
                                           dropped ? detail::concat(", ", dropped, " tensors of the old head left out") : "")
                                .c_str()
                          : "");
  }
  out.task = task;
  out.cfg = cfg;
  out.train = std::move(train);
  out.valid = std::move(valid);
  out.test_raw = std::move(test_raw);
  out.valid_raw = std::move(valid_raw);
  out.n_test = n_test;
  out.tok = std::move(tok);
  out.labels = std::move(labels);
  return 0;
}

// The ranges `qkv train --help` gives, for every caller (the command line checks them as it
// parses; Python's qkv.train and C++ callers get them here). 0 (-1 for warmup, dropout and label
// smoothing) is "the default" where the option has one.
void check_ranges(const TrainOptions& o) {
  auto whole = [](const char* flag, int64_t v, int64_t lo, int64_t hi, bool zero_is_default) {
    check((zero_is_default && v == 0) || (v >= lo && v <= hi), flag, " ", v, ": expected ",
          zero_is_default ? "0 (the default) or " : "", "an integer from ", lo, " to ", hi);
  };
  auto number = [](const char* flag, double v, double lo, double hi, double default_value) {
    check(v == default_value || (std::isfinite(v) && v >= lo && v <= hi), flag, " ", v, ": expected ",
          std::isfinite(default_value) ? detail::concat(default_value, " (the default) or ") : std::string(),
          "a number from ", lo, " to ", hi);
  };
  const double none = std::numeric_limits<double>::quiet_NaN();
  check(!o.out.empty(), "--out: the model directory to write is required");
  check(o.spm_type == "unigram" || o.spm_type == "bpe", "--spm-type ", o.spm_type, ": expected unigram or bpe");
  check(o.precision == "f32" || o.precision == "bf16" || o.precision == "auto", "--precision ", o.precision,
        ": expected f32, bf16 or auto");
  whole("--average", o.average, 0, 1000, false);
  whole("--vocab", o.vocab, 300, 1000000, true);
  whole("--steps", o.steps, 1, int64_t{1} << 40, true);
  whole("--epochs", o.epochs, 1, 1000000, true);
  whole("--max-tokens", o.max_tokens, 1, 1 << 24, true);
  whole("--max-len", o.max_len, 2, 1 << 20, true);
  whole("--eval-every", o.eval_every, 1, 1 << 30, true);
  check(o.warmup == -1 || (o.warmup >= 1 && o.warmup <= (1 << 30)), "--warmup ", o.warmup,
        ": expected -1 (the preset's) or an integer from 1 to ", 1 << 30);
  whole("--parts", o.parts, 1, 4096, false);
  number("--train-only-ratio", o.train_only_ratio, 0.001, 1000, 0);
  number("--subword-alpha", o.subword_alpha, 0, 1, none);
  number("--minutes", o.minutes, 0.01, 1e6, 0);
  number("--lr", o.lr, 1e-6, 1e3, 0);
  number("--dropout", o.dropout, 0, 0.9, -1);
  number("--label-smoothing", o.label_smoothing, 0, 0.5, -1);
  number("--valid-fraction", o.valid_fraction, 0, 0.5, none);
  number("--test-fraction", o.test_fraction, 0, 0.5, none);
  number("--bucket-mb", o.bucket_mb, 0.001, 1024, none);
}

}  // namespace

TrainResult train_model(TrainOptions options, const TrainHooks& hooks) {
  check_ranges(options);
  Options o;
  static_cast<TrainOptions&>(o) = std::move(options);
  const Say say(hooks.log);
  const std::atomic<bool>* stop = hooks.stop;
  // Data parallelism: rank 0 writes and reports.
  Communicator* comm = hooks.comm && hooks.comm->size() > 1 ? hooks.comm : nullptr;
  if (comm) {
    check(o.parts == 1 || o.parts == comm->size(), "--parts ", o.parts, ": under mpirun the parts are the ",
          comm->size(), " ranks");
    o.parts = comm->size();
  }
  TrainResult result;
  const bool lead = !comm || comm->rank() == 0;
  const std::string ckpt = o.out + "/checkpoint.safetensors";
  std::error_code ec;
  Prepared prep;
  int early = 0;
  if (!comm) {
    early = prepare(o, stop, comm, say, prep);
  } else {
    // Rank 0 reads the data, the tokenizer and any model or checkpoint; the others wait for its
    // outcome (an error is printed once, by rank 0), then get what they need.
    on_lead(*comm, [&] { early = prepare(o, stop, comm, say, prep); });
    double e = lead ? early : 0;
    comm->sum_doubles(&e, 1);
    early = static_cast<int>(e);
    if (early == 0) {
      // the options rank 0 settled (from train.json on --resume, from the preset) and the config
      std::string setup;
      if (lead)
        setup = json{{"task", o.task},         {"preset", o.preset}, {"max_tokens", o.max_tokens},
                     {"max_len", o.max_len},   {"seed", o.seed},     {"eval_every", o.eval_every},
                     {"precision", precision_name(resolve_precision(o.precision))},
                     {"config", prep.cfg.to_json()}}
                    .dump();
      comm->broadcast_string(setup, 0);
      if (!lead) {
        const json j = json::parse(setup);
        o.task = j.at("task").get<std::string>();
        o.preset = j.at("preset").get<std::string>();
        o.max_tokens = j.at("max_tokens").get<int64_t>();
        o.max_len = j.at("max_len").get<int64_t>();
        o.seed = j.at("seed").get<uint64_t>();
        o.eval_every = j.at("eval_every").get<int64_t>();
        o.precision = j.at("precision").get<std::string>();  // rank 0's choice, so that every rank computes alike
        prep.task = parse_task(o.task);
        prep.cfg = ModelConfig::from_json(j.at("config").get<std::string>(), "the config from rank 0");
        prep.model = std::make_unique<Model>(prep.cfg);
      }
    }
  }
  if (early) {
    result.stopped_before_training = true;
    return result;
  }
  const Task task = prep.task;
  const Preset p = preset_of(o.preset, task);
  const ModelConfig& cfg = prep.cfg;
  Model& model = *prep.model;
  const size_t n_test = prep.n_test;
  if (comm) share_weights(*comm, model, "after initialisation");
  TrainConfig tc;
  tc.token_mean = o.parts > 1;  // N parts (or ranks) give the loss of their whole batch
  tc.bucket_bytes = std::max<int64_t>(4, static_cast<int64_t>(o.bucket_mb * 1048576.0));
  tc.seed = o.seed;
  tc.clip_norm = 1.0;
  tc.weight_decay = 0.01;
  tc.beta2 = 0.98;
  tc.label_smoothing = o.label_smoothing >= 0 ? static_cast<float>(o.label_smoothing)
                                              : (task == Task::Translate ? 0.1f : 0.0f);
  // the 2017 schedule: warmup, then 1 / sqrt(step); --lr scales it (1 = the paper's)
  tc.schedule.kind = ScheduleKind::InverseSqrt;
  tc.schedule.d_model = cfg.d_model;
  tc.schedule.warmup = o.warmup >= 0 ? o.warmup : p.warmup;
  tc.schedule.lr = o.lr > 0 ? o.lr : 1.0;
  // (--resume: the checkpoint's, which load_checkpoint restores; named here for the message)
  // (only rank 0 has the file; the others get the checkpoint's settings from it in run_training)
  tc.precision = o.resume ? (lead ? checkpoint_precision(ckpt) : Precision::F32) : resolve_precision(o.precision);
  Trainer trainer(model, tc);
  if (comm) trainer.set_communicator(comm);
  // (ranks agree on a stop inside run_training: one alone must not leave the others waiting)
  if (!comm && stopped_before_training(stop, say)) {
    result.stopped_before_training = true;
    return result;
  }

  // Everything checked: only now is the model directory made and written (by rank 0).
  NewDirGuard guard{o.out, ckpt};
  if (!o.resume && lead) {
    guard.armed = !fs::exists(o.out, ec);
    make_dir(o.out);
    if (n_test > 0) {
      write_task_data(task, prep.test_raw, o.out + (task == Task::LanguageModel ? "/test.txt" : "/test.tsv"));
    } else {
      say("note: no test split: qkv eval will need --data FILE");
    }
    // the validation split too, to choose decoding settings on (qkv eval --data DIR/valid.tsv)
    if (prep.valid_raw.size() > 0)
      write_task_data(task, prep.valid_raw, o.out + (task == Task::LanguageModel ? "/valid.txt" : "/valid.tsv"));
    prep.tok->save(o.out);
    TaskInfo info;
    info.task = task;
    info.labels = prep.labels;
    info.max_len = o.max_len;
    info.save(o.out);
    write_file_atomic(o.out + "/train.json", options_json(o, prep.tok->vocab_size()).dump(2) + "\n");
  }
  if (const int64_t stale = lead ? remove_stale_temp_files(o.out) : 0; stale > 0)
    say("removed %lld temporary file(s) left in %s by a killed run",
                 static_cast<long long>(stale), o.out.c_str());
  say("%s model, %lld parameters, %s matrix products, %d threads%s -> %s",
               arch_name(cfg.arch), static_cast<long long>(model.num_parameters()),
               precision_label(trainer.config().precision).c_str(), num_threads(),
               comm ? detail::concat(" per rank x ", comm->size(), " ranks (mpirun)").c_str()
               : o.parts > 1 ? detail::concat(", each batch in ", o.parts, " parts").c_str() : "",
               o.out.c_str());

  LoopConfig lc;
  lc.max_steps = o.steps;
  lc.max_epochs = o.epochs;
  lc.max_minutes = o.minutes;
  lc.max_tokens = o.max_tokens;
  lc.eval_every = o.eval_every;
  // a run bounded by time validates by the clock, ten times over its minutes (at most every 10
  // minutes, at least every 10 s), not once per epoch: a language model's epoch may outlast it
  if (o.eval_every == 0 && o.minutes > 0) lc.eval_every_seconds = std::clamp(6.0 * o.minutes, 10.0, 600.0);
  lc.seed = o.seed;
  lc.stop = stop;
  lc.parts = o.parts;
  lc.average = o.average;
  lc.resample = prep.resample;
  if (o.train_only_ratio > 0) {
    lc.core = prep.core;
    lc.pool_per_epoch = prep.pool_per_epoch;
  }
  result.loop = run_training(trainer, task, prep.train.examples, prep.valid.examples, o.out, lc, o.resume,
                             hooks.progress);
  result.validated = !prep.valid.examples.empty();
  result.task = task;
  result.parameters = model.num_parameters();
  result.out = o.out;
  if (comm && result.loop.step_seconds > 0)
    say("%d ranks; summing gradients over them took %.1f%% of the step time (%.2f of %.2f s)", comm->size(),
        100.0 * result.loop.comm_seconds / result.loop.step_seconds, result.loop.comm_seconds,
        result.loop.step_seconds);
  return result;
}

}  // namespace qkv
