// qkv/viz.h: training curves and attention maps as self-contained SVG 1.1 documents (no
// scripts, no external fonts or images; a generic sans-serif font family), viewable in any
// browser and convertible with rsvg-convert or Inkscape. The output is deterministic: the same
// input gives the same bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::viz {

struct Series {
  std::string name;        // legend text (any UTF-8; escaped); "" -> "series <i>"
  std::vector<double> x, y;  // same length
  int colour = -1;         // palette index (-1: the series' own index), so two series can share one
  bool faint = false;      // drawn thin and pale: the raw points under a smoothed curve
};

// A line chart of one or more series: axes with 1-2-5 ticks and grid lines, title, axis labels,
// a legend to the right. Points whose x or y is NaN or infinite are skipped and break the line
// (the parts on either side are drawn separately). With log_y, points with y <= 0 are skipped
// in the same way (they have no place on a log axis), and the y ticks are 1-2-5 or decade ticks.
// A series may be empty (it is listed in the legend as "no points"); if no series has a point
// to draw, or x and y lengths differ, it throws qkv::Error.
// `caption` lines are printed in small type under the chart.
std::string line_chart_svg(const std::vector<Series>& series, const std::string& title,
                           const std::string& x_label, const std::string& y_label, bool log_y = false,
                           const std::vector<std::string>& caption = {});

// A heatmap of w (rows x cols, row-major), e.g. attention weights: rows are queries, labelled
// by row_labels on the left; columns are keys, labelled by col_labels written vertically above
// the map. Colour: viridis over [0, 1] when every value lies in [0, 1], else over [min, max];
// NaN cells are drawn grey. Each cell carries a <title> tooltip "query -> key: value"; matrices
// up to 16 x 16 also print each value in its cell. A colour scale bar sits on the right. Labels
// longer than 24 characters are shortened with "…" on screen (the tooltip keeps them whole).
// An empty label vector numbers the rows or columns 0, 1, ...; a non-empty one of the wrong
// length, rows or cols < 1, a null w, or more than 512 x 512 cells throws qkv::Error.
std::string heatmap_svg(const float* w, int64_t rows, int64_t cols, const std::vector<std::string>& row_labels,
                        const std::vector<std::string>& col_labels, const std::string& title);

// Writes the document atomically (temporary file, fsync, rename); errors name the path.
void write_svg(const std::string& path, const std::string& svg);

// --- building blocks, exposed for tests and for callers composing their own figures ---

// Text made safe for XML character data and attribute values: & < > " ' escaped; invalid UTF-8
// and characters XML 1.0 forbids (controls other than tab, newline, carriage return; U+FFFE,
// U+FFFF) become U+FFFD.
std::string xml_escape(std::string_view text);

// Ticks with a step of 1, 2 or 5 times a power of ten, about `target` of them, from the
// largest multiple of the step <= lo to the smallest >= hi (so they cover [lo, hi]). lo == hi
// is widened first (by 10% of |lo|, or to [-1, 1] at 0). Non-finite or lo > hi throws.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// Ticks for a log axis covering [lo, hi] (0 < lo <= hi): the values 1, 2, 5 x 10^k when the
// range spans at most three decades, else powers of ten (every k-th decade when there are more
// than eight); the first tick is <= lo and the last >= hi.
std::vector<double> log_ticks(double lo, double hi);

}  // namespace qkv::viz
