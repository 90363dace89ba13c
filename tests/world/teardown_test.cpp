// The teardown protocol's decisions (hmc/world/teardown.hpp): what a rank does with a termination
// signal or Open MPI's warning, and how long the reporting rank waits, per launcher.

#include "hmc/world/teardown.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/result_gatherer.hpp"
#include "hmc/world/run_keys.hpp"
#include "support/memory_store.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using hmc::scenario::RankResult;
using hmc::testing::MemoryStore;
using hmc::world::decideHandOff;
using hmc::world::EvidenceFolder;
using hmc::world::HandOff;
using hmc::world::HandOffFacts;
using hmc::world::InterruptMode;
using hmc::world::RankLaunch;
using hmc::world::RankPlacement;
using hmc::world::RankProgress;
using hmc::world::StoreHost;
using hmc::world::TerminationHandOff;

HandOffFacts facts(bool early, bool reporting, bool fresh = false, bool reported = false) {
  HandOffFacts f;
  f.underLauncher = true;
  f.early = early;
  f.reporting = reporting;
  f.earlyReportFresh = fresh;
  f.folderReported = reported;
  return f;
}

const hmc::scenario::Scenario& twoRanks() {
  static const hmc::scenario::Scenario scenario = hmc::scenario::parseScenarioText(
      R"({"format": "hmc-scenario/1", "name": "t", "world_size": 2, "device": "cpu",
          "steps": [{"op": "create", "module": "a"}, {"op": "close_all"}]})",
      "t.json");
  return scenario;
}

RankResult resultOf(int rank, std::uint64_t marker) {
  RankResult result;
  result.rank = rank;
  result.collectives = marker;
  return result;
}

RankLaunch underLauncher(int rank, const char* launcher) {
  RankLaunch launch;
  launch.placement = RankPlacement{rank, 2, "127.0.0.1", 1, 0, StoreHost::kRankZero, launcher};
  return launch;
}

// What the reporting rank's InterruptedReport was called with.
struct Reports {
  std::vector<InterruptMode> modes;
  std::vector<std::vector<RankResult>> merged;  // of the last call
  hmc::world::InterruptedReport callback() {
    return [this](std::vector<std::vector<RankResult>> ranks, int signal, InterruptMode mode) {
      CHECK(signal == SIGTERM);
      modes.push_back(mode);
      merged = std::move(ranks);
    };
  }
};

}  // namespace

TEST_SUITE("teardown") {
  TEST_CASE("under hmc-run's own launch a rank only writes its current repetition's file") {
    for (bool early : {false, true}) {
      for (bool reporting : {false, true}) {
        HandOffFacts f = facts(early, reporting, true, true);
        f.underLauncher = false;
        CHECK((decideHandOff(f) == HandOff::kOwnFile));
      }
    }
  }

  TEST_CASE("a termination signal: the reporting rank reports, the others hand on") {
    CHECK((decideHandOff(facts(false, true)) == HandOff::kReport));
    CHECK((decideHandOff(facts(false, false)) == HandOff::kLocalAndStore));
  }

  TEST_CASE("Open MPI's warning: early snapshots, and the report's files from the reporter") {
    CHECK((decideHandOff(facts(true, true)) == HandOff::kEarlyReport));
    CHECK((decideHandOff(facts(true, false)) == HandOff::kEarlySnapshot));
    // A second warning after a report made at the first is made again.
    CHECK((decideHandOff(facts(true, true, true, true)) == HandOff::kEarlyReport));
  }

  TEST_CASE("the SIGTERM after the warning prints the fresh report; the others do nothing") {
    CHECK((decideHandOff(facts(false, true, true, true)) == HandOff::kPrintEarlyReport));
    CHECK((decideHandOff(facts(false, false, false, true)) == HandOff::kNothing));
    // A stale early report (the warning was not a teardown) is made again.
    CHECK((decideHandOff(facts(false, true, false, true)) == HandOff::kReport));
  }

  TEST_CASE("mpirun's waits fit in the second between its warning and SIGKILL") {
    using std::chrono::milliseconds;
    const auto mpirun = hmc::world::interruptWaits("mpirun", false);
    CHECK(mpirun.local == milliseconds(400));
    CHECK(mpirun.store == milliseconds(0));
    CHECK(mpirun.earlySnapshotAfter == milliseconds(20));
    const auto warning = hmc::world::interruptWaits("mpirun", true);
    CHECK(warning.local + warning.store + hmc::world::kStoreReadMargin < milliseconds(1000));
    CHECK(warning.earlySnapshotAfter == milliseconds(0));
    for (const char* launcher : {"torchrun", "srun"}) {
      const auto waits = hmc::world::interruptWaits(launcher, false);
      CHECK(waits.local == milliseconds(1000));
      CHECK(waits.store == milliseconds(1000));
    }
  }

  TEST_CASE("own launch: a signal writes the current repetition's file as far as it got") {
    std::string folder = (fs::temp_directory_path() / "hmc-teardown-XXXXXX").string();
    REQUIRE(mkdtemp(folder.data()) != nullptr);
    RankLaunch launch;
    launch.resultFile = folder + "/rank0";
    RankProgress progress(false);
    progress.repetitionDone(resultOf(0, 1), nullptr);  // repetition 0: in its file already
    progress.beginRepetition(std::make_shared<hmc::diagnostics::FlightRecorder>(8));
    TerminationHandOff handOff(twoRanks(), launch, progress, nullptr);
    CHECK(handOff.onSignal(SIGTERM));
    CHECK_FALSE(fs::exists(hmc::world::repetitionResultFile(launch.resultFile, 0)));
    const auto current =
        hmc::world::readRankResult(hmc::world::repetitionResultFile(launch.resultFile, 1), 0);
    REQUIRE(current.has_value());
    CHECK(current->stopped);  // alive until the signal: stopped, not crashed
    CHECK_FALSE(current->crashed);
    CHECK(current->crashReason == "stopped by signal 15 (Terminated) after its steps");
    CHECK(current->leaks.reason == "the rank was stopped by a signal: not checked");
    // The signal's thread claimed the hand-off: the main thread cannot report any more.
    CHECK_FALSE(handOff.claimForMainThread());
    fs::remove_all(folder);
  }

  TEST_CASE("a rank that does not report hands on to the evidence folder and the store") {
    auto kv = std::make_shared<MemoryStore>();
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    zero.announce(*kv);
    const RankLaunch launch = underLauncher(1, "torchrun");
    RankProgress progress(true);
    progress.repetitionDone(resultOf(1, 4), nullptr);
    Reports reports;
    TerminationHandOff handOff(twoRanks(), launch, progress, reports.callback());
    handOff.setStore(kv);
    handOff.setFolder(EvidenceFolder::join(*kv, 1, 1s));
    CHECK(handOff.onSignal(SIGTERM));
    CHECK(reports.modes.empty());  // rank 0, alive on this node, reports
    const auto stored = hmc::world::parseRankResults(kv->get(hmc::world::keys::result(1), 0ms));
    REQUIRE(stored.size() == 1);
    CHECK(stored[0].collectives == 4);
    const auto local = zero.readResults(1);
    REQUIRE(local.has_value());
    CHECK(hmc::world::parseRankResults(*local)[0].collectives == 4);
    zero.remove();
  }

  TEST_CASE("the reporting rank gathers the others' results and reports, then removes the folder") {
    auto kv = std::make_shared<MemoryStore>();
    kv->set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1, 9)}));
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    RankProgress progress(true);
    progress.repetitionDone(resultOf(0, 8), nullptr);
    Reports reports;
    TerminationHandOff handOff(twoRanks(), underLauncher(0, "torchrun"), progress,
                               reports.callback());
    handOff.setStore(kv);
    handOff.setFolder(zero);
    CHECK(handOff.onSignal(SIGTERM));
    REQUIRE(reports.modes == std::vector<InterruptMode>{InterruptMode::kReport});
    REQUIRE(reports.merged.size() == 1);
    CHECK(reports.merged[0][0].collectives == 8);
    CHECK(reports.merged[0][1].collectives == 9);
    CHECK_FALSE(fs::exists(zero.path()));
    // A second signal is not handed on twice.
    CHECK_FALSE(handOff.onSignal(SIGTERM));
    CHECK(reports.modes.size() == 1);
  }

  TEST_CASE("Open MPI's warning: the report's files at the warning, its table at the SIGTERM") {
    auto kv = std::make_shared<MemoryStore>();
    kv->set(hmc::world::keys::result(1), hmc::world::rankResultsDocument({resultOf(1, 2)}));
    const EvidenceFolder zero = EvidenceFolder::create(0);
    RankProgress progress(true);
    progress.repetitionDone(resultOf(0, 1), nullptr);
    Reports reports;
    TerminationHandOff handOff(twoRanks(), underLauncher(0, "mpirun"), progress,
                               reports.callback());
    handOff.setStore(kv);
    handOff.setFolder(zero);
    handOff.onWarning(SIGTERM);
    REQUIRE(reports.modes == std::vector<InterruptMode>{InterruptMode::kEarly});
    CHECK(reports.merged[0][1].collectives == 2);
    CHECK(zero.reported());
    SUBCASE("the folder still there at the SIGTERM") {}
    SUBCASE("a peer of the node removed the folder before this rank looks at it") {
      // Rank 1 of the same node removes the folder at this same SIGTERM (2a003ad).
      zero.remove();
    }
    CHECK(handOff.onSignal(SIGTERM));
    CHECK(reports.modes ==
          std::vector<InterruptMode>{InterruptMode::kEarly, InterruptMode::kPublishEarly});
    CHECK(reports.merged.empty());
    CHECK_FALSE(fs::exists(zero.path()));
  }

  TEST_CASE("the SIGTERM after a report at the warning: the other ranks remove the folder") {
    // mpirun's SIGKILL follows its SIGTERM by 50 ms: whichever rank of the node runs first
    // removes the folder, not only the reporting one; unless the report is stale, for rank 0
    // then reports again at its own SIGTERM and reads the folder for it.
    auto kv = std::make_shared<MemoryStore>();
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    zero.announce(*kv);
    zero.markReported();
    bool stale = false;
    SUBCASE("the report is fresh") { CHECK(zero.reportedWithin(3s)); }
    SUBCASE("the report is stale") {
      const fs::path mark = fs::path(zero.path()) / "reported";
      fs::last_write_time(mark, fs::last_write_time(mark) - 10s);
      CHECK(zero.reported());
      CHECK_FALSE(zero.reportedWithin(3s));
      stale = true;
    }
    RankProgress progress(true);
    progress.repetitionDone(resultOf(1, 3), nullptr);
    Reports reports;
    TerminationHandOff handOff(twoRanks(), underLauncher(1, "mpirun"), progress,
                               reports.callback());
    handOff.setStore(kv);
    handOff.setFolder(EvidenceFolder::join(*kv, 1, 1s));
    CHECK(handOff.onSignal(SIGTERM));
    CHECK(reports.modes.empty());  // rank 0 reported at the warning
    CHECK(fs::exists(zero.path()) == stale);
    zero.remove();  // the stale case's folder, or where a check failed
  }

  TEST_CASE("a signal before the world formed: the ranks that had not joined come first") {
    RankPlacement placement{0, 4, "127.0.0.1", 29510, 0, StoreHost::kRankZero, "mpirun"};
    hmc::world::JoinState join;
    join.missing = {0, 2, 3};  // rank 0 itself in its join: not listed among the others
    join.hosts = {{1, "h1"}};
    const auto ranks = hmc::world::worldNotFormedResults(placement, SIGTERM, join, "");
    REQUIRE(ranks.size() == 4);
    for (const RankResult& rank : ranks) {
      CHECK(rank.stopped);
      CHECK_FALSE(rank.crashed);  // nobody is known to have crashed
    }
    CHECK_FALSE(ranks[0].notJoined);
    CHECK(ranks[0].crashReason->find("ranks [2, 3] had not joined the store at "
                                     "127.0.0.1:29510") != std::string::npos);
    CHECK_FALSE(ranks[1].notJoined);
    CHECK(ranks[1].host == "h1");
    CHECK(ranks[2].notJoined);
    CHECK(ranks[3].notJoined);
    CHECK(ranks[2].host.empty());
    // The report's first failure: the ranks that never joined, stopped in the join; rank 0's
    // and rank 1's stops follow from it.
    static const hmc::scenario::Scenario fourRanks = hmc::scenario::parseScenarioText(
        R"({"format": "hmc-scenario/1", "name": "t", "world_size": 4, "device": "cpu",
            "steps": [{"op": "create", "module": "a"}, {"op": "close_all"}]})",
        "t.json");
    const auto report = hmc::scenario::buildReport(fourRanks, ranks, {});
    CHECK((report.outcome == hmc::scenario::Outcome::kFail));
    REQUIRE(report.diagnosis.first);
    CHECK(report.diagnosis.first->kind == "stopped");
    CHECK(report.diagnosis.first->stage == "join");
    CHECK(report.diagnosis.first->ranks == std::vector<int>{2, 3});
    CHECK(report.diagnosis.first->line.rfind(
              "stopped in the world's join: ranks [2, 3] had not joined the store at "
              "127.0.0.1:29510 when rank 0 was stopped by signal 15",
              0) == 0);
  }

  TEST_CASE("a world stopped while it formed fails, even where the plan has a fault step") {
    RankPlacement placement{0, 2, "127.0.0.1", 29510, 0, StoreHost::kRankZero, "mpirun"};
    hmc::world::JoinState join;
    join.missing = {1};
    static const hmc::scenario::Scenario stall = hmc::scenario::parseScenarioText(
        R"({"format": "hmc-scenario/1", "name": "t", "world_size": 2, "device": "cpu",
            "steps": [{"op": "create", "module": "a"},
                      {"op": "fault", "kind": "stall", "seconds": 0.5, "ranks": [1]},
                      {"op": "close_all"}]})",
        "t.json");
    const auto report = hmc::scenario::buildReport(
        stall, hmc::world::worldNotFormedResults(placement, SIGTERM, join, ""), {});
    CHECK((report.outcome == hmc::scenario::Outcome::kFail));
  }

  TEST_CASE("a signal before the world formed: a rank gone after its join crashed first") {
    RankPlacement placement{0, 3, "h1", 29510, 0, StoreHost::kRankZero, "mpirun"};
    hmc::world::JoinState join;
    join.missing = {2};
    join.hosts = {{0, "h1"}, {1, "h2"}};
    join.gone = {1};  // joined, then every connection from h2 closed
    const auto ranks = hmc::world::worldNotFormedResults(placement, SIGTERM, join, "");
    REQUIRE(ranks.size() == 3);
    CHECK(ranks[1].crashed);
    CHECK_FALSE(ranks[1].stopped);
    CHECK(ranks[1].host == "h2");
    CHECK(ranks[1].crashReason->rfind("joined the store at h1:29510, then every connection "
                                      "from its host h2 to it closed", 0) == 0);
    CHECK(ranks[2].notJoined);
    CHECK(ranks[0].crashReason->find("rank 1 joined it, then every connection from its host "
                                     "to it closed") != std::string::npos);
    static const hmc::scenario::Scenario threeRanks = hmc::scenario::parseScenarioText(
        R"({"format": "hmc-scenario/1", "name": "t", "world_size": 3, "device": "cpu",
            "steps": [{"op": "create", "module": "a"}, {"op": "close_all"}]})",
        "t.json");
    const auto report = hmc::scenario::buildReport(threeRanks, ranks, {});
    REQUIRE(report.diagnosis.first);
    CHECK(report.diagnosis.first->kind == "crash");
    CHECK(report.diagnosis.first->ranks == std::vector<int>{1});
    CHECK(report.diagnosis.first->hosts == std::vector<std::string>{"h2"});
  }

  TEST_CASE("a signal before the world formed: a joined rank whose host went silent crashed") {
    RankPlacement placement{0, 3, "h1", 29510, 0, StoreHost::kRankZero, "mpirun"};
    hmc::world::JoinState join;
    join.hosts = {{0, "h1"}, {1, "h2"}, {2, "h3"}};
    join.unreachable = {2};  // joined, then h3 gave no TCP handshake (probeJoinedHosts)
    const auto ranks = hmc::world::worldNotFormedResults(placement, SIGTERM, join, "");
    REQUIRE(ranks.size() == 3);
    CHECK(ranks[2].crashed);
    CHECK(ranks[2].host == "h3");
    CHECK(ranks[2].crashReason->rfind("joined the store at h1:29510, then its host h3 stopped "
                                      "answering while the world formed", 0) == 0);
    CHECK_FALSE(ranks[1].crashed);  // had joined; stopped with the world
    CHECK(ranks[0].crashReason->find("rank 2 joined it, then its host stopped answering") !=
          std::string::npos);
  }

  TEST_CASE("the probe of joined ranks' hosts: a host that answers is not silent") {
    // Loopback answers (a refused connection is an answer): no rank of it is unreachable;
    // this rank and the ranks already gone are not probed. (A silent host needs a network
    // that drops packets: the cluster in a box, scripts/chaos --modes hosts.)
    hmc::world::JoinState join;
    join.hosts = {{0, "h1"}, {1, "h1"}, {2, "h2"}};
    // Port 1: nothing listens there on loopback (refused).
    join.ends = {{0, "127.0.0.1:1"}, {1, "127.0.0.1:1"}, {2, "127.0.0.1:2"}};
    join.gone = {2};
    hmc::world::probeJoinedHosts(join, 0, std::chrono::milliseconds(300));
    CHECK(join.unreachable.empty());
  }

  TEST_CASE("a signal before the world formed, its store unreadable: nobody called crashed") {
    // The store is a launcher agent's (torchrun): nothing listens, so who had joined is not
    // known.
    RankProgress progress(true);
    Reports reports;
    RankLaunch launch = underLauncher(0, "torchrun");
    launch.placement.storeHost = StoreHost::kLauncherAgent;
    launch.placement.masterPort = 1;
    TerminationHandOff handOff(twoRanks(), launch, progress, reports.callback());
    CHECK(handOff.onSignal(SIGTERM));  // no store set: the world had not formed
    REQUIRE(reports.merged.size() == 1);
    REQUIRE(reports.merged[0].size() == 2);
    CHECK(reports.merged[0][0].stopped);
    CHECK(reports.merged[0][1].stopped);
    CHECK_FALSE(reports.merged[0][1].crashed);
    CHECK_FALSE(reports.merged[0][1].notJoined);
    CHECK(reports.merged[0][1].crashReason->rfind("unknown: the world was stopped before it "
                                                  "formed", 0) == 0);
  }

  TEST_CASE("a signal before rank 0 started its own store: no rank had joined") {
    // mpirun's rank 0 hosts the store; nothing listens at its port, so it had not started it
    // (its ranks load LibTorch first) and nobody can have joined: a host lost then is named by
    // rank as not joined (it read "which ranks had joined is not known", naming nobody).
    RankProgress progress(true);
    Reports reports;
    RankLaunch launch = underLauncher(0, "mpirun");
    launch.placement.masterPort = 1;
    TerminationHandOff handOff(twoRanks(), launch, progress, reports.callback());
    CHECK(handOff.onSignal(SIGTERM));
    REQUIRE(reports.merged.size() == 1);
    REQUIRE(reports.merged[0].size() == 2);
    CHECK(reports.merged[0][1].stopped);
    CHECK_FALSE(reports.merged[0][1].crashed);
    CHECK(reports.merged[0][1].notJoined);
    CHECK(reports.merged[0][0].crashReason->find("this rank had not started the store at "
                                                 "127.0.0.1:1 yet, so no rank had joined it") !=
          std::string::npos);
    const auto report = hmc::scenario::buildReport(twoRanks(), reports.merged[0], {});
    REQUIRE(report.diagnosis.first);
    CHECK(report.diagnosis.first->stage == "join");
    CHECK(report.diagnosis.first->ranks == std::vector<int>{1});
  }

  TEST_CASE("once the main thread claimed the end of the run, a signal leaves it to it") {
    RankProgress progress(true);
    Reports reports;
    TerminationHandOff handOff(twoRanks(), underLauncher(0, "srun"), progress, reports.callback());
    CHECK(handOff.claimForMainThread());
    CHECK_FALSE(handOff.onSignal(SIGTERM));
    handOff.onWarning(SIGTERM);  // nothing either
    CHECK(reports.modes.empty());
  }
}
