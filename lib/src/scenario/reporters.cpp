#include "hmc/scenario/reporters.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <utility>

#include "hmc/render/html.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/text.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;

std::string formatSeconds(const std::optional<double>& seconds) {
  if (!seconds) return "-";
  const double s = *seconds;
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

std::string cellOf(const StepResult& step) {
  std::string text(toString(step.status));
  if (step.bind) {
    text += fmt::format(" #{} {}", step.bind->bindingId, step.bind->reused ? "reused" : "fresh");
  }
  if (step.error) text += fmt::format(" {}", toString(step.error->kind));
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

std::map<std::string, std::vector<const RankResult*>> ranksByHost(
    const std::vector<RankResult>& ranks) {
  std::map<std::string, std::vector<const RankResult*>> byHost;
  for (const auto& rank : ranks) {
    if (!rank.host.empty()) byHost[rank.host].push_back(&rank);
  }
  return byHost;
}

// "# hosts: h1 ranks 0-1 (pids 4711,4712); h2 ranks 2-3 (pids 801,802)": where the rank
// processes ran (pids up to 16 ranks; the JSON report has every one). "" for thread ranks
// (one process) and where no rank said.
std::string whereLine(const std::vector<RankResult>& ranks) {
  const auto byHost = ranksByHost(ranks);
  std::set<std::int64_t> pids;
  for (const auto& rank : ranks) {
    if (!rank.host.empty()) pids.insert(rank.pid);
  }
  if (byHost.empty() || (byHost.size() == 1 && pids.size() <= 1)) return "";
  std::vector<std::string> parts;
  for (const auto& [host, members] : byHost) {
    std::vector<int> numbers;
    std::vector<std::string> ids;
    for (const RankResult* rank : members) {
      numbers.push_back(rank->rank);
      ids.push_back(rank->pid == 0 ? std::string("?") : std::to_string(rank->pid));
    }
    const bool one = numbers.size() == 1;
    std::string part = fmt::format("{} {} {}", printable(host), one ? "rank" : "ranks",
                                   rankRanges(numbers));
    if (ranks.size() <= 16) part += fmt::format(" ({} {})", one ? "pid" : "pids", fmt::join(ids, ","));
    parts.push_back(std::move(part));
  }
  return fmt::format("# hosts: {}", fmt::join(parts, "; "));
}

// "# host h2 (ranks 2-3): every rank lost, ...": for each host of a run across hosts whose
// ranks all crashed (ended or fell silent without a result) while a rank of another host did
// not. Their reasons say how: every connection closed (the processes ended: killed, or the
// node failed with its network up long enough to close them), or every one fell silent (the
// host is down or cut off).
std::vector<std::string> lostHostLines(
    const std::map<std::string, std::vector<const RankResult*>>& byHost) {
  std::vector<std::string> lines;
  if (byHost.size() < 2) return lines;
  // A rank stopped from outside while it ran (`stopped`: its own snapshot at a signal, or a
  // live heartbeat at a launcher's teardown) was not lost with its host.
  const auto allCrashed = [](const std::vector<const RankResult*>& members) {
    return std::all_of(members.begin(), members.end(), [](const RankResult* rank) {
      return rank->crashed;
    });
  };
  bool someLive = false;
  for (const auto& [host, members] : byHost) someLive = someLive || !allCrashed(members);
  if (!someLive) return lines;
  for (const auto& [host, members] : byHost) {
    if (!allCrashed(members)) continue;
    const auto every = [&](const char* words) {
      return std::all_of(members.begin(), members.end(), [&](const RankResult* rank) {
        return rank->crashReason && rank->crashReason->find(words) != std::string::npos;
      });
    };
    std::vector<int> numbers;
    for (const RankResult* rank : members) numbers.push_back(rank->rank);
    const char* how =
        every("had closed") || every("ended without a result")
            ? "every process ended without a result: its processes were killed or the node "
              "failed"
        : every("fell silent")
            ? "every rank fell silent: the host is down or cut off from the others"
            : "none left a result: the node failed or was cut off, or its processes were killed";
    lines.push_back(fmt::format("# host {} ({} {}): {}", printable(host),
                                numbers.size() == 1 ? "rank" : "ranks", rankRanges(numbers), how));
  }
  return lines;
}

std::string stats(const TimingStats& timing) {
  return fmt::format("{}/{} n={}", formatSeconds(timing.p50), formatSeconds(timing.p95),
                     timing.count);
}

class ConsoleReporter final : public Reporter {
 public:
  ConsoleReporter(std::ostream& out, ConsoleOptions options) : out_(out), options_(options) {}

  void report(const ScenarioReport& report) override {
    summary_.push_back({report.invalid ? report.file : report.name, report.outcome,
                        report.info.wallSeconds, report.worldSize});
    if (report.invalid) {
      const auto& invalid = *report.invalid;
      std::ostream& errors = options_.errors != nullptr ? *options_.errors : out_;
      out_.flush();  // keeps the order when both streams are one terminal
      fmt::print(errors, "# invalid scenario {}: {}{}\n", printable(invalid.file),
                 invalid.path.empty() ? "" : printable(invalid.path) + ": ",
                 printable(invalid.message));
      errors.flush();
    } else if (!options_.quiet) {
      fmt::print(out_, "# hmc-run: {} ({} ranks, transport {}, device {}, timeout {} s)\n",
                 printable(report.name), report.worldSize, report.info.transport,
                 report.info.device, report.timeoutS);
      if (!report.description.empty()) fmt::print(out_, "# {}\n", printable(report.description));
      // The first thing that went wrong, before the table: the line a person reads first.
      if (const auto& first = report.diagnosis.first) {
        fmt::print(out_, "# first failure: {}\n", printable(first->line));
      }
      if (const auto where = whereLine(report.ranks); !where.empty()) {
        fmt::print(out_, "{}\n", where);
      }
      if (report.samples.repetitions > 1) {
        fmt::print(out_, "# {} repetitions ({} warm-up); the table shows repetition {}\n",
                   report.samples.repetitions, report.samples.warmup, report.shownRepetition);
      }
      printSteps(report);
      printDetails(report);
      fmt::print(out_, "# outcome: {} in {}\n", toString(report.outcome),
                 formatSeconds(report.info.wallSeconds));
    }
    if (options_.directory && !options_.quiet && !report.invalid) {
      fmt::print(out_, "# [{}/{}] {}: {}\n", summary_.size(), options_.total,
                 printable(report.name), toString(report.outcome));
    }
    out_.flush();
  }

  void finish(bool interrupted) override {
    if (options_.directory && !options_.quiet) {
      fmt::print(out_, "#\n# {:<40} {:>5} {:>8} {:>10}\n", "scenario", "ranks", "outcome", "wall");
      for (const auto& row : summary_) {
        fmt::print(out_, "  {:<40} {:>5} {:>8} {:>10}\n", printable(row.name), row.world,
                   toString(row.outcome), formatSeconds(row.seconds));
      }
    }
    std::map<Outcome, int> counts;
    for (const auto& row : summary_) ++counts[row.outcome];
    const std::size_t total = summary_.size();
    const int bad = static_cast<int>(total) - counts[Outcome::kPass];
    const char* plural = total == 1 ? "" : "s";
    if (interrupted) {
      fmt::print(out_,
                 "# INTERRUPTED: stopped by a signal after {} scenario{} ({} passed, {} did not "
                 "pass); the rest did not run\n",
                 total, plural, counts[Outcome::kPass], bad);
    } else if (bad == 0) {
      fmt::print(out_, "# OK: {} scenario{} passed\n", total, plural);
    } else {
      fmt::print(
          out_, "# FAILED: {} of {} scenario{} did not pass ({} fail, {} hang, {} invalid)\n", bad,
          total, plural, counts[Outcome::kFail], counts[Outcome::kHang], counts[Outcome::kInvalid]);
    }
    out_.flush();
  }

 private:
  struct Row {
    std::string name;
    Outcome outcome;
    double seconds;
    int world;
  };

  void printSteps(const ScenarioReport& report) {
    const auto& ranks = report.ranks;
    const bool wide = static_cast<int>(ranks.size()) > options_.maxRankColumns;
    std::string header = fmt::format("# {:>4}  {:<10} {:<10} ", "step", "op", "module");
    if (wide) {
      header += "ranks";
    } else {
      // Across hosts each column names its rank's host too ("rank 4 @h3").
      std::set<std::string> hosts;
      for (const auto& rank : ranks) hosts.insert(rank.host);
      for (const auto& rank : ranks) {
        std::string title = hosts.size() > 1 && !rank.host.empty()
                                ? fmt::format("rank {} @{}", rank.rank, printable(rank.host))
                                : fmt::format("rank {}", rank.rank);
        if (title.size() > 21) title.resize(21);
        header += fmt::format("{:<22}", title);
      }
    }
    fmt::print(out_, "{}\n", header);
    for (std::size_t index = 0; index < report.steps.size(); ++index) {
      const StepOutline& step = report.steps[index];
      std::string line =
          fmt::format("  {:>4}  {:<10} {:<10} ", index, toString(step.op), printable(step.module));
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
      if (step.label) line += "  " + printable(*step.label);
      fmt::print(out_, "{}\n", line);
    }
  }

  void printDetails(const ScenarioReport& report) {
    // Across hosts, a line for each host that lost every rank, and each crashed rank's host.
    const auto byHost = ranksByHost(report.ranks);
    for (const auto& line : lostHostLines(byHost)) fmt::print(out_, "{}\n", line);
    // Unexpected results, grouped by identical text so 1,024 ranks print one line; a crash
    // by text and host ("# ranks 2-3 @h2: crashed: ...").
    std::map<std::pair<std::string, std::string>, std::vector<int>> problems;
    for (const auto& rank : report.ranks) {
      if (rank.crashed || rank.stopped || rank.resultLost) {
        const std::string where =
            byHost.size() >= 2 && !rank.host.empty() ? " @" + printable(rank.host) : "";
        // A stopped rank's reason says so ("stopped by the launcher's teardown ...").
        const std::string reason = printable(rank.crashReason.value_or("exited"));
        problems[{rank.stopped      ? reason
                  : rank.resultLost ? "result lost: " + reason
                                    : "crashed: " + reason,
                  where}]
            .push_back(rank.rank);
      }
      for (const auto& step : rank.steps) {
        if (step.expected && !step.error) continue;
        const std::string text = fmt::format(
            "step {} {}: {}{}{}", step.index, toString(step.op), toString(step.status),
            step.error
                ? fmt::format(" {}: {}", toString(step.error->kind), printable(step.error->message))
                : "",
            step.expected ? " (expected)" : " (unexpected)");
        problems[{text, ""}].push_back(rank.rank);
      }
    }
    for (const auto& [problem, members] : problems) {
      fmt::print(out_, "# ranks {}{}: {}\n", rankRanges(members), problem.second, problem.first);
    }
    for (const auto& mismatch : report.mismatches) {
      if (mismatch.rank != 0 || !mismatch.firstDifference) continue;
      const ManifestDifference& first = *mismatch.firstDifference;
      fmt::print(out_,
                 "# mismatch at step {} ('{}'): rank {} differs from rank 0 at {}: rank 0 has "
                 "{}, rank {} has {}\n",
                 mismatch.step, mismatch.stage, first.rank,
                 first.index ? fmt::format("manifest entry {}", first.index->dump())
                             : std::string("the signature"),
                 first.rank0.dump(), first.rank, first.thisRank.dump());
    }
    for (const auto& consequence : report.diagnosis.consequences) {
      fmt::print(out_, "# then {}\n", printable(consequence.line));
    }
    if (report.hang) fmt::print(out_, "# hang: {}\n", printable(report.hang->diagnosis));
    const Timings& timings = report.timings;
    fmt::print(out_,
               "# timings (p50/p95, n): fresh bind {}, reused bind {}, close {}, collectives {}\n",
               stats(timings.freshBind), stats(timings.reusedBind), stats(timings.close),
               stats(timings.exchange));
    std::map<std::string, std::vector<int>> leakLines;
    for (const auto& rank : report.ranks) {
      const LeakCheck& leak = rank.leaks;
      if (!leak.checked) {
        leakLines["not checked: " + printable(leak.reason)].push_back(rank.rank);
        continue;
      }
      if (!leak.leaked() && !leak.shutdownError) continue;
      std::string text = fmt::format(
          "left after shutdown: {} groups, {} bound, {} bytes in {} workspaces, runtime {}",
          leak.groups, leak.boundGroups, leak.bytesHeld, leak.workspacesHeld,
          leak.runtimeLive ? "live" : "released");
      if (leak.device && leak.device->leaked()) {
        const DeviceLeakCheck& device = *leak.device;
        text += fmt::format("; on cuda:{}: {} bytes, {} streams, {} events, {} communicators",
                            device.device, device.bytesHeld, device.streamsHeld, device.eventsHeld,
                            device.communicatorsHeld);
      }
      if (leak.shutdownError) text += "; shutdown failed: " + printable(*leak.shutdownError);
      leakLines[text].push_back(rank.rank);
    }
    if (leakLines.empty()) {
      fmt::print(out_, "# leaks: none (automatic shutdown closed everything)\n");
    }
    for (const auto& [text, members] : leakLines) {
      fmt::print(out_, "# leaks, ranks {}: {}\n", rankRanges(members), text);
    }
    printLeakTrends(report);
  }

  // Over the cycles: every leak, then one line for the rest.
  void printLeakTrends(const ScenarioReport& report) {
    if (!report.leakTrends) {
      if (!report.leakTrendFailure.empty()) {
        fmt::print(out_, "# leak trends: {}\n", printable(report.leakTrendFailure));
      }
      return;
    }
    const LeakTrends& trends = *report.leakTrends;
    std::size_t flat = 0;
    std::size_t tooFew = 0;
    for (const TrendSeries& series : trends.series) {
      if (series.verdict == TrendVerdict::kLeak) {
        fmt::print(out_, "# leak trend, {}\n", printable(series.text));
      } else if (series.verdict == TrendVerdict::kFlat) {
        ++flat;
      } else {
        ++tooFew;
      }
    }
    if (tooFew > 0 && flat == 0) {
      fmt::print(out_,
                 "# leak trends: {} cycles ({} warm-up), too few for a trend (needs {} after the "
                 "warm-up)\n",
                 trends.cycles, trends.warmup, kMinTrendCycles);
    } else if (!trends.leaked()) {
      fmt::print(out_, "# leak trends: none over {} cycles ({} warm-up left out; {} series)\n",
                 trends.cycles - trends.warmup, trends.warmup, flat);
    }
    if (!report.leakTrendFailure.empty() && !trends.leaked()) {
      fmt::print(out_, "# leak trends: {}\n", printable(report.leakTrendFailure));
    }
  }

  std::ostream& out_;
  ConsoleOptions options_;
  std::vector<Row> summary_;
};

class JsonReporter final : public Reporter {
 public:
  explicit JsonReporter(std::string path) : path_(std::move(path)) {}
  void report(const ScenarioReport& report) override { reports_.push_back(report); }
  void finish(bool interrupted) override {
    if (reports_.empty()) return;
    json document = toJson(reports_);
    if (interrupted && reports_.size() > 1) document["interrupted"] = true;
    writeOutputFile(path_, document.dump(1) + "\n");
  }

 private:
  std::string path_;
  std::vector<ScenarioReport> reports_;
};

class HtmlReporter final : public Reporter {
 public:
  explicit HtmlReporter(std::string path) : path_(std::move(path)) {}
  void report(const ScenarioReport& report) override { reports_.push_back(report); }
  void finish(bool interrupted) override {
    if (reports_.empty()) return;
    json document = toJson(reports_);
    if (interrupted && reports_.size() > 1) document["interrupted"] = true;
    writeOutputFile(path_, render::renderHtmlReport(document));
  }

 private:
  std::string path_;
  std::vector<ScenarioReport> reports_;
};

class TraceReporter final : public Reporter {
 public:
  explicit TraceReporter(std::string path) : path_(std::move(path)) {}
  void report(const ScenarioReport& report) override {
    if (report.invalid) return;
    json trace = buildChromeTrace(report);
    const int pidBase = static_cast<int>(scenarios_) * 100000;
    for (auto& event : trace["traceEvents"]) {
      event["pid"] = event["pid"].get<int>() + pidBase;
      events_.push_back(std::move(event));
    }
    ++scenarios_;
  }
  void finish(bool) override {
    writeOutputFile(path_, json{{"traceEvents", events_}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  }

 private:
  std::string path_;
  json events_ = json::array();
  std::size_t scenarios_ = 0;
};

}  // namespace

json buildChromeTrace(const ScenarioReport& report) {
  json events = json::array();
  auto us = [](double seconds) { return seconds * 1e6; };
  // Per sequence number: the (rank, start) of each rank's slice, for flow arrows.
  std::map<std::uint64_t, std::vector<std::pair<int, double>>> bySequence;
  for (const auto& rank : report.ranks) {
    const int pid = rank.rank;
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", fmt::format("{} rank {}", report.name, rank.rank)}}}});
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
      if (step.error) {
        args["error"] = fmt::format("{}: {}", toString(step.error->kind), step.error->message);
      }
      if (step.bind) {
        args["bind"] = {{"binding_id", step.bind->bindingId},
                        {"reused", step.bind->reused},
                        {"seconds", step.bind->seconds}};
      }
      const std::string op(toString(step.op));
      events.push_back({{"ph", "X"},
                        {"pid", pid},
                        {"tid", 1},
                        {"name", step.module ? op + " " + *step.module : op},
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
                          {"args", {{"message", step.error ? step.error->message : ""}}}});
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

std::unique_ptr<Reporter> makeHtmlReporter(std::string path) {
  return std::make_unique<HtmlReporter>(std::move(path));
}

std::unique_ptr<Reporter> makeTraceReporter(std::string path) {
  return std::make_unique<TraceReporter>(std::move(path));
}

}  // namespace hmc::scenario
