#pragma once
// Leaks across cycles, found with statistics (docs/leak-trends.md). The leak check of one run
// (rank_result.hpp's LeakCheck) sees what is still held at its end; a leak of a few KB per
// cycle, or of one file descriptor every tenth cycle, passes it. Here each repetition of a
// scenario is a cycle: every rank samples what its process holds at the end of each cycle
// (resident memory, open descriptors, threads), beside hmc's own accounting of what it still
// holds (bytes, workspaces, groups) and, on a GPU, the device memory in use. Per metric and
// rank a robust trend is fitted over the cycles after a warm-up (Theil-Sen: the median of the
// pairwise slopes, with Sen's rank-based confidence interval), and a metric whose interval
// lies above zero and whose slope reaches the metric's threshold is a leak.

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::scenario {

struct RankResult;

// What a process holds at the end of a cycle, as /proc/self shows it.
struct ProcessSample {
  std::int64_t residentBytes = 0;    // VmRSS
  std::int64_t openDescriptors = 0;  // entries of /proc/self/fd
  std::int64_t threads = 0;          // Threads
  // Taken by rank 0 for the process every thread rank shares (the threads transport).
  bool shared = false;
  // Bytes the C allocator has handed out and not had back (glibc's mallinfo2: uordblks +
  // hblkhd), every arena's; -1 where unknown. Unlike resident memory it does not move with
  // what the allocator caches (per-thread caches, fragmented arenas), so it can find a leak
  // of a few KiB per cycle (docs/leak-trends.md).
  std::int64_t heapBytes = -1;
  // Resident memory less what the C allocator keeps free in its bins (glibc's mallinfo2:
  // fordblks - keepcost; the main arena's top is left in, as it may never have been touched);
  // -1 where unknown. Memory in use whatever its kind (malloc'd, mmap'ed, stacks, code): it
  // finds a leak of mapped pages that the heap in use cannot see, without resident memory's
  // drift as a fresh process's thread arenas fragment (docs/leak-trends.md).
  std::int64_t residentUsedBytes = -1;
};
// Reads /proc/self (statm, stat, fd: 10-20 us); nullopt where it cannot.
// `heap`: also the heap in use and the resident memory in use (mallinfo2, which walks every
// arena), where malloc is glibc's own (not a sanitizer's, jemalloc or tcmalloc); else both -1.
std::optional<ProcessSample> sampleProcess(bool heap = true);
// sampleProcess at most about 1% of the time, for the end of every cycle (`cycle`: how long the
// cycle took): samples when the cycles since the last sample took at least 100 times what a
// sample costs (the cheapest one so far; the first call always samples), and at least every
// fourth cycle whatever the cost, else nullopt. A cycle of 0.5 ms is sampled about every other
// time, one of 2 ms or more every time. Thread-safe (one state per process).
std::optional<ProcessSample> sampleProcessEvery(std::chrono::nanoseconds cycle, bool heap = true);

// A Theil-Sen fit of y against x: the median pairwise slope, the median intercept, and Sen's
// two-sided confidence interval of the slope at `confidence`: with N pairwise slopes sorted and
// C = z * sqrt(n (n - 1) (2n + 5) / 18) (the spread of Kendall's S), the slopes of rank
// (N - C) / 2 and (N + C) / 2 + 1 (1-based, rounded outward, clamped).
struct TheilSen {
  double slope = 0;
  double intercept = 0;
  double low = 0;
  double high = 0;
};
// Needs at least 2 points with distinct x; throws ValueError otherwise.
TheilSen theilSen(const std::vector<double>& x, const std::vector<double>& y, double confidence);
// The upper quantile z of the standard normal for a two-sided `confidence` (0.99: 2.576).
double normalQuantileTwoSided(double confidence);

enum class TrendVerdict { kLeak, kFlat, kTooFewCycles };
inline constexpr EnumName<TrendVerdict> kTrendVerdictNames[] = {
    {TrendVerdict::kLeak, "leak"},
    {TrendVerdict::kFlat, "flat"},
    {TrendVerdict::kTooFewCycles, "too_few_cycles"},
};
constexpr EnumTable<TrendVerdict> enumTable(TrendVerdict) {
  return {"trend verdict", kTrendVerdictNames};
}
inline std::string_view toString(TrendVerdict verdict) noexcept { return enumName(verdict); }

// One metric of one rank (or of the whole process that thread ranks share) over the cycles.
struct TrendSeries {
  std::optional<int> rank;  // nullopt: the process of every thread rank
  std::string host;
  std::string metric;  // "resident_bytes", "open_descriptors", ...
  std::string title;   // "resident memory", "open descriptors", ...
  std::string unit;    // "bytes" or "count"
  // values[i] is the mean of the samples taken in cycles [i * cycleStride, (i + 1) *
  // cycleStride) (a long run's points are merged pairwise to keep at most kMaxTrendPoints), and
  // cycles[i] the mean cycle (0-based) of those samples: a process is sampled every cycle, or
  // every few where its cycles are shorter than 100 samples (sampleProcessEvery).
  int cycleStride = 1;
  std::vector<double> values;
  std::vector<double> cycles;
  std::optional<TheilSen> fit;  // per cycle, x = the cycle; absent with too few cycles
  double threshold = 0;         // the smallest growth per cycle called a leak
  // The first cycle the fit takes: the trend's warm-up; for resident memory in a run of
  // 2 * kSettledCycles cycles or more, at least half the cycles.
  int fitFrom = 0;
  TrendVerdict verdict = TrendVerdict::kTooFewCycles;
  // "rank 2: open descriptors grow 0.10 per cycle (99% CI 0.08-0.12) over 200 cycles: leak"
  std::string text;
};

struct LeakTrends {
  int cycles = 0;
  int warmup = 0;  // the first cycles, left out of every fit
  double confidence = 0;
  std::vector<TrendSeries> series;  // leaks first, then by rank and metric

  bool leaked() const noexcept;
  // The texts of the leaking series.
  std::vector<std::string> leaks() const;
};

// The report's `leak_trends` section (docs/scenario-format.md).
nlohmann::json toJson(const LeakTrends& trends);

// Fitted cycles, and samples among them, needed for a verdict; fewer: kTooFewCycles.
inline constexpr int kMinTrendCycles = 10;
inline constexpr std::size_t kMinTrendPoints = 5;
// The points a series keeps; beyond, adjacent points are merged (the stride doubles), so
// memory stays bounded and a fit costs at most kMaxTrendPoints^2 / 2 slopes.
inline constexpr std::size_t kMaxTrendPoints = 512;
// Resident memory in a run of 2 * kSettledCycles cycles or more: its fit takes the second half,
// past where a fresh process's allocator and LibTorch's caches settle on a clean run
// (measured: up to 8 KiB of growth per cycle before, at most 5.4 KiB after, over the bundled
// scenarios), and a growth of kSettledResidentThreshold per cycle is a leak instead of the
// metric's 32 KiB (docs/leak-trends.md).
inline constexpr int kSettledCycles = 100;
inline constexpr double kSettledResidentThreshold = 8 * 1024;
// Resident memory in use: a fresh process's first tens of cycles grow it on a clean run, so
// its threshold is the metric's 2 KiB per cycle in a run of 2 * kSettledCycles cycles or more,
// kMidRunResidentUsedThreshold in one of kSettledCycles or more, kShortRunResidentUsedThreshold
// in a shorter one. Measured over the bundled scenarios, the most a clean run grew it: 7.9 KiB
// per cycle at 12 cycles, 6.0 at 20, 4.4 at 30 (rank processes), 2.1 at 50, 1.6 at 100 (rank
// processes), 1.2 at 200 (docs/leak-trends.md).
inline constexpr double kShortRunResidentUsedThreshold = 16 * 1024;
inline constexpr double kMidRunResidentUsedThreshold = 4 * 1024;
// The heap in use in a run shorter than kShortHeapRunCycles: its fit then has a handful of
// samples from a fresh process's first cycles (measured over the bundled scenarios: up to
// 2.8 KiB per cycle at 12 cycles, 1.5 at 20, 1.0 at 30), so a growth of this much is a leak
// there instead of the metric's 2 KiB.
inline constexpr int kShortHeapRunCycles = 30;
inline constexpr double kShortRunHeapThreshold = 8 * 1024;
// The default confidence of the trend's interval.
inline constexpr double kTrendConfidence = 0.99;

// Collects every rank's samples cycle by cycle (ReportBuilder feeds it each repetition) and
// fits the trends. Not thread-safe.
class TrendRecorder {
 public:
  void add(const std::vector<RankResult>& ranks);
  int cycles() const noexcept { return cycles_; }
  // `warmup`: the cycles the report leaves out of its timings; the fit leaves out at least
  // those, at least 2, and the first tenth of the cycles.
  LeakTrends analyze(int warmup, double confidence = kTrendConfidence) const;

 private:
  struct Series {
    std::string host;
    int stride = 1;
    std::vector<double> values;
    std::vector<double> cycles;  // the mean cycle of each point's samples
    double pendingSum = 0;       // the current point's samples so far
    double pendingCycles = 0;
    int pendingCount = 0;
    int pendingStart = 0;  // the first cycle of the current point
    int firstCycle = 0;    // the cycle of its first sample
  };
  static void close(Series& s);
  void push(std::optional<int> rank, const std::string& metric, const std::string& host,
            double value);

  int cycles_ = 0;
  // (rank, -1 for the process of thread ranks) x metric.
  std::map<std::tuple<int, std::string>, Series> series_;
};

}  // namespace hmc::scenario
