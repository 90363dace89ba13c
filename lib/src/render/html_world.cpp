#include <fmt/format.h>

#include <string>

#include "failure.hpp"
#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/text.hpp"
#include "page.hpp"

namespace hmc::render {
namespace {

using nlohmann::json;
using namespace detail;

// A rank's leak check as one cell: "none", "2 groups left (1 bound)", or why not checked.
std::string leakCell(const json& rank) {
  const json& leaks = objectOf(child(rank, "leaks"));
  if (leaks.empty()) return "-";
  if (!flag(leaks, "checked")) return textOf(leaks, "reason", "not checked");  // says "not checked"
  const long long left = integerOf(leaks, "groups_left").value_or(0);
  if (left == 0) return "none";
  return fmt::format("{} group{} left open ({} bound)", left, left == 1 ? "" : "s",
                     integerOf(leaks, "bound_groups_left").value_or(0));
}

}  // namespace

std::string renderHtmlWorldEnd(const json& document) {
  if (textOf(document, "format") != "hmc-world-end/1") {
    throw ValueError(fmt::format("render: expected an hmc-world-end/1 document, got format '{}'",
                                 hmc::printable(textOf(document, "format", "(none)"))));
  }
  const std::string outcome = textOf(document, "outcome", "?");
  std::string out;
  pageStart(out, "hmc world " + textOf(document, "name", "?") + " \u2014 " + outcome);
  out += "<section class=\"world\" data-outcome=\"" + esc(outcome) + "\">\n";
  out += "<h1>world " + esc(textOf(document, "name", "?"));
  badge(out, outcome);
  out += "</h1>\n";
  out += fmt::format(
      "<p class=\"sub\">{} ranks \u00b7 {} \u00b7 transport {} \u00b7 deadline {:g} s \u00b7 "
      "store {} \u00b7 exit {}</p>\n",
      integerOf(document, "world_size").value_or(0), esc(textOf(document, "launcher", "?")),
      esc(textOf(document, "transport", "?")), numberOf(document, "timeout_s").value_or(0),
      esc(textOf(document, "store", "?")), integerOf(document, "exit_code").value_or(-1));
  // Read first: the first failure and what followed from it, then the verdict and the ranks.
  firstFailureBlock(out, document, "world");
  const FailureParts parts = failurePartsOf(document);
  const json& status = objectOf(child(document, "status"));
  const std::string diagnosis = textOf(status, "diagnosis");
  if (outcome == "pass") {
    out +=
        "<div class=\"callout pass\"><strong class=\"head\">Every rank ended cleanly"
        "</strong>the collective close ran on every rank and left nothing open.</div>\n";
  } else {
    out += "<div class=\"callout " + std::string(outcome == "hang" ? "hang" : "fail") +
           "\" id=\"verdict\"><strong class=\"head\">" +
           (outcome == "hang" ? "Some rank did not reach the end" : "Some rank's end failed") +
           "</strong>";
    if (!diagnosis.empty()) out += "Waits: " + esc(clip(diagnosis, 2000));
    out += "</div>\n";
  }
  out += "<h3 id=\"ranks\">Ranks</h3>\n<table class=\"leaks\"><tr><th>rank</th>" +
         std::string(parts.present ? "<th>first failure</th>" : "") +
         "<th>where</th><th>end</th><th>stage</th><th>what</th><th>leaks</th></tr>";
  const json* ranks = arrayOf(document, "ranks");
  std::size_t shown = 0;
  for (const auto& rank : ranks ? *ranks : json::array()) {
    if (shown++ >= kMaxTableRanks) break;
    const std::string where =
        rank.contains("where")
            ? textOf(rank, "where")
            : fmt::format("{}:{}", textOf(rank, "host", "?"), integerOf(rank, "pid").value_or(0));
    const std::string stage = textOf(rank, "stage").empty()
                                  ? "-"
                                  : fmt::format("'{}' #{}", textOf(rank, "stage"),
                                                integerOf(rank, "sequence").value_or(0));
    const std::string end = textOf(rank, "status", "?");
    const long long number = integerOf(rank, "rank").value_or(-1);
    const FailurePart part = parts.of(number);
    out += fmt::format(
        "<tr{}><td class=\"num\">{}</td>{}<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "</tr>",
        part == FailurePart::kNone ? "" : fmt::format(" class=\"part-{}\"", failurePartClass(part)),
        number, parts.present ? "<td>" + failurePartTag(part) + "</td>" : "", esc(where),
        end == "ok" ? std::string("ok") : "<strong>" + esc(end) + "</strong>", esc(stage),
        esc(clip(textOf(rank, "error"), 400)), esc(clip(leakCell(rank), 400)));
  }
  out += "</table>\n";
  if (ranks && ranks->size() > kMaxTableRanks) {
    out += fmt::format("<p class=\"note\">{} of {} ranks listed.</p>\n", kMaxTableRanks,
                       ranks->size());
  }
  if (const json* problems = arrayOf(status, "ranks")) {
    std::string lines;
    for (const auto& rank : *problems) {
      if (!textOf(rank, "problem").empty())
        lines += "<div class=\"mono\">" + esc(clip(textOf(rank, "problem"), 400)) + "</div>";
    }
    if (!lines.empty()) out += "<h3 id=\"problems\">Where the ranks stopped</h3>\n" + lines;
  }
  out += "</section>\n";
  pageEnd(out);
  return out;
}

}  // namespace hmc::render
