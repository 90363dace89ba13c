#include "hmc/record/merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "hmc/error.hpp"

namespace hmc::record {
namespace {

using json = nlohmann::json;

// A JSON value that was stored as its text (the scratch modules dump their keys): parsed back.
json parsedKey(const json& value) {
  if (!value.is_string()) return value;
  try {
    return json::parse(value.get<std::string>());
  } catch (const std::exception&) {
    return value;
  }
}

bool isScratchSpec(const json& spec) {
  return spec.is_object() && spec.size() == 3 && spec.contains("type") &&
         spec["type"].is_string() &&
         (spec["type"] == "scratch_linear" || spec["type"] == "scratch_mlp") &&
         spec.contains("features") && spec["features"].is_number_integer() &&
         spec.contains("workspace_bytes") && spec["workspace_bytes"].is_number_integer();
}

json createStep(const Event& event, const std::string& type) {
  const json& d = event.detail;
  const json spec = parsedKey(d["spec"]);
  const json compat = parsedKey(d["compat"]);
  json step = {{"op", "create"}, {"module", d["name"]}};
  if (isScratchSpec(spec)) {
    step["type"] = spec["type"];
    step["features"] = spec["features"];
    step["workspace_bytes"] = spec["workspace_bytes"];
    if (compat != spec) step["compat"] = compat;
  } else {
    step["type"] = "scratch_linear";
    step["features"] = 16;
    step["compat"] = {{"type", type}, {"compat", compat}};
    step["label"] = fmt::format("{} {}", type.empty() ? "a module" : type, spec.dump());
  }
  const json& scope = d["scope"];
  const std::string scopeText = scope.is_string() ? scope.get<std::string>() : scope.dump();
  if (scopeText != "default") step["scope"] = scopeText;
  return step;
}

std::string deviceKind(const std::string& device) {
  return device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
}

void addExpectation(json& step, const Event& event, MergeExpect mode) {
  if (mode == MergeExpect::kObserved) {
    if (event.outcome == Outcome::kHang) step["expect"] = "hang";
    if (event.outcome == Outcome::kError) {
      step["expect"] = "error";
      step["expect_error"] = event.detail.value("message", "");
    }
    return;
  }
  if (!event.detail.is_object() || !event.detail.contains("x")) return;
  step["expect"] = event.detail["x"];
  if (event.detail.contains("xe")) step["expect_error"] = event.detail["xe"];
}

}  // namespace

bool sawPeerFail(const Recording& recording) {
  return std::any_of(recording.events.begin(), recording.events.end(), [](const Event& event) {
    return event.outcome == Outcome::kHang && event.detail.is_object() &&
           event.detail.value("kind", "") == "rank_failure";
  });
}

// The replay's step for the forward at events[i]: its dtype and device where it bound them,
// else those the module bound before (`boundDtype`, kept up to date); no backward where the
// recording says it left the backward pending.
json forwardStep(const std::vector<Event>& events, std::size_t i, const std::string& module,
                 std::map<std::int32_t, json>& boundDtype) {
  const Event& event = events[i];
  const json& d = event.detail;
  json step = {{"op", "forward"}, {"module", module}};
  if (d.is_object() && d.contains("dtype")) {
    step["dtype"] = d["dtype"];
    step["device"] = deviceKind(d.value("device", "cpu"));
    if (event.outcome == Outcome::kOk) boundDtype[event.module] = step;
  } else if (const auto bound = boundDtype.find(event.module); bound != boundDtype.end()) {
    step["dtype"] = bound->second["dtype"];
    step["device"] = bound->second["device"];
  }
  if (i + 1 < events.size() && events[i + 1].op == EventOp::kPending &&
      events[i + 1].module == event.module) {
    step["backward"] = false;
  }
  return step;
}

// The replay's step for the sleep at events[i], or none. A launcher stopped the rank at work
// outside any collective (hmc::World writes this at Open MPI's warning and at the SIGTERM): it
// stands for the rest of its work only where nothing followed it (a SIGCONT that was no
// teardown: the rank went on); `stoppedAtWork` says it did.
std::optional<json> sleepStep(const std::vector<Event>& events, std::size_t i,
                              bool& stoppedAtWork) {
  const json& d = events[i].detail;
  json step = {{"op", "sleep"}, {"seconds", d.value("seconds", 0.0)}};
  if (!d.is_object() || !d.contains("stopped_by")) return step;
  const bool last =
      std::none_of(events.begin() + static_cast<std::ptrdiff_t>(i) + 1, events.end(),
                   [](const Event& later) {
                     return later.op != EventOp::kEnd && later.op != EventOp::kType;
                   });
  if (!last) return std::nullopt;
  stoppedAtWork = true;
  step["label"] = fmt::format("stopped by {} at work outside any collective",
                              d.value("stopped_by", std::string("a signal")));
  return step;
}

std::vector<json> stepsOf(const Recording& recording, MergeExpect expect, bool deathSeen) {
  std::vector<json> steps;
  // A rank that worked outside hmc for half a deadline or more between two calls: a sleep that
  // long, so that the replay's ranks meet (or miss) each other's collectives as they did.
  const double pauseS = std::max(0.2, recording.header.timeoutS / 2);
  std::optional<std::chrono::nanoseconds> lastEnd;
  bool stoppedAtWork = false;  // its last event says a launcher stopped it at work
  std::map<std::int32_t, json> boundDtype;  // module -> the dtype it bound
  const auto nameOf = [&](std::int32_t module) {
    return module >= 0 && static_cast<std::size_t>(module) < recording.moduleNames.size()
               ? recording.moduleNames[static_cast<std::size_t>(module)]
               : std::string("?");
  };
  const auto& events = recording.events;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& event = events[i];
    const json& d = event.detail;
    if (lastEnd && event.op != EventOp::kType && event.op != EventOp::kPending) {
      const double idle = std::chrono::duration<double>(event.start - *lastEnd).count();
      if (idle >= pauseS) {
        steps.push_back({{"op", "sleep"},
                         {"seconds", std::round(idle * 10) / 10},
                         {"label", "the program worked outside hmc"}});
      }
    }
    if (event.op != EventOp::kType && event.op != EventOp::kPending) {
      lastEnd = event.start + event.duration;
    }
    json step;
    switch (event.op) {
      case EventOp::kCreate: {
        const auto index = static_cast<std::size_t>(event.module);
        step = createStep(event, index < recording.moduleTypes.size() ? recording.moduleTypes[index]
                                                                      : std::string());
        break;
      }
      case EventOp::kShare: {
        step = {{"op", "share"}, {"modules", json::array()}};
        for (const auto& index : d.value("modules", json::array())) {
          step["modules"].push_back(nameOf(index.get<std::int32_t>()));
        }
        break;
      }
      case EventOp::kForward:
        step = forwardStep(events, i, nameOf(event.module), boundDtype);
        break;
      case EventOp::kPending:
      case EventOp::kRelease:
      case EventOp::kEnd:
      case EventOp::kCapped:
      case EventOp::kType:
        continue;
      case EventOp::kBackward:
      case EventOp::kDrop:
      case EventOp::kClose:
        step = {{"op", std::string(toString(event.op))}, {"module", nameOf(event.module)}};
        break;
      case EventOp::kCloseAll:
      case EventOp::kBarrier:
        step = {{"op", std::string(toString(event.op))}};
        break;
      case EventOp::kSleep: {
        auto sleep = sleepStep(events, i, stoppedAtWork);
        if (!sleep) continue;
        step = std::move(*sleep);
        break;
      }
      case EventOp::kCheck:
        step = {{"op", "check"}};
        for (const char* key : {"groups", "bound_groups", "runtime_live"}) {
          if (d.is_object() && d.contains(key)) step[key] = d[key];
        }
        break;
      case EventOp::kFault: {
        step = {{"op", "fault"}, {"kind", d.value("fault", "stall")}};
        for (const char* key : {"count", "busy", "seconds", "resource", "bytes"}) {
          if (d.contains(key)) step[key] = d[key];
        }
        if (event.module >= 0) step["module"] = nameOf(event.module);
        break;
      }
    }
    addExpectation(step, event, expect);
    steps.push_back(std::move(step));
  }
  // Killed: it ends where its file ends, as a crash (unless it crashed by a fault already, or
  // was stopped at work: still alive when the others waited for it).
  if (!recording.ended && !recording.capped && !stoppedAtWork) {
    const bool crashed =
        !steps.empty() && steps.back()["op"] == "fault" && steps.back()["kind"] == "crash";
    if (!crashed) {
      json crash = {{"op", "fault"},
                    {"kind", "crash"},
                    {"label", "the recording ends here (the rank was killed)"}};
      // Seen by the others: the run's outcome counted it as a crash it did not ask for.
      if (deathSeen) crash["planned"] = false;
      steps.push_back(std::move(crash));
    }
  }
  return steps;
}

namespace {

struct Aligned {
  json step;
  std::string key;
  std::vector<int> ranks;
};

// Merges `steps` of `rank` into `aligned`: a longest common subsequence of the keys (after the
// common prefix and suffix); the steps of one side only keep their ranks.
void alignInto(std::vector<Aligned>& aligned, const std::vector<json>& steps, int rank) {
  std::vector<std::string> keys;
  keys.reserve(steps.size());
  for (const auto& step : steps) keys.push_back(step.dump());
  const std::size_t n = aligned.size();
  const std::size_t m = keys.size();
  std::size_t prefix = 0;
  while (prefix < n && prefix < m && aligned[prefix].key == keys[prefix]) ++prefix;
  std::size_t suffix = 0;
  while (suffix < n - prefix && suffix < m - prefix &&
         aligned[n - 1 - suffix].key == keys[m - 1 - suffix]) {
    ++suffix;
  }
  const std::size_t a = n - prefix - suffix;
  const std::size_t b = m - prefix - suffix;
  // match[i][j]: the LCS length of aligned[prefix+i..] and keys[prefix+j..]; a middle too large
  // for the table (over 16M cells) is not aligned: one side after the other.
  std::vector<std::uint32_t> table;
  const bool align = a > 0 && b > 0 && a * b <= (16u << 20);
  if (align) {
    table.assign((a + 1) * (b + 1), 0);
    for (std::size_t i = a; i-- > 0;) {
      for (std::size_t j = b; j-- > 0;) {
        table[i * (b + 1) + j] =
            aligned[prefix + i].key == keys[prefix + j]
                ? table[(i + 1) * (b + 1) + j + 1] + 1
                : std::max(table[(i + 1) * (b + 1) + j], table[i * (b + 1) + j + 1]);
      }
    }
  }
  std::vector<Aligned> out;
  out.reserve(n + b);
  for (std::size_t k = 0; k < prefix; ++k) {
    out.push_back(std::move(aligned[k]));
    out.back().ranks.push_back(rank);
  }
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < a || j < b) {
    if (align && i < a && j < b && aligned[prefix + i].key == keys[prefix + j]) {
      out.push_back(std::move(aligned[prefix + i]));
      out.back().ranks.push_back(rank);
      ++i;
      ++j;
    } else if (i < a &&
               (!align || j == b || table[(i + 1) * (b + 1) + j] >= table[i * (b + 1) + j + 1])) {
      out.push_back(std::move(aligned[prefix + i]));
      ++i;
    } else {
      out.push_back(Aligned{steps[prefix + j], keys[prefix + j], {rank}});
      ++j;
    }
  }
  for (std::size_t k = n - suffix; k < n; ++k) {
    out.push_back(std::move(aligned[k]));
    out.back().ranks.push_back(rank);
  }
  aligned = std::move(out);
}

}  // namespace

json mergeToScenario(const std::vector<Recording>& recordings, int worldSize, MergeExpect expect,
                     std::vector<std::string>& problems) {
  std::vector<Aligned> aligned;
  std::set<std::string> devices;
  std::map<std::string, int> dtypes;
  double timeoutS = 0;
  std::string name;
  // The ranks whose recording saw a peer fail, each read once.
  std::set<int> sawFail;
  for (const Recording& recording : recordings) {
    if (sawPeerFail(recording)) sawFail.insert(recording.header.rank);
  }
  for (const Recording& recording : recordings) {
    const bool deathSeen =
        sawFail.size() > sawFail.count(recording.header.rank);  // another rank saw it
    const std::vector<json> steps = stepsOf(recording, expect, deathSeen);
    for (const auto& step : steps) {
      if (step.contains("device")) devices.insert(step["device"].get<std::string>());
      if (step.contains("dtype")) ++dtypes[step["dtype"].get<std::string>()];
    }
    timeoutS = std::max(timeoutS, recording.header.timeoutS);
    if (name.empty()) name = recording.header.name;
    alignInto(aligned, steps, recording.header.rank);
  }
  std::string dtype = "float32";
  int most = 0;
  for (const auto& [candidate, count] : dtypes) {
    if (count > most) {
      most = count;
      dtype = candidate;
    }
  }
  json steps = json::array();
  for (auto& entry : aligned) {
    std::sort(entry.ranks.begin(), entry.ranks.end());
    if (static_cast<int>(entry.ranks.size()) != worldSize) entry.step["ranks"] = entry.ranks;
    if (entry.step.value("dtype", "") == dtype) entry.step.erase("dtype");
    if (devices.size() <= 1) entry.step.erase("device");
    steps.push_back(std::move(entry.step));
  }
  std::vector<int> present;
  for (const Recording& recording : recordings) present.push_back(recording.header.rank);
  std::string description =
      fmt::format("Merged by `hmc-run record merge` from the recordings of ranks {} of {} ({}).",
                  fmt::format("{}", fmt::join(present, ",")), worldSize,
                  expect == MergeExpect::kObserved ? "each step expects what it did"
                                                   : "each step expects what the program expected");
  if (!problems.empty())
    description += " Not merged: " + fmt::format("{}", fmt::join(problems, "; "));
  return {{"format", "hmc-scenario/1"},
          {"name", (name.empty() ? std::string("recording") : name) + "-replay"},
          {"description", description},
          {"world_size", worldSize},
          {"device", devices.size() == 1 ? *devices.begin() : std::string("auto")},
          {"dtype", dtype},
          {"timeout_s", timeoutS > 0 ? timeoutS : 30.0},
          {"steps", std::move(steps)}};
}

MergeResult mergeRecordings(const std::string& directory, MergeExpect expect) {
  MergeResult result;
  const auto files = recordingFiles(directory);
  if (files.empty()) {
    throw ValueError(
        fmt::format("{}: no rank-N.hmcrec recording in it; record with HMC_RECORD={} "
                    "or hmc-run --record {}",
                    directory, directory, directory));
  }
  std::vector<std::string> failed;
  for (const auto& [rank, path] : files) {
    try {
      Recording recording = readRecording(path);
      if (recording.header.rank != rank) {
        result.problems.push_back(
            fmt::format("{}: its header says rank {}, its name rank {}; "
                        "left out",
                        path, recording.header.rank, rank));
        continue;
      }
      if (!recording.stop.empty()) {
        result.problems.push_back(
            fmt::format("{}: {}; its steps stop there", path, recording.stop));
      }
      result.worldSize = std::max(result.worldSize, recording.header.worldSize);
      result.recordings.push_back(std::move(recording));
    } catch (const std::exception& error) {
      result.problems.push_back(fmt::format("{}; left out: its rank runs no steps", error.what()));
    }
  }
  if (result.recordings.empty()) {
    throw ValueError(fmt::format("{}: no rank's recording could be read:\n  {}", directory,
                                 fmt::join(result.problems, "\n  ")));
  }
  std::set<int> have;
  for (const auto& recording : result.recordings) have.insert(recording.header.rank);
  for (int rank = 0; rank < result.worldSize; ++rank) {
    if (have.count(rank) == 0 && std::none_of(files.begin(), files.end(),
                                              [rank](const auto& f) { return f.first == rank; })) {
      result.problems.push_back(
          fmt::format("{}/{}: missing (the world had {} ranks): its rank "
                      "runs no steps",
                      directory, recordingFileName(rank), result.worldSize));
    }
  }
  result.scenario = mergeToScenario(result.recordings, result.worldSize, expect, result.problems);
  return result;
}

}  // namespace hmc::record
