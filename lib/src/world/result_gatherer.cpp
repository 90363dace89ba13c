#include "hmc/world/result_gatherer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/job_status.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/host.hpp"
#include "hmc/world/missing_ranks.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/run_keys.hpp"

namespace hmc::world {

bool waitForKeys(collective::KeyValueStore& kv, const std::vector<std::string>& keys,
                 Clock::time_point deadline) {
  while (true) {
    if (kv.check(keys)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<std::string> SilentRanks::check(collective::KeyValueStore& kv, int rank, int self,
                                              Clock::time_point now, double unixNow) {
  std::string problem;
  const auto read = diagnostics::readHeartbeat(kv, rank, std::chrono::milliseconds(500), &problem);
  if (!read) {
    if (!problem.empty()) spdlog::debug("rank {}: rank {}'s heartbeat: {}", self, rank, problem);
    return std::nullopt;
  }
  const diagnostics::Heartbeat& beat = *read;
  // When that beat was written, on this clock: its age by the writer's system clock where the
  // hosts' clocks agree on that much (a beat "from the future" counts from now), so that a rank
  // silent since long before this rank first looked is known at once.
  const auto age = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      beat.writtenAtUnix > 0 ? std::max(0.0, unixNow - beat.writtenAtUnix) : 0.0));
  auto [seen, first] = seen_.try_emplace(rank, Seen{beat.beat, now - age});
  if (!first && seen->second.beat != beat.beat) seen->second = Seen{beat.beat, now - age};
  const auto unchanged = now - seen->second.since;
  const std::string host = beat.host.empty() ? std::string() : fmt::format(" (host {})", beat.host);
  const double silentS = std::chrono::duration<double>(unchanged).count();
  if (beat.state == diagnostics::RankState::kWaiting && beat.current) {
    const auto inStage = std::chrono::duration<double>(beat.inStageS) + unchanged;
    if (unchanged < kSilentAfter || inStage < deadline_ + kDeadlineSlack) return std::nullopt;
    return fmt::format(
        "rank {}{} fell silent: no heartbeat for {:.1f} s while it waited in '{}' (step {}), "
        "{:.1f} s past that collective's deadline (seen by rank {}): its host is down or cut "
        "off, or the rank is stopped",
        rank, host, silentS, beat.current->stage, beat.current->step,
        std::chrono::duration<double>(inStage - deadline_).count(), self);
  }
  const bool outsideSteps = beat.state == diagnostics::RankState::kStarting ||
                            beat.state == diagnostics::RankState::kDone;
  if (outsideSteps && !awaitingResults_) return std::nullopt;  // see awaitResults()
  if (unchanged < std::max<Clock::duration>(kSilentAfter, deadline_)) return std::nullopt;
  // Results that have not followed its last beat in seconds are not coming (its host cut off
  // as it published them: chaos --modes hosts --run-seed 135353714 waited 2 s more for them).
  const std::string doing =
      beat.state == diagnostics::RankState::kDone ? std::string("after its steps")
      : beat.state == diagnostics::RankState::kStarting
          ? std::string("before its steps (a short plan runs between two beats)")
          : fmt::format("while it ran step {}", beat.step);
  return fmt::format(
      "rank {}{} fell silent: no heartbeat for {:.1f} s (a collective's deadline) {} (seen by "
      "rank {}): its host is down or cut off, or the rank is stopped",
      rank, host, silentS, doing, self);
}

namespace {

void announceGone(collective::KeyValueStore& kv, int rank, int self, const std::string& why) {
  try {
    if (!kv.check({collective::deadRankKey(rank)})) collective::announceDeadRank(kv, rank, why);
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: cannot announce rank {}'s end in the store: {}", self, rank,
                  error.what());
  }
}

}  // namespace

bool rankGone(collective::KeyValueStore& kv, const EvidenceFolder* folder, int rank, int self,
              SilentRanks* silent) {
  if (folder != nullptr && folder->ended(rank)) {
    announceGone(kv, rank, self,
                 fmt::format("rank {}'s process ended (seen by rank {} on its node)", rank, self));
    return true;
  }
  if (kv.check({collective::kAnyDeadKey}) && kv.check({collective::deadRankKey(rank)})) {
    return true;
  }
  if (silent == nullptr) return false;
  const auto why = silent->check(kv, rank, self);
  if (!why) return false;
  spdlog::debug("rank {}: {}", self, *why);
  announceGone(kv, rank, self, *why);
  return true;
}

bool waitForRanks(collective::KeyValueStore& kv, const std::function<std::string(int)>& keyOf,
                  int worldSize, Clock::time_point deadline, const EvidenceFolder* folder, int self,
                  SilentRanks* silent) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < worldSize; ++rank) keys.push_back(keyOf(rank));
  for (int round = 0;; ++round) {
    if (kv.check(keys)) return true;
    if (round % 10 == 9) {  // every ~50 ms
      for (int rank = 0; rank < worldSize; ++rank) {
        if (!kv.check({keys[rank]}) && rankGone(kv, folder, rank, self, silent)) return false;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ranksAtWork(collective::KeyValueStore& kv, const std::string& endpoint,
                 const std::vector<int>& ranks, std::chrono::milliseconds request) {
  try {
    const diagnostics::JobStatus status = diagnostics::readJobStatus(kv, endpoint, request);
    for (const int rank : ranks) {
      if (rank >= static_cast<int>(status.ranks.size())) return false;
      const auto& each = status.ranks[rank];
      if (each.dead || each.stale || !each.heartbeat ||
          each.heartbeat->state != diagnostics::RankState::kRunning) {
        return false;
      }
    }
    return !ranks.empty();
  } catch (const std::exception&) {
    return false;
  }
}

namespace {

// Asks `closedPeers` again every 10 ms, each answer replacing `closed`, until `rank` is in it
// (true) or `until` passes (false): the wait of kClosingGrace.
bool closesBy(const collective::Collective::ClosedPeers& closedPeers, std::vector<int>& closed,
              int rank, Clock::time_point until) {
  while (Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    closed = closedPeers();
    if (std::find(closed.begin(), closed.end(), rank) != closed.end()) return true;
  }
  return false;
}

// Polls for rank `rank`'s `key` until it exists (true), the rank is gone (rankGone), or
// `deadline` passes.
bool waitForRankKey(collective::KeyValueStore& kv, const std::string& key, int rank,
                    Clock::time_point deadline, const EvidenceFolder* folder, int self,
                    SilentRanks* silent) {
  for (int round = 0;; ++round) {
    if (kv.check({key})) return true;
    if (round % 10 == 9 && rankGone(kv, folder, rank, self, silent)) return kv.check({key});
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

ResultsByRank readLocalResults(const EvidenceFolder& local, int worldSize, int self,
                               Clock::time_point deadline,
                               std::optional<std::chrono::milliseconds> earlyAfter) {
  ResultsByRank found;
  if (!local.usable()) return found;
  const auto earlyFrom = earlyAfter ? Clock::now() + *earlyAfter : Clock::time_point::max();
  const auto take = [&](int rank, const std::string& text) {
    try {
      found[rank] = parseRankResults(text);
      return true;
    } catch (const std::exception& error) {
      spdlog::warn("rank {} wrote unreadable results to {}: {}", rank, local.path(), error.what());
      return false;
    }
  };
  for (;;) {
    bool pending = false;
    const bool early = Clock::now() >= earlyFrom;
    for (int rank = 0; rank < worldSize; ++rank) {
      if (rank == self || found.count(rank) != 0) continue;
      if (auto text = local.readResults(rank); text && take(rank, *text)) continue;
      if (early) {
        if (auto text = local.readResults(rank, true); text && take(rank, *text)) continue;
      }
      pending = pending || local.alive(rank);
    }
    if (!pending || Clock::now() >= deadline) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::vector<scenario::RankResult>> gatherResults(
    collective::KeyValueStore* kv, const RankPlacement& placement, ResultsByRank local,
    std::chrono::milliseconds wait, const MissingWhy& missingWhy, const EvidenceFolder& folder,
    SilentRanks* silent, const collective::Collective::ClosedPeers& closedPeers,
    bool atTeardown) {
  const int self = placement.rank;
  std::vector<std::vector<scenario::RankResult>> byRank(placement.worldSize);
  const auto deadline = Clock::now() + wait;
  if (silent != nullptr) silent->awaitResults();
  std::string storeFailed;
  const auto fromStore = [&](auto&& read) {
    if (kv == nullptr || !storeFailed.empty()) return;
    try {
      read();
    } catch (const std::exception& error) {
      // Debug level only: in a launcher's teardown the launcher may stop reading this rank's
      // stderr, and a blocked write would hold the log's lock that the report path needs.
      storeFailed = error.what();
      spdlog::debug("rank {}: the store failed while gathering results: {}", self, storeFailed);
    }
  };
  for (int rank = 0; rank < placement.worldSize; ++rank) {
    if (auto it = local.find(rank); it != local.end()) {
      byRank[rank] = std::move(it->second);
      continue;
    }
    fromStore([&] {
      const std::string key = keys::result(rank);
      if (!waitForRankKey(*kv, key, rank, deadline, &folder, self, silent)) return;
      const std::string text = kv->get(key, wait + kStoreReadMargin);
      try {
        byRank[rank] = parseRankResults(text);
      } catch (const std::exception& error) {
        spdlog::warn("rank {} sent unreadable results: {}", rank, error.what());
      }
    });
  }
  std::vector<int> closed;
  std::vector<bool> missing;  // by rank (byRank itself is moved into fillMissing)
  for (const auto& results : byRank) missing.push_back(results.empty());
  const bool someMissing = std::find(missing.begin(), missing.end(), true) != missing.end();
  if (closedPeers && someMissing) {
    closed = closedPeers();
    spdlog::debug("rank {}: closed connections of ranks {}", self,
                  collective::formatRankList(closed));
  }
  const auto isClosed = [&](int rank) {
    return std::find(closed.begin(), closed.end(), rank) != closed.end();
  };
  // A rank that looks alive and waiting may have died a moment ago with a rank whose
  // connection already shows closed (its host's processes killed one by one): asked again
  // until kClosingGrace after the first answer, within half the margin that gatherEveryRank
  // gives this read beyond `wait` (the rest is for the reads below).
  const auto graceEnd = std::min(Clock::now() + kClosingGrace, deadline + kStoreReadMargin / 2);
  const auto closesSoon = [&](int rank) {
    const bool missingClosed = std::any_of(closed.begin(), closed.end(), [&](int peer) {
      return peer >= 0 && peer < static_cast<int>(missing.size()) && missing[peer];
    });
    if (!missingClosed || !closesBy(closedPeers, closed, rank, graceEnd)) return false;
    spdlog::debug("rank {}: rank {}'s connection closed during the grace", self, rank);
    return true;
  };
  // Where a rank without results was: its heartbeat (every rank writes one at least every
  // second), else the flight record its watchdog published at a deadline.
  std::optional<std::map<int, diagnostics::PublishedFlight>> published;
  const EvidenceOf evidenceOf = [&](int rank) {
    MissingRankEvidence evidence;
    evidence.reason = missingWhy(rank);
    evidence.leakReason = "no result from this rank: not checked";
    evidence.ended = folder.ended(rank);
    evidence.atTeardown = atTeardown;
    fromStore([&] {
      std::string problem;
      evidence.heartbeat =
          diagnostics::readHeartbeat(*kv, rank, std::chrono::milliseconds(500), &problem);
      if (!problem.empty()) spdlog::debug("rank {}'s heartbeat: {}", rank, problem);
    });
    const bool waiting =
        evidence.heartbeat && evidence.heartbeat->state == diagnostics::RankState::kWaiting;
    if (!evidence.ended && (isClosed(rank) || (waiting && closesSoon(rank)))) {
      evidence.ended = true;
      evidence.reason = fmt::format(
          "no result from rank {}: its connection with rank {} had closed: its process ended "
          "(killed, crashed, or stopped by the same teardown; did its node fail?)",
          rank, self);
    }
    if (const auto pid = folder.pidOf(rank)) {  // a rank of this node
      evidence.host = hostName();
      evidence.pid = *pid;
    } else if (!evidence.heartbeat || evidence.heartbeat->host.empty()) {
      // No heartbeat (its host cut off before its first): the host it joined from, as its
      // join wrote it in the store, so that the report names the host with the rank (chaos
      // --modes hosts --run-seed 135353714, h3 cut off at the start).
      fromStore([&] {
        if (auto host = collective::joinedHost(*kv, rank, std::chrono::milliseconds(500))) {
          evidence.host = std::move(*host);
        }
      });
    }
    if (!evidence.ended) {
      fromStore([&] {  // another rank saw it fall silent (SilentRanks)
        const std::string key = collective::deadRankKey(rank);
        if (!kv->check({key})) return;
        const auto why = kv->get(key, std::chrono::milliseconds(500));
        evidence.reason = fmt::format("no result from rank {}: {}", rank, why);
        evidence.silent = true;
      });
    }
    if (!evidence.heartbeat) {
      if (!published) {
        published.emplace();
        fromStore(
            [&] { *published = diagnostics::readPublishedFlights(*kv, placement.worldSize); });
      }
      if (auto it = published->find(rank); it != published->end()) evidence.flight = it->second;
    }
    return evidence;
  };
  return fillMissing(std::move(byRank), 1, evidenceOf);
}

Gathered gatherEveryRank(GatherPlan plan) {
  using Merged = std::vector<std::vector<scenario::RankResult>>;
  const RankPlacement& placement = plan.placement;
  const int self = placement.rank;
  Gathered gathered;
  const auto began = Clock::now();
  ResultsByRank found = readLocalResults(plan.folder, placement.worldSize, self,
                                         plan.localDeadline, plan.earlyAfter);
  gathered.localResults = found.size();
  gathered.localTook = Clock::now() - began;
  // Its own results count when judging whether a heartbeat is stale (a crashed rank's last
  // heartbeat may show it waiting in a collective this rank completed).
  found[self] = plan.own;
  const auto storeBegan = Clock::now();
  if (!plan.kv) {
    gathered.storeProblem = plan.noStore;
  } else if (static_cast<int>(found.size()) < placement.worldSize) {
    auto promise = std::make_shared<std::promise<Merged>>();
    auto future = promise->get_future();
    // Everything the read needs, by value: it may outlive this call.
    std::thread([promise, kv = plan.kv, placement, found, wait = plan.storeWait,
                 missingWhy = plan.missingWhy, folder = plan.folder, closedPeers = plan.closedPeers,
                 silent = plan.silent, atTeardown = plan.atTeardown]() mutable {
      try {
        promise->set_value(gatherResults(kv.get(), placement, std::move(found), wait, missingWhy,
                                         folder, silent ? &*silent : nullptr, closedPeers,
                                         atTeardown));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    }).detach();
    if (future.wait_for(plan.storeWait + kStoreReadMargin) == std::future_status::ready) {
      try {
        gathered.merged = future.get();
        gathered.storeRead = true;
      } catch (const std::exception& error) {
        gathered.storeProblem = error.what();
      }
    } else {
      gathered.storeProblem = fmt::format("the store did not answer within {} ms",
                                          (plan.storeWait + kStoreReadMargin).count());
    }
  }
  if (!gathered.storeRead) {
    const std::string& problem = gathered.storeProblem;
    const MissingWhy why = [&](int rank) {
      return plan.whenStoreUnread && !problem.empty() ? plan.whenStoreUnread(rank, problem)
                                                      : plan.missingWhy(rank);
    };
    gathered.merged = gatherResults(nullptr, placement, std::move(found),
                                    std::chrono::milliseconds(0), why, plan.folder, nullptr,
                                    plan.closedPeers, plan.atTeardown);
  }
  gathered.storeTook = Clock::now() - storeBegan;
  gathered.merged = withOwn(std::move(gathered.merged), plan.own, placement);
  return gathered;
}

std::vector<std::vector<scenario::RankResult>> withOwn(
    std::vector<std::vector<scenario::RankResult>> merged,
    const std::vector<scenario::RankResult>& own, const RankPlacement& placement) {
  if (merged.size() < own.size()) {
    std::vector<scenario::RankResult> missing;
    for (int rank = 0; rank < placement.worldSize; ++rank) {
      missing.push_back(
          missingRankResult(rank, fmt::format("no result from rank {} for this repetition", rank),
                            "not checked", {}));
    }
    merged.resize(own.size(), missing);
  }
  for (std::size_t r = 0; r < own.size(); ++r) merged[r][placement.rank] = own[r];
  return merged;
}

std::string endedWithoutResult(int rank, int reporter) {
  return fmt::format("rank {}'s process ended without a result (killed or crashed){}", rank,
                     rank == 0 && reporter != 0
                         ? fmt::format("; rank {} reports in its place", reporter)
                         : std::string());
}

MissingWhy missingRankRule(const EvidenceFolder& folder, int self, MissingWhy otherwise) {
  return [folder, self, otherwise = std::move(otherwise)](int rank) {
    return folder.ended(rank) ? endedWithoutResult(rank, self) : otherwise(rank);
  };
}

}  // namespace hmc::world
