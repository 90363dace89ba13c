#include "failure.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "hmc/render/html.hpp"
#include "page.hpp"

namespace hmc::render::detail {

using nlohmann::json;

namespace {

constexpr std::string_view kFollowsSuffix = " (follows from the first failure)";

const json* firstOf(const json& document) {
  const json* first = child(document, "first_failure");
  return first != nullptr && first->is_object() ? first : nullptr;
}

std::vector<long long> ranksOf(const json& value, std::string_view key) {
  std::vector<long long> ranks;
  if (const json* list = arrayOf(value, key)) {
    for (const auto& rank : *list) {
      if (rank.is_number_integer()) ranks.push_back(rank.get<long long>());
    }
  }
  return ranks;
}

std::string kindWords(const std::string& kind) {
  if (kind == "stopped") return "stopped by a signal";
  if (kind == "unmet") return "unmet expectation";
  std::string words = kind.empty() ? "failure" : kind;
  std::replace(words.begin(), words.end(), '_', ' ');
  return words;
}

// "'close validation' #26, step 4": where the failure happened, "" when the document says not.
std::string whereOf(const json& first) {
  std::string where;
  if (!textOf(first, "stage").empty()) where = "'" + textOf(first, "stage") + "'";
  if (const auto sequence = integerOf(first, "sequence")) {
    where += fmt::format("{}#{}", where.empty() ? "collective " : " ", *sequence);
  }
  if (const auto step = integerOf(first, "step")) {
    where += fmt::format("{}step {}", where.empty() ? "" : ", ", *step);
  }
  return where;
}

std::string rankWords(const std::vector<long long>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", rangesOf(ranks));
}

void factRow(std::string& out, const char* title, const std::string& html) {
  out += fmt::format("<tr><th>{}</th><td>{}</td></tr>", title, html);
}

void failureFacts(std::string& out, const json& first) {
  out += "<table class=\"ff-facts\">";  // the kind is the block's heading
  const std::string where = whereOf(first);
  if (!where.empty()) factRow(out, "where", esc(where));
  const std::vector<long long> named = ranksOf(first, "ranks");
  if (!named.empty()) {
    factRow(out, "named ranks",
            "<strong>" + esc(clip(rankWords(named), 400)) + "</strong> " +
                failurePartTag(FailurePart::kCause));
  }
  if (const json* hosts = arrayOf(first, "hosts"); hosts != nullptr && !hosts->empty()) {
    std::string list;
    std::size_t shown = 0;
    for (const auto& host : *hosts) {
      if (shown++ >= kMaxTableRanks) {
        list += fmt::format(", \u2026 ({} in all)", hosts->size());
        break;
      }
      list += (list.empty() ? "" : ", ") + std::string("<code>") +
              esc(host.is_string() ? host.get<std::string>() : host.dump()) + "</code>";
    }
    factRow(out, hosts->size() == 1 ? "host" : "hosts", list);
  }
  const std::vector<long long> seen = ranksOf(first, "seen_by");
  if (!seen.empty()) factRow(out, "seen by", esc(clip(rankWords(seen), 400)));
  out += "</table>";
  const json* detail = child(first, "detail");
  if (detail != nullptr && !detail->empty()) {
    out += "<details><summary>detail</summary><pre class=\"mono\">" +
           esc(clip(detail->dump(2, ' ', false, json::error_handler_t::replace), 4000)) +
           "</pre></details>";
  }
}

void whatFollowed(std::string& out, const json& document, const std::string& id) {
  const json* consequences = arrayOf(document, "consequences");
  if (consequences == nullptr || consequences->empty()) return;
  out += "<div class=\"callout follows\" id=\"" + id +
         "-what-followed\"><strong class=\"head\">What followed</strong><ul class=\"follows\">";
  std::size_t shown = 0;
  for (const auto& consequence : *consequences) {
    if (shown++ >= kMaxTableRanks) break;
    std::string line = textOf(consequence, "line");
    if (line.size() >= kFollowsSuffix.size() &&
        line.compare(line.size() - kFollowsSuffix.size(), kFollowsSuffix.size(), kFollowsSuffix) ==
            0) {
      line.resize(line.size() - kFollowsSuffix.size());  // the tag says it
    }
    const auto rank = integerOf(consequence, "rank");
    out += fmt::format("<li data-rank=\"{}\">{} <span class=\"mono\">{}</span></li>",
                       rank ? std::to_string(*rank) : "", failurePartTag(FailurePart::kFollows),
                       esc(clip(line, 600)));
  }
  out += "</ul>";
  if (consequences->size() > kMaxTableRanks) {
    out += fmt::format("<div class=\"note\">{} more in the JSON document</div>",
                       consequences->size() - kMaxTableRanks);
  }
  out += "</div>\n";
}

}  // namespace

FailureParts failurePartsOf(const json& document) {
  FailureParts parts;
  const json* first = firstOf(document);
  if (first == nullptr) return parts;
  parts.present = true;
  for (const long long rank : ranksOf(*first, "seen_by")) parts.byRank[rank] = FailurePart::kSaw;
  for (const auto& consequence : objectOf(arrayOf(document, "consequences"))) {
    if (const auto rank = integerOf(consequence, "rank"))
      parts.byRank[*rank] = FailurePart::kFollows;
  }
  for (const long long rank : ranksOf(*first, "ranks")) parts.byRank[rank] = FailurePart::kCause;
  return parts;
}

const char* failurePartWords(FailurePart part) {
  switch (part) {
    case FailurePart::kCause:
      return "the first failure";
    case FailurePart::kFollows:
      return "follows from the first failure";
    case FailurePart::kSaw:
      return "saw the first failure";
    case FailurePart::kNone:
      break;
  }
  return "";
}

const char* failurePartClass(FailurePart part) {
  switch (part) {
    case FailurePart::kCause:
      return "cause";
    case FailurePart::kFollows:
      return "follows";
    case FailurePart::kSaw:
      return "saw";
    case FailurePart::kNone:
      break;
  }
  return "";
}

std::string failurePartTag(FailurePart part) {
  if (part == FailurePart::kNone) return "";
  return fmt::format("<span class=\"tag part-{}\">{}</span>", failurePartClass(part),
                     failurePartWords(part));
}

std::string firstFailureLine(const json& document) {
  const json* first = firstOf(document);
  return first != nullptr ? textOf(*first, "line") : "";
}

void firstFailureBlock(std::string& out, const json& document, const std::string& id) {
  const json* first = firstOf(document);
  if (first == nullptr) return;
  const std::string kind = textOf(*first, "kind");
  const char* colour = kind == "hang" ? "hang" : kind == "leak" ? "leak" : "fail";
  out += fmt::format(
      "<div class=\"callout first-failure {}\" id=\"{}-first-failure\" data-kind=\"{}\" "
      "data-ranks=\"{}\"><strong class=\"head\">First failure: {}</strong>",
      colour, id, esc(kind), esc(clip(rangesOf(ranksOf(*first, "ranks")), 400)),
      esc(kindWords(kind)));
  out += "<p class=\"ff-line\">" + esc(clip(textOf(*first, "line"), 2000)) + "</p>";
  failureFacts(out, *first);
  out += "</div>\n";
  whatFollowed(out, document, id);
}

std::string rangesOf(std::vector<long long> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += out.empty() ? "" : ", ";
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

}  // namespace hmc::render::detail
