#include "hmc/scenario/shrinker.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>

#include "hmc/error.hpp"
#include "hmc/scenario/ddmin.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {
namespace {

using json = nlohmann::json;
using Pointer = json::json_pointer;

bool isRepeatOp(const json& step) {
  return step.is_object() && step.value("op", "") == "repeat" && step.contains("steps") &&
         step["steps"].is_array();
}

// Every list of steps, the top level first, then nested lists in document order.
void collectStepLists(const json& steps, const Pointer& at, std::vector<Pointer>* out) {
  if (!steps.is_array()) return;
  out->push_back(at);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (isRepeatOp(steps[i])) collectStepLists(steps[i]["steps"], at / i / "steps", out);
  }
}

std::vector<Pointer> stepLists(const json& scenario) {
  std::vector<Pointer> lists;
  if (scenario.contains("steps")) collectStepLists(scenario["steps"], Pointer("/steps"), &lists);
  return lists;
}

// Every step object, as (its list, its index), in document order.
std::vector<std::pair<Pointer, std::size_t>> stepsOf(const json& scenario) {
  std::vector<std::pair<Pointer, std::size_t>> steps;
  for (const auto& list : stepLists(scenario)) {
    for (std::size_t i = 0; i < scenario[list].size(); ++i) steps.emplace_back(list, i);
  }
  return steps;
}

template <typename Visit>
void forEachStep(json& steps, const Visit& visit) {
  if (!steps.is_array()) return;
  for (auto& step : steps) {
    if (!step.is_object()) continue;
    visit(step);
    if (isRepeatOp(step)) forEachStep(step["steps"], visit);
  }
}

// A step's `ranks` naming every rank of the world is the same as none: it goes.
json filterRanks(const json& steps, const std::map<int, int>& renumber) {
  json out = json::array();
  for (const auto& original : steps) {
    json step = original;
    if (step.is_object() && step.contains("ranks") && step["ranks"].is_array()) {
      json ranks = json::array();
      for (const auto& rank : step["ranks"]) {
        if (!rank.is_number_integer()) continue;
        const auto it = renumber.find(rank.get<int>());
        if (it != renumber.end()) ranks.push_back(it->second);
      }
      if (ranks.empty()) continue;
      if (ranks.size() == renumber.size()) {
        step.erase("ranks");
      } else {
        step["ranks"] = std::move(ranks);
      }
    }
    if (isRepeatOp(step)) {
      step["steps"] = filterRanks(step["steps"], renumber);
      if (step["steps"].empty()) continue;
    }
    out.push_back(std::move(step));
  }
  return out;
}

std::string moduleName(std::size_t i) {
  return i < 26 ? std::string(1, static_cast<char>('a' + i)) : fmt::format("m{}", i);
}

bool isEndPunctuation(char c) { return std::isalnum(static_cast<unsigned char>(c)) == 0; }

}  // namespace

ScenarioSize scenarioSize(const json& scenario) {
  ScenarioSize size;
  size.ranks = scenario.value("world_size", 1);
  for (const auto& list : stepLists(scenario)) size.steps += scenario[list].size();
  return size;
}

json keepRanks(const json& scenario, const std::vector<int>& kept) {
  std::map<int, int> renumber;
  for (std::size_t i = 0; i < kept.size(); ++i) renumber[kept[i]] = static_cast<int>(i);
  json out = scenario;
  out["world_size"] = kept.size();
  if (out.contains("steps")) out["steps"] = filterRanks(scenario["steps"], renumber);
  out.erase("reference_differs");  // top-level step indices that may no longer exist
  return out;
}

std::string stableFragment(const std::string& message) {
  std::string best;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= message.size(); ++i) {
    if (i == message.size() || std::isdigit(static_cast<unsigned char>(message[i])) != 0) {
      std::size_t b = begin;
      std::size_t e = i;
      while (b < e && isEndPunctuation(message[b])) ++b;
      while (e > b && isEndPunctuation(message[e - 1])) --e;
      if (e - b > best.size()) best = message.substr(b, e - b);
      begin = i + 1;
    }
  }
  return best;
}

json asTest(const json& scenario, const std::vector<RankResult>& ranks) {
  json out = scenario;
  json steps = json::array();
  const json& original = scenario["steps"];
  for (std::size_t index = 0; index < original.size(); ++index) {
    // What each rank that ran the step did: (expect, expect_error) -> ranks.
    std::map<std::pair<std::string, std::string>, std::vector<int>> groups;
    std::vector<int> notRun;
    for (const auto& rank : ranks) {
      const auto it = std::find_if(rank.steps.begin(), rank.steps.end(), [&](const StepResult& s) {
        return s.index == static_cast<int>(index);
      });
      if (it == rank.steps.end() || it->status == StepStatus::kSkipped) continue;
      if (it->status == StepStatus::kNotRun) {
        notRun.push_back(rank.rank);
        continue;
      }
      std::pair<std::string, std::string> did{std::string(toString(it->status)), ""};
      if (it->status == StepStatus::kError && it->error) {
        did.second = stableFragment(it->error->message);
      }
      groups[did].push_back(rank.rank);
    }
    const json& step = original[index];
    if (groups.empty()) {
      steps.push_back(step);
      continue;
    }
    bool first = true;
    for (const auto& [did, who] : groups) {
      json copy = step;
      copy.erase("expect");
      copy.erase("expect_error");
      if (did.first == "error" && !did.second.empty()) {
        copy["expect_error"] = did.second;
      } else {
        copy["expect"] = did.first;
      }
      if (groups.size() > 1) {
        std::vector<int> members = who;
        if (first) members.insert(members.end(), notRun.begin(), notRun.end());
        std::sort(members.begin(), members.end());
        copy["ranks"] = members;
      }
      first = false;
      steps.push_back(std::move(copy));
    }
  }
  out["steps"] = std::move(steps);
  out.erase("reference_differs");
  return out;
}

Shrinker::Shrinker(json scenario, Test test, Stop stop)
    : best_(std::move(scenario)), test_(std::move(test)), stop_(std::move(stop)) {}

bool Shrinker::attempt(const json& candidate) {
  if (stopped_ || (stop_ && stop_())) {
    stopped_ = true;
    return false;
  }
  std::string key = candidate.dump();
  if (const auto it = tried_.find(key); it != tried_.end()) return it->second;
  bool same = false;
  try {
    (void)parseScenario(candidate, "<candidate>");
    ++trials_;
    same = test_(candidate);
  } catch (const ScenarioError&) {
    same = false;  // not a valid scenario: never run
  }
  tried_.emplace(std::move(key), same);
  if (same) best_ = candidate;
  return same;
}

const json& Shrinker::run() {
  while (!stopped_) {
    bool changed = reduceStepLists();
    changed = reduceRanks() || changed;
    changed = reduceRepeats() || changed;
    if (!changed) {
      changed = reduceSizes() || changed;
      changed = renameModules() || changed;
      changed = dropDecorations() || changed;
      changed = dropExpectations() || changed;
    }
    if (!changed) break;
  }
  return best_;
}

bool Shrinker::reduceRanks() {
  const int world = best_.value("world_size", 1);
  if (world < 2 || stopped_) return false;
  const json base = best_;
  const auto kept = ddmin(
      static_cast<std::size_t>(world),
      [&](const std::vector<std::size_t>& subset) {
        return attempt(keepRanks(base, std::vector<int>(subset.begin(), subset.end())));
      },
      [this] { return stopped_; });
  return kept.size() < static_cast<std::size_t>(world);
}

bool Shrinker::reduceStepLists() {
  bool changed = false;
  for (const auto& list : stepLists(best_)) {
    if (stopped_) break;
    if (!best_.contains(list) || !best_[list].is_array() || best_[list].size() < 2) continue;
    const json base = best_;
    const std::size_t count = base[list].size();
    const auto kept = ddmin(
        count,
        [&](const std::vector<std::size_t>& subset) {
          json candidate = base;
          json steps = json::array();
          for (const std::size_t i : subset) steps.push_back(base[list][i]);
          candidate[list] = std::move(steps);
          candidate.erase("reference_differs");
          return attempt(candidate);
        },
        [this] { return stopped_; });
    changed = changed || kept.size() < count;
  }
  return changed;
}

bool Shrinker::shrinkNumber(const Pointer& pointer, double floor) {
  if (!best_.contains(pointer) || !best_[pointer].is_number()) return false;
  const bool integer = best_[pointer].is_number_integer();
  double value = best_[pointer].get<double>();
  if (value <= floor) return false;
  auto with = [&](double v) {
    json candidate = best_;
    if (integer) {
      candidate[pointer] = static_cast<std::int64_t>(v);
    } else {
      candidate[pointer] = v;
    }
    return candidate;
  };
  if (attempt(with(floor))) return true;
  bool changed = false;
  for (int i = 0; i < 20 && !stopped_; ++i) {
    const double half =
        integer ? static_cast<double>(static_cast<std::int64_t>(value / 2)) : value / 2;
    if (half <= floor || half >= value || !attempt(with(half))) break;
    value = half;
    changed = true;
  }
  return changed;
}

bool Shrinker::reduceRepeats() {
  bool changed = false;
  for (const auto& [list, index] : stepsOf(best_)) {
    if (stopped_) break;
    const Pointer at = list / index;
    if (!best_.contains(at)) continue;
    if (best_[at].contains("repeat")) changed = shrinkNumber(at / "repeat", 1) || changed;
    if (!isRepeatOp(best_[at])) continue;
    changed = shrinkNumber(at / "count", 1) || changed;
    const json& step = best_[at];
    if (step.value("count", 1) != 1 || step.value("repeat", 1) != 1 || step.contains("expect") ||
        step.contains("expect_error")) {
      continue;
    }
    // A repeat op that runs once: its steps in its place, limited to its ranks.
    json inlined = json::array();
    for (json nested : step["steps"]) {
      if (step.contains("ranks")) {
        std::set<int> outer;
        for (const auto& r : step["ranks"]) outer.insert(r.get<int>());
        if (nested.contains("ranks")) {
          json both = json::array();
          for (const auto& r : nested["ranks"]) {
            if (outer.count(r.get<int>()) != 0) both.push_back(r);
          }
          if (both.empty()) continue;
          nested["ranks"] = std::move(both);
        } else {
          nested["ranks"] = step["ranks"];
        }
      }
      inlined.push_back(std::move(nested));
    }
    json candidate = best_;
    json& parent = candidate[list];
    parent.erase(parent.begin() + static_cast<std::ptrdiff_t>(index));
    parent.insert(parent.begin() + static_cast<std::ptrdiff_t>(index), inlined.begin(),
                  inlined.end());
    if (attempt(candidate)) return true;  // pointers past this one moved
  }
  return changed;
}

bool Shrinker::reduceSizes() {
  if (stopped_) return false;
  // Everything at its floor at once first: one trial where sizes do not matter.
  json all = best_;
  forEachStep(all["steps"], [](json& step) {
    const std::string op = step.value("op", "");
    if (op == "create") {
      step["features"] = 1;
      if (step.contains("workspace_bytes")) step["workspace_bytes"] = 0;
    }
    if (op == "forward") step["batch"] = 1;
    if (op == "sleep" || (op == "fault" && step.value("kind", "") == "stall")) step["seconds"] = 0;
    if (op == "fault" && step.contains("count")) step["count"] = 1;
  });
  if (all != best_ && attempt(all)) return true;
  bool changed = false;
  for (const auto& [list, index] : stepsOf(best_)) {
    if (stopped_) break;
    const Pointer at = list / index;
    if (!best_.contains(at)) continue;
    const std::string op = best_[at].value("op", "");
    if (op == "create") {
      changed = shrinkNumber(at / "features", 1) || changed;
      changed = shrinkNumber(at / "workspace_bytes", 0) || changed;
    } else if (op == "forward") {
      changed = shrinkNumber(at / "batch", 1) || changed;
    } else if (op == "sleep" || op == "fault") {
      changed = shrinkNumber(at / "seconds", 0) || changed;
      if (op == "fault") changed = shrinkNumber(at / "count", 1) || changed;
    }
  }
  return changed;
}

bool Shrinker::renameModules() {
  if (stopped_) return false;
  std::map<std::string, std::string> names;
  auto name = [&names](const json& value) {
    if (value.is_string() && names.count(value.get<std::string>()) == 0) {
      const std::string next = moduleName(names.size());
      names.emplace(value.get<std::string>(), next);
    }
  };
  json candidate = best_;
  forEachStep(candidate["steps"], [&](json& step) {
    if (step.contains("module")) name(step["module"]);
    if (step.contains("modules") && step["modules"].is_array()) {
      for (const auto& m : step["modules"]) name(m);
    }
  });
  forEachStep(candidate["steps"], [&](json& step) {
    if (step.contains("module") && step["module"].is_string()) {
      step["module"] = names[step["module"].get<std::string>()];
    }
    if (step.contains("modules") && step["modules"].is_array()) {
      for (auto& m : step["modules"]) {
        if (m.is_string()) m = names[m.get<std::string>()];
      }
    }
  });
  return candidate != best_ && attempt(candidate);
}

bool Shrinker::dropDecorations() {
  if (stopped_) return false;
  json candidate = best_;
  candidate.erase("description");
  candidate.erase("reference_differs");
  forEachStep(candidate["steps"], [](json& step) { step.erase("label"); });
  return candidate != best_ && attempt(candidate);
}

bool Shrinker::dropExpectations() {
  bool changed = false;
  for (const auto& [list, index] : stepsOf(best_)) {
    if (stopped_) break;
    const Pointer at = list / index;
    if (!best_.contains(at)) continue;
    if (!best_[at].contains("expect") && !best_[at].contains("expect_error")) continue;
    json candidate = best_;
    candidate[at].erase("expect");
    candidate[at].erase("expect_error");
    changed = attempt(candidate) || changed;
  }
  return changed;
}

}  // namespace hmc::scenario
