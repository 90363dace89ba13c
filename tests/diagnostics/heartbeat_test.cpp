// The watchdog's heartbeats, the job status judged from them, the shared hang diagnosis and
// the on-demand flight dump (SIGUSR1), on an in-memory store: no processes, no torch.

#include "hmc/diagnostics/heartbeat.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "hmc/diagnostics/flight_dump.hpp"
#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/diagnostics/job_status.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "support/memory_store.hpp"

namespace {

using hmc::testing::MemoryStore;

using namespace std::chrono_literals;
using hmc::collective::Clock;
using hmc::collective::CollectiveRecord;
using hmc::collective::CollectiveStatus;
namespace dx = hmc::diagnostics;

CollectiveRecord record(std::uint64_t sequence, std::string stage, Clock::time_point start,
                        CollectiveStatus status = CollectiveStatus::kOk) {
  CollectiveRecord out;
  out.sequence = sequence;
  out.stage = std::move(stage);
  out.start = start;
  out.end = start + 1ms;
  out.status = status;
  return out;
}

std::string stateOf(const dx::Heartbeat& beat) { return std::string(dx::toString(beat.state)); }

dx::Heartbeat readBeat(MemoryStore& store, int rank) {
  return dx::Heartbeat::fromJson(nlohmann::json::parse(store.get(dx::heartbeatKey(rank), 1s)));
}

// Polls `done` every 5 ms for up to 5 s (a bound, not a timing assertion).
template <typename Fn>
bool eventually(Fn done) {
  const auto until = Clock::now() + 5s;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

dx::FlightEntry entry(std::uint64_t sequence, std::string stage, int step, std::string status) {
  dx::FlightEntry out;
  out.sequence = sequence;
  out.stage = std::move(stage);
  out.step = step;
  out.status = std::move(status);
  if (out.status != "in_flight") out.endS = 1.0;
  return out;
}

}  // namespace

TEST_SUITE("heartbeat") {
  TEST_CASE("a recorder that keeps no durations stays bounded; the ring is the same") {
    const auto epoch = Clock::now();
    dx::FlightRecorder kept(4, epoch);
    dx::FlightRecorder bounded(4, epoch);
    bounded.keepDurations(false);
    for (std::uint64_t sequence = 1; sequence <= 100; ++sequence) {
      for (dx::FlightRecorder* recorder : {&kept, &bounded}) {
        recorder->onEnter(record(sequence, "recycle", epoch));
        recorder->onExit(record(sequence, "recycle", epoch));
      }
    }
    CHECK(kept.durations().size() == 100);
    CHECK(bounded.durations().empty());
    CHECK(bounded.entries().size() == 4);
    CHECK(bounded.last()->sequence == 100);
    CHECK(bounded.last()->status == "ok");
  }

  TEST_CASE("a heartbeat says starting, running, waiting and done as the rank moves") {
    const auto epoch = Clock::now();
    dx::FlightRecorder recorder(8, epoch);
    CHECK(stateOf(dx::heartbeatOf(recorder, 3)) == "starting");
    recorder.setStep(0);
    recorder.onEnter(record(1, "recycle", epoch));
    auto beat = dx::heartbeatOf(recorder, 3, epoch + 2s);
    CHECK(stateOf(beat) == "waiting");
    CHECK(beat.rank == 3);
    REQUIRE(beat.current);
    CHECK(beat.current->stage == "recycle");
    CHECK(beat.inStageS == doctest::Approx(2.0));
    CHECK_FALSE(beat.lastCompleted);
    recorder.onExit(record(1, "recycle", epoch));
    recorder.setStep(1);
    beat = dx::heartbeatOf(recorder, 3, epoch + 3s);
    CHECK(stateOf(beat) == "running");
    CHECK(beat.step == 1);
    REQUIRE(beat.lastCompleted);
    CHECK(beat.lastCompleted->sequence == 1);
    recorder.onEnter(record(2, "close validation", epoch + 3s));
    recorder.onExit(record(2, "close validation", epoch + 3s, CollectiveStatus::kTimeout));
    recorder.setStep(-1);
    beat = dx::heartbeatOf(recorder, 3, epoch + 5s);
    CHECK(stateOf(beat) == "done");
    CHECK(beat.current->status == "timeout");
    CHECK(beat.lastCompleted->sequence == 1);  // a timeout is not a completion
    const auto round = dx::Heartbeat::fromJson(nlohmann::json::parse(beat.toJson().dump()));
    CHECK(round.toJson() == beat.toJson());
    // Where the rank runs: this process on this host.
    CHECK(beat.host == hmc::hostName());
    CHECK(beat.pid == hmc::processId());
    CHECK(round.host == beat.host);
    CHECK(round.pid == beat.pid);
    // A heartbeat of an older hmc-run, without them, still reads.
    auto old = beat.toJson();
    old.erase("host");
    old.erase("pid");
    const auto fromOld = dx::Heartbeat::fromJson(old);
    CHECK(fromOld.host.empty());
    CHECK(fromOld.pid == 0);
  }

  TEST_CASE("the watchdog writes the heartbeat when the rank moves, not on every period") {
    auto store = std::make_shared<MemoryStore>();
    const auto epoch = Clock::now();
    auto recorder = std::make_shared<dx::FlightRecorder>(8, epoch);
    dx::WatchdogOptions options;
    options.rank = 1;
    options.period = 10ms;
    options.keepalive = 10s;  // no keepalive writes in this test
    dx::JobMeta meta;
    meta.scenario = "unit";
    meta.worldSize = 2;
    meta.timeoutS = 30;
    meta.transport = "tcp";
    options.meta = meta;
    {
      dx::Watchdog watchdog(recorder, store, options);
      REQUIRE(eventually([&] { return store->check({dx::heartbeatKey(1)}); }));
      CHECK(stateOf(readBeat(*store, 1)) == "starting");
      // Unchanged for 20 periods: no new write.
      std::this_thread::sleep_for(200ms);
      CHECK(store->writes(dx::heartbeatKey(1)) == 1);
      recorder->setStep(0);
      recorder->onEnter(record(1, "recycle", Clock::now()));
      REQUIRE(eventually([&] { return stateOf(readBeat(*store, 1)) == "waiting"; }));
      CHECK(readBeat(*store, 1).current->stage == "recycle");
      CHECK(store->writes(dx::heartbeatKey(1)) == 2);
      CHECK(watchdog.heartbeats() == 2);
    }
    // Stopping writes the last word.
    CHECK(store->writes(dx::heartbeatKey(1)) == 3);
    CHECK(dx::JobMeta::fromJson(nlohmann::json::parse(store->get(dx::kJobMetaKey, 1s))).scenario ==
          "unit");
  }

  TEST_CASE("the heartbeat carries the rank's first failure once it has one, written at once") {
    // What a world's report knows of a rank whose own end does not come (world.cpp,
    // missingView): the error it met, from its last heartbeat.
    auto store = std::make_shared<MemoryStore>();
    auto recorder = std::make_shared<dx::FlightRecorder>(8, Clock::now());
    std::mutex mutex;
    std::optional<nlohmann::json> failure;
    dx::WatchdogOptions options;
    options.rank = 2;
    options.period = 10ms;
    options.keepalive = 10s;  // only a change writes
    options.firstFailure = [&] {
      std::lock_guard<std::mutex> lock(mutex);
      return failure;
    };
    dx::Watchdog watchdog(recorder, store, options);
    REQUIRE(eventually([&] { return store->check({dx::heartbeatKey(2)}); }));
    CHECK_FALSE(readBeat(*store, 2).firstFailure);
    {
      std::lock_guard<std::mutex> lock(mutex);
      failure = nlohmann::json{{"rank", 2}, {"kind", "error"}, {"message", "boom"}};
    }
    REQUIRE(eventually([&] { return readBeat(*store, 2).firstFailure.has_value(); }));
    const auto beat = readBeat(*store, 2);
    CHECK(beat.firstFailure->at("message") == "boom");
    CHECK(stateOf(beat) == "starting");  // nothing else moved: the failure wrote it
    const auto round = dx::Heartbeat::fromJson(nlohmann::json::parse(beat.toJson().dump()));
    CHECK(round.toJson() == beat.toJson());
  }

  TEST_CASE("a rank that moves on every collective is written at most once per period") {
    auto store = std::make_shared<MemoryStore>();
    auto recorder = std::make_shared<dx::FlightRecorder>(8);
    dx::WatchdogOptions options;
    options.period = 100ms;
    std::uint64_t sequence = 0;
    const auto start = Clock::now();
    {
      dx::Watchdog watchdog(recorder, store, options);
      recorder->setStep(0);
      while (Clock::now() - start < 500ms) {
        recorder->onEnter(record(++sequence, "bench", Clock::now()));
        recorder->onExit(record(sequence, "bench", Clock::now()));
      }
    }
    const auto elapsed = Clock::now() - start;
    const auto periods = static_cast<int>(elapsed / 100ms);
    CHECK(sequence > 100);
    // One at start, one per period at most, one at stop.
    CHECK(store->writes(dx::heartbeatKey(0)) <= periods + 2);
    CHECK(store->writes(dx::heartbeatKey(0)) >= 2);
  }

  TEST_CASE("an unchanged rank still writes a heartbeat every keepalive") {
    auto store = std::make_shared<MemoryStore>();
    auto recorder = std::make_shared<dx::FlightRecorder>(8);
    dx::WatchdogOptions options;
    options.period = 10ms;
    options.keepalive = 50ms;
    dx::Watchdog watchdog(recorder, store, options);
    REQUIRE(eventually([&] { return store->writes(dx::heartbeatKey(0)) >= 3; }));
    CHECK(readBeat(*store, 0).beat >= 2);
  }

  TEST_CASE("without heartbeats the watchdog writes nothing while no collective is stuck") {
    auto store = std::make_shared<MemoryStore>();
    auto recorder = std::make_shared<dx::FlightRecorder>(8);
    dx::WatchdogOptions options;
    options.period = 10ms;
    options.heartbeat = false;
    {
      dx::Watchdog watchdog(recorder, store, options);
      recorder->onEnter(record(1, "x", Clock::now()));
      recorder->onExit(record(1, "x", Clock::now()));
      std::this_thread::sleep_for(100ms);
    }
    CHECK(store->totalWrites() == 0);
  }
}

TEST_SUITE("hang diagnosis") {
  TEST_CASE("diagnoseWaits names the waiting, the crashed and the ranks that never arrived") {
    std::vector<dx::RankWhereabouts> ranks(3);
    ranks[0].rank = 0;
    ranks[0].hung = true;
    ranks[0].flight = {entry(2, "forward", 1, "ok"), entry(3, "close validation", 2, "in_flight")};
    ranks[1].rank = 1;
    ranks[1].flight = {entry(2, "forward", 1, "ok")};
    ranks[1].elsewhere = "finished its steps";
    ranks[2].rank = 2;
    ranks[2].gone = "rank 2 exited with status 17 (fault crash)";
    CHECK(dx::diagnoseWaits(ranks) ==
          "rank 0 waits in 'close validation' #3 (step 2); rank 1 never arrived: last "
          "completed 'forward' #2 (step 1), finished its steps; rank 2 crashed (rank 2 exited "
          "with status 17 (fault crash)); no collective completed");
    ranks[0].flight.back().status = "rank_failure";
    CHECK(dx::diagnoseWaits(ranks).find("(step 2), a peer failed;") != std::string::npos);
    ranks[0].hung = false;
    CHECK(dx::diagnoseWaits(ranks).empty());
  }
}

TEST_SUITE("job status") {
  dx::Heartbeat beat(int rank, dx::RankState state, std::optional<dx::FlightEntry> current,
                     double inStageS, double writtenAt) {
    dx::Heartbeat out;
    out.rank = rank;
    out.state = state;
    out.step = state == dx::RankState::kDone ? -1 : 2;
    out.current = current;
    out.lastCompleted = entry(2, "forward", 1, "ok");
    out.inStageS = inStageS;
    out.writtenAtUnix = writtenAt;
    return out;
  }

  TEST_CASE("a hung job: a rank waiting past its deadline, the others done") {
    dx::JobMeta meta;
    meta.worldSize = 2;
    meta.timeoutS = 30;
    const double now = 1000;
    std::vector<std::optional<dx::Heartbeat>> beats = {
        beat(0, dx::RankState::kWaiting, entry(3, "close validation", 2, "in_flight"), 29.5,
             now - 0.7),
        beat(1, dx::RankState::kDone, entry(2, "forward", 1, "ok"), 29.0, now - 0.7)};
    auto status = dx::assessJob(meta, beats, {}, now);
    CHECK(status.hung);
    CHECK(status.ranks[0].inStageS == doctest::Approx(30.2));
    CHECK(status.ranks[0].problem ==
          "rank 0 waits in 'close validation' #3 for 30.2 s, past its 30 s deadline");
    CHECK(status.ranks[1].problem.empty());
    CHECK(status.diagnosis ==
          "rank 0 waits in 'close validation' #3 (step 2); rank 1 never arrived: last completed "
          "'forward' #2 (step 1), finished its steps");
    CHECK(status.toJson()["verdict"] == "hung");

    SUBCASE("within its deadline the same job is progressing, and still diagnosed") {
      beats[0]->inStageS = 5;
      status = dx::assessJob(meta, beats, {}, now);
      CHECK_FALSE(status.hung);
      CHECK_FALSE(status.diagnosis.empty());
      CHECK(status.toJson()["verdict"] == "progressing");
    }
    SUBCASE("a collective that ended with timeout is past its deadline too") {
      beats[0]->state = dx::RankState::kRunning;
      beats[0]->current->status = "timeout";
      beats[0]->current->endS = 40;
      beats[0]->inStageS = 0.1;
      status = dx::assessJob(meta, beats, {}, now);
      CHECK(status.hung);
      CHECK(status.ranks[0].problem.find("until its 30 s deadline") != std::string::npos);
    }
    SUBCASE("a rank announced dead or silent for long is not progressing") {
      beats[0]->inStageS = 1;
      status = dx::assessJob(meta, beats, {{1, "rank 1 killed by signal 9 (Killed)"}}, now);
      CHECK(status.hung);
      CHECK(status.ranks[1].problem == "rank 1 died: rank 1 killed by signal 9 (Killed)");
      CHECK(status.diagnosis.find("rank 1 crashed (rank 1 killed by signal 9") !=
            std::string::npos);
      beats[1]->state = dx::RankState::kRunning;
      beats[1]->writtenAtUnix = now - 10;
      status = dx::assessJob(meta, beats, {}, now);
      CHECK(status.hung);
      CHECK(status.ranks[1].stale);
    }
  }

  TEST_CASE("readJobStatus reads meta, heartbeats and deaths without writing a key") {
    MemoryStore store;
    CHECK_THROWS_AS(dx::readJobStatus(store, "127.0.0.1:1", 1s), hmc::RuntimeError);
    dx::JobMeta meta;
    meta.worldSize = 3;
    meta.timeoutS = 10;
    store.set(dx::kJobMetaKey, meta.toJson().dump());
    store.set(dx::heartbeatKey(0),
              beat(0, dx::RankState::kWaiting, entry(3, "close validation", 2, "in_flight"), 1,
                   dx::unixNow())
                  .toJson()
                  .dump());
    hmc::collective::announceDeadRank(store, 2, "rank 2 exited with status 17 (fault crash)");
    const std::size_t writes = store.totalWrites();
    const auto status = dx::readJobStatus(store, "127.0.0.1:1", 1s);
    CHECK(store.totalWrites() == writes);
    CHECK(status.endpoint == "127.0.0.1:1");
    REQUIRE(status.ranks.size() == 3);
    CHECK_FALSE(status.ranks[1].heartbeat);
    CHECK(status.ranks[1].toJson()["state"] == "unknown");
    CHECK(status.ranks[2].dead == "rank 2 exited with status 17 (fault crash)");
    CHECK(status.hung);
  }
}

TEST_SUITE("flight dump") {
  TEST_CASE("SIGUSR1 makes the watchdog write the flight record to stderr") {
    auto store = std::make_shared<MemoryStore>();
    auto recorder = std::make_shared<dx::FlightRecorder>(8);
    recorder->setStep(4);
    recorder->onEnter(record(7, "close validation", Clock::now()));
    (void)dx::takeFlightDumpRequests();
    // stderr into a pipe for the duration of the dump.
    int pipeFds[2];
    REQUIRE(::pipe(pipeFds) == 0);
    std::fflush(stderr);
    const int savedErr = ::dup(STDERR_FILENO);
    ::dup2(pipeFds[1], STDERR_FILENO);
    std::string text;
    {
      dx::WatchdogOptions options;
      options.rank = 5;
      options.period = 10ms;
      options.dumpSignal = SIGUSR1;
      dx::Watchdog watchdog(recorder, store, options);
      REQUIRE(::kill(::getpid(), SIGUSR1) == 0);  // the handler only counts it
    }
    std::fflush(stderr);
    ::dup2(savedErr, STDERR_FILENO);
    ::close(savedErr);
    ::close(pipeFds[1]);
    char buffer[4096];
    ssize_t n = 0;
    while ((n = ::read(pipeFds[0], buffer, sizeof buffer)) > 0) text.append(buffer, n);
    ::close(pipeFds[0]);
    CHECK(text.find("# hmc flight record of rank 5 (pid") != std::string::npos);
    CHECK(text.find("waiting in 'close validation' #7 (step 4)") != std::string::npos);
    CHECK(text.find("in_flight") != std::string::npos);
    // Still alive, and a second signal is counted, not fatal.
    REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
    CHECK(eventually([] { return dx::takeFlightDumpRequests() > 0; }));
  }
}
