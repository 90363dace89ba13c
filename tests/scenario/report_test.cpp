// The report model (report.hpp), the rank-result wire format (rank_result.hpp), the console
// reporter and output files: what hmc-run prints and writes, without running ranks.
#include "hmc/scenario/report.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/reporters.hpp"

namespace {

namespace fs = std::filesystem;
using namespace hmc::scenario;
using nlohmann::json;

Scenario twoSteps(bool withFault = false) {
  Scenario scenario;
  scenario.name = "two-steps";
  scenario.file = "two-steps.json";
  scenario.worldSize = 2;
  scenario.timeoutS = 5;
  Step create;
  create.op = Op::kCreate;
  create.module = "a";
  Step close;
  close.op = withFault ? Op::kFault : Op::kCloseAll;
  scenario.steps = {create, close};
  return scenario;
}

StepResult step(int index, Op op, StepStatus status, bool expected = true) {
  StepResult result;
  result.index = index;
  result.op = op;
  result.status = status;
  result.expected = expected;
  return result;
}

RankResult rank(int index, std::vector<StepResult> steps) {
  RankResult result;
  result.rank = index;
  result.steps = std::move(steps);
  result.leaks.checked = true;
  return result;
}

hmc::diagnostics::FlightEntry entry(std::uint64_t sequence, std::string stage, int step,
                                    std::string status) {
  hmc::diagnostics::FlightEntry flight;
  flight.sequence = sequence;
  flight.stage = std::move(stage);
  flight.step = step;
  flight.status = std::move(status);
  flight.startS = 0.1 * static_cast<double>(sequence);
  if (flight.status != "in_flight") flight.endS = flight.startS + 0.01;
  return flight;
}

// Every field of a rank result set, so a round trip would notice a field it drops.
RankResult fullResult() {
  RankResult result = rank(1, {});
  result.host = "node-7";
  result.pid = 4242;
  StepResult forward = step(0, Op::kForward, StepStatus::kOk);
  forward.module = "a";
  forward.label = "first bind";
  forward.seconds = 0.25;
  forward.startS = 1.5;
  forward.bind = BindInfo{3, true, 0.125};
  StepResult failed = step(1, Op::kCloseAll, StepStatus::kError, false);
  failed.error = StepError{hmc::ErrorKind::kValueError, "multicore resource manifests differ"};
  failed.mismatch = json{{"stage", "close validation"}, {"first_difference", {{"rank", 1}}}};
  result.steps = {forward, failed, step(2, Op::kBarrier, StepStatus::kNotRun)};
  result.crashed = true;
  result.crashReason = "exited with status 17 (fault crash)";
  result.hung = true;
  result.final = FinalState{2, 1, true};
  result.leaks.reason = "";
  result.leaks.shutdownError = "close failed";
  result.leaks.groups = 1;
  result.leaks.boundGroups = 1;
  result.leaks.runtimeLive = true;
  result.leaks.bytesHeld = 4096;
  result.leaks.workspacesHeld = 1;
  result.leaks.bytesAllocated = 8192;
  result.leaks.workspacesCreated = 2;
  result.leaks.heldBy = {HeldWorkspace{7, std::string("a"), 4096, 1, false, std::string("cuda:0")},
                         HeldWorkspace{std::nullopt, std::nullopt, 0, 0, true, std::nullopt}};
  DeviceLeakCheck device;
  device.device = 0;
  device.freeBytesBefore = 1000;
  device.totalBytes = 5000;
  device.bytesHeld = 4096;
  device.live = {LiveDeviceHandle{"memory", 0, 4096, "rank 1 ScratchLinear cuda:0"}};
  result.leaks.device = device;
  result.timings.freshBind = {0.5};
  result.timings.reusedBind = {0.125, 0.25};
  result.timings.close = {0.75};
  result.timings.collectives = {{"recycle", {0.01, 0.02}}, {"close validation", {0.03}}};
  result.flight = {entry(0, "recycle", 0, "ok"), entry(1, "close validation", 1, "timeout")};
  result.collectives = 2;
  return result;
}

std::string console(const ScenarioReport& report, bool interrupted = false) {
  std::ostringstream out;
  auto reporter = makeConsoleReporter(out, ConsoleOptions{});
  reporter->report(report);
  reporter->finish(interrupted);
  return out.str();
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A fresh folder under the build's temporary directory, removed at the end.
struct TempFolder {
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "hmc-report-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempFolder() { fs::remove_all(path); }
  fs::path path;
};

}  // namespace

TEST_SUITE("report") {
  TEST_CASE("the outcome follows the reference runner's table") {
    const Scenario plain = twoSteps();
    auto ok = [](int r) {
      return rank(r,
                  {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kOk)});
    };
    CHECK((computeOutcome(plain, {ok(0), ok(1)}) == Outcome::kPass));
    // An expected error or hang still passes.
    CHECK((computeOutcome(plain, {ok(0), rank(1, {step(0, Op::kCreate, StepStatus::kError,
                                                       true)})}) == Outcome::kPass));
    CHECK((computeOutcome(plain, {ok(0), rank(1, {step(0, Op::kCreate, StepStatus::kError,
                                                       false)})}) == Outcome::kFail));
    // An unexpected hang wins over an unexpected error.
    CHECK((computeOutcome(plain, {rank(0, {step(1, Op::kCloseAll, StepStatus::kError, false)}),
                                  rank(1, {step(1, Op::kCloseAll, StepStatus::kHang, false)})}) ==
           Outcome::kHang));
    // A crash without a fault step fails even when every step met its expectation.
    RankResult crashed = ok(1);
    crashed.crashed = true;
    CHECK((computeOutcome(plain, {ok(0), crashed}) == Outcome::kFail));
    // The reference passes a crash once the scenario has any fault step (its ranks crash only
    // by plan); hmc only a crash planned on that rank: a rank that fell silent beside a
    // planned stall fails the run (it read '# OK' with 'no result from rank 3').
    CHECK((computeOutcome(twoSteps(true), {ok(0), crashed}) == Outcome::kFail));
    Scenario crashOnRank1 = twoSteps(true);
    crashOnRank1.steps[1].faultKind = hmc::scenario::FaultKind::kCrash;
    crashOnRank1.steps[1].ranks = std::vector<int>{1};
    CHECK((computeOutcome(crashOnRank1, {ok(0), crashed}) == Outcome::kPass));
    crashOnRank1.steps[1].ranks = std::vector<int>{0};  // planned on rank 0, rank 1 crashed
    CHECK((computeOutcome(crashOnRank1, {ok(0), crashed}) == Outcome::kFail));
    // Inside a repeat block, on every rank (beside a top-level stall: as in the reference,
    // only a top-level fault step excuses a crash at all).
    Scenario inRepeat = twoSteps(true);
    Step block;
    block.op = Op::kRepeat;
    block.count = 3;
    block.steps = {crashOnRank1.steps[1]};
    block.steps[0].ranks.reset();
    inRepeat.steps.push_back(block);
    CHECK((computeOutcome(inRepeat, {ok(0), crashed}) == Outcome::kPass));
    // An unplanned crash (a killed rank's recording, merged) fails as in the run it stands
    // for, whatever other fault steps there are. A planned one is the scenario's own.
    Scenario unplanned = twoSteps(true);
    unplanned.steps[1].faultKind = hmc::scenario::FaultKind::kCrash;
    unplanned.steps[1].crashPlanned = false;
    Step stall;
    stall.op = Op::kFault;
    unplanned.steps.push_back(stall);
    CHECK((computeOutcome(unplanned, {ok(0), crashed}) == Outcome::kFail));
    unplanned.steps[1].crashPlanned = true;
    CHECK((computeOutcome(unplanned, {ok(0), crashed}) == Outcome::kPass));
  }

  TEST_CASE("the run's first failure: the earliest collective, the rank named, what followed") {
    const Scenario plain = twoSteps();
    // Rank 0 waited in 'recycle' #3 for rank 1, whose own failure came later (#5): a
    // consequence. The collectives' sequence orders the ranks' failures.
    StepResult waited = step(0, Op::kCreate, StepStatus::kHang, false);
    waited.error = StepError{hmc::ErrorKind::kTimeout,
                             "'recycle' #3 timed out on rank 0 after 2 s: ranks [1] did not arrive"};
    waited.error->stage = "recycle";
    waited.error->sequence = 3;
    waited.error->collectivesBefore = 3;
    StepResult later = step(1, Op::kCloseAll, StepStatus::kError, false);
    later.error = StepError{hmc::ErrorKind::kRuntimeError, "multicore resource manifests differ"};
    later.error->stage = "close validation";
    later.error->sequence = 5;
    later.error->collectivesBefore = 5;
    const std::vector<RankResult> ranks = {rank(0, {waited}),
                                           rank(1, {step(0, Op::kCreate, StepStatus::kOk), later})};
    const auto outcome = computeOutcome(plain, ranks);
    CHECK((outcome == Outcome::kHang));
    const auto diagnosis = hmc::scenario::diagnoseRun(plain, ranks, outcome);
    REQUIRE(diagnosis.first);
    CHECK(diagnosis.first->kind == "hang");
    CHECK(diagnosis.first->ranks == std::vector<int>{1});
    CHECK(diagnosis.first->step == 0);
    CHECK(diagnosis.first->line ==
          "hang in 'recycle' #3 (step 0): rank 0 waited there; rank 1 never arrived");
    REQUIRE(diagnosis.consequences.size() == 1);
    CHECK(diagnosis.consequences[0].rank == 1);
    // A run that passed has none, whatever its ranks' expected errors.
    CHECK_FALSE(hmc::scenario::diagnoseRun(plain, ranks, Outcome::kPass).first);
    // In the JSON, beside the reference's fields.
    ScenarioReport report;
    report.name = "two-steps";
    report.diagnosis = diagnosis;
    const json out = hmc::scenario::toJson(report);
    CHECK(out["first_failure"]["ranks"] == json::array({1}));
    CHECK(out["consequences"][0]["follows_from"] == "first_failure");
  }

  TEST_CASE("a crash from outside fails a run whose scenario planned a crash of its own") {
    Scenario planned = twoSteps(true);
    planned.steps[1].faultKind = hmc::scenario::FaultKind::kCrash;
    RankResult killed = rank(1, {step(0, Op::kCreate, StepStatus::kOk)});
    killed.crashed = true;
    killed.crashReason = "killed by signal 9 (Killed)";
    RankResult joinless = killed;
    joinless.crashReason = "could not join its world: rank 1 timed out";
    RankResult own = killed;
    own.crashReason = "exited with status 17 (fault crash)";
    const RankResult fine = rank(0, {step(0, Op::kCreate, StepStatus::kOk)});
    CHECK((computeOutcome(planned, {fine, own}) == Outcome::kPass));
    CHECK((computeOutcome(planned, {fine, killed}) == Outcome::kFail));
    CHECK((computeOutcome(planned, {fine, joinless}) == Outcome::kFail));
  }

  TEST_CASE("outcomes order as hmc-run's exit codes: invalid > hang > fail > pass") {
    CHECK((worse(Outcome::kPass, Outcome::kFail) == Outcome::kFail));
    CHECK((worse(Outcome::kHang, Outcome::kFail) == Outcome::kHang));
    CHECK((worse(Outcome::kHang, Outcome::kInvalid) == Outcome::kInvalid));
    CHECK((worse(Outcome::kInvalid, Outcome::kPass) == Outcome::kInvalid));
    CHECK((exitCodeOf(Outcome::kPass) == 0));
    CHECK((exitCodeOf(Outcome::kFail) == 1));
    CHECK((exitCodeOf(Outcome::kInvalid) == 2));
    CHECK((exitCodeOf(Outcome::kHang) == 3));
  }

  TEST_CASE("the hang diagnosis names who waits where and who never arrived") {
    RankResult waiting = rank(0, {step(0, Op::kCreate, StepStatus::kOk),
                                  step(1, Op::kCloseAll, StepStatus::kHang, false)});
    waiting.hung = true;
    waiting.flight = {entry(2, "recycle", 0, "ok"), entry(3, "close validation", 1, "timeout")};
    RankResult absent = rank(
        1, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kSkipped)});
    absent.flight = {entry(2, "recycle", 0, "ok")};
    RankResult crashed = rank(2, {});
    crashed.crashed = true;
    crashed.crashReason = "killed by signal 9 (Killed)";
    CHECK(diagnoseHang({waiting, absent, crashed}) ==
          "rank 0 waits in 'close validation' #3 (step 1); rank 1 never arrived: last completed "
          "'recycle' #2 (step 0), finished its steps; rank 2 crashed (killed by signal 9 "
          "(Killed)); no collective completed");
    // No rank hung: nothing to diagnose.
    CHECK(diagnoseHang({absent}).empty());
  }

  TEST_CASE("across hosts the diagnosis names each rank's host, and the hosts that did not wait") {
    auto on = [](RankResult result, std::string host) {
      result.host = std::move(host);
      return result;
    };
    RankResult waiting = rank(0, {step(0, Op::kCreate, StepStatus::kOk),
                                  step(1, Op::kCloseAll, StepStatus::kHang, false)});
    waiting.hung = true;
    waiting.flight = {entry(2, "recycle", 0, "ok"), entry(3, "close validation", 1, "timeout")};
    RankResult waiting1 = waiting;
    waiting1.rank = 1;
    RankResult absent = rank(
        2, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kSkipped)});
    absent.flight = {entry(2, "recycle", 0, "ok")};
    RankResult absent3 = absent;
    absent3.rank = 3;
    RankResult crashed = rank(4, {});
    crashed.crashed = true;
    crashed.crashReason = "killed by signal 9 (Killed)";
    CHECK(diagnoseHang({on(waiting, "h1"), on(waiting1, "h1"), on(absent, "h3"),
                        on(absent3, "h3"), on(crashed, "h2")}) ==
          "rank 0 (host h1) waits in 'close validation' #3 (step 1); rank 1 (host h1) waits in "
          "'close validation' #3 (step 1); rank 2 (host h3) never arrived: last completed "
          "'recycle' #2 (step 0), finished its steps; rank 3 (host h3) never arrived: last "
          "completed 'recycle' #2 (step 0), finished its steps; rank 4 (host h2) crashed "
          "(killed by signal 9 (Killed)); no collective completed; not waiting: host h2 "
          "(rank 4), host h3 (ranks 2-3)");
    // One host (or none known): the words of one node, unchanged.
    CHECK(diagnoseHang({on(waiting, "h1"), on(absent, "h1")}) ==
          "rank 0 waits in 'close validation' #3 (step 1); rank 2 never arrived: last completed "
          "'recycle' #2 (step 0), finished its steps");
    CHECK(diagnoseHang({waiting, absent}) == diagnoseHang({on(waiting, "h1"), on(absent, "h1")}));
  }

  TEST_CASE("the report and the console say where each rank ran") {
    auto at = [](int index, std::string host, std::int64_t pid) {
      RankResult result = rank(index, {step(0, Op::kCreate, StepStatus::kOk),
                                       step(1, Op::kCloseAll, StepStatus::kOk)});
      result.host = std::move(host);
      result.pid = pid;
      return result;
    };
    Scenario three = twoSteps();
    three.worldSize = 3;
    RunInfo info;
    info.transport = "tcp";
    info.device = "cpu";
    const ScenarioReport across =
        buildReport(three, {at(0, "h1", 101), at(1, "h1", 102), at(2, "h3", 301)}, info);
    const json document = toJson(across);
    CHECK(document["ranks"][2]["host"] == "h3");
    CHECK(document["ranks"][2]["pid"] == 301);
    const std::string text = console(across);
    CHECK(text.find("\n# hosts: h1 ranks 0-1 (pids 101,102); h3 rank 2 (pid 301)\n") !=
          std::string::npos);
    CHECK(text.find("rank 2 @h3") != std::string::npos);
    // Thread ranks: one process on one host, no hosts line and plain columns; the JSON still
    // says where.
    const ScenarioReport threads =
        buildReport(three, {at(0, "h1", 7), at(1, "h1", 7), at(2, "h1", 7)}, info);
    CHECK(console(threads).find("# hosts:") == std::string::npos);
    CHECK(console(threads).find("@h1") == std::string::npos);
    CHECK(toJson(threads)["ranks"][0]["host"] == "h1");
    // A rank that never said where it ran reads null.
    const ScenarioReport unknown = buildReport(three, {at(0, "", 0), at(1, "", 0), at(2, "", 0)},
                                               info);
    CHECK(toJson(unknown)["ranks"][1]["host"].is_null());
    CHECK(toJson(unknown)["ranks"][1]["pid"].is_null());
  }

  TEST_CASE("across hosts the console names a host that lost every rank, and each crash's host") {
    auto at = [](int index, std::string host, std::optional<std::string> crash) {
      RankResult result = rank(
          index, crash ? std::vector<StepResult>{}
                       : std::vector<StepResult>{step(0, Op::kCreate, StepStatus::kOk),
                                                 step(1, Op::kCloseAll, StepStatus::kHang, false)});
      result.host = std::move(host);
      result.pid = 100 + index;
      result.hung = !crash;
      if (crash) {
        // Stopped from outside while alive (its reason says so), else crashed.
        (crash->rfind("stopped by ", 0) == 0 ? result.stopped : result.crashed) = true;
        result.crashReason = *crash;
      }
      return result;
    };
    const auto closed = [](int r) {
      return "no result from rank " + std::to_string(r) +
             ": its connection with rank 0 had closed: its process ended";
    };
    Scenario six = twoSteps();
    six.worldSize = 6;
    RunInfo info;
    info.transport = "tcp";
    info.device = "cpu";
    const std::string text = console(buildReport(
        six,
        {at(0, "h1", std::nullopt), at(1, "h1", std::nullopt), at(2, "h2", closed(2)),
         at(3, "h2", closed(3)), at(4, "h3", "no result from rank 4: rank 4 (host h3) fell silent"),
         at(5, "h3", std::nullopt)},
        info));
    CAPTURE(text);
    CHECK(text.find("\n# host h2 (ranks 2-3): every process ended without a result: its "
                    "processes were killed or the node failed\n") != std::string::npos);
    CHECK(text.find("# host h3") == std::string::npos);  // rank 5 of h3 is alive
    CHECK(text.find("\n# ranks 2 @h2: crashed: " + closed(2) + "\n") != std::string::npos);
    CHECK(text.find("\n# ranks 4 @h3: crashed: no result from rank 4") != std::string::npos);
    // Every rank of h3 silent: its own line, in those words.
    const std::string silent = console(buildReport(
        six,
        {at(0, "h1", std::nullopt), at(1, "h1", std::nullopt), at(2, "h2", std::nullopt),
         at(3, "h2", std::nullopt), at(4, "h3", "rank 4 (host h3) fell silent"),
         at(5, "h3", "rank 5 (host h3) fell silent")},
        info));
    CHECK(silent.find("\n# host h3 (ranks 4-5): every rank fell silent: the host is down or cut "
                      "off from the others\n") != std::string::npos);
    // h2's processes killed under mpirun while h3's ranks ran a step: Open MPI's teardown
    // stopped them, alive; only h2 is lost.
    const std::string stopped = console(buildReport(
        six,
        {at(0, "h1", std::nullopt), at(1, "h1", std::nullopt), at(2, "h2", closed(2)),
         at(3, "h2", closed(3)),
         at(4, "h3", "stopped by the launcher's teardown while running step 2 (alive then)"),
         at(5, "h3", "stopped by signal 15 (Terminated) in step 2")},
        info));
    CAPTURE(stopped);
    CHECK(stopped.find("\n# host h2 (ranks 2-3): ") != std::string::npos);
    CHECK(stopped.find("# host h3") == std::string::npos);
    CHECK(stopped.find("\n# ranks 4 @h3: stopped by the launcher's teardown while "
                       "running step 2") != std::string::npos);
    // Every host lost: no host stands out, no host line.
    const std::string all = console(
        buildReport(six,
                    {at(0, "h1", closed(0)), at(1, "h1", closed(1)), at(2, "h2", closed(2)),
                     at(3, "h2", closed(3)), at(4, "h3", closed(4)), at(5, "h3", closed(5))},
                    info));
    CHECK(all.find("# host ") == std::string::npos);
    // One host: the lines of one node, unchanged.
    const std::string one = console(
        buildReport(six,
                    {at(0, "h1", std::nullopt), at(1, "h1", std::nullopt), at(2, "h1", closed(2)),
                     at(3, "h1", closed(3)), at(4, "h1", std::nullopt), at(5, "h1", std::nullopt)},
                    info));
    CHECK(one.find("# host ") == std::string::npos);
    CHECK(one.find("\n# ranks 2: crashed: " + closed(2) + "\n") != std::string::npos);
  }

  TEST_CASE("a rank whose result had no way to the reporter is not called crashed") {
    // Rank 0 (the store's host, h1) crashed by plan; rank 1 reports in its place and waited
    // for it; ranks 2-3 on h2 lost the store too, and their results had no way to h1.
    Scenario plan = twoSteps(true);
    plan.worldSize = 4;
    plan.steps[1].faultKind = hmc::scenario::FaultKind::kCrash;
    plan.steps[1].ranks = std::vector<int>{0};
    RankResult zero = rank(0, {});
    zero.host = "h1";
    zero.crashed = true;
    zero.crashReason = "rank 0's process ended without a result (killed or crashed)";
    StepResult waited = step(1, Op::kFault, StepStatus::kHang, false);
    waited.error = StepError{hmc::ErrorKind::kRankFailure,
                             "rank 0 closed its connection in 'close validation' #1"};
    waited.error->stage = "close validation";
    waited.error->sequence = 1;
    waited.error->collectivesBefore = 1;
    RankResult one = rank(1, {step(0, Op::kCreate, StepStatus::kOk), waited});
    one.host = "h1";
    one.hung = true;
    one.flight = {entry(1, "close validation", 1, "rank_failure")};
    const std::string why = "no result: it runs on another host than rank 1 (h1)";
    std::vector<RankResult> ranks = {zero, one};
    for (const int index : {2, 3}) {
      RankResult lost = rank(index, {});
      lost.host = "h2";
      lost.resultLost = true;
      lost.crashReason = why;
      ranks.push_back(lost);
    }
    // Not crashes the plan did not ask for: the outcome is rank 1's hang, not a failure.
    CHECK((computeOutcome(plan, ranks) == Outcome::kHang));
    RunInfo info;
    info.transport = "tcp";
    const ScenarioReport report = buildReport(plan, ranks, info);
    const json out = toJson(report);
    CHECK(out["ranks"][2]["result_lost"] == true);
    CHECK(out["ranks"][2]["lost_reason"] == why);
    CHECK_FALSE(out["ranks"][2].contains("crashed"));
    CHECK_FALSE(out["ranks"][2].contains("steps"));
    const std::string text = console(report);
    CAPTURE(text);
    CHECK(text.find("\n# ranks 2-3 @h2: result lost: " + why + "\n") != std::string::npos);
    CHECK(text.find("# host h2") == std::string::npos);  // not known to be lost
    CHECK(text.find("# first failure: crash: rank 0 (host h1) ended without reaching 'close "
                    "validation' #1") != std::string::npos);
    CHECK(text.find("what became of ranks [2 (host h2), 3 (host h2)] is not known here") !=
          std::string::npos);
    CHECK(text.find("rank 2 (host h2) not known here (" + why + ")") != std::string::npos);
    // The rank results document between ranks keeps it.
    const RankResult back = rankResultFromJson(toJson(ranks[2]));
    CHECK(back.resultLost);
    CHECK_FALSE(back.crashed);
  }

  TEST_CASE("timing percentiles are nearest-rank over the samples") {
    std::vector<double> samples;
    for (int i = 20; i >= 1; --i) samples.push_back(i);
    const TimingStats stats = timingStats(samples);
    CHECK(stats.count == 20);
    CHECK(*stats.p50 == 10);
    CHECK(*stats.p95 == 19);
    CHECK(*stats.max == 20);
    const TimingStats one = timingStats({0.5});
    CHECK(*one.p50 == 0.5);
    CHECK(*one.p95 == 0.5);
    const TimingStats none = timingStats({});
    CHECK(none.count == 0);
    CHECK_FALSE(none.p50.has_value());
  }

  TEST_CASE("a rank result survives the wire format unchanged") {
    RankResult original = fullResult();
    original.process = hmc::scenario::ProcessSample{1 << 20, 9, 4, false};
    original.process->heapBytes = 123456;
    original.process->residentUsedBytes = 654321;
    const json wire = toJson(original);
    CHECK(wire["format"] == std::string(kRankResultFormat));
    const RankResult back = rankResultFromJson(json::parse(wire.dump()));
    CHECK(toJson(back) == wire);
    CHECK(back.steps[0].bind->bindingId == 3);
    CHECK((back.steps[1].error->kind == hmc::ErrorKind::kValueError));
    CHECK(back.leaks.device->live.at(0).owner == "rank 1 ScratchLinear cuda:0");
    CHECK(back.timings.collectives.at("recycle").size() == 2);
    CHECK(back.process->heapBytes == 123456);
    CHECK(back.process->residentUsedBytes == 654321);
  }

  TEST_CASE("a rank result with a missing or foreign field is refused, naming it") {
    const json wire = toJson(fullResult());
    json missing = wire;
    missing["leaks"].erase("bytes_held");
    CHECK_THROWS_WITH_AS(rankResultFromJson(missing),
                         doctest::Contains("missing field /leaks/bytes_held"), hmc::ValueError);
    json stepless = wire;
    stepless["steps"][1].erase("status");
    CHECK_THROWS_WITH_AS(rankResultFromJson(stepless),
                         doctest::Contains("missing field /steps/1/status"), hmc::ValueError);
    json hostless = wire;
    hostless.erase("host");
    CHECK_THROWS_WITH_AS(rankResultFromJson(hostless), doctest::Contains("missing field /host"),
                         hmc::ValueError);
    json mistyped = wire;
    mistyped["rank"] = "one";
    CHECK_THROWS_WITH_AS(rankResultFromJson(mistyped), doctest::Contains("field /rank"),
                         hmc::ValueError);
    json foreign = wire;
    foreign["format"] = "hmc-rank-result/0";
    CHECK_THROWS_WITH_AS(rankResultFromJson(foreign), doctest::Contains("same hmc-run version"),
                         hmc::ValueError);
    json badOp = wire;
    badOp["steps"][0]["op"] = "explode";
    CHECK_THROWS_WITH_AS(rankResultFromJson(badOp),
                         doctest::Contains("unknown op 'explode' (expected one of: create, "),
                         hmc::ValueError);
    json badStatus = wire;
    badStatus["steps"][0]["status"] = "passed";
    CHECK_THROWS_WITH_AS(rankResultFromJson(badStatus),
                         "unknown step status 'passed' (expected one of: ok, error, hang, "
                         "skipped, not_run)",
                         hmc::ValueError);
    json badKind = wire;
    badKind["steps"][1]["error"]["kind"] = "oops";
    CHECK_THROWS_WITH_AS(rankResultFromJson(badKind),
                         doctest::Contains("unknown error kind 'oops' (expected one of: "
                                           "runtime_error, value_error, type_error, "),
                         hmc::ValueError);
  }

  TEST_CASE("the report document carries the contract's fields and hmc's sections") {
    RankResult r0 = fullResult();
    r0.rank = 0;
    r0.crashed = false;
    r0.hung = false;
    RankResult r1 =
        rank(1, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kOk)});
    RunInfo info;
    info.transport = "threads";
    const ScenarioReport report = buildReport(twoSteps(), {r0, r1}, info);
    const json document = toJson(report);
    CHECK(document["format"] == std::string(kReportFormat));
    CHECK(document["scenario"] == "two-steps");
    CHECK(document["world_size"] == 2);
    CHECK(document["outcome"] == "fail");
    CHECK(document["ranks"][0]["steps"][0]["bind"]["reused"] == true);
    CHECK(document["ranks"][0]["steps"][1]["error"]["kind"] == "value_error");
    CHECK(document["ranks"][0]["final"]["groups"] == 2);
    CHECK(document["mismatches"].size() == 1);
    CHECK(document["mismatches"][0]["rank"] == 0);
    CHECK(document["leaks"]["leaked"] == true);
    CHECK(document["leaks"]["ranks"][0]["device"]["bytes_held"] == 4096);
    CHECK_FALSE(document["leaks"]["ranks"][1].contains("device"));  // a CPU rank
    CHECK(document["timings"]["fresh_bind"]["count"] == 1);
    CHECK(document["timings"]["reuse_speedup_p50"] == doctest::Approx(0.5 / 0.125));
    CHECK(document["hang"].is_null());
    CHECK(document["environment"]["transport"] == "threads");
    CHECK(document["samples"]["repetitions"] == 1);
    CHECK(document["samples"]["metrics"]["collective/recycle"]["per_repetition"][0].size() == 2);
  }

  TEST_CASE(
      "repetitions: the worst outcome, the first failing repetition shown, warm-up left out") {
    auto run = [](double bind, StepStatus status, bool expected) {
      RankResult r = rank(
          0, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, status, expected)});
      r.timings.freshBind = {bind};
      RankResult other =
          rank(1, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kOk)});
      other.timings.freshBind = {bind};
      return std::vector<RankResult>{r, other};
    };
    std::vector<std::vector<RankResult>> repetitions = {
        run(100.0, StepStatus::kOk, true),  // warm-up: its 100 s must not reach the timings
        run(1.0, StepStatus::kError, false), run(2.0, StepStatus::kOk, true)};
    const ScenarioReport report = buildReport(twoSteps(), repetitions, 1, RunInfo{});
    CHECK((report.outcome == Outcome::kFail));
    CHECK(report.shownRepetition == 1);
    CHECK((report.ranks[0].steps[1].status == StepStatus::kError));
    CHECK(report.timings.freshBind.count == 4);
    CHECK(*report.timings.freshBind.max == 2.0);
    const auto& fresh = report.samples.metrics.at("fresh_bind").perRepetition;
    REQUIRE(fresh.size() == 3);
    CHECK(fresh[0] == std::vector<double>{100.0, 100.0});
    CHECK(report.samples.warmup == 1);
  }

  TEST_CASE("a report built one repetition at a time equals the report of them all") {
    auto run = [](double bind, StepStatus status, bool expected, bool withStage) {
      RankResult r = rank(
          0, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, status, expected)});
      r.timings.freshBind = {bind};
      if (withStage) r.timings.collectives["recycle"] = {bind / 2, bind / 4};
      RankResult other =
          rank(1, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kOk)});
      other.timings.reusedBind = {bind * 3};
      return std::vector<RankResult>{r, other};
    };
    // A stage seen only in the middle repetition; the second and fourth do not pass.
    const std::vector<std::vector<RankResult>> repetitions = {
        run(1.0, StepStatus::kOk, true, false), run(2.0, StepStatus::kError, false, true),
        run(3.0, StepStatus::kOk, true, false), run(4.0, StepStatus::kHang, false, false)};
    const Scenario scenario = twoSteps();
    ReportBuilder builder(scenario, 1);
    for (const auto& ranks : repetitions) builder.add(ranks);
    CHECK(builder.repetitions() == 4);
    const ScenarioReport streamed = std::move(builder).build(RunInfo{});
    const ScenarioReport whole = buildReport(scenario, repetitions, 1, RunInfo{});
    CHECK(toJson(streamed) == toJson(whole));
    CHECK((streamed.outcome == Outcome::kHang));
    CHECK(streamed.shownRepetition == 1);  // the first that did not pass
    CHECK((streamed.ranks[0].steps[1].status == StepStatus::kError));
    const auto& recycle = streamed.samples.metrics.at("collective/recycle").perRepetition;
    CHECK(recycle == std::vector<std::vector<double>>{{}, {1.0, 0.5}, {}, {}});
    CHECK(streamed.timings.exchange.count == 2);

    ReportBuilder passing(scenario, 0);
    passing.add(repetitions[0]);
    passing.add(repetitions[2]);
    const ScenarioReport last = std::move(passing).build(RunInfo{});
    CHECK(last.shownRepetition == 1);  // all passed: the latest
    CHECK(last.ranks[0].timings.freshBind == std::vector<double>{3.0});
    CHECK_THROWS_AS(ReportBuilder(scenario, 0).build(RunInfo{}), hmc::ValueError);
  }

  TEST_CASE("past the kept values a repetition keeps its median, and timings stay within 1 %") {
    // 100000 values a repetition: the third one would pass kKeptSampleValues.
    static_assert(2 * 100000 <= kKeptSampleValues && 3 * 100000 > kKeptSampleValues);
    auto run = [](double scale) {
      RankResult r =
          rank(0, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kOk)});
      for (int k = 1; k <= 100000; ++k) r.timings.freshBind.push_back(scale * k);
      return std::vector<RankResult>{r};
    };
    const Scenario scenario = twoSteps();
    ReportBuilder builder(scenario, 1);
    std::vector<double> exact;
    for (int r = 0; r < 5; ++r) {
      auto ranks = run(1e-6 * (r + 1));
      const auto& values = ranks[0].timings.freshBind;
      if (r >= 1) exact.insert(exact.end(), values.begin(), values.end());
      builder.add(std::move(ranks));
    }
    const ScenarioReport report = std::move(builder).build(RunInfo{});
    REQUIRE(report.samples.summarizedFrom == 2);
    const auto& fresh = report.samples.metrics.at("fresh_bind").perRepetition;
    REQUIRE(fresh.size() == 5);
    CHECK(fresh[1].size() == 100000);
    const double scale = 1e-6 * 3;  // the mean of the middle two
    CHECK(fresh[2] == std::vector<double>{(scale * 50000 + scale * 50001) / 2});
    CHECK(fresh[4].size() == 1);
    const json document = toJson(report);
    CHECK(document["samples"]["summarized_from"] == 2);
    CHECK(document["timings"]["approximate"] == true);
    const TimingStats want = timingStats(exact);
    CHECK(report.timings.freshBind.count == want.count);
    CHECK(*report.timings.freshBind.max == *want.max);
    CHECK(*report.timings.freshBind.p50 == doctest::Approx(*want.p50).epsilon(0.01));
    CHECK(*report.timings.freshBind.p95 == doctest::Approx(*want.p95).epsilon(0.01));
    // Within the budget: exact, and no trace of the summary in the document.
    const json whole = toJson(buildReport(scenario, {run(1e-6)}, RunInfo{}));
    CHECK_FALSE(whole["samples"].contains("summarized_from"));
    CHECK_FALSE(whole["timings"].contains("approximate"));
  }

  TEST_CASE("a labelled repeat step gives per-cycle samples") {
    Scenario scenario = twoSteps();
    scenario.steps[1].op = Op::kRepeat;
    scenario.steps[1].count = 4;
    scenario.steps[1].label = "cycle";
    StepResult repeated = step(1, Op::kRepeat, StepStatus::kOk);
    repeated.label = "cycle";
    repeated.seconds = 2.0;
    const ScenarioReport report = buildReport(
        scenario, {rank(0, {step(0, Op::kCreate, StepStatus::kOk), repeated})}, RunInfo{});
    CHECK(report.samples.metrics.at("repeat/cycle").perRepetition.at(0) ==
          std::vector<double>{0.5});
  }

  TEST_CASE("an invalid scenario's report names file, path and message") {
    const hmc::ScenarioError error("bad.json", "/steps/0/featres", "unknown key 'featres'");
    const ScenarioReport report = invalidReport("bad.json", "", error);
    CHECK((report.outcome == Outcome::kInvalid));
    const json document = toJson(report);
    CHECK(document["outcome"] == "invalid");
    CHECK(document["scenario"].is_null());
    CHECK(document["error"]["path"] == "/steps/0/featres");
    CHECK(console(report).find("# invalid scenario bad.json: /steps/0/featres: ") !=
          std::string::npos);
    // With an error stream, the error goes there and the table keeps the closing line.
    std::ostringstream table;
    std::ostringstream errors;
    ConsoleOptions options;
    options.errors = &errors;
    auto reporter = makeConsoleReporter(table, options);
    reporter->report(report);
    reporter->finish(false);
    CHECK(errors.str().find("# invalid scenario bad.json: /steps/0/featres: ") == 0);
    CHECK(table.str().find("invalid scenario") == std::string::npos);
    CHECK(table.str().find("# FAILED") != std::string::npos);
    const json set = toJson(std::vector<ScenarioReport>{report, report});
    CHECK(set["format"] == std::string(kReportSetFormat));
    CHECK(set["reports"].size() == 2);
  }

  TEST_CASE("the console prints the step table, the hang and the closing line") {
    RankResult waiting = rank(0, {step(0, Op::kCreate, StepStatus::kOk),
                                  step(1, Op::kCloseAll, StepStatus::kHang, false)});
    waiting.hung = true;
    waiting.steps[1].error = StepError{hmc::ErrorKind::kTimeout, "close validation timed out"};
    waiting.flight = {entry(0, "close validation", 1, "timeout")};
    RankResult skipped = rank(
        1, {step(0, Op::kCreate, StepStatus::kOk), step(1, Op::kCloseAll, StepStatus::kSkipped)});
    RunInfo info;
    info.transport = "tcp";
    info.device = "cpu";
    const ScenarioReport report = buildReport(twoSteps(), {waiting, skipped}, info);
    const std::string text = console(report);
    CHECK(text.find("# hmc-run: two-steps (2 ranks, transport tcp, device cpu, timeout 5 s)") == 0);
    CHECK(text.find("hang timeout (!)") != std::string::npos);
    CHECK(text.find("# ranks 0: step 1 close_all: hang timeout: close validation timed out "
                    "(unexpected)") != std::string::npos);
    CHECK(text.find("# hang: rank 0 waits in 'close validation' #0 (step 1); rank 1 never "
                    "arrived: no collective completed, finished its steps") != std::string::npos);
    CHECK(text.find("# outcome: hang") != std::string::npos);
    CHECK(text.find("# FAILED: 1 of 1 scenario did not pass (0 fail, 1 hang, 0 invalid)\n") !=
          std::string::npos);
    // Every line is a "# " comment or a table row.
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      CHECK((line.rfind("# ", 0) == 0 || line == "#" || line.rfind("  ", 0) == 0));
    }
    CHECK(console(report, true).find("# INTERRUPTED: stopped by a signal after 1 scenario") !=
          std::string::npos);
  }
}

TEST_SUITE("output_file") {
  TEST_CASE("a regular file is replaced atomically and no temporary file is left") {
    TempFolder folder;
    const std::string path = (folder.path / "report.json").string();
    CHECK(checkOutputPath(path).empty());
    writeOutputFile(path, "first\n");
    writeOutputFile(path, "second\n");
    CHECK(readAll(path) == "second\n");
    CHECK(std::distance(fs::directory_iterator(folder.path), fs::directory_iterator()) == 1);
  }

  TEST_CASE("a symlink to a file is written through, and stays a symlink") {
    TempFolder folder;
    const fs::path target = folder.path / "target.json";
    const fs::path link = folder.path / "link.json";
    std::ofstream(target) << "old";
    fs::create_symlink(target, link);
    writeOutputFile(link.string(), "new");
    CHECK(fs::is_symlink(link));
    CHECK(readAll(target.string()) == "new");
  }

  TEST_CASE("a FIFO is written directly, never renamed over") {
    TempFolder folder;
    const std::string fifo = (folder.path / "stream").string();
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    std::string received;
    std::thread reader([&] { received = readAll(fifo); });
    CHECK(checkOutputPath(fifo).empty());
    writeOutputFile(fifo, "through the pipe\n");
    reader.join();
    CHECK(received == "through the pipe\n");
    struct stat info {};
    REQUIRE(lstat(fifo.c_str(), &info) == 0);
    CHECK(S_ISFIFO(info.st_mode));
  }

  TEST_CASE("an unwritable path is refused up front, naming the path") {
    TempFolder folder;
    const std::string nowhere = (folder.path / "missing" / "report.json").string();
    CHECK(checkOutputPath(nowhere).find("cannot write " + nowhere + ": the folder") == 0);
    CHECK(checkOutputPath(folder.path.string()).find("it is a directory") != std::string::npos);
    CHECK(checkOutputPath("").find("empty path") != std::string::npos);
    CHECK_THROWS_WITH_AS(writeOutputFile(nowhere, "x"),
                         doctest::Contains(("cannot write " + nowhere).c_str()), hmc::RuntimeError);
  }
}
