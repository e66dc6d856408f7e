// qkv plot: the loss curves of several training runs in one SVG chart (their metrics.jsonl), to
// compare runs: two seeds, two precisions, two learning rates.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/viz.h"

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PlotOptions {
  std::vector<std::string> runs;
  std::string out, what = "both", title = "training runs";
  int64_t smooth = 1;
  bool linear = false;
};

struct Run {
  std::string name;
  std::vector<double> step, loss, valid_step, valid_loss;
};

// RUN is [NAME=]PATH: a qkv train output directory (its metrics.jsonl) or a metrics file. The
// legend shows NAME, else the directory's name.
Run read_run(const std::string& spec) {
  Run r;
  std::string path = spec;
  if (const size_t eq = spec.find('='); eq != std::string::npos && eq > 0) {
    r.name = spec.substr(0, eq);
    path = spec.substr(eq + 1);
  }
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  const std::string file = dir ? (fs::path(path) / "metrics.jsonl").string() : path;
  if (r.name.empty()) {
    // the run's directory: PATH itself, or the metrics file's folder
    fs::path p = fs::path(path).lexically_normal();
    if (!dir) p = p.parent_path();
    r.name = p.filename().string();
    if (r.name.empty()) r.name = p.parent_path().filename().string();  // "DIR/"
    if (r.name.empty() || r.name == "." || r.name == "..") r.name = path;
  }
  const std::string text = read_file(file, "a training run's metrics");
  // one JSON object per line, as qkv train writes them: "step" an integer >= 1, "loss" and
  // "valid_loss" numbers where present (null for a step whose loss was not finite)
  size_t at = 0;
  int64_t line_no = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(file, " line ", line_no, ": not JSON (", e.what(), "); expected one object per line, as qkv train writes");
    }
    check(j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() >= 1, file,
          " line ", line_no, ": expected an object with an integer \"step\" >= 1");
    const auto step = static_cast<double>(j["step"].get<int64_t>());
    for (const char* key : {"loss", "valid_loss"}) {
      if (!j.contains(key) || j[key].is_null()) continue;
      check(j[key].is_number() && std::isfinite(j[key].get<double>()), file, " line ", line_no, ": \"", key,
            "\" is ", j[key].dump(), "; expected a finite number (or null)");
      const double v = j[key].get<double>();
      if (std::string(key) == "loss") {
        r.step.push_back(step), r.loss.push_back(v);
      } else {
        r.valid_step.push_back(step), r.valid_loss.push_back(v);
      }
    }
  }
  check(!r.step.empty() || !r.valid_step.empty(), file, ": no losses in it (is it a qkv train metrics.jsonl?)");
  return r;
}

// The mean of the last n values at each point (fewer at the start).
std::vector<double> moving_mean(const std::vector<double>& y, int64_t n) {
  std::vector<double> out(y.size());
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    sum += y[i];
    if (i >= static_cast<size_t>(n)) sum -= y[i - static_cast<size_t>(n)];
    out[i] = sum / static_cast<double>(std::min<size_t>(i + 1, static_cast<size_t>(n)));
  }
  return out;
}

int run_plot(const PlotOptions& o) {
  std::vector<viz::Series> series;
  for (const std::string& spec : o.runs) {
    const Run r = read_run(spec);
    if (o.what != "valid") {
      check(!r.step.empty(), spec, ": no training losses in its metrics");
      series.push_back({r.name + (o.what == "both" ? " (train)" : ""), r.step, moving_mean(r.loss, o.smooth)});
    }
    if (o.what != "train") {
      check(!r.valid_step.empty(), spec, ": no validation losses in its metrics (train with --eval-every N, or plot ",
            "--what train)");
      series.push_back({r.name + (o.what == "both" ? " (validation)" : ""), r.valid_step, r.valid_loss});
    }
  }
  const std::string x_label =
      o.smooth > 1 && o.what != "valid" ? "step (training losses: the mean of the last " + std::to_string(o.smooth) + ")"
                                        : "step";
  viz::write_svg(o.out, viz::line_chart_svg(series, o.title, x_label, "cross-entropy (nats)", !o.linear));
  std::printf("wrote %s: %zu curve%s from %zu run%s\n", o.out.c_str(), series.size(), series.size() == 1 ? "" : "s",
              o.runs.size(), o.runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

Runner add_plot(CLI::App& app) {
  auto o = std::make_shared<PlotOptions>();
  CLI::App* c = app.add_subcommand(
      "plot", "Draw the loss curves of training runs in one SVG chart (each run's metrics.jsonl), to compare them");
  c->add_option("runs", o->runs,
                "[NAME=]RUN: a qkv train output directory or a metrics.jsonl file; NAME labels it (default: the "
                "directory's name)")
      ->required();
  c->add_option("--out", o->out, "The SVG file to write")->required();
  c->add_option("--what", o->what, "train, valid or both (default): which losses to draw")
      ->check(CLI::IsMember({"train", "valid", "both"}));
  c->add_option("--smooth", o->smooth, "Draw each training loss as the mean of the last N steps (default 1: as logged)")
      ->transform(whole(1, 1000000));
  c->add_option("--title", o->title, "The chart's title");
  c->add_flag("--linear", o->linear, "A linear loss axis (default: logarithmic)");
  return [o] { return run_plot(*o); };
}

}  // namespace qkv::cli
