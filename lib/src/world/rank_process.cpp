#include "hmc/world/rank_process.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "hmc/collective/transport_factory.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/log.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "hmc/world/evidence_folder.hpp"
#include "hmc/world/rank_progress.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/result_gatherer.hpp"
#include "hmc/world/run_keys.hpp"
#include "hmc/world/signals.hpp"

namespace hmc::world {
namespace {

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

// The exit status of a rank whose results no report will show: a hang where its own results
// show one (or a crash), else a failed expectation (the run's report is incomplete).
scenario::Outcome unreportedOutcome(const std::vector<scenario::RankResult>& own) {
  for (const auto& result : own) {
    if (result.unfinished()) return scenario::Outcome::kHang;
  }
  return scenario::Outcome::kFail;
}

// What a rank whose results are lost did, for its own stderr: its last repetition's first step
// that did not pass ("step 4 (close_all) hang: ..."), else that every step passed.
std::string describeOwn(const std::vector<scenario::RankResult>& own) {
  if (own.empty()) return "no repetition finished";
  for (const auto& step : own.back().steps) {
    if (step.status == scenario::StepStatus::kOk || step.status == scenario::StepStatus::kSkipped)
      continue;
    return fmt::format("step {} ({}) {}{}", step.index, toString(step.op), toString(step.status),
                       step.error ? ": " + step.error->message : std::string());
  }
  return fmt::format("every step of repetition {} passed", own.size());
}

// One rank's side of the run, from its transport on.
class RankRun {
 public:
  RankRun(const scenario::Scenario& scenario, const RankLaunch& launch, RankProgress& progress,
          TerminationHandOff& handOff)
      : scenario_(scenario),
        launch_(launch),
        placement_(launch.placement),
        timeout_(scenario.timeout()),
        progress_(progress),
        handOff_(handOff) {}

  RankProcessOutcome run();

 private:
  void joinWorld();
  collective::ProcessTransport formWorld();
  // The end-of-run agreement of `repetition`, out of band: whether every rank ended it cleanly.
  bool agreeOnShutdown(int repetition, bool clean);
  void runRepetition(int repetition);
  void startTogether();
  // Under an external launcher, once every repetition ran: hand the results on (store, else
  // the evidence folder) and, on the reporting rank, gather every rank's.
  RankProcessOutcome finishUnderLauncher();
  RankProcessOutcome reportWithoutStore(const std::vector<scenario::RankResult>& own);
  // What every way of gathering starts from: this rank, its folder, its own results.
  GatherPlan gatherPlan(const std::vector<scenario::RankResult>& own) const;

  const scenario::Scenario& scenario_;
  const RankLaunch& launch_;
  const RankPlacement& placement_;
  const std::chrono::milliseconds timeout_;
  RankProgress& progress_;
  TerminationHandOff& handOff_;
  // Under a launcher: results that need no store (evidence_folder.hpp).
  EvidenceFolder local_;
  std::optional<collective::ProcessTransport> transport_;
  // The control store: out-of-band votes and results (and the `store` transport itself).
  std::shared_ptr<collective::KeyValueStore> kv_;
  bool everyoneClean_ = true;
  std::string storeLost_;  // the store's error, once a store request failed
  // Under a launcher: ranks on hosts that went down or were cut off (no launcher of ours
  // announces them), so that the vote and the results do not wait a deadline more for them.
  std::optional<SilentRanks> silent_;
};

void RankRun::joinWorld() {
  std::shared_ptr<JoinWatch> watch;
  if (placement_.underLauncher() && placement_.rank == 0) {
    local_ = EvidenceFolder::create(placement_.rank);
    handOff_.setFolder(local_);
    watch = std::make_shared<JoinWatch>(placement_);
    handOff_.setJoinWatch(watch);
  }
  try {
    transport_.emplace(formWorld());
    if (watch) watch->stop();
  } catch (...) {
    if (watch) watch->stop();
    // Rank 0 made the folder for a world that never formed: nobody else knows of it, and it
    // holds only rank 0's pid (a failed start under a launcher left one in /tmp each time).
    local_.remove();
    throw;
  }
  kv_ = transport_->control->keyValueStore();
  handOff_.setStore(transport_->control->keyValueStore());  // the watcher's own connection
  handOff_.setClosedPeers(collective::closedPeersOf(*transport_));
  if (!placement_.underLauncher()) return;
  silent_.emplace(timeout_);
  if (placement_.rank == 0) {
    // As joinWorld says it: the moment the world formed, and where `status` attaches.
    const auto& control = *transport_->control;
    fmt::print(stderr,
               "# hmc-run: world of scenario '{}' ({} ranks) joined ({}, transport {}); store at "
               "{}:{} (attach: hmc-run status --master-addr {} --master-port {})\n",
               scenario_.name, placement_.worldSize, placement_.launcher,
               collective::toString(launch_.transport), control.host(), control.port(),
               control.host(), control.port());
    local_.announce(*kv_);
  } else {
    local_ = EvidenceFolder::join(*kv_, placement_.rank, launch_.joinTimeout);
    handOff_.setFolder(local_);
  }
}

// Forms this rank's world (collective::makeTransport), bounded by the join timeout. Under
// hmc-run's own launcher a rank that could not join leaves a result saying so, which the
// launcher reports (a rank process that ended without one reads as a crash).
collective::ProcessTransport RankRun::formWorld() {
  try {
    return collective::makeTransport(launch_.transport, launch_.transportOptions(timeout_));
  } catch (const std::exception& error) {
    if (placement_.underLauncher()) throw;
    scenario::RankResult result;
    result.rank = placement_.rank;
    result.host = hostName();
    result.pid = processId();
    result.crashed = true;
    result.crashReason = fmt::format("could not join its world: {}", error.what());
    result.leaks.reason = "the rank did not join its world: not checked";
    try {
      scenario::writeOutputFile(repetitionResultFile(launch_.resultFile, 0),
                                rankResultsDocument({result}));
    } catch (const std::exception& writeError) {
      spdlog::debug("rank {}: cannot write its result: {}", placement_.rank, writeError.what());
    }
    throw;
  }
}

bool RankRun::agreeOnShutdown(int repetition, bool clean) {
  try {
    kv_->set(keys::vote(repetition, placement_.rank), clean ? "1" : "0");
    // A dead rank never votes: stop waiting for it (it cannot shut down cleanly anyway).
    const auto voteOf = [repetition](int rank) { return keys::vote(repetition, rank); };
    // A rank that has not voted by the deadline but is at work outside any collective (its
    // heartbeat says running: a stall, a checkpoint) is waited for, as a collective close and
    // the thread ranks' vote wait for it, up to the join timeout: not left with its groups.
    const auto began = Clock::now();
    for (auto deadline = began + timeout_;;) {
      everyoneClean_ = waitForRanks(*kv_, voteOf, placement_.worldSize, deadline, &local_,
                                    placement_.rank, silent_ ? &*silent_ : nullptr);
      if (everyoneClean_ || Clock::now() < deadline ||
          Clock::now() - began >= launch_.joinTimeout) {
        break;
      }
      std::vector<int> absent;
      for (int rank = 0; rank < placement_.worldSize; ++rank) {
        if (!kv_->check({voteOf(rank)})) absent.push_back(rank);
      }
      if (!ranksAtWork(*kv_, fmt::format("{}:{}", placement_.masterAddr, placement_.masterPort),
                       absent, timeout_)) {
        break;
      }
      deadline = Clock::now() + timeout_;
    }
    for (int rank = 0; rank < placement_.worldSize && everyoneClean_; ++rank) {
      everyoneClean_ = kv_->get(voteOf(rank), timeout_) == "1";
    }
  } catch (const std::exception& error) {
    // The store's host died (rank 0, or the launcher's agent): nobody can agree on anything
    // any more; keep the steps and report what this rank knows.
    storeLost_ = error.what();
    everyoneClean_ = false;
  }
  // Every rank voted here, so every rank has read the previous repetition's votes: drop this
  // rank's, or a long --repetitions run grows the store by world_size keys each time.
  if (everyoneClean_ && repetition > 0) {
    kv_->deleteKey(keys::vote(repetition - 1, placement_.rank));
  }
  return everyoneClean_;
}

// Every rank begins its first step at once, as torch.distributed's init_process_group ends in
// a store barrier. Otherwise step 0 of rank 0 (done first: it hosts the store and accepts no
// connection) counted the other ranks' last set-up in its first collective: up to 30 ms on
// the 2-core machine, in about half of the runs of 4 rank processes. Bounded (the collective
// deadline, at most 5 s); where it runs out, the steps start anyway, and their first
// collective names any rank that does not come.
void RankRun::startTogether() {
  const auto wait = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
  try {
    if (kv_->add(keys::kStartCount, 1) == placement_.worldSize) kv_->set(keys::kStartGo, "1");
    kv_->get(keys::kStartGo, wait);
  } catch (const std::exception& error) {
    hmc::logger()->debug("rank {}: starts its steps without the other ranks: {}",
                         placement_.rank, error.what());
  }
}

void RankRun::runRepetition(int repetition) {
  scenario::RankEnvironment env;
  env.collective = transport_->collective;
  env.recorder = std::make_shared<diagnostics::FlightRecorder>(launch_.flightCapacity, env.epoch);
  if (launch_.recordDirectory && repetition == 0) {
    env.recording =
        record::openRankRecording(*launch_.recordDirectory, placement_.rank,
                                  placement_.worldSize, scenario_.name, scenario_.timeoutS);
  }
  env.crash = [] { _exit(kCrashExitStatus); };
  // Under a launcher the results are kept until the end (below), so this process's heap grows
  // by a result each cycle, which its heap-in-use trend would call a leak: it has none
  // (docs/leak-trends.md).
  env.sampleHeap = !placement_.underLauncher();
  env.onStep = [this](const scenario::StepResult& step) { progress_.stepDone(step); };
  env.agreeOnShutdown = [this, repetition](bool clean) {
    return agreeOnShutdown(repetition, clean);
  };
  progress_.beginRepetition(env.recorder);
  scenario::RankResult result;
  {
    // Publishes this rank's flight record out of band when a collective passes its deadline
    // (diagnostics/watchdog.hpp); its own store connection.
    diagnostics::WatchdogOptions watch;
    watch.rank = placement_.rank;
    watch.deadline = timeout_;
    // Rank 0 names the job for `hmc-run status`; SIGUSR1 dumps the flight record to stderr.
    if (placement_.rank == 0) {
      watch.meta = diagnostics::JobMeta{scenario_.name, placement_.worldSize, scenario_.timeoutS,
                                        std::string(collective::toString(launch_.transport)),
                                        diagnostics::unixNow()};
    }
    watch.dumpSignal = SIGUSR1;
    diagnostics::Watchdog watchdog(env.recorder, transport_->control->keyValueStore(), watch);
    // Later repetitions start after the vote of the one before, which every rank waited for.
    if (repetition == 0) startTogether();
    result = scenario::runRank(scenario_, env);
  }
  if (!storeLost_.empty()) recordLostStore(result, placement_.storeHostName(), storeLost_);
  if (placement_.underLauncher()) {
    progress_.repetitionDone(result, nullptr);  // kept: handed on at the end
    return;
  }
  // hmc-run's launcher reads it from there and removes it: a long --repetitions run holds no
  // past repetition here nor in the launcher (scripts/soak).
  progress_.repetitionDone(result, [&] {
    scenario::writeOutputFile(
        repetitionResultFile(launch_.resultFile, static_cast<std::size_t>(repetition)),
        rankResultsDocument({result}));
  });
}

RankProcessOutcome RankRun::run() {
  // LibTorch's first calls, on a thread of their own while the world forms.
  scenario::RankWarmUp warmUp(scenario_);
  if (!warmUp.skipped().empty()) {
    hmc::logger()->debug("rank {}: no warm-up ({})", placement_.rank, warmUp.skipped());
  }
  joinWorld();
  warmUp.finish();
  // After a hang or a crash (every rank knows from the vote) there is no world to repeat with.
  for (int repetition = 0; repetition < launch_.repetitions && everyoneClean_; ++repetition) {
    runRepetition(repetition);
  }
  // The hosting rank's transport waits (bounded) in its destructor until every rank left.
  if (!placement_.underLauncher()) return {};
  return finishUnderLauncher();
}

RankProcessOutcome RankRun::finishUnderLauncher() {
  const std::vector<scenario::RankResult> own = progress_.done();
  if (storeLost_.empty()) {
    try {
      kv_->set(keys::result(placement_.rank), rankResultsDocument(own));
    } catch (const std::exception& error) {
      storeLost_ = error.what();
    }
  }
  if (!storeLost_.empty()) return reportWithoutStore(own);
  if (placement_.rank != 0) {
    // Wait (bounded) until rank 0 has read every result before the store may go away.
    try {
      waitForKeys(*kv_, {keys::kResultsRead}, Clock::now() + timeout_);
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: the store went away before rank 0 read the results: {}",
                    placement_.rank, error.what());
    }
    return {};
  }
  GatherPlan plan = gatherPlan(own);
  plan.kv = kv_;
  plan.storeWait = timeout_;
  plan.silent = silent_;
  plan.missingWhy = missingRankRule(local_, placement_.rank, [this](int rank) {
    return fmt::format(
        "no result from rank {} within {:g} s: it died, was stopped, or never finished its steps",
        rank, std::chrono::duration<double>(timeout_).count());
  });
  Gathered gathered = gatherEveryRank(std::move(plan));
  // A store that did not answer may still be in use by the abandoned read: left alone.
  if (gathered.storeProblem.empty()) {
    try {
      kv_->set(keys::kResultsRead, "1");
    } catch (const std::exception& error) {
      spdlog::debug("rank 0: cannot mark the results read: {}", error.what());
    }
  }
  // Every result is here: the report is this thread's now, even if a launcher's SIGTERM comes
  // before it is printed (else the watcher, finding the folder removed, would hand on nothing).
  handOff_.claimOrAwaitSignalExit();
  local_.remove();
  RankProcessOutcome outcome;
  outcome.merged = std::move(gathered.merged);
  return outcome;
}

GatherPlan RankRun::gatherPlan(const std::vector<scenario::RankResult>& own) const {
  GatherPlan plan;
  plan.placement = placement_;
  plan.folder = local_;
  plan.own = own;
  return plan;
}

// No store: the local evidence folder carries the results, and the lowest rank of the node
// still alive reports (rank 0 hosted the store and is gone).
RankProcessOutcome RankRun::reportWithoutStore(const std::vector<scenario::RankResult>& own) {
  const int self = placement_.rank;
  const std::string host = placement_.storeHostName();
  const int reporter = local_.usable() ? local_.lowestLiveRank(placement_.worldSize) : -1;
  const std::string localProblem = local_.writeResults(rankResultsDocument(own));
  if (reporter != self) {
    RankProcessOutcome outcome;
    if (localProblem.empty()) {
      fmt::print(stderr,
                 "hmc-run rank {}: lost {} ({}); its results are in {} for rank {} to report\n",
                 self, host, storeLost_, local_.path(), reporter);
      return outcome;
    }
    // Nobody can report this rank's results: say what it did here, and exit with it.
    outcome.unreported = unreportedOutcome(own);
    fmt::print(stderr,
               "hmc-run rank {}: lost {} ({}); its results are lost: {}, so no rank reports them "
               "({}); this rank: {}\n",
               self, host, storeLost_, localProblem,
               reporter < 0
                   ? fmt::format("the evidence folder is on rank 0's host, not on {}", hostName())
                   : fmt::format("rank {} reports the others of this host", reporter),
               describeOwn(own));
    return outcome;
  }
  // Every rank of the node still alive writes its results as it finds the store gone (its own
  // deadline at most): wait for them that long.
  GatherPlan plan = gatherPlan(own);
  plan.localDeadline = Clock::now() + timeout_ + std::chrono::seconds(1);
  plan.noStore = storeLost_;
  plan.missingWhy = missingRankRule(local_, self, [this](int rank) {
    return fmt::format(
        "no result from rank {}: it lost the store too and wrote nothing to {} within the "
        "deadline",
        rank, local_.path());
  });
  Gathered gathered = gatherEveryRank(std::move(plan));
  // A rank of another host had no way to send its result here: not known to have crashed
  // (each such rank prints on its own output what it did). Only this host's ranks, whose pids
  // the folder holds, are known to have ended.
  for (auto& repetition : gathered.merged) {
    for (auto& result : repetition) {
      if (result.rank == self || !result.crashed || !result.steps.empty() ||
          local_.known(result.rank)) {
        continue;
      }
      result.crashed = false;
      result.resultLost = true;
      result.crashReason = fmt::format(
          "no result: it runs on another host than rank {} ({}), which reports in rank 0's "
          "place, and with {} gone its result had no way here; its own output says what it did",
          self, hostName(), host);
    }
  }
  // A termination signal that came first owns the end: its thread reports and exits.
  handOff_.claimOrAwaitSignalExit();
  local_.remove();
  fmt::print(stderr, "hmc-run rank {}: lost {} ({}); reporting what every rank did\n", self, host,
             storeLost_);
  RankProcessOutcome outcome;
  outcome.merged = std::move(gathered.merged);
  return outcome;
}

}  // namespace

RankProcessOutcome runRankProcess(const scenario::Scenario& scenario, const RankLaunch& launch,
                                  const InterruptedReport& onInterrupted) {
  const RankPlacement& placement = launch.placement;
  RankProgress progress(placement.underLauncher());
  TerminationHandOff handOff(scenario, launch, progress, onInterrupted);
  // Open MPI's warning only under mpirun: no other launcher sends a SIGCONT to running ranks.
  TerminationWatcher watcher([&handOff](int signal) { return handOff.onSignal(signal); }, 5,
                             placement.launcher == "mpirun"
                                 ? std::function<void()>([&handOff] { handOff.onWarning(SIGTERM); })
                                 : nullptr);
  RankRun run(scenario, launch, progress, handOff);
  return run.run();
}

}  // namespace hmc::world
