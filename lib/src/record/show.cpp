#include "hmc/record/show.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

namespace hmc::record {
namespace show_detail {

using nlohmann::json;

std::string moduleName(const Recording& recording, std::int32_t module) {
  return module >= 0 && static_cast<std::size_t>(module) < recording.moduleNames.size()
             ? recording.moduleNames[static_cast<std::size_t>(module)]
             : std::string("?");
}

// A row's text in a one-line summary: quoted, and long error messages cut.
std::string quoted(const std::string& text) {
  constexpr std::size_t kMost = 160;
  if (text.size() <= kMost) return "'" + text + "'";
  return "'" + text.substr(0, kMost - 3) + "...'";
}

std::string ranksWord(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankRanges(ranks);
}

// The ranks of one row grouped by their text (std::nullopt: no event), in order of each
// group's lowest rank.
struct Group {
  std::optional<std::string> text;
  std::vector<int> ranks;
};

std::vector<Group> groupsOf(const std::vector<Recording>& recordings,
                            const std::vector<std::optional<std::string>>& cells) {
  std::vector<Group> groups;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const Group& g) { return g.text == cells[i]; });
    if (same == groups.end()) {
      groups.push_back({cells[i], {}});
      same = std::prev(groups.end());
    }
    same->ranks.push_back(recordings[i].header.rank);
  }
  return groups;
}

std::string groupText(const Group& group, const std::vector<Recording>& recordings) {
  if (group.text) return quoted(*group.text);
  // Every rank of the group ran out of events: say where its file ended (the first's).
  for (const auto& r : recordings) {
    if (r.header.rank == group.ranks.front()) {
      return fmt::format("no event ({} after {} events)",
                         group.ranks.size() == 1 ? "its recording ends" : "their recordings end",
                         r.events.size());
    }
  }
  return "no event";
}

// The detail of the first row where the ranks differ.
json divergenceOf(std::size_t row, const std::vector<Recording>& recordings,
                  const std::vector<std::optional<std::string>>& cells) {
  const std::vector<Group> groups = groupsOf(recordings, cells);
  // The reference: the text most ranks have; a tie goes to the group of the lowest rank (the
  // groups are in that order), so that two ranks read "rank 1 ... where rank 0 ...".
  std::size_t usual = 0;
  for (std::size_t g = 1; g < groups.size(); ++g) {
    if (groups[g].ranks.size() > groups[usual].ranks.size()) usual = g;
  }
  std::vector<int> differing;
  std::vector<std::string> parts;
  constexpr std::size_t kMostGroups = 4;
  std::size_t more = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g == usual) continue;
    differing.insert(differing.end(), groups[g].ranks.begin(), groups[g].ranks.end());
    if (parts.size() < kMostGroups) {
      parts.push_back(fmt::format("{} {} {}", ranksWord(groups[g].ranks),
                                  groups[g].ranks.size() == 1 ? "has" : "have",
                                  groupText(groups[g], recordings)));
    } else {
      more += groups[g].ranks.size();
    }
  }
  std::sort(differing.begin(), differing.end());
  std::string summary = fmt::format("{}", fmt::join(parts, ", "));
  if (more > 0) summary += fmt::format(", {} more ranks have other events", more);
  const Group& reference = groups[usual];
  summary +=
      fmt::format(" where {} {} {}", ranksWord(reference.ranks),
                  reference.ranks.size() == 1 ? "has" : "have", groupText(reference, recordings));
  return {{"event", row},
          {"ranks", differing},
          {"agreeing_ranks", reference.ranks},
          {"usual", reference.text ? json(*reference.text) : json()},
          {"summary", summary}};
}

}  // namespace show_detail

std::string rankRanges(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (j == i) {
      parts.push_back(std::to_string(sorted[i]));
    } else if (j == i + 1) {
      parts.push_back(std::to_string(sorted[i]));
      parts.push_back(std::to_string(sorted[j]));
    } else {
      parts.push_back(fmt::format("{}-{}", sorted[i], sorted[j]));
    }
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string describeEvent(const Recording& recording, const Event& event) {
  std::string text(toString(event.op));
  if (event.module >= 0 && static_cast<std::size_t>(event.module) < recording.moduleNames.size()) {
    text += " " + recording.moduleNames[static_cast<std::size_t>(event.module)];
  }
  const auto& d = event.detail;
  if (event.op == EventOp::kShare && d.is_object() && d.contains("modules") &&
      d["modules"].is_array()) {
    for (const auto& index : d["modules"]) {
      if (index.is_number_integer()) {
        text += " " + show_detail::moduleName(recording, index.get<std::int32_t>());
      }
    }
  }
  if (event.op == EventOp::kForward && d.is_object() && d.contains("reused")) {
    text += d["reused"].get<bool>() ? " (bound: reused)" : " (bound: created)";
  }
  if (event.op == EventOp::kFault && d.is_object()) text += " " + d.value("fault", std::string());
  if (event.outcome != Outcome::kOk) {
    text += fmt::format(": {}", toString(event.outcome));
    if (d.is_object() && d.contains("message") && d["message"].is_string()) {
      text += " (" + d["message"].get<std::string>() + ")";
    }
  }
  return text;
}

nlohmann::json showDocument(const std::vector<Recording>& recordings, const ShowOptions& options) {
  using nlohmann::json;
  json ranks = json::array();
  for (const auto& r : recordings) {
    ranks.push_back({{"rank", r.header.rank},
                     {"host", r.header.host},
                     {"pid", r.header.pid},
                     {"version", r.header.version},
                     {"events", r.events.size()},
                     {"ended", r.ended},
                     {"stop", r.ended ? std::string() : r.stop}});
  }
  std::size_t total = 0;
  for (const auto& r : recordings) total = std::max(total, r.events.size());
  const std::size_t shown = options.limit ? std::min(total, *options.limit) : total;

  std::optional<std::size_t> divergence;
  json firstDivergence;
  json firstFailure;
  // The first row that is not every rank's same successful call: the folds end before it.
  std::optional<std::size_t> opening;
  std::size_t agreed = 0;  // rows before the opening row (all of them when there is none)
  json rows = json::array();
  for (std::size_t row = 0; row < total; ++row) {
    std::vector<std::optional<std::string>> cells;
    bool failed = false;
    std::vector<int> failedRanks;
    for (const auto& r : recordings) {
      if (row < r.events.size()) {
        cells.emplace_back(describeEvent(r, r.events[row]));
        if (r.events[row].outcome != Outcome::kOk) {
          failed = true;
          failedRanks.push_back(r.header.rank);
        }
      } else {
        cells.emplace_back(std::nullopt);
      }
    }
    const bool same = std::all_of(cells.begin(), cells.end(),
                                  [&](const auto& cell) { return cell && cell == cells.front(); });
    if (!same && !divergence) {
      divergence = row;
      firstDivergence = show_detail::divergenceOf(row, recordings, cells);
    }
    // Every rank failed the same call before any divergence: the failure comes first.
    if (same && failed && !divergence && firstFailure.is_null()) {
      firstFailure = {
          {"event", row},
          {"ranks", failedRanks},
          {"summary", fmt::format("every rank has {}", show_detail::quoted(*cells.front()))}};
    }
    if (!opening) {
      if (same && !failed) {
        ++agreed;
      } else {
        opening = row;
      }
    }
    if (row < shown) {
      json texts = json::array();
      for (const auto& cell : cells) texts.push_back(cell.value_or(std::string()));
      rows.push_back({{"event", row}, {"cells", std::move(texts)}});
    }
    if (row + 1 >= shown && divergence) break;
  }

  // The agreeing rows before the opening row, less its context; only within the rows shown.
  json folds = json::array();
  if (options.fold) {
    std::size_t end = agreed;  // rows [0, end) agree
    if (opening) end = *opening >= kFoldContextRows ? *opening - kFoldContextRows : 0;
    end = std::min(end, shown);
    if (end >= kMinFoldRows) {
      // Each rank made the same calls there: count rank 0's.
      std::vector<std::pair<std::string, std::size_t>> calls;
      for (std::size_t row = 0; row < end; ++row) {
        const std::string op(toString(recordings.front().events[row].op));
        auto it = std::find_if(calls.begin(), calls.end(),
                               [&](const auto& call) { return call.first == op; });
        if (it == calls.end()) {
          calls.emplace_back(op, 1);
        } else {
          ++it->second;
        }
      }
      json counts = json::array();
      std::vector<std::string> words;
      for (const auto& [op, count] : calls) {
        counts.push_back({{"op", op}, {"count", count}});
        words.push_back(fmt::format("{} {}", count, op));
      }
      folds.push_back({{"first", 0},
                       {"last", end - 1},
                       {"events", end},
                       {"calls", std::move(counts)},
                       {"summary", fmt::format("events {}-{}: every rank the same ({} events: {})",
                                               0, end - 1, end, fmt::join(words, ", "))}});
    }
  }

  return {{"format", "hmc-record-show/1"},
          {"directory", options.directory},
          {"ranks", std::move(ranks)},
          {"total_rows", total},
          {"rows", std::move(rows)},
          {"divergence", divergence ? json(*divergence) : json()},
          {"first_divergence", std::move(firstDivergence)},
          {"first_failure", std::move(firstFailure)},
          {"folds", std::move(folds)}};
}

}  // namespace hmc::record
