#include "record_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <system_error>

#include "exit_codes.hpp"
#include "hmc/record/merge.hpp"
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

int runShow(const RecordOptions& options) {
  const auto files = hmc::record::recordingFiles(options.directory);
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
  for (const auto& r : recordings) {
    fmt::print("# rank {}: {} pid {}, hmc {}, {} events{}\n", r.header.rank, r.header.host,
               r.header.pid, r.header.version, r.events.size(), r.ended ? "" : "; " + r.stop);
  }
  std::size_t rows = 0;
  for (const auto& r : recordings) rows = std::max(rows, r.events.size());
  if (options.limit) rows = std::min(rows, static_cast<std::size_t>(*options.limit));
  std::string head = "#     ";
  for (const auto& r : recordings)
    head += fit(fmt::format("rank {}", r.header.rank), options.width) + " ";
  fmt::print("{}\n", head);
  // The first row where the ranks' events differ (kind, module name or outcome).
  std::optional<std::size_t> divergence;
  for (std::size_t row = 0; row < rows && !divergence; ++row) {
    std::set<std::string> seen;
    for (const auto& r : recordings) {
      seen.insert(row < r.events.size() ? describe(r, r.events[row]) : std::string("(none)"));
    }
    if (seen.size() > 1) divergence = row;
  }
  for (std::size_t row = 0; row < rows; ++row) {
    std::string line = fmt::format("{}{:>5} ", divergence == row ? ">" : " ", row);
    for (const auto& r : recordings) {
      line +=
          fit(row < r.events.size() ? describe(r, r.events[row]) : std::string(), options.width) +
          " ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  if (divergence) {
    fmt::print("# the ranks first differ at event {} (marked >)\n", *divergence);
  } else {
    fmt::print("# every rank recorded the same events\n");
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
