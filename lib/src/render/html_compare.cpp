#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/text.hpp"
#include "page.hpp"

namespace hmc::render {
namespace {

using nlohmann::json;
using namespace detail;

const char* verdictColour(const std::string& verdict) {
  if (verdict == "faster") return "#009E73";
  if (verdict == "slower") return "#D55E00";
  if (verdict == "undecided") return "#E69F00";
  if (verdict == "inconclusive") return "#CC79A7";
  return "#6e7781";
}

// `maxRegression`: the gate (0.10: a median 10% slower than the baseline's fails).
void comparePlot(std::string& out, const json& metric, double maxRegression) {
  const std::string name = textOf(metric, "name", "?");
  const std::string unit = textOf(metric, "unit", "s");
  const std::string verdict = textOf(metric, "verdict", "?");
  const bool regression = flag(metric, "regression");
  const json& baseline = objectOf(child(metric, "baseline"));
  const json& current = objectOf(child(metric, "current"));
  struct Side {
    const char* title;
    std::vector<double> values;
    std::optional<double> median;
    const char* colour;
  };
  Side sides[2] = {
      {"baseline", numbersOf(arrayOf(baseline, "values")), numberOf(baseline, "median"), "#0072B2"},
      {"candidate", numbersOf(arrayOf(current, "values")), numberOf(current, "median"), "#E69F00"}};
  for (auto& side : sides) {
    if (side.values.empty() && side.median) side.values.push_back(*side.median);
  }
  double low = 1e300, high = -1e300;
  for (const auto& side : sides) {
    for (const double v : side.values) {
      low = std::min(low, v);
      high = std::max(high, v);
    }
  }
  if (low > high) {
    low = 0;
    high = 1;
  }
  // The gate: where the candidate's median would fail. On the axis when it lies near the data
  // (so a 1% change reads as small beside a 10% gate), else named at the edge.
  std::optional<double> gate;
  if (sides[0].median && *sides[0].median > 0) gate = *sides[0].median * (1 + maxRegression);
  const bool gateShown = gate && *gate <= high * 1.5;
  if (gateShown) high = std::max(high, *gate);
  const double pad = std::max((high - low) * 0.1, std::fabs(high) * 0.02 + 1e-12);
  low = std::max(0.0, low - pad);
  high += pad;
  const double width = 400, height = 108, left = 82, right = 14, rowH = 38, top = 8;
  const Axis x{low, high, left, width - right, false};
  out += "<div class=\"plot metric v-" + esc(verdict) + "\"><h4><span class=\"mono\">" + esc(name) +
         "</span>";
  badge(out, verdict);
  if (regression) badge(out, "regression");
  out += "</h4>\n<svg role=\"img\" aria-label=\"baseline against candidate\" width=\"" + px(width) +
         "\" height=\"" + px(height) + "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" xmlns=\"http://www.w3.org/2000/svg\">";
  const double bottom = top + rowH * 2;
  for (const double tick : x.ticks(4)) {
    out += fmt::format(
        "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e7eb\"/>"
        "<text x=\"{0}\" y=\"{3}\" font-size=\"11\" text-anchor=\"middle\" "
        "fill=\"#57606a\">{4}</text>",
        px(x(tick)), px(top), px(bottom + 3), px(bottom + 16), esc(formatValue(tick, unit)));
  }
  if (gateShown) {
    out += fmt::format(
        "<line class=\"gate\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#D55E00\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"><title>the gate: a candidate median above "
        "{3} (+{4:g}%) fails</title></line>",
        px(x(*gate)), px(top - 2), px(bottom + 2), esc(formatValue(*gate, unit)),
        maxRegression * 100);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const Side& side = sides[i];
    const double mid = top + rowH * (static_cast<double>(i) + 0.5);
    out += fmt::format(
        "<text x=\"4\" y=\"{}\" font-size=\"13\" font-weight=\"600\" fill=\"{}\">{}"
        "</text>",
        px(mid + 4), side.colour, side.title);
    const auto dots = thinned(side.values, kMaxDots);
    for (std::size_t d = 0; d < dots.size(); ++d) {
      out +=
          fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3.2\" fill=\"{}\" fill-opacity=\"0.75\"/>",
                      px(x(dots[d])), px(mid + jitter(d + i * 104729) * 9), side.colour);
    }
    if (side.median) {
      out += fmt::format(
          "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#1b1f24\" "
          "stroke-width=\"3\"><title>median {3}</title></line>",
          px(x(*side.median)), px(mid - 14), px(mid + 14), esc(formatValue(*side.median, unit)));
    }
  }
  out += "</svg>\n";
  out += fmt::format(
      "<div class=\"note\">median {} \u2192 {} ({}), p = {}, {} vs {} samples{}</div>",
      esc(sides[0].median ? formatValue(*sides[0].median, unit) : "n/a"),
      esc(sides[1].median ? formatValue(*sides[1].median, unit) : "n/a"),
      esc(formatChange(numberOf(metric, "change"))), esc(formatP(numberOf(metric, "p_value"))),
      integerOf(baseline, "samples").value_or(0), integerOf(current, "samples").value_or(0),
      child(metric, "note") ? " \u00b7 " + esc(textOf(metric, "note")) : "");
  if (gate && !gateShown) {
    out += fmt::format(
        "<div class=\"note\">gate +{:g}% at {}: far right of these samples, off "
        "the axis</div>",
        maxRegression * 100, esc(formatValue(*gate, unit)));
  }
  out += "</div>\n";
}

}  // namespace

std::string renderHtmlCompare(const json& document) {
  if (textOf(document, "format") != "hmc-compare/1") {
    throw ValueError(fmt::format("render: expected an hmc-compare/1 document, got format '{}'",
                                 hmc::printable(textOf(document, "format", "(none)"))));
  }
  const CompareVerdict verdict = compareVerdict(document);
  std::string out;
  pageStart(out, "hmc-run compare \u2014 " + verdict.word);
  out += "<section class=\"compare\" data-verdict=\"" + esc(verdict.word) + "\">\n";
  out += "<h1>hmc-run compare";
  badge(out, verdict.word);
  out += "</h1>\n";
  const json& baseline = objectOf(child(document, "baseline"));
  const json& current = objectOf(child(document, "current"));
  out += fmt::format(
      "<p class=\"sub\">baseline <code>{}</code> against candidate <code>{}</code> "
      "({}) \u00b7 {}, alpha {:g}, max regression {:g}%<br>drift control: {} \u00b7 gate: "
      "{}</p>\n",
      esc(textOf(baseline, "file", "?")), esc(textOf(current, "file", "?")),
      esc(textOf(baseline, "kind", "?")), esc(compareMethod(document).test),
      numberOf(document, "alpha").value_or(0.05),
      numberOf(document, "max_regression").value_or(0.1) * 100, esc(compareMethod(document).drift),
      esc(compareMethod(document).gate));
  out += "<div class=\"callout " + esc(verdict.word) + "\" id=\"verdict\"><strong class=\"head\">" +
         esc(verdict.word) + "</strong>" + esc(clip(verdict.line, 2000));
  if (const auto ratio = numberOf(document, "geometric_mean_ratio")) {
    out += fmt::format("<br>Geometric mean of candidate/baseline medians: {:.4f} ({:+.1f}%).",
                       *ratio, (*ratio - 1) * 100);
  }
  out += "</div>\n";
  const json* metrics = arrayOf(document, "metrics");
  const std::size_t count = metrics ? metrics->size() : 0;
  out +=
      "<h2>Metrics</h2>\n<table class=\"metrics\"><tr><th>metric</th><th>baseline</th>"
      "<th>candidate</th><th>change</th><th>interval</th><th>p</th><th>verdict</th></tr>";
  for (std::size_t i = 0; i < count; ++i) {
    const json& m = (*metrics)[i];
    const std::string unit = textOf(m, "unit", "s");
    auto median = [&](const char* side) {
      const json& s = objectOf(child(m, side));
      const auto v = numberOf(s, "median");
      return v && integerOf(s, "samples").value_or(1) > 0 ? formatValue(*v, unit)
                                                          : std::string("n/a");
    };
    const std::string v = textOf(m, "verdict", "?");
    out += fmt::format(
        "<tr><td class=\"mono\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}"
        "</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
        "<td><span class=\"sw\" style=\"background:{}\"></span>{}{}</td></tr>",
        esc(textOf(m, "name", "?")), esc(median("baseline")), esc(median("current")),
        esc(formatChange(numberOf(m, "change"))), esc(formatChangeInterval(m)),
        esc(formatP(numberOf(m, "p_value"))),
        verdictColour(v), esc(v), flag(m, "regression") ? " <strong>(regression)</strong>" : "");
  }
  out += "</table>\n";
  out += "<h2>Baseline against candidate, per metric</h2>\n";
  out +=
      "<div class=\"legend\"><span><span class=\"sw\" style=\"background:#0072B2;"
      "border-radius:50%\"></span>baseline sample</span><span><span class=\"sw\" "
      "style=\"background:#E69F00;border-radius:50%\"></span>candidate sample</span><span><span "
      "class=\"sw\" style=\"background:#1b1f24;width:4px\"></span>median</span><span><span "
      "class=\"sw\" style=\"border:0;border-left:2px dashed #D55E00;width:4px\"></span>the gate "
      "(baseline median + max regression)</span><span>one sample "
      "per measured repetition</span></div>\n";
  out += "<div class=\"plots\">\n";
  // Regressions and slower metrics first: what the reader came for.
  std::vector<std::size_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = i;
  auto weight = [&](std::size_t i) {
    const json& m = (*metrics)[i];
    if (flag(m, "regression")) return 0;
    const std::string v = textOf(m, "verdict");
    return v == "slower" ? 1 : v == "undecided" || v == "inconclusive" ? 2 : v == "faster" ? 3 : 4;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return weight(a) < weight(b); });
  for (std::size_t i = 0; i < count && i < kMaxCompareMetrics; ++i) {
    comparePlot(out, (*metrics)[order[i]], numberOf(document, "max_regression").value_or(0.1));
  }
  out += "</div>\n";
  if (count > kMaxCompareMetrics) {
    out += fmt::format(
        "<p class=\"note\"><strong>Left out:</strong> the plots of {} more metrics "
        "(all are in the table).</p>\n",
        count - kMaxCompareMetrics);
  }
  for (const auto& [key, title] :
       {std::pair<const char*, const char*>{"only_baseline", "Only in the baseline (not compared)"},
        {"only_current", "Only in the candidate (not compared)"}}) {
    const json* names = arrayOf(document, key);
    if (names == nullptr || names->empty()) continue;
    std::string list;
    for (const auto& n : *names)
      list += (list.empty() ? "" : ", ") + (n.is_string() ? n.get<std::string>() : n.dump());
    out += fmt::format("<p class=\"note\"><strong>{}:</strong> {}</p>\n", title, esc(list));
  }
  out += "</section>\n";
  pageEnd(out);
  return out;
}

}  // namespace hmc::render
