// qkv._qkv.train: `qkv train` from Python (qkv::train_model, qkv/train_run.h). The options are
// the command's, named as its flags with '_' for '-' (max_tokens is --max-tokens); the run
// computes with the GIL released and takes it back for each progress report and log line.
// A callback that raises (KeyboardInterrupt included) or returns False stops the run after the
// step: the checkpoint is saved, so train(..., resume=True) continues it.
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "bindings.h"
#include "qkv/train_run.h"

namespace qkv::python {
namespace {

// An option's value, checked against the field's type: an int for a count (not a bool, not a
// float), a number for a float (not a bool), a str, a bool.
template <class T>
T option_value(const std::string& name, const py::handle& v) {
  const std::string got = py::str(py::type::of(v).attr("__name__")).cast<std::string>();
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(v)) throw py::type_error(name + ": expected True or False, got " + got);
    return v.cast<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!py::isinstance<py::str>(v)) throw py::type_error(name + ": expected a str, got " + got);
    return v.cast<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v))
      throw py::type_error(name + ": expected an int, got " + got);
    try {
      return v.cast<T>();
    } catch (const py::cast_error&) {
      throw py::value_error(name + ": " + py::str(v).cast<std::string>() + " is out of range");
    }
  } else {
    if (py::isinstance<py::bool_>(v) || !(py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)))
      throw py::type_error(name + ": expected a number, got " + got);
    return v.cast<double>();
  }
}

// options (a dict of the given options) -> TrainOptions, each given option listed as its flag
TrainOptions train_options_of(const py::dict& given) {
  TrainOptions o;
  for (const auto& [key, value] : given) {
    const std::string name = py::str(key).cast<std::string>();
    bool known = true;
    // clang-format off
    if (name == "task") o.task = option_value<std::string>(name, value);
    else if (name == "data") o.data = option_value<std::string>(name, value);
    else if (name == "source") o.source = option_value<std::string>(name, value);
    else if (name == "target") o.target = option_value<std::string>(name, value);
    else if (name == "train_only") o.train_only = option_value<std::string>(name, value);
    else if (name == "preset") o.preset = option_value<std::string>(name, value);
    else if (name == "out") o.out = option_value<std::string>(name, value);
    else if (name == "config") o.config = option_value<std::string>(name, value);
    else if (name == "tokenizer") o.tokenizer = option_value<std::string>(name, value);
    else if (name == "spm_type") o.spm_type = option_value<std::string>(name, value);
    else if (name == "init") o.init = option_value<std::string>(name, value);
    else if (name == "precision") o.precision = option_value<std::string>(name, value);
    else if (name == "max_tokens") o.max_tokens = option_value<int64_t>(name, value);
    else if (name == "max_len") o.max_len = option_value<int64_t>(name, value);
    else if (name == "eval_every") o.eval_every = option_value<int64_t>(name, value);
    else if (name == "average") o.average = option_value<int64_t>(name, value);
    else if (name == "vocab") o.vocab = option_value<int64_t>(name, value);
    else if (name == "steps") o.steps = option_value<int64_t>(name, value);
    else if (name == "epochs") o.epochs = option_value<int64_t>(name, value);
    else if (name == "warmup") o.warmup = option_value<int64_t>(name, value);
    else if (name == "parts") o.parts = option_value<int64_t>(name, value);
    else if (name == "seed") o.seed = option_value<uint64_t>(name, value);
    else if (name == "valid_fraction") o.valid_fraction = option_value<double>(name, value);
    else if (name == "test_fraction") o.test_fraction = option_value<double>(name, value);
    else if (name == "train_only_ratio") o.train_only_ratio = option_value<double>(name, value);
    else if (name == "subword_alpha") o.subword_alpha = option_value<double>(name, value);
    else if (name == "bucket_mb") o.bucket_mb = option_value<double>(name, value);
    else if (name == "minutes") o.minutes = option_value<double>(name, value);
    else if (name == "lr") o.lr = option_value<double>(name, value);
    else if (name == "dropout") o.dropout = option_value<double>(name, value);
    else if (name == "label_smoothing") o.label_smoothing = option_value<double>(name, value);
    else if (name == "resume") o.resume = option_value<bool>(name, value);
    else known = false;
    // clang-format on
    if (!known) throw py::type_error("train(): unexpected option '" + name + "'");
    std::string flag = "--" + name;
    for (char& c : flag)
      if (c == '_') c = '-';
    o.given.push_back(flag);
  }
  return o;
}

py::dict progress_dict(const LoopProgress& lp) {
  py::dict d;
  d["step"] = lp.step;
  d["epoch"] = lp.epoch;
  d["loss"] = lp.loss;
  d["lr"] = lp.lr;
  d["tokens_per_s"] = lp.tokens_per_s;
  d["elapsed_s"] = lp.elapsed_s;
  d["fraction"] = lp.fraction >= 0 ? py::object(py::float_(lp.fraction)) : py::object(py::none());
  d["start_fraction"] = lp.start_fraction;
  d["evaluated"] = lp.evaluated;
  d["valid_loss"] = std::isfinite(lp.valid_loss) ? py::object(py::float_(lp.valid_loss)) : py::object(py::none());
  d["best"] = lp.best;
  return d;
}

py::object nan_to_none(double v) { return std::isnan(v) ? py::object(py::none()) : py::object(py::float_(v)); }

}  // namespace

void bind_train(py::module_& m) {
  m.def(
      "train",
      [](const py::dict& options, const py::object& progress, const py::object& log) {
        const TrainOptions o = train_options_of(options);
        std::atomic<bool> stop{false};
        std::optional<py::error_already_set> raised;  // a callback's exception, raised once the run returns
        // with the GIL: the callback, and Ctrl-C (blocked while the run computes, see Computing: it
        // is taken when the signals open here, and PyErr_CheckSignals raises its KeyboardInterrupt)
        const Computing* computing = nullptr;  // the run's, while it runs
        auto call = [&](const std::function<py::object()>& f) {
          py::gil_scoped_acquire gil;
          // a pending Ctrl-C is taken here, on this thread, which is between steps
          const SignalsOpen open(*computing);
          if (raised) return;
          try {
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            const py::object r = f();
            if (py::isinstance<py::bool_>(r) && !r.cast<bool>()) stop = true;
          } catch (py::error_already_set& e) {
            raised.emplace(std::move(e));
            stop = true;
          }
        };
        TrainHooks hooks;
        hooks.stop = &stop;
        hooks.progress = [&](const LoopProgress& lp) {
          call([&] { return progress.is_none() ? py::object(py::none()) : progress(progress_dict(lp)); });
        };
        if (!log.is_none()) hooks.log = [&](const std::string& line) { call([&] { return log(line); }); };
        TrainResult r;
        {
          const Computing running;
          computing = &running;
          r = train_model(o, hooks);
        }
        if (raised) throw std::move(*raised);
        const LoopResult& l = r.loop;
        py::dict d;
        d["out"] = r.out;
        d["stopped_before_training"] = r.stopped_before_training;
        d["interrupted"] = l.interrupted;
        d["steps"] = l.steps;
        d["start_step"] = l.start_step;
        d["epochs"] = l.epochs;
        d["seconds"] = l.seconds;
        d["parameters"] = r.parameters;
        d["best_valid_loss"] = r.validated ? nan_to_none(l.best_valid_loss) : py::object(py::none());
        d["last_valid_loss"] = r.validated ? nan_to_none(l.last_valid_loss) : py::object(py::none());
        d["averaged"] = l.averaged;
        d["averaged_valid_loss"] = l.averaged > 0 ? nan_to_none(l.averaged_valid_loss) : py::object(py::none());
        d["averaged_kept"] = l.averaged_kept;
        return d;
      },
      py::arg("options"), py::arg("progress") = py::none(), py::arg("log") = py::none(),
      "Runs `qkv train` with the given options (a dict); see qkv.train");
}

}  // namespace qkv::python
