#pragma once
// The signature of a scenario run's failure: what `hmc-run shrink` keeps fixed while it makes a
// failing scenario smaller ("fails the same way"). Computed from the report alone, so that it
// does not depend on how many ranks or steps there were, or on the deadline:
// - kind: hang, collective mismatch, manifest mismatch, error, unmet (an expected error or hang
//   did not happen), crash, leak;
// - op: the op of the first top-level step some rank did not do as expected;
// - stage: the collective stage where the failure shows ("close validation", "recycle");
// - ranks: the pattern of what the ranks did at that step (the distinct statuses, "crashed"
//   for a rank that crashed), never rank numbers or counts;
// - text: the error messages there, numbers, rank lists and quoted names masked (maskText).
// Torch-free and pure: thread-safe.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "hmc/enum_names.hpp"
#include "hmc/scenario/report.hpp"

namespace hmc::scenario {

enum class FailureKind {
  kNone,
  kHang,
  kCollectiveMismatch,
  kManifestMismatch,
  kError,
  kUnmet,
  kCrash,
  kLeak,
};
inline constexpr EnumName<FailureKind> kFailureKindNames[] = {
    {FailureKind::kNone, "none"},
    {FailureKind::kHang, "hang"},
    {FailureKind::kCollectiveMismatch, "collective mismatch"},
    {FailureKind::kManifestMismatch, "manifest mismatch"},
    {FailureKind::kError, "error"},
    {FailureKind::kUnmet, "unmet"},
    {FailureKind::kCrash, "crash"},
    {FailureKind::kLeak, "leak"},
};
constexpr EnumTable<FailureKind> enumTable(FailureKind) {
  return {"failure kind", kFailureKindNames};
}

// How much of two signatures must agree (`hmc-run shrink --same`), loosest first; each level
// includes the ones before it.
enum class SameLevel {
  kOutcome,  // the kind only
  kStage,    // kind, op and stage
  kText,     // ... and the masked error text
  kAll,      // ... and the ranks' pattern (the default)
};
inline constexpr EnumName<SameLevel> kSameLevelNames[] = {
    {SameLevel::kOutcome, "outcome"},
    {SameLevel::kStage, "stage"},
    {SameLevel::kText, "text"},
    {SameLevel::kAll, "all"},
};
constexpr EnumTable<SameLevel> enumTable(SameLevel) { return {"--same level", kSameLevelNames}; }

struct FailureSignature {
  FailureKind kind = FailureKind::kNone;
  std::string op;     // "" for none (a leak, a crash without a failing step)
  std::string stage;  // "" where no collective shows it; "a / b" for several
  std::string ranks;  // "hang, skipped": the distinct per-rank statuses, sorted
  std::string text;   // masked messages, distinct and sorted, joined with " | "

  bool fails() const noexcept { return kind != FailureKind::kNone; }
  // Whether `other` is the same failure at `level`. An op "repeat" (a failure inside a repeat
  // op, whose nested op the report does not say) matches any op.
  bool sameAs(const FailureSignature& other, SameLevel level) const;
  // "hang in 'close validation' at close_all; ranks: hang, skipped; text: timeout: ..."
  std::string describe() const;
  // describe() without the text: "hang in 'close validation' at close_all; ranks: hang, skipped"
  std::string summary() const;
  nlohmann::json toJson() const;
};

// The signature of a report's failure; kind kNone when the run passed without a leak (a rank
// whose automatic shutdown ran and left resources held). An invalid report (no rank ran) is
// kError with the parse message.
FailureSignature failureSignature(const ScenarioReport& report);

// An error message with what changes from run to run and from world to world masked: numbers
// (integers, decimals) become N, lists and ranges of them ("[0, 1, 5]", "0-14") one N, and a
// quoted token without spaces ('a', "module_17") 'X'. A stage ("'recycle' #5", or quoted text
// with spaces such as 'close validation') stays.
std::string maskText(std::string_view text);

}  // namespace hmc::scenario
