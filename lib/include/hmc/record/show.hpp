#pragma once
// `hmc-run record show`: the ranks' recordings (recording.hpp) side by side as one
// hmc-record-show/1 document, which the console table, `--json` and the HTML page
// (hmc/render/html.hpp, renderHtmlRecordShow) all draw from.
//
// Row N holds each rank's N-th event as a short text ("forward lin (bound: reused)", "close a:
// hang (...)"). On a row where every rank has the same text (the same kind of call, module,
// arguments shown and outcome with its message) the ranks agree. The document says:
// - `divergence`: the first row where they do not (a rank with no event there counts as
//   different), or null; `first_divergence`: that row's detail, the ranks whose text differs
//   from the one most ranks have (ties: the group holding the lowest rank is the reference)
//   and a one-line `summary` naming both;
// - `first_failure`: the first row where a rank's call failed (error or hang), when every rank
//   failed it the same way before any divergence (else the divergence comes first), or null;
// - `folds`: ranges of consecutive rows before the first of those two where every rank agrees
//   and every call succeeded, at least kMinFoldRows long, ending kFoldContextRows rows before
//   it (those are shown as context): the table and the page draw each as one line. Empty when
//   folding is off (`record show --all`). The rows from that first divergence or failure on
//   are never folded.
// `rows` always holds every row (up to `limit`): folds only say how to draw them.
//
// Torch-free and pure; readRecording() reads the files.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/record/recording.hpp"

namespace hmc::record {

// Rows of context kept unfolded before the first divergence or failure.
inline constexpr std::size_t kFoldContextRows = 3;
// Shorter runs of agreeing rows are shown as they are: one line would save too little.
inline constexpr std::size_t kMinFoldRows = 4;

struct ShowOptions {
  std::string directory;             // named in the document
  std::optional<std::size_t> limit;  // at most this many rows (the divergence is found anyway)
  bool fold = true;                  // false: `folds` stays empty (--all)
};

// One event as a row's text: its kind, module, what the bind did, the fault, the outcome
// with the error's message.
std::string describeEvent(const Recording& recording, const Event& event);

// The hmc-record-show/1 document of `recordings` (one per rank, in rank order).
nlohmann::json showDocument(const std::vector<Recording>& recordings, const ShowOptions& options);

// "0-3, 5, 7-9": sorted distinct ranks as ranges.
std::string rankRanges(const std::vector<int>& ranks);

}  // namespace hmc::record
