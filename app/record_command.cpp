#include "record_command.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "exit_codes.hpp"
#include "hmc/error.hpp"
#include "hmc/record/merge.hpp"
#include "hmc/record/show.hpp"
#include "hmc/render/html.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/text.hpp"

namespace {

using hmc::app::kExitUsage;

using hmc::record::Recording;

std::string fit(const std::string& text, int width) {
  const auto w = static_cast<std::size_t>(std::max(8, width));
  if (text.size() <= w) return text + std::string(w - text.size(), ' ');
  return text.substr(0, w - 3) + "...";
}

// The line a person reads first: where the ranks went wrong (the first divergence, or a call
// every rank failed before it), or that they never did.
void printVerdict(const nlohmann::json& document) {
  const auto& divergence = document["first_divergence"];
  const auto& failure = document["first_failure"];
  const std::string failed =
      failure.is_object()
          ? fmt::format("# every rank failed the same call at event {}: {}",
                        failure["event"].get<std::size_t>(),
                        hmc::printable(failure["summary"].get<std::string>()))
          : std::string();
  if (!failed.empty()) fmt::print("{}\n", failed);
  if (divergence.is_object()) {
    fmt::print("# the ranks first differ at event {}: {}\n", divergence["event"].get<std::size_t>(),
               hmc::printable(divergence["summary"].get<std::string>()));
  } else if (failed.empty()) {
    fmt::print("# every rank recorded the same {} events\n",
               document["total_rows"].get<std::size_t>());
  }
}

void printShow(const RecordOptions& options, const nlohmann::json& document) {
  printVerdict(document);
  for (const auto& r : document["ranks"]) {
    const std::string stop = r["stop"].get<std::string>();
    fmt::print("# rank {}: {} pid {}, hmc {}, {} events{}\n", r["rank"].get<int>(),
               hmc::printable(r["host"].get<std::string>()), r["pid"].get<long long>(),
               r["version"].get<std::string>(), r["events"].get<std::size_t>(),
               stop.empty() ? "" : "; " + stop);
  }
  std::string head = "#     ";
  for (const auto& r : document["ranks"]) {
    head += fit(fmt::format("rank {}", r["rank"].get<int>()), options.width) + " ";
  }
  while (!head.empty() && head.back() == ' ') head.pop_back();
  fmt::print("{}\n", head);
  const auto& divergence = document["divergence"];
  const auto& folds = document["folds"];
  std::size_t fold = 0;
  for (const auto& row : document["rows"]) {
    const auto index = row["event"].get<std::size_t>();
    // A folded range: its one line in place of its first row, nothing for the rest.
    while (fold < folds.size() && folds[fold]["last"].get<std::size_t>() < index) ++fold;
    if (fold < folds.size() && folds[fold]["first"].get<std::size_t>() <= index) {
      if (folds[fold]["first"].get<std::size_t>() == index) {
        fmt::print("# {}\n", folds[fold]["summary"].get<std::string>());
      }
      continue;
    }
    const bool marked = divergence.is_number() && divergence.get<std::size_t>() == index;
    std::string line = fmt::format("{}{:>5} ", marked ? ">" : " ", index);
    for (const auto& cell : row["cells"]) {
      line += fit(hmc::printable(cell.get<std::string>()), options.width) + " ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
  const std::size_t drawn = document["rows"].size();
  if (drawn < document["total_rows"].get<std::size_t>()) {
    fmt::print("# {} of {} rows shown (--limit)\n", drawn,
               document["total_rows"].get<std::size_t>());
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
  hmc::record::ShowOptions show;
  show.directory = options.directory;
  if (options.limit) show.limit = static_cast<std::size_t>(std::max(0, *options.limit));
  show.fold = !options.all;
  const nlohmann::json document = hmc::record::showDocument(recordings, show);
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
      "show",
      "Print the ranks' recorded events side by side: the first divergence named first, the "
      "events every rank repeats before it folded into one line");
  show->footer(
      "The first line names the first divergence: the event (rows are numbered from 0), what "
      "the differing ranks recorded and what the others did. The events before it on which "
      "every rank made the same call with the same successful outcome fold into one line "
      "(\"# events 0-120: every rank the same (121 events: 40 create, ...)\"); the 3 events "
      "before the divergence and everything from it on are shown in full, the divergence "
      "marked >. --all folds nothing.");
  show->add_option("directory", options.directory, "The recording folder")->required();
  show->add_option("--width", options.width, "Characters per rank column")
      ->check(CLI::Range(12, 200));
  show->add_option("--limit", options.limit, "At most this many rows")
      ->check(CLI::NonNegativeNumber);
  show->add_flag("--all", options.all,
                 "Show every row: fold nothing (the table, the page and the JSON's folds)");
  show->add_flag("--json", options.json,
                 "Print hmc-record-show/1 JSON instead of the table: every row, the first "
                 "divergence and the folded ranges (hmc-run render draws it)");
  show->add_option("--html", options.htmlPath,
                   "Also write one self-contained HTML page of the events side by side, the "
                   "agreeing rows folded, opening at the first divergence; - for standard output "
                   "(instead of the table)");
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
