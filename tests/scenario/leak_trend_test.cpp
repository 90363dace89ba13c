// The leak-trend check: Theil-Sen with Sen's interval, the recorder's bounded series, the
// verdicts and their texts, the report's section and the scenario's expectation.

#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/scenario/leak_trend.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/report.hpp"

using hmc::scenario::LeakTrends;
using hmc::scenario::RankResult;
using hmc::scenario::TrendRecorder;
using hmc::scenario::TrendVerdict;

namespace {

std::vector<double> indices(std::size_t n) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}

// One cycle of `world` process ranks: each holds `descriptors(rank)` descriptors.
std::vector<RankResult> cycle(int world, const std::function<std::int64_t(int)>& descriptors,
                              std::int64_t resident = 100 << 20) {
  std::vector<RankResult> ranks(world);
  for (int rank = 0; rank < world; ++rank) {
    ranks[rank].rank = rank;
    ranks[rank].host = "h1";
    ranks[rank].process = hmc::scenario::ProcessSample{resident, descriptors(rank), 7, false};
    ranks[rank].leaks.checked = true;
  }
  return ranks;
}

// The trends of `cycles` cycles of one rank process whose sample `set` fills in for cycle c.
LeakTrends processTrends(int cycles,
                         const std::function<void(hmc::scenario::ProcessSample&, int)>& set) {
  TrendRecorder recorder;
  for (int c = 0; c < cycles; ++c) {
    auto ranks = cycle(1, [](int) { return 5; });
    set(*ranks[0].process, c);
    recorder.add(ranks);
  }
  return recorder.analyze(1);
}

const hmc::scenario::TrendSeries& seriesOf(const LeakTrends& trends, std::optional<int> rank,
                                           const std::string& metric) {
  for (const auto& series : trends.series) {
    if (series.rank == rank && series.metric == metric) return series;
  }
  FAIL("no series " << metric);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_SUITE("leak trends") {
  TEST_CASE("Theil-Sen: the median slope, robust to outliers, and Sen's interval") {
    // y = 3x + 5 with two wild outliers: the slope and intercept stay exact.
    std::vector<double> y;
    for (int i = 0; i < 21; ++i) y.push_back(3.0 * i + 5);
    y[4] = 1000;
    y[17] = -1000;
    const auto fit = hmc::scenario::theilSen(indices(y.size()), y, 0.95);
    CHECK(fit.slope == doctest::Approx(3.0));
    CHECK(fit.intercept == doctest::Approx(5.0));
    CHECK(fit.low <= fit.slope);
    CHECK(fit.high >= fit.slope);
    // A flat series: every slope 0, so is the interval.
    const auto flat = hmc::scenario::theilSen(indices(30), std::vector<double>(30, 9.0), 0.99);
    CHECK(flat.slope == 0);
    CHECK(flat.low == 0);
    CHECK(flat.high == 0);
    CHECK_THROWS_AS(hmc::scenario::theilSen({1, 1}, {2, 3}, 0.99), hmc::ValueError);
  }

  TEST_CASE("Sen's interval covers the true slope at about its confidence") {
    // 400 noisy lines of slope 0.5: a 95% interval misses it in about 5% of them.
    std::mt19937 random(7);
    std::normal_distribution<double> noise(0, 2);
    int missed = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<double> y;
      for (int i = 0; i < 40; ++i) y.push_back(0.5 * i + noise(random));
      const auto fit = hmc::scenario::theilSen(indices(y.size()), y, 0.95);
      if (fit.low > 0.5 || fit.high < 0.5) ++missed;
    }
    CHECK(missed >= 4);   // not 0: the interval is not vacuously wide
    CHECK(missed <= 40);  // about 20 expected
    CHECK(hmc::scenario::normalQuantileTwoSided(0.95) == doctest::Approx(1.959964).epsilon(1e-5));
    CHECK(hmc::scenario::normalQuantileTwoSided(0.99) == doctest::Approx(2.575829).epsilon(1e-5));
  }

  TEST_CASE("a descriptor every tenth cycle on one rank is a leak; the others are flat") {
    TrendRecorder recorder;
    for (int c = 0; c < 200; ++c) {
      recorder.add(cycle(3, [c](int rank) { return 20 + (rank == 2 ? c / 10 : 0); }));
    }
    const LeakTrends trends = recorder.analyze(1);
    CHECK(trends.cycles == 200);
    CHECK(trends.warmup == 20);  // a tenth of the cycles
    REQUIRE(trends.leaked());
    const auto& leak = seriesOf(trends, 2, "open_descriptors");
    CHECK((leak.verdict == TrendVerdict::kLeak));
    REQUIRE(leak.fit);
    CHECK(leak.fit->slope == doctest::Approx(0.1).epsilon(0.05));
    CHECK(leak.text.find("rank 2 (h1): open descriptors grow 0.1") == 0);
    CHECK(leak.text.find("over 180 cycles: leak") != std::string::npos);
    CHECK(trends.series.front().metric == "open_descriptors");  // leaks first
    CHECK(trends.leaks() == std::vector<std::string>{leak.text});
    CHECK((seriesOf(trends, 0, "open_descriptors").verdict == TrendVerdict::kFlat));
    CHECK((seriesOf(trends, 1, "resident_bytes").verdict == TrendVerdict::kFlat));
    CHECK((seriesOf(trends, 1, "hmc_bytes_held").verdict == TrendVerdict::kFlat));
  }

  TEST_CASE("growth under the metric's threshold is not a leak; too few cycles no verdict") {
    TrendRecorder slow;
    // 1 KiB of resident memory per cycle, exact: the interval is above 0, the slope under
    // the threshold of 32 KiB.
    for (int c = 0; c < 100; ++c) slow.add(cycle(1, [](int) { return 5; }, (100 << 20) + c * 1024));
    const auto slowTrends = slow.analyze(1);
    const auto& resident = seriesOf(slowTrends, 0, "resident_bytes");
    CHECK((resident.verdict == TrendVerdict::kFlat));
    CHECK(resident.text.find("no leak (under the threshold of 32.0 KiB per cycle)") !=
          std::string::npos);
    TrendRecorder few;
    for (int c = 0; c < 8; ++c) few.add(cycle(1, [c](int) { return 5 + c; }));
    const auto trends = few.analyze(1);
    CHECK_FALSE(trends.leaked());
    CHECK((seriesOf(trends, 0, "open_descriptors").verdict == TrendVerdict::kTooFewCycles));
    CHECK_FALSE(seriesOf(trends, 0, "open_descriptors").fit);
  }

  TEST_CASE("resident memory over 200 cycles: the second half fitted, 8 KiB a leak") {
    const auto residentOf = [](int cycles, const std::function<std::int64_t(int)>& bytes) {
      TrendRecorder recorder;
      for (int c = 0; c < cycles; ++c) recorder.add(cycle(1, [](int) { return 5; }, bytes(c)));
      return recorder.analyze(1);
    };
    // A fresh process settling: 8 KiB per cycle for its first 80 cycles, then 1 KiB. Over 200
    // cycles the fit takes cycles 100-199: flat, under 8 KiB.
    const auto settling = residentOf(200, [](int c) {
      return (100 << 20) + std::int64_t{8192} * std::min(c, 80) + 1024 * std::max(0, c - 80);
    });
    const auto& settled = seriesOf(settling, 0, "resident_bytes");
    CHECK(settled.fitFrom == 100);
    CHECK(settled.threshold == hmc::scenario::kSettledResidentThreshold);
    CHECK((settled.verdict == TrendVerdict::kFlat));
    CHECK(settled.fit->slope == doctest::Approx(1024));
    CHECK(settled.text.find("over 100 cycles: no leak (under the threshold of 8.0 KiB") !=
          std::string::npos);
    // A leak of 16 KiB per cycle over 200 cycles: found.
    const auto leaking =
        residentOf(200, [](int c) { return (100 << 20) + std::int64_t{16384} * c; });
    CHECK((seriesOf(leaking, 0, "resident_bytes").verdict == TrendVerdict::kLeak));
    // Descriptors keep the trend's warm-up (a tenth): no half left out.
    CHECK(seriesOf(leaking, 0, "open_descriptors").fitFrom == 20);
    // The same over 100 cycles: a half would start before a process settles; the fit keeps
    // the warm-up and 32 KiB is the threshold.
    const auto shorter =
        residentOf(100, [](int c) { return (100 << 20) + std::int64_t{16384} * c; });
    const auto& early = seriesOf(shorter, 0, "resident_bytes");
    CHECK(early.fitFrom == 10);
    CHECK(early.threshold == 32 * 1024.0);
    CHECK((early.verdict == TrendVerdict::kFlat));
  }

  TEST_CASE("heap in use: 4 KiB per cycle is a leak, a few hundred bytes are not") {
    // Resident memory moves with the allocator's caches; the heap in use (what malloc handed
    // out and did not get back) does not: its threshold is 2 KiB from the first fitted cycle
    // in a run of 30 cycles or more.
    const auto heapOf = [](int cycles, std::int64_t perCycle, std::int64_t known = 0) {
      return processTrends(cycles, [&](hmc::scenario::ProcessSample& sample, int c) {
        sample.heapBytes = known < 0 ? -1 : (50 << 20) + perCycle * c + (c % 3) * 64;
      });
    };
    const auto leaking = heapOf(200, 4096);
    const auto& leak = seriesOf(leaking, 0, "heap_bytes");
    CHECK((leak.verdict == TrendVerdict::kLeak));
    CHECK(leak.threshold == 2 * 1024.0);
    CHECK(leak.fitFrom == 20);  // the warm-up only: no half left out
    CHECK(leak.fit->slope == doctest::Approx(4096).epsilon(0.01));
    CHECK(leak.text.find("heap in use grows 4.0 KiB per cycle") != std::string::npos);
    CHECK(leaking.leaked());
    // hmc-run's own bookkeeping grows the heap by about 16 bytes per metric and cycle.
    const auto clean = heapOf(200, 350);
    CHECK((seriesOf(clean, 0, "heap_bytes").verdict == TrendVerdict::kFlat));
    CHECK_FALSE(clean.leaked());
    // A run of 30 cycles finds it too; a shorter one has 8 KiB, as its few samples come from a
    // fresh process's first cycles.
    CHECK((seriesOf(heapOf(50, 4096), 0, "heap_bytes").verdict == TrendVerdict::kLeak));
    CHECK((seriesOf(heapOf(30, 4096), 0, "heap_bytes").verdict == TrendVerdict::kLeak));
    const auto shortRun = heapOf(29, 4096);
    CHECK(seriesOf(shortRun, 0, "heap_bytes").threshold == 8 * 1024.0);
    CHECK((seriesOf(shortRun, 0, "heap_bytes").verdict == TrendVerdict::kFlat));
    // Where the heap is unknown (-1: no glibc), there is no series.
    for (const auto& series : heapOf(50, 0, -1).series) CHECK(series.metric != "heap_bytes");
  }

  TEST_CASE("resident memory in use: 4 KiB per cycle is a leak in a run of 200 cycles") {
    // Resident memory less the allocator's free bins: what a fresh process's arenas keep for
    // later is subtracted, so it keeps the heap's warm-up, not resident memory's second half,
    // with a threshold by the run's length.
    const auto usedOf = [](int cycles, std::int64_t perCycle, std::int64_t known = 0) {
      return processTrends(cycles, [&](hmc::scenario::ProcessSample& sample, int c) {
        // Resident memory itself drifts by 6 KiB per cycle (a clean process settling).
        sample.residentBytes = (100 << 20) + std::int64_t{6144} * c;
        sample.residentUsedBytes = known < 0 ? -1 : (90 << 20) + perCycle * c + (c % 4) * 512;
      });
    };
    const auto leaking = usedOf(200, 4096);
    const auto& leak = seriesOf(leaking, 0, "resident_used_bytes");
    CHECK((leak.verdict == TrendVerdict::kLeak));
    CHECK(leak.threshold == 2 * 1024.0);
    CHECK(leak.fitFrom == 20);
    CHECK(leak.fit->slope == doctest::Approx(4096).epsilon(0.05));
    CHECK(leak.text.find("resident memory in use grows 4.") != std::string::npos);
    CHECK(leak.title == "resident memory in use");
    // The raw resident memory's 6 KiB per cycle is under its 8 KiB.
    CHECK((seriesOf(leaking, 0, "resident_bytes").verdict == TrendVerdict::kFlat));
    // Shorter than 100 cycles: 16 KiB, as a fresh process's first cycles grow it by up to 7.9.
    const auto shortRun = usedOf(50, 4096);
    CHECK(seriesOf(shortRun, 0, "resident_used_bytes").threshold == 16 * 1024.0);
    CHECK((seriesOf(shortRun, 0, "resident_used_bytes").verdict == TrendVerdict::kFlat));
    CHECK((seriesOf(usedOf(50, 20000), 0, "resident_used_bytes").verdict == TrendVerdict::kLeak));
    CHECK((seriesOf(usedOf(99, 4096), 0, "resident_used_bytes").verdict == TrendVerdict::kFlat));
    // From 100 to 199 cycles: 4 KiB.
    const auto midRun = usedOf(199, 3800);
    const auto& mid = seriesOf(midRun, 0, "resident_used_bytes");
    CHECK(mid.threshold == 4 * 1024.0);
    CHECK((mid.verdict == TrendVerdict::kFlat));
    CHECK((seriesOf(usedOf(100, 5000), 0, "resident_used_bytes").verdict == TrendVerdict::kLeak));
    CHECK((seriesOf(usedOf(200, 3800), 0, "resident_used_bytes").verdict == TrendVerdict::kLeak));
    const auto clean = usedOf(200, 350);
    CHECK((seriesOf(clean, 0, "resident_used_bytes").verdict == TrendVerdict::kFlat));
    CHECK_FALSE(clean.leaked());
    for (const auto& series : usedOf(50, 0, -1).series) {
      CHECK(series.metric != "resident_used_bytes");
    }
    // Listed right after resident memory.
    REQUIRE(clean.series.size() >= 2);
    CHECK(clean.series[0].metric == "resident_bytes");
    CHECK(clean.series[1].metric == "resident_used_bytes");
  }

  TEST_CASE("resident memory in use: mapped and allocated pages count, freed ones do not") {
    const auto sample = [] {
      auto s = hmc::scenario::sampleProcess();
      REQUIRE(s);
      return *s;
    };
    const auto before = sample();
    if (before.residentUsedBytes < 0) {
      // A sanitizer's allocator (scripts/test --sanitize), or not glibc.
      MESSAGE("skipped: malloc is not glibc's here, so mallinfo2 says nothing of the heap");
      return;
    }
    CHECK(before.residentUsedBytes <= before.residentBytes);
    constexpr std::size_t kMiB = 1 << 20;
    // 8 MiB of pages mapped on their own, outside the allocator.
    void* pages =
        ::mmap(nullptr, 8 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(pages != MAP_FAILED);
    std::memset(pages, 1, 8 * kMiB);
    const auto mapped = sample();
    CHECK(mapped.residentUsedBytes - before.residentUsedBytes >= std::int64_t{7 * kMiB});
    ::munmap(pages, 8 * kMiB);
    // 4 MiB in blocks of 1 KiB from the allocator, then every other one freed: the freed ones
    // stay resident in its bins (their neighbours are in use), but are no longer in use.
    std::vector<char*> blocks(4096);
    for (char*& block : blocks) {
      block = static_cast<char*>(std::malloc(1024));
      REQUIRE(block != nullptr);
      std::memset(block, 1, 1024);
    }
    const auto allocated = sample();
    CHECK(allocated.residentUsedBytes - before.residentUsedBytes >= std::int64_t{3 * kMiB});
    for (std::size_t i = 0; i < blocks.size(); i += 2) std::free(blocks[i]);
    const auto halved = sample();
    CHECK(allocated.residentUsedBytes - halved.residentUsedBytes >= std::int64_t{3 * kMiB / 2});
    CHECK(std::llabs(allocated.residentBytes - halved.residentBytes) < std::int64_t{kMiB});
    for (std::size_t i = 1; i < blocks.size(); i += 2) std::free(blocks[i]);
  }

  TEST_CASE("a long run keeps at most kMaxTrendPoints per series, merging cycles pairwise") {
    TrendRecorder recorder;
    const int cycles = 5000;
    for (int c = 0; c < cycles; ++c) recorder.add(cycle(1, [c](int) { return 10 + c / 4; }));
    const auto trends = recorder.analyze(1);
    const auto& series = seriesOf(trends, 0, "open_descriptors");
    CHECK(series.values.size() <= hmc::scenario::kMaxTrendPoints);
    CHECK(series.cycleStride == 16);
    // Full points of 16 cycles, and the last 8 cycles as a partial one.
    CHECK(series.values.size() ==
          static_cast<std::size_t>((cycles + series.cycleStride - 1) / series.cycleStride));
    REQUIRE(series.cycles.size() == series.values.size());
    CHECK(series.cycles.front() == doctest::Approx(7.5));
    CHECK(series.cycles.back() == doctest::Approx(4995.5));
    REQUIRE(series.fit);
    CHECK(series.fit->slope == doctest::Approx(0.25).epsilon(0.01));  // per cycle, not per point
    CHECK((series.verdict == TrendVerdict::kLeak));
  }

  TEST_CASE("a process sampled every third cycle: the fit uses the cycles it was sampled in") {
    TrendRecorder recorder;
    for (int c = 0; c < 90; ++c) {
      auto ranks = cycle(1, [c](int) { return 10 + c / 2; });
      if (c % 3 != 0) ranks[0].process.reset();  // sampleProcessEvery skipped it
      recorder.add(ranks);
    }
    const auto trends = recorder.analyze(1);
    const auto& series = seriesOf(trends, 0, "open_descriptors");
    CHECK(series.values.size() == 30);
    CHECK(series.cycles[1] == 3);
    REQUIRE(series.fit);
    CHECK(series.fit->slope == doctest::Approx(0.5).epsilon(0.05));
    // hmc's own metrics have every cycle.
    CHECK(seriesOf(trends, 0, "hmc_groups").values.size() == 90);
  }

  TEST_CASE("sampling every cycle costs at most about 1% of the cycles' time") {
    using namespace std::chrono_literals;
    // Cycles far shorter than a sample are sampled only every fourth time (the first call of
    // the process has already sampled); a long cycle is sampled at once.
    int sampled = 0;
    for (int i = 0; i < 48; ++i) sampled += hmc::scenario::sampleProcessEvery(1ns) ? 1 : 0;
    CHECK(sampled == 12);  // every fourth cycle: the floor a trend needs
    CHECK(hmc::scenario::sampleProcessEvery(1s));
    CHECK(hmc::scenario::sampleProcessEvery(1s));
  }

  TEST_CASE("thread ranks: one process series, named as such") {
    TrendRecorder recorder;
    for (int c = 0; c < 40; ++c) {
      auto ranks = cycle(4, [](int) { return 12; });
      for (auto& rank : ranks) rank.process.reset();
      ranks[0].process = hmc::scenario::ProcessSample{1 << 26, 12, 5 + c, true};
      recorder.add(ranks);
    }
    const auto trends = recorder.analyze(1);
    const auto& threads = seriesOf(trends, std::nullopt, "threads");
    CHECK((threads.verdict == TrendVerdict::kLeak));
    CHECK(threads.text.find("the process of every thread rank: threads grow 1.00 per cycle") == 0);
    const auto json = hmc::scenario::toJson(trends);
    CHECK(json["series"][0]["rank"].is_null());
    CHECK(json["series"][0]["verdict"] == "leak");
    CHECK(json["leaks"].size() == 1);
  }

  TEST_CASE("this process's sample reads /proc and sees a descriptor opened") {
    const auto before = hmc::scenario::sampleProcess();
    REQUIRE(before);
    CHECK(before->residentBytes > 0);
    CHECK(before->threads >= 1);
    const int fd = ::dup(0);
    const auto after = hmc::scenario::sampleProcess();
    ::close(fd);
    REQUIRE(after);
    CHECK(after->openDescriptors == before->openDescriptors + 1);
  }

  TEST_CASE("the report fails on an unexpected leak, and on a missing expected one") {
    using hmc::scenario::LeakTrendExpect;
    using hmc::scenario::Outcome;
    nlohmann::json document = {{"format", "hmc-scenario/1"},
                               {"name", "trend"},
                               {"world_size", 1},
                               {"steps", nlohmann::json::array()}};
    const auto build = [&](const hmc::scenario::Scenario& scenario, bool leaking, int cycles) {
      hmc::scenario::ReportBuilder builder(scenario, 1);
      for (int c = 0; c < cycles; ++c) {
        builder.add(cycle(1, [&](int) { return leaking ? 10 + c : 10; }));
      }
      return std::move(builder).build({});
    };
    const auto none = hmc::scenario::parseScenario(document, "trend.json");
    CHECK((none.leakTrend == LeakTrendExpect::kNone));
    const auto clean = build(none, false, 30);
    CHECK((clean.outcome == Outcome::kPass));
    REQUIRE(clean.leakTrends);
    CHECK(clean.leakTrendFailure.empty());
    const auto leaky = build(none, true, 30);
    CHECK((leaky.outcome == Outcome::kFail));
    CHECK(leaky.leakTrendFailure.find("which the scenario does not expect") != std::string::npos);
    const auto json = hmc::scenario::toJson(leaky);
    CHECK(json["leak_trends"]["failure"] == leaky.leakTrendFailure);
    CHECK(json["leak_trends"]["series"][0]["verdict"] == "leak");

    document["leak_trend"] = "leak";
    const auto expects = hmc::scenario::parseScenario(document, "trend.json");
    CHECK((build(expects, true, 30).outcome == Outcome::kPass));
    const auto missing = build(expects, false, 30);
    CHECK((missing.outcome == Outcome::kFail));
    CHECK(missing.leakTrendFailure.find("no leak across 30 cycles") == 0);
    const auto once = build(expects, true, 1);
    CHECK((once.outcome == Outcome::kFail));
    CHECK_FALSE(once.leakTrends);
    CHECK(once.leakTrendFailure.find("run it with --repetitions") != std::string::npos);
    // One run of a scenario without the expectation: no section at all.
    CHECK_FALSE(build(none, false, 1).leakTrends);
  }
}
