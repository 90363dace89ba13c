#include "hmc/compare/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "hmc/compare/statistics.hpp"
#include "hmc/error.hpp"

namespace hmc::compare {
namespace {

using nlohmann::json;

double toSeconds(double value, const std::string& unit, const std::string& where) {
  if (unit == "s") return value;
  if (unit == "ms") return value * 1e-3;
  if (unit == "us") return value * 1e-6;
  if (unit == "ns") return value * 1e-9;
  throw ValueError(
      fmt::format("{}: unknown time unit '{}' (expected s, ms, us or ns)", where, unit));
}

double numberAt(const json& value, const std::string& where) {
  if (!value.is_number()) {
    throw ValueError(fmt::format("{}: expected a number, got {}", where, value.dump()));
  }
  const double number = value.get<double>();
  if (!std::isfinite(number)) throw ValueError(fmt::format("{}: not a finite number", where));
  return number;
}

void addReport(const json& report, const std::string& where, SampleSet& out) {
  if (!report.is_object() || report.value("format", "") != "hmc-report/1") {
    throw ValueError(fmt::format("{}: expected an hmc-report/1 object", where));
  }
  const std::string scenario = report.value("scenario", "");
  if (scenario.empty()) throw ValueError(fmt::format("{}: the report has no \"scenario\"", where));
  const auto samples = report.find("samples");
  if (samples == report.end() || !samples->is_object()) {
    throw ValueError(fmt::format(
        "{}: the report of scenario '{}' has no \"samples\" section; write it with an hmc-run "
        "that records samples (docs/scenario-extensions.md, \"Samples and compare\")",
        where, scenario));
  }
  if (const auto trends = report.find("leak_trends");
      trends != report.end() && trends->is_object() && trends->contains("series")) {
    for (const json& series : trends->at("series")) {
      if (!series.is_object() || series.value("verdict", "") != "leak") continue;
      const json& rank = series.value("rank", json());
      const std::string who =
          rank.is_number_integer() ? fmt::format("rank {}", rank.get<long long>()) : "process";
      out.leaks[fmt::format("{}: {}: {}", scenario, who, series.value("metric", "?"))] =
          series.value("text", "");
    }
  }
  const std::string at = where + "/samples";
  const auto warmupValue = samples->value("warmup", json(0));
  if (!warmupValue.is_number_integer() || warmupValue.get<long long>() < 0) {
    throw ValueError(fmt::format("{}/warmup: expected an integer >= 0", at));
  }
  const auto warmup = static_cast<std::size_t>(warmupValue.get<long long>());
  const auto metrics = samples->find("metrics");
  if (metrics == samples->end() || !metrics->is_object()) {
    throw ValueError(fmt::format("{}: expected an object \"metrics\"", at));
  }
  for (const auto& [metric, entry] : metrics->items()) {
    const std::string mat = fmt::format("{}/metrics/{}", at, metric);
    const std::string unit = entry.value("unit", "s");
    const auto perRepetition = entry.find("per_repetition");
    if (perRepetition == entry.end() || !perRepetition->is_array()) {
      throw ValueError(fmt::format("{}: expected an array \"per_repetition\"", mat));
    }
    Series series;
    for (std::size_t rep = warmup; rep < perRepetition->size(); ++rep) {
      const json& values = (*perRepetition)[rep];
      const std::string rat = fmt::format("{}/per_repetition/{}", mat, rep);
      if (!values.is_array()) throw ValueError(fmt::format("{}: expected an array", rat));
      if (values.empty()) continue;  // the metric did not occur in this repetition
      std::vector<double> seconds;
      seconds.reserve(values.size());
      for (std::size_t k = 0; k < values.size(); ++k) {
        const std::string vat = fmt::format("{}/{}", rat, k);
        seconds.push_back(toSeconds(numberAt(values[k], vat), unit, vat));
      }
      series.values.push_back(median(std::move(seconds)));
    }
    out.series[fmt::format("{}: {}", scenario, metric)] = std::move(series);
  }
}

void addGoogleBenchmark(const json& document, const std::string& source, SampleSet& out) {
  const json& rows = document.at("benchmarks");
  if (!rows.is_array()) throw ValueError(fmt::format("{}/benchmarks: expected an array", source));
  std::size_t aggregates = 0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const json& row = rows[k];
    const std::string where = fmt::format("{}/benchmarks/{}", source, k);
    if (!row.is_object() || !row.contains("name") || !row["name"].is_string()) {
      throw ValueError(fmt::format("{}: expected an object with a \"name\"", where));
    }
    if (row.value("run_type", "iteration") == "aggregate") {
      ++aggregates;
      continue;
    }
    if (row.value("error_occurred", false)) continue;
    const std::string unit = row.value("time_unit", "ns");
    const double seconds = toSeconds(numberAt(row.value("real_time", json()), where + "/real_time"),
                                     unit, where + "/time_unit");
    out.series[row["name"].get<std::string>()].values.push_back(seconds);
  }
  if (out.series.empty() && aggregates > 0) {
    throw ValueError(fmt::format(
        "{}: only aggregate rows (mean, median, ...), no iteration rows to test; write it with "
        "--benchmark_repetitions=N without --benchmark_report_aggregates_only (use "
        "--benchmark_display_aggregates_only to keep the console short)",
        source));
  }
}

// The relative change's estimate and interval (MetricComparison::changeEstimate).
void changeOf(const std::vector<double>& baseline, const std::vector<double>& current,
              double baselineMedian, double alpha, MetricComparison& out) {
  const auto positive = [](const std::vector<double>& values) {
    return std::all_of(values.begin(), values.end(), [](double v) { return v > 0; });
  };
  if (positive(baseline) && positive(current)) {
    std::vector<double> logBaseline;
    std::vector<double> logCurrent;
    for (double v : baseline) logBaseline.push_back(std::log(v));
    for (double v : current) logCurrent.push_back(std::log(v));
    const ShiftInterval shift = shiftInterval(logBaseline, logCurrent, 1 - alpha);
    out.changeEstimate = std::expm1(shift.shift);
    if (shift.bounded()) {
      out.changeLow = std::expm1(shift.lower);
      out.changeHigh = std::expm1(shift.upper);
    }
    return;
  }
  if (baselineMedian == 0) return;
  const ShiftInterval shift = shiftInterval(baseline, current, 1 - alpha);
  const double scale = std::abs(baselineMedian);
  out.changeEstimate = shift.shift / scale;
  if (shift.bounded()) {
    out.changeLow = shift.lower / scale;
    out.changeHigh = shift.upper / scale;
  }
}

// An inconclusive metric's note, and the samples per side that would decide it at this spread:
// the interval's half-width falls as 1 / sqrt(n); "same" needs it within the margin left by the
// estimate, "slower" or "faster" needs it short of zero.
void decideInconclusive(MetricComparison& out, std::size_t samples,
                        const Thresholds& thresholds) {
  const double m = thresholds.maxRegression;
  const double level = (1 - thresholds.alpha) * 100;
  if (!out.changeLow || !out.changeHigh || !out.changeEstimate) {
    out.note = fmt::format("not significant (p >= {:g}), and the change has no {:g}% interval",
                           thresholds.alpha, level);
    return;
  }
  const double estimate = *out.changeEstimate;
  const double half = (*out.changeHigh - *out.changeLow) / 2;
  const double target = std::abs(estimate) < m ? m - std::abs(estimate) : std::abs(estimate);
  std::string decide = "more samples would not decide it at this spread";
  if (target > 0 && half > 0) {
    const double needed =
        std::ceil(static_cast<double>(samples) * (half / target) * (half / target));
    if (needed < 1e6) {
      out.samplesNeeded = std::max(samples + 1, static_cast<std::size_t>(needed));
      decide = fmt::format("about {} samples per side would decide it at this spread",
                           *out.samplesNeeded);
    }
  }
  out.note = fmt::format(
      "not significant (p >= {:g}) but not shown the same: the change's {:g}% interval "
      "[{:+.1f}%, {:+.1f}%] reaches past +/-{:g}%; {}",
      thresholds.alpha, level, *out.changeLow * 100, *out.changeHigh * 100, m * 100, decide);
}

}  // namespace

SampleSet samplesFromJson(const nlohmann::json& document, const std::string& source) {
  SampleSet out;
  if (!document.is_object()) {
    throw ValueError(
        fmt::format("{}: expected a JSON object (an hmc-run report or Google "
                    "Benchmark --benchmark_out JSON)",
                    source));
  }
  const std::string format = document.value("format", "");
  if (format == "hmc-report/1") {
    addReport(document, source, out);
  } else if (format == "hmc-report-set/1") {
    const auto reports = document.find("reports");
    if (reports == document.end() || !reports->is_array()) {
      throw ValueError(fmt::format("{}: expected an array \"reports\"", source));
    }
    for (std::size_t k = 0; k < reports->size(); ++k) {
      addReport((*reports)[k], fmt::format("{}/reports/{}", source, k), out);
    }
  } else if (document.contains("benchmarks")) {
    out.format = SourceFormat::kGoogleBenchmark;
    addGoogleBenchmark(document, source, out);
  } else {
    throw ValueError(fmt::format(
        "{}: unknown format{}; expected an hmc-run report (\"format\": \"hmc-report/1\" or "
        "\"hmc-report-set/1\") or Google Benchmark JSON (a \"benchmarks\" array)",
        source, format.empty() ? std::string() : " '" + format + "'"));
  }
  return out;
}

void validate(const Thresholds& thresholds) {
  if (!(thresholds.alpha > 0 && thresholds.alpha < 1)) {
    throw ValueError(fmt::format("alpha must be in (0, 1), got {}", thresholds.alpha));
  }
  if (!(thresholds.maxRegression >= 0) || !std::isfinite(thresholds.maxRegression)) {
    throw ValueError(
        fmt::format("the maximum regression must be >= 0, got {}", thresholds.maxRegression));
  }
}

namespace {

// The verdict at p-value `p` (the raw or the corrected one), with the interval already set.
void decide(MetricComparison& out, double p, const Thresholds& thresholds, bool paired) {
  out.regression = false;
  out.samplesNeeded.reset();
  out.note.clear();
  const bool noMove = paired ? (!out.changeEstimate || *out.changeEstimate == 0)
                             : out.currentMedian == out.baselineMedian;
  if (p >= thresholds.alpha || noMove) {
    const double m = thresholds.maxRegression;
    if (out.changeLow && out.changeHigh && *out.changeLow >= -m && *out.changeHigh <= m) {
      out.verdict = Verdict::kSame;
      return;
    }
    out.verdict = Verdict::kInconclusive;
    decideInconclusive(out, std::min(out.baselineCount, out.currentCount), thresholds);
    return;
  }
  const bool slower = paired ? *out.changeEstimate > 0 : out.currentMedian > out.baselineMedian;
  out.verdict = slower ? Verdict::kSlower : Verdict::kFaster;
  // A zero baseline median that got slower is an unbounded regression.
  out.regression =
      out.verdict == Verdict::kSlower && (!out.change || *out.change > thresholds.maxRegression);
}

// Common start: counts, medians; false (with the note) when a side is empty.
bool describeSides(MetricComparison& out, const std::string& name, const Series& baseline,
                   const Series& current) {
  out.name = name;
  out.unit = "s";
  out.baselineCount = baseline.values.size();
  out.currentCount = current.values.size();
  if (out.baselineCount == 0 || out.currentCount == 0) {
    out.note =
        fmt::format("no samples on the {} side", out.baselineCount == 0 ? "baseline" : "current");
    return false;
  }
  out.baselineMedian = median(baseline.values);
  out.currentMedian = median(current.values);
  return true;
}

}  // namespace

MetricComparison compareSeries(const std::string& name, const Series& baseline,
                               const Series& current, const Thresholds& thresholds) {
  validate(thresholds);
  MetricComparison out;
  if (!describeSides(out, name, baseline, current)) return out;
  if (out.baselineMedian != 0) {
    out.change = (out.currentMedian - out.baselineMedian) / out.baselineMedian;
  }
  const UTestResult test = mannWhitneyU(baseline.values, current.values);
  out.pValue = test.pValue;
  out.exact = test.exact;
  if (smallestPValue(out.baselineCount, out.currentCount) >= thresholds.alpha) {
    out.note = fmt::format(
        "too few samples to decide: {} baseline, {} current; the U test cannot reach p < {:g} "
        "with fewer than {} samples per side (run more repetitions)",
        out.baselineCount, out.currentCount, thresholds.alpha,
        minimumSamplesPerSide(thresholds.alpha));
    return out;
  }
  changeOf(baseline.values, current.values, out.baselineMedian, thresholds.alpha, out);
  decide(out, test.pValue, thresholds, false);
  return out;
}

MetricComparison comparePairedSeries(const std::string& name, const Series& baseline,
                                     const Series& current, const Thresholds& thresholds) {
  validate(thresholds);
  if (baseline.values.size() != current.values.size()) {
    throw ValueError(
        fmt::format("{}: paired samples need as many on each side, got {} baseline and {} current",
                    name, baseline.values.size(), current.values.size()));
  }
  MetricComparison out;
  if (!describeSides(out, name, baseline, current)) return out;
  const auto positive = [](const std::vector<double>& values) {
    return std::all_of(values.begin(), values.end(), [](double v) { return v > 0; });
  };
  // Log ratios where every value is > 0; else the plain differences over the baseline median.
  const bool logs = positive(baseline.values) && positive(current.values);
  const double scale = std::abs(out.baselineMedian);
  if (!logs && scale == 0) {
    out.note = "the baseline median is 0 and a value is not > 0: no relative change to test";
    return out;
  }
  std::vector<double> differences;
  for (std::size_t k = 0; k < baseline.values.size(); ++k) {
    differences.push_back(logs ? std::log(current.values[k] / baseline.values[k])
                               : (current.values[k] - baseline.values[k]) / scale);
  }
  const SignedRankResult test = wilcoxonSignedRank(differences);
  out.pValue = test.pValue;
  out.exact = test.exact;
  const auto relative = [&](double d) { return logs ? std::expm1(d) : d; };
  if (smallestPairedPValue(differences.size()) >= thresholds.alpha) {
    std::size_t needed = 1;
    while (smallestPairedPValue(needed) >= thresholds.alpha) ++needed;
    out.note = fmt::format(
        "too few rounds to decide: {}; the signed-rank test cannot reach p < {:g} with fewer "
        "than {} (run more rounds)",
        differences.size(), thresholds.alpha, needed);
    return out;
  }
  const ShiftInterval shift = pairedShiftInterval(differences, 1 - thresholds.alpha);
  out.changeEstimate = relative(shift.shift);
  out.change = out.changeEstimate;
  if (shift.bounded()) {
    out.changeLow = relative(shift.lower);
    out.changeHigh = relative(shift.upper);
  }
  decide(out, test.pValue, thresholds, true);
  return out;
}

Comparison compareSets(const SampleSet& baseline, const SampleSet& current,
                       const Thresholds& thresholds, const std::string& metricGlob,
                       const GateOptions& gate) {
  validate(thresholds);
  if (baseline.format != current.format) {
    throw ValueError(
        fmt::format("cannot compare the baseline ({}) with the current file ({}): "
                    "give two hmc-run reports or two Google Benchmark files",
                    toString(baseline.format), toString(current.format)));
  }
  Comparison out;
  out.gate = gate;
  const bool paired = gate.design == Design::kPaired;
  std::vector<double> ratios;
  auto keep = [&](const std::string& name) {
    return metricGlob.empty() || globMatch(metricGlob, name);
  };
  for (const auto& [name, series] : baseline.series) {
    if (!keep(name)) continue;
    const auto other = current.series.find(name);
    if (other == current.series.end()) {
      out.onlyBaseline.push_back(name);
      continue;
    }
    MetricComparison metric = paired ? comparePairedSeries(name, series, other->second, thresholds)
                                     : compareSeries(name, series, other->second, thresholds);
    if (metric.baselineMedian > 0 && metric.currentMedian > 0) {
      ratios.push_back(metric.currentMedian / metric.baselineMedian);
    }
    out.metrics.push_back(std::move(metric));
  }
  out.gateGlob = gate.gateGlob;
  if (out.gateGlob.empty()) {
    const bool labelled =
        baseline.format == SourceFormat::kReport &&
        std::any_of(out.metrics.begin(), out.metrics.end(),
                    [](const MetricComparison& m) { return globMatch(kLabelledGlob, m.name); });
    out.gateGlob = labelled ? std::string(kLabelledGlob) : "*";
  }
  // The gated metrics that reached a verdict on their p-value form the family of the correction.
  std::vector<std::size_t> family;
  for (std::size_t k = 0; k < out.metrics.size(); ++k) {
    MetricComparison& m = out.metrics[k];
    m.gated = globMatch(out.gateGlob, m.name);
    if (!m.gated) m.regression = false;
    const bool tested = m.pValue && m.verdict != Verdict::kUndecided;
    if (m.gated && tested) family.push_back(k);
  }
  out.gatedCount = family.size();
  std::vector<double> raw;
  for (std::size_t k : family) raw.push_back(*out.metrics[k].pValue);
  const std::vector<double> adjusted = gate.correction == Correction::kHolm ? holmAdjust(raw) : raw;
  for (std::size_t i = 0; i < family.size(); ++i) {
    MetricComparison& m = out.metrics[family[i]];
    m.adjustedPValue = adjusted[i];
    if (adjusted[i] != raw[i]) decide(m, adjusted[i], thresholds, paired);
  }
  for (const auto& m : out.metrics) out.regression = out.regression || m.regression;
  for (const auto& [name, series] : current.series) {
    if (keep(name) && baseline.series.count(name) == 0) out.onlyCurrent.push_back(name);
  }
  if (!ratios.empty()) out.geometricMeanRatio = geometricMean(ratios);
  for (const auto& [key, text] : current.leaks) {
    if (!keep(key)) continue;
    (baseline.leaks.count(key) ? out.keptLeaks : out.newLeaks).push_back(text);
  }
  for (const auto& [key, text] : baseline.leaks) {
    if (keep(key) && current.leaks.count(key) == 0) out.goneLeaks.push_back(text);
  }
  out.regression = out.regression || !out.newLeaks.empty();
  return out;
}

bool globMatch(std::string_view pattern, std::string_view text) {
  // Iterative match with one backtrack point for the last `*`.
  std::size_t p = 0, t = 0, starP = std::string_view::npos, starT = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      starP = p++;
      starT = t;
    } else if (starP != std::string_view::npos) {
      p = starP + 1;
      t = ++starT;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace hmc::compare
