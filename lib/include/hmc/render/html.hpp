#pragma once
// Pictures of hmc-run's JSON documents: one self-contained HTML page (inline CSS and SVG, no
// script or font fetched at view time, a Content-Security-Policy that forbids any) for
//   - a run: an `hmc-report/1` document, or an `hmc-report-set/1` (one section per report);
//   - a comparison: the `hmc-compare/1` document of `hmc-run compare`;
//   - a program's world end: the `hmc-world-end/1` document of hmc::joinWorld's report;
//   - a recording's ranks side by side: the `hmc-record-show/1` document of `record show`;
// and the comparison as a Markdown table for a CI job summary (markdown.hpp).
//
// Rendered from the documents, not from the C++ structs, so a report written on a cluster can
// be drawn later (`hmc-run render`). Every key is optional where the format says so (an old
// report without `samples` or `leak_trends`, an `invalid` report); what is missing is left out
// of the page, never guessed. Every string from a document is escaped. The page is bounded
// whatever the run's size (kMaxTimelineRanks x kMaxTimelineSteps cells, kMaxDots points per
// plot, ...); what is left out is said on the page.
//
// Pure functions: no I/O, thread safe. Throw hmc::ValueError for a document of another format.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace hmc::render {

inline constexpr std::size_t kMaxTimelineRanks = 64;
inline constexpr std::size_t kMaxTimelineSteps = 200;
inline constexpr std::size_t kMaxDots = 2000;          // per distribution or trend plot
inline constexpr std::size_t kMaxTrendPlots = 48;      // leak trend series drawn
inline constexpr std::size_t kMaxTableRanks = 64;      // rows of per-rank tables
inline constexpr std::size_t kMaxReportSections = 64;  // reports of a set drawn
inline constexpr std::size_t kMaxCompareMetrics = 200;
inline constexpr std::size_t kMaxRecordRows = 5000;  // events of a recording drawn

// The page of one run: `hmc-report/1` or `hmc-report-set/1`.
std::string renderHtmlReport(const nlohmann::json& reportDocument);

// The page of one comparison: `hmc-compare/1`. Metrics whose `baseline`/`current` carry
// `values` (the samples) are drawn as two dot strips; without them, as their medians.
std::string renderHtmlCompare(const nlohmann::json& compareDocument);

// The page of a program's world end: `hmc-world-end/1` (hmc/world/world.hpp, HMC_REPORT): the
// verdict, every rank's end (where, stage, what, leaks) and where the others waited.
std::string renderHtmlWorldEnd(const nlohmann::json& worldEndDocument);
// The page of a recording's events side by side: `hmc-record-show/1` (`hmc-run record show
// DIR --json`): a column per rank, the first row where they differ marked, and in the rows from
// there the cells that differ from most ranks' in bold.
std::string renderHtmlRecordShow(const nlohmann::json& recordShowDocument);

// `text` safe in HTML text and in a quoted attribute value: & < > " ' escaped, control
// characters (other than newline and tab) and invalid UTF-8 shown as hmc::printable does.
std::string escapeHtml(std::string_view text);

}  // namespace hmc::render
