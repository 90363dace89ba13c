#include "compare_command.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hmc/compare/compare.hpp"
#include "hmc/compare/statistics.hpp"
#include "hmc/error.hpp"
#include "hmc/render/html.hpp"
#include "hmc/render/markdown.hpp"
#include "hmc/scenario/output_file.hpp"

namespace {

using hmc::compare::Comparison;
using hmc::compare::MetricComparison;
using hmc::compare::SampleSet;
using hmc::compare::Verdict;
using nlohmann::json;

constexpr int kExitRegression = 1;
constexpr int kExitBadInput = 2;

// "10%", "10", "2.5%" -> 0.10, 0.10, 0.025.
double parsePercent(const std::string& text) {
  std::string number = text;
  if (!number.empty() && number.back() == '%') number.pop_back();
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (number.empty() || used != number.size() || !std::isfinite(value) || value < 0) {
    throw hmc::ValueError(fmt::format(
        "--max-regression: expected a percentage >= 0 such as 10% or 2.5, got '{}'", text));
  }
  return value / 100.0;
}

SampleSet load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw hmc::ValueError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  json document;
  try {
    document = json::parse(text.str());
  } catch (const json::parse_error& error) {
    throw hmc::ValueError(fmt::format("{}: not valid JSON: {}", path, error.what()));
  }
  return hmc::compare::samplesFromJson(document, path);
}

// Seconds in a readable unit: "312.4 us".
std::string formatSeconds(double seconds) {
  const double magnitude = std::fabs(seconds);
  if (magnitude == 0) return "0 s";
  if (magnitude < 1e-6) return fmt::format("{:.1f} ns", seconds * 1e9);
  if (magnitude < 1e-3) return fmt::format("{:.1f} us", seconds * 1e6);
  if (magnitude < 1) return fmt::format("{:.2f} ms", seconds * 1e3);
  return fmt::format("{:.3f} s", seconds);
}

std::string joinNames(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

std::vector<std::string> namesOf(const SampleSet& set) {
  std::vector<std::string> names;
  for (const auto& entry : set.series) names.push_back(entry.first);
  return names;
}

// One metric of hmc-compare/1, with both sides' samples (`values`) for pictures.
json toJson(const MetricComparison& m, const SampleSet& baseline, const SampleSet& current) {
  auto valuesOf = [&](const SampleSet& set) {
    const auto it = set.series.find(m.name);
    return it == set.series.end() ? json::array() : json(it->second.values);
  };
  json out{
      {"name", m.name},
      {"unit", m.unit},
      {"baseline",
       {{"samples", m.baselineCount},
        {"median", m.baselineMedian},
        {"values", valuesOf(baseline)}}},
      {"current",
       {{"samples", m.currentCount}, {"median", m.currentMedian}, {"values", valuesOf(current)}}},
      {"change", m.change ? json(*m.change) : json()},
      {"p_value", m.pValue ? json(*m.pValue) : json()},
      {"exact", m.exact},
      {"change_estimate", m.changeEstimate ? json(*m.changeEstimate) : json()},
      {"change_interval",
       m.changeLow && m.changeHigh ? json::array({*m.changeLow, *m.changeHigh}) : json()},
      {"verdict", std::string(hmc::compare::toString(m.verdict))},
      {"regression", m.regression}};
  if (m.samplesNeeded) out["samples_needed"] = *m.samplesNeeded;
  if (!m.note.empty()) out["note"] = m.note;
  return out;
}

void printTable(std::FILE* to, const Comparison& result, const CompareOptions& options,
                const hmc::compare::Thresholds& thresholds) {
  fmt::print(to,
             "# hmc-run compare: baseline {}, current {}; two-sided Mann-Whitney U, alpha {:g}, "
             "max regression {:g}%\n",
             options.baselinePath, options.currentPath, thresholds.alpha,
             thresholds.maxRegression * 100);
  std::size_t width = 6;
  for (const auto& m : result.metrics) width = std::max(width, m.name.size());
  fmt::print(to, "# {:<{}}  {:>8}  {:>12}  {:>12}  {:>8}  {:>17}  {:>7}  {}\n", "metric",
             width - 2, "samples", "baseline", "current", "change",
             fmt::format("{:g}% interval", (1 - thresholds.alpha) * 100), "p", "verdict");
  for (const auto& m : result.metrics) {
    const std::string change = m.change ? fmt::format("{:+.1f}%", *m.change * 100) : "n/a";
    const std::string interval =
        m.changeLow && m.changeHigh
            ? fmt::format("[{:+.1f}%, {:+.1f}%]", *m.changeLow * 100, *m.changeHigh * 100)
            : "n/a";
    const std::string p = m.pValue ? fmt::format("{:.4f}", *m.pValue) : "n/a";
    std::string verdict(hmc::compare::toString(m.verdict));
    if (m.regression) verdict += " (regression)";
    fmt::print(to, "{:<{}}  {:>8}  {:>12}  {:>12}  {:>8}  {:>17}  {:>7}  {}\n", m.name, width,
               fmt::format("{}/{}", m.baselineCount, m.currentCount),
               m.baselineCount ? formatSeconds(m.baselineMedian) : "n/a",
               m.currentCount ? formatSeconds(m.currentMedian) : "n/a", change, interval, p,
               verdict);
  }
  for (const auto& m : result.metrics) {
    if (!m.note.empty()) fmt::print(to, "# {}: {}\n", m.name, m.note);
  }
  if (result.geometricMeanRatio) {
    fmt::print(
        to, "# geometric mean of current/baseline medians: {:.4f} ({:+.1f}%) over {} metrics\n",
        *result.geometricMeanRatio, (*result.geometricMeanRatio - 1) * 100, result.metrics.size());
  }
  if (!result.onlyBaseline.empty()) {
    fmt::print(to, "# only in the baseline (not compared): {}\n", joinNames(result.onlyBaseline));
  }
  if (!result.onlyCurrent.empty()) {
    fmt::print(to, "# only in the current file (not compared): {}\n",
               joinNames(result.onlyCurrent));
  }
  for (const auto& leak : result.newLeaks) {
    fmt::print(to, "# leak across cycles, new in the current file (regression): {}\n", leak);
  }
  for (const auto& leak : result.keptLeaks) {
    fmt::print(to, "# leak across cycles, in both files: {}\n", leak);
  }
  for (const auto& leak : result.goneLeaks) {
    fmt::print(to, "# leak across cycles, gone (only in the baseline): {}\n", leak);
  }
}

// The gate: which metrics regressed, which cannot be decided, and the exit code.
struct Gate {
  std::vector<std::string> regressions;
  std::vector<std::string> undecided;
  std::vector<std::string> inconclusive;
  bool strict = false;
  int code = 0;
};

Gate gateOf(const Comparison& result, bool strict) {
  Gate gate;
  gate.strict = strict;
  for (const auto& m : result.metrics) {
    if (m.regression) gate.regressions.push_back(m.name);
    if (m.verdict == Verdict::kUndecided) gate.undecided.push_back(m.name);
    if (m.verdict == Verdict::kInconclusive) gate.inconclusive.push_back(m.name);
  }
  // A regression found is a result; metrics that cannot be decided make the gate unusable.
  // Inconclusive ones pass (the test saw no regression) unless --strict asks them to fail.
  const bool failed = !gate.regressions.empty() || !result.newLeaks.empty() ||
                      (strict && !gate.inconclusive.empty());
  gate.code = failed ? kExitRegression : !gate.undecided.empty() ? kExitBadInput : 0;
  return gate;
}

// No metric of the two files matches: say what each has (under --metric, what matches it).
void sayNothingInCommon(const CompareOptions& options, const SampleSet& baseline,
                        const SampleSet& current) {
  auto selected = [&](std::vector<std::string> names) {
    if (options.metricGlob.empty()) return names;
    std::vector<std::string> kept;
    for (auto& name : names) {
      if (hmc::compare::globMatch(options.metricGlob, name)) kept.push_back(name);
    }
    return kept;
  };
  fmt::print(stderr,
             "hmc-run compare: no metric in common{}.\n  {} has: {}\n  {} has: {}\n"
             "Compare files of the same scenarios or benchmarks{}.\n",
             options.metricGlob.empty() ? "" : " matching '" + options.metricGlob + "'",
             options.baselinePath, joinNames(selected(namesOf(baseline))), options.currentPath,
             joinNames(selected(namesOf(current))),
             options.metricGlob.empty() ? "" : ", or change --metric");
}

// The hmc-compare/1 document (--format json, and what the HTML and Markdown pages draw).
json comparisonDocument(const CompareOptions& options, const hmc::compare::Thresholds& thresholds,
                        const Comparison& result, const SampleSet& baseline,
                        const SampleSet& current, const Gate& gate) {
  const auto& regressions = gate.regressions;
  const auto& undecided = gate.undecided;
  const int code = gate.code;
  json out{{"format", "hmc-compare/1"},
           {"baseline",
            {{"file", options.baselinePath},
             {"kind", std::string(hmc::compare::toString(baseline.format))}}},
           {"current",
            {{"file", options.currentPath},
             {"kind", std::string(hmc::compare::toString(current.format))}}},
           {"alpha", thresholds.alpha},
           {"max_regression", thresholds.maxRegression},
           {"metrics", json::array()},
           {"only_baseline", result.onlyBaseline},
           {"only_current", result.onlyCurrent},
           {"geometric_mean_ratio",
            result.geometricMeanRatio ? json(*result.geometricMeanRatio) : json()},
           {"regressions", regressions},
           {"undecided", undecided},
           {"inconclusive", gate.inconclusive},
           {"strict", gate.strict},
           {"leak_trends",
            {{"new", result.newLeaks}, {"both", result.keptLeaks}, {"gone", result.goneLeaks}}},
           {"exit_code", code}};
  for (const auto& m : result.metrics) out["metrics"].push_back(toJson(m, baseline, current));
  return out;
}

// The verdict lines after the table (on `to`), or on standard error after JSON or Markdown; the
// undecided metrics always on standard error.
void printVerdicts(std::FILE* to, const CompareOptions& options,
                   const hmc::compare::Thresholds& thresholds, const Comparison& result,
                   const Gate& gate) {
  const auto& regressions = gate.regressions;
  const auto& undecided = gate.undecided;
  if (!regressions.empty()) {
    fmt::print(to, "# FAILED: {} slower by more than {:g}% with p < {:g}: {}\n",
               regressions.size() == 1 ? "1 metric" : fmt::format("{} metrics", regressions.size()),
               thresholds.maxRegression * 100, thresholds.alpha, joinNames(regressions));
  }
  if (!undecided.empty()) {
    fmt::print(stderr,
               "hmc-run compare: too few samples to decide {}: at least {} per side are needed "
               "for p < {:g}. Run hmc-run with --repetitions N (N - warm-up >= {}), or "
               "--benchmark_repetitions; or leave these metrics out with --metric.\n",
               joinNames(undecided), hmc::compare::minimumSamplesPerSide(thresholds.alpha),
               thresholds.alpha, hmc::compare::minimumSamplesPerSide(thresholds.alpha));
  }
  if (!gate.inconclusive.empty()) {
    fmt::print(to,
               "# {}: {} not significant, but not shown within +/-{:g}% either (the change's "
               "{:g}% interval reaches past it): {}{}\n",
               gate.strict ? "FAILED (--strict)" : "INCONCLUSIVE",
               gate.inconclusive.size() == 1
                   ? std::string("1 metric")
                   : fmt::format("{} metrics", gate.inconclusive.size()),
               thresholds.maxRegression * 100, (1 - thresholds.alpha) * 100,
               joinNames(gate.inconclusive),
               gate.strict ? "" : "; they pass (--strict fails them); their notes say how many "
                                  "samples would decide them");
  }
  if (!result.newLeaks.empty()) {
    fmt::print(
        to, "# FAILED: {} across cycles new in {}\n",
        result.newLeaks.size() == 1 ? "1 leak" : fmt::format("{} leaks", result.newLeaks.size()),
        options.currentPath);
  }
  if (gate.code == 0) {
    fmt::print(to,
               "# OK: no metric slower by more than {:g}% "
               "with p < {:g} ({} compared{})\n",
               thresholds.maxRegression * 100, thresholds.alpha, result.metrics.size(),
               gate.inconclusive.empty()
                   ? std::string()
                   : fmt::format(", {} of them inconclusive", gate.inconclusive.size()));
  }
}

}  // namespace

CLI::App* addCompareCommand(CLI::App& app, CompareOptions& options) {
  auto* sub = app.add_subcommand(
      "compare",
      "Compare two hmc-run reports (with samples) or two Google Benchmark JSON files: median, "
      "change with its Hodges-Lehmann interval and a two-sided Mann-Whitney U test per metric. "
      "Exit 1 when a metric is slower by more than --max-regression with p < --alpha (with "
      "--strict, or inconclusive), 2 on bad input");
  sub->add_option("baseline", options.baselinePath, "Baseline file (e.g. from main)")->required();
  sub->add_option("current", options.currentPath, "Current file (from the change)")->required();
  sub->add_flag("--json", options.json,
                "Print hmc-compare/1 JSON instead of the table (the same as --format json)");
  sub->add_option("--format", options.format,
                  "What to print: table, json (hmc-compare/1) or markdown (a GitHub job-summary "
                  "table: metric, baseline, candidate, change, p, verdict, and the overall "
                  "verdict; e.g. >> $GITHUB_STEP_SUMMARY)")
      ->check(CLI::IsMember({"table", "json", "markdown"}))
      ->capture_default_str();
  sub->add_option("--html", options.htmlPath,
                  "Also write one self-contained HTML page drawing baseline against candidate "
                  "per metric with the verdict; - for standard output (what is printed then "
                  "goes to standard error)");
  sub->add_option("--max-regression", options.maxRegression,
                  "Largest slowdown of a median that passes, in percent, e.g. 10% or 2.5")
      ->capture_default_str();
  sub->add_option("--alpha", options.alpha, "Significance level of the U test, in (0, 1)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_flag("--strict", options.strict,
                "Fail (exit 1) on an inconclusive metric too: not significant, but its "
                "change's 1 - alpha interval reaches past +/- --max-regression");
  sub->add_option("--metric", options.metricGlob,
                  "Compare only metrics whose name matches this glob ('*', '?'), e.g. "
                  "'quickstart: repeat/*' or 'BM_Threads*'");
  sub->footer(
      "Report metrics are named '<scenario>: <metric>'; one sample per measured repetition "
      "(run hmc-run with --repetitions N: at least 4 per side for alpha 0.05). Google "
      "Benchmark: one sample per iteration row (--benchmark_repetitions N).");
  return sub;
}

int runCompare(const CompareOptions& options) {
  hmc::compare::Thresholds thresholds;
  Comparison result;
  SampleSet baseline;
  SampleSet current;
  if (options.json && options.format != "table" && options.format != "json") {
    fmt::print(stderr, "hmc-run compare: --json and --format {} ask for two outputs: give one\n",
               options.format);
    return kExitBadInput;
  }
  const std::string format = options.json ? "json" : options.format;
  // Checked before reading anything, as a run checks --report.
  if (options.htmlPath) {
    const std::string problem = hmc::scenario::checkOutputPath(*options.htmlPath);
    if (!problem.empty()) {
      fmt::print(stderr, "hmc-run compare: {}\n", problem);
      return kExitBadInput;
    }
  }
  // With --html - the page is standard output; what would be printed goes to standard error.
  std::FILE* const text = options.htmlPath && *options.htmlPath == "-" ? stderr : stdout;
  try {
    thresholds.alpha = options.alpha;
    thresholds.maxRegression = parsePercent(options.maxRegression);
    hmc::compare::validate(thresholds);
    baseline = load(options.baselinePath);
    current = load(options.currentPath);
    result = hmc::compare::compareSets(baseline, current, thresholds, options.metricGlob);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run compare: {}\n", error.what());
    return kExitBadInput;
  }
  if (result.metrics.empty()) {
    sayNothingInCommon(options, baseline, current);
    return kExitBadInput;
  }
  const Gate gate = gateOf(result, options.strict);
  const json out = comparisonDocument(options, thresholds, result, baseline, current, gate);
  if (options.htmlPath) {
    try {
      hmc::scenario::writeOutputFile(*options.htmlPath, hmc::render::renderHtmlCompare(out));
    } catch (const hmc::Error& error) {
      fmt::print(stderr, "hmc-run compare: {}\n", error.what());
      return kExitBadInput;
    }
  }
  // The table carries its own verdict line on the same stream; JSON and Markdown say it on
  // standard error (Markdown has it in its last line too).
  const bool table = format == "table";
  if (format == "json") {
    fmt::print(text, "{}\n", out.dump(2));
  } else if (format == "markdown") {
    fmt::print(text, "{}", hmc::render::renderMarkdownCompare(out));
  } else {
    printTable(text, result, options, thresholds);
  }
  std::fflush(text);

  printVerdicts(table ? text : stderr, options, thresholds, result, gate);
  return gate.code;
}
