#include "rank_process.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "evidence_folder.hpp"
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

// How long the reporting rank waits for the others' results after a termination signal (they
// write theirs to the local evidence folder within milliseconds of the same signal, then to
// the store). Under mpirun the report is made at Open MPI's SIGCONT, 1 s before its SIGTERM
// (which SIGKILL follows within 20-50 ms, seen with strace: odls_base_sigkill_timeout is the
// time between the two signals, not after SIGTERM), so the waits must fit in that second: at
// most 400 ms for the local files of the ranks still alive, and the store read once without
// waiting. torchrun and srun give seconds after SIGTERM.
std::chrono::milliseconds interruptLocalWait(const std::string& launcher) {
  return launcher == "mpirun" ? std::chrono::milliseconds(400) : std::chrono::milliseconds(1000);
}
std::chrono::milliseconds interruptStoreWait(const std::string& launcher) {
  return launcher == "mpirun" ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000);
}
// How long the reporting rank waits for a live rank's final file (written at its own SIGTERM)
// before it takes that rank's early snapshot instead (written at Open MPI's SIGCONT).
constexpr std::chrono::milliseconds kUseEarlySnapshotAfter{20};
// A report made at Open MPI's warning is printed at the SIGTERM that follows within about 1 s;
// one older than this (the warning was not a teardown) is made again.
constexpr std::chrono::seconds kEarlyReportFresh{3};
// The bound on reading the store beyond the wait, should the store not answer.
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

// Whether rank `rank` is known to be gone: announced dead in the store (hmc-run's own launcher
// does that), or its process on this node ended (the evidence folder's pid file: torchrun,
// mpirun and srun announce nothing, and Open MPI tears the job down 1 s after a rank's death,
// so nobody may wait for a dead rank's vote or result up to the deadline). A rank found gone
// through the folder is announced in the store for ranks on other nodes and `hmc-run status`.
bool rankGone(collective::KeyValueStore& kv, const EvidenceFolder* folder, int rank, int self) {
  if (folder != nullptr && folder->known(rank) && !folder->alive(rank)) {
    try {
      if (!kv.check({collective::deadRankKey(rank)})) {
        collective::announceDeadRank(
            kv, rank,
            fmt::format("rank {}'s process ended (seen by rank {} on its node)", rank, self));
      }
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: cannot announce rank {}'s end in the store: {}", self, rank,
                    error.what());
    }
    return true;
  }
  return kv.check({collective::kAnyDeadKey}) && kv.check({collective::deadRankKey(rank)});
}

// Polls for every rank's "<stem>/<rank>" until all exist, a rank whose key is missing is gone
// (rankGone), or `deadline` passes.
bool waitForRanks(collective::KeyValueStore& kv, const std::string& stem, int worldSize,
                  Clock::time_point deadline, const EvidenceFolder* folder, int self) {
  const auto keys = rankKeys(stem, worldSize);
  for (int round = 0;; ++round) {
    if (kv.check(keys)) return true;
    if (round % 10 == 9) {  // every ~50 ms
      for (int rank = 0; rank < worldSize; ++rank) {
        if (!kv.check({keys[rank]}) && rankGone(kv, folder, rank, self)) return false;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Polls for rank `rank`'s `key` until it exists (true), the rank is gone (rankGone), or
// `deadline` passes.
bool waitForRankKey(collective::KeyValueStore& kv, const std::string& key, int rank,
                    Clock::time_point deadline, const EvidenceFolder* folder, int self) {
  for (int round = 0;; ++round) {
    if (kv.check({key})) return true;
    if (round % 10 == 9 && rankGone(kv, folder, rank, self)) return kv.check({key});
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

std::string repetitionResultFile(const std::string& stem, std::size_t repetition) {
  return fmt::format("{}.{}.json", stem, repetition);
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
// `deadWhy`: the rank's process is known to have ended (the evidence folder): crashed, saying
// so, whatever its heartbeat shows (a heartbeat lags by up to its period).
std::optional<scenario::RankResult> fromHeartbeat(collective::KeyValueStore& kv, int rank,
                                                  std::optional<std::uint64_t> completedByOthers,
                                                  const std::optional<std::string>& deadWhy) {
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
    if (beat.state == diagnostics::RankState::kWaiting && beat.current && !stale && !deadWhy) {
      result.hung = true;
    } else {
      result.crashed = true;
      result.crashReason = fmt::format(
          "{}; its last heartbeat ({}): {}",
          deadWhy ? *deadWhy : fmt::format("no result from rank {}: it died or was stopped", rank),
          diagnostics::toString(beat.state),
          beat.step < 0 ? std::string("outside its steps") : fmt::format("in step {}", beat.step));
    }
    return result;
  } catch (const std::exception& error) {
    spdlog::debug("rank {}'s heartbeat: {}", rank, error.what());
    return std::nullopt;
  }
}

// What the store's loss is called in this launch: rank 0 hosts the store unless the
// launcher's agent does (torchrun).
std::string storeHostName(const RankLaunch& launch) {
  return launch.agentHostsStore ? std::string("the store's host (the launcher's agent)")
                                : std::string("the store's host (rank 0)");
}

using ResultsByRank = std::map<int, std::vector<scenario::RankResult>>;
// Why a rank without results has none: the crash reason for rank `rank`.
using MissingWhy = std::function<std::string(int rank)>;

// The results the other ranks wrote to the local evidence folder: polls until every rank of
// this node that is still alive wrote its own, or `deadline` passes. With `earlyAfter`, a rank
// whose final file is still missing that long after the call is taken from its early snapshot
// (EvidenceFolder::writeResults), if it wrote one.
ResultsByRank readLocalResults(const EvidenceFolder& local, int worldSize, int self,
                               Clock::time_point deadline,
                               std::optional<std::chrono::milliseconds> earlyAfter = std::nullopt) {
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

// The reporting rank: every rank's results, from `local` (the evidence folder's files) first,
// then the store `kv` (waiting up to `wait` for results; nullptr: the store is gone, or a
// store that fails is given up at its first error), then a rank's heartbeat or published
// flight record; a rank without any is a crashed rank saying `missingWhy`.
std::vector<std::vector<scenario::RankResult>> gatherResults(
    collective::KeyValueStore* kv, const RankLaunch& launch, ResultsByRank local,
    std::chrono::milliseconds wait, const MissingWhy& missingWhy, const EvidenceFolder& folder) {
  std::vector<std::vector<scenario::RankResult>> byRank(launch.worldSize);
  const auto deadline = Clock::now() + wait;
  std::string storeFailed;
  const auto fromStore = [&](auto&& read) {
    if (kv == nullptr || !storeFailed.empty()) return;
    try {
      read();
    } catch (const std::exception& error) {
      // Debug level only: in a launcher's teardown the launcher may stop reading this rank's
      // stderr, and a blocked write would hold the log's lock that the report path needs.
      storeFailed = error.what();
      spdlog::debug("rank {}: the store failed while gathering results: {}", launch.rank,
                    storeFailed);
    }
  };
  std::size_t repetitions = 1;
  for (int rank = 0; rank < launch.worldSize; ++rank) {
    if (auto it = local.find(rank); it != local.end()) {
      byRank[rank] = std::move(it->second);
    } else {
      fromStore([&] {
        const std::string key = fmt::format("result/{}", rank);
        if (!waitForRankKey(*kv, key, rank, deadline, &folder, launch.rank)) return;
        const std::string text = kv->get(key, wait + kInterruptRead);
        try {
          byRank[rank] = parseRankResults(text);
        } catch (const std::exception& error) {
          spdlog::warn("rank {} sent unreadable results: {}", rank, error.what());
        }
      });
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
  std::optional<std::map<int, diagnostics::PublishedFlight>> published;
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
      std::optional<scenario::RankResult> seen;
      std::optional<std::string> deadWhy;
      if (folder.known(rank) && !folder.alive(rank)) deadWhy = missingWhy(rank);
      fromStore([&] { seen = fromHeartbeat(*kv, rank, completedByOthers, deadWhy); });
      if (seen) {
        merged[r][rank] = std::move(*seen);
        continue;
      }
      if (!published) {
        published.emplace();
        fromStore([&] { *published = diagnostics::readPublishedFlights(*kv, launch.worldSize); });
      }
      merged[r][rank] = missingRankResult(rank, missingWhy(rank),
                                          "no result from this rank: not checked", *published);
    }
  }
  return merged;
}

// What the rank has done so far, for the termination watcher (another thread): the finished
// repetitions (kept only when `keepDone`: the store gathers them at the end; otherwise each
// was handed on as it ended), and the current one's finished steps and flight recorder.
class RankProgress {
 public:
  explicit RankProgress(bool keepDone) : keepDone_(keepDone) {}

  void beginRepetition(std::shared_ptr<diagnostics::FlightRecorder> recorder) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.clear();
    recorder_ = std::move(recorder);
  }
  void stepDone(const scenario::StepResult& step) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.push_back(step);
  }
  // `handOn` runs under the lock: a signal's snapshot sees the repetition either running or
  // handed on, never both nor neither.
  void repetitionDone(const scenario::RankResult& result, const std::function<void()>& handOn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handOn) handOn();
    if (keepDone_) done_.push_back(result);
    ++completed_;
    steps_.clear();
    recorder_.reset();
  }

  struct Snapshot {
    std::size_t first = 0;  // the repetition of results[0]
    std::vector<scenario::RankResult> results;
  };
  // The finished repetitions kept, plus the current one as far as it got when `signal` stopped
  // the rank: a rank waiting in a collective records a hang there (so the report's hang
  // diagnosis says where it waited); otherwise it is a rank stopped in a step.
  Snapshot snapshot(const scenario::Scenario& scenario, int rank, int signal) const {
    std::lock_guard<std::mutex> lock(mutex_);
    Snapshot snap{completed_ - done_.size(), done_};
    std::vector<scenario::RankResult>& results = snap.results;
    if (!recorder_) return snap;
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
    return snap;
  }

 private:
  mutable std::mutex mutex_;
  bool keepDone_;
  std::size_t completed_ = 0;
  std::vector<scenario::RankResult> done_;
  std::vector<scenario::StepResult> steps_;
  std::shared_ptr<diagnostics::FlightRecorder> recorder_;
};

}  // namespace

namespace {

// A rank of this node whose process is gone and left no result.
std::string endedWithoutResult(int rank, int reporter) {
  return fmt::format("rank {}'s process ended without a result (killed or crashed){}", rank,
                     rank == 0 && reporter != 0
                         ? fmt::format("; rank {} reports in its place", reporter)
                         : std::string());
}

// Every rank's results for the report, with this rank's own (as it has them now) in place.
std::vector<std::vector<scenario::RankResult>> withOwn(
    std::vector<std::vector<scenario::RankResult>> merged,
    const std::vector<scenario::RankResult>& own, const RankLaunch& launch) {
  if (merged.size() < own.size()) {
    std::vector<scenario::RankResult> missing;
    for (int rank = 0; rank < launch.worldSize; ++rank) {
      missing.push_back(
          missingRankResult(rank, fmt::format("no result from rank {} for this repetition", rank),
                            "not checked", {}));
    }
    merged.resize(own.size(), missing);
  }
  for (std::size_t r = 0; r < own.size(); ++r) merged[r][launch.rank] = own[r];
  return merged;
}

// A rank that lost the store: the step that failed because of it (the last one that hung on
// a rank failure) says so; a rank whose steps all passed says it in its leak check.
void recordLostStore(scenario::RankResult& result, const std::string& host,
                     const std::string& error) {
  for (auto it = result.steps.rbegin(); it != result.steps.rend(); ++it) {
    if (it->status == scenario::StepStatus::kHang && it->error &&
        it->error->kind == ErrorKind::kRankFailure) {
      it->error->message += fmt::format("; lost {}: {}", host, error);
      return;
    }
  }
  result.leaks.reason =
      fmt::format("lost {} in the end-of-run vote ({}): not checked", host, error);
}

// Forms this rank's world (collective::makeTransport). Under hmc-run's own launcher a rank that
// could not join leaves a result saying so, which the launcher reports (a rank process that
// ended without one reads as a crash).
collective::ProcessTransport formWorld(const RankLaunch& launch, std::chrono::milliseconds timeout,
                                       bool gatherOnRankZero) {
  try {
    return collective::makeTransport(launch.transport, launch.transportOptions(timeout));
  } catch (const std::exception& error) {
    if (gatherOnRankZero) throw;
    scenario::RankResult result;
    result.rank = launch.rank;
    result.crashed = true;
    result.crashReason = fmt::format("could not join its world: {}", error.what());
    result.leaks.reason = "the rank did not join its world: not checked";
    try {
      scenario::writeOutputFile(repetitionResultFile(launch.resultFile, 0),
                                rankResultsDocument({result}));
    } catch (const std::exception& writeError) {
      spdlog::debug("rank {}: cannot write its result: {}", launch.rank, writeError.what());
    }
    throw;
  }
}

}  // namespace

RankProcessOutcome runRankProcess(const scenario::Scenario& scenario, const RankLaunch& launch,
                                  bool gatherOnRankZero, const InterruptedReport& onInterrupted) {
  const auto timeout = collective::timeoutFromSeconds(scenario.timeoutS);
  RankProgress progress(gatherOnRankZero);
  std::mutex storeMutex;
  std::shared_ptr<collective::KeyValueStore> evidenceStore;  // the watcher's own connection
  // Under a launcher: results that need no store (evidence_folder.hpp). The reporting rank is
  // rank 0, or, when rank 0's process is gone, the lowest rank of its node still alive.
  EvidenceFolder local;
  // A termination signal (the launcher tearing the job down, Ctrl-C, the local launcher's
  // SIGTERM): hand on what this rank did, at once and bounded, then exit with the signal.
  // Who hands on this rank's results after losing the store: the main thread (it has every
  // rank's results and reports them; a launcher's SIGTERM then must not end the process in the
  // middle of it) or the watcher (a termination signal came first; it reports and exits), the
  // first to claim it. Both at once left a half-removed evidence folder.
  enum : int { kNobody = 0, kMainThread = 1, kWatcher = 2 };
  std::atomic<int> handingOn{kNobody};
  // What the watcher's thread knows of a report made at Open MPI's warning (kEarly).
  std::optional<Clock::time_point> earlyReportAt;
  // Hands on what this rank did, on the watcher's thread: at a termination signal (`early`
  // false), and under mpirun at Open MPI's warning, the SIGCONT it sends 1 s before its SIGTERM
  // (`early` true; SIGKILL follows SIGTERM within 20-50 ms, too soon to gather anything then).
  // At the warning every rank writes an early snapshot of its results (as stopped by SIGTERM,
  // which follows) to the evidence folder only (the job may yet go on: nothing a normal end
  // reads), and the reporting rank writes the report's files from them and keeps the console's
  // text, which it prints at the SIGTERM.
  const auto handOn = [&](int signal, bool early) {
    // The main thread reports and exits by itself (the watcher's hard limit still bounds it).
    if (early) {
      if (handingOn.load() == kMainThread) return true;
    } else if (int nobody = kNobody; !handingOn.compare_exchange_strong(nobody, kWatcher)) {
      return false;
    }
    const auto snap = progress.snapshot(scenario, launch.rank, signal);
    const auto& results = snap.results;
    if (!gatherOnRankZero) {
      // Only the current repetition's: the finished ones are in their files.
      if (!results.empty()) {
        scenario::writeOutputFile(repetitionResultFile(launch.resultFile, snap.first),
                                  rankResultsDocument(results));
      }
      return true;
    }
    const std::string document = rankResultsDocument(results);
    std::shared_ptr<collective::KeyValueStore> kv;
    EvidenceFolder folder;
    {
      std::lock_guard<std::mutex> lock(storeMutex);
      kv = evidenceStore;
      folder = local;
    }
    // Who reports, decided before this rank's file exists: a reporting rank that finds every
    // file it waits for removes the folder and exits. Then the local file: it needs no store,
    // which may stall or be gone in a teardown.
    const int reporter = folder.usable() ? folder.lowestLiveRank(launch.worldSize) : 0;
    const bool reporting = launch.rank == reporter && onInterrupted;
    if (!early && reporting && earlyReportAt && Clock::now() - *earlyReportAt < kEarlyReportFresh) {
      folder.remove();
      onInterrupted({}, signal, InterruptMode::kPublishEarly);
      return true;
    }
    // The report was made at Open MPI's warning: nothing more to hand on.
    if (!early && !reporting && folder.reported()) return true;
    const std::string localProblem = folder.writeResults(document, early);
    if (early && !reporting) return true;
    std::string storeProblem = kv ? "" : "the rank had not joined the store yet";
    if (!reporting) {
      // The store too, for a reporting rank on another node.
      if (kv) {
        try {
          kv->set(fmt::format("result/{}", launch.rank), document);
        } catch (const std::exception& error) {
          storeProblem = error.what();
        }
      }
      if (!storeProblem.empty() && !localProblem.empty()) {
        fmt::print(stderr,
                   "hmc-run rank {}: stopped by signal {}; cannot hand on its results: {}; {}\n",
                   launch.rank, signal, storeProblem, localProblem);
      }
      return true;
    }
    // This rank reports. The others write theirs as they receive the same signal: the local
    // files of the ranks still alive (bounded), then the store for the rest (bounded even
    // when the store stalls: a launcher's SIGKILL follows soon; the read runs on its own
    // thread, abandoned past its time, as the process exits right after).
    const auto began = Clock::now();
    ResultsByRank found = readLocalResults(
        folder, launch.worldSize, launch.rank, began + interruptLocalWait(launch.launcher),
        early ? std::chrono::milliseconds(0) : kUseEarlySnapshotAfter);
    const auto localDone = Clock::now();
    const std::size_t others = found.size();
    // Its own results count when judging whether a heartbeat is stale (a crashed rank's last
    // heartbeat may show it waiting in a collective this rank completed).
    found[launch.rank] = results;
    const int self = launch.rank;
    const MissingWhy missingWhy = [self, folder](int rank) {
      if (folder.known(rank) && !folder.alive(rank)) return endedWithoutResult(rank, self);
      return fmt::format(
          "no result from rank {}: it died, was stopped, or never finished its "
          "steps",
          rank);
    };
    std::vector<std::vector<scenario::RankResult>> merged;
    bool gathered = false;
    if (kv && static_cast<int>(found.size()) < launch.worldSize) {
      auto promise =
          std::make_shared<std::promise<std::vector<std::vector<scenario::RankResult>>>>();
      auto future = promise->get_future();
      const auto storeWait =
          early ? std::chrono::milliseconds(200) : interruptStoreWait(launch.launcher);
      std::thread([promise, kv, launch, found, storeWait, missingWhy, folder] {
        try {
          promise->set_value(gatherResults(kv.get(), launch, found, storeWait, missingWhy, folder));
        } catch (...) {
          promise->set_exception(std::current_exception());
        }
      }).detach();
      if (future.wait_for(storeWait + kInterruptRead) == std::future_status::ready) {
        try {
          merged = future.get();
          gathered = true;
        } catch (const std::exception& error) {
          storeProblem = error.what();
        }
      } else {
        storeProblem = fmt::format("the store did not answer within {} ms",
                                   (storeWait + kInterruptRead).count());
      }
    }
    if (!gathered) {
      const MissingWhy unknown = [&](int rank) {
        return storeProblem.empty()
                   ? missingWhy(rank)
                   : fmt::format(
                         "unknown: no result from rank {} in the local evidence folder, "
                         "and the store could not be read when rank {} was stopped ({})",
                         rank, self, storeProblem);
      };
      merged = gatherResults(nullptr, launch, found, std::chrono::milliseconds(0), unknown, folder);
    }
    const auto storeDone = Clock::now();
    if (early) {
      onInterrupted(withOwn(std::move(merged), results, launch), signal, InterruptMode::kEarly);
      earlyReportAt = Clock::now();
      folder.markReported();
    } else {
      folder.remove();  // read: gone before the report, which a SIGKILL may cut short
      onInterrupted(withOwn(std::move(merged), results, launch), signal, InterruptMode::kReport);
    }
    // Only after the report: under mpirun a write to stderr blocked in some teardowns here
    // (Open MPI stops reading the ranks' output), which lost the report when logged before.
    spdlog::debug(
        "rank {}: evidence after signal {}{}: {} local results in {} ms, store {} in {} ms",
        launch.rank, signal, early ? " (early, at SIGCONT)" : "", others,
        std::chrono::duration_cast<std::chrono::milliseconds>(localDone - began).count(),
        gathered ? "read" : (storeProblem.empty() ? "not needed" : storeProblem),
        std::chrono::duration_cast<std::chrono::milliseconds>(storeDone - localDone).count());
    return true;
  };
  const auto onTermination = [&](int signal) { return handOn(signal, false); };
  const auto onWarning = [&] { handOn(SIGTERM, true); };
  // Open MPI's warning only under mpirun: no other launcher sends a SIGCONT to running ranks.
  TerminationWatcher watcher(
      onTermination, 5,
      gatherOnRankZero && launch.launcher == "mpirun" ? std::function<void()>(onWarning) : nullptr);
  if (gatherOnRankZero && launch.rank == 0) {
    auto created = EvidenceFolder::create(launch.rank);
    std::lock_guard<std::mutex> lock(storeMutex);
    local = std::move(created);
  }
  const collective::ProcessTransport transport = formWorld(launch, timeout, gatherOnRankZero);
  // The control store: out-of-band votes and results (and the `store` transport itself).
  std::shared_ptr<collective::KeyValueStore> kv = transport.control->keyValueStore();
  {
    std::lock_guard<std::mutex> lock(storeMutex);
    evidenceStore = transport.control->keyValueStore();
  }
  if (gatherOnRankZero) {
    if (launch.rank == 0) {
      local.announce(*kv);
    } else {
      auto joined = EvidenceFolder::join(*kv, launch.rank, launch.joinTimeout());
      std::lock_guard<std::mutex> lock(storeMutex);
      local = std::move(joined);
    }
  }

  RankProcessOutcome outcome;
  bool everyoneClean = true;
  std::string storeLost;  // the store's error, once a store request failed
  for (int repetition = 0; repetition < launch.repetitions && everyoneClean; ++repetition) {
    scenario::RankResult result;
    scenario::RankEnvironment env;
    env.collective = transport.collective;
    env.recorder = std::make_shared<diagnostics::FlightRecorder>(launch.flightCapacity, env.epoch);
    env.crash = [] { _exit(kCrashExitStatus); };
    env.onStep = [&progress](const scenario::StepResult& step) { progress.stepDone(step); };
    progress.beginRepetition(env.recorder);
    env.agreeOnShutdown = [&, repetition](bool clean) {
      const std::string stem = fmt::format("vote/{}", repetition);
      try {
        kv->set(fmt::format("{}/{}", stem, launch.rank), clean ? "1" : "0");
        // A dead rank never votes: stop waiting for it (it cannot shut down cleanly anyway).
        everyoneClean =
            waitForRanks(*kv, stem, launch.worldSize, Clock::now() + timeout, &local, launch.rank);
        for (const auto& key : rankKeys(stem, launch.worldSize)) {
          if (!everyoneClean) break;
          everyoneClean = kv->get(key, timeout) == "1";
        }
      } catch (const std::exception& error) {
        // The store's host died (rank 0, or the launcher's agent): nobody can agree on
        // anything any more; keep the steps and report what this rank knows.
        storeLost = error.what();
        everyoneClean = false;
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
      result = scenario::runRank(scenario, env);
    }
    if (!storeLost.empty()) recordLostStore(result, storeHostName(launch), storeLost);
    if (gatherOnRankZero) {
      progress.repetitionDone(result, nullptr);
      outcome.results.push_back(std::move(result));
    } else {
      // hmc-run's launcher reads it from there and removes it: a long --repetitions run holds
      // no past repetition here nor in the launcher (scripts/soak).
      progress.repetitionDone(result, [&] {
        scenario::writeOutputFile(
            repetitionResultFile(launch.resultFile, static_cast<std::size_t>(repetition)),
            rankResultsDocument({result}));
      });
    }
    // After a hang or a crash (every rank knows from the vote) there is no world to repeat
    // with.
  }
  // The hosting rank's transport waits (bounded) in its destructor until every rank left.
  if (!gatherOnRankZero) return outcome;

  const std::string document = rankResultsDocument(outcome.results);
  if (storeLost.empty()) {
    try {
      kv->set(fmt::format("result/{}", launch.rank), document);
    } catch (const std::exception& error) {
      storeLost = error.what();
    }
  }
  if (!storeLost.empty()) {
    // No store: the local evidence folder carries the results, and the lowest rank of the node
    // still alive reports (rank 0 hosted the store and is gone).
    const int reporter = local.usable() ? local.lowestLiveRank(launch.worldSize) : -1;
    const std::string localProblem = local.writeResults(document);
    if (reporter != launch.rank) {
      fmt::print(
          stderr, "hmc-run rank {}: lost {} ({}); {}\n", launch.rank, storeHostName(launch),
          storeLost,
          localProblem.empty()
              ? fmt::format("its results are in {} for rank {} to report", local.path(), reporter)
              : fmt::format("its results are lost: {} (rank {} reports what it has)", localProblem,
                            reporter));
      return outcome;
    }
    // Every rank of the node still alive writes its results as it finds the store gone (its
    // own deadline at most): wait for them that long.
    ResultsByRank found = readLocalResults(local, launch.worldSize, launch.rank,
                                           Clock::now() + timeout + std::chrono::seconds(1));
    found[launch.rank] = outcome.results;
    outcome.merged = withOwn(gatherResults(
                                 nullptr, launch, std::move(found), std::chrono::milliseconds(0),
                                 [&](int rank) {
                                   if (local.known(rank) && !local.alive(rank)) {
                                     return endedWithoutResult(rank, launch.rank);
                                   }
                                   return fmt::format(
                                       "no result from rank {}: it lost the store too and "
                                       "wrote nothing to {} within the deadline",
                                       rank, local.path());
                                 },
                                 local),
                             outcome.results, launch);
    if (int nobody = kNobody; !handingOn.compare_exchange_strong(nobody, kMainThread)) {
      // A termination signal came first: the watcher reports and exits the process (its hard
      // limit bounds it).
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    local.remove();
    fmt::print(stderr, "hmc-run rank {}: lost {} ({}); reporting what every rank did\n",
               launch.rank, storeHostName(launch), storeLost);
    return outcome;
  }
  if (launch.rank != 0) {
    // Wait (bounded) until rank 0 has read every result before the store may go away.
    try {
      waitForKeys(*kv, {"results-read"}, Clock::now() + timeout);
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: the store went away before rank 0 read the results: {}", launch.rank,
                    error.what());
    }
    return outcome;
  }
  outcome.merged = gatherResults(
      kv.get(), launch, readLocalResults(local, launch.worldSize, launch.rank, Clock::now()),
      timeout,
      [&](int rank) {
        if (local.known(rank) && !local.alive(rank)) return endedWithoutResult(rank, launch.rank);
        return fmt::format(
            "no result from rank {} within {:g} s: it died, was stopped, or never "
            "finished its steps",
            rank, std::chrono::duration<double>(timeout).count());
      },
      local);
  try {
    kv->set("results-read", "1");
  } catch (const std::exception& error) {
    spdlog::debug("rank 0: cannot mark the results read: {}", error.what());
  }
  // Every result is here: the report is this thread's now, even if a launcher's SIGTERM comes
  // before it is printed (else the watcher, finding the folder removed, would hand on nothing).
  if (int nobody = kNobody; !handingOn.compare_exchange_strong(nobody, kMainThread)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watcher reports
  }
  local.remove();
  return outcome;
}

}  // namespace hmc::app
