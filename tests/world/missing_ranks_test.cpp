// The one rule for ranks that left no result (hmc/world/missing_ranks.hpp): pure data in, data out.

#include "hmc/world/missing_ranks.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

namespace {

using hmc::diagnostics::FlightEntry;
using hmc::diagnostics::Heartbeat;
using hmc::diagnostics::RankState;
using hmc::scenario::RankResult;
using hmc::world::fillMissing;
using hmc::world::MissingRankEvidence;

RankResult passed(int rank, std::uint64_t lastOkSequence = 0) {
  RankResult result;
  result.rank = rank;
  FlightEntry entry;
  entry.sequence = lastOkSequence;
  entry.stage = "recycle";
  entry.status = "ok";
  entry.endS = 1.0;
  result.flight.push_back(entry);
  return result;
}

FlightEntry inFlight(std::uint64_t sequence, const std::string& stage, int step) {
  FlightEntry entry;
  entry.sequence = sequence;
  entry.stage = stage;
  entry.step = step;
  return entry;
}

Heartbeat waitingIn(std::uint64_t sequence, int step) {
  Heartbeat beat;
  beat.state = RankState::kWaiting;
  beat.step = step;
  beat.current = inFlight(sequence, "close validation", step);
  FlightEntry done = inFlight(sequence - 1, "recycle", step - 1);
  done.status = "ok";
  beat.lastCompleted = done;
  return beat;
}

}  // namespace

TEST_SUITE("missing ranks") {
  TEST_CASE("ranks with every repetition pass through untouched, laid out per repetition") {
    std::vector<std::vector<RankResult>> byRank = {{passed(0), passed(0)}, {passed(1), passed(1)}};
    int asked = 0;
    const auto merged = fillMissing(std::move(byRank), 1, [&](int) {
      ++asked;
      return MissingRankEvidence{};
    });
    REQUIRE(merged.size() == 2);
    for (const auto& repetition : merged) {
      REQUIRE(repetition.size() == 2);
      CHECK(repetition[0].rank == 0);
      CHECK(repetition[1].rank == 1);
      CHECK_FALSE(repetition[1].crashed);
    }
    CHECK(asked == 0);
  }

  TEST_CASE("a rank that died in repetition k is missing from k on, asked about once") {
    std::vector<std::vector<RankResult>> byRank = {
        {passed(0), passed(0), passed(0)}, {passed(1)}, {passed(2), passed(2), passed(2)}};
    std::map<int, int> asked;
    const auto merged = fillMissing(std::move(byRank), 1, [&](int rank) {
      ++asked[rank];
      MissingRankEvidence evidence;
      evidence.reason = "killed by signal 9 (Killed)";
      evidence.leakReason = "the rank process died without a result: not checked";
      evidence.ended = true;
      return evidence;
    });
    REQUIRE(merged.size() == 3);
    CHECK_FALSE(merged[0][1].crashed);
    for (std::size_t r = 1; r < 3; ++r) {
      CHECK(merged[r][1].rank == 1);
      CHECK(merged[r][1].crashed);
      CHECK(merged[r][1].crashReason == "killed by signal 9 (Killed)");
      CHECK(merged[r][1].leaks.reason == "the rank process died without a result: not checked");
      CHECK(merged[r][1].flight.empty());
    }
    CHECK(asked == std::map<int, int>{{1, 1}});
  }

  TEST_CASE("no rank left anything: minRepetitions rows of missing ranks") {
    std::vector<std::vector<RankResult>> byRank(3);
    const auto merged = fillMissing(std::move(byRank), 1, [](int rank) {
      MissingRankEvidence evidence;
      evidence.reason = "rank " + std::to_string(rank) + " exited with status 1";
      evidence.ended = true;
      return evidence;
    });
    REQUIRE(merged.size() == 1);
    REQUIRE(merged[0].size() == 3);
    CHECK(merged[0][2].rank == 2);
    CHECK(merged[0][2].crashReason == "rank 2 exited with status 1");
    CHECK(fillMissing(std::vector<std::vector<RankResult>>(2), 0, nullptr).empty());
  }

  TEST_CASE("a live rank whose heartbeat waits in a collective nobody completed is hung") {
    std::vector<std::vector<RankResult>> byRank = {{passed(0, 3)}, {}};
    const auto merged = fillMissing(std::move(byRank), 1, [](int) {
      MissingRankEvidence evidence;
      evidence.reason = "no result from rank 1 within 10 s";
      evidence.leakReason = "no result from this rank: not checked";
      evidence.heartbeat = waitingIn(4, 2);
      return evidence;
    });
    const RankResult& rank1 = merged[0][1];
    CHECK(rank1.hung);
    CHECK_FALSE(rank1.crashed);
    CHECK_FALSE(rank1.crashReason.has_value());
    REQUIRE(rank1.flight.size() == 2);  // the last completed, then the one it waits in
    CHECK(rank1.flight[0].sequence == 3);
    CHECK(rank1.flight[1].sequence == 4);
    CHECK(rank1.flight[1].status == "in_flight");
    CHECK(rank1.leaks.reason == "no result from this rank: not checked");
  }

  TEST_CASE("a heartbeat waiting where others moved on is stale: the rank crashed") {
    // Rank 0 completed sequence 4: rank 1's heartbeat in #4 was written before it died.
    std::vector<std::vector<RankResult>> byRank = {{passed(0, 4)}, {}};
    const auto merged = fillMissing(std::move(byRank), 1, [](int) {
      MissingRankEvidence evidence;
      evidence.reason = "no result from rank 1";
      evidence.heartbeat = waitingIn(4, 2);
      return evidence;
    });
    CHECK_FALSE(merged[0][1].hung);
    CHECK(merged[0][1].crashed);
    CHECK(merged[0][1].crashReason == "no result from rank 1; last heartbeat (waiting): in step 2");
  }

  TEST_CASE("a rank whose process ended is crashed whatever its heartbeat shows") {
    std::vector<std::vector<RankResult>> byRank = {{passed(0, 1)}, {}};
    const auto merged = fillMissing(std::move(byRank), 1, [](int) {
      MissingRankEvidence evidence;
      evidence.reason = "rank 1's process ended without a result (killed or crashed)";
      evidence.ended = true;
      evidence.heartbeat = waitingIn(7, 5);
      return evidence;
    });
    CHECK(merged[0][1].crashed);
    CHECK_FALSE(merged[0][1].hung);
    CHECK(merged[0][1].crashReason ==
          "rank 1's process ended without a result (killed or crashed); last heartbeat "
          "(waiting): in step 5");
    CHECK(merged[0][1].flight.size() == 2);
  }

  TEST_CASE("a heartbeat outside the steps says so") {
    const auto merged = fillMissing({{}}, 1, [](int) {
      MissingRankEvidence evidence;
      evidence.reason = "killed by signal 9 (Killed)";
      evidence.ended = true;
      evidence.heartbeat = Heartbeat{};  // starting, step -1, no collective yet
      return evidence;
    });
    CHECK(merged[0][0].crashReason ==
          "killed by signal 9 (Killed); last heartbeat (starting): "
          "outside its steps");
    CHECK(merged[0][0].flight.empty());
  }

  TEST_CASE("without a heartbeat the published flight record says where it was") {
    hmc::diagnostics::PublishedFlight flight;
    flight.rank = 1;
    flight.step = 3;
    flight.entries = {inFlight(9, "recycle", 3)};
    const auto merged = fillMissing({{passed(0)}, {}}, 1, [&](int) {
      MissingRankEvidence evidence;
      evidence.reason = "exited with status 17 (fault crash)";
      evidence.ended = true;
      evidence.flight = flight;
      return evidence;
    });
    CHECK(merged[0][1].crashReason == "exited with status 17 (fault crash); last seen in step 3");
    REQUIRE(merged[0][1].flight.size() == 1);
    CHECK(merged[0][1].flight[0].sequence == 9);

    flight.step = -1;
    const auto after = fillMissing({{}}, 1, [&](int) {
      MissingRankEvidence evidence;
      evidence.reason = "killed";
      evidence.flight = flight;
      return evidence;
    });
    CHECK(after[0][0].crashReason == "killed; last seen after its steps");
  }

  TEST_CASE("the heartbeat, more recent, wins over a published flight record") {
    hmc::diagnostics::PublishedFlight flight;
    flight.step = 1;
    flight.entries = {inFlight(2, "recycle", 1)};
    const auto merged = fillMissing({{}}, 1, [&](int) {
      MissingRankEvidence evidence;
      evidence.reason = "killed";
      evidence.ended = true;
      evidence.flight = flight;
      Heartbeat beat;
      beat.state = RankState::kRunning;
      beat.step = 4;
      evidence.heartbeat = beat;
      return evidence;
    });
    CHECK(merged[0][0].crashReason == "killed; last heartbeat (running): in step 4");
  }

  TEST_CASE("at a launcher's teardown, a rank whose heartbeat says running was stopped, alive") {
    // h3's ranks under mpirun: Open MPI signals them about a second after rank 0's warning, so
    // rank 0 reports before their results come; their heartbeats say they were running.
    const auto evidenceOf = [](bool atTeardown, bool ended, RankState state, int step) {
      return [=](int) {
        MissingRankEvidence evidence;
        evidence.reason = "no result from rank 0: it died, was stopped, or never finished";
        evidence.ended = ended;
        evidence.atTeardown = atTeardown;
        Heartbeat beat;
        beat.state = state;
        beat.step = step;
        evidence.heartbeat = beat;
        return evidence;
      };
    };
    const auto stopped = fillMissing({{}}, 1, evidenceOf(true, false, RankState::kRunning, 2));
    CHECK_FALSE(stopped[0][0].crashed);  // alive, stopped from outside: not a crash
    CHECK(stopped[0][0].stopped);
    CHECK(stopped[0][0].crashReason ==
          "stopped by the launcher's teardown while running step 2 (alive then: its last "
          "heartbeat says running; its result did not come before the report)");
    const auto after = fillMissing({{}}, 1, evidenceOf(true, false, RankState::kRunning, -1));
    CHECK(after[0][0].crashReason->rfind("stopped by the launcher's teardown after its steps", 0) ==
          0);
    // Done with its steps and handing on its result when the teardown came (a rank of h3 whose
    // result went to a store that the teardown ended): alive, stopped.
    const auto done = fillMissing({{}}, 1, evidenceOf(true, false, RankState::kDone, -1));
    CHECK(done[0][0].stopped);
    CHECK_FALSE(done[0][0].crashed);
    CHECK(done[0][0].crashReason ==
          "stopped by the launcher's teardown after its steps (alive then: its last heartbeat "
          "says done; its result did not come before the report)");
    // A run shorter than the heartbeat's second: "starting" is a live rank's last word too.
    const auto starting = fillMissing({{}}, 1, evidenceOf(true, false, RankState::kStarting, -1));
    CHECK(starting[0][0].stopped);
    CHECK_FALSE(starting[0][0].crashed);
    CHECK(starting[0][0].crashReason ==
          "stopped by the launcher's teardown as it started (alive then: its last heartbeat "
          "says starting; its result did not come before the report)");
    CHECK(fillMissing({{}}, 1, evidenceOf(true, true, RankState::kStarting, -1))[0][0].crashed);
    // Waiting is not at work: never stopped by the teardown (with no collective in its heartbeat
    // to wait in, a rank with no result is crashed).
    const auto waiting = fillMissing({{}}, 1, evidenceOf(true, false, RankState::kWaiting, 2));
    CHECK_FALSE(waiting[0][0].stopped);
    // Its process ended (a closed connection, a pid gone), or no teardown: as before.
    const auto ended = fillMissing({{}}, 1, evidenceOf(true, true, RankState::kRunning, 2));
    CHECK(ended[0][0].crashReason ==
          "no result from rank 0: it died, was stopped, or never finished; last heartbeat "
          "(running): in step 2");
    const auto normal = fillMissing({{}}, 1, evidenceOf(false, false, RankState::kRunning, 2));
    CHECK(normal[0][0].crashReason->rfind("no result from rank 0", 0) == 0);
  }

  TEST_CASE("a missing rank's host and pid: the caller's, else its heartbeat's, else its last") {
    // Rank 1 has a heartbeat from h2; rank 2 is known to the caller (a rank of this node);
    // rank 3 left repetition 0 and nothing after, and no heartbeat.
    RankResult earlier = passed(3);
    earlier.host = "h3";
    earlier.pid = 33;
    std::vector<std::vector<RankResult>> byRank = {{passed(0), passed(0)}, {}, {}, {earlier}};
    const auto merged = fillMissing(std::move(byRank), 1, [](int rank) {
      MissingRankEvidence evidence;
      evidence.reason = "no result";
      evidence.ended = true;
      if (rank == 1) {
        evidence.heartbeat = waitingIn(4, 2);
        evidence.heartbeat->host = "h2";
        evidence.heartbeat->pid = 22;
      }
      if (rank == 2) {
        evidence.host = "h1";
        evidence.pid = 11;
        evidence.heartbeat = waitingIn(4, 2);  // the caller's knowledge wins
        evidence.heartbeat->host = "elsewhere";
      }
      return evidence;
    });
    REQUIRE(merged.size() == 2);
    for (const auto& repetition : merged) {
      CHECK(repetition[1].host == "h2");
      CHECK(repetition[1].pid == 22);
      CHECK(repetition[2].host == "h1");
      CHECK(repetition[2].pid == 11);
    }
    CHECK(merged[1][3].crashed);
    CHECK(merged[1][3].host == "h3");
    CHECK(merged[1][3].pid == 33);
  }
}
