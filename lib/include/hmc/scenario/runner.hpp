#pragma once
// The per-rank step runner: runs a scenario's steps on one rank with the semantics of
// scenario-format.md (the reference runner shared/oracle/run_oracle.py is the executable
// definition) and returns what happened as data. Transport-agnostic: the caller supplies
// the rank's collective and what "crash" and the end-of-run agreement mean for it.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/record/recording.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

// Thrown by RankEnvironment::crash where the rank cannot really exit (thread ranks).
class RankCrashed : public std::exception {
 public:
  const char* what() const noexcept override { return "rank crashed (fault crash)"; }
};

struct RankEnvironment {
  std::shared_ptr<collective::Collective> collective;
  // The `crash` fault: a process exits at once (never returns); thread ranks throw
  // RankCrashed after marking themselves failed.
  std::function<void()> crash;
  // Out of band, bounded: every rank says whether it ended its steps cleanly (no hang, no
  // crash); returns true when every rank did, so the collective shutdown can run.
  std::function<bool(bool clean)> agreeOnShutdown;
  collective::Clock::time_point epoch = collective::Clock::now();
  std::size_t flightCapacity = 64;
  // The rank's flight recorder, for a watchdog that reads it from another thread; null:
  // runRank makes its own (flightCapacity, epoch).
  std::shared_ptr<diagnostics::FlightRecorder> recorder;
  // The rank's recording of its lifecycle calls (`--record`); null: none.
  std::shared_ptr<record::Recorder> recording;
  // Called after every top-level step (progress, watchdog).
  std::function<void(const StepResult&)> onStep;
  // Whether this rank samples its process at the end of the run (RankResult::process); thread
  // ranks share one process, which the threads driver samples once they all ended.
  bool sampleProcess = true;
  // With it, the heap in use (ProcessSample::heapBytes); false: none, and no mallinfo2 call.
  bool sampleHeap = true;
};

// Runs every step of `scenario` on `env.collective->rank()`. Never throws for what a step
// does; throws only when the environment itself is unusable.
RankResult runRank(const Scenario& scenario, RankEnvironment& env);

// Limits LibTorch's intra-op threads (thread ranks each run their own small matmuls). Throws
// RuntimeError naming the limit when this process cannot start a thread.
void limitTorchThreads(int threads);
// The device a scenario's inputs land on: "cuda" or "cpu" ("auto" resolved).
std::string resolvedDeviceName(Device device);
// Whether `scenario` puts inputs on CUDA: its device is "cuda" (or "auto" where CUDA is
// usable), or a step asks for "cuda".
bool usesCuda(const Scenario& scenario);
// Why this process cannot put inputs on a CUDA device ("no usable CUDA device: ..."), or ""
// when it can.
std::string cudaUnusableReason();
// The LibTorch version this build runs against ("1.13.1").
std::string torchVersion();
// Saves the state of LibTorch's default CPU generator (the one torch::randn draws from); the
// returned function puts that state back.
std::function<void()> saveCpuGeneratorState();

// Whether a finished step met its expectation (the reference runner's `met`).
bool expectationMet(const Step& step, const StepResult& result);

}  // namespace hmc::scenario
