// The reporting rank's gathering (hmc/world/result_gatherer.hpp) against an in-memory store and a
// real evidence folder: results from the folder first, then the store, and the ranks that
// left none named from their heartbeats and flight records; waits that never wait for a rank
// known to be gone; a store that fails is given up at its first error.

#include "hmc/world/result_gatherer.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/run_keys.hpp"
#include "support/dead_pid.hpp"
#include "support/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using hmc::scenario::RankResult;
using hmc::testing::MemoryStore;
using hmc::world::Clock;
using hmc::world::EvidenceFolder;
using hmc::world::RankPlacement;
using hmc::world::ResultsByRank;

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

// Rank `rank`'s heartbeat: waiting in 'close validation' (step 2) for `inStage`, beat `beat`.
// `writtenAt`: its writer's system clock (0: unknown).
void writeWaiting(MemoryStore& kv, int rank, std::uint64_t beat, double inStage,
                  hmc::diagnostics::RankState state = hmc::diagnostics::RankState::kWaiting,
                  double writtenAt = 0) {
  hmc::diagnostics::Heartbeat heartbeat;
  heartbeat.rank = rank;
  heartbeat.state = state;
  heartbeat.step = 2;
  hmc::diagnostics::FlightEntry current;
  current.sequence = 3;
  current.stage = "close validation";
  current.step = 2;
  heartbeat.current = current;
  heartbeat.inStageS = inStage;
  heartbeat.beat = beat;
  heartbeat.host = "h3";
  heartbeat.writtenAtUnix = writtenAt;
  kv.set(hmc::diagnostics::heartbeatKey(rank), heartbeat.toJson().dump());
}

using hmc::testing::deadPid;

// The reporting rank 0 of `world` ranks with its own result (`marker`), the store `kv` waited
// for `wait`, and the missing-rank rule why().
hmc::world::GatherPlan planOf(std::shared_ptr<MemoryStore> kv, int world, std::uint64_t marker,
                              std::chrono::milliseconds wait) {
  hmc::world::GatherPlan plan;
  plan.placement = rankOf(0, world);
  plan.own = {resultOf(0, marker)};
  plan.kv = std::move(kv);
  plan.storeWait = wait;
  plan.missingWhy = why;
  return plan;
}

}  // namespace

TEST_SUITE("result gatherer") {
  TEST_CASE("every rank's results from the store, per repetition") {
    MemoryStore kv;
    kv.set(hmc::world::keys::result(0),
           hmc::world::rankResultsDocument({resultOf(0, 1), resultOf(0, 2)}));
    kv.set(hmc::world::keys::result(1),
           hmc::world::rankResultsDocument({resultOf(1, 1), resultOf(1, 2)}));
    const auto merged = hmc::world::gatherResults(&kv, rankOf(0, 2), {}, 1s, why, EvidenceFolder());
    REQUIRE(merged.size() == 2);
    CHECK(merged[1][0].collectives == 2);
    CHECK(merged[1][1].rank == 1);
    CHECK_FALSE(merged[1][1].crashed);
  }

  TEST_CASE("the local evidence comes first; the store is not read for those ranks") {
    MemoryStore kv;
    kv.set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1, 99)}));
    ResultsByRank local;
    local[1] = {resultOf(1, 7)};
    local[0] = {resultOf(0, 7)};
    const auto before = kv.requests();
    const auto merged =
        hmc::world::gatherResults(&kv, rankOf(0, 2), local, 1s, why, EvidenceFolder());
    CHECK(kv.requests() == before);
    CHECK(merged[0][1].collectives == 7);
  }

  TEST_CASE("a rank without results: hung where its heartbeat waits, else where it was seen") {
    MemoryStore kv;
    kv.set(hmc::world::keys::result(0), hmc::world::rankResultsDocument({resultOf(0)}));
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
    const auto merged =
        hmc::world::gatherResults(&kv, rankOf(0, 4), {}, 0ms, why, EvidenceFolder());
    REQUIRE(merged.size() == 1);
    CHECK(merged[0][1].hung);
    CHECK(merged[0][1].leaks.reason == "no result from this rank: not checked");
    CHECK(merged[0][2].crashed);
    CHECK(merged[0][2].crashReason == "no result from rank 2; last seen in step 1");
    CHECK(merged[0][3].crashed);
    CHECK(merged[0][3].crashReason == "no result from rank 3");
  }

  TEST_CASE("a rank without results or a heartbeat is named with the host it joined from") {
    // chaos --modes hosts --run-seed 135353714: h3 cut off right after the join, before ranks
    // 4-5 wrote a heartbeat; the report named them without h3, and no host line said h3.
    MemoryStore kv;
    kv.set(hmc::world::keys::result(0), hmc::world::rankResultsDocument({resultOf(0)}));
    kv.set(hmc::collective::joinedRankKey(1), "h3");
    const auto merged =
        hmc::world::gatherResults(&kv, rankOf(0, 3), {}, 0ms, why, EvidenceFolder());
    REQUIRE(merged.size() == 1);
    CHECK(merged[0][1].crashed);
    CHECK(merged[0][1].host == "h3");
    CHECK(merged[0][2].host.empty());  // it did not join: nothing says where it runs
  }

  TEST_CASE("a rank whose connection closed and that left no result ended: crashed, not hung") {
    // Ranks 1 and 2 both last beat 'waiting' in the same collective; rank 2's process ended
    // (its connection with rank 0 closed), rank 1 still waits.
    MemoryStore kv;
    for (int rank : {1, 2}) writeWaiting(kv, rank, 1, 0.5);
    int asked = 0;
    const auto closedPeers = [&asked] {
      ++asked;
      return std::vector<int>{2};
    };
    const auto merged = hmc::world::gatherResults(&kv, rankOf(0, 3), {{0, {resultOf(0)}}}, 0ms, why,
                                                  EvidenceFolder(), nullptr, closedPeers);
    // Rank 1 looks waiting while rank 2's connection closed: asked again (each 10 ms apart)
    // until kClosingGrace has passed, then still reported hung.
    CHECK(asked > 1);
    CHECK(asked <= 1 + hmc::world::kClosingGrace / 10ms);
    CHECK(merged[0][1].hung);
    CHECK_FALSE(merged[0][2].hung);
    CHECK(merged[0][2].crashed);
    CHECK(merged[0][2].crashReason ==
          "no result from rank 2: its connection with rank 0 had closed: its process ended "
          "(killed, crashed, or stopped by the same teardown; did its node fail?); last "
          "heartbeat (waiting): in step 2");
    // Nobody missing: not asked.
    kv.set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1)}));
    kv.set(hmc::world::keys::result(2), hmc::world::rankResultsDocument({resultOf(2)}));
    asked = 0;
    hmc::world::gatherResults(&kv, rankOf(0, 3), {{0, {resultOf(0)}}}, 0ms, why, EvidenceFolder(),
                              nullptr, closedPeers);
    CHECK(asked == 0);
  }

  TEST_CASE("a waiting rank whose connection closes a moment after another's: crashed too") {
    // Ranks 2 and 3 share a host whose processes were killed one by one: rank 0 saw rank 2's
    // connection close first, rank 3's from its third look on. Rank 4 runs a step (its
    // heartbeat says running) and rank 1 had a result that closed its connection: neither
    // makes rank 0 look again.
    MemoryStore kv;
    for (int rank : {2, 3}) writeWaiting(kv, rank, 1, 0.5);
    writeWaiting(kv, 4, 1, 0.5, hmc::diagnostics::RankState::kRunning);
    kv.set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1)}));
    int asked = 0;
    const auto closedPeers = [&asked] {
      ++asked;
      return asked < 3 ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 3};
    };
    const auto merged = hmc::world::gatherResults(&kv, rankOf(0, 5), {{0, {resultOf(0)}}}, 0ms, why,
                                                  EvidenceFolder(), nullptr, closedPeers, true);
    CHECK(asked == 3);
    for (int rank : {2, 3}) {
      CHECK_FALSE(merged[0][rank].hung);
      CHECK(merged[0][rank].crashReason ==
            fmt::format("no result from rank {}: its connection with rank 0 had closed: its "
                        "process ended (killed, crashed, or stopped by the same teardown; did "
                        "its node fail?); last heartbeat (waiting): in step 2",
                        rank));
    }
    CHECK(merged[0][4].crashReason ==
          "stopped by the launcher's teardown while running step 2 (alive then: its last "
          "heartbeat says running; its result did not come before the report)");
    // A result that closed its connection is no sign of a dying host: rank 3 waits, unasked.
    asked = 0;
    const auto onlyFinished = [&asked] {
      ++asked;
      return std::vector<int>{1};
    };
    const auto alive = hmc::world::gatherResults(&kv, rankOf(0, 4), {{0, {resultOf(0)}}}, 0ms, why,
                                                 EvidenceFolder(), nullptr, onlyFinished);
    CHECK(asked == 1);
    CHECK(alive[0][3].hung);
  }

  TEST_CASE("a store that fails is given up at its first error") {
    MemoryStore kv;
    kv.fail();
    const auto merged = hmc::world::gatherResults(&kv, rankOf(0, 4), {{0, {resultOf(0)}}}, 1s, why,
                                                  EvidenceFolder());
    CHECK(kv.requests() == 1);
    for (int rank = 1; rank < 4; ++rank) CHECK(merged[0][rank].crashReason == why(rank));
    // No store at all: the same, from what is known locally.
    const auto alone =
        hmc::world::gatherResults(nullptr, rankOf(0, 2), {}, 0ms, why, EvidenceFolder());
    CHECK(alone[0][0].crashReason == why(0));
  }

  TEST_CASE("the one gatherer: the folder, the store, this rank's own results in place") {
    auto kv = std::make_shared<MemoryStore>();
    kv->set(hmc::world::keys::result(2), hmc::world::rankResultsDocument({resultOf(2, 7)}));
    hmc::world::GatherPlan plan = planOf(kv, 3, 5, 200ms);
    plan.whenStoreUnread = [](int rank, const std::string&) { return "unread " + why(rank); };
    const auto gathered = hmc::world::gatherEveryRank(std::move(plan));
    CHECK(gathered.storeRead);
    CHECK(gathered.storeProblem.empty());
    REQUIRE(gathered.merged.size() == 1);
    REQUIRE(gathered.merged[0].size() == 3);
    CHECK(gathered.merged[0][0].collectives == 5);
    CHECK(gathered.merged[0][1].crashReason == why(1));
    CHECK(gathered.merged[0][2].collectives == 7);
  }

  TEST_CASE("the one gatherer gives up a store that stalls, and says why") {
    auto kv = std::make_shared<MemoryStore>();
    kv->set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1, 7)}));
    kv->stall(5s);  // longer than the gatherer may wait: the read is abandoned, still stalled
    hmc::world::GatherPlan plan = planOf(kv, 2, 5, 100ms);
    plan.whenStoreUnread = [](int rank, const std::string& problem) {
      return "unread " + why(rank) + " (" + problem + ")";
    };
    const auto began = Clock::now();
    const auto gathered = hmc::world::gatherEveryRank(std::move(plan));
    // Bounded by storeWait + kStoreReadMargin (400 ms), far from the store's 5 s.
    CHECK(Clock::now() - began < 4s);
    CHECK_FALSE(gathered.storeRead);
    CHECK(gathered.storeProblem == "the store did not answer within 400 ms");
    CHECK(gathered.merged[0][0].collectives == 5);
    CHECK(gathered.merged[0][1].crashReason ==
          "unread no result from rank 1 (the store did not answer within 400 ms)");
  }

  TEST_CASE("the one gatherer without a store: the reason given for it") {
    hmc::world::GatherPlan plan;
    plan.placement = rankOf(1, 2);
    plan.own = {resultOf(1, 5), resultOf(1, 6)};
    plan.noStore = "the store's host is gone";
    plan.missingWhy = why;
    auto unread = plan;
    const auto plain = hmc::world::gatherEveryRank(std::move(plan));
    CHECK(plain.storeProblem == "the store's host is gone");
    REQUIRE(plain.merged.size() == 2);  // as many repetitions as this rank has
    CHECK(plain.merged[1][1].collectives == 6);
    CHECK(plain.merged[0][0].crashReason == why(0));
    unread.whenStoreUnread = [](int rank, const std::string& problem) {
      return why(rank) + ": " + problem;
    };
    const auto told = hmc::world::gatherEveryRank(std::move(unread));
    CHECK(told.merged[0][0].crashReason == why(0) + ": the store's host is gone");
  }

  TEST_CASE("waiting for every rank's key stops at a rank announced dead") {
    MemoryStore kv;
    kv.set("vote/0/0", "1");
    hmc::collective::announceDeadRank(kv, 1, "rank 1 exited with status 17 (fault crash)");
    const auto voteOf = [](int rank) { return hmc::world::keys::vote(0, rank); };
    // Bounded by a deadline far away: it returns because rank 1 is gone, not at the deadline.
    CHECK_FALSE(hmc::world::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, nullptr, 0));
    kv.set("vote/0/1", "1");
    CHECK(hmc::world::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, nullptr, 0));
    CHECK_FALSE(hmc::world::waitForKeys(kv, {"results-read"}, Clock::now()));
  }

  TEST_CASE("a rank of this node whose process ended is gone, and announced for the others") {
    MemoryStore kv;
    EvidenceFolder folder = EvidenceFolder::create(0);
    REQUIRE(folder.usable());
    folder.announce(kv);
    // Rank 1 joins (this process plays it), writes its results, and its process ends.
    const EvidenceFolder one = EvidenceFolder::join(kv, 1, 1s);
    REQUIRE(one.usable());
    CHECK(one.writeResults(hmc::world::rankResultsDocument({resultOf(1, 5)})).empty());
    {
      std::ofstream pid(folder.path() + "/rank1.pid", std::ios::trunc);
      pid << deadPid();
    }
    CHECK(folder.known(1));
    CHECK_FALSE(folder.alive(1));
    CHECK(folder.alive(0));
    CHECK(folder.lowestLiveRank(2) == 0);
    const auto voteOf = [](int rank) { return hmc::world::keys::vote(3, rank); };
    kv.set(voteOf(0), "1");
    CHECK_FALSE(hmc::world::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, &folder, 0));
    CHECK(kv.get(hmc::collective::deadRankKey(1), 0ms) ==
          "rank 1's process ended (seen by rank 0 on its node)");
    // What it wrote before it ended comes from the folder, without waiting for the live ones.
    const auto local = hmc::world::readLocalResults(folder, 2, 0, Clock::now() + 1h);
    REQUIRE(local.count(1) == 1);
    CHECK(local.at(1)[0].collectives == 5);
    folder.remove();
  }

  TEST_CASE("a rank whose heartbeat stops while it waits past its deadline fell silent") {
    MemoryStore kv;
    hmc::world::SilentRanks silent(2000ms);
    const auto t0 = Clock::now();
    writeWaiting(kv, 4, 10, 2.5);             // 2.5 s into a collective whose deadline is 2 s
    CHECK_FALSE(silent.check(kv, 4, 0, t0));  // first seen: not yet
    // Unchanged, but not long enough.
    CHECK_FALSE(silent.check(kv, 4, 0, t0 + hmc::world::SilentRanks::kSilentAfter - 1ms));
    const auto why = silent.check(kv, 4, 0, t0 + hmc::world::SilentRanks::kSilentAfter);
    REQUIRE(why);
    CHECK(*why ==
          "rank 4 (host h3) fell silent: no heartbeat for 2.5 s while it waited in 'close "
          "validation' (step 2), 3.0 s past that collective's deadline (seen by rank 0): its host "
          "is down or cut off, or the rank is stopped");
    // No heartbeat at all: nothing to judge by (a rank that never started is the join's).
    CHECK_FALSE(silent.check(kv, 5, 0, t0 + 1h));
  }

  TEST_CASE("the silence counts from the beat's writing where the clocks agree") {
    using hmc::diagnostics::RankState;
    MemoryStore kv;
    const auto t0 = Clock::now();
    const double unix0 = 1.7e9;
    // Written 6 s ago, 0.5 s into its collective (deadline 2 s): silent at the first look.
    hmc::world::SilentRanks silent(2000ms);
    writeWaiting(kv, 1, 4, 0.5, RankState::kWaiting, unix0 - 6.0);
    const auto why = silent.check(kv, 1, 0, t0, unix0);
    REQUIRE(why);
    CHECK(why->find("no heartbeat for 6.0 s") != std::string::npos);
    CHECK(why->find("4.5 s past that collective's deadline") != std::string::npos);
    // Written 1 s ago: not yet silent (kSilentAfter), and then so 1.5 s later.
    hmc::world::SilentRanks fresh(0ms);
    writeWaiting(kv, 2, 4, 9.0, RankState::kWaiting, unix0 - 1.0);
    CHECK_FALSE(fresh.check(kv, 2, 0, t0, unix0));
    CHECK(fresh.check(kv, 2, 0, t0 + 1500ms, unix0 + 1.5));
    // From the future (the writer's clock ahead of this one): counted from the first look.
    hmc::world::SilentRanks ahead(0ms);
    writeWaiting(kv, 3, 4, 9.0, RankState::kWaiting, unix0 + 30.0);
    CHECK_FALSE(ahead.check(kv, 3, 0, t0, unix0));
    CHECK_FALSE(ahead.check(kv, 3, 0, t0 + 2400ms, unix0 + 2.4));
    CHECK(ahead.check(kv, 3, 0, t0 + 2500ms, unix0 + 2.5));
  }

  TEST_CASE("a rank whose heartbeat goes on, or not yet past a deadline, is not silent") {
    using hmc::world::SilentRanks;
    MemoryStore kv;
    const auto t0 = Clock::now();
    SilentRanks beating(2000ms);
    writeWaiting(kv, 1, 1, 5.0);
    CHECK_FALSE(beating.check(kv, 1, 0, t0));
    writeWaiting(kv, 1, 2, 6.0);  // a new beat resets the silence
    CHECK_FALSE(beating.check(kv, 1, 0, t0 + SilentRanks::kSilentAfter));
    CHECK_FALSE(beating.check(kv, 1, 0, t0 + SilentRanks::kSilentAfter * 2 - 1ms));
    CHECK(beating.check(kv, 1, 0, t0 + SilentRanks::kSilentAfter * 2));
    // Waiting, silent, but the collective's deadline (plus the slack) is still ahead: its own
    // timeout comes first.
    SilentRanks patient(60000ms);
    writeWaiting(kv, 2, 1, 0.5);
    CHECK_FALSE(patient.check(kv, 2, 0, t0));
    CHECK_FALSE(patient.check(kv, 2, 0, t0 + 30s));
    CHECK(patient.check(kv, 2, 0, t0 + 61s));
    // Running a step outside any collective: silent once its heartbeat stopped for a whole
    // collective deadline (at least kSilentAfter).
    SilentRanks running(4000ms);
    writeWaiting(kv, 3, 1, 9.0, hmc::diagnostics::RankState::kRunning);
    CHECK_FALSE(running.check(kv, 3, 0, t0));
    CHECK_FALSE(running.check(kv, 3, 0, t0 + 3999ms));
    const auto ran = running.check(kv, 3, 0, t0 + 4s);
    REQUIRE(ran);
    CHECK(*ran ==
          "rank 3 (host h3) fell silent: no heartbeat for 4.0 s (a collective's deadline) while "
          "it ran step 2 (seen by rank 0): its host is down or cut off, or the rank is stopped");
    SilentRanks shortDeadline(1000ms);
    CHECK_FALSE(shortDeadline.check(kv, 3, 0, t0));
    CHECK_FALSE(shortDeadline.check(kv, 3, 0, t0 + 2499ms));
    CHECK(shortDeadline.check(kv, 3, 0, t0 + 2500ms));
    // Starting or done: never, but both once the results are what is awaited (awaitResults).
    SilentRanks other(0ms);
    writeWaiting(kv, 6, 1, 9.0, hmc::diagnostics::RankState::kDone);
    writeWaiting(kv, 7, 1, 9.0, hmc::diagnostics::RankState::kStarting);
    CHECK_FALSE(other.check(kv, 6, 0, t0));
    CHECK_FALSE(other.check(kv, 6, 0, t0 + 1h));
    CHECK_FALSE(other.check(kv, 7, 0, t0));
    CHECK_FALSE(other.check(kv, 7, 0, t0 + 1h));
    SilentRanks results(0ms);
    results.awaitResults();
    CHECK_FALSE(results.check(kv, 6, 0, t0));
    CHECK_FALSE(results.check(kv, 6, 0, t0 + SilentRanks::kSilentAfter - 1ms));
    const auto done = results.check(kv, 6, 0, t0 + SilentRanks::kSilentAfter);
    REQUIRE(done);
    CHECK(done->find("(a collective's deadline) after its steps (seen by rank 0)") !=
          std::string::npos);
    CHECK_FALSE(results.check(kv, 7, 0, t0));
    const auto starting = results.check(kv, 7, 0, t0 + SilentRanks::kSilentAfter);
    REQUIRE(starting);
    CHECK(starting->find("before its steps") != std::string::npos);
  }

  TEST_CASE("a silent rank is announced gone, and reported as such, never as hung") {
    MemoryStore kv;
    kv.set(hmc::world::keys::result(0), hmc::world::rankResultsDocument({resultOf(0)}));
    writeWaiting(kv, 1, 7, 0.0);
    hmc::world::SilentRanks silent(0ms);
    const auto voteOf = [](int rank) { return hmc::world::keys::vote(0, rank); };
    kv.set(voteOf(0), "1");
    // The first look starts rank 1's silence; the wait ends once it lasted kSilentAfter (the
    // deadline, an hour away, is not what ends it).
    CHECK_FALSE(hmc::world::waitForRanks(kv, voteOf, 2, Clock::now() + 1h, nullptr, 0, &silent));
    const std::string announced = kv.get(hmc::collective::deadRankKey(1), 0ms);
    CHECK(announced.rfind("rank 1 (host h3) fell silent: no heartbeat for ", 0) == 0);
    CHECK(kv.check({hmc::collective::kAnyDeadKey}));
    const auto merged =
        hmc::world::gatherResults(&kv, rankOf(0, 2), {}, 1h, why, EvidenceFolder(), &silent);
    REQUIRE(merged.size() == 1);
    CHECK_FALSE(merged[0][1].hung);
    CHECK(merged[0][1].crashed);
    REQUIRE(merged[0][1].crashReason);
    CHECK(merged[0][1].crashReason->rfind("no result from rank 1: " + announced, 0) == 0);
  }

  TEST_CASE("the reporting rank's own results go in place, and grow the repetitions") {
    std::vector<std::vector<RankResult>> merged = {{resultOf(0), resultOf(1)}};
    const auto out = hmc::world::withOwn(merged, {resultOf(1, 1), resultOf(1, 2)}, rankOf(1, 2));
    REQUIRE(out.size() == 2);
    CHECK(out[0][1].collectives == 1);
    CHECK(out[1][1].collectives == 2);
    CHECK(out[1][0].crashed);
    CHECK(out[1][0].crashReason == "no result from rank 0 for this repetition");
    CHECK(hmc::world::endedWithoutResult(0, 2) ==
          "rank 0's process ended without a result (killed or crashed); rank 2 reports in its "
          "place");
  }
}
