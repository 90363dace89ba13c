// The pure parts of `hmc-run shrink`: failure signatures from reports (failure_signature.hpp),
// ddmin (ddmin.hpp) and the scenario reductions and --as-test (shrinker.hpp), with fake tests
// in place of runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "hmc/scenario/ddmin.hpp"
#include "hmc/scenario/failure_signature.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/shrinker.hpp"

namespace {

using namespace hmc::scenario;
using nlohmann::json;

StepResult stepResult(int index, Op op, StepStatus status, bool expected,
                      std::optional<StepError> error = std::nullopt) {
  StepResult step;
  step.index = index;
  step.op = op;
  step.status = status;
  step.expected = expected;
  step.error = std::move(error);
  return step;
}

// World of `world` ranks: rank `skipper` skips close_all (step 2), the others hang there.
ScenarioReport skippedClose(int world, int skipper) {
  ScenarioReport report;
  report.outcome = Outcome::kHang;
  for (int r = 0; r < world; ++r) {
    RankResult rank;
    rank.rank = r;
    rank.steps.push_back(stepResult(0, Op::kCreate, StepStatus::kOk, true));
    rank.steps.push_back(stepResult(1, Op::kForward, StepStatus::kOk, true));
    if (r == skipper) {
      rank.steps.push_back(stepResult(2, Op::kCloseAll, StepStatus::kSkipped, true));
    } else {
      rank.hung = true;
      rank.steps.push_back(stepResult(
          2, Op::kCloseAll, StepStatus::kHang, false,
          StepError{hmc::ErrorKind::kTimeout,
                    "'close validation' #" + std::to_string(3 + world) + " timed out on rank " +
                        std::to_string(r) + ": ranks [" + std::to_string(skipper) +
                        "] did not arrive" + (r == 0 ? "" : " (rank 0 gave up waiting first)")}));
    }
    report.ranks.push_back(std::move(rank));
  }
  return report;
}

json scenarioWith(int world, json steps) {
  return {{"format", "hmc-scenario/1"},
          {"name", "t"},
          {"world_size", world},
          {"timeout_s", 2},
          {"steps", std::move(steps)}};
}

json createStep(const std::string& module) { return {{"op", "create"}, {"module", module}}; }

}  // namespace

TEST_SUITE("shrink") {
  TEST_CASE("masking hides numbers, rank lists and quoted names but keeps stage names") {
    CHECK(maskText("'close validation' #17 timed out on rank 3: ranks [4, 5, 6] did not arrive") ==
          "'close validation' #N timed out on rank N: ranks [N] did not arrive");
    CHECK(maskText("ranks [0-14] entered 'recycle' #5") == "ranks [N] entered 'recycle' #N");
    CHECK(maskText("module 'noise_17' took 0.25 s") == "module 'X' took N s");
    CHECK(maskText("timed out: ranks [1] did not arrive (rank 0 gave up waiting first)") ==
          "timed out: ranks [N] did not arrive");
  }

  TEST_CASE("a skipped close has the same signature at 16 ranks as at 2, whoever skips") {
    const FailureSignature big = failureSignature(skippedClose(16, 15));
    const FailureSignature small = failureSignature(skippedClose(2, 1));
    CHECK(big.kind == FailureKind::kHang);
    CHECK(big.op == "close_all");
    CHECK(big.stage == "close validation");
    CHECK(big.ranks == "hang, skipped");
    CHECK(big.sameAs(small, SameLevel::kAll));
    CHECK(big.describe().rfind("hang in 'close validation' at close_all; ranks: hang, skipped",
                               0) == 0);
  }

  TEST_CASE("the levels of --same compare less and less") {
    FailureSignature a = failureSignature(skippedClose(4, 3));
    FailureSignature b = a;
    b.ranks = "hang";
    CHECK_FALSE(a.sameAs(b, SameLevel::kAll));
    CHECK(a.sameAs(b, SameLevel::kText));
    b.text = "timeout: something else";
    CHECK_FALSE(a.sameAs(b, SameLevel::kText));
    CHECK(a.sameAs(b, SameLevel::kStage));
    b.op = "repeat";  // a failure inside a repeat op: its nested op is not known
    CHECK(a.sameAs(b, SameLevel::kStage));
    b.op = "close";
    CHECK_FALSE(a.sameAs(b, SameLevel::kStage));
    b.op = a.op;
    b.stage = "recycle";
    CHECK_FALSE(a.sameAs(b, SameLevel::kStage));
    CHECK(a.sameAs(b, SameLevel::kOutcome));
    b.kind = FailureKind::kError;
    CHECK_FALSE(a.sameAs(b, SameLevel::kOutcome));
  }

  TEST_CASE("the kind comes from the first unexpected step: crash, mismatch, error, unmet") {
    ScenarioReport report;
    report.outcome = Outcome::kHang;
    RankResult live;
    live.rank = 0;
    live.steps.push_back(stepResult(
        1, Op::kCloseAll, StepStatus::kHang, false,
        StepError{hmc::ErrorKind::kRankFailure, "'close validation' #2 on rank 0: rank 1 failed"}));
    RankResult dead;
    dead.rank = 1;
    dead.crashed = true;
    dead.steps.push_back(stepResult(1, Op::kCloseAll, StepStatus::kNotRun, true));
    report.ranks = {live, dead};
    const FailureSignature crash = failureSignature(report);
    CHECK(crash.kind == FailureKind::kCrash);
    CHECK(crash.ranks == "crashed, hang");

    report.ranks = {live};
    report.ranks[0].steps[0] = stepResult(
        3, Op::kForward, StepStatus::kError, false,
        StepError{hmc::ErrorKind::kCollectiveMismatch,
                  "ranks entered different collectives at #4: ranks [0] entered 'recycle' #4, "
                  "ranks [1] entered 'close validation' #4"});
    const FailureSignature mismatch = failureSignature(report);
    CHECK(mismatch.kind == FailureKind::kCollectiveMismatch);
    CHECK(mismatch.stage == "close validation / recycle");

    report.ranks[0].steps[0] =
        stepResult(3, Op::kForward, StepStatus::kError, false,
                   StepError{hmc::ErrorKind::kRuntimeError,
                             "multicore resource binding order or specifications differ"});
    MismatchReport manifest;
    manifest.step = 3;
    manifest.stage = "recycle";
    report.mismatches = {manifest};
    CHECK(failureSignature(report).kind == FailureKind::kManifestMismatch);
    CHECK(failureSignature(report).stage == "recycle");
    report.mismatches.clear();
    CHECK(failureSignature(report).kind == FailureKind::kError);

    report.ranks[0].steps[0] = stepResult(3, Op::kClose, StepStatus::kOk, false);
    CHECK(failureSignature(report).kind == FailureKind::kUnmet);
  }

  TEST_CASE(
      "a run that passes without a leak has no failure; one whose shutdown leaves resources does") {
    ScenarioReport report;
    RankResult rank;
    rank.steps.push_back(stepResult(0, Op::kCreate, StepStatus::kOk, true));
    report.ranks = {rank};
    CHECK_FALSE(failureSignature(report).fails());
    report.leaked = true;
    report.ranks[0].leaks.groups = 1;
    // Held after a skipped shutdown (a hang that was expected): not a leak.
    CHECK_FALSE(failureSignature(report).fails());
    report.ranks[0].leaks.checked = true;
    report.ranks[0].leaks.shutdownError = "multicore resource manifests differ across ranks";
    CHECK(failureSignature(report).kind == FailureKind::kLeak);
    CHECK(failureSignature(report).ranks == "leaked");
    CHECK(failureSignature(report).text == "multicore resource manifests differ across ranks");
  }

  TEST_CASE("ddmin finds the failure-inducing items among many") {
    const std::set<std::size_t> needed = {17, 401, 777};
    std::size_t tests = 0;
    const auto kept = ddmin(1000, [&](const std::vector<std::size_t>& subset) {
      ++tests;
      return std::all_of(needed.begin(), needed.end(), [&](std::size_t i) {
        return std::binary_search(subset.begin(), subset.end(), i);
      });
    });
    CHECK(std::set<std::size_t>(kept.begin(), kept.end()) == needed);
    CHECK(tests < 300);
  }

  TEST_CASE("ddmin stops when asked and returns a subset that held") {
    int budget = 5;
    std::vector<std::size_t> lastHeld;
    const auto kept = ddmin(
        64,
        [&](const std::vector<std::size_t>& subset) {
          --budget;
          const bool held = std::binary_search(subset.begin(), subset.end(), std::size_t{40});
          if (held) lastHeld = subset;
          return held;
        },
        [&] { return budget <= 0; });
    CHECK(std::binary_search(kept.begin(), kept.end(), std::size_t{40}));
    CHECK(kept.size() < 64);
    CHECK(kept == lastHeld);
  }

  TEST_CASE("keeping ranks renumbers rank lists and drops steps left without ranks") {
    json scenario = scenarioWith(
        16, json::array({createStep("a"),
                         {{"op", "close_all"}, {"ranks", {0, 3, 15}}},
                         {{"op", "barrier"}, {"ranks", {7}}},
                         {{"op", "repeat"},
                          {"count", 2},
                          {"steps", json::array({{{"op", "barrier"}, {"ranks", {5}}}})}}}));
    const json kept = keepRanks(scenario, {3, 7, 15});
    CHECK(kept["world_size"] == 3);
    REQUIRE(kept["steps"].size() == 3);
    CHECK(kept["steps"][1]["ranks"] == json({0, 2}));
    CHECK(kept["steps"][2]["ranks"] == json({1}));
    // A list left naming every rank is the same as none.
    const json two = keepRanks(scenario, {3, 15});
    REQUIRE(two["steps"].size() == 2);
    CHECK_FALSE(two["steps"][1].contains("ranks"));
  }

  TEST_CASE("the shrinker finds the two needed steps and two ranks, and simplifies the rest") {
    json steps = json::array();
    for (int i = 0; i < 200; ++i) {
      steps.push_back({{"op", "create"},
                       {"module", "noise" + std::to_string(i)},
                       {"features", 64},
                       {"label", "noise"}});
    }
    steps[60] = {{"op", "create"}, {"module", "victim"}, {"features", 64}};
    steps[150] = {{"op", "close_all"}, {"ranks", {0, 1, 2, 3, 4, 5, 6}}, {"label", "skip 7"}};
    json scenario = scenarioWith(8, steps);
    scenario["description"] = "long";
    // "Fails" while the victim is created before a close_all that some rank skips.
    auto fails = [](const json& candidate) {
      const json& s = candidate["steps"];
      std::optional<std::size_t> create;
      std::optional<std::size_t> close;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i]["op"] == "create" && s[i].contains("module") &&
            (s[i]["module"] == "victim" || (s[i]["module"] == "a" && !create))) {
          create = i;
        }
        if (s[i]["op"] == "close_all" && s[i].contains("ranks") &&
            s[i]["ranks"].size() < candidate["world_size"].get<std::size_t>()) {
          close = i;
        }
      }
      return create && close && *create < *close;
    };
    Shrinker shrinker(scenario, fails);
    const json best = shrinker.run();
    CHECK(scenarioSize(best).steps == 2);
    CHECK(scenarioSize(best).ranks == 2);
    CHECK(best["steps"][0]["features"] == 1);
    CHECK(best["steps"][0]["module"] == "a");
    CHECK_FALSE(best.contains("description"));
    CHECK_FALSE(best["steps"][1].contains("label"));
    CHECK(shrinker.trials() < 400);
  }

  TEST_CASE("repeat counts go toward 1 and a repeat run once is replaced by its steps") {
    json scenario = scenarioWith(
        2, json::array({{{"op", "repeat"},
                         {"count", 50},
                         {"steps", json::array({createStep("a"),
                                                {{"op", "drop"}, {"module", "a"}},
                                                {{"op", "barrier"}, {"repeat", 9}}})}}}));
    auto fails = [](const json& candidate) {
      return candidate.dump().find("barrier") != std::string::npos;
    };
    Shrinker shrinker(scenario, fails);
    const json best = shrinker.run();
    REQUIRE(best["steps"].size() == 1);
    CHECK(best["steps"][0]["op"] == "barrier");
    CHECK(best["steps"][0].value("repeat", 1) == 1);
  }

  TEST_CASE("the shrinker stops when told and keeps the best so far") {
    json steps = json::array();
    for (int i = 0; i < 100; ++i) steps.push_back({{"op", "barrier"}});
    int calls = 0;
    Shrinker shrinker(
        scenarioWith(2, steps), [&](const json&) { return ++calls > 0; },
        [&] { return calls >= 3; });
    const json best = shrinker.run();
    CHECK(shrinker.stopped());
    CHECK(calls == 3);
    CHECK(scenarioSize(best).steps < 100);
  }

  TEST_CASE("--as-test sets each step's expect to what it did, split where ranks differ") {
    json scenario = scenarioWith(2, json::array({createStep("a"), {{"op", "close_all"}}}));
    RankResult r0;
    r0.rank = 0;
    r0.steps = {stepResult(0, Op::kCreate, StepStatus::kOk, true),
                stepResult(1, Op::kCloseAll, StepStatus::kHang, false,
                           StepError{hmc::ErrorKind::kTimeout, "'close validation' #1 timed out"})};
    RankResult r1;
    r1.rank = 1;
    r1.steps = {
        stepResult(0, Op::kCreate, StepStatus::kOk, true),
        stepResult(1, Op::kCloseAll, StepStatus::kError, false,
                   StepError{hmc::ErrorKind::kRuntimeError,
                             "close failed on ranks [1]: injected workspace close failure"})};
    const json test = asTest(scenario, {r0, r1});
    REQUIRE(test["steps"].size() == 3);
    CHECK(test["steps"][0]["expect"] == "ok");
    CHECK(test["steps"][1]["ranks"] == json({1}));
    CHECK(test["steps"][1]["expect_error"] == "injected workspace close failure");
    CHECK(test["steps"][2]["ranks"] == json({0}));
    CHECK(test["steps"][2]["expect"] == "hang");
    CHECK_NOTHROW((void)parseScenario(test, "as-test"));
  }

  TEST_CASE("an expect_error fragment is the longest part without digits") {
    CHECK(stableFragment("multicore resource close failed on ranks [1]: RuntimeError: injected "
                         "workspace close failure") ==
          "RuntimeError: injected workspace close failure");
    CHECK(stableFragment("42") == "");
  }
}
