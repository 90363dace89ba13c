#include "hmc/scenario/failure_signature.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <regex>
#include <set>

namespace hmc::scenario {
namespace {

std::string joined(const std::set<std::string>& items, std::string_view separator) {
  return fmt::format("{}", fmt::join(items, separator));
}

// The first top-level step that some rank did not do as expected, or nullopt.
std::optional<int> firstUnexpectedStep(const std::vector<RankResult>& ranks) {
  std::optional<int> first;
  for (const auto& rank : ranks) {
    for (const auto& step : rank.steps) {
      if (!step.expected && (!first || step.index < *first)) first = step.index;
    }
  }
  return first;
}

const StepResult* stepOf(const RankResult& rank, int index) {
  for (const auto& step : rank.steps) {
    if (step.index == index) return &step;
  }
  return nullptr;
}

// The stages a message names: "'recycle' #5" (every collective error starts that way; a
// collective mismatch names one per group of ranks).
void addStagesOf(const std::string& message, std::set<std::string>* stages) {
  static const std::regex kStage("'([^']+)' #[0-9]+");
  for (auto it = std::sregex_iterator(message.begin(), message.end(), kStage);
       it != std::sregex_iterator(); ++it) {
    stages->insert((*it)[1].str());
  }
}

}  // namespace

std::string maskText(std::string_view text) {
  // A stage name stays even without spaces ("'recycle' #5"): it is where the failure shows.
  static const std::regex kQuoted(R"('[^'\s]+'(?! #)|"[^"\s]+")");
  static const std::regex kNumber(R"([0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?)");
  static const std::regex kList(R"(N(\s*(,|-|\.\.)\s*N)+)");
  static const std::regex kGaveUp(R"( \(rank N gave up waiting first\))");
  std::string out = std::regex_replace(std::string(text), kQuoted, "'X'");
  out = std::regex_replace(out, kNumber, "N");
  out = std::regex_replace(out, kList, "N");
  // Which of several waiting ranks gave up first is a race, not part of the failure.
  out = std::regex_replace(out, kGaveUp, "");
  return out;
}

bool FailureSignature::sameAs(const FailureSignature& other, SameLevel level) const {
  if (kind != other.kind) return false;
  // A failure inside a repeat op shows as the repeat (the report has top-level steps only):
  // its op is unknown, so it matches any op, and a repeat that runs once can be unwrapped.
  const bool sameOp = op == other.op || op == "repeat" || other.op == "repeat";
  if (level >= SameLevel::kStage && (!sameOp || stage != other.stage)) return false;
  if (level >= SameLevel::kText && text != other.text) return false;
  if (level >= SameLevel::kAll && ranks != other.ranks) return false;
  return true;
}

std::string FailureSignature::summary() const {
  if (!fails()) return "no failure";
  std::string out(enumName(kind));
  if (!stage.empty()) out += fmt::format(" in '{}'", stage);
  if (!op.empty()) out += fmt::format(" at {}", op);
  if (!ranks.empty()) out += fmt::format("; ranks: {}", ranks);
  return out;
}

std::string FailureSignature::describe() const {
  if (!fails()) return "no failure";
  std::string out(enumName(kind));
  if (!stage.empty()) out += fmt::format(" in '{}'", stage);
  if (!op.empty()) out += fmt::format(" at {}", op);
  if (!ranks.empty()) out += fmt::format("; ranks: {}", ranks);
  if (!text.empty()) out += fmt::format("; text: {}", text);
  return out;
}

nlohmann::json FailureSignature::toJson() const {
  return {{"kind", enumName(kind)}, {"op", op}, {"stage", stage}, {"ranks", ranks}, {"text", text}};
}

FailureSignature failureSignature(const ScenarioReport& report) {
  FailureSignature signature;
  if (report.outcome == Outcome::kInvalid) {
    signature.kind = FailureKind::kError;
    if (report.invalid) signature.text = "invalid: " + maskText(report.invalid->message);
    return signature;
  }
  const auto& ranks = report.ranks;
  const bool anyCrash =
      std::any_of(ranks.begin(), ranks.end(), [](const RankResult& r) { return r.crashed; });
  const std::optional<int> index = firstUnexpectedStep(ranks);
  if (!index) {
    std::set<std::string> pattern;
    if (anyCrash) {
      signature.kind = FailureKind::kCrash;
      for (const auto& rank : ranks) pattern.insert(rank.crashed ? "crashed" : "live");
    } else if (std::any_of(ranks.begin(), ranks.end(), [](const RankResult& r) {
                 return r.leaks.checked && r.leaks.leaked();
               })) {
      // Only a shutdown that ran and left something is a leak: after an (expected) hang the
      // shutdown is skipped and what is held says nothing.
      signature.kind = FailureKind::kLeak;
      signature.stage = "shutdown";
      std::set<std::string> texts;
      for (const auto& rank : ranks) {
        pattern.insert(!rank.leaks.checked   ? "unchecked"
                       : rank.leaks.leaked() ? "leaked"
                                             : "clean");
        if (rank.leaks.shutdownError) texts.insert(maskText(*rank.leaks.shutdownError));
      }
      signature.text = joined(texts, " | ");
    } else {
      return signature;
    }
    signature.ranks = joined(pattern, ", ");
    return signature;
  }

  std::set<std::string> pattern;
  std::set<std::string> texts;
  std::set<std::string> stages;
  bool hang = false;
  bool rankFailure = false;
  bool collectiveMismatch = false;
  bool error = false;
  for (const auto& rank : ranks) {
    const StepResult* step = stepOf(rank, *index);
    if (rank.crashed && (step == nullptr || step->status == StepStatus::kNotRun)) {
      pattern.insert("crashed");
    } else {
      pattern.insert(step == nullptr ? "absent" : std::string(toString(step->status)));
    }
    if (step == nullptr) continue;
    if (signature.op.empty()) signature.op = std::string(toString(step->op));
    if (step->expected) continue;
    if (step->status == StepStatus::kHang) hang = true;
    if (step->status == StepStatus::kError) error = true;
    if (step->error) {
      rankFailure = rankFailure || step->error->kind == ErrorKind::kRankFailure;
      collectiveMismatch =
          collectiveMismatch || step->error->kind == ErrorKind::kCollectiveMismatch;
      texts.insert(
          fmt::format("{}: {}", toString(step->error->kind), maskText(step->error->message)));
      addStagesOf(step->error->message, &stages);
    } else {
      texts.insert(fmt::format("{} where an error or a hang was expected", toString(step->status)));
    }
  }
  const auto mismatch = std::find_if(report.mismatches.begin(), report.mismatches.end(),
                                     [&](const MismatchReport& m) { return m.step == *index; });
  if (anyCrash && rankFailure) {
    signature.kind = FailureKind::kCrash;
  } else if (hang) {
    signature.kind = FailureKind::kHang;
  } else if (collectiveMismatch) {
    signature.kind = FailureKind::kCollectiveMismatch;
  } else if (mismatch != report.mismatches.end()) {
    signature.kind = FailureKind::kManifestMismatch;
    if (!mismatch->stage.empty()) stages = {mismatch->stage};
  } else if (error) {
    signature.kind = FailureKind::kError;
  } else {
    signature.kind = FailureKind::kUnmet;
  }
  signature.stage = joined(stages, " / ");
  signature.ranks = joined(pattern, ", ");
  signature.text = joined(texts, " | ");
  return signature;
}

}  // namespace hmc::scenario
