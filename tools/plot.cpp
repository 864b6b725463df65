// `tpc plot run.jsonl [more.jsonl ...] -o curves.svg`: training curves from `tpc run --log-jsonl` logs as
// one SVG with two panels: loss (training, and validation where logged) and throughput, against the step.
// Several logs overlay, one colour each (a run's validation loss dashed), so runs compare at a glance.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "frontend/unicode_classes.h"
#include "ir/file_io.h"
#include "tools/cli.h"
#include "tools/output_paths.h"

namespace tpc {
namespace {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;
  size_t run = 0;       // the log it came from: its colour in both panels
  bool dashed = false;  // a run's validation loss, beside its training loss
};

// In step order, one point a step: a log a resumed run appended to (older tpc kept the lines past the checkpoint)
// holds some steps twice; the later line, the run that went on, is the one drawn.
void lastPointPerStep(Series& s) {
  std::map<double, double> byStep;
  for (const auto& [step, y] : s.points) byStep[step] = y;
  s.points.assign(byStep.begin(), byStep.end());
}

// Ten colours (matplotlib's tab10); runs past ten take them again with a dotted line (run 11) or dash-dots (21).
const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kNumColours = sizeof kColours / sizeof kColours[0];

// The stroke pattern of a series: a validation loss is dashed; runs past the colours are dotted or dash-dotted.
std::string strokePattern(size_t run, bool dashed) {
  static const char* kRounds[] = {"", "1.5,2.5", "8,3,1.5,3"};
  std::string p = dashed ? "6,3" : "";
  const std::string round = kRounds[(run / kNumColours) % 3];
  if (!round.empty()) p = dashed ? "6,3," + round : round;
  return p.empty() ? "" : " stroke-dasharray='" + p + "'";
}

// A "nice" tick step for a range (1, 2 or 5 x 10^k), about 5 ticks.
double tickStep(double range) {
  double raw = range / 5, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

// Widens [lo, hi] where it is too narrow to draw: one value, or values that differ only in their last digits (1e6
// and the next double). Scaling by such a range divides by zero, and ticks stepped by a fifth of it never pass hi.
void widenRange(double& lo, double& hi) {
  if (hi - lo > std::max({std::abs(lo), std::abs(hi)}) * 1e-9 && hi - lo > 1e-300) return;
  const double mid = lo / 2 + hi / 2;
  if (lo == hi && std::abs(mid) < 1e6) {  // one value: a unit above it, as a flat curve has always been drawn
    hi = lo + 1;
    return;
  }
  const double half = std::max(std::abs(mid) * 1e-6, 1e-300);
  lo = mid - half, hi = mid + half;
}

// A file name as SVG text: XML's special characters escaped, and a byte that is not UTF-8 or a control character
// shown as '?', or "run&1.jsonl" would make a file no SVG viewer opens.
std::string svgText(std::string_view s) {
  std::string out;
  for (const char* p = s.data(); p < s.data() + s.size();) {
    char32_t cp;
    const int len = unicode::decodeUtf8(p, s.data() + s.size(), cp);
    if (len == 0 || cp < 0x20 || cp == 0x7F) out += '?';
    else if (cp == '&') out += "&amp;";
    else if (cp == '<') out += "&lt;";
    else if (cp == '>') out += "&gt;";
    else if (cp == '\'') out += "&apos;";
    else if (cp == '"') out += "&quot;";
    else out.append(p, static_cast<size_t>(len));
    p += len ? len : 1;
  }
  return out;
}

// Significant digits enough for ticks `step` apart near max(|lo|, |hi|) to read differently: 4 cannot tell
// 10.8249 from 10.8251, or step 100001 from 100002.
int tickDigits(double lo, double hi, double step) {
  const double magnitude = std::max(std::abs(lo), std::abs(hi));
  if (!(step > 0) || !(magnitude > step)) return 4;
  const int digits = static_cast<int>(std::floor(std::log10(magnitude)) - std::floor(std::log10(step))) + 1;
  return std::clamp(digits, 4, 17);
}

std::string fmt(double v, int digits = 4) {
  std::ostringstream o;
  o.precision(digits);
  o << (v == 0 ? 0.0 : v);  // a tick at -0 (ceil of a small negative) reads 0
  return o.str();
}

// The legend inside a panel: columns from the right as wide as the longest label, the font made smaller (down to 5
// px) until every line fits (a long legend ran into the next panel and past the left edge).
struct LegendLayout {
  double fontSize = 12, lineHeight = 15, columnWidth = 0;
  size_t perColumn = 1;
};
LegendLayout layLegend(const std::vector<Series>& series, double width, double height) {
  size_t longest = 1;
  for (const Series& s : series) longest = std::max(longest, s.label.size());
  LegendLayout l;
  for (;; l.fontSize *= 0.9) {
    l.lineHeight = 1.25 * l.fontSize;
    l.columnWidth = 0.6 * l.fontSize * static_cast<double>(longest) + l.fontSize;  // about a digit's width a character
    l.perColumn = std::max<size_t>(1, static_cast<size_t>(height / l.lineHeight));
    const size_t columns = (series.size() + l.perColumn - 1) / l.perColumn;
    if (static_cast<double>(columns) * l.columnWidth <= width || l.fontSize < 5) return l;
  }
}

// One panel at vertical offset `top`: axes, ticks, a polyline per series, a legend.
void panel(std::ostream& svg, double top, const std::string& title, const std::vector<Series>& series) {
  const double left = 70, width = 620, height = 220;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (auto [x, y] : s.points) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  svg << "<text x='" << left << "' y='" << top - 8 << "' font-size='14' font-weight='bold'>" << title << "</text>\n";
  svg << "<rect x='" << left << "' y='" << top << "' width='" << width << "' height='" << height
      << "' fill='none' stroke='#888'/>\n";
  if (x0 > x1) {
    svg << "<text x='" << left + 10 << "' y='" << top + 20 << "' font-size='12'>(nothing logged)</text>\n";
    return;
  }
  const double lowest = y0, highest = y1, lowestStep = x0, highestStep = x1;
  widenRange(x0, x1);
  widenRange(y0, y1);
  if (!std::isfinite(x1 - x0) || !std::isfinite(2 * (y1 - y0))) {  // 1e308 and -1e308: no scale spans them
    const bool steps = !std::isfinite(x1 - x0);
    svg << "<text x='" << left + 10 << "' y='" << top + 20 << "' font-size='12'>(" << (steps ? "steps" : "values")
        << " too large to plot: " << fmt(steps ? lowestStep : lowest) << " to " << fmt(steps ? highestStep : highest)
        << ")</text>\n";
    return;
  }
  double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * width; };
  auto Y = [&](double y) { return top + height - (y - y0) / (y1 - y0) * height; };
  const int yDigits = tickDigits(y0, y1, tickStep(y1 - y0)), xDigits = tickDigits(x0, x1, tickStep(x1 - x0));
  for (double t = std::ceil(y0 / tickStep(y1 - y0)) * tickStep(y1 - y0); t <= y1; t += tickStep(y1 - y0))
    svg << "<line x1='" << left << "' x2='" << left + width << "' y1='" << Y(t) << "' y2='" << Y(t)
        << "' stroke='#eee'/><text x='" << left - 6 << "' y='" << Y(t) + 4 << "' font-size='11' text-anchor='end'>"
        << fmt(t, yDigits) << "</text>\n";
  for (double t = std::ceil(x0 / tickStep(x1 - x0)) * tickStep(x1 - x0); t <= x1; t += tickStep(x1 - x0))
    svg << "<text x='" << X(t) << "' y='" << top + height + 14 << "' font-size='11' text-anchor='middle'>" << fmt(t, xDigits)
        << "</text>\n";
  svg << "<text x='" << left + width / 2 << "' y='" << top + height + 30
      << "' font-size='12' text-anchor='middle'>step</text>\n";
  const LegendLayout legend = layLegend(series, width - 16, height - 8);
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* c = kColours[s.run % kNumColours];
    svg << "<polyline fill='none' stroke='" << c << "' stroke-width='1.5'" << strokePattern(s.run, s.dashed) << " points='";
    for (auto [x, y] : s.points) svg << X(x) << "," << Y(y) << " ";
    svg << "'/>\n";
    if (s.points.size() == 1)
      svg << "<circle cx='" << X(s.points[0].first) << "' cy='" << Y(s.points[0].second) << "' r='3' fill='" << c
          << "'/>\n";
    const size_t column = i / legend.perColumn;
    svg << "<text x='" << left + width - 8 - legend.columnWidth * static_cast<double>(column) << "' y='"
        << top + 4 + legend.lineHeight * static_cast<double>(i % legend.perColumn + 1) << "' font-size='" << legend.fontSize
        << "' text-anchor='end' fill='" << c << "'>" << svgText(s.label) << "</text>\n";
  }
}

int runPlot(std::vector<std::string> args) {
  cli::Flags flags("plot",
                   "tpc plot RUN.jsonl [RUN2.jsonl ...] -o CURVES.svg\n\n"
                   "Draws loss (training and validation) and tokens/s against the step from `tpc run --log-jsonl` logs.");
  flags.value("o", "the SVG file to write");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.has("o")) return cli::fail("plot", "-o CURVES.svg is required");
  if (Status s = cli::checkOutputFile("-o", flags.get("o")); !s.ok()) return cli::fail("plot", s.error());
  if (flags.positional().empty()) return cli::fail("plot", "expected one or more JSONL logs (tpc run --log-jsonl)");
  for (const std::string& path : flags.positional()) {
    std::error_code ec;
    if (std::filesystem::equivalent(path, flags.get("o"), ec))
      return cli::fail("plot", cat("-o ", flags.get("o"), " is one of the logs to plot: name another file for the SVG"));
  }
  std::string extension = std::filesystem::path(flags.get("o")).extension().string();
  for (char& ch : extension) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (extension != ".svg")
    return cli::fail("plot", cat("-o ", flags.get("o"), ": plot writes SVG; name the file .svg (e.g. -o curves.svg)"));
  std::vector<Series> losses, speed;
  size_t colour = 0;
  // Each run is named by its file name, or by its path as given where two logs share a name (run1/log.jsonl).
  std::set<std::string> names;
  for (const std::string& path : flags.positional()) names.insert(path.substr(path.find_last_of('/') + 1));
  const bool byPath = names.size() < flags.positional().size();
  for (const std::string& path : flags.positional()) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) return cli::fail("plot", path + ": error: is a directory, not a JSONL log");
    std::ifstream in(path);
    if (!in) return cli::fail("plot", path + ": error: cannot open");
    std::string name = byPath ? path : path.substr(path.find_last_of('/') + 1);
    Series train{name + " loss", {}, colour}, valid{name + " valid loss", {}, colour, true}, tps{name, {}, colour};
    std::string line;
    for (int lineNo = 1; std::getline(in, line); ++lineNo) {
      if (line.empty()) continue;
      // nlohmann's parser keeps its nesting on the heap (llvm::json's recursed: a garbled line of a million '['
      // overflowed the stack); a line that does not parse is discarded, not thrown.
      const nlohmann::json o = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      auto number = [&](const char* key) -> std::optional<double> {
        auto it = o.find(key);  // end() where o is not an object
        return it != o.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
      };
      if (!o.is_object() || !number("step")) {
        // The last line, without its newline: a run writing it now, or one killed while it wrote.
        if (in.eof() && o.is_discarded()) {
          std::cerr << "tpc plot: note: " << path << ":" << lineNo << ": the last line is cut short (a run still "
                    << "writing the log?); it is left out\n";
          break;
        }
        return cli::fail("plot", cat(path, ":", lineNo, ": error: not a tpc run log line (a JSON object with \"step\")"));
      }
      double step = *number("step");
      // Skipped steps log null; a diverged run may log a non-number: neither is a point.
      auto finite = [&](const char* key) {
        auto x = number(key);
        return x && std::isfinite(*x) && std::isfinite(step) ? x : std::nullopt;
      };
      if (auto x = finite("loss")) train.points.push_back({step, *x});
      if (auto x = finite("valid_loss")) valid.points.push_back({step, *x});
      if (auto x = finite("tokens_per_s"); x && step > 1) tps.points.push_back({step, *x});  // step 1 is warm-up
    }
    if (train.points.empty()) return cli::fail("plot", path + ": error: no line has a finite number as \"loss\"");
    for (Series* s : {&train, &valid, &tps}) lastPointPerStep(*s);
    losses.push_back(train);
    if (!valid.points.empty()) losses.push_back(valid);
    speed.push_back(tps);
    ++colour;
  }
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='620' font-family='sans-serif'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n";
  panel(svg, 30, "loss", losses);
  panel(svg, 340, "tokens/s", speed);
  svg << "</svg>\n";
  if (Status s = writeFileAtomically(flags.get("o"), svg.str()); !s.ok()) return cli::fail("plot", s.error());
  std::cout << "wrote " << flags.get("o") << " (" << flags.positional().size() << " run(s))\n";
  return 0;
}

cli::SubcommandRegistration reg("plot", "draw loss and throughput curves from JSONL logs as SVG", runPlot);

}  // namespace
}  // namespace tpc
