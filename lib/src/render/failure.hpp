#pragma once
// The first failure of a verdict document (hmc-report/1, hmc-world-end/1; see
// hmc/diagnostics/diagnosis.hpp) as a page shows it: one block read first ("First failure", then
// "What followed"), and each rank's part in it for the rows that show a rank. A document from
// an older hmc has no `first_failure`: no block, no part.

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hmc::render::detail {

// What a rank has to do with the first failure.
enum class FailurePart {
  kNone,
  kCause,    // first_failure.ranks names it
  kFollows,  // its failure is one of the consequences
  kSaw,      // first_failure.seen_by: its own record shows the failure
};

struct FailureParts {
  bool present = false;  // the document has a first failure
  std::map<long long, FailurePart> byRank;

  FailurePart of(long long rank) const {
    const auto it = byRank.find(rank);
    return it == byRank.end() ? FailurePart::kNone : it->second;
  }
};

// Each rank's part: a named rank is the cause even where it also saw it or failed later.
FailureParts failurePartsOf(const nlohmann::json& document);

// "the first failure", "follows from the first failure", "saw the first failure", "".
const char* failurePartWords(FailurePart part);
// "cause", "follows", "saw", "": the part's CSS class is part-<this>.
const char* failurePartClass(FailurePart part);
// <span class="tag part-cause">the first failure</span>, or "" for kNone.
std::string failurePartTag(FailurePart part);

// The first failure's line (the one a person reads first), or "" when there is none.
std::string firstFailureLine(const nlohmann::json& document);

// The block: "First failure" with its line, kind, where, the ranks it names and their hosts,
// who saw it and its detail; then "What followed" with each consequence, labelled as following
// from it. Ids `<id>-first-failure` and `<id>-what-followed`. Nothing when the document has no
// first failure (a pass, or an older hmc).
void firstFailureBlock(std::string& out, const nlohmann::json& document, const std::string& id);

// "0-3, 5, 7-8"
std::string rangesOf(std::vector<long long> ranks);

}  // namespace hmc::render::detail
