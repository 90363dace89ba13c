#include "compare_command.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

extern "C" char** environ;

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

// The last `count` lines of a file (a failed run's standard error).
std::string tailOf(const std::string& path, std::size_t count) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (std::size_t k = lines.size() > count ? lines.size() - count : 0; k < lines.size(); ++k) {
    out += "\n  " + lines[k];
  }
  return out;
}

// Runs `argv` with standard output to /dev/null and standard error to `errPath`; the exit status
// (128 + signal when killed).
int runProgram(const std::vector<std::string>& argv, const std::string& errPath) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errPath.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    throw hmc::ValueError(
        fmt::format("--ab: cannot start '{}': {}", argv[0], std::strerror(error)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      throw hmc::ValueError(
          fmt::format("--ab: waiting for '{}': {}", argv[0], std::strerror(errno)));
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// A temporary folder, removed with its files when the A/B run ends.
struct TempFolder {
  std::string path;
  TempFolder() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/hmc-compare-ab-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      throw hmc::ValueError(fmt::format("--ab: cannot make a temporary folder {}: {}", pattern,
                                        std::strerror(errno)));
    }
    path = pattern;
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// --ab: the rounds of both programs, alternating; sample k of each side is round k (the median
// of that run's measured repetitions), kept only where both runs of the round have the metric.
void runRounds(const CompareOptions& options, SampleSet& baseline, SampleSet& current) {
  if (options.rounds < 2) throw hmc::ValueError("--rounds: at least 2 rounds are needed");
  if (options.roundRepetitions < 2) {
    throw hmc::ValueError(
        "--round-repetitions: at least 2 (hmc-run leaves the first out as warm-up)");
  }
  const TempFolder folder;
  const std::string& scenario = options.baselinePath;
  fmt::print(stderr,
             "# hmc-run compare --ab: {} rounds of {} and {} on {}, alternating (old first in "
             "even rounds, new first in odd ones), --repetitions {} each\n",
             options.rounds, options.ab[0], options.ab[1], scenario, options.roundRepetitions);
  for (std::size_t round = 0; round < options.rounds; ++round) {
    SampleSet sides[2];
    for (int turn = 0; turn < 2; ++turn) {
      const int side = round % 2 == 0 ? turn : 1 - turn;
      const std::string stem =
          fmt::format("{}/round{}-{}", folder.path, round, side ? "new" : "old");
      const std::vector<std::string> argv{
          options.ab[side], scenario,
          "--repetitions",  std::to_string(options.roundRepetitions),
          "--report",       stem + ".json"};
      const int code = runProgram(argv, stem + ".log");
      if (code != 0) {
        throw hmc::ValueError(fmt::format(
            "--ab: round {}: '{} {} --repetitions {}' ({}) exited {}; a scenario the gate times "
            "must pass. Its standard error ends:{}",
            round + 1, argv[0], scenario, options.roundRepetitions, side ? "new" : "old", code,
            tailOf(stem + ".log", 8)));
      }
      sides[side] = load(stem + ".json");
    }
    for (const auto& [name, series] : sides[0].series) {
      const auto other = sides[1].series.find(name);
      if (series.values.empty() || other == sides[1].series.end() || other->second.values.empty()) {
        continue;
      }
      baseline.series[name].values.push_back(hmc::compare::median(series.values));
      current.series[name].values.push_back(hmc::compare::median(other->second.values));
    }
    for (int side = 0; side < 2; ++side) {
      for (const auto& [key, text] : sides[side].leaks)
        (side ? current : baseline).leaks[key] = text;
    }
  }
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
      {"p_adjusted", m.adjustedPValue ? json(*m.adjustedPValue) : json()},
      {"gated", m.gated},
      {"change_estimate", m.changeEstimate ? json(*m.changeEstimate) : json()},
      {"change_interval",
       m.changeLow && m.changeHigh ? json::array({*m.changeLow, *m.changeHigh}) : json()},
      {"verdict", std::string(hmc::compare::toString(m.verdict))},
      {"regression", m.regression}};
  if (m.samplesNeeded) out["samples_needed"] = *m.samplesNeeded;
  if (!m.note.empty()) out["note"] = m.note;
  return out;
}

// How drift was handled and how the metrics make one verdict, in words (console and stderr).
std::string driftWords(const CompareOptions& options) {
  if (!options.ab.empty()) {
    return fmt::format(
        "drift control: A/B, {} rounds alternating the two programs, each round's pair read as "
        "one log ratio (paired Wilcoxon signed-rank test)",
        options.rounds);
  }
  return "drift control: none (two files written apart; unpaired Mann-Whitney U test; "
         "--ab alternates the builds)";
}

std::string gateWords(const Comparison& result) {
  const std::string which =
      result.gateGlob == "*" ? std::string("every metric") : "'" + result.gateGlob + "'";
  const std::string family = result.gatedCount == 1
                                 ? std::string("1 gated metric")
                                 : fmt::format("{} gated metrics", result.gatedCount);
  return fmt::format("gate: {} ({}); {}; other metrics are information", which, family,
                     result.gate.correction == hmc::compare::Correction::kHolm
                         ? "p adjusted by Holm's step-down over them"
                         : "each at alpha, no correction");
}

void printTable(std::FILE* to, const Comparison& result, const CompareOptions& options,
                const hmc::compare::Thresholds& thresholds) {
  fmt::print(to, "# hmc-run compare: {}; alpha {:g}, max regression {:g}%\n# {}\n# {}\n",
             options.ab.empty()
                 ? fmt::format("baseline {}, current {}", options.baselinePath, options.currentPath)
                 : fmt::format("baseline (old) {}, current (new) {}, scenario {}", options.ab[0],
                               options.ab[1], options.baselinePath),
             thresholds.alpha, thresholds.maxRegression * 100, driftWords(options),
             gateWords(result));
  std::size_t width = 6;
  for (const auto& m : result.metrics) width = std::max(width, m.name.size());
  fmt::print(to, "# {:<{}}  {:>8}  {:>12}  {:>12}  {:>8}  {:>17}  {:>7}  {:>7}  {}\n", "metric",
             width - 2, "samples", "baseline", "current", "change",
             fmt::format("{:g}% interval", (1 - thresholds.alpha) * 100), "p", "adj p", "verdict");
  for (const auto& m : result.metrics) {
    const std::string change = m.change ? fmt::format("{:+.1f}%", *m.change * 100) : "n/a";
    const std::string interval =
        m.changeLow && m.changeHigh
            ? fmt::format("[{:+.1f}%, {:+.1f}%]", *m.changeLow * 100, *m.changeHigh * 100)
            : "n/a";
    const std::string p = m.pValue ? fmt::format("{:.4f}", *m.pValue) : "n/a";
    const std::string adjusted = m.adjustedPValue ? fmt::format("{:.4f}", *m.adjustedPValue)
                                 : m.gated        ? "n/a"
                                                  : "info";
    std::string verdict(hmc::compare::toString(m.verdict));
    if (m.regression) verdict += " (regression)";
    if (!m.gated) verdict += " (information)";
    fmt::print(to, "{:<{}}  {:>8}  {:>12}  {:>12}  {:>8}  {:>17}  {:>7}  {:>7}  {}\n", m.name,
               width, fmt::format("{}/{}", m.baselineCount, m.currentCount),
               m.baselineCount ? formatSeconds(m.baselineMedian) : "n/a",
               m.currentCount ? formatSeconds(m.currentMedian) : "n/a", change, interval, p,
               adjusted, verdict);
  }
  // Notes of information metrics stay in the JSON: the gate's own are what a reader acts on.
  for (const auto& m : result.metrics) {
    if (!m.note.empty() && m.gated) fmt::print(to, "# {}: {}\n", m.name, m.note);
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
    if (m.verdict == Verdict::kInconclusive && m.gated) gate.inconclusive.push_back(m.name);
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

json driftControl(const CompareOptions& options) {
  if (options.ab.empty()) return json{{"method", "none"}};
  return json{{"method", "ab"},
              {"old", options.ab[0]},
              {"new", options.ab[1]},
              {"scenario", options.baselinePath},
              {"rounds", options.rounds},
              {"repetitions_per_run", options.roundRepetitions},
              {"order", "alternating: old then new in even rounds, new then old in odd ones"}};
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
            {{"file", options.ab.empty() ? options.baselinePath : options.ab[0]},
             {"kind", std::string(hmc::compare::toString(baseline.format))}}},
           {"current",
            {{"file", options.ab.empty() ? options.currentPath : options.ab[1]},
             {"kind", std::string(hmc::compare::toString(current.format))}}},
           {"alpha", thresholds.alpha},
           {"max_regression", thresholds.maxRegression},
           {"design", std::string(hmc::compare::toString(result.gate.design))},
           {"drift_control", driftControl(options)},
           {"correction", std::string(hmc::compare::toString(result.gate.correction))},
           {"gate", result.gateGlob},
           {"gated_metrics", result.gatedCount},
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

std::string holmNote(const Comparison& result) {
  return result.gate.correction == hmc::compare::Correction::kHolm && result.gatedCount > 1
             ? fmt::format(" (p Holm-adjusted over {} gated metrics)", result.gatedCount)
             : std::string();
}

// The verdict lines after the table (on `to`), or on standard error after JSON or Markdown; the
// undecided metrics always on standard error.
void printVerdicts(std::FILE* to, const CompareOptions& options,
                   const hmc::compare::Thresholds& thresholds, const Comparison& result,
                   const Gate& gate) {
  const auto& regressions = gate.regressions;
  const auto& undecided = gate.undecided;
  if (!regressions.empty()) {
    fmt::print(to, "# FAILED: {} slower by more than {:g}% with p < {:g}: {}{}\n",
               regressions.size() == 1 ? "1 metric" : fmt::format("{} metrics", regressions.size()),
               thresholds.maxRegression * 100, thresholds.alpha, joinNames(regressions),
               holmNote(result));
  }
  // Holm asks the smallest p of m gated metrics to reach alpha / m: with few samples the test
  // cannot get there, and the gate passes whatever happened. Say so rather than pass in silence.
  if (result.gate.correction == hmc::compare::Correction::kHolm && result.gatedCount > 1) {
    std::vector<std::string> powerless;
    double best = 1;
    for (const auto& m : result.metrics) {
      if (!m.gated || !m.adjustedPValue) continue;
      const double smallest = result.gate.design == hmc::compare::Design::kPaired
                                  ? hmc::compare::smallestPairedPValue(m.baselineCount)
                                  : hmc::compare::smallestPValue(m.baselineCount, m.currentCount);
      if (smallest * static_cast<double>(result.gatedCount) >= thresholds.alpha) {
        powerless.push_back(m.name);
        best = std::min(best, smallest);
      }
    }
    if (!powerless.empty()) {
      fmt::print(stderr,
                 "hmc-run compare: with Holm over {} gated metrics a metric needs p < {:g} / {} "
                 "= {:.4f} to fail, but these samples reach at best p = {:.4f}, so the gate "
                 "cannot fail on {}. Take more samples (--repetitions, --rounds) or gate fewer "
                 "metrics (--gate).\n",
                 result.gatedCount, thresholds.alpha, result.gatedCount,
                 thresholds.alpha / static_cast<double>(result.gatedCount), best,
                 joinNames(powerless));
    }
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
               "with p < {:g} ({} compared, {} gated{}){}\n",
               thresholds.maxRegression * 100, thresholds.alpha, result.metrics.size(),
               result.gatedCount,
               gate.inconclusive.empty()
                   ? std::string()
                   : fmt::format(", {} of them inconclusive", gate.inconclusive.size()),
               holmNote(result));
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
  sub->add_option("baseline", options.baselinePath,
                  "Baseline file (e.g. from main); with --ab, the scenario to run");
  sub->add_option("current", options.currentPath, "Current file (from the change); not with --ab");
  sub->add_option("--ab", options.ab,
                  "OLD_HMC_RUN NEW_HMC_RUN: run the scenario (the one positional argument) with "
                  "both programs in alternating rounds and compare the rounds paired (Wilcoxon "
                  "signed-rank of each round's log ratio), so machine drift cancels")
      ->expected(2)
      ->allow_extra_args(false);
  sub->add_option("--rounds", options.rounds,
                  "With --ab: rounds (one run of each program per round; at least 6 for p < "
                  "0.05, more for several gated metrics)")
      ->capture_default_str();
  sub->add_option("--round-repetitions", options.roundRepetitions,
                  "With --ab: hmc-run --repetitions of each run (the first is warm-up)")
      ->capture_default_str();
  sub->add_option("--gate", options.gateGlob,
                  "Metrics that can fail the gate (a glob; the others are information). "
                  "Default: the labelled cycles '*: repeat/*' when both reports have any, else "
                  "every metric ('*')");
  sub->add_option("--correction", options.correction,
                  "How the gated metrics' p-values are read together: holm (Holm's step-down: "
                  "at most alpha chance that any unchanged gated metric crosses) or none (each "
                  "at alpha)")
      ->check(CLI::IsMember({"holm", "none"}))
      ->capture_default_str();
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
  const bool ab = !options.ab.empty();
  if (ab ? options.baselinePath.empty() || !options.currentPath.empty()
         : options.baselinePath.empty() || options.currentPath.empty()) {
    fmt::print(stderr, "hmc-run compare: {}\n",
               ab ? "--ab OLD_HMC_RUN NEW_HMC_RUN takes one scenario file, e.g. hmc-run compare "
                    "--ab old/hmc-run new/hmc-run scenario.json"
                  : "give two files, BASELINE CURRENT (or --ab OLD_HMC_RUN NEW_HMC_RUN "
                    "SCENARIO)");
    return kExitBadInput;
  }
  hmc::compare::GateOptions gateOptions;
  gateOptions.correction = options.correction == "none" ? hmc::compare::Correction::kNone
                                                        : hmc::compare::Correction::kHolm;
  gateOptions.design = ab ? hmc::compare::Design::kPaired : hmc::compare::Design::kUnpaired;
  gateOptions.gateGlob = options.gateGlob;
  try {
    thresholds.alpha = options.alpha;
    thresholds.maxRegression = parsePercent(options.maxRegression);
    hmc::compare::validate(thresholds);
    if (ab) {
      runRounds(options, baseline, current);
    } else {
      baseline = load(options.baselinePath);
      current = load(options.currentPath);
    }
    result =
        hmc::compare::compareSets(baseline, current, thresholds, options.metricGlob, gateOptions);
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
