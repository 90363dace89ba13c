#include "record_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>

#include "exit_codes.hpp"
#include "hmc/error.hpp"
#include "hmc/record/merge.hpp"
#include "hmc/render/html.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/scenario.hpp"

namespace {

using hmc::app::kExitUsage;

using hmc::record::Event;
using hmc::record::EventOp;
using hmc::record::Outcome;
using hmc::record::Recording;

// One event as a short line: "forward lin (bound, reused) 0.2 ms", "close a: hang".
std::string describe(const Recording& recording, const Event& event) {
  std::string text(hmc::record::toString(event.op));
  if (event.module >= 0 && static_cast<std::size_t>(event.module) < recording.moduleNames.size()) {
    text += " " + recording.moduleNames[static_cast<std::size_t>(event.module)];
  }
  const auto& d = event.detail;
  if (event.op == EventOp::kForward && d.is_object() && d.contains("reused")) {
    text += d["reused"].get<bool>() ? " (bound: reused)" : " (bound: created)";
  }
  if (event.op == EventOp::kFault) text += " " + d.value("fault", std::string());
  if (event.outcome != Outcome::kOk) {
    text += fmt::format(": {}", hmc::record::toString(event.outcome));
    if (d.is_object() && d.contains("message")) {
      text += " (" + d["message"].get<std::string>() + ")";
    }
  }
  return text;
}

std::string fit(const std::string& text, int width) {
  const auto w = static_cast<std::size_t>(std::max(8, width));
  if (text.size() <= w) return text + std::string(w - text.size(), ' ');
  return text.substr(0, w - 3) + "...";
}

// The hmc-record-show/1 document: each rank's header and events as short lines, side by side,
// and the first row where they differ (kind, module name or outcome).
nlohmann::json showDocument(const RecordOptions& options,
                            const std::vector<Recording>& recordings) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : recordings) {
    ranks.push_back({{"rank", r.header.rank},
                     {"host", r.header.host},
                     {"pid", r.header.pid},
                     {"version", r.header.version},
                     {"events", r.events.size()},
                     {"ended", r.ended},
                     {"stop", r.ended ? std::string() : r.stop}});
  }
  std::size_t total = 0;
  for (const auto& r : recordings) total = std::max(total, r.events.size());
  const std::size_t shown =
      options.limit ? std::min(total, static_cast<std::size_t>(*options.limit)) : total;
  std::optional<std::size_t> divergence;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t row = 0; row < total; ++row) {
    nlohmann::json cells = nlohmann::json::array();
    std::set<std::string> seen;
    for (const auto& r : recordings) {
      cells.push_back(row < r.events.size() ? describe(r, r.events[row]) : std::string());
      seen.insert(row < r.events.size() ? cells.back().get<std::string>() : "(none)");
    }
    if (seen.size() > 1 && !divergence) divergence = row;
    if (row < shown) rows.push_back({{"event", row}, {"cells", std::move(cells)}});
    if (row >= shown && divergence) break;
  }
  return {{"format", "hmc-record-show/1"},
          {"directory", options.directory},
          {"ranks", std::move(ranks)},
          {"total_rows", total},
          {"rows", std::move(rows)},
          {"divergence", divergence ? nlohmann::json(*divergence) : nlohmann::json()}};
}

void printShow(const RecordOptions& options, const nlohmann::json& document) {
  for (const auto& r : document["ranks"]) {
    const std::string stop = r["stop"].get<std::string>();
    fmt::print("# rank {}: {} pid {}, hmc {}, {} events{}\n", r["rank"].get<int>(),
               r["host"].get<std::string>(), r["pid"].get<long long>(),
               r["version"].get<std::string>(), r["events"].get<std::size_t>(),
               stop.empty() ? "" : "; " + stop);
  }
  std::string head = "#     ";
  for (const auto& r : document["ranks"]) {
    head += fit(fmt::format("rank {}", r["rank"].get<int>()), options.width) + " ";
  }
  fmt::print("{}\n", head);
  const auto& divergence = document["divergence"];
  for (const auto& row : document["rows"]) {
    const auto index = row["event"].get<std::size_t>();
    const bool marked = divergence.is_number() && divergence.get<std::size_t>() == index;
    std::string line = fmt::format("{}{:>5} ", marked ? ">" : " ", index);
    for (const auto& cell : row["cells"]) line += fit(cell.get<std::string>(), options.width) + " ";
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  if (divergence.is_number()) {
    fmt::print("# the ranks first differ at event {} (marked >)\n", divergence.get<std::size_t>());
  } else {
    fmt::print("# every rank recorded the same events\n");
  }
}

int runShow(const RecordOptions& options) {
  if (options.htmlPath) {
    const std::string problem = hmc::scenario::checkOutputPath(*options.htmlPath);
    if (!problem.empty()) {
      fmt::print(stderr, "hmc-run record show: {}\n", problem);
      return kExitUsage;
    }
  }
  std::vector<std::pair<int, std::string>> files;
  try {
    files = hmc::record::recordingFiles(options.directory);
  } catch (const hmc::Error& error) {
    // A folder that is not there yet (a run that has not opened its files) or not readable.
    fmt::print(stderr, "hmc-run record show: {}\n", error.what());
    return kExitUsage;
  }
  if (files.empty()) {
    fmt::print(stderr, "hmc-run record show: {}: no rank-N.hmcrec recording in it\n",
               options.directory);
    return kExitUsage;
  }
  std::vector<Recording> recordings;
  for (const auto& [rank, path] : files) {
    try {
      recordings.push_back(hmc::record::readRecording(path));
    } catch (const std::exception& error) {
      fmt::print(stderr, "# {} (left out)\n", error.what());
    }
  }
  if (recordings.empty()) return kExitUsage;
  const nlohmann::json document = showDocument(options, recordings);
  if (options.htmlPath) {
    hmc::scenario::writeOutputFile(*options.htmlPath, hmc::render::renderHtmlRecordShow(document));
    // The page on standard output leaves nothing else there.
    if (*options.htmlPath == "-") return 0;
  }
  if (options.json) {
    fmt::print("{}\n", document.dump(2));
  } else {
    printShow(options, document);
  }
  return 0;
}

int runMerge(const RecordOptions& options) {
  const auto expect = options.expect == "observed" ? hmc::record::MergeExpect::kObserved
                                                   : hmc::record::MergeExpect::kProgram;
  hmc::record::MergeResult merged;
  try {
    merged = hmc::record::mergeRecordings(options.directory, expect);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run record merge: {}\n", error.what());
    return kExitUsage;
  }
  for (const auto& problem : merged.problems) fmt::print(stderr, "# not merged: {}\n", problem);
  // The merged document must be a scenario this hmc-run runs.
  try {
    hmc::scenario::parseScenario(merged.scenario, options.outputPath);
  } catch (const std::exception& error) {
    fmt::print(stderr,
               "hmc-run record merge: the merged scenario does not validate (a bug in hmc, "
               "please report it with the recordings): {}\n",
               error.what());
    return kExitUsage;
  }
  const std::string text = merged.scenario.dump(2) + "\n";
  if (options.outputPath == "-") {
    fmt::print("{}", text);
  } else {
    const std::string problem = hmc::scenario::checkOutputPath(options.outputPath);
    if (!problem.empty()) {
      fmt::print(stderr, "hmc-run record merge: {}\n", problem);
      return kExitUsage;
    }
    hmc::scenario::writeOutputFile(options.outputPath, text);
  }
  fmt::print(stderr, "# merged {} of {} ranks, {} steps, into {}; replay: hmc-run {}\n",
             merged.recordings.size(), merged.worldSize, merged.scenario["steps"].size(),
             options.outputPath, options.outputPath);
  return 0;
}

}  // namespace

CLI::App* addRecordCommand(CLI::App& app, RecordOptions& options) {
  CLI::App* record = app.add_subcommand(
      "record", "Recordings of a run's lifecycle calls (--record DIR, HMC_RECORD=DIR)");
  record->require_subcommand(1);
  CLI::App* merge = record->add_subcommand(
      "merge", "Merge the ranks' recordings into a scenario that replays the run on thread ranks");
  merge->add_option("directory", options.directory, "The recording folder")->required();
  merge->add_option("-o,--output", options.outputPath, "The scenario file to write (- : stdout)")
      ->required();
  merge
      ->add_option("--expect", options.expect,
                   "program: each step expects what the program expected (a replay fails as the "
                   "run did); observed: what each call did (a replay passes while it "
                   "reproduces, for CI)")
      ->check(CLI::IsMember({"program", "observed"}));
  CLI::App* show = record->add_subcommand(
      "show", "Print the ranks' recorded events side by side, the first divergence marked");
  show->add_option("directory", options.directory, "The recording folder")->required();
  show->add_option("--width", options.width, "Characters per rank column")
      ->check(CLI::Range(12, 200));
  show->add_option("--limit", options.limit, "At most this many rows");
  show->add_flag("--json", options.json,
                 "Print hmc-record-show/1 JSON instead of the table (hmc-run render draws it)");
  show->add_option("--html", options.htmlPath,
                   "Also write one self-contained HTML page of the events side by side, the first "
                   "divergence marked; - for standard output (instead of the table)");
  return record;
}

int runRecord(const CLI::App& record, const RecordOptions& options) {
  try {
    if (record.got_subcommand("merge")) return runMerge(options);
    return runShow(options);
  } catch (const std::system_error& error) {
    // `record show DIR | head`: the reader left; nothing is lost.
    if (error.code() == std::errc::broken_pipe) return 0;
    fmt::print(stderr, "hmc-run record: {}\n", error.what());
    return 1;
  }
}
