// SVG line charts and heatmaps: escaping, skipped points, log axes, tick generation, cell
// counts, well-formed XML (checked by a small parser here, and by xmllint when installed),
// errors, atomic writes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/viz.h"

namespace {

using qkv::testing::error_of;
using qkv::testing::read_bytes;
using qkv::testing::TempDir;
using qkv::viz::Series;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------
// A small XML 1.0 well-formedness checker for what the SVG writer emits: an optional
// declaration, comments, elements with quoted attributes, text with character and the five
// predefined entity references, valid UTF-8. Returns "" when well-formed, else the problem.

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > s.size() || (len == 2 && b < 0xC2)) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool name_char(char c) { return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'; }

std::string xml_problem(const std::string& d) {
  if (!valid_utf8(d)) return "invalid UTF-8";
  size_t p = 0;
  auto at = [&](const char* what) { return std::string(what) + " at byte " + std::to_string(p); };
  auto ws = [&] {
    while (p < d.size() && std::isspace(static_cast<unsigned char>(d[p]))) ++p;
  };
  auto name = [&]() -> std::string {
    const size_t s = p;
    if (p >= d.size() || !name_start(d[p])) return "";
    while (p < d.size() && name_char(d[p])) ++p;
    return d.substr(s, p - s);
  };
  // a reference at d[p] == '&'
  auto reference = [&]() -> bool {
    const size_t semi = d.find(';', p);
    if (semi == std::string::npos) return false;
    const std::string r = d.substr(p + 1, semi - p - 1);
    p = semi + 1;
    if (r == "amp" || r == "lt" || r == "gt" || r == "quot" || r == "apos") return true;
    if (r.size() > 1 && r[0] == '#') {
      const bool hexa = r[1] == 'x';
      const std::string digits = r.substr(hexa ? 2 : 1);
      if (digits.empty()) return false;
      for (char c : digits)
        if (!(hexa ? std::isxdigit(static_cast<unsigned char>(c)) : std::isdigit(static_cast<unsigned char>(c))))
          return false;
      return true;
    }
    return false;
  };
  if (d.compare(0, 5, "<?xml") == 0) {
    p = d.find("?>");
    if (p == std::string::npos) return "unterminated declaration";
    p += 2;
  }
  std::vector<std::string> open;
  bool root_done = false;
  while (p < d.size()) {
    if (d[p] == '<') {
      if (d.compare(p, 4, "<!--") == 0) {
        const size_t e = d.find("-->", p + 4);
        if (e == std::string::npos) return at("unterminated comment");
        if (d.substr(p + 4, e - p - 4).find("--") != std::string::npos) return at("'--' inside a comment");
        p = e + 3;
        continue;
      }
      if (d.compare(p, 2, "<!") == 0 || d.compare(p, 2, "<?") == 0) return at("unexpected markup");
      if (d.compare(p, 2, "</") == 0) {
        p += 2;
        const std::string n = name();
        ws();
        if (p >= d.size() || d[p] != '>') return at("bad end tag");
        ++p;
        if (open.empty() || open.back() != n) return at(("mismatched end tag </" + n + ">").c_str());
        open.pop_back();
        if (open.empty()) root_done = true;
        continue;
      }
      ++p;
      if (root_done) return at("second root element");
      const std::string n = name();
      if (n.empty()) return at("bad element name");
      std::set<std::string> attrs;
      for (;;) {
        const size_t before = p;
        ws();
        if (p >= d.size()) return at("unterminated start tag");
        if (d[p] == '/') {
          if (d.compare(p, 2, "/>") != 0) return at("bad empty-element tag");
          p += 2;
          if (open.empty()) root_done = true;
          break;
        }
        if (d[p] == '>') {
          ++p;
          open.push_back(n);
          break;
        }
        if (p == before) return at("attributes must be separated by whitespace");
        const std::string a = name();
        if (a.empty()) return at("bad attribute name");
        if (!attrs.insert(a).second) return at(("duplicate attribute " + a).c_str());
        ws();
        if (p >= d.size() || d[p] != '=') return at("attribute without '='");
        ++p;
        ws();
        if (p >= d.size() || (d[p] != '"' && d[p] != '\'')) return at("unquoted attribute value");
        const char q = d[p++];
        while (p < d.size() && d[p] != q) {
          if (d[p] == '<') return at("'<' in an attribute value");
          if (d[p] == '&') {
            if (!reference()) return at("bad reference in an attribute value");
          } else {
            ++p;
          }
        }
        if (p >= d.size()) return at("unterminated attribute value");
        ++p;
      }
      continue;
    }
    // character data
    if (open.empty() && !std::isspace(static_cast<unsigned char>(d[p]))) return at("text outside the root element");
    if (d[p] == '&') {
      if (!reference()) return at("bad reference");
    } else {
      ++p;
    }
  }
  if (!open.empty()) return "unclosed element <" + open.back() + ">";
  if (!root_done) return "no root element";
  return "";
}

// Both checks: ours, and xmllint's where it is installed.
void expect_well_formed(const std::string& svg, const std::string& tag) {
  EXPECT_EQ(xml_problem(svg), "") << tag;
  if (std::system("command -v xmllint >/dev/null 2>&1") == 0) {
    TempDir dir("viz_xml");
    const std::string path = dir / "doc.svg";
    qkv::viz::write_svg(path, svg);
    EXPECT_EQ(std::system(("xmllint --noout " + path).c_str()), 0) << tag;
  }
}

TEST(XmlChecker, RejectsWhatIsNotWellFormed) {
  EXPECT_EQ(xml_problem("<a><b/></a>"), "");
  EXPECT_NE(xml_problem("<a><b></a></b>"), "");
  EXPECT_NE(xml_problem("<a>x & y</a>"), "");
  EXPECT_NE(xml_problem("<a x=1/>"), "");
  EXPECT_NE(xml_problem("<a x=\"<\"/>"), "");
  EXPECT_NE(xml_problem("<a/><b/>"), "");
  EXPECT_NE(xml_problem("<a x=\"1\" x=\"2\"/>"), "");
  EXPECT_NE(xml_problem("<a>\xff</a>"), "");
}

// ---------------------------------------------------------------------------------------------

TEST(XmlEscape, EscapesMarkupAndRepairsBadText) {
  EXPECT_EQ(qkv::viz::xml_escape("<a&b>"), "&lt;a&amp;b&gt;");
  EXPECT_EQ(qkv::viz::xml_escape("\"it's\""), "&quot;it&apos;s&quot;");
  EXPECT_EQ(qkv::viz::xml_escape("na\u00efve \u65e5\u672c \U0001F600"), "na\u00efve \u65e5\u672c \U0001F600");
  // invalid UTF-8 and control characters XML cannot carry -> U+FFFD
  EXPECT_EQ(qkv::viz::xml_escape("a\xff" "b"), "a\uFFFD" "b");
  EXPECT_EQ(qkv::viz::xml_escape("\xe6\x97"), "\uFFFD\uFFFD");  // truncated sequence
  EXPECT_EQ(qkv::viz::xml_escape(std::string("x\x01y\0z", 5)), "x\uFFFDy\uFFFDz");
  EXPECT_EQ(qkv::viz::xml_escape("tab\there"), "tab\there");
}

TEST(NiceTicks, OneTwoFiveSteps) {
  auto expect_ticks = [](std::vector<double> got, std::vector<double> want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  };
  expect_ticks(qkv::viz::nice_ticks(0, 1), {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  expect_ticks(qkv::viz::nice_ticks(0, 97), {0, 20, 40, 60, 80, 100});
  expect_ticks(qkv::viz::nice_ticks(-3.2, 7.9), {-4, -2, 0, 2, 4, 6, 8});
  expect_ticks(qkv::viz::nice_ticks(1.9, 10.3), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  expect_ticks(qkv::viz::nice_ticks(0, 2000, 7), {0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000});
  expect_ticks(qkv::viz::nice_ticks(0, 2000, 3), {0, 500, 1000, 1500, 2000});
  // lo == hi is widened by 10% (or to [-1, 1] at zero)
  expect_ticks(qkv::viz::nice_ticks(5, 5), {4.4, 4.6, 4.8, 5.0, 5.2, 5.4, 5.6});
  expect_ticks(qkv::viz::nice_ticks(0, 0), {-1, -0.5, 0, 0.5, 1});
}

TEST(NiceTicks, PropertiesOverManyRanges) {
  // For ranges over many magnitudes: the step is 1, 2 or 5 x 10^k, the ticks cover [lo, hi]
  // with at most one step to spare on each side, and there are 3..13 of them.
  uint64_t s = 12345;
  auto uniform = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const double scale = std::pow(10.0, std::floor(uniform() * 16) - 8);
    double lo = (uniform() * 2 - 1) * scale, hi = lo + uniform() * scale * 3 + scale * 1e-3;
    const std::vector<double> t = qkv::viz::nice_ticks(lo, hi);
    ASSERT_GE(t.size(), 3u);
    ASSERT_LE(t.size(), 13u);
    const double step = t[1] - t[0];
    const double mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::fabs(mant - 1) < 1e-6 || std::fabs(mant - 2) < 1e-6 || std::fabs(mant - 5) < 1e-6)
        << "step " << step;
    EXPECT_LE(t.front(), lo + step * 1e-6);
    EXPECT_GE(t.back(), hi - step * 1e-6);
    EXPECT_GT(t.front(), lo - step);
    EXPECT_LT(t.back(), hi + step);
  }
  EXPECT_NE(error_of([] { qkv::viz::nice_ticks(1, 0); }).find("lo <= hi"), std::string::npos);
  EXPECT_NE(error_of([] { qkv::viz::nice_ticks(0, kInf); }).find("finite"), std::string::npos);
}

TEST(LogTicks, OneTwoFiveOrDecades) {
  EXPECT_EQ(qkv::viz::log_ticks(2.1, 9.8), (std::vector<double>{2, 5, 10}));
  EXPECT_EQ(qkv::viz::log_ticks(0.5, 11), (std::vector<double>{0.5, 1, 2, 5, 10, 20}));
  EXPECT_EQ(qkv::viz::log_ticks(1, 1), (std::vector<double>{1, 2}));  // never a single tick
  EXPECT_EQ(qkv::viz::log_ticks(3, 3), (std::vector<double>{2, 5}));
  const std::vector<double> d = qkv::viz::log_ticks(1e-6, 1e3);  // 9 decades: every 2nd
  ASSERT_EQ(d.size(), 6u);
  for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(std::log10(d[i]), -6.0 + 2.0 * static_cast<double>(i), 1e-12);
  EXPECT_NE(error_of([] { qkv::viz::log_ticks(0, 1); }).find("0 < lo"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// line charts

Series ramp(const std::string& name, int n, double scale = 1.0) {
  Series s{name, {}, {}};
  for (int i = 0; i < n; ++i) {
    s.x.push_back(i);
    s.y.push_back(scale * (1.0 + i));
  }
  return s;
}

TEST(LineChart, LabelsAreEscapedNeverRaw) {
  const std::string svg =
      qkv::viz::line_chart_svg({ramp("<a&b>", 5)}, "title <a&b>", "x \"<a&b>\"", "y <a&b>");
  EXPECT_EQ(svg.find("<a&b>"), std::string::npos);
  EXPECT_GE(count(svg, "&lt;a&amp;b&gt;"), 4u);  // legend, title (twice: <title> and text), axes
  expect_well_formed(svg, "escaped chart");
}

// A title wider than the plot starts at the left edge and the document widens to hold it (centred
// over the plot, it ran off the left edge); a short one stays centred.
TEST(LineChart, WideTitleStartsAtTheLeftEdge) {
  const std::string wide(90, 'W');
  const std::string svg = qkv::viz::line_chart_svg({ramp("a", 5)}, wide, "step", "loss");
  const size_t at = svg.find(">" + wide + "</text>");
  ASSERT_NE(at, std::string::npos);
  const size_t open = svg.rfind("<text", at);
  EXPECT_NE(svg.substr(open, at - open).find("text-anchor=\"start\""), std::string::npos) << svg.substr(open, at - open);
  const size_t w = svg.find("width=\"");
  ASSERT_NE(w, std::string::npos);
  EXPECT_GE(std::stod(svg.substr(w + 7)), 90 * 0.6 * 16 * 0.95) << "the document is narrower than its title";
  const std::string narrow = qkv::viz::line_chart_svg({ramp("a", 5)}, "short", "step", "loss");
  const size_t at2 = narrow.find(">short</text>");
  ASSERT_NE(at2, std::string::npos);
  EXPECT_NE(narrow.substr(narrow.rfind("<text", at2), at2 - narrow.rfind("<text", at2)).find("\"middle\""),
            std::string::npos);
  expect_well_formed(svg, "wide title");
}

// A faint series (raw points under a smoothed curve) shares a colour with its curve; a caption
// sits under the chart, escaped, and makes the document taller.
TEST(LineChart, FaintSeriesSharedColourAndCaption) {
  Series raw = ramp("raw", 5), mean = ramp("mean", 5), other = ramp("other", 5);
  raw.faint = true;
  raw.colour = 1;
  mean.colour = 1;
  const std::string svg = qkv::viz::line_chart_svg({raw, mean, other}, "t", "step", "loss", false,
                                                   {"first <line>", "second line"});
  EXPECT_EQ(count(svg, "stroke-opacity=\"0.35\""), 2u);  // the faint polyline group and its legend line
  EXPECT_EQ(count(svg, "stroke=\"#f28e2b\""), 4u);        // raw and mean: palette entry 1, lines and legend
  EXPECT_EQ(count(svg, "stroke=\"#e15759\""), 2u);        // other: its own index, 2
  EXPECT_NE(svg.find(">first &lt;line&gt;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">second line</text>"), std::string::npos);
  const std::string plain = qkv::viz::line_chart_svg({raw, mean, other}, "t", "step", "loss");
  auto height = [](const std::string& doc) { return std::stod(doc.substr(doc.find("height=\"") + 8)); };
  EXPECT_GT(height(svg), height(plain));
  expect_well_formed(svg, "caption");
}

TEST(LineChart, NonFinitePointsAreSkippedAndBreakTheLine) {
  Series s{"gappy", {0, 1, 2, 3, 4, 5}, {1, 2, kNaN, 4, kInf, 6}};
  Series t{"x-gap", {0, kNaN, 2}, {1, 1, 1}};
  const std::string svg = qkv::viz::line_chart_svg({s, t}, "gaps", "step", "loss");
  // s: runs {0,1} {3} {5} -> one polyline and two single dots; t: runs {0} {2} -> two dots
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_EQ(count(svg, "nan"), 0u);
  EXPECT_EQ(count(svg, "inf"), 0u);
  // sparse series (<= 40 points) get a dot on every point: 4 for s, 2 for t
  EXPECT_EQ(count(svg, "<circle"), 6u);
  expect_well_formed(svg, "gaps");
}

TEST(LineChart, LogScaleSkipsNonPositiveValues) {
  // On a log axis y <= 0 has no place: those points are skipped (like NaN), the rest drawn.
  Series s{"loss", {0, 1, 2, 3, 4, 5}, {-1, 0, 0.1, 10, 100, 50}};
  const std::string svg = qkv::viz::line_chart_svg({s}, "log", "step", "loss", true);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_EQ(count(svg, "<circle"), 4u);
  EXPECT_NE(svg.find(">0.1</text>"), std::string::npos);
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);
  EXPECT_NE(svg.find("loss (log scale)"), std::string::npos);
  expect_well_formed(svg, "log");
  // nothing positive at all: nothing to draw on a log axis
  Series z{"zeros", {0, 1}, {0, -2}};
  const std::string m = error_of([&] { qkv::viz::line_chart_svg({z}, "t", "x", "y", true); });
  EXPECT_NE(m.find("log scale"), std::string::npos) << m;
  // the same data on a linear axis is fine
  EXPECT_NO_THROW(qkv::viz::line_chart_svg({z}, "t", "x", "y"));
}

TEST(LineChart, TicksCoverTheDataAndDenseSeriesHaveNoDots) {
  const std::string svg = qkv::viz::line_chart_svg({ramp("dense", 500, 0.01)}, "", "", "");
  // x in [0, 499] -> ticks 0..500 by 100; y in [0.01, 5] -> ticks 0..5 by 1
  for (const char* label : {">0</text>", ">100</text>", ">500</text>", ">5</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(count(svg, "<circle"), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  expect_well_formed(svg, "dense");
}

TEST(LineChart, LargeAndSmallNumbersUseCompactExponents) {
  Series lr{"lr", {0, 600000, 1200000}, {0, 3e-4, 1e-5}};
  const std::string svg = qkv::viz::line_chart_svg({lr}, "lr", "step", "lr");
  EXPECT_NE(svg.find(">1.2e6</text>"), std::string::npos);
  EXPECT_NE(svg.find(">0.00030</text>"), std::string::npos);
  const std::string lg = qkv::viz::line_chart_svg({Series{"p", {0, 1}, {1e-7, 1e3}}}, "", "", "", true);
  EXPECT_NE(lg.find(">1e-7</text>"), std::string::npos);
  EXPECT_NE(lg.find(">1000</text>"), std::string::npos);
}

TEST(LineChart, EmptySeriesAllowedAllEmptyRejected) {
  Series empty{"nothing yet", {}, {}};
  const std::string svg = qkv::viz::line_chart_svg({empty, ramp("some", 3)}, "t", "x", "y");
  EXPECT_NE(svg.find("nothing yet (no points)"), std::string::npos);
  expect_well_formed(svg, "one empty");
  const std::string m = error_of([&] { qkv::viz::line_chart_svg({empty, empty}, "t", "x", "y"); });
  EXPECT_NE(m.find("nothing to plot"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { qkv::viz::line_chart_svg({Series{"nan", {kNaN}, {1}}}, "t", "x", "y"); })
                .find("nothing to plot"),
            std::string::npos);
  EXPECT_NE(error_of([] { qkv::viz::line_chart_svg({}, "t", "x", "y"); }).find("no series"), std::string::npos);
}

TEST(LineChart, MismatchedLengthsNameTheSeries) {
  Series bad{"val", {1, 2, 3}, {1, 2}};
  const std::string m = error_of([&] { qkv::viz::line_chart_svg({ramp("ok", 2), bad}, "t", "x", "y"); });
  EXPECT_NE(m.find("series 1"), std::string::npos) << m;
  EXPECT_NE(m.find("val"), std::string::npos) << m;
  EXPECT_NE(m.find("3 x values but 2 y values"), std::string::npos) << m;
}

TEST(LineChart, SinglePointAndDeterministic) {
  const std::string a = qkv::viz::line_chart_svg({Series{"one", {7}, {3}}}, "single", "x", "y");
  EXPECT_EQ(count(a, "<circle"), 1u);
  expect_well_formed(a, "single");
  EXPECT_EQ(a, qkv::viz::line_chart_svg({Series{"one", {7}, {3}}}, "single", "x", "y"));
}

// ---------------------------------------------------------------------------------------------
// heatmaps

TEST(Heatmap, OneRectPerCellWithTooltipAndNumbersWhenSmall) {
  const std::vector<float> w = {0.1f, 0.2f, 0.7f, 0.0f, 0.5f, 0.5f, 1.0f, 0.0f, 0.0f, 0.25f, 0.25f, 0.25f, 0.3f, 0.3f, 0.4f};
  const std::string svg = qkv::viz::heatmap_svg(w.data(), 3, 5, {"q0", "q1", "q2"}, {"k0", "k1", "k2", "k3", "k4"}, "attn");
  EXPECT_EQ(count(svg, "\"><title>"), 15u);  // each cell: <rect ...><title>...</title></rect>
  EXPECT_EQ(count(svg, "</title></rect>"), 15u);
  EXPECT_NE(svg.find("<title>q0 \u2192 k2: 0.7</title>"), std::string::npos);
  EXPECT_NE(svg.find(">0.70</text>"), std::string::npos);  // value printed in the cell
  EXPECT_NE(svg.find("linearGradient"), std::string::npos);  // colour scale
  expect_well_formed(svg, "3x5");
  // 17 x 17: no numbers in cells, still one rect per cell
  const std::vector<float> big(17 * 17, 0.5f);
  const std::string b = qkv::viz::heatmap_svg(big.data(), 17, 17, {}, {}, "big");
  EXPECT_EQ(count(b, "</title></rect>"), 289u);
  EXPECT_EQ(count(b, ">0.50</text>"), 1u);  // the scale bar's label only
  EXPECT_NE(b.find("<title>16 \u2192 3: 0.5</title>"), std::string::npos);  // numbered labels
  expect_well_formed(b, "17x17");
}

TEST(Heatmap, TokenLabelsAreEscaped) {
  const std::vector<std::string> toks = {"<a&b>", "\"q\"", "\u65e5\u672c", "it's", "a\x01" "b"};
  std::vector<float> w(25, 0.2f);
  const std::string svg = qkv::viz::heatmap_svg(w.data(), 5, 5, toks, toks, "<title> & more");
  EXPECT_EQ(svg.find("<a&b>"), std::string::npos);
  EXPECT_EQ(svg.find("<title> & more"), std::string::npos);
  EXPECT_NE(svg.find("&lt;a&amp;b&gt;"), std::string::npos);
  EXPECT_NE(svg.find("&quot;q&quot;"), std::string::npos);
  EXPECT_NE(svg.find("\u65e5\u672c"), std::string::npos);
  EXPECT_NE(svg.find("a\uFFFD" "b"), std::string::npos);
  expect_well_formed(svg, "escaped heatmap");
}

TEST(Heatmap, OutOfUnitRangeNaNAndLongLabels) {
  const std::vector<float> w = {-3.0f, 0.0f, 5.0f, std::nanf("")};
  const std::string long_label(40, 'x');
  const std::string svg = qkv::viz::heatmap_svg(w.data(), 2, 2, {long_label, "b"}, {"c", "d"}, "scores");
  EXPECT_NE(svg.find(">-3</text>"), std::string::npos);  // scale bar from min ...
  EXPECT_NE(svg.find(">5</text>"), std::string::npos);   // ... to max
  EXPECT_NE(svg.find(">nan</text>"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#bdbdbd\""), std::string::npos);  // NaN cell grey
  EXPECT_NE(svg.find(std::string(23, 'x') + "\u2026<"), std::string::npos);  // shortened on screen
  EXPECT_NE(svg.find("<title>" + long_label + " \u2192 c"), std::string::npos);  // whole in tooltip
  expect_well_formed(svg, "2x2");
}

TEST(Heatmap, SizeErrors) {
  const std::vector<float> w(6, 0.f);
  std::string m = error_of([&] { qkv::viz::heatmap_svg(w.data(), 2, 3, {"a"}, {}, "t"); });
  EXPECT_NE(m.find("1 row labels for 2 rows"), std::string::npos) << m;
  m = error_of([&] { qkv::viz::heatmap_svg(w.data(), 2, 3, {}, {"a", "b"}, "t"); });
  EXPECT_NE(m.find("2 column labels for 3 columns"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { qkv::viz::heatmap_svg(w.data(), 0, 3, {}, {}, "t"); }).find("rows >= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { qkv::viz::heatmap_svg(nullptr, 2, 3, {}, {}, "t"); }).find("null"), std::string::npos);
  EXPECT_NE(error_of([&] { qkv::viz::heatmap_svg(w.data(), 600, 1, {}, {}, "t"); }).find("512"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------

TEST(WriteSvg, AtomicWriteAndErrorsNameThePath) {
  TempDir dir("viz");
  const std::string svg = qkv::viz::line_chart_svg({ramp("a", 3)}, "t", "x", "y");
  qkv::viz::write_svg(dir / "c.svg", svg);
  EXPECT_EQ(read_bytes(dir / "c.svg"), svg);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"c.svg"}));  // no temporary left behind
  const std::string bad = dir / "no_such_dir/c.svg";
  EXPECT_NE(error_of([&] { qkv::viz::write_svg(bad, svg); }).find(bad), std::string::npos);
  EXPECT_NE(error_of([&] { qkv::viz::write_svg("", svg); }).find("empty path"), std::string::npos);
}

}  // namespace
