#include "rank_process.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/runner.hpp"
#include "signals.hpp"

namespace hmc::app {
namespace {

using Clock = std::chrono::steady_clock;

// How long rank 0 waits for the others' results after a termination signal (they publish
// theirs within milliseconds of the same signal). Under mpirun not at all: Open MPI sends
// SIGKILL 1 s after SIGTERM (odls_base_sigkill_timeout), so rank 0 reports at once from what
// the store holds (results, else every rank's heartbeat). torchrun and srun give seconds.
std::chrono::milliseconds interruptGatherFor(const std::string& launcher) {
  return launcher == "mpirun" ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000);
}
// The bound on that reading beyond the wait, should the store not answer.
constexpr std::chrono::milliseconds kInterruptRead{300};

// Polls for `keys` until all exist or `deadline` passes.
bool waitForKeys(collective::KeyValueStore& kv, const std::vector<std::string>& keys,
                 Clock::time_point deadline) {
  while (true) {
    if (kv.check(keys)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<std::string> rankKeys(const std::string& stem, int worldSize) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < worldSize; ++rank) keys.push_back(fmt::format("{}/{}", stem, rank));
  return keys;
}

// Polls for every rank's "<stem>/<rank>" until all exist, a rank whose key is missing is
// announced dead ("dead/<rank>", set by hmc-run's launcher), or `deadline` passes.
bool waitForRanks(collective::KeyValueStore& kv, const std::string& stem, int worldSize,
                  Clock::time_point deadline) {
  const auto keys = rankKeys(stem, worldSize);
  for (int round = 0;; ++round) {
    if (kv.check(keys)) return true;
    if (round % 10 == 9 && kv.check({collective::kAnyDeadKey})) {  // every ~50 ms
      for (int rank = 0; rank < worldSize; ++rank) {
        if (!kv.check({keys[rank]}) && kv.check({collective::deadRankKey(rank)})) return false;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights) {
  scenario::RankResult result;
  result.rank = rank;
  result.crashed = true;
  result.leaks.reason = std::move(leakReason);
  if (auto it = flights.find(rank); it != flights.end()) {
    result.flight = it->second.entries;
    reason += it->second.step < 0 ? std::string("; last seen after its steps")
                                  : fmt::format("; last seen in step {}", it->second.step);
  }
  result.crashReason = std::move(reason);
  return result;
}

std::string rankResultsDocument(const std::vector<scenario::RankResult>& results) {
  nlohmann::json repetitions = nlohmann::json::array();
  for (const auto& result : results) repetitions.push_back(scenario::toJson(result));
  return nlohmann::json{{"repetitions", std::move(repetitions)}}.dump();
}

std::vector<scenario::RankResult> parseRankResults(const std::string& text) {
  std::vector<scenario::RankResult> results;
  const auto document = nlohmann::json::parse(text);  // outlives the loop
  for (const auto& entry : document.at("repetitions")) {
    results.push_back(scenario::rankResultFromJson(entry));
  }
  return results;
}

namespace {

// A rank without results, as its last heartbeat shows it: waiting in a collective (hung, so
// the hang diagnosis says where), or elsewhere (crashed: it left no result). nullopt without
// a heartbeat.
std::optional<scenario::RankResult> fromHeartbeat(collective::KeyValueStore& kv, int rank,
                                                  std::optional<std::uint64_t> completedByOthers) {
  try {
    const std::string key = diagnostics::heartbeatKey(rank);
    if (!kv.check({key})) return std::nullopt;
    const auto beat = diagnostics::Heartbeat::fromJson(
        nlohmann::json::parse(kv.get(key, std::chrono::milliseconds(500))));
    scenario::RankResult result;
    result.rank = rank;
    if (beat.lastCompleted) result.flight.push_back(*beat.lastCompleted);
    if (beat.current &&
        (!beat.lastCompleted || beat.current->sequence != beat.lastCompleted->sequence)) {
      result.flight.push_back(*beat.current);
    }
    result.leaks.reason = "no result from this rank (stopped or died): not checked";
    const bool stale =
        completedByOthers && beat.current && beat.current->sequence <= *completedByOthers;
    if (beat.state == diagnostics::RankState::kWaiting && beat.current && !stale) {
      result.hung = true;
    } else {
      result.crashed = true;
      result.crashReason = fmt::format(
          "no result from rank {}: it died or was stopped; its last heartbeat ({}): {}", rank,
          diagnostics::toString(beat.state),
          beat.step < 0 ? std::string("outside its steps") : fmt::format("in step {}", beat.step));
    }
    return result;
  } catch (const std::exception& error) {
    spdlog::debug("rank {}'s heartbeat: {}", rank, error.what());
    return std::nullopt;
  }
}

// Rank 0 of an external launch: every rank's results, through the store (bounded by the
// timeout; a rank without results is a crashed rank, with its flight record if it published
// one).
std::vector<std::vector<scenario::RankResult>> gatherResults(collective::KeyValueStore& kv,
                                                             const RankLaunch& launch,
                                                             std::chrono::milliseconds timeout) {
  std::vector<std::vector<scenario::RankResult>> byRank(launch.worldSize);
  const auto deadline = Clock::now() + timeout;
  std::optional<std::map<int, diagnostics::PublishedFlight>> published;
  std::size_t repetitions = 1;
  for (int rank = 0; rank < launch.worldSize; ++rank) {
    const std::string key = fmt::format("result/{}", rank);
    if (!waitForKeys(kv, {key}, deadline)) continue;
    try {
      byRank[rank] = parseRankResults(kv.get(key, timeout));
    } catch (const std::exception& error) {
      spdlog::warn("rank {} sent unreadable results: {}", rank, error.what());
    }
    repetitions = std::max(repetitions, byRank[rank].size());
  }
  // The last collective every rank with results completed: a heartbeat that shows a rank
  // waiting in an earlier one is stale (it died after writing it).
  std::optional<std::uint64_t> completedByOthers;
  for (const auto& results : byRank) {
    if (results.empty()) continue;
    for (const auto& entry : results.back().flight) {
      if (entry.status != "ok") continue;
      completedByOthers = std::max(completedByOthers.value_or(0), entry.sequence);
    }
  }
  std::vector<std::vector<scenario::RankResult>> merged(
      repetitions, std::vector<scenario::RankResult>(launch.worldSize));
  for (int rank = 0; rank < launch.worldSize; ++rank) {
    for (std::size_t r = 0; r < repetitions; ++r) {
      if (r < byRank[rank].size()) {
        merged[r][rank] = std::move(byRank[rank][r]);
        continue;
      }
      // Where it was: its heartbeat (every rank writes one at least every second), else the
      // flight record its watchdog published at a deadline.
      if (auto seen = fromHeartbeat(kv, rank, completedByOthers)) {
        merged[r][rank] = std::move(*seen);
        continue;
      }
      if (!published) published = diagnostics::readPublishedFlights(kv, launch.worldSize);
      merged[r][rank] = missingRankResult(
          rank,
          fmt::format("no result from rank {} within {:g} s: it died, was stopped, or never "
                      "finished its steps",
                      rank, std::chrono::duration<double>(timeout).count()),
          "no result from this rank: not checked", *published);
    }
  }
  return merged;
}

// What the rank has done so far, for the termination watcher (another thread): the finished
// repetitions, and the current one's finished steps and flight recorder.
class RankProgress {
 public:
  void beginRepetition(std::shared_ptr<diagnostics::FlightRecorder> recorder) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.clear();
    recorder_ = std::move(recorder);
  }
  void stepDone(const scenario::StepResult& step) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.push_back(step);
  }
  void repetitionDone(const scenario::RankResult& result) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.push_back(result);
    steps_.clear();
    recorder_.reset();
  }

  // Every finished repetition, plus the current one as far as it got when `signal` stopped
  // the rank: a rank waiting in a collective records a hang there (so the report's hang
  // diagnosis says where it waited); otherwise it is a rank stopped in a step.
  std::vector<scenario::RankResult> snapshot(const scenario::Scenario& scenario, int rank,
                                             int signal) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<scenario::RankResult> results = done_;
    if (!recorder_) return results;
    scenario::RankResult partial;
    partial.rank = rank;
    partial.steps = steps_;
    partial.flight = recorder_->entries();
    partial.leaks.reason = "the rank was stopped by a signal: not checked";
    const int step = recorder_->step();
    const auto last = recorder_->last();
    const std::string by = fmt::format("stopped by signal {} ({})", signal, strsignal(signal));
    if (last && last->status == "in_flight" && step >= 0 &&
        step < static_cast<int>(scenario.steps.size())) {
      const scenario::Step& definition = scenario.steps[step];
      scenario::StepResult waiting;
      waiting.index = step;
      waiting.op = definition.op;
      if (!definition.module.empty()) waiting.module = definition.module;
      waiting.label = definition.label;
      waiting.status = scenario::StepStatus::kHang;
      waiting.startS = last->startS;
      waiting.error = scenario::StepError{
          ErrorKind::kRankFailure,
          fmt::format("{} while waiting in '{}' #{}: the launcher or the user ended the run "
                      "(did another rank exit?)",
                      by, last->stage, last->sequence)};
      waiting.expected = scenario::expectationMet(definition, waiting);
      partial.steps.push_back(std::move(waiting));
      partial.hung = true;
    } else {
      // A rank that hung earlier is reported as hung (where it waited is in its steps and
      // flight record); any other rank was stopped in the middle of its work.
      partial.hung = std::any_of(partial.steps.begin(), partial.steps.end(), [](const auto& s) {
        return s.status == scenario::StepStatus::kHang;
      });
      if (!partial.hung) {
        partial.crashed = true;
        partial.crashReason =
            step < 0 ? by + " after its steps" : fmt::format("{} in step {}", by, step);
      }
    }
    results.push_back(std::move(partial));
    return results;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<scenario::RankResult> done_;
  std::vector<scenario::StepResult> steps_;
  std::shared_ptr<diagnostics::FlightRecorder> recorder_;
};

}  // namespace

RankProcessOutcome runRankProcess(const scenario::Scenario& scenario, const RankLaunch& launch,
                                  bool gatherOnRankZero, const InterruptedReport& onInterrupted) {
  const auto timeout = collective::timeoutFromSeconds(scenario.timeoutS);
  RankProgress progress;
  std::mutex storeMutex;
  std::shared_ptr<collective::KeyValueStore> evidenceStore;  // the watcher's own connection
  // A termination signal (the launcher tearing the job down, Ctrl-C, the local launcher's
  // SIGTERM): hand on what this rank did, at once and bounded, then exit with the signal.
  TerminationWatcher watcher([&](int signal) {
    const auto results = progress.snapshot(scenario, launch.rank, signal);
    if (!gatherOnRankZero) {
      scenario::writeOutputFile(launch.resultFile, rankResultsDocument(results));
      return;
    }
    std::shared_ptr<collective::KeyValueStore> kv;
    {
      std::lock_guard<std::mutex> lock(storeMutex);
      kv = evidenceStore;
    }
    std::string storeProblem = kv ? "" : "the rank had not joined the store yet";
    const bool reporting = launch.rank == 0 && onInterrupted;
    // The reporting rank keeps its own results (nobody reads them from the store), so that no
    // store round trip stands between the signal and the report.
    if (kv && !reporting) {
      try {
        kv->set(fmt::format("result/{}", launch.rank), rankResultsDocument(results));
      } catch (const std::exception& error) {
        storeProblem = error.what();
      }
    }
    if (!reporting) {
      if (!storeProblem.empty()) {
        fmt::print(stderr,
                   "hmc-run rank {}: stopped by signal {}; cannot hand on its results: {}\n",
                   launch.rank, signal, storeProblem);
      }
      return;
    }
    // Rank 0 reports. The others publish theirs as they receive the same signal: wait briefly
    // for them. The store may be gone with the launcher's agent that hosted it: then rank 0
    // reports what it knows itself.
    std::vector<std::vector<scenario::RankResult>> merged;
    if (storeProblem.empty()) {
      // Bounded even when the store stalls (a launcher's SIGKILL follows soon): the gather
      // runs on its own thread, abandoned past its time (the process exits right after).
      auto gathered =
          std::make_shared<std::promise<std::vector<std::vector<scenario::RankResult>>>>();
      auto future = gathered->get_future();
      std::thread([gathered, kv, &launch] {
        try {
          gathered->set_value(gatherResults(*kv, launch, interruptGatherFor(launch.launcher)));
        } catch (...) {
          gathered->set_exception(std::current_exception());
        }
      }).detach();
      const auto bound = interruptGatherFor(launch.launcher) + kInterruptRead;
      if (future.wait_for(bound) != std::future_status::ready) {
        storeProblem = fmt::format("the store did not answer within {} ms", bound.count());
      } else {
        try {
          merged = future.get();
          // Rank 0's own results, as it has them now (the store holds only a finished run's).
          if (merged.size() < results.size()) {
            std::vector<scenario::RankResult> missing;
            for (int rank = 0; rank < launch.worldSize; ++rank) {
              missing.push_back(missingRankResult(
                  rank, fmt::format("no result from rank {} for this repetition", rank),
                  "not checked", {}));
            }
            merged.resize(results.size(), missing);
          }
          for (std::size_t r = 0; r < results.size(); ++r) merged[r][launch.rank] = results[r];
        } catch (const std::exception& error) {
          storeProblem = error.what();
        }
      }
    }
    if (!storeProblem.empty()) {
      merged.assign(std::max<std::size_t>(1, results.size()),
                    std::vector<scenario::RankResult>(launch.worldSize));
      for (std::size_t r = 0; r < merged.size(); ++r) {
        for (int rank = 0; rank < launch.worldSize; ++rank) {
          merged[r][rank] =
              rank == launch.rank && r < results.size()
                  ? results[r]
                  : missingRankResult(rank,
                                      "unknown: the store was gone when rank 0 was stopped (" +
                                          storeProblem + ")",
                                      "not checked", {});
        }
      }
    }
    onInterrupted(std::move(merged), signal);
  });
  const collective::ProcessTransport transport =
      collective::makeTransport(launch.transport, launch.transportOptions(timeout));
  // The control store: out-of-band votes and results (and the `store` transport itself).
  std::shared_ptr<collective::KeyValueStore> kv = transport.control->keyValueStore();
  {
    std::lock_guard<std::mutex> lock(storeMutex);
    evidenceStore = transport.control->keyValueStore();
  }

  RankProcessOutcome outcome;
  bool everyoneClean = true;
  for (int repetition = 0; repetition < launch.repetitions && everyoneClean; ++repetition) {
    scenario::RankEnvironment env;
    env.collective = transport.collective;
    env.recorder = std::make_shared<diagnostics::FlightRecorder>(launch.flightCapacity, env.epoch);
    env.crash = [] { _exit(kCrashExitStatus); };
    env.onStep = [&progress](const scenario::StepResult& step) { progress.stepDone(step); };
    progress.beginRepetition(env.recorder);
    env.agreeOnShutdown = [&, repetition](bool clean) {
      const std::string stem = fmt::format("vote/{}", repetition);
      kv->set(fmt::format("{}/{}", stem, launch.rank), clean ? "1" : "0");
      // A dead rank never votes: stop waiting for it (it cannot shut down cleanly anyway).
      everyoneClean = waitForRanks(*kv, stem, launch.worldSize, Clock::now() + timeout);
      for (const auto& key : rankKeys(stem, launch.worldSize)) {
        if (!everyoneClean) break;
        everyoneClean = kv->get(key, timeout) == "1";
      }
      // Every rank voted here, so every rank has read the previous repetition's votes: drop
      // this rank's, or a long --repetitions run grows the store by world_size keys each time.
      if (everyoneClean && repetition > 0) {
        kv->deleteKey(fmt::format("vote/{}/{}", repetition - 1, launch.rank));
      }
      return everyoneClean;
    };
    {
      // Publishes this rank's flight record out of band when a collective passes its deadline
      // (diagnostics/watchdog.hpp); its own store connection.
      diagnostics::WatchdogOptions watch;
      watch.rank = launch.rank;
      watch.deadline = timeout;
      // Rank 0 names the job for `hmc-run status`; SIGUSR1 dumps the flight record to stderr.
      if (launch.rank == 0) {
        watch.meta = diagnostics::JobMeta{scenario.name, launch.worldSize, scenario.timeoutS,
                                          std::string(collective::toString(launch.transport)),
                                          diagnostics::unixNow()};
      }
      watch.dumpSignal = SIGUSR1;
      diagnostics::Watchdog watchdog(env.recorder, transport.control->keyValueStore(), watch);
      outcome.results.push_back(scenario::runRank(scenario, env));
    }
    progress.repetitionDone(outcome.results.back());
    if (!gatherOnRankZero) {
      scenario::writeOutputFile(launch.resultFile, rankResultsDocument(outcome.results));
    }
    // After a hang or a crash (every rank knows from the vote) there is no world to repeat
    // with.
  }
  // The hosting rank's transport waits (bounded) in its destructor until every rank left.
  if (!gatherOnRankZero) return outcome;

  kv->set(fmt::format("result/{}", launch.rank), rankResultsDocument(outcome.results));
  if (launch.rank != 0) {
    // Wait (bounded) until rank 0 has read every result before the store may go away.
    waitForKeys(*kv, {"results-read"}, Clock::now() + timeout);
    return outcome;
  }
  outcome.merged = gatherResults(*kv, launch, timeout);
  kv->set("results-read", "1");
  return outcome;
}

}  // namespace hmc::app
