#include "hmc/compare/statistics.hpp"

#include <doctest/doctest.h>

#include <limits>
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
    CHECK(verdict(compareSeries("m", Series{"s", {1, 3, 5, 7}}, Series{"s", {2, 4, 6, 8}},
                                kDefault)) == "same");
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
