// Line charts and heatmaps as SVG 1.1 text (see include/qkv/viz.h). Everything is laid out here
// in pixels from estimated text widths; no font metrics are available, so widths are estimated
// per code point (ASCII 0.6 em, other characters 1 em) and every band gets a margin.
#include "qkv/viz.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "qkv/error.h"
#include "qkv/files.h"
#include "qkv/tokenizer.h"
#include "qkv/npy.h"

namespace qkv::viz {
namespace {

constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";

template <class... Args>
std::string format(const char* f, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// A coordinate: at most two decimals, no trailing zeros, never "-0".
std::string num(double v) {
  if (std::fabs(v) < 0.005) return "0";
  std::string s = format("%.2f", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// Decodes one code point at s[i]; returns its length, or 1 with ok = false for a byte that does
// not start a valid shortest-form sequence.
size_t decode(std::string_view s, size_t i, char32_t& cp, bool& ok) {
  const size_t len = decode_utf8(s, i, cp);
  ok = len > 0;
  if (!ok) cp = 0xFFFD;
  return ok ? len : 1;
}

// Estimated rendered width in em: 0.6 per ASCII character, 1 per other character.
double text_em(std::string_view s) {
  double em = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    bool ok;
    i += decode(s, i, c, ok);
    em += c < 0x80 ? 0.6 : 1.0;
  }
  return em;
}

// The first max_chars - 1 code points and "…" when s is longer than max_chars code points.
std::string shorten(std::string_view s, size_t max_chars) {
  size_t chars = 0, cut = s.size();
  for (size_t i = 0; i < s.size(); ++chars) {
    if (chars == max_chars - 1) cut = i;
    char32_t c;
    bool ok;
    i += decode(s, i, c, ok);
  }
  if (chars <= max_chars) return std::string(s);
  return std::string(s.substr(0, cut)) + "\u2026";
}

struct Rgb {
  double r, g, b;
};

// viridis at t = 0, 0.1, ..., 1
constexpr Rgb kViridis[] = {
    {0x44, 0x01, 0x54}, {0x48, 0x24, 0x75}, {0x41, 0x44, 0x87}, {0x35, 0x5f, 0x8d},
    {0x2a, 0x78, 0x8e}, {0x21, 0x91, 0x8c}, {0x22, 0xa8, 0x84}, {0x44, 0xbf, 0x70},
    {0x7a, 0xd1, 0x51}, {0xbd, 0xdf, 0x26}, {0xfd, 0xe7, 0x25},
};

Rgb viridis(double t) {
  t = std::clamp(t, 0.0, 1.0) * 10;
  const int k = std::min(static_cast<int>(t), 9);
  const double f = t - k;
  const Rgb a = kViridis[k], b = kViridis[k + 1];
  return {a.r + (b.r - a.r) * f, a.g + (b.g - a.g) * f, a.b + (b.b - a.b) * f};
}

std::string hex(Rgb c) {
  auto byte = [](double v) { return static_cast<unsigned>(std::lround(std::clamp(v, 0.0, 255.0))); };
  return format("#%02x%02x%02x", byte(c.r), byte(c.g), byte(c.b));
}

// Relative luminance (sRGB weights on the 0..255 values), 0..1.
double luminance(Rgb c) { return (0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b) / 255.0; }

// Tableau 10: distinguishable, colour-blind-aware; after ten series the dash pattern changes.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr const char* kDashes[] = {"", "6 3", "2 2", "8 3 2 3"};

// "2e+05" -> "2e5", "1.5e-07" -> "1.5e-7"
std::string compact_exponent(std::string s) {
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), ex = s.substr(e + 1);
  const bool neg = !ex.empty() && ex[0] == '-';
  if (!ex.empty() && (ex[0] == '+' || ex[0] == '-')) ex.erase(0, 1);
  while (ex.size() > 1 && ex[0] == '0') ex.erase(0, 1);
  return mant + "e" + (neg ? "-" : "") + ex;
}

// A tick label for a linear axis whose ticks are `step` apart and reach `max_abs`.
std::string tick_label(double v, double step, double max_abs) {
  if (std::fabs(v) < step * 1e-9) v = 0;
  const int step_exp = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  if (max_abs >= 1e6 || max_abs < 1e-4) {
    const int max_exp = static_cast<int>(std::floor(std::log10(max_abs)));
    const int sig = std::clamp(max_exp - step_exp + 1, 1, 15);
    return compact_exponent(format("%.*g", sig, v));
  }
  return format("%.*f", std::clamp(-step_exp, 0, 10), v);
}

// A tick label on a log axis: plain for 1e-4 <= v < 1e6, else "1e-5"-style.
std::string log_tick_label(double v) {
  if (v >= 1e-4 && v < 1e6) return format("%.6g", v);
  return compact_exponent(format("%.0e", v));
}

std::string text_el(double x, double y, const std::string& content, const char* anchor, double size,
                     const std::string& extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\" font-size=\"" +
         num(size) + "\"" + extra + ">" + xml_escape(content) + "</text>\n";
}

std::string header(double w, double h, const std::string& title) {
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + num(w) + "\" height=\"" + num(h) +
       "\" viewBox=\"0 0 " + num(w) + " " + num(h) + "\" font-family=\"" + kFont + "\">\n";
  s += "<title>" + xml_escape(title) + "</title>\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(w) + "\" height=\"" + num(h) + "\" fill=\"#ffffff\"/>\n";
  return s;
}

// FNV-1a, for ids that stay unique when several documents are inlined in one HTML page.
uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    bool ok;
    const size_t len = decode(text, i, c, ok);
    const bool allowed = ok && (c == 0x9 || c == 0xA || c == 0xD || c >= 0x20) && c != 0xFFFE && c != 0xFFFF;
    if (!allowed) {
      out += "\uFFFD";
    } else if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '"') {
      out += "&quot;";
    } else if (c == '\'') {
      out += "&apos;";
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  check(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "nice_ticks: needs finite lo <= hi; got [", lo, ", ",
        hi, "]");
  check(target >= 2, "nice_ticks: target must be at least 2; got ", target);
  // [lo, hi] <- widened when empty
  if (lo == hi) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  // step <- 1, 2 or 5 x 10^k nearest above (hi - lo) / target
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  // ticks <- k * step for k from floor(lo / step) to ceil(hi / step)
  const double k0 = std::floor(lo / step + 1e-9), k1 = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = k0; k <= k1; k += 1) ticks.push_back(k * step);
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  check(std::isfinite(lo) && std::isfinite(hi) && lo > 0 && lo <= hi, "log_ticks: needs finite 0 < lo <= hi; got [",
        lo, ", ", hi, "]");
  // decades [k0, k1] <- the powers of ten around [lo, hi]
  const int k0 = static_cast<int>(std::floor(std::log10(lo) + 1e-12));
  int k1 = static_cast<int>(std::ceil(std::log10(hi) - 1e-12));
  if (k1 == k0) ++k1;
  std::vector<double> ticks;
  if (k1 - k0 <= 3) {
    // ticks <- {1, 2, 5} x 10^k from the last one <= lo to the first one >= hi
    std::vector<double> all;
    for (int k = k0; k <= k1; ++k)
      for (double m : {1.0, 2.0, 5.0}) all.push_back(m * std::pow(10.0, k));
    size_t first = 0, last = all.size() - 1;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] <= lo * (1 + 1e-12)) first = i;
    }
    for (size_t i = all.size(); i-- > 0;) {
      if (all[i] >= hi * (1 - 1e-12)) last = i;
    }
    if (last == first) ++last;  // lo == hi on a tick: still two ticks, so the axis has a length
    ticks.assign(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(last) + 1);
    return ticks;
  }
  // ticks <- 10^(k0 + i * stride), at most about eight of them, the last >= hi
  const int stride = (k1 - k0 + 7) / 8;
  for (int k = k0;; k += stride) {
    ticks.push_back(std::pow(10.0, k));
    if (k >= k1) break;
  }
  return ticks;
}

namespace {
// A series' colour: its own palette entry, or the one it names (Series::colour).
std::string series_colour(const Series& sr, size_t index) {
  return kPalette[(sr.colour >= 0 ? static_cast<size_t>(sr.colour) : index) % 10];
}
}  // namespace

std::string line_chart_svg(const std::vector<Series>& series, const std::string& title, const std::string& x_label,
                           const std::string& y_label, bool log_y, const std::vector<std::string>& caption) {
  check(!series.empty(), "line_chart_svg: no series to plot");
  // runs[s] <- the maximal runs of drawable points of series s (finite; y > 0 on a log axis)
  std::vector<std::vector<std::vector<std::pair<double, double>>>> runs(series.size());
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  size_t drawable = 0;
  for (size_t s = 0; s < series.size(); ++s) {
    const Series& sr = series[s];
    check(sr.x.size() == sr.y.size(), "line_chart_svg: series ", s, " (\"", sr.name, "\") has ", sr.x.size(),
          " x values but ", sr.y.size(), " y values");
    std::vector<std::pair<double, double>> run;
    for (size_t i = 0; i < sr.x.size(); ++i) {
      const double x = sr.x[i], y = sr.y[i];
      if (std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0)) {
        run.emplace_back(x, y);
        x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
        y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
        ++drawable;
      } else if (!run.empty()) {
        runs[s].push_back(std::move(run));
        run.clear();
      }
    }
    if (!run.empty()) runs[s].push_back(std::move(run));
  }
  check(drawable > 0, "line_chart_svg: nothing to plot: the ", series.size(), " series have no point with finite x "
        "and y", log_y ? " and y > 0 (log scale)" : "");

  // Axes: tick positions and the ranges they span.
  const std::vector<double> xt = nice_ticks(x_lo, x_hi, 7);
  const std::vector<double> yt = log_y ? log_ticks(y_lo, y_hi) : nice_ticks(y_lo, y_hi, 6);
  const double x0 = xt.front(), x1 = xt.back();
  auto yf = [&](double v) { return log_y ? std::log10(v) : v; };
  const double y0 = yf(yt.front()), y1 = yf(yt.back());
  const double x_step = xt.size() > 1 ? xt[1] - xt[0] : 1.0, y_step = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
  const double x_abs = std::max(std::fabs(x0), std::fabs(x1));
  const double y_abs = std::max(std::fabs(yt.front()), std::fabs(yt.back()));
  std::vector<std::string> ylabels;
  for (double v : yt) ylabels.push_back(log_y ? log_tick_label(v) : tick_label(v, y_step, y_abs));

  // Layout (pixels): [y label | y tick labels | plot | legend], title above, x labels below.
  constexpr double kTick = 11, kLegendFont = 12, kPlotW = 560, kPlotH = 340;
  double ylab_w = 0;
  for (const auto& l : ylabels) ylab_w = std::max(ylab_w, text_em(l) * kTick);
  std::vector<std::string> names;
  double name_w = 0;
  for (size_t s = 0; s < series.size(); ++s) {
    std::string n = series[s].name.empty() ? "series " + std::to_string(s) : shorten(series[s].name, 32);
    if (runs[s].empty()) n += " (no points)";
    name_w = std::max(name_w, text_em(n) * kLegendFont);
    names.push_back(std::move(n));
  }
  const double left = 12 + 16 + 10 + ylab_w + 8;
  const double top = title.empty() ? 20 : 48;
  const double legend_x = left + kPlotW + 20, legend_w = 34 + name_w + 10;
  // a title wider than the plot starts at the left edge instead of overflowing it
  const double title_w = text_em(title) * 16 * 0.95;
  const bool title_wide = title_w > kPlotW;
  constexpr double kCaption = 12;
  double caption_w = 0;
  for (const std::string& line : caption) caption_w = std::max(caption_w, text_em(line) * kCaption + 24);
  const double width = std::max({legend_x + legend_w + 10, title_wide ? 12 + title_w + 12 : 0.0, caption_w});
  const double legend_h = 14 + 20.0 * static_cast<double>(series.size());
  const double caption_h = caption.empty() ? 0 : 8 + 16.0 * static_cast<double>(caption.size());
  const double height = std::max(top + kPlotH + 58 + caption_h, top + legend_h + 10);
  // px <- left + (x - x0) / (x1 - x0) * W;  py <- top + H - (f(y) - y0) / (y1 - y0) * H
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * kPlotW; };
  auto py = [&](double y) { return top + kPlotH - (yf(y) - y0) / (y1 - y0) * kPlotH; };

  std::string svg = header(width, height, title.empty() ? "line chart" : title);
  // grid and ticks
  svg += "<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double v : xt) svg += "<line x1=\"" + num(px(v)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(px(v)) +
                             "\" y2=\"" + num(top + kPlotH) + "\"/>\n";
  for (double v : yt) svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(py(v)) + "\" x2=\"" + num(left + kPlotW) +
                             "\" y2=\"" + num(py(v)) + "\"/>\n";
  svg += "</g>\n<g stroke=\"#444444\" stroke-width=\"1\">\n";
  for (double v : xt) svg += "<line x1=\"" + num(px(v)) + "\" y1=\"" + num(top + kPlotH) + "\" x2=\"" + num(px(v)) +
                             "\" y2=\"" + num(top + kPlotH + 5) + "\"/>\n";
  for (double v : yt) svg += "<line x1=\"" + num(left - 5) + "\" y1=\"" + num(py(v)) + "\" x2=\"" + num(left) +
                             "\" y2=\"" + num(py(v)) + "\"/>\n";
  svg += "</g>\n<g fill=\"#333333\">\n";
  for (double v : xt) svg += text_el(px(v), top + kPlotH + 19, tick_label(v, x_step, x_abs), "middle", kTick);
  for (size_t i = 0; i < yt.size(); ++i) svg += text_el(left - 8, py(yt[i]) + 4, ylabels[i], "end", kTick);
  svg += "</g>\n";
  // series: one polyline per run, a dot for a run of one point or for sparse series
  for (size_t s = 0; s < series.size(); ++s) {
    const std::string colour = series_colour(series[s], s);
    const char* dash = kDashes[(s / 10) % 4];
    const bool faint = series[s].faint;
    size_t points = 0;
    for (const auto& run : runs[s]) points += run.size();
    svg += "<g fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"" + (faint ? "1\" stroke-opacity=\"0.35" : "2") +
           "\" stroke-linejoin=\"round\"" +
           (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string()) + ">\n";
    for (const auto& run : runs[s]) {
      if (run.size() < 2) continue;
      svg += "<polyline points=\"";
      for (size_t i = 0; i < run.size(); ++i) {
        if (i) svg += ' ';
        svg += num(px(run[i].first)) + "," + num(py(run[i].second));
      }
      svg += "\"/>\n";
    }
    svg += "</g>\n<g fill=\"" + colour + "\">\n";
    for (const auto& run : runs[s]) {
      for (const auto& [x, y] : run) {
        if (run.size() == 1 || points <= 40)
          svg += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3\"/>\n";
      }
    }
    svg += "</g>\n";
  }
  // frame
  svg += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(kPlotW) + "\" height=\"" +
         num(kPlotH) + "\" fill=\"none\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  // legend
  svg += "<g>\n";
  for (size_t s = 0; s < series.size(); ++s) {
    const double ly = top + 16 + 20.0 * static_cast<double>(s);
    const char* dash = kDashes[(s / 10) % 4];
    svg += "<line x1=\"" + num(legend_x) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(legend_x + 24) + "\" y2=\"" +
           num(ly - 4) + "\" stroke=\"" + (runs[s].empty() ? "#bbbbbb" : series_colour(series[s], s)) + "\"" +
           (series[s].faint ? " stroke-width=\"1.5\" stroke-opacity=\"0.35\"" : " stroke-width=\"2.5\"") +
           (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string()) + "/>\n";
    svg += text_el(legend_x + 32, ly, names[s], "start", kLegendFont, " fill=\"#222222\"");
  }
  svg += "</g>\n";
  // title and axis labels
  if (!title.empty())
    svg += text_el(title_wide ? 12 : left + kPlotW / 2, 30, title, title_wide ? "start" : "middle", 16,
                   " font-weight=\"bold\" fill=\"#111111\"");
  if (!x_label.empty()) svg += text_el(left + kPlotW / 2, top + kPlotH + 44, x_label, "middle", 13, " fill=\"#222222\"");
  for (size_t i = 0; i < caption.size(); ++i)
    svg += text_el(12, top + kPlotH + 70 + 16.0 * static_cast<double>(i), caption[i], "start", kCaption,
                   " fill=\"#555555\"");
  if (!y_label.empty() || log_y) {
    const std::string yl = log_y ? (y_label.empty() ? "log scale" : y_label + " (log scale)") : y_label;
    const double cy = top + kPlotH / 2;
    svg += "<text transform=\"translate(24," + num(cy) + ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" "
           "fill=\"#222222\">" + xml_escape(yl) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::string heatmap_svg(const float* w, int64_t rows, int64_t cols, const std::vector<std::string>& row_labels,
                        const std::vector<std::string>& col_labels, const std::string& title) {
  check(rows >= 1 && cols >= 1, "heatmap_svg: needs rows >= 1 and cols >= 1; got ", rows, " x ", cols);
  check(rows <= 512 && cols <= 512, "heatmap_svg: at most 512 x 512 cells; got ", rows, " x ", cols,
        " (crop the matrix first)");
  check(w != nullptr, "heatmap_svg: weights pointer is null (", rows, " x ", cols, ")");
  check(row_labels.empty() || static_cast<int64_t>(row_labels.size()) == rows, "heatmap_svg: ", row_labels.size(),
        " row labels for ", rows, " rows (", rows, " x ", cols, " matrix)");
  check(col_labels.empty() || static_cast<int64_t>(col_labels.size()) == cols, "heatmap_svg: ", col_labels.size(),
        " column labels for ", cols, " columns (", rows, " x ", cols, " matrix)");
  const auto R = static_cast<size_t>(rows), C = static_cast<size_t>(cols);
  // labels <- the given ones, or 0, 1, ...
  std::vector<std::string> rl(row_labels), cl(col_labels);
  if (rl.empty())
    for (size_t i = 0; i < R; ++i) rl.push_back(std::to_string(i));
  if (cl.empty())
    for (size_t j = 0; j < C; ++j) cl.push_back(std::to_string(j));

  // colour range [lo, hi] <- [0, 1] when all finite values lie there, else [min, max]
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (size_t k = 0; k < R * C; ++k) {
    if (std::isfinite(w[k])) lo = std::min(lo, static_cast<double>(w[k])), hi = std::max(hi, static_cast<double>(w[k]));
  }
  if (!(lo <= hi) || (lo >= 0 && hi <= 1)) {
    lo = 0, hi = 1;
  } else if (lo == hi) {
    hi = lo + 1;
  }

  // Layout: cell size from the larger side; labels every `stride` cells when cells are small.
  const double cell = std::clamp(std::floor(560.0 / static_cast<double>(std::max(R, C))), 2.0, 36.0);
  const size_t stride = static_cast<size_t>(std::ceil(9.0 / cell));
  const double font = std::clamp(cell * static_cast<double>(stride) * 0.7, 6.0, 12.0);
  constexpr size_t kMaxLabel = 24;
  double row_w = 0, col_h = 0;
  for (size_t i = 0; i < R; i += stride) row_w = std::max(row_w, text_em(shorten(rl[i], kMaxLabel)) * font);
  for (size_t j = 0; j < C; j += stride) col_h = std::max(col_h, text_em(shorten(cl[j], kMaxLabel)) * font);
  const double title_h = title.empty() ? 8 : 40;
  // (whole pixels, so that with crispEdges neighbouring cells meet without seams)
  const double left = std::round(10 + 18 + row_w + 8);
  const double top = std::round(title_h + 18 + col_h + 8);
  const double map_w = cell * static_cast<double>(C), map_h = cell * static_cast<double>(R);
  const double bar_x = left + map_w + 22, bar_h = std::max(map_h, 150.0), bar_w = 16;
  std::vector<std::string> bar_labels;
  for (int k = 0; k <= 4; ++k) {
    const double v = lo + (hi - lo) * k / 4.0;
    bar_labels.push_back((lo == 0 && hi == 1) ? format("%.2f", v) : format("%.3g", v));
  }
  double bar_label_w = 0;
  for (const auto& l : bar_labels) bar_label_w = std::max(bar_label_w, text_em(l) * 11);
  const double width = std::max(bar_x + bar_w + 8 + bar_label_w + 12, title.empty() ? 0.0 : text_em(title) * 15 + 20);
  const double height = top + bar_h + 14;

  std::string svg = header(width, height, title.empty() ? "heatmap" : title);
  // cells: colour, tooltip, and the value itself when the matrix is small
  const bool numbers = R <= 16 && C <= 16;
  const double num_font = std::min(11.0, cell * 0.3);
  svg += "<g stroke=\"none\" shape-rendering=\"crispEdges\">\n";
  for (size_t i = 0; i < R; ++i) {
    for (size_t j = 0; j < C; ++j) {
      const float v = w[i * C + j];
      const bool finite = std::isfinite(v);
      const Rgb c = finite ? viridis((v - lo) / (hi - lo)) : Rgb{0xbd, 0xbd, 0xbd};
      const double x = left + cell * static_cast<double>(j), y = top + cell * static_cast<double>(i);
      svg += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(cell) + "\" height=\"" + num(cell) +
             "\" fill=\"" + hex(c) + "\"><title>" + xml_escape(rl[i]) + " \u2192 " + xml_escape(cl[j]) + ": " +
             format("%.4g", static_cast<double>(v)) + "</title></rect>\n";
      if (numbers) {
        const char* ink = luminance(c) < 0.45 ? "#ffffff" : "#111111";
        svg += "<text x=\"" + num(x + cell / 2) + "\" y=\"" + num(y + cell / 2 + num_font * 0.35) +
               "\" text-anchor=\"middle\" font-size=\"" + num(num_font) + "\" fill=\"" + ink + "\">" +
               (finite ? format(std::fabs(v) < 10 ? "%.2f" : "%.3g", static_cast<double>(v)) : "nan") + "</text>\n";
      }
    }
  }
  svg += "</g>\n";
  // row labels (queries) on the left, column labels (keys) vertical above
  svg += "<g fill=\"#222222\" font-size=\"" + num(font) + "\">\n";
  for (size_t i = 0; i < R; i += stride) {
    svg += "<text x=\"" + num(left - 6) + "\" y=\"" + num(top + cell * (static_cast<double>(i) + 0.5) + font * 0.35) +
           "\" text-anchor=\"end\">" + xml_escape(shorten(rl[i], kMaxLabel)) + "</text>\n";
  }
  for (size_t j = 0; j < C; j += stride) {
    const double x = left + cell * (static_cast<double>(j) + 0.5) + font * 0.35;
    svg += "<text transform=\"translate(" + num(x) + "," + num(top - 6) + ") rotate(-90)\" text-anchor=\"start\">" +
           xml_escape(shorten(cl[j], kMaxLabel)) + "</text>\n";
  }
  svg += "</g>\n";
  svg += text_el(left + map_w / 2, title_h + 12, "keys", "middle", 12, " fill=\"#555555\" font-style=\"italic\"");
  svg += "<text transform=\"translate(20," + num(top + map_h / 2) + ") rotate(-90)\" text-anchor=\"middle\" "
         "font-size=\"12\" fill=\"#555555\" font-style=\"italic\">queries</text>\n";
  svg += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(map_w) + "\" height=\"" + num(map_h) +
         "\" fill=\"none\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  // colour scale: a vertical gradient from lo (bottom) to hi (top), five labels
  const std::string id = format("qkvscale%016llx", static_cast<unsigned long long>(
                                                       fnv1a(title, fnv1a(std::to_string(rows) + "x" + std::to_string(cols)))));
  svg += "<defs><linearGradient id=\"" + id + "\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n";
  for (int k = 0; k <= 10; ++k) svg += "<stop offset=\"" + num(k / 10.0) + "\" stop-color=\"" + hex(kViridis[k]) + "\"/>\n";
  svg += "</linearGradient></defs>\n";
  svg += "<rect x=\"" + num(bar_x) + "\" y=\"" + num(top) + "\" width=\"" + num(bar_w) + "\" height=\"" + num(bar_h) +
         "\" fill=\"url(#" + id + ")\" stroke=\"#444444\" stroke-width=\"1\"/>\n";
  svg += "<g fill=\"#333333\">\n";
  for (int k = 0; k <= 4; ++k) {
    const double y = top + bar_h - bar_h * k / 4.0;
    svg += "<line x1=\"" + num(bar_x + bar_w) + "\" y1=\"" + num(y) + "\" x2=\"" + num(bar_x + bar_w + 4) + "\" y2=\"" +
           num(y) + "\" stroke=\"#444444\"/>\n";
    svg += text_el(bar_x + bar_w + 7, y + 4, bar_labels[static_cast<size_t>(k)], "start", 11);
  }
  svg += "</g>\n";
  if (!title.empty()) svg += text_el(width / 2, 26, title, "middle", 15, " font-weight=\"bold\" fill=\"#111111\"");
  svg += "</svg>\n";
  return svg;
}

void write_svg(const std::string& path, const std::string& svg) {
  check(!path.empty(), "write_svg: empty path");
  check(!svg.empty(), "write_svg: ", path, ": the document is empty");
  write_file_atomic(path, svg);
}

}  // namespace qkv::viz
