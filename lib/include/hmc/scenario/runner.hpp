#pragma once
// The per-rank step runner: runs a scenario's steps on one rank with the semantics of
// scenario-format.md (the reference runner shared/oracle/run_oracle.py is the executable
// definition) and returns what happened as data. Transport-agnostic: the caller supplies
// the rank's collective and what "crash" and the end-of-run agreement mean for it.

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

enum class StepStatus { kOk, kError, kHang, kSkipped, kNotRun };
std::string_view toString(StepStatus status) noexcept;
StepStatus stepStatusFromString(std::string_view text);

struct StepResult {
  int index = 0;
  std::string op;
  std::optional<std::string> module;
  std::optional<std::string> label;
  StepStatus status = StepStatus::kOk;
  bool expected = true;
  double seconds = 0;
  double startS = 0;  // since the run's epoch
  std::optional<std::string> errorKind;
  std::optional<std::string> errorMessage;
  std::optional<nlohmann::json> bind;      // {binding_id, reused, seconds}
  std::optional<nlohmann::json> mismatch;  // the manager's manifest diagnosis
};

struct FinalState {
  std::int64_t groups = 0;
  std::int64_t boundGroups = 0;
  bool runtimeLive = false;
};

// What a run on a CUDA device left behind on one rank (LeakCheck::device). hmc's own figures
// (the rank's accounting and the device registry) decide `leaked`; cudaMemGetInfo's before
// and after are informative: they also see LibTorch's caching allocator, the CUDA context and
// other ranks or processes on the same GPU.
struct DeviceLeakCheck {
  int device = 0;                               // the rank's CUDA device index
  std::optional<std::int64_t> freeBytesBefore;  // cudaMemGetInfo before the first step
  std::optional<std::int64_t> freeBytesAfter;   // ... after the automatic shutdown
  std::int64_t totalBytes = 0;
  std::string memoryInfoError;         // why a cudaMemGetInfo figure is missing, or ""
  std::int64_t bytesAllocated = 0;     // device bytes hmc allocated for this rank's workspaces
  std::int64_t bytesHeld = 0;          // ... still allocated after the shutdown
  std::int64_t streamsHeld = 0;        // workspace streams not destroyed
  std::int64_t eventsHeld = 0;         // workspace events not destroyed
  std::int64_t communicatorsHeld = 0;  // NCCL communicators of the rank's runtime still live
  // Device registry records of this rank created during the run and still live:
  // [{kind, device, bytes, owner}] (the owner names rank, module type and device).
  nlohmann::json live = nlohmann::json::array();

  bool leaked() const noexcept {
    return bytesHeld > 0 || streamsHeld > 0 || eventsHeld > 0 || communicatorsHeld > 0;
  }
};

// What an automatic shutdown after the last step left behind on one rank.
struct LeakCheck {
  bool checked = false;
  std::string reason;  // why it was not checked, or ""
  std::optional<std::string> shutdownError;
  std::int64_t groups = 0;
  std::int64_t boundGroups = 0;
  bool runtimeLive = false;
  std::int64_t bytesHeld = 0;
  std::int64_t workspacesHeld = 0;
  std::int64_t bytesAllocated = 0;
  std::int64_t workspacesCreated = 0;
  // [{module, binding_id, bytes, ...}]; CUDA workspaces add "device": "cuda:N".
  nlohmann::json heldBy = nlohmann::json::array();
  // Set when the rank's inputs were on a CUDA device; absent on CPU runs.
  std::optional<DeviceLeakCheck> device;

  bool leaked() const noexcept {
    return groups > 0 || boundGroups > 0 || runtimeLive || bytesHeld > 0 || workspacesHeld > 0 ||
           (device && device->leaked());
  }
};

// Samples in seconds, for the report's timings.
struct TimingSamples {
  std::vector<double> freshBind;
  std::vector<double> reusedBind;
  std::vector<double> close;
  std::vector<double> exchange;
};

struct RankResult {
  int rank = 0;
  bool crashed = false;
  std::optional<std::string> crashReason;
  bool hung = false;
  std::vector<StepResult> steps;
  FinalState final;
  LeakCheck leaks;
  TimingSamples timings;
  std::vector<diagnostics::FlightEntry> flight;
  std::uint64_t collectives = 0;

  nlohmann::json toJson() const;
  static RankResult fromJson(const nlohmann::json& value);
};

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
  // Called after every top-level step (progress, watchdog).
  std::function<void(const StepResult&)> onStep;
};

// Runs every step of `scenario` on `env.collective->rank()`. Never throws for what a step
// does; throws only when the environment itself is unusable.
RankResult runRank(const Scenario& scenario, RankEnvironment& env);

// Limits LibTorch's intra-op threads (thread ranks each run their own small matmuls).
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

// Whether a finished step met its expectation (the reference runner's `met`).
bool expectationMet(const Step& step, const StepResult& result);

}  // namespace hmc::scenario
