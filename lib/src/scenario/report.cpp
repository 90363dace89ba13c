#include "hmc/scenario/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "hmc/config.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;

std::string stepText(int step) {
  return step < 0 ? std::string("after its steps") : fmt::format("step {}", step);
}

bool isWaitStatus(const std::string& status) {
  return status == "timeout" || status == "rank_failure" || status == "in_flight";
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
  // The collective the hung ranks wait in (the lowest sequence number among them).
  std::optional<diagnostics::FlightEntry> waitedIn;
  for (const auto& rank : ranks) {
    if (!rank.hung || rank.flight.empty()) continue;
    for (auto it = rank.flight.rbegin(); it != rank.flight.rend(); ++it) {
      if (isWaitStatus(it->status)) {
        if (!waitedIn || it->sequence < waitedIn->sequence) waitedIn = *it;
        break;
      }
    }
  }
  if (!waitedIn) return "";
  std::vector<std::string> parts;
  for (const auto& rank : ranks) {
    std::optional<diagnostics::FlightEntry> waiting;
    std::optional<diagnostics::FlightEntry> lastDone;
    for (auto it = rank.flight.rbegin(); it != rank.flight.rend(); ++it) {
      if (!waiting && !lastDone && isWaitStatus(it->status)) waiting = *it;
      if (!lastDone && !isWaitStatus(it->status)) lastDone = *it;
      if (lastDone) break;
    }
    const std::string last = lastDone ? fmt::format("last completed '{}' #{} ({})", lastDone->stage,
                                                    lastDone->sequence, stepText(lastDone->step))
                                      : std::string("no collective completed");
    if (rank.crashed) {
      parts.push_back(fmt::format("rank {} crashed ({}); {}", rank.rank,
                                  rank.crashReason.value_or("exited"), last));
    } else if (rank.hung && waiting) {
      parts.push_back(fmt::format("rank {} waits in '{}' #{} ({}){}", rank.rank, waiting->stage,
                                  waiting->sequence, stepText(waiting->step),
                                  waiting->status == "rank_failure" ? ", a peer failed" : ""));
    } else {
      const bool finished = !rank.steps.empty() && rank.steps.back().status != StepStatus::kNotRun;
      parts.push_back(fmt::format("rank {} never arrived: {}, {}", rank.rank, last,
                                  finished ? "finished its steps" : "stopped early"));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

json timingStats(std::vector<double> samples) {
  if (samples.empty()) {
    return {{"count", 0}, {"p50", nullptr}, {"p95", nullptr}, {"max", nullptr}};
  }
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    const auto index = static_cast<std::size_t>(std::ceil(q * samples.size())) - 1;
    return samples[std::min(index, samples.size() - 1)];
  };
  return {
      {"count", samples.size()}, {"p50", rank(0.5)}, {"p95", rank(0.95)}, {"max", samples.back()}};
}

json buildReport(const Scenario& scenario, const std::vector<RankResult>& ranks,
                 const RunInfo& info) {
  json report = {{"format", kReportFormat},
                 {"scenario", scenario.name},
                 {"world_size", scenario.worldSize},
                 {"outcome", toString(computeOutcome(scenario, ranks))}};
  json rankEntries = json::array();
  json mismatches = json::array();
  json leakRanks = json::array();
  TimingSamples all;
  bool anyLeak = false;
  for (const auto& rank : ranks) {
    json full = rank.toJson();
    json entry = {{"rank", rank.rank}};
    // A rank process that died left no result: like the reference, no steps and no final
    // state (zeros would read as a clean rank). Thread ranks that crashed keep theirs.
    if (!(rank.crashed && rank.steps.empty())) {
      entry["steps"] = full["steps"];
      entry["final"] = full["final"];
    }
    if (rank.crashed) {
      entry["crashed"] = true;
      entry["crash_reason"] = full["crash_reason"];
    }
    rankEntries.push_back(std::move(entry));
    for (const auto& step : rank.steps) {
      if (!step.mismatch) continue;
      mismatches.push_back({{"step", step.index},
                            {"rank", rank.rank},
                            {"message", step.errorMessage.value_or("")},
                            {"diagnosis", *step.mismatch}});
    }
    json leaks = full["leaks"];
    leaks["rank"] = rank.rank;
    anyLeak = anyLeak || leaks["leaked"].get<bool>();
    leakRanks.push_back(std::move(leaks));
    all.freshBind.insert(all.freshBind.end(), rank.timings.freshBind.begin(),
                         rank.timings.freshBind.end());
    all.reusedBind.insert(all.reusedBind.end(), rank.timings.reusedBind.begin(),
                          rank.timings.reusedBind.end());
    all.close.insert(all.close.end(), rank.timings.close.begin(), rank.timings.close.end());
    all.exchange.insert(all.exchange.end(), rank.timings.exchange.begin(),
                        rank.timings.exchange.end());
  }
  report["ranks"] = std::move(rankEntries);
  report["mismatches"] = std::move(mismatches);
  report["leaks"] = {{"leaked", anyLeak}, {"ranks", std::move(leakRanks)}};
  json timings = {{"fresh_bind", timingStats(all.freshBind)},
                  {"reused_bind", timingStats(all.reusedBind)},
                  {"close", timingStats(all.close)},
                  {"exchange", timingStats(all.exchange)}};
  if (!timings["fresh_bind"]["p50"].is_null() && !timings["reused_bind"]["p50"].is_null() &&
      timings["reused_bind"]["p50"].get<double>() > 0) {
    timings["reuse_speedup_p50"] =
        timings["fresh_bind"]["p50"].get<double>() / timings["reused_bind"]["p50"].get<double>();
  }
  report["timings"] = std::move(timings);
  const std::string hang = diagnoseHang(ranks);
  if (hang.empty()) {
    report["hang"] = nullptr;
  } else {
    json flights = json::array();
    for (const auto& rank : ranks) {
      json entries = json::array();
      const std::size_t from = rank.flight.size() > 8 ? rank.flight.size() - 8 : 0;
      for (std::size_t i = from; i < rank.flight.size(); ++i) {
        entries.push_back(rank.flight[i].toJson());
      }
      flights.push_back({{"rank", rank.rank}, {"last_collectives", std::move(entries)}});
    }
    report["hang"] = {{"diagnosis", hang}, {"ranks", std::move(flights)}};
  }
  report["environment"] = {{"hmc_version", HMC_VERSION},
                           {"torch_version", info.torchVersion},
                           {"host", info.host},
                           {"transport", info.transport},
                           {"world_size", scenario.worldSize},
                           {"device", info.device},
                           {"timeout_s", scenario.timeoutS},
                           {"started_at", info.startedAt},
                           {"wall_seconds", info.wallSeconds},
                           {"command", info.command},
                           {"file", scenario.file}};
  return report;
}

json invalidReport(const std::string& file, const std::string& name, const ScenarioError& error) {
  return {{"format", kReportFormat},
          {"scenario", name.empty() ? json(nullptr) : json(name)},
          {"world_size", nullptr},
          {"outcome", "invalid"},
          {"ranks", json::array()},
          {"error", {{"file", file}, {"path", error.jsonPath()}, {"message", error.detail()}}}};
}

}  // namespace hmc::scenario
