#pragma once
// Runs a scenario with every rank as a thread of this process (the `threads` transport):
// fast, deterministic, and able to simulate large worlds. A `crash` fault marks the rank
// failed in the thread world (its peers see rank_failure) and ends its steps.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/threads_transport.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

// Stops a thread run from another thread (Ctrl-C): every rank's pending and next collective
// raises rank_failure with `reason`, so each rank records a hang there and runs no further
// steps; steps that need no collective (sleep, stall) still end by themselves. Thread-safe.
class ThreadInterrupt {
 public:
  void interrupt(const std::string& reason);
  bool interrupted() const;

 private:
  friend std::vector<RankResult> runOnThreads(const Scenario&, const struct ThreadRunOptions&);
  void attach(std::shared_ptr<collective::ThreadWorld> world);
  void detach();

  mutable std::mutex mutex_;
  std::shared_ptr<collective::ThreadWorld> world_;
  std::optional<std::string> reason_;
};

struct ThreadRunOptions {
  std::size_t flightCapacity = 64;
  // Called from rank threads after each top-level step; must be thread-safe.
  std::function<void(int rank, const StepResult&)> onStep;
  // Optional; must outlive the run.
  ThreadInterrupt* interrupt = nullptr;
  // Sample the process once every rank thread ended (rank 0's RankResult::process, shared).
  bool sampleProcess = true;
  // Each rank records its lifecycle calls in this folder (rank-N.hmcrec); nullopt: none.
  std::optional<std::string> recordDirectory;
};

// Blocks until every rank thread has finished; bounded by the scenario's deadlines.
std::vector<RankResult> runOnThreads(const Scenario& scenario,
                                     const ThreadRunOptions& options = {});

// Turns RankWarmUp off where it is "0".
inline constexpr const char* kRankWarmUpVariable = "HMC_RANK_WARM_UP";

// What RankWarmUp runs for `scenario`: one rank on the CPU, the module of the first `create`
// (type, features, workspace_bytes, compat, scope), the first `forward` of it (batch, dtype),
// with backward, then drop and close_all; 30 s deadline. Steps inside `repeat` count; `ranks`
// and `expect` are dropped; features, workspace_bytes and batch are capped at the limits below.
// nullopt when no step creates a module, or when the first forward of it is on CUDA (its own
// `device`, or the scenario's "cuda").
inline constexpr std::int64_t kWarmUpMaxFeatures = 64;
inline constexpr std::int64_t kWarmUpMaxWorkspaceBytes = 64 * 1024;
inline constexpr std::int64_t kWarmUpMaxBatch = 64;
std::optional<Scenario> warmUpScenario(const Scenario& scenario);

// LibTorch resolves its symbols (lazily, across the ~290 libraries behind libtorch_cpu), its
// operator handles and its code pages at the first call of each operator in a process: a rank
// process's first cycle of reuse-churn took 18-41 ms on the 2-core machine, later ones 0.2-0.5
// ms. RankWarmUp runs warmUpScenario on a thread world of one rank, on a thread of its own,
// while the rank process forms its world (it waits on the store and its peers then), so the
// first cycle of the real steps finds that done. The default CPU generator's state is put back
// in finish(): the steps draw the numbers they would have drawn without it (nothing else may
// draw from it meanwhile). It does not run for a scenario on CUDA (usesCuda), nor with
// HMC_RANK_WARM_UP=0. It never throws: a warm-up that fails or cannot start says why in the
// debug log, and the steps pay the first calls as before.
class RankWarmUp {
 public:
  explicit RankWarmUp(const Scenario& scenario);
  ~RankWarmUp();
  RankWarmUp(const RankWarmUp&) = delete;
  RankWarmUp& operator=(const RankWarmUp&) = delete;

  // Waits for the warm-up (bounded by its 30 s deadline) and puts the generator back. Once.
  void finish();
  // Why no warm-up runs ("HMC_RANK_WARM_UP=0", ...); "" when one runs.
  const std::string& skipped() const noexcept { return skipped_; }
  // How long the warm-up ran on its thread, once finish() has waited for it.
  const std::optional<collective::Clock::duration>& took() const noexcept { return took_; }

 private:
  std::thread thread_;
  std::function<void()> restoreGenerator_;
  std::string skipped_;
  collective::Clock::time_point start_;
  collective::Clock::time_point end_;  // written by thread_
  std::optional<collective::Clock::duration> took_;
};

}  // namespace hmc::scenario
