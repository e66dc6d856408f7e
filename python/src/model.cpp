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
  py::gil_scoped_release nogil;
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

SamplingConfig sampling_of(double temperature, int64_t top_k, double top_p, double repetition_penalty, uint64_t seed) {
  SamplingConfig s;
  if (!std::isfinite(temperature) || temperature < 0)
    throw py::value_error("temperature: " + std::to_string(temperature) + "; expected >= 0 (0: greedy)");
  s.greedy = temperature == 0;
  s.temperature = static_cast<float>(temperature == 0 ? 1.0 : temperature);
  s.top_k = top_k;
  s.top_p = static_cast<float>(top_p);
  s.repetition_penalty = static_cast<float>(repetition_penalty);
  s.seed = seed;
  return s;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<PyModel>(m, "Model", "A model directory (qkv's own, a Hugging Face folder) or a GGUF file")
      .def_static(
          "load",
          [](const std::string& path, const std::string& dtype) {
            auto p = std::make_unique<PyModel>();
            p->path = path;
            {
              py::gil_scoped_release nogil;  // a new model: nobody else holds it
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
      .def("encode", [](const PyModel& p, const std::string& text) { return p.tokenizer().encode(text); },
           py::arg("text"), "The text's token ids (no special tokens)")
      .def("decode", [](const PyModel& p, const std::vector<int32_t>& ids) { return p.tokenizer().decode(ids); },
           py::arg("ids"), "The text of token ids (special tokens dropped)")
      .def(
          "forward",
          [](const PyModel& p, const py::handle& ids) {
            const std::vector<int32_t> row = ids_of(p, ids, false);
            Tensor z;
            {
              Busy busy(p);
              z = logits_of(*p.model, row);
            }
            return numpy_of(z);
          },
          py::arg("ids"),
          "Logits for one row of token ids (or a text, encoded without special tokens): (1, T, V) for a "
          "language or masked-language model, (1, C) for a classifier")
      .def(
          "generate",
          [](const PyModel& p, const py::handle& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
             double top_p, double repetition_penalty, uint64_t seed, int64_t beam_size) {
            check(p.model->config().arch == Arch::Decoder, "generate: ", p.path, " is a ",
                  arch_name(p.model->config().arch), " model, not a language model");
            const bool text = py::isinstance<py::str>(prompt);
            const std::vector<int32_t> ids = ids_of(p, prompt, true);
            GenerateConfig g;
            g.max_new_tokens = max_new_tokens;
            g.sampling = sampling_of(temperature, top_k, top_p, repetition_penalty, seed);
            g.beam_size = beam_size;
            if (p.tok) g.sampling.vocab_limit = p.tok->vocab_size();
            std::vector<Generation> out;
            {
              Busy busy(p);
              out = generate(*p.model, {ids}, g);
            }
            if (text) return py::object(py::str(output_text(*p.tok, out[0].tokens)));
            return py::object(py::cast(out[0].tokens));
          },
          py::arg("prompt"), py::kw_only(), py::arg("max_new_tokens") = 64, py::arg("temperature") = 1.0,
          py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("repetition_penalty") = 1.0, py::arg("seed") = 0,
          py::arg("beam_size") = 1,
          "Continues a prompt (text: the continuation's text; token ids: its ids); temperature 0 is greedy")
      .def(
          "translate",
          [](const PyModel& p, const std::vector<std::string>& texts, int64_t beam_size,
             std::optional<int64_t> max_new_tokens, double length_penalty) {
            check(p.model->config().arch == Arch::EncoderDecoder, "translate: ", p.path, " is a ",
                  arch_name(p.model->config().arch), " model, not a translation model");
            std::vector<std::vector<int32_t>> src;
            int64_t longest = 0;
            for (const std::string& t : texts) {
              src.push_back(source_ids(p.tokenizer(), p.tokenizer().encode(t)));
              longest = std::max<int64_t>(longest, static_cast<int64_t>(src.back().size()));
            }
            GenerateConfig g;
            g.beam_size = beam_size;
            g.length_penalty = length_penalty;
            g.max_new_tokens = max_new_tokens ? *max_new_tokens : 2 * longest + 10;  // qkv translate's default
            g.sampling.vocab_limit = p.tokenizer().vocab_size();
            if (p.model->config().positional == Positional::Learned)
              g.max_new_tokens = std::min(g.max_new_tokens, p.model->config().max_len);
            std::vector<Generation> out;
            {
              Busy busy(p);
              out = translate(*p.model, src, g);
            }
            std::vector<std::string> r;
            for (const Generation& x : out) r.push_back(output_text(p.tokenizer(), x.tokens));
            return r;
          },
          py::arg("texts"), py::kw_only(), py::arg("beam_size") = 4, py::arg("max_new_tokens") = py::none(),
          py::arg("length_penalty") = 1.0,
          "Translates each text (beam search; beam_size 1 is greedy); max_new_tokens: default twice the longest "
          "source + 10, as qkv translate")
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
