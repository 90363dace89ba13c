#pragma once
// `hmc-run compare --format markdown`: the comparison as a GitHub-flavoured Markdown table
// (metric, baseline, candidate, change, p, verdict) and the overall verdict line, for a CI
// job summary ($GITHUB_STEP_SUMMARY). Pure function, thread safe.

#include <nlohmann/json.hpp>
#include <string>

namespace hmc::render {

// From the `hmc-compare/1` document. Throws hmc::ValueError for another format.
std::string renderMarkdownCompare(const nlohmann::json& compareDocument);

}  // namespace hmc::render
