// qkv._qkv.Model: a model directory (qkv's own, a Hugging Face folder, a GGUF file) from Python,
// opened as qkv's commands open it (src/models/model_dir.h), with its tokenizer and task. Compute
// runs with the GIL released; logits come back as NumPy arrays over qkv's memory.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "models/model_dir.h"
#include "qkv/generate.h"
#include "qkv/inspect.h"
#include "qkv/model.h"
#include "qkv/tokenizer.h"

namespace qkv::python {
namespace {

struct PyModel {
  std::string path;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  TaskInfo info;
  mutable std::mutex mu;  // one call computes on the model at a time (Busy)

  const Tokenizer& tokenizer() const {
    if (!tok) throw Error(detail::concat(path, ": the model has no tokenizer; pass token ids"));
    return *tok;
  }
};

// Held while a call computes: the GIL released (other Python threads run), then the model's lock
// taken, so two threads calling one model wait for each other instead of sharing its state.
struct Busy {
  Computing computing;
  std::lock_guard<std::mutex> lock;
  explicit Busy(const PyModel& p) : lock(p.mu) {}
};

// A prompt given as text or as token ids.
std::vector<int32_t> ids_of(const PyModel& m, const py::handle& x, bool lm_prompt) {
  if (py::isinstance<py::str>(x)) {
    const std::string text = x.cast<std::string>();
    return lm_prompt ? prompt_ids(m.tokenizer(), text) : m.tokenizer().encode(text);
  }
  return x.cast<std::vector<int32_t>>();
}

// Whether x is several inputs (a list of texts, a list of id lists, a 2-D array) rather than one (a
// text, a list of ids, NumPy integers included, a 1-D array).
bool rows_of_rows(const py::handle& x) {
  if (py::isinstance<py::str>(x) || !py::isinstance<py::sequence>(x) || py::len(x) == 0) return false;
  const py::object first = py::reinterpret_borrow<py::sequence>(x)[0];
  return py::isinstance<py::str>(first) || py::isinstance<py::sequence>(first);
}

// Token ids as an int64 tensor: an integer array (or nested lists of ints), `rank` dimensions.
Tensor ids_tensor(const py::handle& x, int64_t rank, const char* name) {
  const py::array a = py::array::ensure(x);
  if (!a) throw py::type_error(std::string(name) + ": expected token ids (an integer array or lists of ints)");
  const char kind = a.dtype().kind();
  if (a.size() > 0 && kind != 'i' && kind != 'u')
    throw py::type_error(std::string(name) + ": expected integer token ids, got dtype " +
                         py::str(a.dtype()).cast<std::string>());
  if (a.ndim() != rank)
    throw py::value_error(std::string(name) + ": expected " + std::to_string(rank) + " dimensions, got " +
                          std::to_string(a.ndim()));
  return tensor_of(a.size() > 0 ? py::object(a) : py::object(py::array_t<int64_t>(std::vector<py::ssize_t>(
                                                       a.shape(), a.shape() + a.ndim()))),
                   DType::I64, name);
}

SamplingConfig sampling_of(double temperature, int64_t top_k, double top_p, double repetition_penalty, uint64_t seed) {
  SamplingConfig s;
  // qkv generate's ranges
  check(temperature == 0 || (std::isfinite(temperature) && temperature >= 1e-4 && temperature <= 100), "temperature ",
        temperature, ": expected 0 (greedy) or a number from 0.0001 to 100");
  check(top_k >= 0 && top_k <= (int64_t{1} << 30), "top_k ", top_k, ": expected 0 (off) to 2^30");
  check(std::isfinite(top_p) && top_p >= 1e-6 && top_p <= 1, "top_p ", top_p, ": expected a number in [1e-6, 1]");
  check(std::isfinite(repetition_penalty) && repetition_penalty >= 0.01 && repetition_penalty <= 100,
        "repetition_penalty ", repetition_penalty, ": expected a number from 0.01 to 100 (1: off)");
  s.greedy = temperature == 0;
  s.temperature = static_cast<float>(temperature == 0 ? 1.0 : temperature);
  s.top_k = top_k;
  s.top_p = static_cast<float>(top_p);
  s.repetition_penalty = static_cast<float>(repetition_penalty);
  s.seed = seed;
  return s;
}

// qkv generate's and translate's rules on decoding options, with `what` naming the method: sampling
// (temperature > 0) draws one token at a time (beam 1), the sampling options need it, beam search
// ranks by length_penalty and applies no repetition_penalty. Ranges are sampling_of's.
void check_decoding(const char* what, double temperature, int64_t beam, std::optional<int64_t> top_k,
                    std::optional<double> top_p, std::optional<uint64_t> seed, std::optional<double> length_penalty,
                    double repetition_penalty) {
  (void)sampling_of(temperature, top_k.value_or(0), top_p.value_or(1.0), repetition_penalty, 0);
  const bool sample = temperature != 0;
  check(beam >= 1 && beam <= 256, what, ": beam_size ", beam, " (expected 1 to 256)");
  check(!sample || beam == 1, what, ": temperature ", temperature, " samples one token at a time; beam_size ", beam,
        " searches (give temperature=0 for beam search)");
  check(sample || (!top_k && !top_p && !seed), what,
        ": top_k, top_p and seed apply to sampling: give temperature > 0 (temperature=0 is greedy)");
  check(beam > 1 || !length_penalty, what, ": length_penalty ranks beam search's hypotheses: give beam_size >= 2");
  check(beam == 1 || repetition_penalty == 1.0, what,
        ": repetition_penalty applies to greedy decoding and sampling, not to beam search (beam_size ", beam, ")");
  check(!length_penalty || (std::isfinite(*length_penalty) && std::fabs(*length_penalty) <= 100), what,
        ": length_penalty ", length_penalty.value_or(0), " (expected -100 to 100)");
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", "A model's tokenizer (Model.tokenizer); lives as long as its model")
      .def_property_readonly("type", &Tokenizer::type, "'byte', 'gpt2', 'sentencepiece', 'hf' or 'marian'")
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("bos_id", &Tokenizer::bos_id, "-1: none")
      .def_property_readonly("eos_id", &Tokenizer::eos_id, "-1: none")
      .def_property_readonly("pad_id", &Tokenizer::pad_id, "-1: none")
      .def_property_readonly("mask_id", &Tokenizer::mask_id, "-1: none")
      .def("encode", [](const Tokenizer& t, const std::string& text) { return t.encode(text); }, py::arg("text"),
           "The text's token ids (no special tokens)")
      .def("decode", [](const Tokenizer& t, const std::vector<int32_t>& ids) { return t.decode(ids); },
           py::arg("ids"), "The text of token ids (special tokens dropped)")
      .def(
          "piece",
          [](const Tokenizer& t, int32_t id) {
            check(id >= 0 && id < t.vocab_size(), "piece: id ", id, " is outside the vocabulary (0 to ",
                  t.vocab_size() - 1, ")");
            return py::bytes(t.piece(id));
          },
          py::arg("id"), "The token's piece as the tokenizer stores it (bytes: a piece may be part of a character)");
  py::class_<PyModel>(m, "Model", "A model directory (qkv's own, a Hugging Face folder) or a GGUF file")
      .def_static(
          "load",
          [](const std::string& path, const std::string& dtype) {
            auto p = std::make_unique<PyModel>();
            p->path = path;
            {
              Computing computing;  // a new model: nobody else holds it
              p->model = std::make_unique<Model>(load_model(path, dtype));
            }
            try {
              p->info = model_task_info(path);
            } catch (const Error&) {
              p->info.task = p->model->config().arch == Arch::Decoder ? Task::LanguageModel : Task::Classify;
            }
            try {
              p->tok = load_tokenizer(path);
            } catch (const Error&) {
              p->tok = nullptr;  // token ids only (a llama2.c checkpoint without its tokenizer, say)
            }
            return p;
          },
          py::arg("path"), py::arg("dtype") = "",
          "Loads a model; dtype: '' (as stored), 'f32', 'bf16', 'f16', 'int8' or 'q4' (packed at load)")
      .def_property_readonly("task", [](const PyModel& p) { return std::string(task_name(p.info.task)); })
      .def_property_readonly("labels", [](const PyModel& p) { return p.info.labels; })
      .def_property_readonly("config",
                             [](const PyModel& p) {
                               const ModelConfig& c = p.model->config();
                               py::dict d;
                               d["arch"] = arch_name(c.arch);
                               d["vocab_size"] = c.vocab_size;
                               d["d_model"] = c.d_model;
                               d["n_heads"] = c.n_heads;
                               d["n_kv_heads"] = c.kv_heads();
                               d["d_ff"] = c.d_ff;
                               d["n_layers"] = c.n_layers;
                               d["n_encoder_layers"] = c.n_encoder_layers;
                               d["n_decoder_layers"] = c.n_decoder_layers;
                               d["max_len"] = c.max_len;
                               d["positional"] = positional_name(c.positional);
                               d["norm_first"] = c.norm_first;
                               d["parameters"] = p.model->num_parameters();
                               return d;
                             })
      .def_property_readonly(
          "tokenizer", [](const PyModel& p) -> const Tokenizer& { return p.tokenizer(); },
          py::return_value_policy::reference_internal, "The model's tokenizer (qkv.Error when it has none)")
      .def("encode", [](const PyModel& p, const std::string& text) { return p.tokenizer().encode(text); },
           py::arg("text"), "The text's token ids (no special tokens)")
      .def("decode", [](const PyModel& p, const std::vector<int32_t>& ids) { return p.tokenizer().decode(ids); },
           py::arg("ids"), "The text of token ids (special tokens dropped)")
      .def(
          "forward",
          [](const PyModel& p, const py::handle& ids, const py::object& lengths, const py::object& decoder_input,
             const py::object& target, double label_smoothing) -> py::object {
            // one row (a text or a list of ids) or a batch (B, T) of right-padded rows, as qkv forward
            Batch b;
            const bool batch = rows_of_rows(ids);
            if (batch) {
              b.input = ids_tensor(ids, 2, "ids");
            } else {
              const std::vector<int32_t> row = ids_of(p, ids, false);
              b.input = Tensor({1, static_cast<int64_t>(row.size())}, DType::I64);
              std::copy(row.begin(), row.end(), b.input.data<int64_t>());
            }
            if (!lengths.is_none()) b.input_lengths = ids_tensor(lengths, 1, "lengths");
            if (!decoder_input.is_none()) b.decoder_input = ids_tensor(decoder_input, 2, "decoder_input");
            if (!target.is_none()) {
              const py::array t = py::array::ensure(target);
              b.target = ids_tensor(target, t ? t.ndim() : 1, "target");
            }
            if (!std::isfinite(label_smoothing) || label_smoothing < 0 || label_smoothing > 1)
              throw py::value_error("label_smoothing: " + std::to_string(label_smoothing) + "; expected 0 to 1");
            if (target.is_none() && label_smoothing != 0)
              throw py::value_error("label_smoothing applies to the loss: give target too");
            const ModelConfig& c = p.model->config();
            if (c.arch == Arch::EncoderDecoder && !b.decoder_input.defined()) {
              check(b.target.defined() && c.bos_id >= 0, "forward: ", p.path,
                    " is an encoder-decoder: give decoder_input, or target and a bos_id in its config (the decoder "
                    "input is then the target shifted right)");
              b.decoder_input = shift_right(b.target, c.bos_id);
            }
            Tensor z;
            double loss = 0;
            {
              Busy busy(p);
              p.model->check_batch(b, {"ids", "lengths", "decoder_input", "target"});
              Tape tape;
              tape.recording = false;
              const Var logits = p.model->logits(tape, b);
              if (b.target.defined())
                loss = p.model->loss(tape, logits, b, static_cast<float>(label_smoothing))->value.data<float>()[0];
              z = logits->value;
            }
            if (target.is_none()) return numpy_of(z);
            return py::make_tuple(numpy_of(z), loss);
          },
          py::arg("ids"), py::kw_only(), py::arg("lengths") = py::none(), py::arg("decoder_input") = py::none(),
          py::arg("target") = py::none(), py::arg("label_smoothing") = 0.0,
          "Logits of one row of token ids (or a text, encoded without special tokens), (1, T, V), or of a batch "
          "(B, T) of right-padded rows (lengths: their real lengths; default from pad_id), as qkv forward; a "
          "classifier gives (B, C). With target (next tokens (B, T), or labels (B)): (logits, mean loss)")
      .def(
          "generate",
          [](const PyModel& p, const py::handle& prompt, int64_t max_new_tokens, double temperature,
             std::optional<int64_t> top_k, std::optional<double> top_p, double repetition_penalty,
             std::optional<uint64_t> seed, int64_t beam_size, std::optional<double> length_penalty,
             int64_t n) -> py::object {
            const ModelConfig& c = p.model->config();
            check(c.arch == Arch::Decoder, "generate: ", p.path, " is a ", arch_name(c.arch),
                  " model, not a language model");
            check(max_new_tokens >= 1, "generate: max_new_tokens ", max_new_tokens, " (expected >= 1)");
            check(n >= 1 && n <= 1000, "generate: n ", n, " (expected 1 to 1000)");
            check_decoding("generate", temperature, beam_size, top_k, top_p, seed, length_penalty, repetition_penalty);
            const bool sample = temperature != 0;
            check(n == 1 || sample || beam_size >= n, "generate: n ", n,
                  beam_size > 1 ? detail::concat(" with beam_size ", beam_size, ": beam search returns at most its ",
                                                 beam_size, " best continuations")
                                : std::string(": greedy decoding has one continuation (temperature > 0 samples n "
                                              "different ones; beam_size >= n gives the n best)"));
            // one prompt (a text or a list of ids) or a list of them
            const bool many = rows_of_rows(prompt);
            std::vector<py::object> prompts;
            if (many) {
              for (const py::handle x : prompt) prompts.push_back(py::reinterpret_borrow<py::object>(x));
            } else {
              prompts.push_back(py::reinterpret_borrow<py::object>(prompt));
            }
            py::list results;
            for (const py::object& one : prompts) {
              const bool text = py::isinstance<py::str>(one);
              const std::vector<int32_t> ids = ids_of(p, one, true);
              check(!ids.empty(), "generate: the prompt has no tokens");
              GenerateConfig g;
              g.max_new_tokens = max_new_tokens;
              if (c.positional == Positional::Learned) {
                // learned positions end at max_len: the prompt and its continuation must fit the table
                const int64_t room = c.max_len - static_cast<int64_t>(ids.size()) + 1;
                check(room >= 1, "generate: the prompt's ", ids.size(), " tokens do not fit the model's max_len ",
                      c.max_len, " (its learned positions)");
                g.max_new_tokens = std::min(g.max_new_tokens, room);
              }
              g.sampling = sampling_of(temperature, top_k.value_or(0), top_p.value_or(1.0), repetition_penalty,
                                       seed.value_or(0));
              g.beam_size = beam_size;
              g.length_penalty = length_penalty.value_or(1.0);
              if (beam_size > 1) g.num_return = n;
              if (p.tok) g.sampling.vocab_limit = p.tok->vocab_size();
              // n samples: the prompt n times, as qkv generate --sample -n N
              const std::vector<std::vector<int32_t>> rows(static_cast<size_t>(sample ? n : 1), ids);
              std::vector<Generation> out;
              {
                Busy busy(p);
                g.on_step = signals_between_steps(busy.computing);  // Ctrl-C between tokens
                out = generate(*p.model, rows, g);
              }
              py::list these;
              for (const Generation& gen : out) {
                if (text) {
                  // prompt and continuation decoded together (a tokenizer may mark a word's start on the
                  // token after it), then the prompt's own text taken off
                  std::vector<int32_t> all = ids;
                  all.insert(all.end(), gen.tokens.begin(), gen.tokens.end());
                  const std::string whole = output_text(*p.tok, all), head = output_text(*p.tok, ids);
                  these.append(py::str(whole.compare(0, head.size(), head) == 0 ? whole.substr(head.size())
                                                                                : output_text(*p.tok, gen.tokens)));
                } else {
                  these.append(py::cast(gen.tokens));
                }
              }
              results.append(n == 1 ? these[0] : py::object(these));
            }
            return many ? py::object(results) : py::object(results[0]);
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_new_tokens") = 64, py::arg("temperature") = 0.0,
          py::arg("top_k") = py::none(), py::arg("top_p") = py::none(), py::arg("repetition_penalty") = 1.0,
          py::arg("seed") = py::none(), py::arg("beam_size") = 1, py::arg("length_penalty") = py::none(),
          py::arg("n") = 1,
          "Continues a prompt (text: the continuation's text; token ids: its ids), or each prompt of a list; "
          "temperature 0 is greedy; n > 1: a list of n continuations (samples, or beam search's n best)")
      .def(
          "translate",
          [](const PyModel& p, const std::vector<std::string>& texts, std::optional<int64_t> beam_size,
             std::optional<int64_t> max_new_tokens, std::optional<double> length_penalty, double temperature,
             std::optional<int64_t> top_k, std::optional<double> top_p, double repetition_penalty,
             std::optional<uint64_t> seed, int64_t batch) {
            const ModelConfig& c = p.model->config();
            check(c.arch == Arch::EncoderDecoder, "translate: ", p.path, " is a ", arch_name(c.arch),
                  " model, not a translation model");
            // beam search with 4 beams, or with temperature > 0 sampling
            const int64_t beam = beam_size.value_or(temperature != 0 ? 1 : 4);
            check_decoding("translate", temperature, beam, top_k, top_p, seed, length_penalty, repetition_penalty);
            check(!max_new_tokens || (*max_new_tokens >= 1 && *max_new_tokens <= (1 << 20)),
                  "translate: max_new_tokens ", max_new_tokens.value_or(0), " (expected 1 to 2^20)");
            check(batch >= 1 && batch <= 4096, "translate: batch ", batch, " (expected 1 to 4096)");
            // as qkv translate: a text with no tokens translates to "" and is not decoded; the others
            // in batches of `batch`, each decoding up to twice its longest source + 10 tokens
            std::vector<std::string> out(texts.size());
            std::vector<std::vector<int32_t>> ids(texts.size());
            std::vector<size_t> rows;
            for (size_t i = 0; i < texts.size(); ++i) {
              ids[i] = p.tokenizer().encode(texts[i]);
              if (ids[i].empty()) continue;
              ids[i] = source_ids(p.tokenizer(), std::move(ids[i]));
              rows.push_back(i);
            }
            for (size_t b0 = 0; b0 < rows.size(); b0 += static_cast<size_t>(batch)) {
              const size_t b1 = std::min(rows.size(), b0 + static_cast<size_t>(batch));
              std::vector<std::vector<int32_t>> src;
              int64_t longest = 0;
              for (size_t k = b0; k < b1; ++k) {
                longest = std::max<int64_t>(longest, static_cast<int64_t>(ids[rows[k]].size()));
                src.push_back(ids[rows[k]]);
              }
              GenerateConfig g;
              g.max_new_tokens = max_new_tokens.value_or(2 * longest + 10);
              if (c.positional == Positional::Learned) g.max_new_tokens = std::min(g.max_new_tokens, c.max_len);
              g.beam_size = beam;
              g.length_penalty = length_penalty.value_or(1.0);
              g.sampling = sampling_of(temperature, top_k.value_or(0), top_p.value_or(1.0), repetition_penalty,
                                       seed.value_or(0));
              g.sampling.vocab_limit = p.tokenizer().vocab_size();
              std::vector<Generation> gen;
              {
                Busy busy(p);
                g.on_step = signals_between_steps(busy.computing);  // Ctrl-C between tokens
                gen = translate(*p.model, src, g);
              }
              for (size_t k = b0; k < b1; ++k) out[rows[k]] = output_text(p.tokenizer(), gen[k - b0].tokens);
            }
            return out;
          },
          py::arg("texts"), py::kw_only(), py::arg("beam_size") = py::none(), py::arg("max_new_tokens") = py::none(),
          py::arg("length_penalty") = py::none(), py::arg("temperature") = 0.0, py::arg("top_k") = py::none(),
          py::arg("top_p") = py::none(), py::arg("repetition_penalty") = 1.0, py::arg("seed") = py::none(),
          py::arg("batch") = 16,
          "Translates each text as qkv translate does: beam search (beam_size 4; 1 is greedy), or sampling with "
          "temperature > 0; max_new_tokens: default twice the batch's longest source + 10; an empty text gives ''")
      .def(
          "classify",
          [](const PyModel& p, const std::vector<std::string>& texts) {
            check(p.info.task == Task::Classify && !p.info.labels.empty(), "classify: ", p.path,
                  " is not a classifier with labels (task.json)");
            py::list out;
            for (const std::string& t : texts) {
              const std::vector<int32_t> ids = classifier_ids(p.tokenizer(), t, p.info.max_len);
              Tensor z;
              {
                Busy busy(p);
                z = logits_of(*p.model, ids);
              }
              const int64_t C = z.size(-1);
              const float* row = z.data<float>();
              const int64_t best = std::max_element(row, row + C) - row;
              double s = 0;
              for (int64_t k = 0; k < C; ++k) s += std::exp(static_cast<double>(row[k] - row[best]));
              out.append(py::make_tuple(p.info.labels.at(static_cast<size_t>(best)), 1.0 / s));
            }
            return out;
          },
          py::arg("texts"), "(label, probability) of each text")
      .def(
          "fill_mask",
          [](const PyModel& p, const std::string& text, int64_t top_k) {
            // qkv fill-mask's answer: for each mask token, the top_k tokens with their probabilities
            check(p.model->config().arch == Arch::EncoderMLM, "fill_mask: ", p.path, " is a ",
                  arch_name(p.model->config().arch), " model; fill_mask needs a masked-language model");
            check(top_k >= 1, "fill_mask: top_k ", top_k, " (expected >= 1)");
            const Tokenizer& tok = p.tokenizer();
            const int32_t mask = tok.mask_id();
            check(mask >= 0, "fill_mask: ", p.path, ": the tokenizer has no mask token");
            const ModelConfig& c = p.model->config();
            const std::vector<int32_t> ids =
                encode_input(tok, text, c.positional == Positional::Learned ? c.max_len : 0);
            std::vector<size_t> at;
            for (size_t i = 0; i < ids.size(); ++i)
              if (ids[i] == mask) at.push_back(i);
            check(!at.empty(), "fill_mask: no mask token ", tok.piece(mask), " in '", text, "'");
            Tensor z;
            {
              Busy busy(p);
              z = logits_of(*p.model, ids);
            }
            py::list out;
            const std::vector<std::vector<TokenChoice>> top = top_tokens(z, at, top_k, p.path);
            for (size_t k = 0; k < at.size(); ++k) {
              py::list cands;
              for (const TokenChoice& t : top[k]) {
                std::vector<int32_t> filled = ids;
                filled[at[k]] = t.id < tok.vocab_size() ? t.id : mask;
                py::dict d;
                d["id"] = t.id;
                d["token"] = t.id < tok.vocab_size() ? tok.decode({t.id}) : "<id " + std::to_string(t.id) + ">";
                d["prob"] = t.prob;
                d["logit"] = t.logit;
                d["sequence"] = tok.decode(filled);
                cands.append(d);
              }
              out.append(cands);
            }
            return out;
          },
          py::arg("text"), py::kw_only(), py::arg("top_k") = 5,
          "For each mask token of the text ([MASK]), the top_k tokens: [{'id', 'token', 'prob', 'logit', "
          "'sequence'}] (qkv fill-mask's answer)")
      .def(
          "attention_maps",
          [](const PyModel& p, const py::handle& text, const py::object& source, const py::object& layers,
             const py::object& heads) {
            // the token ids the model reads, as its commands build them (qkv serve's /v1/attention)
            const ModelConfig& c = p.model->config();
            const bool encdec = c.arch == Arch::EncoderDecoder;
            std::vector<int32_t> ids, src;
            if (encdec) {
              check(!source.is_none(), "attention_maps: ", p.path, " translates: give the source text (source=...)");
              src = source_ids(p.tokenizer(), ids_of(p, source, false));
            }
            if (py::isinstance<py::str>(text)) {
              ids = trace_ids(p.tokenizer(), c, p.info, text.cast<std::string>());
            } else {
              ids = text.cast<std::vector<int32_t>>();  // as the model reads them
            }
            check(!ids.empty(), "attention_maps: the text has no tokens");
            const Batch b = trace_batch(ids, src);
            AttentionTrace trace;
            {
              Busy busy(p);
              trace = trace_attention(*p.model, b);
            }
            const auto wanted = [](const py::object& sel, int64_t i) {
              if (sel.is_none()) return true;
              for (const py::handle x : sel)
                if (x.cast<int64_t>() == i) return true;
              return false;
            };
            py::list maps;
            for (const AttentionMap& am : trace.maps) {
              if (!wanted(layers, am.layer)) continue;
              std::vector<int64_t> hs;
              for (int64_t h = 0; h < am.heads(); ++h)
                if (wanted(heads, h)) hs.push_back(h);
              py::array_t<float> w({static_cast<py::ssize_t>(hs.size()), static_cast<py::ssize_t>(am.rows()),
                                    static_cast<py::ssize_t>(am.cols())});
              for (size_t i = 0; i < hs.size(); ++i) {
                const std::vector<float> x = am.weights(0, hs[i], 0, am.rows());
                std::copy(x.begin(), x.end(), w.mutable_data() + static_cast<int64_t>(i) * am.rows() * am.cols());
              }
              py::dict d;
              d["stack"] = am.stack;
              d["kind"] = am.kind;
              d["layer"] = am.layer;
              d["heads"] = hs;
              d["weights"] = w;
              maps.append(d);
            }
            py::dict out;
            out["ids"] = ids;
            if (encdec) out["source_ids"] = src;
            out["maps"] = maps;
            return out;
          },
          py::arg("text"), py::kw_only(), py::arg("source") = py::none(), py::arg("layers") = py::none(),
          py::arg("heads") = py::none(),
          "Every layer's attention weights on a text (and for a translation model its source): {'ids', 'maps': "
          "[{'stack', 'kind', 'layer', 'heads', 'weights': (heads, rows, cols)}]}; rows sum to 1 over the keys "
          "they may see. Weights show part of the computation, not a causal explanation of it");
}

}  // namespace qkv::python
