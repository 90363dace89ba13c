#pragma once
// What one rank did in one run of a scenario, as data: the runner (runner.hpp) fills it, rank
// processes send it to the reporting process in the wire format below, and report.hpp merges
// the ranks' results into a ScenarioReport.
//
// Wire format `hmc-rank-result/1` (toJson / rankResultFromJson): JSON, every field written,
// every field required on reading. A missing or mistyped field is an error naming the field
// (ValueError), never a default: a rank process of another hmc version, or a truncated file,
// must not read as a clean rank.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/enum_names.hpp"
#include "hmc/error.hpp"
#include "hmc/scenario/leak_trend.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

inline constexpr const char* kRankResultFormat = "hmc-rank-result/1";

enum class StepStatus { kOk, kError, kHang, kSkipped, kNotRun };
inline constexpr EnumName<StepStatus> kStepStatusNames[] = {
    {StepStatus::kOk, "ok"},          {StepStatus::kError, "error"},
    {StepStatus::kHang, "hang"},      {StepStatus::kSkipped, "skipped"},
    {StepStatus::kNotRun, "not_run"},
};
constexpr EnumTable<StepStatus> enumTable(StepStatus) { return {"step status", kStepStatusNames}; }
inline std::string_view toString(StepStatus status) noexcept { return enumName(status); }

// The bind of a module's group on its first forward.
struct BindInfo {
  std::int64_t bindingId = 0;
  bool reused = false;  // the resources came from a recycled group
  double seconds = 0;
};

struct StepError {
  ErrorKind kind = ErrorKind::kRuntimeError;
  std::string message;
  // Where it happened (ResourceManager::describeFailure): the collective's stage and sequence,
  // none for a local error; and the collectives the rank had entered before the step.
  std::string stage{};
  std::optional<std::uint64_t> sequence{};
  std::uint64_t collectivesBefore = 0;
};

struct StepResult {
  int index = 0;
  Op op = Op::kBarrier;
  std::optional<std::string> module;
  std::optional<std::string> label;
  StepStatus status = StepStatus::kOk;
  bool expected = true;
  double seconds = 0;
  double startS = 0;  // since the run's epoch
  std::optional<StepError> error;
  std::optional<BindInfo> bind;
  // The manager's manifest diagnosis (ResourceManager::lastMismatch): {stage, ranks' manifests,
  // first_difference}; the lifecycle layer's own document, carried as is.
  std::optional<nlohmann::json> mismatch;
};

struct FinalState {
  std::int64_t groups = 0;
  std::int64_t boundGroups = 0;
  bool runtimeLive = false;
};

// A device handle of the rank still live after the shutdown (the device registry's record).
struct LiveDeviceHandle {
  std::string kind;  // "memory", "stream", "event", "communicator"
  int device = 0;
  std::int64_t bytes = 0;
  std::string owner;
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
  std::vector<LiveDeviceHandle> live;  // created during the run and still live

  bool leaked() const noexcept {
    return bytesHeld > 0 || streamsHeld > 0 || eventsHeld > 0 || communicatorsHeld > 0;
  }
};

// A workspace still held after the shutdown, and who held it.
struct HeldWorkspace {
  std::optional<std::int64_t> bindingId;
  std::optional<std::string> module;  // the live module whose group it is, if any
  std::int64_t bytes = 0;
  std::int64_t pendingBackward = 0;
  bool closing = false;
  std::optional<std::string> device;  // "cuda:N" for CUDA workspaces
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
  std::vector<HeldWorkspace> heldBy;
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
  // Every collective's duration by stage ("recycle", "close validation", ...), in order.
  std::map<std::string, std::vector<double>> collectives;

  // Every collective's duration, all stages together.
  std::vector<double> exchange() const;
};

struct RankResult {
  int rank = 0;
  // Where it ran: its host (hostName()) and process id; "" and 0 when unknown (a rank that
  // died before it said).
  std::string host;
  std::int64_t pid = 0;
  bool crashed = false;
  // Why it crashed, or, when `stopped`, how it was stopped.
  std::optional<std::string> crashReason;
  bool hung = false;
  // Alive and stopped from outside (a launcher's teardown) before its result came: not crashed.
  bool stopped = false;
  // With `stopped`: the world did not form, and this rank had not joined its store when it was
  // stopped (its host and process unknown: it never said). The report's first failure names
  // such ranks, the ones a launcher's teardown most likely followed (world/teardown.hpp).
  bool notJoined = false;
  // Its result could not reach the reporting rank, and what became of it is not known there:
  // the store's host is gone, and the rank runs on another host than the local evidence
  // folder (its own output says what it did). Neither crashed nor stopped; `crashReason`
  // says why nothing came.
  bool resultLost = false;
  // Whether the rank did not come to the end of its steps (as far as the report knows): it
  // hung, crashed, was stopped, or its result was lost.
  bool unfinished() const noexcept { return hung || crashed || stopped || resultLost; }
  std::vector<StepResult> steps;
  FinalState final;
  LeakCheck leaks;
  TimingSamples timings;
  std::vector<diagnostics::FlightEntry> flight;
  std::uint64_t collectives = 0;
  // What its process held at the end of the run (leak_trend.hpp); nullopt when not sampled
  // (thread ranks other than 0, which share rank 0's process).
  std::optional<ProcessSample> process;
};

// The wire format (see the top of this file).
nlohmann::json toJson(const RankResult& result);
RankResult rankResultFromJson(const nlohmann::json& value);

// The report's and the wire format's shape of a leak check (one writer for both).
nlohmann::json toJson(const LeakCheck& leaks);

}  // namespace hmc::scenario
