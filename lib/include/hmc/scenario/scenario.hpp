#pragma once
// The scenario model: an `hmc-scenario/1` file (shared/scenario-format.md) parsed and
// validated. Parsing rejects every rule violation with a ScenarioError that names the file,
// the JSON path (RFC 6901, "/steps/3/features") and what was expected.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::scenario {

inline constexpr const char* kScenarioFormat = "hmc-scenario/1";
inline constexpr int kMaxWorldSize = 4096;
inline constexpr int kMaxRepeatDepth = 8;
// Limits that keep a valid scenario's run bounded (docs/scenario-extensions.md, "Limits").
// A `repeat` field, a repeat op's `count` and a fault's `count`: at most this.
inline constexpr int kMaxRepeat = 1'000'000;
// Steps one rank executes, nested repeats multiplied out (every step counted as if it ran on
// every rank): at most this. At 10 us to 10 ms a step, from minutes to about a day.
inline constexpr std::int64_t kMaxStepsPerRank = 10'000'000;
// One `sleep` or `stall`: at most this many seconds.
inline constexpr int kMaxStepSeconds = 3600;
// All `sleep` and `stall` seconds of one rank, repeats multiplied out: at most one day.
inline constexpr int kMaxSleepSecondsPerRank = 86'400;

enum class Device { kAuto, kCpu, kCuda };
enum class Expect { kOk, kError, kHang, kAny };
enum class Op {
  kCreate,
  kShare,
  kForward,
  kBackward,
  kDrop,
  kClose,
  kCloseAll,
  kCheck,
  kFault,
  kBarrier,
  kSleep,
  kRepeat,
};
enum class FaultKind { kCloseError, kReleaseError, kBusy, kStall, kCrash, kLeak };
// What a `leak` fault keeps on the rank's process each time it runs (hmc's seeded leak, for
// testing the leak-trend check: docs/leak-trends.md).
// kMemory comes from the C allocator (the heap in use sees it); kMapped is anonymous pages of
// its own mmap, outside the allocator (resident memory and resident memory in use see it, the
// heap in use does not).
enum class LeakResource { kMemory, kMapped, kDescriptor, kThread };
// What a scenario expects of the leak-trend check over its repetitions (`leak_trend`).
enum class LeakTrendExpect { kNone, kLeak, kAny };

// The scenario format's names (`device`, `expect`, `op`, a fault's `kind`).
inline constexpr EnumName<Device> kDeviceNames[] = {
    {Device::kAuto, "auto"}, {Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
inline constexpr EnumName<Expect> kExpectNames[] = {
    {Expect::kOk, "ok"}, {Expect::kError, "error"}, {Expect::kHang, "hang"}, {Expect::kAny, "any"}};
inline constexpr EnumName<Op> kOpNames[] = {
    {Op::kCreate, "create"},      {Op::kShare, "share"}, {Op::kForward, "forward"},
    {Op::kBackward, "backward"},  {Op::kDrop, "drop"},   {Op::kClose, "close"},
    {Op::kCloseAll, "close_all"}, {Op::kCheck, "check"}, {Op::kFault, "fault"},
    {Op::kBarrier, "barrier"},    {Op::kSleep, "sleep"}, {Op::kRepeat, "repeat"},
};
inline constexpr EnumName<FaultKind> kFaultKindNames[] = {
    {FaultKind::kCloseError, "close_error"},
    {FaultKind::kReleaseError, "release_error"},
    {FaultKind::kBusy, "busy"},
    {FaultKind::kStall, "stall"},
    {FaultKind::kCrash, "crash"},
    {FaultKind::kLeak, "leak"},
};
inline constexpr EnumName<LeakResource> kLeakResourceNames[] = {
    {LeakResource::kMemory, "memory"},
    {LeakResource::kMapped, "mapped"},
    {LeakResource::kDescriptor, "descriptor"},
    {LeakResource::kThread, "thread"},
};
inline constexpr EnumName<LeakTrendExpect> kLeakTrendExpectNames[] = {
    {LeakTrendExpect::kNone, "none"},
    {LeakTrendExpect::kLeak, "leak"},
    {LeakTrendExpect::kAny, "any"},
};
constexpr EnumTable<Device> enumTable(Device) { return {"device", kDeviceNames}; }
constexpr EnumTable<Expect> enumTable(Expect) { return {"expect value", kExpectNames}; }
constexpr EnumTable<Op> enumTable(Op) { return {"op", kOpNames}; }
constexpr EnumTable<FaultKind> enumTable(FaultKind) { return {"fault kind", kFaultKindNames}; }
constexpr EnumTable<LeakResource> enumTable(LeakResource) {
  return {"leak resource", kLeakResourceNames};
}
constexpr EnumTable<LeakTrendExpect> enumTable(LeakTrendExpect) {
  return {"leak_trend value", kLeakTrendExpectNames};
}

inline std::string_view toString(Op op) noexcept { return enumName(op); }
inline std::string_view toString(Device device) noexcept { return enumName(device); }
inline std::string_view toString(Expect expect) noexcept { return enumName(expect); }
inline std::string_view toString(FaultKind kind) noexcept { return enumName(kind); }
inline std::string_view toString(LeakResource resource) noexcept { return enumName(resource); }
inline std::string_view toString(LeakTrendExpect expect) noexcept { return enumName(expect); }

struct Step {
  Op op = Op::kBarrier;
  std::string path;  // JSON path of the step in its file ("/steps/3", "/steps/2/steps/0")

  // Fields every step may carry.
  std::optional<std::vector<int>> ranks;  // nullopt: every rank
  Expect expect = Expect::kOk;            // kError when expectError is given and expect is not
  std::optional<std::string> expectError;
  int repeat = 1;
  std::optional<std::string> label;

  // create, forward, backward, drop, close; fault `busy`.
  std::string module;

  // create
  std::string type = "scratch_linear";
  std::int64_t features = 64;
  std::optional<std::int64_t> workspaceBytes;  // nullopt: features * features * 4
  std::optional<nlohmann::json> compat;        // nullopt (or JSON null): the specification
  std::string scope = "default";

  // share
  std::vector<std::string> modules;

  // forward
  std::int64_t batch = 8;
  std::optional<std::string> dtype;  // nullopt: the scenario's
  std::optional<Device> device;      // nullopt: the scenario's
  bool backward = true;

  // drop (reference runner extension; a no-op in C++ where destruction is immediate)
  bool collect = false;

  // check
  std::optional<std::int64_t> groups;
  std::optional<std::int64_t> boundGroups;
  std::optional<bool> runtimeLive;

  // fault
  FaultKind faultKind = FaultKind::kStall;
  int faultCount = 1;  // close_error, release_error
  bool busy = true;    // busy
  LeakResource leakResource = LeakResource::kMemory;  // leak
  std::int64_t leakBytes = 1 << 20;                   // leak of memory
  // crash: false where the crash stands for a rank lost from outside (a killed rank's
  // recording, merged): the outcome counts it as a crash the scenario did not ask for.
  bool crashPlanned = true;

  // sleep, fault stall
  double seconds = 0;  // sleep default 0, stall default 1

  // repeat (the op): count and nested steps
  int count = 1;
  std::vector<Step> steps;
};

// hmc's extension `reference_differs` (docs/scenario-extensions.md): the top-level steps
// whose results differ from the reference runner's by design, and why. The differential
// test compares every other step with the reference and checks these against the
// scenario's own expectations instead.
struct ReferenceDiffers {
  std::string why;         // non-empty
  std::vector<int> steps;  // distinct top-level step indices, ascending; may be empty
};

struct Scenario {
  std::string file;  // where it was read from ("" when parsed from memory)
  std::string name;
  std::string description;
  int worldSize = 1;
  Device device = Device::kAuto;
  std::string dtype = "float32";
  double timeoutS = 30;  // `timeout_s` as written (reports print it as given)
  std::vector<Step> steps;
  std::optional<ReferenceDiffers> referenceDiffers;  // hmc extension; nullopt when absent
  // hmc extension `leak_trend`: what the leak-trend check over repetitions must find.
  LeakTrendExpect leakTrend = LeakTrendExpect::kNone;

  // The deadline of every collective: timeoutS rounded up to whole milliseconds
  // (collective::timeoutFromSeconds). Throws ValueError unless 0 < timeoutS <= 1e6, which a
  // parsed scenario always satisfies.
  std::chrono::milliseconds timeout() const;
};

struct ParseOptions {
  // Replaces the file's world_size before rank lists are validated (--world-size).
  std::optional<int> worldSize;
};

// Validates and converts a parsed JSON document. Throws ScenarioError.
Scenario parseScenario(const nlohmann::json& document, const std::string& file,
                       const ParseOptions& options = {});
// Parses scenario text (the bytes of a file named `file`): the same checks as loadScenario
// after reading, for callers that hold the bytes (a fuzzer, a rank that received them).
Scenario parseScenarioText(std::string_view text, const std::string& file,
                           const ParseOptions& options = {});
// Reads and parses a file: empty, truncated, binary and non-object files are
// ScenarioErrors too. Never hangs, never crashes on bad input.
Scenario loadScenario(const std::string& path, const ParseOptions& options = {});
// The first half of loadScenario: a file's bytes (bounded; FIFO- and /dev/zero-safe). hmc-run
// reads a file once and hands the same bytes to its rank processes (parseScenarioText), so
// every rank runs exactly the scenario the parent parsed.
std::string readScenarioFile(const std::string& path);

// The scenario dtypes: "float32", "float64", "float16", "bfloat16".
bool isScenarioDtype(std::string_view dtype) noexcept;

}  // namespace hmc::scenario
