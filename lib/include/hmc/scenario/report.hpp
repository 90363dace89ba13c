#pragma once
// The report of one scenario run, as data (ScenarioReport), built once from the ranks'
// results by buildReport; toJson is the only writer of the `hmc-report/1` document
// (docs/scenario-format.md) and the reporters (reporters.hpp) read the struct. Like
// google/benchmark's Run: a failed, hung or invalid scenario is a report too, never a crash.

#include <cstddef>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/diagnostics/diagnosis.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/enum_names.hpp"
#include "hmc/error.hpp"
#include "hmc/scenario/leak_trend.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

inline constexpr const char* kReportFormat = "hmc-report/1";
inline constexpr const char* kReportSetFormat = "hmc-report-set/1";

enum class Outcome { kPass, kFail, kHang, kInvalid };
inline constexpr EnumName<Outcome> kOutcomeNames[] = {{Outcome::kPass, "pass"},
                                                      {Outcome::kFail, "fail"},
                                                      {Outcome::kHang, "hang"},
                                                      {Outcome::kInvalid, "invalid"}};
constexpr EnumTable<Outcome> enumTable(Outcome) { return {"outcome", kOutcomeNames}; }
inline std::string_view toString(Outcome outcome) noexcept { return enumName(outcome); }
// Exit code of hmc-run for an outcome: 0 pass, 1 fail, 3 hang, 2 invalid.
int exitCodeOf(Outcome outcome) noexcept;
// The worse of two outcomes: invalid > hang > fail > pass (the order of hmc-run's exit codes
// over a directory).
Outcome worse(Outcome a, Outcome b) noexcept;

struct RunInfo {
  std::string transport;
  std::string device;  // the scenario's device as resolved ("cpu", "cuda")
  double wallSeconds = 0;
  std::string startedAt;  // ISO 8601, UTC
  std::string host;
  std::string torchVersion;
  std::vector<std::string> command;
};

// count, p50, p95 and max of samples in seconds (nearest rank); no figures without samples.
struct TimingStats {
  std::size_t count = 0;
  std::optional<double> p50;
  std::optional<double> p95;
  std::optional<double> max;
};
TimingStats timingStats(std::vector<double> samples);

struct Timings {
  TimingStats freshBind;
  TimingStats reusedBind;
  TimingStats close;
  TimingStats exchange;                   // every collective
  std::optional<double> reuseSpeedupP50;  // fresh p50 / reused p50, when both exist
  // The run recorded more values than the report keeps (Samples::summarizedFrom): p50 and p95
  // come from logarithmic buckets and lie within 1 % of the nearest-rank value; count and max
  // are exact.
  bool approximate = false;
};

// The first manifest entry (or the signature) where a rank differs from rank 0.
struct ManifestDifference {
  int rank = 0;
  std::optional<nlohmann::json> index;  // the manifest entry; nullopt: the signature differs
  nlohmann::json rank0;
  nlohmann::json thisRank;
};

// A manifest mismatch a rank's manager diagnosed at a step.
struct MismatchReport {
  int step = 0;
  int rank = 0;
  std::string message;  // the step's error message
  std::string stage;    // the collective that found it: "recycle" or "close validation"
  std::optional<ManifestDifference> firstDifference;
  nlohmann::json diagnosis;  // the manager's whole document (every rank's manifest)
};

struct RankFlight {
  int rank = 0;
  std::vector<diagnostics::FlightEntry> lastCollectives;  // at most the last 8
};

struct HangReport {
  // "rank 0 waits in 'close validation' #3 (step 4); rank 1 never arrived: last completed
  // 'recycle' #2 (step 1), finished its steps"
  std::string diagnosis;
  std::vector<RankFlight> ranks;
};

// Where a scenario file failed to parse or cannot run here.
struct InvalidScenario {
  std::string file;
  std::string path;  // JSON path, or ""
  std::string message;
};

// Raw timing samples of one metric, per repetition (the first `warmup` are warm-up).
struct MetricSamples {
  std::string unit = "s";
  std::vector<std::vector<double>> perRepetition;
};

// The raw samples of every timing metric: "fresh_bind", "reused_bind", "close", "exchange",
// "collective/<stage>", and "repeat/<label>" (a labelled step's per-cycle seconds, one value
// per rank that ran it).
struct Samples {
  int repetitions = 1;
  int warmup = 0;
  std::map<std::string, MetricSamples> metrics;
  // Set when the run recorded more than kKeptSampleValues values: from this repetition on,
  // each metric's per_repetition entry holds one value, the median of that repetition's
  // values (what `hmc-run compare` takes from a repetition), instead of every value.
  std::optional<int> summarizedFrom;
};

// A top-level step of the scenario as tables show it.
struct StepOutline {
  Op op = Op::kBarrier;
  std::string module;  // "" when the step names none
  std::optional<std::string> label;
};

struct ScenarioReport {
  Outcome outcome = Outcome::kPass;
  std::string name;  // "" for a file that did not parse far enough to have one
  std::string file;
  std::string description;
  int worldSize = 0;
  double timeoutS = 0;
  std::vector<StepOutline> steps;
  RunInfo info;
  // The ranks of the reported repetition: the first one that did not pass, else the last.
  std::vector<RankResult> ranks;
  int shownRepetition = 0;  // its index (0-based, warm-up repetitions included)
  std::vector<MismatchReport> mismatches;
  bool leaked = false;
  Timings timings;  // over every measured repetition
  std::optional<HangReport> hang;
  // The first failure of the shown repetition and what followed (hmc/diagnostics/diagnosis.hpp):
  // what the console, the page and the JSON (first_failure, consequences) lead with. Empty
  // when the outcome is pass.
  diagnostics::Diagnosis diagnosis;
  std::optional<InvalidScenario> invalid;  // set iff outcome is kInvalid
  Samples samples;
  bool interrupted = false;  // Ctrl-C or SIGTERM stopped the run
  // Over the repetitions as cycles (two or more): every rank's metrics fitted for a trend
  // (leak_trend.hpp), and why that failed the run when it did ("" otherwise): a leak the
  // scenario does not expect (`leak_trend`: "none", the default), or none where it expects one.
  std::optional<LeakTrends> leakTrends;
  std::string leakTrendFailure;
};

// The reference runner's rule: a crashed rank fails a scenario without a top-level fault
// step; else pass when every step met its expectation; else hang when some step hung
// unexpectedly; else fail.
Outcome computeOutcome(const Scenario& scenario, const std::vector<RankResult>& ranks);

// The first failure of a run's ranks and what followed, from each rank's first step that did
// not do as expected (its stage and sequence: StepError), its crash, or the collective it was
// left waiting in. Empty for an outcome of pass.
diagnostics::Diagnosis diagnoseRun(const Scenario& scenario, const std::vector<RankResult>& ranks,
                                   Outcome outcome);

// "rank 0 waits in 'close validation' #3 (step 4); rank 1 never arrived: last completed
// 'recycle' #2 (step 1), finished its steps". Empty when no rank hung.
std::string diagnoseHang(const std::vector<RankResult>& ranks);

// The timing values a report keeps whole (all metrics and repetitions together, 2 MiB);
// a run that records more keeps one value per metric and repetition from then on
// (Samples::summarizedFrom).
inline constexpr std::size_t kKeptSampleValues = std::size_t{1} << 18;

// Builds the report of a run of several repetitions one repetition at a time, keeping only
// what the report needs: the outcome so far, every rank's whole result of the repetition the
// report shows (the first that did not pass, else the latest), each repetition's timing
// values up to kKeptSampleValues in all, then each repetition's median per metric, and
// bounded percentile buckets for `timings`. A long `--repetitions` run (scripts/soak) hands
// each repetition over as it ends and drops it. The values kept whole live in one block of
// kKeptSampleValues (2 MiB), allocated and written through at the second repetition, and the
// leak trend's series are sized to their cap when they begin: what the builder keeps grows
// the process by about 16 bytes per metric and repetition (where each value is), not by the
// values, so the leak trend that measures this process sees its own bookkeeping flat
// (docs/leak-trends.md). Within the budget the report is the one buildReport gives for the
// same repetitions. Not thread-safe; `scenario` must outlive the builder.
class ReportBuilder {
 public:
  // `warmup`: the first repetitions not counted in timings (clamped as buildReport does).
  ReportBuilder(const Scenario& scenario, int warmup);

  // One repetition: every rank's result, in rank order.
  void add(std::vector<RankResult> ranks);
  std::size_t repetitions() const noexcept { return count_; }
  // The report of the repetitions added. Throws ValueError when none was.
  ScenarioReport build(RunInfo info) &&;
  ~ReportBuilder();
  ReportBuilder(ReportBuilder&&) noexcept;
  ReportBuilder& operator=(ReportBuilder&&) noexcept;

 private:
  struct Kept;  // the samples as kept (report.cpp)

  const Scenario* scenario_;
  int warmup_;
  std::size_t count_ = 0;
  Outcome outcome_ = Outcome::kPass;
  std::size_t shown_ = 0;
  std::vector<RankResult> shownRanks_;
  std::unique_ptr<Kept> kept_;
};

// The report of one run.
ScenarioReport buildReport(const Scenario& scenario, std::vector<RankResult> ranks, RunInfo info);
// The report of `repetitions.size()` runs of the same scenario, the first `warmup` of them
// not counted in timings: the outcome is the worst repetition's; ranks, mismatches and hang
// come from the first repetition that did not pass (else the last).
ScenarioReport buildReport(const Scenario& scenario,
                           std::vector<std::vector<RankResult>> repetitions, int warmup,
                           RunInfo info);
// The report of a scenario that did not parse or cannot run here: outcome "invalid", no rank
// ran. `name` may be "".
ScenarioReport invalidReport(const std::string& file, const std::string& name,
                             const ScenarioError& error);

// The `hmc-report/1` document: the only writer of its keys.
nlohmann::json toJson(const ScenarioReport& report);
// One report's document, or {"format": "hmc-report-set/1", "reports": [...]} for several.
nlohmann::json toJson(const std::vector<ScenarioReport>& reports);

}  // namespace hmc::scenario
