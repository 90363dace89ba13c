#include "hmc/scenario/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

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
  json entry = {{"rank", rank.rank}};
  // A rank process that died left no result: like the reference, no steps and no final
  // state (zeros would read as a clean rank). Thread ranks that crashed keep theirs.
  // The same for a rank known only from its heartbeat (no steps, hung).
  if (!rank.steps.empty() || !(rank.crashed || rank.hung)) {
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
  return entry;
}

json samplesJson(const Samples& samples) {
  json metrics = json::object();
  for (const auto& [name, metric] : samples.metrics) {
    metrics[name] = {{"unit", metric.unit}, {"per_repetition", metric.perRepetition}};
  }
  return {{"repetitions", samples.repetitions},
          {"warmup", samples.warmup},
          {"metrics", std::move(metrics)}};
}

}  // namespace

std::string_view toString(Outcome outcome) noexcept {
  switch (outcome) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kFail:
      return "fail";
    case Outcome::kHang:
      return "hang";
    case Outcome::kInvalid:
      return "invalid";
  }
  return "fail";
}

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

Outcome computeOutcome(const Scenario& scenario, const std::vector<RankResult>& ranks) {
  const bool anyCrash =
      std::any_of(ranks.begin(), ranks.end(), [](const RankResult& r) { return r.crashed; });
  const bool anyFaultStep = std::any_of(scenario.steps.begin(), scenario.steps.end(),
                                        [](const Step& s) { return s.op == Op::kFault; });
  if (anyCrash && !anyFaultStep) return Outcome::kFail;
  bool allExpected = true;
  bool unexpectedHang = false;
  for (const auto& rank : ranks) {
    for (const auto& step : rank.steps) {
      allExpected = allExpected && step.expected;
      unexpectedHang = unexpectedHang || (step.status == StepStatus::kHang && !step.expected);
    }
  }
  if (allExpected) return Outcome::kPass;
  return unexpectedHang ? Outcome::kHang : Outcome::kFail;
}

std::string diagnoseHang(const std::vector<RankResult>& ranks) {
  // The words are diagnostics::diagnoseWaits's, shared with `hmc-run status`.
  std::vector<diagnostics::RankWhereabouts> places;
  places.reserve(ranks.size());
  for (const auto& rank : ranks) {
    diagnostics::RankWhereabouts place;
    place.rank = rank.rank;
    place.flight = rank.flight;
    place.hung = rank.hung;
    if (rank.crashed) place.gone = rank.crashReason.value_or("exited");
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

ScenarioReport buildReport(const Scenario& scenario,
                           std::vector<std::vector<RankResult>> repetitions, int warmup,
                           RunInfo info) {
  if (repetitions.empty()) throw ValueError("buildReport: no repetition to report");
  warmup = std::clamp(warmup, 0, static_cast<int>(repetitions.size()) - 1);
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
  report.samples.repetitions = static_cast<int>(repetitions.size());
  report.samples.warmup = warmup;

  std::size_t shown = repetitions.size() - 1;
  report.outcome = Outcome::kPass;
  std::map<std::string, std::vector<double>> measured;  // pooled over measured repetitions
  for (std::size_t r = 0; r < repetitions.size(); ++r) {
    const Outcome outcome = computeOutcome(scenario, repetitions[r]);
    if (outcome != Outcome::kPass && report.outcome == Outcome::kPass) shown = r;
    report.outcome = worse(report.outcome, outcome);
    auto metrics = samplesOf(scenario, repetitions[r]);
    for (auto& [name, values] : metrics) {
      auto& metric = report.samples.metrics[name];
      metric.perRepetition.resize(repetitions.size());
      if (static_cast<int>(r) >= warmup) append(measured[name], values);
      metric.perRepetition[r] = std::move(values);
    }
  }
  report.ranks = std::move(repetitions[shown]);
  report.shownRepetition = static_cast<int>(shown);

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
  report.timings.freshBind = timingStats(measured["fresh_bind"]);
  report.timings.reusedBind = timingStats(measured["reused_bind"]);
  report.timings.close = timingStats(measured["close"]);
  report.timings.exchange = timingStats(measured["exchange"]);
  if (report.timings.freshBind.p50 && report.timings.reusedBind.p50 &&
      *report.timings.reusedBind.p50 > 0) {
    report.timings.reuseSpeedupP50 = *report.timings.freshBind.p50 / *report.timings.reusedBind.p50;
  }
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
  return report;
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
  out["leaks"] = {{"leaked", report.leaked}, {"ranks", std::move(leakRanks)}};
  json timings = {{"fresh_bind", toJson(report.timings.freshBind)},
                  {"reused_bind", toJson(report.timings.reusedBind)},
                  {"close", toJson(report.timings.close)},
                  {"exchange", toJson(report.timings.exchange)}};
  if (report.timings.reuseSpeedupP50) {
    timings["reuse_speedup_p50"] = *report.timings.reuseSpeedupP50;
  }
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
