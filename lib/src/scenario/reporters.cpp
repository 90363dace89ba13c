#include "hmc/scenario/reporters.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>

#include "hmc/error.hpp"
#include "hmc/scenario/report.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;

std::string formatSeconds(const json& value) {
  if (value.is_null()) return "-";
  const double s = value.get<double>();
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

std::string cellOf(const StepResult& step) {
  std::string text(toString(step.status));
  if (step.bind) {
    text += fmt::format(" #{} {}", (*step.bind)["binding_id"].get<std::int64_t>(),
                        (*step.bind)["reused"].get<bool>() ? "reused" : "fresh");
  }
  if (step.errorKind) text += " " + *step.errorKind;
  if (!step.expected) text += " (!)";
  return text;
}

// "0-3,5" for a sorted rank list.
std::string rankRanges(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(i == j ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

class ConsoleReporter final : public Reporter {
 public:
  ConsoleReporter(std::ostream& out, ConsoleOptions options) : out_(out), options_(options) {}

  void scenarioFinished(const Scenario& scenario, const json& report,
                        const std::vector<RankResult>& ranks) override {
    const std::string outcome = report["outcome"].get<std::string>();
    summary_.push_back({scenario.name, outcome, report["environment"]["wall_seconds"].get<double>(),
                        scenario.worldSize, scenario.file});
    if (options_.quiet) return;
    const json& env = report["environment"];
    fmt::print(out_, "# hmc-run: {} ({} ranks, transport {}, device {}, timeout {} s)\n",
               scenario.name, scenario.worldSize, env["transport"].get<std::string>(),
               env["device"].get<std::string>(), scenario.timeoutS);
    if (!scenario.description.empty()) fmt::print(out_, "# {}\n", scenario.description);
    printSteps(scenario, ranks);
    printDetails(report, ranks);
    fmt::print(out_, "# outcome: {} in {}\n", outcome, formatSeconds(env["wall_seconds"]));
    out_.flush();
  }

  void scenarioInvalid(const std::string& file, const json& report) override {
    summary_.push_back({file, "invalid", 0.0, 0, file});
    const json& error = report["error"];
    const std::string path = error["path"].get<std::string>();
    fmt::print(out_, "# invalid scenario {}: {}{}\n", file, path.empty() ? "" : path + ": ",
               error["message"].get<std::string>());
  }

  void finish() override {
    if (options_.directory && !options_.quiet) {
      fmt::print(out_, "#\n# {:<40} {:>5} {:>8} {:>10}\n", "scenario", "ranks", "outcome", "wall");
      for (const auto& row : summary_) {
        fmt::print(out_, "  {:<40} {:>5} {:>8} {:>10}\n", row.name, row.world, row.outcome,
                   formatSeconds(json(row.seconds)));
      }
    }
    std::map<std::string, int> counts;
    for (const auto& row : summary_) ++counts[row.outcome];
    const int bad = static_cast<int>(summary_.size()) - counts["pass"];
    if (bad == 0) {
      fmt::print(out_, "# OK: {} scenario{} passed\n", summary_.size(),
                 summary_.size() == 1 ? "" : "s");
    } else {
      fmt::print(out_,
                 "# FAILED: {} of {} scenario{} did not pass ({} fail, {} hang, {} invalid)\n", bad,
                 summary_.size(), summary_.size() == 1 ? "" : "s", counts["fail"], counts["hang"],
                 counts["invalid"]);
    }
    out_.flush();
  }

 private:
  struct Row {
    std::string name;
    std::string outcome;
    double seconds;
    int world;
    std::string file;
  };

  void printSteps(const Scenario& scenario, const std::vector<RankResult>& ranks) {
    const bool wide = static_cast<int>(ranks.size()) > options_.maxRankColumns;
    std::string header = fmt::format("# {:>4}  {:<10} {:<10} ", "step", "op", "module");
    if (wide) {
      header += "ranks";
    } else {
      for (const auto& rank : ranks)
        header += fmt::format("{:<22}", fmt::format("rank {}", rank.rank));
    }
    fmt::print(out_, "{}\n", header);
    for (std::size_t index = 0; index < scenario.steps.size(); ++index) {
      const Step& step = scenario.steps[index];
      std::string line = fmt::format("  {:>4}  {:<10} {:<10} ", index, toString(step.op),
                                     step.module.empty() ? "" : step.module);
      if (wide) {
        std::map<std::string, std::vector<int>> groups;
        for (const auto& rank : ranks) {
          if (index < rank.steps.size()) groups[cellOf(rank.steps[index])].push_back(rank.rank);
        }
        std::vector<std::string> parts;
        for (const auto& [cell, members] : groups) {
          parts.push_back(members.size() == ranks.size()
                              ? cell + " (all)"
                              : fmt::format("{} (ranks {})", cell, rankRanges(members)));
        }
        line += fmt::format("{}", fmt::join(parts, "; "));
      } else {
        for (const auto& rank : ranks) {
          line += fmt::format(
              "{:<22}", index < rank.steps.size() ? cellOf(rank.steps[index]) : std::string("-"));
        }
      }
      if (step.label) line += "  " + *step.label;
      fmt::print(out_, "{}\n", line);
    }
  }

  void printDetails(const json& report, const std::vector<RankResult>& ranks) {
    // Unexpected results, grouped by identical text so 1,024 ranks print one line.
    std::map<std::string, std::vector<int>> problems;
    for (const auto& rank : ranks) {
      if (rank.crashed) {
        problems[fmt::format("crashed: {}", rank.crashReason.value_or("exited"))].push_back(
            rank.rank);
      }
      for (const auto& step : rank.steps) {
        if (step.expected && !step.errorKind) continue;
        const std::string text = fmt::format(
            "step {} {}: {}{}{}", step.index, step.op, toString(step.status),
            step.errorKind ? " " + *step.errorKind + ": " + step.errorMessage.value_or("") : "",
            step.expected ? " (expected)" : " (unexpected)");
        problems[text].push_back(rank.rank);
      }
    }
    for (const auto& [text, members] : problems) {
      fmt::print(out_, "# ranks {}: {}\n", rankRanges(members), text);
    }
    for (const auto& mismatch : report["mismatches"]) {
      if (mismatch["rank"].get<int>() != 0) continue;
      const json& first = mismatch["diagnosis"]["first_difference"];
      if (first.is_null()) continue;
      fmt::print(out_,
                 "# mismatch at step {} ('{}'): rank {} differs from rank 0 at {}: rank 0 has "
                 "{}, rank {} has {}\n",
                 mismatch["step"].get<int>(), mismatch["diagnosis"]["stage"].get<std::string>(),
                 first["rank"].get<int>(),
                 first.contains("index") ? fmt::format("manifest entry {}", first["index"].dump())
                                         : std::string("the signature"),
                 first["rank0"].dump(), first["rank"].get<int>(), first["this_rank"].dump());
    }
    if (!report["hang"].is_null()) {
      fmt::print(out_, "# hang: {}\n", report["hang"]["diagnosis"].get<std::string>());
    }
    const json& timings = report["timings"];
    fmt::print(
        out_,
        "# timings (p50/p95, n): fresh bind {}/{} n={}, reused bind {}/{} n={}, "
        "close {}/{} n={}, collectives {}/{} n={}\n",
        formatSeconds(timings["fresh_bind"]["p50"]), formatSeconds(timings["fresh_bind"]["p95"]),
        timings["fresh_bind"]["count"].get<int>(), formatSeconds(timings["reused_bind"]["p50"]),
        formatSeconds(timings["reused_bind"]["p95"]), timings["reused_bind"]["count"].get<int>(),
        formatSeconds(timings["close"]["p50"]), formatSeconds(timings["close"]["p95"]),
        timings["close"]["count"].get<int>(), formatSeconds(timings["exchange"]["p50"]),
        formatSeconds(timings["exchange"]["p95"]), timings["exchange"]["count"].get<int>());
    std::map<std::string, std::vector<int>> leakLines;
    for (const auto& leak : report["leaks"]["ranks"]) {
      const int rank = leak["rank"].get<int>();
      if (!leak["checked"].get<bool>()) {
        leakLines["not checked: " + leak["reason"].get<std::string>()].push_back(rank);
        continue;
      }
      if (!leak["leaked"].get<bool>() && leak["shutdown_error"].is_null()) continue;
      std::string text = fmt::format(
          "left after shutdown: {} groups, {} bound, {} bytes in {} workspaces, runtime {}",
          leak["groups"].get<std::int64_t>(), leak["bound_groups"].get<std::int64_t>(),
          leak["bytes_held"].get<std::int64_t>(), leak["workspaces_held"].get<std::int64_t>(),
          leak["runtime_live"].get<bool>() ? "live" : "released");
      if (leak.contains("device") && leak["device"].value("leaked", false)) {
        const auto& device = leak["device"];
        text += fmt::format("; on cuda:{}: {} bytes, {} streams, {} events, {} communicators",
                            device["device"].get<int>(), device["bytes_held"].get<std::int64_t>(),
                            device["streams_held"].get<std::int64_t>(),
                            device["events_held"].get<std::int64_t>(),
                            device["communicators_held"].get<std::int64_t>());
      }
      if (!leak["shutdown_error"].is_null()) {
        text += "; shutdown failed: " + leak["shutdown_error"].get<std::string>();
      }
      leakLines[text].push_back(rank);
    }
    if (leakLines.empty()) {
      fmt::print(out_, "# leaks: none (automatic shutdown closed everything)\n");
    }
    for (const auto& [text, members] : leakLines) {
      fmt::print(out_, "# leaks, ranks {}: {}\n", rankRanges(members), text);
    }
  }

  std::ostream& out_;
  ConsoleOptions options_;
  std::vector<Row> summary_;
};

class JsonReporter final : public Reporter {
 public:
  explicit JsonReporter(std::string path) : path_(std::move(path)) {}
  void scenarioFinished(const Scenario&, const json& report,
                        const std::vector<RankResult>&) override {
    reports_.push_back(report);
  }
  void scenarioInvalid(const std::string&, const json& report) override {
    reports_.push_back(report);
  }
  void finish() override {
    const json document = reports_.size() == 1
                              ? reports_.front()
                              : json{{"format", "hmc-report-set/1"}, {"reports", reports_}};
    writeFileAtomically(path_, document.dump(1) + "\n");
  }

 private:
  std::string path_;
  std::vector<json> reports_;
};

class TraceReporter final : public Reporter {
 public:
  explicit TraceReporter(std::string path) : path_(std::move(path)) {}
  void scenarioFinished(const Scenario& scenario, const json&,
                        const std::vector<RankResult>& ranks) override {
    json trace = buildChromeTrace(scenario, ranks);
    const int pidBase = static_cast<int>(scenarios_) * 100000;
    for (auto& event : trace["traceEvents"]) {
      event["pid"] = event["pid"].get<int>() + pidBase;
      events_.push_back(std::move(event));
    }
    ++scenarios_;
  }
  void scenarioInvalid(const std::string&, const json&) override {}
  void finish() override {
    writeFileAtomically(path_,
                        json{{"traceEvents", events_}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  }

 private:
  std::string path_;
  json events_ = json::array();
  std::size_t scenarios_ = 0;
};

}  // namespace

json buildChromeTrace(const Scenario& scenario, const std::vector<RankResult>& ranks) {
  json events = json::array();
  auto us = [](double seconds) { return seconds * 1e6; };
  // Per sequence number: the (rank, start) of each rank's slice, for flow arrows.
  std::map<std::uint64_t, std::vector<std::pair<int, double>>> bySequence;
  for (const auto& rank : ranks) {
    const int pid = rank.rank;
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("{} rank {}", scenario.name, rank.rank)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"sort_index", rank.rank}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", 1},
                      {"args", {{"name", "steps"}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", 2},
                      {"args", {{"name", "collectives"}}}});
    for (const auto& step : rank.steps) {
      if (step.status == StepStatus::kSkipped || step.status == StepStatus::kNotRun) continue;
      json args = {{"status", toString(step.status)}, {"expected", step.expected}};
      if (step.errorKind) args["error"] = *step.errorKind + ": " + step.errorMessage.value_or("");
      if (step.bind) args["bind"] = *step.bind;
      events.push_back({{"ph", "X"},
                        {"pid", pid},
                        {"tid", 1},
                        {"name", step.module ? step.op + " " + *step.module : step.op},
                        {"cat", "step"},
                        {"ts", us(step.startS)},
                        {"dur", std::max(us(step.seconds), 1.0)},
                        {"args", std::move(args)}});
      if (step.status == StepStatus::kHang || step.status == StepStatus::kError) {
        events.push_back({{"ph", "i"},
                          {"pid", pid},
                          {"tid", 1},
                          {"s", "p"},
                          {"name", fmt::format("{} at step {}", toString(step.status), step.index)},
                          {"ts", us(step.startS + step.seconds)},
                          {"args", {{"message", step.errorMessage.value_or("")}}}});
      }
    }
    for (const auto& entry : rank.flight) {
      const double end = entry.endS.value_or(entry.startS);
      events.push_back(
          {{"ph", "X"},
           {"pid", pid},
           {"tid", 2},
           {"name", fmt::format("{} #{}", entry.stage, entry.sequence)},
           {"cat", "collective"},
           {"ts", us(entry.startS)},
           {"dur", std::max(us(end - entry.startS), 1.0)},
           {"args",
            {{"status", entry.status}, {"step", entry.step}, {"bytes", entry.payloadBytes}}}});
      bySequence[entry.sequence].emplace_back(pid, us(entry.startS));
    }
  }
  for (const auto& [sequence, slices] : bySequence) {
    for (std::size_t i = 0; i + 1 < slices.size(); ++i) {
      const std::uint64_t id = sequence * 4096 + i;
      events.push_back({{"ph", "s"},
                        {"id", id},
                        {"pid", slices[i].first},
                        {"tid", 2},
                        {"name", "collective"},
                        {"cat", "flow"},
                        {"ts", slices[i].second}});
      events.push_back({{"ph", "f"},
                        {"bp", "e"},
                        {"id", id},
                        {"pid", slices[i + 1].first},
                        {"tid", 2},
                        {"name", "collective"},
                        {"cat", "flow"},
                        {"ts", slices[i + 1].second}});
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

std::unique_ptr<Reporter> makeConsoleReporter(std::ostream& out, ConsoleOptions options) {
  return std::make_unique<ConsoleReporter>(out, options);
}

std::unique_ptr<Reporter> makeJsonReporter(std::string path) {
  return std::make_unique<JsonReporter>(std::move(path));
}

std::unique_ptr<Reporter> makeTraceReporter(std::string path) {
  return std::make_unique<TraceReporter>(std::move(path));
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw RuntimeError(fmt::format("cannot write {}: {}", temporary, std::strerror(errno)));
    }
    out << text;
    out.flush();
    if (!out) {
      throw RuntimeError(fmt::format("cannot write {}: {}", temporary, std::strerror(errno)));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw RuntimeError(fmt::format("cannot write {}: {}", path, reason));
  }
}

}  // namespace hmc::scenario
