#include "hmc/render/markdown.hpp"

#include <fmt/format.h>

#include "format.hpp"
#include "hmc/error.hpp"
#include "hmc/text.hpp"

namespace hmc::render {
namespace {

using nlohmann::json;
using namespace detail;

// A table cell: GitHub renders HTML inside Markdown, so < > & are entities; | would end the
// cell, ` * _ [ ] would format; a newline would end the row.
std::string cell(std::string_view raw) {
  const std::string text = hmc::printable(raw);
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '|':
        out += "\\|";
        break;
      case '`':
      case '*':
      case '_':
      case '[':
      case ']':
      case '\\':
        out += '\\';
        out += c;
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string median(const json& side, const std::string& unit) {
  const auto samples = numberOf(side, "samples");
  const auto value = numberOf(side, "median");
  if (!value || (samples && *samples == 0)) return "n/a";
  return formatValue(*value, unit);
}

}  // namespace

std::string renderMarkdownCompare(const json& document) {
  if (textOf(document, "format") != "hmc-compare/1") {
    throw ValueError(fmt::format("render: expected an hmc-compare/1 document, got format '{}'",
                                 hmc::printable(textOf(document, "format", "(none)"))));
  }
  const CompareVerdict verdict = compareVerdict(document);
  std::string out = fmt::format("### hmc-run compare: {}\n\n", verdict.word);
  const json empty = json::object();
  const json* baseline = child(document, "baseline");
  const json* current = child(document, "current");
  const CompareMethod method = compareMethod(document);
  out += fmt::format(
      "Baseline `{}`, candidate `{}`; {}, alpha {:g}, max "
      "regression {:g}%.\n\n",
      cell(textOf(baseline ? *baseline : empty, "file", "?")),
      cell(textOf(current ? *current : empty, "file", "?")), method.test,
      numberOf(document, "alpha").value_or(0.05),
      numberOf(document, "max_regression").value_or(0.10) * 100);
  out += fmt::format("Drift control: {}.  \nGate: {}.\n\n", cell(method.drift), cell(method.gate));
  out += "| metric | baseline | candidate | change | interval | p | verdict |\n";
  out += "|---|---:|---:|---:|---:|---:|---|\n";
  const json* metrics = child(document, "metrics");
  if (metrics != nullptr && metrics->is_array()) {
    for (const auto& m : *metrics) {
      const std::string unit = textOf(m, "unit", "s");
      const json* b = child(m, "baseline");
      const json* c = child(m, "current");
      std::string word = textOf(m, "verdict", "?");
      const json* regression = child(m, "regression");
      const bool failed =
          regression != nullptr && regression->is_boolean() && regression->get<bool>();
      word = failed ? "**" + cell(word) + " (regression)**" : cell(word);
      const json* gated = child(m, "gated");
      if (gated != nullptr && gated->is_boolean() && !gated->get<bool>()) word += " (information)";
      std::string p = formatP(numberOf(m, "p_value"));
      const auto adjusted = numberOf(m, "p_adjusted");
      if (adjusted && p != formatP(adjusted)) p += " (Holm " + formatP(adjusted) + ")";
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", cell(textOf(m, "name", "?")),
                         median(b ? *b : empty, unit), median(c ? *c : empty, unit),
                         formatChange(numberOf(m, "change")), formatChangeInterval(m), p, word);
    }
  }
  out += fmt::format("\n**{}**: {}\n", verdict.word, cell(verdict.line));
  return out;
}

}  // namespace hmc::render
