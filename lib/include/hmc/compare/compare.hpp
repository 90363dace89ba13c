#pragma once
// Comparing two benchmark result files (hmc-run compare): timing samples read from hmc-run
// reports (hmc-report/1 or hmc-report-set/1, their "samples" section) or from Google Benchmark
// JSON (--benchmark_out), matched by name and judged by a two-sided Mann-Whitney U test.
//
// What one sample is:
// - hmc-run report: one value per measured repetition of a metric, the median of the values
//   that repetition recorded (every rank, every occurrence). Repetitions are separate runs,
//   so run-to-run noise is in the samples; values within one run are not independent and are
//   not counted as separate samples. The first `warmup` repetitions are left out.
// - Google Benchmark: one value per iteration row ("run_type": "iteration"; a
//   --benchmark_repetitions run has one per repetition), its real_time. Aggregate rows (mean,
//   median, stddev, cv) are ignored and rows with error_occurred are skipped.
// Values are in seconds.
//
// Pure functions, no torch, thread safe.

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::compare {

enum class SourceFormat { kReport, kGoogleBenchmark };

// The `kind` of a source in compare's JSON and its messages.
inline constexpr EnumName<SourceFormat> kSourceFormatNames[] = {
    {SourceFormat::kReport, "hmc-run report"},
    {SourceFormat::kGoogleBenchmark, "Google Benchmark JSON"}};
constexpr EnumTable<SourceFormat> enumTable(SourceFormat) {
  return {"source format", kSourceFormatNames};
}
inline std::string_view toString(SourceFormat format) noexcept { return enumName(format); }

struct Series {
  std::string unit = "s";
  std::vector<double> values;  // one per sample, in file order
};

struct SampleSet {
  SourceFormat format = SourceFormat::kReport;
  // Key: "<scenario>: <metric>" for reports, the benchmark name for Google Benchmark.
  std::map<std::string, Series> series;
  // Reports: the leaks across cycles their leak_trends found, "<scenario>: rank 2:
  // open_descriptors" (or "<scenario>: process: ..." for thread ranks) -> the verdict's text.
  std::map<std::string, std::string> leaks;
};

// Reads the samples of one parsed file. `source` names the file in error messages. Throws
// ValueError naming the file and what is wrong (unknown format, a report without "samples",
// a value that is not a number, a Google Benchmark file with only aggregate rows).
SampleSet samplesFromJson(const nlohmann::json& document, const std::string& source);

enum class Verdict { kFaster, kSlower, kSame, kUndecided, kInconclusive };

inline constexpr EnumName<Verdict> kVerdictNames[] = {{Verdict::kFaster, "faster"},
                                                      {Verdict::kSlower, "slower"},
                                                      {Verdict::kSame, "same"},
                                                      {Verdict::kUndecided, "undecided"},
                                                      {Verdict::kInconclusive, "inconclusive"}};
constexpr EnumTable<Verdict> enumTable(Verdict) { return {"verdict", kVerdictNames}; }
inline std::string_view toString(Verdict verdict) noexcept { return enumName(verdict); }

struct Thresholds {
  double alpha = 0.05;          // significance level of the U test, in (0, 1)
  double maxRegression = 0.10;  // a slower median by more than this (0.10: 10%) fails
};

// Throws ValueError unless 0 < alpha < 1 and 0 <= maxRegression.
void validate(const Thresholds& thresholds);

// How the gated metrics' p-values are read together. kHolm: Holm's step-down adjustment
// (statistics.hpp, holmAdjust) over the gated metrics that have a p-value, so that the chance
// that any unchanged gated metric reads as slower or faster is at most alpha; a metric's verdict
// uses its adjusted p. kNone: each metric at alpha on its own (with 9 metrics about 1 - 0.95^9
// = 37% of unchanged pairs have some metric significant).
enum class Correction { kHolm, kNone };

// The metrics of a labelled `repeat` step: what a scenario marks as the thing to time.
inline constexpr std::string_view kLabelledGlob = "*: repeat/*";
inline constexpr EnumName<Correction> kCorrectionNames[] = {{Correction::kHolm, "holm"},
                                                            {Correction::kNone, "none"}};
constexpr EnumTable<Correction> enumTable(Correction) { return {"correction", kCorrectionNames}; }
inline std::string_view toString(Correction correction) noexcept { return enumName(correction); }

// How the two sides' samples relate.
// kUnpaired: two independent sets (two files written at different times): Mann-Whitney U, the
//   change as the two-sample Hodges-Lehmann shift of the log values.
// kPaired: sample k of each side is one round of an A/B run (hmc-run compare --ab: the two
//   builds' runs alternate, so each round's pair saw the same machine): Wilcoxon's signed-rank
//   test of the rounds' log ratios log(current[k] / baseline[k]), the change as their one-sample
//   Hodges-Lehmann estimate (exp(estimate) - 1) with its signed-rank interval. A drift of the
//   machine that moves both runs of a round alike cancels in the ratio.
enum class Design { kUnpaired, kPaired };
inline constexpr EnumName<Design> kDesignNames[] = {{Design::kUnpaired, "unpaired"},
                                                    {Design::kPaired, "paired"}};
constexpr EnumTable<Design> enumTable(Design) { return {"design", kDesignNames}; }
inline std::string_view toString(Design design) noexcept { return enumName(design); }

struct GateOptions {
  Correction correction = Correction::kHolm;
  Design design = Design::kUnpaired;
  // The metrics that can fail the gate (a glob as for compareSets' metricGlob). The others are
  // compared and shown as information: never a regression, and left out of the correction.
  // Empty: the labelled cycles (kLabelledGlob) where two reports have any in common, else every
  // compared metric.
  std::string gateGlob;
};

struct MetricComparison {
  std::string name;
  std::string unit;
  std::size_t baselineCount = 0;
  std::size_t currentCount = 0;
  double baselineMedian = 0;
  double currentMedian = 0;
  std::optional<double> change;  // (current - baseline) / baseline; none when baseline is 0
  std::optional<double> pValue;  // none when a side has no samples
  bool exact = false;            // p from the exact distribution
  // The p-value the verdict used: Holm-adjusted over the gated metrics (GateOptions), else
  // pValue. None where pValue is none or the metric is not gated.
  std::optional<double> adjustedPValue;
  bool gated = true;  // false: information only (GateOptions::gateGlob), never a regression
  Verdict verdict = Verdict::kUndecided;
  // verdict kSlower and change > maxRegression: this metric fails the gate.
  bool regression = false;
  // The relative change as the Hodges-Lehmann shift of the log values (exp(shift) - 1), and
  // its rank-based interval at 1 - alpha (statistics.hpp, shiftInterval); on the values
  // themselves, relative to the baseline median, when a value is not > 0. None when undecided.
  std::optional<double> changeEstimate;
  std::optional<double> changeLow;
  std::optional<double> changeHigh;
  // Inconclusive: about how many samples per side would decide it at the spread observed (the
  // interval's width falls as 1 / sqrt(n)); none when no number would.
  std::optional<std::size_t> samplesNeeded;
  // Why the verdict is kUndecided (too few samples: says the minimum) or kInconclusive (the
  // interval and what would decide it), else empty.
  std::string note;
};

// Faster / slower: p < alpha, the direction of the medians. Same: p >= alpha and the change's
// 1 - alpha interval lies within +/- maxRegression. Inconclusive: p >= alpha but the interval
// reaches past that (not significant is not the same: with 5 samples a side the test cannot
// see a 24% change). Undecided: too few samples for the test to reach p < alpha (see
// minimumSamplesPerSide).
MetricComparison compareSeries(const std::string& name, const Series& baseline,
                               const Series& current, const Thresholds& thresholds);

// The same verdicts for paired samples (Design::kPaired): `change` is the paired estimate.
// Throws ValueError unless both sides have the same number of samples.
MetricComparison comparePairedSeries(const std::string& name, const Series& baseline,
                                     const Series& current, const Thresholds& thresholds);

struct Comparison {
  std::vector<MetricComparison> metrics;  // the names both sides have, in name order
  std::vector<std::string> onlyBaseline;
  std::vector<std::string> onlyCurrent;
  // Geometric mean of current / baseline medians over the metrics with both medians > 0.
  std::optional<double> geometricMeanRatio;
  bool regression = false;  // any metric's regression, or a new leak across cycles
  GateOptions gate;         // how the verdicts were reached
  std::string gateGlob;     // the gate glob used ("*" for every metric)
  std::size_t gatedCount = 0;  // gated metrics with a p-value (the correction's family size)
  // Leaks across cycles (reports' leak_trends), as "<key>: <text>": in the current file only
  // (each a regression), in both, in the baseline only (gone).
  std::vector<std::string> newLeaks;
  std::vector<std::string> keptLeaks;
  std::vector<std::string> goneLeaks;
};

// Matches the series by name. `metricGlob` keeps only names that match it (shell-style `*`
// and `?`; empty keeps all). Each metric is compared (compareSeries, or comparePairedSeries
// under Design::kPaired), then the gated ones' p-values are corrected together (GateOptions)
// and their verdicts taken at the corrected p. Throws ValueError when the formats differ.
Comparison compareSets(const SampleSet& baseline, const SampleSet& current,
                       const Thresholds& thresholds, const std::string& metricGlob = "",
                       const GateOptions& gate = {});

// Shell-style match of the whole text: `*` any run of characters, `?` one character.
bool globMatch(std::string_view pattern, std::string_view text);

}  // namespace hmc::compare
