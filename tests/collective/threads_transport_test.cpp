#include "hmc/collective/threads_transport.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>

#include "hmc/collective/collective.hpp"
#include "hmc/error.hpp"
#include "support/thread_ranks.hpp"

using namespace std::chrono_literals;
using hmc::testing::runThreadRanks;

TEST_SUITE("collective") {
  TEST_CASE("exchangeReduced runs the reduction once per collective and every rank gets it") {
    for (int world : {1, 2, 4, 8}) {
      CAPTURE(world);
      std::atomic<int> runs{0};
      std::vector<std::string> results(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        results[rank] = collective->exchangeReduced("reduce", std::to_string(rank),
                                                    [&](const std::vector<std::string>& payloads) {
                                                      ++runs;
                                                      std::string joined;
                                                      for (const auto& payload : payloads)
                                                        joined += payload;
                                                      return joined;
                                                    });
      });
      std::string expected;
      for (int rank = 0; rank < world; ++rank) expected += std::to_string(rank);
      for (int rank = 0; rank < world; ++rank) {
        CHECK(outcomes[rank].ok());
        CHECK(results[rank] == expected);
      }
      CHECK(runs.load() == 1);
    }
  }

  TEST_CASE("a reduction that throws raises RuntimeError on every rank") {
    auto outcomes = runThreadRanks(3, [&](int, auto collective) {
      collective->exchangeReduced("reduce", "", [](const std::vector<std::string>&) -> std::string {
        throw std::runtime_error("boom");
      });
    });
    for (const auto& outcome : outcomes) {
      CHECK(outcome.kind() == "runtime_error");
      CHECK(outcome.message().find("boom") != std::string::npos);
    }
  }

  TEST_CASE("exchange returns every rank's payload in rank order") {
    for (int world : {1, 2, 3, 4, 8}) {
      CAPTURE(world);
      std::vector<std::vector<std::string>> seen(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        for (int round = 0; round < 3; ++round) {
          auto peers = collective->exchange("test", std::to_string(rank * 10 + round));
          for (const auto& peer : peers) seen[rank].push_back(peer);
        }
      });
      for (int rank = 0; rank < world; ++rank) {
        CHECK(outcomes[rank].ok());
        REQUIRE(seen[rank].size() == static_cast<std::size_t>(3 * world));
        for (int round = 0; round < 3; ++round) {
          for (int peer = 0; peer < world; ++peer) {
            CHECK(seen[rank][round * world + peer] == std::to_string(peer * 10 + round));
          }
        }
      }
    }
  }

  TEST_CASE("ranks in different collectives raise collective_mismatch on every rank naming both") {
    for (int world : {2, 3, 4, 8}) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        collective->exchange(rank == world - 1 ? "close validation" : "recycle", "x");
      });
      for (const auto& outcome : outcomes) {
        CHECK(outcome.kind() == "collective_mismatch");
        CHECK(outcome.message().find("'recycle' #0") != std::string::npos);
        CHECK(outcome.message().find("'close validation' #0") != std::string::npos);
      }
      CHECK(outcomes[0].message() == outcomes[world - 1].message());
    }
  }

  TEST_CASE("collectiveCall runs nothing when ranks entered different stages") {
    std::atomic<int> ran{0};
    auto outcomes = runThreadRanks(2, [&](int rank, auto collective) {
      if (rank == 0) {
        collective->collectiveCall("multicore resource close", [&] { ++ran; });
      } else {
        collective->exchange("recycle", "");
      }
    });
    CHECK(ran == 0);
    CHECK(outcomes[0].kind() == "collective_mismatch");
    CHECK(outcomes[1].kind() == "collective_mismatch");
  }

  TEST_CASE("collectiveCall raises on every rank naming the failed ranks and the first error") {
    for (int world : {2, 3, 4, 8}) {
      CAPTURE(world);
      auto outcomes = runThreadRanks(world, [&](int rank, auto collective) {
        collective->collectiveCall("multicore resource close", [&] {
          if (rank % 2 == 1) throw hmc::ValueError("rank " + std::to_string(rank) + " broke");
        });
      });
      std::string failed = "[1";
      for (int r = 3; r < world; r += 2) failed += ", " + std::to_string(r);
      failed += "]";
      for (const auto& outcome : outcomes) {
        CHECK(outcome.kind() == "runtime_error");
        CHECK(outcome.message() ==
              "multicore resource close failed on ranks " + failed + ": ValueError: rank 1 broke");
      }
    }
  }

  TEST_CASE("a foreign exception is reported as a RuntimeError") {
    auto outcomes = runThreadRanks(2, [&](int rank, auto collective) {
      collective->collectiveCall("stage", [&] {
        if (rank == 0) throw std::runtime_error("plain");
      });
    });
    CHECK(outcomes[1].message() == "stage failed on ranks [0]: RuntimeError: plain");
  }

  TEST_CASE("a rank that never arrives gives a timeout naming the stage and the absent ranks") {
    auto outcomes = runThreadRanks(
        3,
        [&](int rank, auto collective) {
          if (rank != 2) collective->exchange("multicore resource close", "");
        },
        200ms);
    for (int rank : {0, 1}) {
      CHECK(outcomes[rank].kind() == "timeout");
      CHECK(outcomes[rank].message().find("'multicore resource close' #0") != std::string::npos);
      CHECK(outcomes[rank].message().find("ranks [2] did not arrive") != std::string::npos);
    }
    CHECK(outcomes[2].ok());
  }

  TEST_CASE("a rank arriving after a peer gave up fails at once") {
    auto world = hmc::collective::ThreadWorld::create(2);
    auto late = world->collective(1, 5000ms);
    auto early = world->collective(0, 50ms);
    CHECK_THROWS_AS(early->exchange("recycle", ""), hmc::TimeoutError);
    // "At once" is what the message says, not a stopwatch (a loaded machine stretches any
    // time): a rank that waited out its own 5 s deadline would name rank 0 as not arrived.
    CHECK_THROWS_WITH_AS(
        late->exchange("recycle", ""),
        "'recycle' #0 timed out on rank 1: it arrived after ranks [0] had left this collective "
        "(rank 0 gave up waiting first)",
        hmc::TimeoutError);
  }

  TEST_CASE("a failed rank raises rank_failure in its peers") {
    auto world = hmc::collective::ThreadWorld::create(2);
    auto survivor = world->collective(0, 5000ms);
    world->markFailed(1, "exited with status 17");
    try {
      survivor->exchange("recycle", "");
      FAIL("expected RankFailure");
    } catch (const hmc::RankFailure& error) {
      CHECK(std::string(error.what()) ==
            "rank 1 was announced dead in 'recycle' #0: exited with status 17; ranks [1] did not "
            "arrive");
    }
  }

  TEST_CASE("every survivor of a dead rank reports rank_failure, early or late") {
    for (int world : {3, 4, 8}) {
      CAPTURE(world);
      auto threadWorld = hmc::collective::ThreadWorld::create(world);
      threadWorld->markFailed(world - 1, "exited at once (fault crash)");
      std::vector<std::string> kinds(world - 1);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < world - 1; ++rank) {
        threads.emplace_back([&, rank] {
          auto collective = threadWorld->collective(rank, 5000ms);
          // Stagger arrivals so that some ranks arrive after a peer has already given up.
          std::this_thread::sleep_for(std::chrono::milliseconds(5 * rank));
          try {
            collective->exchange("recycle", "");
          } catch (const std::exception& error) {
            kinds[rank] = std::string(hmc::toString(hmc::kindOf(error)));
          }
        });
      }
      for (auto& thread : threads) thread.join();
      for (const auto& kind : kinds) CHECK(kind == "rank_failure");
    }
  }

  TEST_CASE("sequence numbers count every collective and appear in messages") {
    hmc::collective::LocalCollective local;
    CHECK(local.sequence() == 0);
    local.exchange("a", "");
    local.collectiveCall("b", [] {});
    CHECK(local.sequence() == 3);  // a call agrees on entry and on the result
  }

  TEST_CASE("observers see every collective with its status") {
    struct Recorder : hmc::collective::CollectiveObserver {
      std::vector<hmc::collective::CollectiveRecord> records;
      void onEnter(const hmc::collective::CollectiveRecord&) override {}
      void onExit(const hmc::collective::CollectiveRecord& r) override { records.push_back(r); }
    } recorder;
    auto world = hmc::collective::ThreadWorld::create(2);
    auto alone = world->collective(0, 30ms);
    alone->setObserver(&recorder);
    CHECK_THROWS(alone->exchange("recycle", "abc"));
    REQUIRE(recorder.records.size() == 1);
    CHECK(recorder.records[0].stage == "recycle");
    CHECK(recorder.records[0].payloadBytes == 3);
    CHECK(recorder.records[0].status == hmc::collective::CollectiveStatus::kTimeout);
  }

  TEST_CASE("invalid options are rejected with a message") {
    CHECK_THROWS_AS(hmc::collective::ThreadWorld::create(0), hmc::ValueError);
    auto world = hmc::collective::ThreadWorld::create(2);
    CHECK_THROWS_AS(world->collective(2, 10ms), hmc::ValueError);
    CHECK_THROWS_AS(world->collective(0, 0ms), hmc::ValueError);
  }
}
