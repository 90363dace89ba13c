#include "hmc/scenario/leak_trend.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "hmc/error.hpp"
#include "hmc/scenario/rank_result.hpp"

namespace hmc::scenario {
namespace {

// What each metric is, and the smallest growth per cycle it calls a leak. Resident memory
// moves by pages and allocator arenas on a clean run; a descriptor or a thread every 50th
// cycle is a leak; hmc's own accounting has no noise at all.
struct MetricInfo {
  const char* metric;
  const char* title;
  const char* unit;
  double threshold;
  bool plural;  // "open descriptors grow", "resident memory grows"
};
constexpr MetricInfo kMetrics[] = {
    {"resident_bytes", "resident memory", "bytes", 32 * 1024.0, false},
    {"resident_used_bytes", "resident memory in use", "bytes", 2 * 1024.0, false},
    {"heap_bytes", "heap in use", "bytes", 2 * 1024.0, false},
    {"open_descriptors", "open descriptors", "count", 0.02, true},
    {"threads", "threads", "count", 0.02, true},
    {"hmc_bytes_held", "workspace bytes held by hmc", "bytes", 1.0, true},
    {"hmc_workspaces_held", "workspaces held by hmc", "count", 0.01, true},
    {"hmc_groups", "resource groups", "count", 0.01, true},
    {"device_used_bytes", "device memory in use", "bytes", 1024 * 1024.0, false},
};

const MetricInfo& infoOf(const std::string& metric) {
  for (const MetricInfo& info : kMetrics) {
    if (metric == info.metric) return info;
  }
  throw ValueError("unknown leak-trend metric '" + metric + "'");
}

int metricOrder(const std::string& metric) {
  for (std::size_t i = 0; i < std::size(kMetrics); ++i) {
    if (metric == kMetrics[i].metric) return static_cast<int>(i);
  }
  return static_cast<int>(std::size(kMetrics));
}

// "+40.0 KiB", "0.10", "-2 B": a growth per cycle in its unit.
std::string amount(double value, const std::string& unit) {
  if (unit != "bytes") {
    const double magnitude = std::abs(value);
    if (magnitude == 0) return "0";
    if (magnitude >= 100) return fmt::format("{:.0f}", value);
    if (magnitude >= 1) return fmt::format("{:.2f}", value);
    return fmt::format("{:.3g}", value);
  }
  const double magnitude = std::abs(value);
  if (magnitude < 1024) return fmt::format("{:.0f} B", value);
  if (magnitude < 1024.0 * 1024) return fmt::format("{:.1f} KiB", value / 1024);
  if (magnitude < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", value / 1024 / 1024);
  return fmt::format("{:.2f} GiB", value / 1024 / 1024 / 1024);
}

#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
// Whether the malloc this process calls is glibc's own. An allocator linked or preloaded ahead
// of it (a sanitizer's, jemalloc, tcmalloc) leaves glibc's arenas unused: mallinfo2 then says
// nothing about the process's heap, and no heap series is better than a flat one.
bool glibcMallocInUse() {
  static const bool own = [] {
    void* libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc == nullptr) return false;
    void* const glibc = ::dlsym(libc, "malloc");
    void* const called = ::dlsym(RTLD_DEFAULT, "malloc");
    ::dlclose(libc);
    return glibc != nullptr && glibc == called;
  }();
  return own;
}
#endif

std::string whoOf(const std::optional<int>& rank, const std::string& host) {
  if (!rank) return "the process of every thread rank";
  return host.empty() ? fmt::format("rank {}", *rank) : fmt::format("rank {} ({})", *rank, host);
}

}  // namespace

std::optional<ProcessSample> sampleProcess(bool heap) {
  // Small proc files read with one read() each (an ifstream of /proc/self/status cost 20 us a
  // sample, statm and stat about a third of that).
  const auto slurp = [](const char* path, char* buffer, std::size_t size) -> std::size_t {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const ssize_t got = ::read(fd, buffer, size - 1);
    ::close(fd);
    if (got <= 0) return 0;
    buffer[got] = '\0';
    return static_cast<std::size_t>(got);
  };
  char buffer[1024];
  ProcessSample sample;
  // statm: size resident shared text lib data dt (pages).
  if (slurp("/proc/self/statm", buffer, sizeof buffer) == 0) return std::nullopt;
  long long size = 0;
  long long resident = 0;
  if (std::sscanf(buffer, "%lld %lld", &size, &resident) != 2) return std::nullopt;
  sample.residentBytes = resident * static_cast<long long>(::sysconf(_SC_PAGESIZE));
  // stat: "pid (comm) state ..." with num_threads the 20th field; comm may hold spaces and
  // parentheses, so the fields count from the last ')'.
  if (slurp("/proc/self/stat", buffer, sizeof buffer) == 0) return std::nullopt;
  const char* after = std::strrchr(buffer, ')');
  if (after == nullptr) return std::nullopt;
  int field = 2;  // the ')' ends field 2
  for (const char* p = after + 1; *p != '\0'; ++p) {
    if (*p != ' ') continue;
    if (++field == 20) {
      sample.threads = std::strtoll(p + 1, nullptr, 10);
      break;
    }
  }
  if (sample.threads <= 0) return std::nullopt;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::int64_t entries = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++entries;
  }
  ::closedir(dir);
  sample.openDescriptors = entries - 1;  // the directory's own descriptor
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  if (heap && glibcMallocInUse()) {
    const struct mallinfo2 info = ::mallinfo2();
    sample.heapBytes = static_cast<std::int64_t>(info.uordblks + info.hblkhd);
    // Free chunks in the bins were written before they were freed (glibc returns none of an
    // arena's inner pages by itself), so they are resident; the main arena's top (keepcost)
    // grows by sbrk ahead of use and may not be. fordblks also counts the other arenas' tops,
    // whose untouched part (a new thread arena starts with about 128 KiB) is not resident:
    // the value is then low, never high (docs/leak-trends.md).
    const auto binned =
        static_cast<std::int64_t>(info.fordblks) - static_cast<std::int64_t>(info.keepcost);
    sample.residentUsedBytes = std::max<std::int64_t>(0, sample.residentBytes - binned);
  }
#else
  (void)heap;
#endif
  return sample;
}

std::optional<ProcessSample> sampleProcessEvery(std::chrono::nanoseconds cycle, bool heap) {
  // The cost is the cheapest sample so far: one that was preempted, or the first (cold) one,
  // says nothing about what sampling costs.
  static std::mutex mutex;
  static std::optional<std::chrono::nanoseconds> cost;
  static std::chrono::nanoseconds since{0};
  static int skipped = 0;
  std::lock_guard<std::mutex> lock(mutex);
  since += cycle;
  // At least every fourth cycle, whatever the cost: a trend needs its points.
  if (cost && since < 100 * *cost && skipped < 3) {
    ++skipped;
    return std::nullopt;
  }
  skipped = 0;
  if (!cost) sampleProcess(heap);  // the first one is cold (page faults, dentries): not timed
  const auto began = std::chrono::steady_clock::now();
  auto sample = sampleProcess(heap);
  const std::chrono::nanoseconds took = std::chrono::steady_clock::now() - began;
  cost = cost ? std::min(*cost, took) : took;
  since = std::chrono::nanoseconds(0);
  return sample;
}

double normalQuantileTwoSided(double confidence) {
  if (!(confidence > 0 && confidence < 1)) {
    throw ValueError(fmt::format("confidence {} is not between 0 and 1", confidence));
  }
  // The upper (1 - confidence) / 2 quantile, by bisection on erfc (exact to 1e-12).
  const double tail = (1 - confidence) / 2;
  double lo = 0;
  double hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    if (0.5 * std::erfc(mid / std::sqrt(2.0)) > tail) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}

TheilSen theilSen(const std::vector<double>& x, const std::vector<double>& y, double confidence) {
  if (x.size() != y.size()) throw ValueError("theilSen: x and y differ in length");
  const std::size_t n = x.size();
  std::vector<double> slopes;
  slopes.reserve(n * (n - 1) / 2);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      if (x[j] != x[i]) slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
    }
  }
  if (slopes.empty()) throw ValueError("theilSen: needs two points with distinct x");
  std::sort(slopes.begin(), slopes.end());
  const auto median = [](const std::vector<double>& sorted) {
    const std::size_t m = sorted.size();
    return m % 2 == 1 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
  };
  TheilSen fit;
  fit.slope = median(slopes);
  std::vector<double> intercepts(n);
  for (std::size_t i = 0; i < n; ++i) intercepts[i] = y[i] - fit.slope * x[i];
  std::sort(intercepts.begin(), intercepts.end());
  fit.intercept = median(intercepts);
  const double big = static_cast<double>(slopes.size());
  const double nn = static_cast<double>(n);
  const double c = normalQuantileTwoSided(confidence) * std::sqrt(nn * (nn - 1) * (2 * nn + 5) / 18);
  // 1-based ranks (N - C) / 2 and (N + C) / 2 + 1, rounded outward.
  const auto lowRank = static_cast<std::int64_t>(std::floor((big - c) / 2));
  const auto highRank = static_cast<std::int64_t>(std::ceil((big + c) / 2)) + 1;
  const auto at = [&](std::int64_t rank1) {
    const std::int64_t clamped =
        std::clamp<std::int64_t>(rank1, 1, static_cast<std::int64_t>(slopes.size()));
    return slopes[static_cast<std::size_t>(clamped - 1)];
  };
  fit.low = at(lowRank);
  fit.high = at(highRank);
  return fit;
}

bool LeakTrends::leaked() const noexcept {
  return std::any_of(series.begin(), series.end(),
                     [](const TrendSeries& s) { return s.verdict == TrendVerdict::kLeak; });
}

std::vector<std::string> LeakTrends::leaks() const {
  std::vector<std::string> out;
  for (const TrendSeries& s : series) {
    if (s.verdict == TrendVerdict::kLeak) out.push_back(s.text);
  }
  return out;
}

nlohmann::json toJson(const LeakTrends& trends) {
  nlohmann::json series = nlohmann::json::array();
  for (const TrendSeries& s : trends.series) {
    nlohmann::json entry{{"rank", s.rank ? nlohmann::json(*s.rank) : nlohmann::json(nullptr)},
                         {"host", s.host},
                         {"metric", s.metric},
                         {"title", s.title},
                         {"unit", s.unit},
                         {"cycle_stride", s.cycleStride},
                         {"values", s.values},
                         {"cycles", s.cycles},
                         {"threshold_per_cycle", s.threshold},
                         {"fit_from_cycle", s.fitFrom},
                         {"verdict", std::string(toString(s.verdict))},
                         {"text", s.text}};
    if (s.fit) {
      entry["slope_per_cycle"] = s.fit->slope;
      entry["intercept"] = s.fit->intercept;
      entry["ci_low"] = s.fit->low;
      entry["ci_high"] = s.fit->high;
    } else {
      entry["slope_per_cycle"] = nullptr;
      entry["intercept"] = nullptr;
      entry["ci_low"] = nullptr;
      entry["ci_high"] = nullptr;
    }
    series.push_back(std::move(entry));
  }
  return {{"cycles", trends.cycles},     {"warmup", trends.warmup},
          {"confidence", trends.confidence}, {"series", std::move(series)},
          {"leaks", trends.leaks()}};
}

void TrendRecorder::close(Series& s) {
  if (s.pendingCount == 0) return;
  s.values.push_back(s.pendingSum / s.pendingCount);
  s.cycles.push_back(s.pendingCycles / s.pendingCount);
  s.pendingSum = 0;
  s.pendingCycles = 0;
  s.pendingCount = 0;
  if (s.values.size() < kMaxTrendPoints) return;
  // Full: merge adjacent points in place; each now stands for twice as many cycles.
  const std::size_t merged = s.values.size() / 2;
  for (std::size_t i = 0; i < merged; ++i) {
    s.values[i] = (s.values[2 * i] + s.values[2 * i + 1]) / 2;
    s.cycles[i] = (s.cycles[2 * i] + s.cycles[2 * i + 1]) / 2;
  }
  s.values.resize(merged);
  s.cycles.resize(merged);
  s.stride *= 2;
}

void TrendRecorder::push(std::optional<int> rank, const std::string& metric,
                         const std::string& host, double value) {
  auto [it, fresh] = series_.try_emplace({rank.value_or(-1), metric});
  Series& s = it->second;
  if (fresh) {
    // Its whole size at once, written through: a series never grows the process whose
    // resident memory it measures.
    s.values.assign(kMaxTrendPoints, 0.0);
    s.values.clear();
    s.cycles.assign(kMaxTrendPoints, 0.0);
    s.cycles.clear();
    s.host = host;
    s.firstCycle = cycles_;
    s.pendingStart = cycles_ - cycles_ % s.stride;
  }
  // A point holds the samples of `stride` consecutive cycles (aligned to the stride).
  if (cycles_ >= s.pendingStart + s.stride) {
    close(s);
    s.pendingStart = cycles_ - cycles_ % s.stride;
  }
  s.pendingSum += value;
  s.pendingCycles += cycles_;
  ++s.pendingCount;
}

void TrendRecorder::add(const std::vector<RankResult>& ranks) {
  for (const RankResult& result : ranks) {
    if (result.process) {
      const std::optional<int> rank =
          result.process->shared ? std::nullopt : std::optional<int>(result.rank);
      const std::string host = result.host;
      push(rank, "resident_bytes", host, static_cast<double>(result.process->residentBytes));
      push(rank, "open_descriptors", host, static_cast<double>(result.process->openDescriptors));
      push(rank, "threads", host, static_cast<double>(result.process->threads));
      if (result.process->residentUsedBytes >= 0) {
        push(rank, "resident_used_bytes", host,
             static_cast<double>(result.process->residentUsedBytes));
      }
      if (result.process->heapBytes >= 0) {
        push(rank, "heap_bytes", host, static_cast<double>(result.process->heapBytes));
      }
    }
    const LeakCheck& leaks = result.leaks;
    if (leaks.checked) {
      push(result.rank, "hmc_bytes_held", result.host, static_cast<double>(leaks.bytesHeld));
      push(result.rank, "hmc_workspaces_held", result.host,
           static_cast<double>(leaks.workspacesHeld));
      push(result.rank, "hmc_groups", result.host, static_cast<double>(leaks.groups));
      if (leaks.device && leaks.device->freeBytesAfter && leaks.device->totalBytes > 0) {
        push(result.rank, "device_used_bytes", result.host,
             static_cast<double>(leaks.device->totalBytes - *leaks.device->freeBytesAfter));
      }
    }
  }
  ++cycles_;
}

LeakTrends TrendRecorder::analyze(int warmup, double confidence) const {
  LeakTrends out;
  out.cycles = cycles_;
  out.warmup = std::min(cycles_, std::max({warmup, 2, cycles_ / 10}));
  out.confidence = confidence;
  const int percent = static_cast<int>(std::lround(confidence * 100));
  for (const auto& [key, s] : series_) {
    const auto& [rankKey, metric] = key;
    const MetricInfo& info = infoOf(metric);
    TrendSeries series;
    if (rankKey >= 0) series.rank = rankKey;
    series.host = s.host;
    series.metric = metric;
    series.title = info.title;
    series.unit = info.unit;
    Series whole = s;
    close(whole);  // the last, partial point too
    series.cycleStride = whole.stride;
    series.values = whole.values;
    series.cycles = whole.cycles;
    series.threshold = info.threshold;
    // Resident memory: a fresh process's allocator arenas and LibTorch's caches grow by up to
    // 8 KiB per cycle in its first ~100 cycles on a clean run (docs/leak-trends.md). A run
    // long enough that its second half starts past them is fitted over that half, with the
    // smaller threshold.
    int from = out.warmup;
    if (metric == "resident_bytes" && cycles_ / 2 >= kSettledCycles) {
      from = std::max(from, cycles_ / 2);
      series.threshold = kSettledResidentThreshold;
    }
    // Resident memory in use: its threshold is 2 KiB once a run is long enough that its first
    // tens of cycles, where a fresh process still grows it, weigh little in the fit.
    if (metric == "resident_used_bytes" && cycles_ < 2 * kSettledCycles) {
      series.threshold = cycles_ < kSettledCycles ? kShortRunResidentUsedThreshold
                                                  : kMidRunResidentUsedThreshold;
    }
    if (metric == "heap_bytes" && cycles_ < kShortHeapRunCycles) {
      series.threshold = kShortRunHeapThreshold;
    }
    series.fitFrom = from;
    // The fit takes the points past the warm-up, x their mean cycle.
    std::vector<double> x;
    std::vector<double> y;
    for (std::size_t i = 0; i < whole.values.size(); ++i) {
      if (whole.cycles[i] < from) continue;
      x.push_back(whole.cycles[i]);
      y.push_back(whole.values[i]);
    }
    const int fitted = cycles_ - std::max(from, s.firstCycle);
    const std::string who = whoOf(series.rank, series.host);
    if (fitted < kMinTrendCycles || x.size() < kMinTrendPoints) {
      series.verdict = TrendVerdict::kTooFewCycles;
      series.text = fmt::format(
          "{}: {}: {} cycles ({} samples) after the warm-up, too few for a trend (needs {} "
          "cycles, {} samples)",
          who, info.title, std::max(fitted, 0), x.size(), kMinTrendCycles, kMinTrendPoints);
    } else {
      series.fit = theilSen(x, y, confidence);
      const bool leak = series.fit->low > 0 && series.fit->slope >= series.threshold;
      series.verdict = leak ? TrendVerdict::kLeak : TrendVerdict::kFlat;
      const double slope = series.fit->slope;
      const char* verb = slope > 0 ? (info.plural ? "grow" : "grows")
                                   : (slope < 0 ? (info.plural ? "shrink" : "shrinks")
                                                : (info.plural ? "stay flat:" : "stays flat:"));
      series.text = fmt::format(
          "{}: {} {} {} per cycle ({}% CI {} to {}) over {} cycles: {}", who, info.title, verb,
          amount(std::abs(slope), info.unit), percent, amount(series.fit->low, info.unit),
          amount(series.fit->high, info.unit), fitted,
          leak ? "leak"
               : (series.fit->low > 0 ? fmt::format("no leak (under the threshold of {} per cycle)",
                                                    amount(series.threshold, info.unit))
                                      : "no leak"));
    }
    out.series.push_back(std::move(series));
  }
  std::stable_sort(out.series.begin(), out.series.end(),
                   [](const TrendSeries& a, const TrendSeries& b) {
                     const bool al = a.verdict == TrendVerdict::kLeak;
                     const bool bl = b.verdict == TrendVerdict::kLeak;
                     if (al != bl) return al;
                     const int ar = a.rank.value_or(-1);
                     const int br = b.rank.value_or(-1);
                     if (ar != br) return ar < br;
                     return metricOrder(a.metric) < metricOrder(b.metric);
                   });
  return out;
}

}  // namespace hmc::scenario
