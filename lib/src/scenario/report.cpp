#include "hmc/scenario/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "hmc/config.hpp"
#include "hmc/diagnostics/hang_diagnosis.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;

int severity(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass:
      return 0;
    case Outcome::kFail:
      return 1;
    case Outcome::kHang:
      return 2;
    case Outcome::kInvalid:
      return 3;
  }
  return 1;
}

void append(std::vector<double>& to, const std::vector<double>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// The raw samples of one repetition, by metric name (Samples).
std::map<std::string, std::vector<double>> samplesOf(const Scenario& scenario,
                                                     const std::vector<RankResult>& ranks) {
  std::map<std::string, std::vector<double>> metrics;
  for (const char* name : {"fresh_bind", "reused_bind", "close", "exchange"}) metrics[name];
  for (const auto& rank : ranks) {
    append(metrics["fresh_bind"], rank.timings.freshBind);
    append(metrics["reused_bind"], rank.timings.reusedBind);
    append(metrics["close"], rank.timings.close);
    for (const auto& [stage, samples] : rank.timings.collectives) {
      append(metrics["exchange"], samples);
      append(metrics["collective/" + stage], samples);
    }
    for (const auto& step : rank.steps) {
      if (!step.label || step.status != StepStatus::kOk) continue;
      if (step.index < 0 || step.index >= static_cast<int>(scenario.steps.size())) continue;
      const Step& definition = scenario.steps[step.index];
      const std::int64_t cycles = static_cast<std::int64_t>(definition.repeat) *
                                  (definition.op == Op::kRepeat ? definition.count : 1);
      if (cycles < 1 || (definition.op != Op::kRepeat && definition.repeat == 1)) continue;
      metrics["repeat/" + *step.label].push_back(step.seconds / static_cast<double>(cycles));
    }
  }
  return metrics;
}

std::optional<ManifestDifference> firstDifferenceOf(const json& diagnosis) {
  const auto it = diagnosis.find("first_difference");
  if (it == diagnosis.end() || !it->is_object()) return std::nullopt;
  ManifestDifference first;
  first.rank = it->value("rank", 0);
  if (it->contains("index")) first.index = (*it)["index"];
  first.rank0 = it->value("rank0", json(nullptr));
  first.thisRank = it->value("this_rank", json(nullptr));
  return first;
}

json toJson(const TimingStats& stats) {
  auto figure = [](const std::optional<double>& value) { return value ? json(*value) : json(); };
  return {{"count", stats.count},
          {"p50", figure(stats.p50)},
          {"p95", figure(stats.p95)},
          {"max", figure(stats.max)}};
}

// A step as the report shows it: absent fields are left out.
json reportStepJson(const StepResult& step) {
  json out = {
      {"index", step.index},       {"op", toString(step.op)}, {"status", toString(step.status)},
      {"expected", step.expected}, {"seconds", step.seconds}, {"start_s", step.startS}};
  if (step.module) out["module"] = *step.module;
  if (step.label) out["label"] = *step.label;
  if (step.error) {
    out["error"] = {{"kind", toString(step.error->kind)}, {"message", step.error->message}};
  }
  if (step.bind) {
    out["bind"] = {{"binding_id", step.bind->bindingId},
                   {"reused", step.bind->reused},
                   {"seconds", step.bind->seconds}};
  }
  if (step.mismatch) out["mismatch"] = *step.mismatch;
  return out;
}

json rankJson(const RankResult& rank) {
  json entry = {{"rank", rank.rank},
                {"host", rank.host.empty() ? json(nullptr) : json(rank.host)},
                {"pid", rank.pid == 0 ? json(nullptr) : json(rank.pid)}};
  // A rank process that died left no result: like the reference, no steps and no final
  // state (zeros would read as a clean rank). Thread ranks that crashed keep theirs.
  // The same for a rank known only from its heartbeat (no steps, hung).
  if (!rank.steps.empty() || !rank.unfinished()) {
    json steps = json::array();
    for (const auto& step : rank.steps) steps.push_back(reportStepJson(step));
    entry["steps"] = std::move(steps);
    entry["final"] = {{"groups", rank.final.groups},
                      {"bound_groups", rank.final.boundGroups},
                      {"runtime_live", rank.final.runtimeLive}};
  }
  if (rank.crashed) {
    entry["crashed"] = true;
    entry["crash_reason"] = rank.crashReason.value_or("");
  }
  if (rank.stopped) {  // alive, stopped from outside before its result came: not crashed
    entry["stopped"] = true;
    entry["stop_reason"] = rank.crashReason.value_or("");
  }
  if (rank.notJoined) entry["joined"] = false;  // a world that did not form: never joined
  if (rank.resultLost) {  // not known to have crashed: its result could not come
    entry["result_lost"] = true;
    entry["lost_reason"] = rank.crashReason.value_or("");
  }
  return entry;
}

json samplesJson(const Samples& samples) {
  json metrics = json::object();
  for (const auto& [name, metric] : samples.metrics) {
    metrics[name] = {{"unit", metric.unit}, {"per_repetition", metric.perRepetition}};
  }
  json out = {{"repetitions", samples.repetitions},
              {"warmup", samples.warmup},
              {"metrics", std::move(metrics)}};
  if (samples.summarizedFrom) out["summarized_from"] = *samples.summarizedFrom;
  return out;
}

}  // namespace

int exitCodeOf(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::kPass:
      return 0;
    case Outcome::kFail:
      return 1;
    case Outcome::kInvalid:
      return 2;
    case Outcome::kHang:
      return 3;
  }
  return 1;
}

Outcome worse(Outcome a, Outcome b) noexcept { return severity(b) > severity(a) ? b : a; }

namespace {

// Whether `steps` (repeat blocks included) plan a crash (fault crash) on rank `rank`.
bool plansCrashOn(const std::vector<Step>& steps, int rank) {
  return std::any_of(steps.begin(), steps.end(), [rank](const Step& s) {
    const bool onRank =
        !s.ranks || std::find(s.ranks->begin(), s.ranks->end(), rank) != s.ranks->end();
    if (!onRank) return false;
    if (s.op == Op::kRepeat) return plansCrashOn(s.steps, rank);
    return s.op == Op::kFault && s.faultKind == FaultKind::kCrash;
  });
}

}  // namespace

Outcome computeOutcome(const Scenario& scenario, const std::vector<RankResult>& ranks) {
  // A rank stopped from outside while at work did not finish either: as a crash here.
  const bool anyCrash = std::any_of(ranks.begin(), ranks.end(),
                                    [](const RankResult& r) { return r.crashed || r.stopped; });
  const bool anyFaultStep = std::any_of(scenario.steps.begin(), scenario.steps.end(),
                                        [](const Step& s) { return s.op == Op::kFault; });
  // (hmc) A rank that crashed where its scenario planned no crash for it: one that fell silent
  // (SIGSTOP, a host cut off), a runner that failed. The reference exempts every crash once the
  // scenario has any fault step, which is right for it (its ranks crash only by plan); hmc sees
  // ranks lost from outside, and a stall or a close error planned elsewhere does not make their
  // loss a pass (a rank stopped 4.6 s at the end read '# OK' with 'no result from rank 3').
  // Where the others hung waiting for it, the table's `hang` stands.
  const bool crashedUnplanned = std::any_of(ranks.begin(), ranks.end(), [&](const RankResult& r) {
    return r.crashed && !plansCrashOn(scenario.steps, r.rank);
  });
  // (hmc) A top-level crash that stands for a rank lost from outside (a killed rank's
  // recording, merged): the crash fails as it did in the run.
  const bool unplannedCrash =
      std::any_of(scenario.steps.begin(), scenario.steps.end(), [](const Step& s) {
        return s.op == Op::kFault && s.faultKind == FaultKind::kCrash && !s.crashPlanned;
      });
  // A rank that crashed other than at its fault step fails the run whatever the scenario
  // planned: killed by a signal (a fault crash exits), or lost while the world formed (a SIGKILL
  // of one store rank during the join read '# OK' with every rank crashed).
  const bool crashedOtherwise = std::any_of(ranks.begin(), ranks.end(), [](const RankResult& r) {
    return r.crashed && r.crashReason &&
           (r.crashReason->find("killed by signal") != std::string::npos ||
            r.crashReason->rfind("could not join its world", 0) == 0);
  });
  // A world a launcher stopped while it formed (no rank has a step): nothing the plan did.
  const bool notFormed =
      std::any_of(ranks.begin(), ranks.end(), [](const RankResult& r) { return r.stopped; }) &&
      std::all_of(ranks.begin(), ranks.end(), [](const RankResult& r) { return r.steps.empty(); });
  if (anyCrash && (!anyFaultStep || unplannedCrash || crashedOtherwise || notFormed)) {
    return Outcome::kFail;
  }
  bool allExpected = true;
  bool unexpectedHang = false;
  for (const auto& rank : ranks) {
    for (const auto& step : rank.steps) {
      allExpected = allExpected && step.expected;
      unexpectedHang = unexpectedHang || (step.status == StepStatus::kHang && !step.expected);
    }
  }
  if (allExpected) return crashedUnplanned ? Outcome::kFail : Outcome::kPass;
  return unexpectedHang ? Outcome::kHang : Outcome::kFail;
}

namespace {

// Rank `rank`'s first failure in a run that did not pass, if it had one of its own.
std::optional<diagnostics::FailureView> rankFailure(const Scenario& scenario,
                                                    const RankResult& rank) {
  diagnostics::FailureView view;
  view.rank = rank.rank;
  view.host = rank.host;
  for (const auto& step : rank.steps) {
    if (step.expected) continue;
    view.step = step.index;
    view.op = std::string(toString(step.op));
    if (step.error) {
      view.kind = diagnostics::failureKindOf(toString(step.error->kind), step.mismatch.has_value());
      view.stage = step.error->stage;
      view.sequence = step.error->sequence;
      view.collectivesBefore = step.error->collectivesBefore;
      view.message = step.error->message;
      if (step.mismatch) view.mismatch = *step.mismatch;
    } else {
      // An expected error or hang that did not happen.
      const Step& definition = scenario.steps[step.index];
      view.kind = "unmet";
      view.message = fmt::format("step {} ({}) was expected to end with {}{}, but its status is {}",
                                 step.index, toString(step.op), toString(definition.expect),
                                 definition.expectError
                                     ? fmt::format(" containing '{}'", *definition.expectError)
                                     : std::string(),
                                 toString(step.status));
      view.collectivesBefore = std::numeric_limits<std::uint64_t>::max() / 2;
    }
    return view;
  }
  // Where its heartbeat last showed it waiting, for a rank that ended from outside.
  if (!rank.flight.empty() && diagnostics::isWaitStatus(rank.flight.back().status)) {
    view.waitedIn = std::make_pair(rank.flight.back().stage, rank.flight.back().sequence);
  }
  if (rank.crashed) {
    view.kind = std::string(diagnostics::kCrash);
    view.message = rank.crashReason.value_or("exited");
    return view;
  }
  if (rank.notJoined) {
    // Never joined the world that a launcher stopped while it formed: what the teardown most
    // likely followed, named before the ranks it stopped (the diagnosis's 'missing' order).
    view.kind = std::string(diagnostics::kMissing);
    view.stage = "join";
    view.message = rank.crashReason.value_or("had not joined the world");
    return view;
  }
  if (rank.resultLost) {  // its fate unknown here: after any failure seen, never the first
    view.kind = std::string(diagnostics::kMissing);
    view.message = rank.crashReason.value_or("its result was lost");
    return view;
  }
  if (rank.stopped) {
    view.kind = std::string(diagnostics::kStopped);
    view.message = rank.crashReason.value_or("stopped");
    return view;
  }
  if (rank.hung) {  // left waiting, with no step of its own that says so (a missing rank)
    for (auto it = rank.flight.rbegin(); it != rank.flight.rend(); ++it) {
      if (!diagnostics::isWaitStatus(it->status)) continue;
      view.kind = "timeout";
      view.stage = it->stage;
      view.sequence = it->sequence;
      view.collectivesBefore = it->sequence;
      view.message = fmt::format("waited in '{}' #{} (its last heartbeat)", it->stage, it->sequence);
      return view;
    }
  }
  return std::nullopt;
}

}  // namespace

diagnostics::Diagnosis diagnoseRun(const Scenario& scenario, const std::vector<RankResult>& ranks,
                                   Outcome outcome) {
  if (outcome == Outcome::kPass || outcome == Outcome::kInvalid) return {};
  std::vector<diagnostics::FailureView> views;
  std::vector<std::string> hosts;
  std::map<int, std::string> whereabouts;
  for (const auto& rank : ranks) {
    hosts.push_back(rank.host);
    // A crash the scenario planned does not fail it by itself; where the run failed anyway,
    // the crash is what the others met.
    if (auto view = rankFailure(scenario, rank)) {
      views.push_back(std::move(*view));
    } else if (!rank.unfinished()) {
      const bool finished = !rank.steps.empty() && rank.steps.back().status != StepStatus::kNotRun;
      whereabouts[rank.rank] = finished ? "it finished its steps" : "it stopped early";
    }
  }
  return diagnostics::diagnose(views, static_cast<int>(ranks.size()), hosts, whereabouts);
}

std::string diagnoseHang(const std::vector<RankResult>& ranks) {
  // The words are diagnostics::diagnoseWaits's, shared with `hmc-run status`.
  std::vector<diagnostics::RankWhereabouts> places;
  places.reserve(ranks.size());
  for (const auto& rank : ranks) {
    diagnostics::RankWhereabouts place;
    place.rank = rank.rank;
    place.host = rank.host;
    place.flight = rank.flight;
    place.hung = rank.hung;
    if (rank.resultLost) {
      place.unknown = rank.crashReason.value_or("its result was lost");
    } else if (rank.crashed || rank.stopped) {
      place.gone = rank.crashReason.value_or("exited");
    }
    const bool finished = !rank.steps.empty() && rank.steps.back().status != StepStatus::kNotRun;
    place.elsewhere = finished ? "finished its steps" : "stopped early";
    places.push_back(std::move(place));
  }
  return diagnostics::diagnoseWaits(places);
}

TimingStats timingStats(std::vector<double> samples) {
  TimingStats stats;
  stats.count = samples.size();
  if (samples.empty()) return stats;
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    const auto index = static_cast<std::size_t>(std::ceil(q * samples.size())) - 1;
    return samples[std::min(index, samples.size() - 1)];
  };
  stats.p50 = rank(0.5);
  stats.p95 = rank(0.95);
  stats.max = samples.back();
  return stats;
}

ScenarioReport buildReport(const Scenario& scenario, std::vector<RankResult> ranks, RunInfo info) {
  std::vector<std::vector<RankResult>> repetitions;
  repetitions.push_back(std::move(ranks));
  return buildReport(scenario, std::move(repetitions), 0, std::move(info));
}

namespace {

// Nearest-rank percentiles of any number of values in bounded memory: logarithmic buckets,
// bucket i holding the values in (kGamma^(i-1), kGamma^i]; a bucket's value is within
// (kGamma - 1) / (kGamma + 1) < 1 % of every value in it. Count, min and max are exact. From
// 1 ns to 1 h a metric has at most ~1500 buckets.
class LogHistogram {
 public:
  void add(double value) {
    ++count_;
    min_ = count_ == 1 ? value : std::min(min_, value);
    max_ = count_ == 1 ? value : std::max(max_, value);
    if (value > 0) {
      ++buckets_[static_cast<int>(std::ceil(std::log(value) / std::log(kGamma)))];
    } else {
      ++nonPositive_;
    }
  }

  // timingStats's figures, p50 and p95 from the buckets.
  TimingStats stats() const {
    TimingStats stats;
    stats.count = count_;
    if (count_ == 0) return stats;
    auto rank = [&](double q) {
      const auto wanted = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(count_)));
      std::uint64_t seen = nonPositive_;
      if (seen >= wanted) return std::clamp(0.0, min_, max_);
      for (const auto& [index, inBucket] : buckets_) {
        seen += inBucket;
        if (seen >= wanted) {
          return std::clamp(2 * std::pow(kGamma, index) / (kGamma + 1), min_, max_);
        }
      }
      return max_;
    };
    stats.p50 = rank(0.5);
    stats.p95 = rank(0.95);
    stats.max = max_;
    return stats;
  }

 private:
  static constexpr double kGamma = 1.02;
  std::map<int, std::uint64_t> buckets_;
  std::uint64_t nonPositive_ = 0;
  std::uint64_t count_ = 0;
  double min_ = 0;
  double max_ = 0;
};

// The metrics behind `timings`.
constexpr std::array<const char*, 4> kTimingMetrics = {"fresh_bind", "reused_bind", "close",
                                                       "exchange"};

// The median as `hmc-run compare` takes it from a repetition (the mean of the two middle
// values for an even count).
double medianOf(std::vector<double> values) {
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle),
                   values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle)) +
          upper) /
         2;
}

}  // namespace

struct ReportBuilder::Kept {
  // Where one repetition's values of a metric are: pool[begin, begin + count) while values are
  // kept whole, medians[begin] (count 1, or 0 without values) from summarizedFrom on.
  struct Span {
    std::uint32_t begin = 0;
    std::uint32_t count = 0;
  };
  struct Metric {
    std::vector<Span> spans;     // one per repetition
    std::vector<double> medians;  // past the budget: one per repetition with values
  };
  // Every value kept whole, of every metric, in one block of kKeptSampleValues allocated and
  // written through with the second repetition: keeping them never grows the process across
  // cycles, whose resident memory the leak trend measures (docs/leak-trends.md). A report of
  // one repetition keeps just its own. Past the block a repetition adds about 16 bytes per
  // metric.
  std::vector<double> pool;
  std::size_t whole = 0;  // values kept whole: the pool's used part
  std::map<std::string, Metric> metrics;
  std::optional<std::size_t> summarizedFrom;
  std::map<std::string, LogHistogram> measured;  // kTimingMetrics, measured repetitions
  // The latest repetition's values while it is a warm-up one: timings when the run ends
  // within its warm-up (the last repetition is measured then).
  std::map<std::string, std::vector<double>> latest;
  TrendRecorder trends;  // every repetition is a cycle
};

ReportBuilder::ReportBuilder(const Scenario& scenario, int warmup)
    : scenario_(&scenario), warmup_(warmup), kept_(std::make_unique<Kept>()) {}
ReportBuilder::~ReportBuilder() = default;
ReportBuilder::ReportBuilder(ReportBuilder&&) noexcept = default;
ReportBuilder& ReportBuilder::operator=(ReportBuilder&&) noexcept = default;

void ReportBuilder::add(std::vector<RankResult> ranks) {
  const std::size_t r = count_++;
  const Outcome outcome = computeOutcome(*scenario_, ranks);
  const bool firstNotPassing = outcome != Outcome::kPass && outcome_ == Outcome::kPass;
  outcome_ = worse(outcome_, outcome);
  Kept& kept = *kept_;
  kept.trends.add(ranks);
  auto metrics = samplesOf(*scenario_, ranks);
  std::size_t values = 0;
  for (const auto& [name, samples] : metrics) values += samples.size();
  if (!kept.summarizedFrom && kept.whole + values > kKeptSampleValues) kept.summarizedFrom = r;
  if (const std::size_t wanted = r == 0 ? std::min(values, kKeptSampleValues) : kKeptSampleValues;
      kept.pool.size() < wanted) {
    kept.pool.resize(wanted, 0.0);
  }
  if (static_cast<int>(r) >= warmup_) {
    for (const char* name : kTimingMetrics) {
      for (double value : metrics[name]) kept.measured[name].add(value);
    }
  }
  for (auto& [name, samples] : metrics) {
    auto& metric = kept.metrics[name];
    metric.spans.resize(r);  // a metric new in this repetition: none before
    Kept::Span span;
    if (!kept.summarizedFrom) {
      span = {static_cast<std::uint32_t>(kept.whole), static_cast<std::uint32_t>(samples.size())};
      std::copy(samples.begin(), samples.end(),
                kept.pool.begin() + static_cast<std::ptrdiff_t>(kept.whole));
      kept.whole += samples.size();
    } else if (!samples.empty()) {
      span = {static_cast<std::uint32_t>(metric.medians.size()), 1};
      metric.medians.push_back(medianOf(samples));
    }
    metric.spans.push_back(span);
  }
  if (static_cast<int>(r) < warmup_) {
    kept.latest = std::move(metrics);
  } else {
    kept.latest.clear();
  }
  // The shown repetition: the first that did not pass, once there is one; until then the
  // latest (the last one in the end).
  if (firstNotPassing || outcome_ == Outcome::kPass) {
    shown_ = r;
    shownRanks_ = std::move(ranks);
  }
}

ScenarioReport ReportBuilder::build(RunInfo info) && {
  if (count_ == 0) throw ValueError("buildReport: no repetition to report");
  const Scenario& scenario = *scenario_;
  Kept& kept = *kept_;
  const int warmup = std::clamp(warmup_, 0, static_cast<int>(count_) - 1);
  ScenarioReport report;
  report.name = scenario.name;
  report.file = scenario.file;
  report.description = scenario.description;
  report.worldSize = scenario.worldSize;
  report.timeoutS = scenario.timeoutS;
  for (const Step& step : scenario.steps) {
    report.steps.push_back(StepOutline{step.op, step.module, step.label});
  }
  report.info = std::move(info);
  report.samples.repetitions = static_cast<int>(count_);
  report.samples.warmup = warmup;
  if (kept.summarizedFrom) report.samples.summarizedFrom = static_cast<int>(*kept.summarizedFrom);
  report.outcome = outcome_;
  std::map<std::string, std::vector<double>> measured;  // pooled over measured repetitions
  for (auto& [name, metric] : kept.metrics) {
    metric.spans.resize(count_);  // a metric absent from the last repetitions: none there
    auto& samples = report.samples.metrics[name];
    samples.perRepetition.resize(count_);
    auto& pooled = measured[name];
    for (std::size_t r = 0; r < count_; ++r) {
      const Kept::Span span = metric.spans[r];
      const bool whole = !kept.summarizedFrom || r < *kept.summarizedFrom;
      const double* from = (whole ? kept.pool.data() : metric.medians.data()) + span.begin;
      samples.perRepetition[r].assign(from, from + span.count);
      if (static_cast<int>(r) >= warmup) pooled.insert(pooled.end(), from, from + span.count);
    }
    metric = {};
  }
  kept.pool = {};
  report.ranks = std::move(shownRanks_);
  report.shownRepetition = static_cast<int>(shown_);

  for (const auto& rank : report.ranks) {
    report.leaked = report.leaked || rank.leaks.leaked();
    for (const auto& step : rank.steps) {
      if (!step.mismatch) continue;
      MismatchReport mismatch;
      mismatch.step = step.index;
      mismatch.rank = rank.rank;
      mismatch.message = step.error ? step.error->message : "";
      mismatch.stage = step.mismatch->value("stage", "");
      mismatch.firstDifference = firstDifferenceOf(*step.mismatch);
      mismatch.diagnosis = *step.mismatch;
      report.mismatches.push_back(std::move(mismatch));
    }
  }
  // Exact from the values kept whole; past the budget from the buckets (every measured
  // value went there), unless the run ended in its warm-up (the last repetition is measured).
  auto stats = [&](const char* name) {
    if (!kept.summarizedFrom) return timingStats(std::move(measured[name]));
    if (static_cast<int>(count_) <= warmup_) return timingStats(std::move(kept.latest[name]));
    return kept.measured[name].stats();
  };
  report.timings.freshBind = stats("fresh_bind");
  report.timings.reusedBind = stats("reused_bind");
  report.timings.close = stats("close");
  report.timings.exchange = stats("exchange");
  report.timings.approximate = kept.summarizedFrom && static_cast<int>(count_) > warmup_;
  if (report.timings.freshBind.p50 && report.timings.reusedBind.p50 &&
      *report.timings.reusedBind.p50 > 0) {
    report.timings.reuseSpeedupP50 = *report.timings.freshBind.p50 / *report.timings.reusedBind.p50;
  }
  if (count_ >= 2) {
    report.leakTrends = kept.trends.analyze(warmup_);
    const bool leaked = report.leakTrends->leaked();
    if (scenario.leakTrend == LeakTrendExpect::kNone && leaked) {
      report.leakTrendFailure = fmt::format(
          "a leak across cycles, which the scenario does not expect (leak_trend: none): {}",
          fmt::join(report.leakTrends->leaks(), "; "));
    } else if (scenario.leakTrend == LeakTrendExpect::kLeak && !leaked) {
      report.leakTrendFailure = fmt::format(
          "no leak across {} cycles, where the scenario expects one (leak_trend: leak)", count_);
    }
  } else if (scenario.leakTrend == LeakTrendExpect::kLeak) {
    report.leakTrendFailure =
        "the scenario expects a leak across cycles (leak_trend: leak), but it ran once: run it "
        "with --repetitions (at least 20 cycles; 200 find a small leak)";
  }
  if (!report.leakTrendFailure.empty()) report.outcome = worse(report.outcome, Outcome::kFail);
  const std::string hang = diagnoseHang(report.ranks);
  if (!hang.empty()) {
    HangReport section;
    section.diagnosis = hang;
    for (const auto& rank : report.ranks) {
      const std::size_t from = rank.flight.size() > 8 ? rank.flight.size() - 8 : 0;
      section.ranks.push_back(RankFlight{
          rank.rank, {rank.flight.begin() + static_cast<std::ptrdiff_t>(from), rank.flight.end()}});
    }
    report.hang = std::move(section);
  }
  report.diagnosis = diagnoseRun(scenario, report.ranks, report.outcome);
  return report;
}

ScenarioReport buildReport(const Scenario& scenario,
                           std::vector<std::vector<RankResult>> repetitions, int warmup,
                           RunInfo info) {
  ReportBuilder builder(scenario, warmup);
  for (auto& ranks : repetitions) builder.add(std::move(ranks));
  return std::move(builder).build(std::move(info));
}

ScenarioReport invalidReport(const std::string& file, const std::string& name,
                             const ScenarioError& error) {
  ScenarioReport report;
  report.outcome = Outcome::kInvalid;
  report.name = name;
  report.file = file;
  report.invalid = InvalidScenario{file, error.jsonPath(), error.detail()};
  return report;
}

json toJson(const ScenarioReport& report) {
  if (report.invalid) {
    return {{"format", kReportFormat},
            {"scenario", report.name.empty() ? json(nullptr) : json(report.name)},
            {"world_size", nullptr},
            {"outcome", toString(Outcome::kInvalid)},
            {"ranks", json::array()},
            {"error",
             {{"file", report.invalid->file},
              {"path", report.invalid->path},
              {"message", report.invalid->message}}}};
  }
  json out = {{"format", kReportFormat},
              {"scenario", report.name},
              {"world_size", report.worldSize},
              {"outcome", toString(report.outcome)}};
  json ranks = json::array();
  json leakRanks = json::array();
  for (const auto& rank : report.ranks) {
    ranks.push_back(rankJson(rank));
    json leaks = toJson(rank.leaks);
    leaks["rank"] = rank.rank;
    leakRanks.push_back(std::move(leaks));
  }
  out["ranks"] = std::move(ranks);
  json mismatches = json::array();
  for (const auto& mismatch : report.mismatches) {
    mismatches.push_back({{"step", mismatch.step},
                          {"rank", mismatch.rank},
                          {"message", mismatch.message},
                          {"diagnosis", mismatch.diagnosis}});
  }
  out["mismatches"] = std::move(mismatches);
  out.update(report.diagnosis.toJson());  // first_failure, consequences
  out["leaks"] = {{"leaked", report.leaked}, {"ranks", std::move(leakRanks)}};
  json timings = {{"fresh_bind", toJson(report.timings.freshBind)},
                  {"reused_bind", toJson(report.timings.reusedBind)},
                  {"close", toJson(report.timings.close)},
                  {"exchange", toJson(report.timings.exchange)}};
  if (report.timings.reuseSpeedupP50) {
    timings["reuse_speedup_p50"] = *report.timings.reuseSpeedupP50;
  }
  if (report.timings.approximate) timings["approximate"] = true;
  out["timings"] = std::move(timings);
  if (report.hang) {
    json flights = json::array();
    for (const auto& rank : report.hang->ranks) {
      json entries = json::array();
      for (const auto& entry : rank.lastCollectives) entries.push_back(entry.toJson());
      flights.push_back({{"rank", rank.rank}, {"last_collectives", std::move(entries)}});
    }
    out["hang"] = {{"diagnosis", report.hang->diagnosis}, {"ranks", std::move(flights)}};
  } else {
    out["hang"] = nullptr;
  }
  out["samples"] = samplesJson(report.samples);
  if (report.interrupted) out["interrupted"] = true;
  if (report.leakTrends) {
    out["leak_trends"] = toJson(*report.leakTrends);
    out["leak_trends"]["failure"] = report.leakTrendFailure.empty()
                                        ? nlohmann::json(nullptr)
                                        : nlohmann::json(report.leakTrendFailure);
  } else if (!report.leakTrendFailure.empty()) {
    out["leak_trends"] = {{"cycles", report.samples.repetitions},
                          {"failure", report.leakTrendFailure}};
  }
  const RunInfo& info = report.info;
  out["environment"] = {{"hmc_version", HMC_VERSION},
                        {"torch_version", info.torchVersion},
                        {"host", info.host},
                        {"transport", info.transport},
                        {"world_size", report.worldSize},
                        {"device", info.device},
                        {"timeout_s", report.timeoutS},
                        {"started_at", info.startedAt},
                        {"wall_seconds", info.wallSeconds},
                        {"command", info.command},
                        {"file", report.file}};
  return out;
}

json toJson(const std::vector<ScenarioReport>& reports) {
  if (reports.size() == 1) return toJson(reports.front());
  json all = json::array();
  for (const auto& report : reports) all.push_back(toJson(report));
  return {{"format", kReportSetFormat}, {"reports", std::move(all)}};
}

}  // namespace hmc::scenario
