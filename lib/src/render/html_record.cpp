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

// The first line a person reads: where the ranks went wrong (or that they did not).
void appendCallouts(std::string& out, const json& document,
                    const std::optional<long long>& divergence,
                    const std::optional<long long>& failure) {
  const json& firstDivergence = objectOf(document.contains("first_divergence")
                                             ? &document["first_divergence"]
                                             : nullptr);
  const json& firstFailure =
      objectOf(document.contains("first_failure") ? &document["first_failure"] : nullptr);
  if (failure) {
    out += fmt::format(
        "<div class=\"callout fail\" id=\"first-failure\"><strong class=\"head\">Every rank "
        "failed the same call at event {}</strong><a href=\"#event-{}\">row {}</a>: {}.</div>\n",
        *failure, *failure, *failure, esc(clip(textOf(firstFailure, "summary"), 600)));
  }
  if (divergence) {
    const std::string summary = textOf(firstDivergence, "summary");
    out += fmt::format(
        "<div class=\"callout fail\" id=\"verdict\"><strong class=\"head\">The ranks first "
        "differ at event {}</strong>{}<a href=\"#event-{}\">row {}</a>: the cells in bold differ "
        "from what most ranks recorded.</div>\n",
        *divergence,
        summary.empty() ? std::string()
                        : "<span class=\"first\">" + esc(clip(summary, 600)) + ".</span><br>",
        *divergence, *divergence);
  } else if (!failure) {
    out +=
        "<div class=\"callout pass\" id=\"verdict\"><strong class=\"head\">Every rank recorded "
        "the same events</strong>(kind, module and outcome of each event, in order).</div>\n";
  }
}

// Which rank is which, and where each file stopped.
void appendRankTable(std::string& out, const json* ranks) {
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
}

// The events side by side, a column per rank (at most kMaxTableRanks of them); the ranges
// every rank has alike folded. Returns the rows drawn.
std::size_t appendEvents(std::string& out, const json& document, const json* ranks,
                         const json* rows, const std::optional<long long>& divergence,
                         const std::optional<long long>& failure) {
  const std::size_t columns = std::min<std::size_t>(ranks ? ranks->size() : 0, kMaxTableRanks);
  out += "<h3>Events</h3>\n<div class=\"scroll\"><table class=\"events\"><tr><th>event</th>";
  for (std::size_t c = 0; c < columns; ++c) {
    out += fmt::format("<th>rank {}</th>", integerOf((*ranks)[c], "rank").value_or(-1));
  }
  out += "</tr>";
  // Folded ranges (every rank the same call, the same outcome): one row with the range
  // collapsed in it, a single text per event since every rank has it.
  std::vector<std::pair<long long, long long>> folded;
  for (const auto& fold : document.contains("folds") && document["folds"].is_array()
                              ? document["folds"]
                              : json::array()) {
    const auto first = integerOf(fold, "first");
    const auto last = integerOf(fold, "last");
    if (first && last && *first <= *last) folded.emplace_back(*first, *last);
  }
  const auto foldOf = [&](long long index) -> const std::pair<long long, long long>* {
    for (const auto& range : folded) {
      if (range.first <= index && index <= range.second) return &range;
    }
    return nullptr;
  };
  const auto textAt = [](const json* cells, std::size_t c) {
    return cells && c < cells->size() && (*cells)[c].is_string() ? (*cells)[c].get<std::string>()
                                                                 : std::string();
  };
  std::size_t drawn = 0;
  std::size_t drawnFolded = 0;
  const json& allRows = rows ? *rows : json::array();
  for (std::size_t r = 0; r < allRows.size(); ++r) {
    const json& row = allRows[r];
    const long long index = integerOf(row, "event").value_or(-1);
    if (const auto* range = foldOf(index)) {
      const json* foldSpec = nullptr;
      for (const auto& fold : document["folds"]) {
        if (integerOf(fold, "first") == range->first) foldSpec = &fold;
      }
      out += fmt::format(
          "<tr class=\"fold\" id=\"fold-{}\"><td colspan=\"{}\"><details><summary>{}</summary>"
          "<table class=\"events\"><tr><th>event</th><th>every rank</th></tr>",
          range->first, columns + 1,
          esc(foldSpec ? textOf(*foldSpec, "summary")
                       : fmt::format("events {}-{}: every rank the same", range->first,
                                     range->second)));
      std::size_t left = 0;
      for (; r < allRows.size(); ++r) {
        const long long at = integerOf(allRows[r], "event").value_or(-1);
        if (at > range->second) break;
        if (drawnFolded >= kMaxRecordRows) {
          ++left;
          continue;
        }
        out += fmt::format("<tr id=\"event-{}\"><td class=\"num\">{}</td><td class=\"mono\">{}"
                           "</td></tr>",
                           at, at, esc(clip(textAt(arrayOf(allRows[r], "cells"), 0), 300)));
        ++drawnFolded;
      }
      --r;  // the loop's ++r moves to the first row after the range
      out += "</table>";
      if (left > 0) {
        out += fmt::format(
            "<p class=\"note\">{} more events of this range not drawn (the page's bound of {} "
            "folded events; hmc-run record show --json has them).</p>",
            left, kMaxRecordRows);
      }
      out += "</details></td></tr>";
      continue;
    }
    if (drawn >= kMaxRecordRows) break;
    const json* cells = arrayOf(row, "cells");
    const bool marked = divergence && index == *divergence;
    const bool failedRow = failure && index == *failure;
    out += fmt::format("<tr id=\"event-{}\"{}><td class=\"num\">{}{}</td>", index,
                       marked      ? " class=\"diverge\" style=\"background:#fff1e6\""
                       : failedRow ? " class=\"failed\" style=\"background:#fff1e6\""
                                   : "",
                       marked || failedRow ? "&gt; " : "", index);
    const std::string usual = cells ? majorityOf(*cells) : std::string();
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string text = textAt(cells, c);
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
  return drawn + drawnFolded;
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
  const json& firstFailure =
      objectOf(document.contains("first_failure") ? &document["first_failure"] : nullptr);
  const std::optional<long long> failure = integerOf(firstFailure, "event");
  appendCallouts(out, document, divergence, failure);
  appendRankTable(out, ranks);
  const std::size_t drawn = appendEvents(out, document, ranks, rows, divergence, failure);
  // Open at the first failure or divergence: scrolled to it when the page's first screen does
  // not show it, its row at three quarters of the window so that the rows before it show (a
  // link to another row, #event-N, wins).
  std::optional<long long> opening = divergence;
  if (failure && (!opening || *failure < *opening)) opening = failure;
  if (opening) {
    out += fmt::format(
        "<script>(function(){{if(location.hash)return;var r=document.getElementById('event-{}');"
        "if(!r)return;var b=r.getBoundingClientRect().bottom;"
        "if(b>window.innerHeight)window.scrollBy(0,b-window.innerHeight*0.75)}})()</script>\n",
        *opening);
  }
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
