#include "hmc/diagnostics/hang_diagnosis.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace hmc::diagnostics {
namespace {

std::string stepText(int step) {
  return step < 0 ? std::string("after its steps") : fmt::format("step {}", step);
}

// "0-2,5" for {0, 1, 2, 5} (sorted).
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

// Whether the ranks ran on more than one known host.
bool severalHosts(const std::vector<RankWhereabouts>& ranks) {
  std::set<std::string> hosts;
  for (const auto& rank : ranks) {
    if (!rank.host.empty()) hosts.insert(rank.host);
  }
  return hosts.size() > 1;
}

}  // namespace

bool isWaitStatus(std::string_view status) noexcept {
  return status == "timeout" || status == "rank_failure" || status == "in_flight";
}

std::string diagnoseWaits(const std::vector<RankWhereabouts>& ranks) {
  bool anyWait = false;
  for (const auto& rank : ranks) {
    if (!rank.hung) continue;
    for (const auto& entry : rank.flight) anyWait = anyWait || isWaitStatus(entry.status);
  }
  if (!anyWait) return "";
  const bool named = severalHosts(ranks);
  std::vector<std::string> parts;
  std::map<std::string, std::vector<int>> notWaitingByHost;
  for (const auto& rank : ranks) {
    const std::string who =
        named && !rank.host.empty() ? fmt::format("rank {} (host {})", rank.rank, rank.host)
                                    : fmt::format("rank {}", rank.rank);
    std::optional<FlightEntry> waiting;
    std::optional<FlightEntry> lastDone;
    for (auto it = rank.flight.rbegin(); it != rank.flight.rend(); ++it) {
      if (!waiting && !lastDone && isWaitStatus(it->status)) waiting = *it;
      if (!lastDone && !isWaitStatus(it->status)) lastDone = *it;
      if (lastDone) break;
    }
    const std::string last = lastDone ? fmt::format("last completed '{}' #{} ({})", lastDone->stage,
                                                    lastDone->sequence, stepText(lastDone->step))
                                      : std::string("no collective completed");
    if (rank.unknown) {
      parts.push_back(fmt::format("{} not known here ({})", who, *rank.unknown));
    } else if (rank.gone) {
      parts.push_back(fmt::format("{} crashed ({}); {}", who, *rank.gone, last));
    } else if (rank.hung && waiting) {
      parts.push_back(fmt::format("{} waits in '{}' #{} ({}){}", who, waiting->stage,
                                  waiting->sequence, stepText(waiting->step),
                                  waiting->status == "rank_failure" ? ", a peer failed" : ""));
      continue;
    } else {
      parts.push_back(fmt::format("{} never arrived: {}, {}", who, last, rank.elsewhere));
    }
    notWaitingByHost[rank.host.empty() ? std::string("unknown") : rank.host].push_back(rank.rank);
  }
  if (named && !notWaitingByHost.empty()) {
    std::vector<std::string> hosts;
    for (auto& [host, members] : notWaitingByHost) {
      std::sort(members.begin(), members.end());
      hosts.push_back(fmt::format("host {} ({} {})", host, members.size() == 1 ? "rank" : "ranks",
                                  rankRanges(members)));
    }
    parts.push_back(fmt::format("not waiting: {}", fmt::join(hosts, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace hmc::diagnostics
