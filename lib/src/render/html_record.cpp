#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/text.hpp"
#include "page.hpp"

namespace hmc::render {
namespace {

using nlohmann::json;
using namespace detail;

// The text most ranks have in one row: a cell that differs from it is what diverged.
std::string majorityOf(const json& cells) {
  std::map<std::string, int> counts;
  for (const auto& cell : cells) {
    if (cell.is_string()) ++counts[cell.get<std::string>()];
  }
  std::string best;
  int most = 0;
  for (const auto& [text, count] : counts) {
    if (count > most) {
      best = text;
      most = count;
    }
  }
  return best;
}

}  // namespace

std::string renderHtmlRecordShow(const json& document) {
  if (textOf(document, "format") != "hmc-record-show/1") {
    throw ValueError(fmt::format("render: expected an hmc-record-show/1 document, got format '{}'",
                                 hmc::printable(textOf(document, "format", "(none)"))));
  }
  const json* ranks = arrayOf(document, "ranks");
  const json* rows = arrayOf(document, "rows");
  const std::optional<long long> divergence = integerOf(document, "divergence");
  std::string out;
  pageStart(out, "hmc-run record show \u2014 " + textOf(document, "directory", "?"));
  out += "<section class=\"record\" data-divergence=\"" +
         (divergence ? std::to_string(*divergence) : std::string("none")) + "\">\n";
  out += "<h1>recording " + esc(textOf(document, "directory", "?")) + "</h1>\n";
  out += fmt::format("<p class=\"sub\">{} ranks \u00b7 {} rows</p>\n",
                     ranks ? ranks->size() : 0, integerOf(document, "total_rows").value_or(0));
  if (divergence) {
    out += fmt::format(
        "<div class=\"callout fail\" id=\"verdict\"><strong class=\"head\">The ranks first "
        "differ at event {}</strong><a href=\"#event-{}\">row {}</a>: the cells in bold differ "
        "from what most ranks recorded.</div>\n",
        *divergence, *divergence, *divergence);
  } else {
    out +=
        "<div class=\"callout pass\" id=\"verdict\"><strong class=\"head\">Every rank recorded "
        "the same events</strong>(kind, module and outcome of each event, in order).</div>\n";
  }
  // Which rank is which, and where each file stopped.
  out += "<h3>Ranks</h3>\n<table><tr><th>rank</th><th>host</th><th>pid</th><th>hmc</th>"
         "<th>events</th><th>end of file</th></tr>";
  std::size_t listed = 0;
  for (const auto& rank : ranks ? *ranks : json::array()) {
    if (listed++ >= kMaxTableRanks) break;
    const std::string stop = textOf(rank, "stop");
    out += fmt::format(
        "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td>"
        "<td class=\"num\">{}</td><td>{}</td></tr>",
        integerOf(rank, "rank").value_or(-1), esc(textOf(rank, "host", "?")),
        integerOf(rank, "pid").value_or(0), esc(textOf(rank, "version", "?")),
        integerOf(rank, "events").value_or(0),
        flag(rank, "ended") ? std::string("clean end") : "<strong>" + esc(clip(stop, 400)) +
                                                             "</strong>");
  }
  out += "</table>\n";
  // The events side by side, a column per rank (at most kMaxTableRanks of them).
  const std::size_t columns = std::min<std::size_t>(ranks ? ranks->size() : 0, kMaxTableRanks);
  out += "<h3>Events</h3>\n<div class=\"scroll\"><table class=\"events\"><tr><th>event</th>";
  for (std::size_t c = 0; c < columns; ++c) {
    out += fmt::format("<th>rank {}</th>", integerOf((*ranks)[c], "rank").value_or(-1));
  }
  out += "</tr>";
  std::size_t drawn = 0;
  for (const auto& row : rows ? *rows : json::array()) {
    if (drawn >= kMaxRecordRows) break;
    const long long index = integerOf(row, "event").value_or(-1);
    const json* cells = arrayOf(row, "cells");
    const bool marked = divergence && index == *divergence;
    out += fmt::format("<tr id=\"event-{}\"{}><td class=\"num\">{}{}</td>", index,
                       marked ? " class=\"diverge\" style=\"background:#fff1e6\"" : "",
                       marked ? "&gt; " : "", index);
    const std::string usual = cells ? majorityOf(*cells) : std::string();
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string text =
          cells && c < cells->size() && (*cells)[c].is_string() ? (*cells)[c].get<std::string>()
                                                                 : std::string();
      if (text.empty()) {
        out += "<td class=\"note\">(no event)</td>";  // the rank's file ended before this row
        continue;
      }
      const bool odd = divergence && index >= *divergence && text != usual;
      out += "<td class=\"mono\">" +
             (odd ? "<strong>" + esc(clip(text, 300)) + "</strong>" : esc(clip(text, 300))) +
             "</td>";
    }
    out += "</tr>";
    ++drawn;
  }
  out += "</table></div>\n";
  const long long total = integerOf(document, "total_rows").value_or(0);
  if (rows && static_cast<long long>(drawn) < total) {
    out += fmt::format(
        "<p class=\"note\">{} of {} rows drawn (hmc-run record show --limit, or the page's "
        "bound of {}).</p>\n",
        drawn, total, kMaxRecordRows);
  }
  out += "</section>\n";
  pageEnd(out);
  return out;
}

}  // namespace hmc::render
