// The reporting rank's gathering (app/result_gatherer.hpp) against an in-memory store and a
// real evidence folder: results from the folder first, then the store, and the ranks that
// left none named from their heartbeats and flight records; waits that never wait for a rank
// known to be gone; a store that fails is given up at its first error.

#include "result_gatherer.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "result_files.hpp"
#include "run_keys.hpp"
#include "support/dead_pid.hpp"
#include "support/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using hmc::app::Clock;
using hmc::app::EvidenceFolder;
using hmc::app::RankPlacement;
using hmc::app::ResultsByRank;
using hmc::scenario::RankResult;
using hmc::testing::MemoryStore;

RankPlacement rankOf(int rank, int world) {
  RankPlacement placement;
  placement.rank = rank;
  placement.worldSize = world;
  placement.launcher = "torchrun";
  return placement;
}

RankResult resultOf(int rank, std::uint64_t marker = 0) {
  RankResult result;
  result.rank = rank;
  result.collectives = marker;
  return result;
}

std::string why(int rank) { return "no result from rank " + std::to_string(rank); }

using hmc::testing::deadPid;

}  // namespace

TEST_SUITE("result gatherer") {
  TEST_CASE("every rank's results from the store, per repetition") {
    MemoryStore kv;
    kv.set(hmc::app::keys::result(0),
           hmc::app::rankResultsDocument({resultOf(0, 1), resultOf(0, 2)}));
    kv.set(hmc::app::keys::result(1),
           hmc::app::rankResultsDocument({resultOf(1, 1), resultOf(1, 2)}));
    const auto merged = hmc::app::gatherResults(&kv, rankOf(0, 2), {}, 1s, why, EvidenceFolder());
    REQUIRE(merged.size() == 2);
    CHECK(merged[1][0].collectives == 2);
    CHECK(merged[1][1].rank == 1);
    CHECK_FALSE(merged[1][1].crashed);
  }

  TEST_CASE("the local evidence comes first; the store is not read for those ranks") {
    MemoryStore kv;
    kv.set(hmc::app::keys::result(1), hmc::app::rankResultsDocument({resultOf(1, 99)}));
    ResultsByRank local;
    local[1] = {resultOf(1, 7)};
    local[0] = {resultOf(0, 7)};
    const auto before = kv.requests();
    const auto merged =
        hmc::app::gatherResults(&kv, rankOf(0, 2), local, 1s, why, EvidenceFolder());
    CHECK(kv.requests() == before);
    CHECK(merged[0][1].collectives == 7);
  }

  TEST_CASE("a rank without results: hung where its heartbeat waits, else where it was seen") {
    MemoryStore kv;
    kv.set(hmc::app::keys::result(0), hmc::app::rankResultsDocument({resultOf(0)}));
    hmc::diagnostics::Heartbeat beat;
    beat.rank = 1;
    beat.state = hmc::diagnostics::RankState::kWaiting;
    beat.step = 2;
    hmc::diagnostics::FlightEntry current;
    current.sequence = 3;
    current.stage = "close validation";
    current.step = 2;
    beat.current = current;
    kv.set(hmc::diagnostics::heartbeatKey(1), beat.toJson().dump());
    hmc::diagnostics::PublishedFlight flight;
    flight.rank = 2;
    flight.step = 1;
    flight.entries = {current};
    kv.set(hmc::collective::flightKey(2), flight.toJson().dump());
    const auto merged = hmc::app::gatherResults(&kv, rankOf(0, 4), {}, 0ms, why, EvidenceFolder());
    REQUIRE(merged.size() == 1);
    CHECK(merged[0][1].hung);
    CHECK(merged[0][1].leaks.reason == "no result from this rank: not checked");
    CHECK(merged[0][2].crashed);
    CHECK(merged[0][2].crashReason == "no result from rank 2; last seen in step 1");
    CHECK(merged[0][3].crashed);
    CHECK(merged[0][3].crashReason == "no result from rank 3");
  }

  TEST_CASE("a store that fails is given up at its first error") {
    MemoryStore kv;
    kv.fail();
    const auto merged =
        hmc::app::gatherResults(&kv, rankOf(0, 4), {{0, {resultOf(0)}}}, 1s, why, EvidenceFolder());
    CHECK(kv.requests() == 1);
    for (int rank = 1; rank < 4; ++rank) CHECK(merged[0][rank].crashReason == why(rank));
    // No store at all: the same, from what is known locally.
    const auto alone =
        hmc::app::gatherResults(nullptr, rankOf(0, 2), {}, 0ms, why, EvidenceFolder());
    CHECK(alone[0][0].crashReason == why(0));
  }

  TEST_CASE("waiting for every rank's key stops at a rank announced dead") {
    MemoryStore kv;
    kv.set("vote/0/0", "1");
    hmc::collective::announceDeadRank(kv, 1, "rank 1 exited with status 17 (fault crash)");
    const auto voteOf = [](int rank) { return hmc::app::keys::vote(0, rank); };
    // Bounded by a deadline far away: it returns because rank 1 is gone, not at the deadline.
    CHECK_FALSE(hmc::app::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, nullptr, 0));
    kv.set("vote/0/1", "1");
    CHECK(hmc::app::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, nullptr, 0));
    CHECK_FALSE(hmc::app::waitForKeys(kv, {"results-read"}, Clock::now()));
  }

  TEST_CASE("a rank of this node whose process ended is gone, and announced for the others") {
    MemoryStore kv;
    EvidenceFolder folder = EvidenceFolder::create(0);
    REQUIRE(folder.usable());
    folder.announce(kv);
    // Rank 1 joins (this process plays it), writes its results, and its process ends.
    const EvidenceFolder one = EvidenceFolder::join(kv, 1, 1s);
    REQUIRE(one.usable());
    CHECK(one.writeResults(hmc::app::rankResultsDocument({resultOf(1, 5)})).empty());
    {
      std::ofstream pid(folder.path() + "/rank1.pid", std::ios::trunc);
      pid << deadPid();
    }
    CHECK(folder.known(1));
    CHECK_FALSE(folder.alive(1));
    CHECK(folder.alive(0));
    CHECK(folder.lowestLiveRank(2) == 0);
    const auto voteOf = [](int rank) { return hmc::app::keys::vote(3, rank); };
    kv.set(voteOf(0), "1");
    CHECK_FALSE(hmc::app::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, &folder, 0));
    CHECK(kv.get(hmc::collective::deadRankKey(1), 0ms) ==
          "rank 1's process ended (seen by rank 0 on its node)");
    // What it wrote before it ended comes from the folder, without waiting for the live ones.
    const auto local = hmc::app::readLocalResults(folder, 2, 0, Clock::now() + 1h);
    REQUIRE(local.count(1) == 1);
    CHECK(local.at(1)[0].collectives == 5);
    folder.remove();
  }

  TEST_CASE("the reporting rank's own results go in place, and grow the repetitions") {
    std::vector<std::vector<RankResult>> merged = {{resultOf(0), resultOf(1)}};
    const auto out = hmc::app::withOwn(merged, {resultOf(1, 1), resultOf(1, 2)}, rankOf(1, 2));
    REQUIRE(out.size() == 2);
    CHECK(out[0][1].collectives == 1);
    CHECK(out[1][1].collectives == 2);
    CHECK(out[1][0].crashed);
    CHECK(out[1][0].crashReason == "no result from rank 0 for this repetition");
    CHECK(hmc::app::endedWithoutResult(0, 2) ==
          "rank 0's process ended without a result (killed or crashed); rank 2 reports in its "
          "place");
  }
}
