#include "hmc/compare/statistics.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "hmc/compare/compare.hpp"
#include "hmc/error.hpp"

using doctest::Approx;
using namespace hmc::compare;

namespace {
// A std::string for doctest to print (it would pick up toString(Verdict) by ADL otherwise).
std::string verdict(const MetricComparison& m) { return std::string(toString(m.verdict)); }
}  // namespace

// Expected p-values: the exact ones count arrangements (C(n1 + n2, n1) of them; a brute-force
// enumeration with itertools.combinations gives the same counts), the normal ones follow the
// formula in statistics.hpp by hand; Debian's scipy 1.10
// mannwhitneyu(x, y, alternative="two-sided") gives every value below to the digits shown.
TEST_SUITE("compare statistics") {
  TEST_CASE("complete separation of 5 and 5 gives the exact p = 2 / C(10, 5)") {
    const UTestResult r = mannWhitneyU({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
    CHECK(r.exact);
    CHECK_FALSE(r.ties);
    CHECK(r.u1 == 0);
    CHECK(r.u2 == 25);
    CHECK(r.pValue == Approx(2.0 / 252.0).epsilon(1e-12));
    // The same test the other way round.
    CHECK(mannWhitneyU({6, 7, 8, 9, 10}, {1, 2, 3, 4, 5}).pValue == Approx(2.0 / 252.0));
  }

  TEST_CASE("interleaved 3 and 3 gives the exact p = 2 * 7 / 20") {
    // U of {1, 3, 5} against {2, 4, 6} is 3; the null counts of U = 0..9 are
    // 1 1 2 3 3 3 3 2 1 1, so P(U >= 6) = 7 / 20.
    const UTestResult r = mannWhitneyU({1, 3, 5}, {2, 4, 6});
    CHECK(r.exact);
    CHECK(r.u1 == 3);
    CHECK(r.pValue == Approx(0.7).epsilon(1e-12));
  }

  TEST_CASE("unequal sizes use the exact distribution: 6 against 4") {
    const UTestResult r = mannWhitneyU({1.1, 2.5, 3.3, 4.7, 6.0, 7.2}, {2.0, 5.1, 8.4, 9.9});
    CHECK(r.exact);
    CHECK(r.u1 == 7);
    CHECK(r.pValue == Approx(2.0 * 37.0 / 210.0).epsilon(1e-12));  // 0.352381
  }

  TEST_CASE("a small side (<= 8) against 20 stays exact") {
    std::vector<double> y;
    for (int v = 1; v <= 20; ++v) y.push_back(v);
    const UTestResult a = mannWhitneyU({2.5, 7.5, 13.5}, y);
    CHECK(a.exact);
    CHECK(a.u1 == 22);
    CHECK(a.pValue == Approx(0.5138339920948616).epsilon(1e-9));
    const UTestResult b = mannWhitneyU({10.5, 15.5, 18.5, 19.5}, y);
    CHECK(b.u1 == 62);
    CHECK(b.pValue == Approx(0.09693205345379258).epsilon(1e-9));
  }

  TEST_CASE("ties get midranks and the tie-corrected normal approximation") {
    // Ranks: 1 -> 1, the three 2s -> 3, the two 3s -> 5.5, 4 -> 7, 5 -> 8. R1 = 12.5,
    // U1 = 2.5, sigma^2 = 16/12 * (9 - (24 + 6) / 56) = 11.2857, z = (13.5 - 8 - 0.5) / sigma.
    const UTestResult r = mannWhitneyU({1, 2, 2, 3}, {2, 3, 4, 5});
    CHECK_FALSE(r.exact);
    CHECK(r.ties);
    CHECK(r.u1 == Approx(2.5));
    CHECK(r.pValue == Approx(0.13665824773814753).epsilon(1e-9));
  }

  TEST_CASE("both sides above 8 samples use the normal approximation with continuity correction") {
    const std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const std::vector<double> y{4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5};
    const UTestResult r = mannWhitneyU(x, y);
    CHECK_FALSE(r.exact);
    CHECK(r.u1 == 21);
    CHECK(r.pValue == Approx(0.05501383235397906).epsilon(1e-9));
  }

  TEST_CASE("identical samples give p = 1") {
    CHECK(mannWhitneyU({5, 5, 5}, {5, 5, 5, 5}).pValue == 1.0);
    CHECK(mannWhitneyU({1, 2, 3}, {1, 2, 3}).pValue == 1.0);
  }

  TEST_CASE("empty and non-finite samples are refused") {
    CHECK_THROWS_AS(mannWhitneyU({}, {1.0}), hmc::ValueError);
    CHECK_THROWS_AS(mannWhitneyU({1.0, std::numeric_limits<double>::quiet_NaN()}, {1.0}),
                    hmc::ValueError);
  }

  TEST_CASE("the smallest reachable p-value says how many samples are needed") {
    CHECK(smallestPValue(3, 3) == Approx(0.1));
    CHECK(smallestPValue(4, 4) == Approx(2.0 / 70.0));
    CHECK(smallestPValue(0, 4) == 1.0);
    CHECK(minimumSamplesPerSide(0.05) == 4);
    CHECK(minimumSamplesPerSide(0.01) == 5);  // 2 / C(8, 4) = 0.029, 2 / C(10, 5) = 0.0079
    CHECK_THROWS_AS(minimumSamplesPerSide(0.0), hmc::ValueError);
  }

  TEST_CASE("median and geometric mean") {
    CHECK(median({3, 1, 2}) == 2);
    CHECK(median({4, 1, 3, 2}) == 2.5);
    CHECK_THROWS_AS(median({}), hmc::ValueError);
    CHECK(geometricMean({2.0, 8.0}) == Approx(4.0));
    CHECK(geometricMean({1.1}) == Approx(1.1));
    CHECK_THROWS_AS(geometricMean({1.0, 0.0}), hmc::ValueError);
  }
}

// The Hodges-Lehmann shift and its Moses interval. By hand for 5 against 5: the 25 differences
// y - x of {1..5} and {6..10} are 1..9 with counts 1 2 3 4 5 4 3 2 1 (median 5); the exact null
// distribution of U gives P(U <= 2) = 4/252 <= 0.025 < P(U <= 3) = 7/252, so each end leaves
// out 3: [D(3), D(23)] = [2, 8].
TEST_SUITE("compare shift interval") {
  TEST_CASE("5 against 5: the median difference and [D(3), D(23)]") {
    const ShiftInterval s = shiftInterval({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, 0.95);
    CHECK(s.shift == 5);
    REQUIRE(s.bounded());
    CHECK(s.lower == 2);
    CHECK(s.upper == 8);
    // At 90%: P(U <= 3) = 7/252 <= 0.05 < P(U <= 4) = 12/252: 4 out each end, [3, 7].
    const ShiftInterval ninety = shiftInterval({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, 0.90);
    CHECK(ninety.lower == 3);
    CHECK(ninety.upper == 7);
  }

  TEST_CASE("too few samples for the level: an unbounded interval") {
    // 3 against 3: P(U <= 0) = 1/20 > 0.025, so no difference can be left out at 95%.
    const ShiftInterval s = shiftInterval({1, 2, 3}, {4, 5, 6}, 0.95);
    CHECK_FALSE(s.bounded());
    CHECK(s.shift == 3);
    CHECK_THROWS_AS(shiftInterval({}, {1}, 0.95), hmc::ValueError);
    CHECK_THROWS_AS(shiftInterval({1}, {1}, 1.0), hmc::ValueError);
  }

  TEST_CASE("the normal quantile") {
    CHECK(normalUpperQuantile(0.025) == Approx(1.959964).epsilon(1e-6));
    CHECK(normalUpperQuantile(0.5) == Approx(0).epsilon(1e-9));
    CHECK(normalUpperQuantile(0.005) == Approx(2.575829).epsilon(1e-6));
  }

  TEST_CASE("12 against 12 (the normal approximation): [D(38), D(107)]") {
    // c = floor(72 - 1.959964 * sqrt(12 * 12 * 25 / 12)) = floor(38.05) = 38 (the exact null
    // distribution gives 38 too: coverage 0.9551). The differences of {1..12} and {13..24} are
    // 1..23 with counts 1 2 .. 12 .. 2 1: D(38) = 9, D(107) = 15.
    std::vector<double> first;
    std::vector<double> second;
    for (int i = 1; i <= 12; ++i) {
      first.push_back(i);
      second.push_back(i + 12);
    }
    const ShiftInterval s = shiftInterval(first, second, 0.95);
    CHECK(s.shift == 12);
    CHECK(s.lower == 9);
    CHECK(s.upper == 15);
  }

  // Coverage on synthetic samples: two normal samples whose true shift is known, many times,
  // at sizes in the exact regime and in the normal approximation's (a fixed seed: the same draws
  // every run). The interval's coverage by construction is 0.968 at 5/5, 0.9551 at 12/12,
  // 0.9537 at 20/15, 0.9513 at 40/40 (the null distribution of U, counted in Python); the
  // fraction of 4,000 draws it holds the true shift in must not be below 95% by more than three
  // standard errors (0.0103): an interval of 94% or less fails.
  TEST_CASE("coverage of the 95% interval is at least 95%") {
    std::mt19937_64 random(20261205);
    std::normal_distribution<double> noise(0.0, 1.0);
    for (const auto& [n1, n2] : std::vector<std::pair<int, int>>{
             {5, 5}, {6, 9}, {8, 8}, {12, 12}, {20, 15}, {40, 40}}) {
      const double trueShift = 0.7;
      const int trials = 4000;
      int covered = 0;
      for (int trial = 0; trial < trials; ++trial) {
        std::vector<double> first(n1);
        std::vector<double> second(n2);
        for (double& v : first) v = noise(random);
        for (double& v : second) v = noise(random) + trueShift;
        const ShiftInterval s = shiftInterval(first, second, 0.95);
        if (s.lower <= trueShift && trueShift <= s.upper) ++covered;
      }
      const double coverage = static_cast<double>(covered) / trials;
      INFO("n1 = " << n1 << ", n2 = " << n2 << ": coverage " << coverage);
      MESSAGE("coverage at " << n1 << "/" << n2 << ": " << coverage);
      CHECK(coverage >= 0.95 - 3 * std::sqrt(0.95 * 0.05 / trials));
    }
  }
}

TEST_SUITE("compare verdicts") {
  const Thresholds kDefault{};

  TEST_CASE("a separated slower current fails the gate beyond the maximum regression") {
    const MetricComparison m = compareSeries("m", Series{"s", {1.0, 1.01, 0.99, 1.02, 1.0}},
                                             Series{"s", {1.2, 1.21, 1.19, 1.22, 1.2}}, kDefault);
    CHECK(verdict(m) == "slower");
    REQUIRE(m.change);
    CHECK(*m.change == Approx(0.2));
    CHECK(m.regression);
  }

  TEST_CASE("slower but within the maximum regression is slower without failing") {
    const MetricComparison m = compareSeries("m", Series{"s", {1.0, 1.01, 0.99, 1.02}},
                                             Series{"s", {1.05, 1.06, 1.04, 1.07}}, kDefault);
    CHECK(verdict(m) == "slower");
    CHECK_FALSE(m.regression);
  }

  TEST_CASE("faster and same") {
    CHECK(verdict(compareSeries("m", Series{"s", {2, 2.1, 2.2, 2.3}},
                                Series{"s", {1, 1.1, 1.2, 1.3}}, kDefault)) == "faster");
    // Interleaved and tight: the change's 95% interval lies within +/-10%.
    CHECK(verdict(compareSeries("m", Series{"s", {1.00, 1.02, 1.04, 1.06, 1.08, 1.01}},
                                Series{"s", {1.01, 1.03, 1.05, 1.07, 1.00, 1.02}}, kDefault)) ==
          "same");
  }

  TEST_CASE("not significant but wide is inconclusive, not same, with what would decide it") {
    // Interleaved, 4 a side: p = 0.69, but the 95% interval of the change runs from -71% to
    // +700% (the extreme ratios: 4 a side leave out one difference at each end).
    const MetricComparison wide = compareSeries("m", Series{"s", {1, 3, 5, 7}},
                                                Series{"s", {2, 4, 6, 8}}, kDefault);
    CHECK(verdict(wide) == "inconclusive");
    CHECK_FALSE(wide.regression);
    REQUIRE(wide.changeLow);
    REQUIRE(wide.changeHigh);
    CHECK(*wide.changeLow == Approx(2.0 / 7.0 - 1));
    CHECK(*wide.changeHigh == Approx(8.0 / 1.0 - 1));
    CHECK(wide.note.find("reaches past +/-10%") != std::string::npos);
    // A noisy machine: the median 15% slower on 5 samples a side, p = 0.46; the interval
    // runs from -31% to +100%.
    const MetricComparison noisy =
        compareSeries("m", Series{"s", {1.00, 0.80, 1.30, 0.95, 1.10}},
                      Series{"s", {1.24, 1.00, 1.60, 1.15, 0.90}}, kDefault);
    CHECK(noisy.pValue.value_or(0) >= 0.05);
    CHECK(verdict(noisy) == "inconclusive");
    REQUIRE(noisy.samplesNeeded);
    CHECK(*noisy.samplesNeeded > 5);
    CHECK(noisy.note.find("samples per side would decide it") != std::string::npos);
    // Stated as a wider margin, the same samples are the same.
    Thresholds wider;
    wider.maxRegression = 2.0;
    CHECK(verdict(compareSeries("m", Series{"s", {1.00, 0.80, 1.30, 0.95, 1.10}},
                                Series{"s", {1.24, 1.00, 1.60, 1.15, 0.90}}, wider)) == "same");
  }

  TEST_CASE("too few samples are undecided, with the minimum in the note") {
    const MetricComparison m =
        compareSeries("m", Series{"s", {1, 1, 1}}, Series{"s", {9, 9, 9}}, kDefault);
    CHECK(verdict(m) == "undecided");
    CHECK_FALSE(m.regression);
    CHECK(m.note.find("fewer than 4 samples per side") != std::string::npos);
  }

  TEST_CASE("sets match by name; a metric glob selects") {
    SampleSet a;
    a.series["s: fresh_bind"] = Series{"s", {1, 1, 1, 1}};
    a.series["s: close"] = Series{"s", {1, 1, 1, 1}};
    a.series["s: only_a"] = Series{"s", {1}};
    SampleSet b;
    b.series["s: fresh_bind"] = Series{"s", {2, 2, 2, 2}};
    b.series["s: close"] = Series{"s", {1, 1, 1, 1}};
    b.series["s: only_b"] = Series{"s", {1}};
    const Comparison all = compareSets(a, b, kDefault);
    REQUIRE(all.metrics.size() == 2);
    CHECK(all.metrics[0].name == "s: close");
    CHECK(verdict(all.metrics[1]) == "slower");
    CHECK(all.regression);
    CHECK(all.onlyBaseline == std::vector<std::string>{"s: only_a"});
    CHECK(all.onlyCurrent == std::vector<std::string>{"s: only_b"});
    CHECK(*all.geometricMeanRatio == Approx(std::sqrt(2.0)));
    const Comparison some = compareSets(a, b, kDefault, "*close");
    REQUIRE(some.metrics.size() == 1);
    CHECK_FALSE(some.regression);
    SampleSet g;
    g.format = SourceFormat::kGoogleBenchmark;
    CHECK_THROWS_AS(compareSets(a, g, kDefault), hmc::ValueError);
  }

  TEST_CASE("glob matching") {
    CHECK(globMatch("*", "anything"));
    CHECK(globMatch("quick*: repeat/*", "quickstart: repeat/cycle"));
    CHECK(globMatch("BM_?", "BM_X"));
    CHECK_FALSE(globMatch("BM_?", "BM_XY"));
    CHECK_FALSE(globMatch("*close", "close validation"));
  }

  TEST_CASE("report samples: warm-up repetitions are left out, one median per repetition") {
    const auto report = nlohmann::json::parse(R"({
      "format": "hmc-report/1", "scenario": "demo",
      "samples": {"repetitions": 3, "warmup": 1, "metrics": {
        "fresh_bind": {"unit": "s", "per_repetition": [[9.0], [1.0, 3.0, 2.0], [4.0, 6.0]]},
        "repeat/cycle": {"unit": "ms", "per_repetition": [[1.0], [], [2.0]]}}}})");
    const SampleSet set = samplesFromJson(report, "a.json");
    REQUIRE(set.series.count("demo: fresh_bind") == 1);
    CHECK(set.series.at("demo: fresh_bind").values == std::vector<double>{2.0, 5.0});
    CHECK(set.series.at("demo: repeat/cycle").values == std::vector<double>{0.002});
  }

  TEST_CASE("Google Benchmark: iteration rows grouped by name, aggregates ignored") {
    const auto doc = nlohmann::json::parse(R"({"context": {}, "benchmarks": [
      {"name": "BM_A", "run_type": "iteration", "real_time": 1000, "time_unit": "ns"},
      {"name": "BM_A", "run_type": "iteration", "real_time": 3, "time_unit": "us"},
      {"name": "BM_A_mean", "run_type": "aggregate", "real_time": 2000, "time_unit": "ns"},
      {"name": "BM_B", "run_type": "iteration", "real_time": 5, "time_unit": "ms"}]})");
    const SampleSet set = samplesFromJson(doc, "b.json");
    const bool isGoogleBenchmark = set.format == SourceFormat::kGoogleBenchmark;
    CHECK(isGoogleBenchmark);
    REQUIRE(set.series.size() == 2);
    CHECK(set.series.at("BM_A").values.size() == 2);
    CHECK(set.series.at("BM_A").values[1] == Approx(3e-6));
    CHECK(set.series.at("BM_B").values[0] == Approx(5e-3));
  }

  TEST_CASE("unknown formats and aggregate-only files are refused with what to do") {
    CHECK_THROWS_WITH_AS(samplesFromJson(nlohmann::json::parse(R"({"format": "x/1"})"), "f.json"),
                         doctest::Contains("unknown format 'x/1'"), hmc::ValueError);
    CHECK_THROWS_WITH_AS(samplesFromJson(nlohmann::json::parse(R"({"benchmarks": [
          {"name": "BM_A_mean", "run_type": "aggregate", "real_time": 1, "time_unit": "ns"}]})"),
                                         "g.json"),
                         doctest::Contains("--benchmark_report_aggregates_only"), hmc::ValueError);
    CHECK_THROWS_WITH_AS(
        samplesFromJson(nlohmann::json::parse(R"({"format": "hmc-report/1", "scenario": "s"})"),
                        "r.json"),
        doctest::Contains("no \"samples\" section"), hmc::ValueError);
  }
}

// Holm's step-down, by hand: p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005 x 4 = 0.02,
// 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06. Bonferroni would
// give (0.04, 0.16, 0.12, 0.02); Holm without the running maximum would give 0.04 to the 0.04.
TEST_SUITE("compare Holm adjustment") {
  TEST_CASE("step-down by hand, in the input's order") {
    const std::vector<double> adjusted = holmAdjust({0.01, 0.04, 0.03, 0.005});
    REQUIRE(adjusted.size() == 4);
    CHECK(adjusted[0] == Approx(0.03));
    CHECK(adjusted[1] == Approx(0.06));
    CHECK(adjusted[2] == Approx(0.06));
    CHECK(adjusted[3] == Approx(0.02));
  }

  TEST_CASE("capped at 1, monotone, one p-value unchanged, none refused") {
    const std::vector<double> capped = holmAdjust({0.5, 0.6});
    CHECK(capped[0] == Approx(1.0));
    CHECK(capped[1] == Approx(1.0));
    CHECK(holmAdjust({0.03})[0] == Approx(0.03));
    CHECK(holmAdjust({}).empty());
    // Ties: (0.02, 0.02, 0.2): 0.06, max(0.06, 0.04) = 0.06, max(0.06, 0.2) = 0.2.
    const std::vector<double> tied = holmAdjust({0.2, 0.02, 0.02});
    CHECK(tied[0] == Approx(0.2));
    CHECK(tied[1] == Approx(0.06));
    CHECK(tied[2] == Approx(0.06));
    CHECK_THROWS_AS(holmAdjust({0.1, 1.5}), hmc::ValueError);
    CHECK_THROWS_AS(holmAdjust({std::nan("")}), hmc::ValueError);
  }
}

// Signed-rank p-values count sign patterns by hand (2^n of them); scipy.stats.wilcoxon gives
// the same (0.0625, 0.1875).
TEST_SUITE("compare signed-rank test") {
  TEST_CASE("all five differences positive: p = 2 / 2^5") {
    const SignedRankResult r = wilcoxonSignedRank({1, 2, 3, 4, 5});
    CHECK(r.exact);
    CHECK(r.tPlus == 15);
    CHECK(r.pValue == Approx(0.0625));
  }

  TEST_CASE("one negative of rank 2: T- = 2, P(T <= 2) = 3 / 32, p = 6 / 32") {
    const SignedRankResult r = wilcoxonSignedRank({1, -2, 3, 4, 5});
    CHECK(r.tPlus == 13);
    CHECK(r.tMinus == 2);
    CHECK(r.pValue == Approx(0.1875));
    // The sign does not matter to a two-sided test; zeros are dropped.
    CHECK(wilcoxonSignedRank({-1, 2, -3, -4, -5, 0}).pValue == Approx(0.1875));
    CHECK(wilcoxonSignedRank({0, 0}).pValue == 1.0);
  }

  TEST_CASE("ties use the normal approximation with the tie correction") {
    // |d| = 1, 1, 2, 3: midranks 1.5, 1.5, 3, 4, all positive: T = 10, n = 4;
    // variance 4 * 5 * 9 / 24 - (8 - 2) / 48 = 7.375, z = (10 - 5 - 0.5) / sqrt(7.375).
    const SignedRankResult r = wilcoxonSignedRank({1, 1, 2, 3});
    CHECK_FALSE(r.exact);
    CHECK(r.pValue == Approx(std::erfc((4.5 / std::sqrt(7.375)) / std::sqrt(2.0))));
  }

  TEST_CASE("the smallest reachable p: 2 / 2^n") {
    CHECK(smallestPairedPValue(5) == Approx(0.0625));
    CHECK(smallestPairedPValue(10) == Approx(2.0 / 1024));
    CHECK(smallestPairedPValue(0) == 1.0);
  }

  TEST_CASE("paired interval: Walsh averages of 1..10 at 95% are [W(9), W(47)] = [3, 8]") {
    // n = 10: P(T+ <= 8) = 0.0244 <= 0.025 < P(T+ <= 9) = 0.0322, so c = 9 (the table's
    // critical value 8); the 55 sorted Walsh averages' 9th is 3.0 and 47th is 8.0.
    std::vector<double> d;
    for (int k = 1; k <= 10; ++k) d.push_back(k);
    const ShiftInterval s = pairedShiftInterval(d, 0.95);
    CHECK(s.shift == Approx(5.5));
    CHECK(s.lower == Approx(3.0));
    CHECK(s.upper == Approx(8.0));
    CHECK_FALSE(pairedShiftInterval({1, 2, 3}, 0.95).bounded());
  }
}

TEST_SUITE("compare gate over many metrics") {
  // Eight metrics: seven the same, one 30% slower with 5 a side completely separated
  // (p = 2 / 252 = 0.0079). Alone it is a regression; among 8 gated metrics Holm asks for
  // p < 0.05 / 8 = 0.00625 of the smallest, so it is not.
  SampleSet eight(bool slower) {
    SampleSet set;
    for (int k = 0; k < 8; ++k) {
      Series s{"s", {1.00, 1.01, 1.02, 1.03, 1.04}};
      if (slower && k == 3) {
        for (double& v : s.values) v *= 1.3;
      }
      set.series["x: m" + std::to_string(k)] = s;
    }
    return set;
  }

  TEST_CASE("Holm over the gated metrics keeps one chance crossing from failing the gate") {
    const Comparison holm = compareSets(eight(false), eight(true), Thresholds{});
    CHECK_FALSE(holm.regression);
    CHECK(holm.gatedCount == 8);
    const MetricComparison& m3 = holm.metrics[3];
    CHECK(m3.name == "x: m3");
    REQUIRE(m3.pValue);
    REQUIRE(m3.adjustedPValue);
    CHECK(*m3.pValue == Approx(2.0 / 252));
    CHECK(*m3.adjustedPValue == Approx(8 * 2.0 / 252));
    CHECK(verdict(m3) != "slower");
    CHECK_FALSE(m3.regression);

    GateOptions none;
    none.correction = Correction::kNone;
    const Comparison raw = compareSets(eight(false), eight(true), Thresholds{}, "", none);
    CHECK(raw.regression);
    CHECK(verdict(raw.metrics[3]) == "slower");
  }

  TEST_CASE("a gate glob: only the gated metric counts, the others are information") {
    GateOptions only;
    only.gateGlob = "x: m3";
    const Comparison gated = compareSets(eight(false), eight(true), Thresholds{}, "", only);
    CHECK(gated.gatedCount == 1);
    CHECK(gated.regression);
    CHECK(gated.metrics[3].regression);
    CHECK_FALSE(gated.metrics[0].gated);
    CHECK_FALSE(gated.metrics[0].adjustedPValue);
    // Informational metrics never fail the gate, even when slower.
    only.gateGlob = "x: m0";
    const Comparison info = compareSets(eight(false), eight(true), Thresholds{}, "", only);
    CHECK_FALSE(info.regression);
    CHECK(verdict(info.metrics[3]) == "slower");
    CHECK_FALSE(info.metrics[3].regression);
  }
}

TEST_SUITE("compare paired rounds") {
  // Ten rounds on a machine whose speed wanders by a factor of 2 between rounds (the same for
  // both runs of a round) and a noise of +/-1% within a round.
  std::pair<Series, Series> rounds(double slowdown) {
    const double drift[10] = {1.0, 1.6, 0.9, 2.0, 1.1, 1.3, 1.8, 0.95, 1.4, 1.2};
    const double noise[10] = {0.004, -0.008, 0.01,   -0.002, 0.006,
                              -0.01, 0.002,  -0.004, 0.008,  -0.006};
    Series base{"s", {}};
    Series cur{"s", {}};
    for (int k = 0; k < 10; ++k) {
      base.values.push_back(drift[k]);
      cur.values.push_back(drift[k] * (1 + noise[k]) * (1 + slowdown));
    }
    return {base, cur};
  }

  TEST_CASE("drift that moves both runs of a round cancels: same, where unpaired cannot tell") {
    const auto [base, cur] = rounds(0.0);
    const MetricComparison paired = comparePairedSeries("m", base, cur, Thresholds{});
    CHECK(verdict(paired) == "same");
    REQUIRE(paired.changeLow);
    CHECK(*paired.changeLow > -0.02);
    CHECK(*paired.changeHigh < 0.02);
    CHECK(verdict(compareSeries("m", base, cur, Thresholds{})) == "inconclusive");
  }

  TEST_CASE("a 15% slower build under the same drift is a regression, p = 2 / 2^10") {
    const auto [base, cur] = rounds(0.15);
    const MetricComparison paired = comparePairedSeries("m", base, cur, Thresholds{});
    CHECK(verdict(paired) == "slower");
    CHECK(paired.regression);
    REQUIRE(paired.pValue);
    CHECK(*paired.pValue == Approx(2.0 / 1024));
    REQUIRE(paired.change);
    CHECK(*paired.change == Approx(0.15).epsilon(0.02));
    // Unpaired, the drift hides it.
    CHECK_FALSE(compareSeries("m", base, cur, Thresholds{}).regression);
  }

  TEST_CASE("paired sides must have as many samples; too few rounds are undecided") {
    CHECK_THROWS_AS(comparePairedSeries("m", Series{"s", {1, 2}}, Series{"s", {1}}, Thresholds{}),
                    hmc::ValueError);
    const MetricComparison few = comparePairedSeries("m", Series{"s", {1, 1, 1, 1}},
                                                     Series{"s", {2, 2, 2, 2}}, Thresholds{});
    CHECK(verdict(few) == "undecided");
    CHECK(few.note.find("fewer than 6") != std::string::npos);
  }
}

TEST_SUITE("compare default gate") {
  TEST_CASE("reports with labelled cycles gate on them alone; without, on every metric") {
    SampleSet base;
    SampleSet slow;
    for (const char* name : {"s: repeat/cycle", "s: fresh_bind", "s: close"}) {
      base.series[name] = Series{"s", {1.00, 1.01, 1.02, 1.03, 1.04}};
      slow.series[name] = Series{"s", {1.30, 1.31, 1.32, 1.33, 1.34}};
    }
    const Comparison labelled = compareSets(base, slow, Thresholds{});
    CHECK(labelled.gateGlob == "*: repeat/*");
    CHECK(labelled.gatedCount == 1);
    CHECK(labelled.regression);
    for (const auto& m : labelled.metrics) CHECK(m.regression == (m.name == "s: repeat/cycle"));
    base.series.erase("s: repeat/cycle");
    slow.series.erase("s: repeat/cycle");
    const Comparison every = compareSets(base, slow, Thresholds{});
    CHECK(every.gateGlob == "*");
    CHECK(every.gatedCount == 2);
    CHECK(every.regression);  // 2 x 2 / 252 = 0.016 < 0.05
  }
}
