// The hmc-scenario/1 model (shared/scenario-format.md): what parses into what, and that every
// rule violation is a ScenarioError naming the file, the JSON path and what was expected.

#include "hmc/scenario/scenario.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "hmc/error.hpp"

using hmc::ScenarioError;
using hmc::scenario::Device;
using hmc::scenario::Expect;
using hmc::scenario::FaultKind;
using hmc::scenario::loadScenario;
using hmc::scenario::Op;
using hmc::scenario::ParseOptions;
using hmc::scenario::parseScenario;
using hmc::scenario::Scenario;
using nlohmann::json;

namespace {

constexpr const char* kFile = "test.json";

// What a ScenarioError said, comparable in one CHECK that prints both sides.
struct Failure {
  std::string file;
  std::string path;
  std::string detail;
  bool operator==(const Failure& other) const {
    return file == other.file && path == other.path && detail == other.detail;
  }
};

std::ostream& operator<<(std::ostream& out, const Failure& failure) {
  return out << "{file: '" << failure.file << "', path: '" << failure.path << "', detail: '"
             << failure.detail << "'}";
}

json scenarioWith(const json& steps, const json& extra = json::object()) {
  json document = {{"format", "hmc-scenario/1"}, {"name", "t"}, {"steps", steps}};
  document.update(extra);
  return document;
}

Failure failureOf(const json& document, const ParseOptions& options = {}) {
  try {
    parseScenario(document, kFile, options);
  } catch (const ScenarioError& error) {
    return {error.file(), error.jsonPath(), error.detail()};
  }
  return {"", "", "parsed without an error"};
}

// A failure of a scenario whose steps are `stepsText` (JSON text), world_size 2.
Failure stepsFailure(const std::string& stepsText, const ParseOptions& options = {}) {
  return failureOf(scenarioWith(json::parse(stepsText), {{"world_size", 2}}), options);
}

// A failure of a scenario whose top level is `documentText` (JSON text).
Failure topFailure(const std::string& documentText) { return failureOf(json::parse(documentText)); }

Scenario parseSteps(const std::string& stepsText) {
  return parseScenario(scenarioWith(json::parse(stepsText), {{"world_size", 2}}), kFile);
}

Failure at(const std::string& path, const std::string& detail) { return {kFile, path, detail}; }

// A file in a fresh temporary directory, removed with the directory.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("hmc_scenario_test_" + std::to_string(::getpid()) + "_" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

Failure loadFailure(const std::string& path, const ParseOptions& options = {}) {
  try {
    loadScenario(path, options);
  } catch (const ScenarioError& error) {
    return {error.file(), error.jsonPath(), error.detail()};
  }
  return {"", "", "loaded without an error"};
}

// Enum values by their format names: doctest would pick up toString() by ADL and fail.
template <typename Enum>
std::string name(Enum value) {
  return std::string(hmc::scenario::toString(value));
}
template <typename Enum>
std::string name(const std::optional<Enum>& value) {
  return value ? name(*value) : std::string("<none>");
}

const std::string kCreateA = R"({"op": "create", "module": "a"})";

}  // namespace

TEST_SUITE("scenario") {
  // ---- what parses ---------------------------------------------------------------------

  TEST_CASE("a minimal scenario takes the format's defaults") {
    const Scenario scenario = parseScenario(scenarioWith(json::array()), kFile);
    CHECK(scenario.file == kFile);
    CHECK(scenario.name == "t");
    CHECK(scenario.description.empty());
    CHECK(scenario.worldSize == 1);
    CHECK(name(scenario.device) == "auto");
    CHECK(scenario.dtype == "float32");
    CHECK(scenario.timeoutS == 30);
    CHECK(scenario.steps.empty());
  }

  TEST_CASE("the example of the format document parses field by field") {
    const Scenario scenario = parseScenario(json::parse(R"({
      "format": "hmc-scenario/1",
      "name": "recycle-reuses-idle-workspace",
      "description": "A dropped module's workspace is reused by the next compatible module.",
      "world_size": 2, "device": "cpu", "dtype": "float64", "timeout_s": 10.5,
      "steps": [
        {"op": "create", "module": "a", "type": "scratch_linear", "features": 64},
        {"op": "forward", "module": "a"},
        {"op": "drop", "module": "a"},
        {"op": "create", "module": "b", "type": "scratch_linear", "features": 64},
        {"op": "forward", "module": "b"},
        {"op": "check", "groups": 1, "bound_groups": 1},
        {"op": "close_all"}
      ]})"),
                                            "example.json");
    CHECK(scenario.name == "recycle-reuses-idle-workspace");
    CHECK(scenario.description ==
          "A dropped module's workspace is reused by the next compatible module.");
    CHECK(scenario.worldSize == 2);
    CHECK(name(scenario.device) == "cpu");
    CHECK(scenario.dtype == "float64");
    CHECK(scenario.timeoutS == 10.5);
    REQUIRE(scenario.steps.size() == 7);
    CHECK(name(scenario.steps[0].op) == "create");
    CHECK(scenario.steps[0].module == "a");
    CHECK(scenario.steps[0].path == "/steps/0");
    CHECK(name(scenario.steps[2].op) == "drop");
    CHECK(name(scenario.steps[5].op) == "check");
    CHECK(scenario.steps[5].groups == 1);
    CHECK(scenario.steps[5].boundGroups == 1);
    CHECK_FALSE(scenario.steps[5].runtimeLive.has_value());
    CHECK(name(scenario.steps[6].op) == "close_all");
    CHECK(scenario.steps[6].path == "/steps/6");
  }

  TEST_CASE("steps take the format's defaults for fields left out") {
    const Scenario scenario = parseSteps(R"([
      {"op": "create", "module": "a"},
      {"op": "forward", "module": "a"},
      {"op": "drop", "module": "a"},
      {"op": "fault", "kind": "stall"},
      {"op": "fault", "kind": "close_error"},
      {"op": "create", "module": "b", "compat": null},
      {"op": "fault", "kind": "busy", "module": "b"},
      {"op": "sleep"}
    ])");
    const auto& s = scenario.steps;
    CHECK(s[0].type == "scratch_linear");
    CHECK(s[0].features == 64);
    CHECK_FALSE(s[0].workspaceBytes.has_value());
    CHECK_FALSE(s[0].compat.has_value());
    CHECK(s[0].scope == "default");
    CHECK_FALSE(s[0].ranks.has_value());
    CHECK(name(s[0].expect) == "ok");
    CHECK_FALSE(s[0].expectError.has_value());
    CHECK(s[0].repeat == 1);
    CHECK_FALSE(s[0].label.has_value());
    CHECK(s[1].batch == 8);
    CHECK_FALSE(s[1].dtype.has_value());
    CHECK_FALSE(s[1].device.has_value());
    CHECK(s[1].backward);
    CHECK_FALSE(s[2].collect);
    CHECK(name(s[3].faultKind) == "stall");
    CHECK(s[3].seconds == 1);
    CHECK(name(s[4].faultKind) == "close_error");
    CHECK(s[4].faultCount == 1);
    CHECK_FALSE(s[5].compat.has_value());
    CHECK(name(s[6].faultKind) == "busy");
    CHECK(s[6].busy);
    CHECK(s[7].seconds == 0);
  }

  TEST_CASE("every field of every op is read into the step") {
    const Scenario scenario = parseSteps(R"([
      {"op": "create", "module": "a", "type": "scratch_mlp", "features": 16,
       "workspace_bytes": 0, "compat": {"k": [1, 2]}, "scope": "s",
       "ranks": [1, 0], "expect": "any", "expect_error": "x", "repeat": 3, "label": "make a"},
      {"op": "create", "module": "b"},
      {"op": "share", "modules": ["a", "b"]},
      {"op": "forward", "module": "a", "batch": 2, "dtype": "bfloat16", "device": "cuda",
       "backward": false},
      {"op": "backward", "module": "a"},
      {"op": "drop", "module": "b", "collect": true},
      {"op": "close", "module": "a", "expect_error": "closed"},
      {"op": "check", "runtime_live": false, "expect": "hang"},
      {"op": "fault", "kind": "release_error", "count": 4},
      {"op": "fault", "kind": "busy", "module": "a", "busy": false},
      {"op": "fault", "kind": "stall", "seconds": 0.25},
      {"op": "fault", "kind": "crash", "planned": false},
      {"op": "barrier"},
      {"op": "sleep", "seconds": 2},
      {"op": "repeat", "count": 5, "steps": [{"op": "barrier", "ranks": [1]}]}
    ])");
    const auto& s = scenario.steps;
    REQUIRE(s.size() == 15);
    CHECK(s[0].type == "scratch_mlp");
    CHECK(s[0].features == 16);
    CHECK(s[0].workspaceBytes == 0);
    CHECK(s[0].compat == json::parse(R"({"k": [1, 2]})"));
    CHECK(s[0].scope == "s");
    CHECK(s[0].ranks == std::vector<int>{1, 0});
    CHECK(name(s[0].expect) == "any");
    CHECK(s[0].expectError == "x");
    CHECK(s[0].repeat == 3);
    CHECK(s[0].label == "make a");
    CHECK(name(s[2].op) == "share");
    CHECK(s[2].modules == std::vector<std::string>{"a", "b"});
    CHECK(s[3].batch == 2);
    CHECK(s[3].dtype == "bfloat16");
    CHECK(name(s[3].device) == "cuda");
    CHECK_FALSE(s[3].backward);
    CHECK(name(s[4].op) == "backward");
    CHECK(s[4].module == "a");
    CHECK(s[5].collect);
    CHECK(name(s[6].op) == "close");
    CHECK(name(s[6].expect) == "error");
    CHECK(s[6].expectError == "closed");
    CHECK(s[7].runtimeLive == false);
    CHECK(name(s[7].expect) == "hang");
    CHECK(name(s[8].faultKind) == "release_error");
    CHECK(s[8].faultCount == 4);
    CHECK(s[9].module == "a");
    CHECK_FALSE(s[9].busy);
    CHECK(s[10].seconds == 0.25);
    CHECK(name(s[11].faultKind) == "crash");
    CHECK_FALSE(s[11].crashPlanned);
    CHECK(name(s[12].op) == "barrier");
    CHECK(s[13].seconds == 2);
    CHECK(s[14].count == 5);
    REQUIRE(s[14].steps.size() == 1);
    CHECK(name(s[14].steps[0].op) == "barrier");
    CHECK(s[14].steps[0].ranks == std::vector<int>{1});
    CHECK(s[14].steps[0].path == "/steps/14/steps/0");
  }

  TEST_CASE("an empty steps array is a valid scenario") {
    CHECK(parseScenario(scenarioWith(json::array()), kFile).steps.empty());
  }

  TEST_CASE("the toString functions spell the format's names") {
    using hmc::scenario::toString;
    CHECK(toString(Op::kCreate) == "create");
    CHECK(toString(Op::kShare) == "share");
    CHECK(toString(Op::kForward) == "forward");
    CHECK(toString(Op::kBackward) == "backward");
    CHECK(toString(Op::kDrop) == "drop");
    CHECK(toString(Op::kClose) == "close");
    CHECK(toString(Op::kCloseAll) == "close_all");
    CHECK(toString(Op::kCheck) == "check");
    CHECK(toString(Op::kFault) == "fault");
    CHECK(toString(Op::kBarrier) == "barrier");
    CHECK(toString(Op::kSleep) == "sleep");
    CHECK(toString(Op::kRepeat) == "repeat");
    CHECK(toString(Device::kAuto) == "auto");
    CHECK(toString(Device::kCpu) == "cpu");
    CHECK(toString(Device::kCuda) == "cuda");
    CHECK(toString(Expect::kOk) == "ok");
    CHECK(toString(Expect::kError) == "error");
    CHECK(toString(Expect::kHang) == "hang");
    CHECK(toString(Expect::kAny) == "any");
    CHECK(toString(FaultKind::kCloseError) == "close_error");
    CHECK(toString(FaultKind::kReleaseError) == "release_error");
    CHECK(toString(FaultKind::kBusy) == "busy");
    CHECK(toString(FaultKind::kStall) == "stall");
    CHECK(toString(FaultKind::kCrash) == "crash");
  }

  TEST_CASE("isScenarioDtype accepts exactly the four scenario dtypes") {
    using hmc::scenario::isScenarioDtype;
    CHECK(isScenarioDtype("float32"));
    CHECK(isScenarioDtype("float64"));
    CHECK(isScenarioDtype("float16"));
    CHECK(isScenarioDtype("bfloat16"));
    CHECK_FALSE(isScenarioDtype("int64"));
    CHECK_FALSE(isScenarioDtype("Float32"));
    CHECK_FALSE(isScenarioDtype(""));
  }

  TEST_CASE("the error message carries the file and the JSON path in front of the detail") {
    try {
      parseScenario(json::parse(R"({"format": "hmc-scenario/1", "name": "t", "steps": 1})"), kFile);
      FAIL("no error");
    } catch (const ScenarioError& error) {
      CHECK(std::string(error.what()) == "test.json: /steps: expected an array of steps, got 1");
      CHECK(hmc::toString(error.kind()) == "scenario_error");
    }
  }

  // ---- the top level -------------------------------------------------------------------

  TEST_CASE("a top level that is not an object is rejected with the type found") {
    CHECK(topFailure("[]") ==
          at("", "expected a JSON object at the top level, got an empty array"));
    CHECK(topFailure("[1]") == at("", "expected a JSON object at the top level, got an array"));
    CHECK(topFailure("null") == at("", "expected a JSON object at the top level, got null"));
    CHECK(topFailure(R"("x")") ==
          at("", R"(expected a JSON object at the top level, got a string "x")"));
  }

  TEST_CASE("an unknown top-level key is named, with the known keys and a likely typo") {
    const std::string known =
        "expected one of format, name, description, world_size, device, dtype, timeout_s, steps, "
        "leak_trend, reference_differs";
    CHECK(failureOf(scenarioWith(json::array(), {{"wrld_size", 2}})) ==
          at("/wrld_size", "unknown key 'wrld_size'; " + known + "; did you mean 'world_size'?"));
    CHECK(failureOf(scenarioWith(json::array(), {{"colour", "red"}})) ==
          at("/colour", "unknown key 'colour'; " + known));
    CHECK(failureOf(scenarioWith(json::array(), {{"a/b~c", 1}})) ==
          at("/a~1b~0c", "unknown key 'a/b~c'; " + known));
  }

  TEST_CASE("reference_differs is hmc's extension: why and distinct top-level step indices") {
    const json steps =
        json::array({json{{"op", "barrier"}}, json{{"op", "barrier"}}, json{{"op", "barrier"}}});
    CHECK_FALSE(parseScenario(scenarioWith(steps), kFile).referenceDiffers.has_value());
    const Scenario scenario = parseScenario(
        scenarioWith(steps,
                     {{"reference_differs", {{"why", "named mismatch"}, {"steps", {2, 0}}}}}),
        kFile);
    REQUIRE(scenario.referenceDiffers.has_value());
    CHECK(scenario.referenceDiffers->why == "named mismatch");
    CHECK(scenario.referenceDiffers->steps == std::vector<int>{0, 2});
    const Scenario whyOnly =
        parseScenario(scenarioWith(steps, {{"reference_differs", {{"why", "w"}}}}), kFile);
    CHECK(whyOnly.referenceDiffers->steps.empty());

    auto with = [&](const json& value) {
      return failureOf(scenarioWith(steps, {{"reference_differs", value}}));
    };
    CHECK(with(json::array()) ==
          at("/reference_differs",
             "expected an object {\"why\": ..., \"steps\": [...]}, got an empty array"));
    CHECK(
        with(json{{"steps", {1}}}) ==
        at("/reference_differs", "missing required key 'why' (why the reference runner differs)"));
    CHECK(with(json{{"why", ""}}) ==
          at("/reference_differs/why", "expected a non-empty string, got an empty string"));
    CHECK(with(json{{"why", "w"}, {"step", {1}}}) ==
          at("/reference_differs/step",
             "unknown key 'step' in reference_differs; expected one of why, steps; did you mean "
             "'steps'?"));
    CHECK(with(json{{"why", "w"}, {"steps", 1}}) ==
          at("/reference_differs/steps", "expected an array of top-level step indices, got 1"));
    CHECK(with(json{{"why", "w"}, {"steps", {"1"}}}) ==
          at("/reference_differs/steps/0", "expected an integer, got a string \"1\""));
    CHECK(with(json{{"why", "w"}, {"steps", {0, 3}}}) ==
          at("/reference_differs/steps/1", "step 3 does not exist: top-level steps are 0..2"));
    CHECK(with(json{{"why", "w"}, {"steps", {-1}}}) ==
          at("/reference_differs/steps/0", "step -1 does not exist: top-level steps are 0..2"));
    CHECK(with(json{{"why", "w"}, {"steps", {1, 1}}}) ==
          at("/reference_differs/steps/1", "step 1 is listed more than once"));
    CHECK(failureOf(scenarioWith(json::array(),
                                 {{"reference_differs", {{"why", "w"}, {"steps", {0}}}}})) ==
          at("/reference_differs/steps/0", "step 0 does not exist: the scenario has no steps"));
  }

  TEST_CASE("format is required and must be hmc-scenario/1") {
    CHECK(topFailure(R"({"name": "t", "steps": []})") == at("", "missing required key 'format'"));
    CHECK(topFailure(R"({"format": "hmc-scenario/2", "name": "t", "steps": []})") ==
          at("/format", R"(expected "hmc-scenario/1", got a string "hmc-scenario/2")"));
    CHECK(topFailure(R"({"format": 1, "name": "t", "steps": []})") ==
          at("/format", R"(expected "hmc-scenario/1", got 1)"));
    CHECK(topFailure(R"({"format": "other/1", "nom": "t", "steps": []})") ==
          at("/format", R"(expected "hmc-scenario/1", got a string "other/1")"));
  }

  TEST_CASE("name is a required non-empty string") {
    CHECK(topFailure(R"({"format": "hmc-scenario/1", "steps": []})") ==
          at("", "missing required key 'name'"));
    CHECK(topFailure(R"({"format": "hmc-scenario/1", "name": "", "steps": []})") ==
          at("/name", "expected a non-empty string, got an empty string"));
    CHECK(topFailure(R"({"format": "hmc-scenario/1", "name": null, "steps": []})") ==
          at("/name", "expected a string, got null"));
  }

  TEST_CASE("description must be a string") {
    CHECK(failureOf(scenarioWith(json::array(), {{"description", json::array({"x"})}})) ==
          at("/description", "expected a string, got an array"));
  }

  TEST_CASE("world_size is an integer in 1..4096, never a float or a boolean") {
    auto withWorld = [](const json& value) {
      return failureOf(scenarioWith(json::array(), {{"world_size", value}}));
    };
    CHECK(withWorld(0) == at("/world_size", "expected an integer in 1..4096, got 0"));
    CHECK(withWorld(4097) == at("/world_size", "expected an integer in 1..4096, got 4097"));
    CHECK(withWorld(-3) == at("/world_size", "expected an integer in 1..4096, got -3"));
    CHECK(withWorld(2.0) == at("/world_size", "expected an integer, got 2.0"));
    CHECK(withWorld(true) == at("/world_size", "expected an integer, got true"));
    CHECK(withWorld("2") == at("/world_size", R"(expected an integer, got a string "2")"));
    CHECK(withWorld(18446744073709551615ULL) ==
          at("/world_size", "expected an integer in 1..4096, got 18446744073709551615"));
    CHECK(parseScenario(scenarioWith(json::array(), {{"world_size", 4096}}), kFile).worldSize ==
          4096);
  }

  TEST_CASE("device and dtype are one of their names, with a likely typo suggested") {
    CHECK(failureOf(scenarioWith(json::array(), {{"device", "gpu0"}})) ==
          at("/device", R"(expected one of "auto", "cpu", "cuda", got a string "gpu0")"));
    CHECK(failureOf(scenarioWith(json::array(), {{"device", "cuda:0"}})) ==
          at("/device", R"(expected one of "auto", "cpu", "cuda", got a string "cuda:0"; )"
                        R"(did you mean "cuda"?)"));
    CHECK(failureOf(scenarioWith(json::array(), {{"dtype", "flaot32"}})) ==
          at("/dtype", R"(expected one of "float32", "float64", "float16", "bfloat16", )"
                       R"(got a string "flaot32"; did you mean "float32"?)"));
    CHECK(failureOf(scenarioWith(json::array(), {{"dtype", 32}})) ==
          at("/dtype", R"(expected one of "float32", "float64", "float16", "bfloat16", got 32)"));
  }

  TEST_CASE("timeout_s is a number greater than zero") {
    auto withTimeout = [](const json& value) {
      return failureOf(scenarioWith(json::array(), {{"timeout_s", value}}));
    };
    CHECK(withTimeout(0) ==
          at("/timeout_s", "expected a number of seconds > 0 and <= 1000000, got 0"));
    CHECK(withTimeout(-1.5) ==
          at("/timeout_s", "expected a number of seconds > 0 and <= 1000000, got -1.5"));
    CHECK(withTimeout(1e7) ==
          at("/timeout_s", "expected a number of seconds > 0 and <= 1000000, got 10000000.0"));
    CHECK(withTimeout("10") == at("/timeout_s", R"(expected a number, got a string "10")"));
    CHECK(parseScenario(scenarioWith(json::array(), {{"timeout_s", 2}}), kFile).timeoutS == 2);
  }

  TEST_CASE("the collective deadline is timeout_s rounded up to whole milliseconds") {
    auto timeoutOf = [](const json& seconds) {
      return parseScenario(scenarioWith(json::array(), {{"timeout_s", seconds}}), kFile)
          .timeout()
          .count();
    };
    CHECK(timeoutOf(2) == 2000);
    CHECK(timeoutOf(10.5) == 10500);
    CHECK(timeoutOf(0.0001) == 1);
    CHECK(timeoutOf(1.0001) == 1001);
    CHECK(timeoutOf(1000000) == 1000000000);
    Scenario unparsed;
    CHECK(unparsed.timeout() == std::chrono::seconds(30));
    unparsed.timeoutS = 0;
    CHECK_THROWS_AS(unparsed.timeout(), hmc::ValueError);
  }

  TEST_CASE("steps is a required array") {
    CHECK(topFailure(R"({"format": "hmc-scenario/1", "name": "t"})") ==
          at("", "missing required key 'steps'"));
    CHECK(topFailure(R"({"format": "hmc-scenario/1", "name": "t", "steps": {}})") ==
          at("/steps", "expected an array of steps, got an empty object"));
  }

  TEST_CASE("a string shown in a message is escaped and shortened") {
    CHECK(failureOf(scenarioWith(json::array(), {{"device", std::string(100, 'x')}})) ==
          at("/device", R"(expected one of "auto", "cpu", "cuda", got a string ")" +
                            std::string(60, 'x') + R"(...")"));
    CHECK(failureOf(scenarioWith(json::array(), {{"device", "a\"\n"}})) ==
          at("/device", R"(expected one of "auto", "cpu", "cuda", got a string "a\"\n")"));
  }

  // ---- ParseOptions::worldSize ---------------------------------------------------------

  TEST_CASE("the world size option replaces world_size before ranks are checked") {
    ParseOptions options;
    options.worldSize = 4;
    const Scenario scenario = parseScenario(
        scenarioWith(json::parse(R"([{"op": "barrier", "ranks": [3]}])"), {{"world_size", 2}}),
        kFile, options);
    CHECK(scenario.worldSize == 4);
    options.worldSize = 1;
    CHECK(
        stepsFailure(R"([{"op": "barrier", "ranks": [1]}])", options) ==
        at("/steps/0/ranks/0",
           "rank 1 is out of range for world_size 1 (the --world-size override); ranks are 0..0"));
  }

  TEST_CASE("the world size option must be in 1..4096 itself") {
    ParseOptions options;
    options.worldSize = 0;
    CHECK(failureOf(scenarioWith(json::array()), options) ==
          at("", "the world_size override (--world-size) must be in 1..4096, got 0"));
    options.worldSize = 4097;
    CHECK(failureOf(scenarioWith(json::array()), options) ==
          at("", "the world_size override (--world-size) must be in 1..4096, got 4097"));
  }

  // ---- fields every step may carry -----------------------------------------------------

  TEST_CASE("a step must be an object with a known op") {
    CHECK(stepsFailure(R"([1])") == at("/steps/0", "expected a step object, got 1"));
    CHECK(stepsFailure(R"([{"module": "a"}])") ==
          at("/steps/0",
             "missing required key 'op' (create, share, forward, backward, drop, close, "
             "close_all, check, fault, barrier, sleep, repeat)"));
    const std::string ops =
        R"(expected one of "create", "share", "forward", "backward", "drop", "close", )"
        R"("close_all", "check", "fault", "barrier", "sleep", "repeat", )";
    CHECK(stepsFailure(R"([{"op": "crate", "module": "a"}])") ==
          at("/steps/0/op", ops + R"(got a string "crate"; did you mean "create"?)"));
    CHECK(stepsFailure(R"([{"op": "launch"}])") ==
          at("/steps/0/op", ops + R"(got a string "launch")"));
    CHECK(stepsFailure(R"([{"op": null}])") == at("/steps/0/op", ops + "got null"));
  }

  TEST_CASE("ranks is an array of distinct ranks below world_size") {
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": 0}])") ==
          at("/steps/0/ranks", "expected an array of ranks, got 0"));
    // An empty list is valid: no rank runs the step (the reference runner skips it everywhere).
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": []}])") ==
          Failure{"", "", "parsed without an error"});
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [0, "1"]}])") ==
          at("/steps/0/ranks/1", R"(expected an integer, got a string "1")"));
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [false]}])") ==
          at("/steps/0/ranks/0", "expected an integer, got false"));
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [1.0]}])") ==
          at("/steps/0/ranks/0", "expected an integer, got 1.0"));
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [0, 2]}])") ==
          at("/steps/0/ranks/1", "rank 2 is out of range for world_size 2; ranks are 0..1"));
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [-1]}])") ==
          at("/steps/0/ranks/0", "rank -1 is out of range for world_size 2; ranks are 0..1"));
    CHECK(stepsFailure(R"([{"op": "barrier", "ranks": [1, 0, 1]}])") ==
          at("/steps/0/ranks/2", "rank 1 is listed more than once"));
  }

  TEST_CASE("expect is one of ok, error, hang, any and defaults to error with expect_error") {
    CHECK(stepsFailure(R"([{"op": "barrier", "expect": "fail"}])") ==
          at("/steps/0/expect",
             R"(expected one of "ok", "error", "hang", "any", got a string "fail")"));
    CHECK(stepsFailure(R"([{"op": "barrier", "expect_error": 3}])") ==
          at("/steps/0/expect_error", "expected a string, got 3"));
    const Scenario scenario = parseSteps(R"([
      {"op": "barrier", "expect_error": "boom"},
      {"op": "barrier", "expect_error": "boom", "expect": "any"},
      {"op": "barrier", "expect": "error"}
    ])");
    CHECK(name(scenario.steps[0].expect) == "error");
    CHECK(name(scenario.steps[1].expect) == "any");
    CHECK(name(scenario.steps[2].expect) == "error");
    CHECK_FALSE(scenario.steps[2].expectError.has_value());
  }

  TEST_CASE("expect_error together with expect ok or hang is a contradiction") {
    CHECK(stepsFailure(R"([{"op": "barrier", "expect": "ok", "expect_error": "x"}])") ==
          at("/steps/0/expect_error",
             R"(expect_error needs expect "error" or "any", but expect is "ok")"));
    CHECK(stepsFailure(R"([{"op": "barrier", "expect": "hang", "expect_error": "x"}])") ==
          at("/steps/0/expect_error",
             R"(expect_error needs expect "error" or "any", but expect is "hang")"));
  }

  TEST_CASE("repeat is an integer from 1 to a million and label is a string") {
    CHECK(stepsFailure(R"([{"op": "barrier", "repeat": 0}])") ==
          at("/steps/0/repeat", "expected an integer in 1..1000000, got 0"));
    CHECK(stepsFailure(R"([{"op": "barrier", "repeat": 1000001}])") ==
          at("/steps/0/repeat", "expected an integer in 1..1000000, got 1000001"));
    CHECK(stepsFailure(R"([{"op": "barrier", "repeat": 2.5}])") ==
          at("/steps/0/repeat", "expected an integer, got 2.5"));
    CHECK(stepsFailure(R"([{"op": "barrier", "label": ["x"]}])") ==
          at("/steps/0/label", "expected a string, got an array"));
  }

  // ---- keys per op ---------------------------------------------------------------------

  TEST_CASE("a key of another op is an unknown key for this op that names its owner") {
    CHECK(
        stepsFailure(R"([)" + kCreateA + R"(, {"op": "forward", "module": "a", "features": 8}])") ==
        at("/steps/1/features",
           "unknown key 'features' for op 'forward'; expected one of op, ranks, expect, "
           "expect_error, repeat, label, module, batch, dtype, device, backward; 'features' "
           "belongs to op create"));
    CHECK(stepsFailure(R"([{"op": "close_all", "module": "a"}])") ==
          at("/steps/0/module",
             "unknown key 'module' for op 'close_all'; expected one of op, ranks, expect, "
             "expect_error, repeat, label; 'module' belongs to ops create, forward, backward, "
             "drop, close and fault kind busy"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "stall", "planned": false}])") ==
          at("/steps/0/planned",
             "unknown key 'planned' for fault kind 'stall'; expected one of op, ranks, expect, "
             "expect_error, repeat, label, kind, seconds; 'planned' belongs to fault kind crash"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "crash", "planned": 1}])") ==
          at("/steps/0/planned", "expected true or false, got 1"));
    CHECK(stepsFailure(R"([{"op": "barrier", "kind": "crash"}])") ==
          at("/steps/0/kind",
             "unknown key 'kind' for op 'barrier'; expected one of op, ranks, expect, "
             "expect_error, repeat, label; 'kind' belongs to op fault"));
    CHECK(stepsFailure(R"([{"op": "sleep", "count": 2}])") ==
          at("/steps/0/count",
             "unknown key 'count' for op 'sleep'; expected one of op, ranks, expect, "
             "expect_error, repeat, label, seconds; 'count' belongs to op repeat and fault "
             "kinds close_error, release_error"));
  }

  TEST_CASE("a misspelt step key is unknown and the likely key is suggested") {
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "forward", "module": "a", "bach": 8}])") ==
          at("/steps/1/bach",
             "unknown key 'bach' for op 'forward'; expected one of op, ranks, expect, "
             "expect_error, repeat, label, module, batch, dtype, device, backward; "
             "did you mean 'batch'?"));
    CHECK(stepsFailure(R"([{"op": "barrier", "rank": [0]}])") ==
          at("/steps/0/rank",
             "unknown key 'rank' for op 'barrier'; expected one of op, ranks, expect, "
             "expect_error, repeat, label; did you mean 'ranks'?"));
  }

  // ---- create --------------------------------------------------------------------------

  TEST_CASE("create needs a non-empty module name and a known type") {
    CHECK(stepsFailure(R"([{"op": "create"}])") == at("/steps/0", "missing required key 'module'"));
    CHECK(stepsFailure(R"([{"op": "create", "module": ""}])") ==
          at("/steps/0/module", "expected a non-empty string, got an empty string"));
    CHECK(stepsFailure(R"([{"op": "create", "module": 1}])") ==
          at("/steps/0/module", "expected a string, got 1"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "type": "linear"}])") ==
          at("/steps/0/type",
             R"(expected one of "scratch_linear", "scratch_mlp", got a string "linear")"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "scope": 1}])") ==
          at("/steps/0/scope", "expected a string, got 1"));
  }

  TEST_CASE("create features is a positive integer, never a float") {
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "features": 0}])") ==
          at("/steps/0/features", "expected an integer in 1..1048576, got 0"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "features": 3.0}])") ==
          at("/steps/0/features", "expected an integer, got 3.0"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "features": true}])") ==
          at("/steps/0/features", "expected an integer, got true"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "features": 2000000}])") ==
          at("/steps/0/features", "expected an integer in 1..1048576, got 2000000"));
  }

  TEST_CASE("create workspace_bytes is an integer from 0 to 64 GiB, default included") {
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "workspace_bytes": -1}])") ==
          at("/steps/0/workspace_bytes", "expected an integer >= 0, got -1"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "workspace_bytes": "1"}])") ==
          at("/steps/0/workspace_bytes", R"(expected an integer, got a string "1")"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "workspace_bytes": 68719476737}])") ==
          at("/steps/0/workspace_bytes",
             "workspace_bytes 68719476737 is over the limit of 64 GiB (68719476736 bytes)"));
    CHECK(stepsFailure(
              R"([{"op": "create", "module": "a", "workspace_bytes": 18446744073709551615}])") ==
          at("/steps/0/workspace_bytes",
             "workspace_bytes 18446744073709551615 is over the "
             "limit of 64 GiB (68719476736 bytes)"));
    CHECK(stepsFailure(R"([{"op": "create", "module": "a", "features": 200000}])") ==
          at("/steps/0/features",
             "features 200000 gives a default workspace_bytes of 160000000000 (features * "
             "features * 4), over the limit of 64 GiB (68719476736 bytes); set "
             "workspace_bytes"));
    const Scenario scenario = parseSteps(
        R"([{"op": "create", "module": "a", "features": 200000, "workspace_bytes": 68719476736}])");
    CHECK(scenario.steps[0].workspaceBytes == 68719476736LL);
  }

  TEST_CASE("create compat may be any JSON but not nested without bound") {
    json compat = 1;
    for (int i = 0; i < 65; ++i) compat = json::array({compat});
    json steps = json::array({{{"op", "create"}, {"module", "a"}, {"compat", compat}}});
    CHECK(failureOf(scenarioWith(steps)) ==
          at("/steps/0/compat", "compat nests deeper than 64 levels"));
    const Scenario scenario =
        parseSteps(R"([{"op": "create", "module": "a", "compat": "anything"}])");
    CHECK(scenario.steps[0].compat == json("anything"));
  }

  // ---- module references ---------------------------------------------------------------

  TEST_CASE("a module must be created by an earlier step before a step names it") {
    CHECK(stepsFailure(R"([{"op": "forward", "module": "a"}, {"op": "create", "module": "a"}])") ==
          at("/steps/0/module", "module 'a' is never created before this step"));
    for (const char* op : {"backward", "drop", "close"}) {
      CAPTURE(op);
      CHECK(stepsFailure(std::string(R"([{"op": ")") + op + R"(", "module": "b"}])") ==
            at("/steps/0/module", "module 'b' is never created before this step"));
    }
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "share", "modules": ["a", "b"]}])") ==
          at("/steps/1/modules/1", "module 'b' is never created before this step"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "busy", "module": "z"}])") ==
          at("/steps/0/module", "module 'z' is never created before this step"));
  }

  TEST_CASE("a module created inside a repeat counts for the steps after it") {
    const Scenario scenario = parseSteps(R"([
      {"op": "repeat", "count": 2, "steps": [{"op": "create", "module": "a"},
                                             {"op": "forward", "module": "a"},
                                             {"op": "drop", "module": "a"}]},
      {"op": "create", "module": "b"},
      {"op": "close", "module": "a"}
    ])");
    CHECK(scenario.steps[2].module == "a");
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 2, "steps": [
      {"op": "forward", "module": "a"}, {"op": "create", "module": "a"}]}])") ==
          at("/steps/0/steps/0/module", "module 'a' is never created before this step"));
  }

  // ---- share, forward, backward, drop, close -------------------------------------------

  TEST_CASE("share needs an array of module names") {
    CHECK(stepsFailure(R"([{"op": "share"}])") == at("/steps/0", "missing required key 'modules'"));
    CHECK(stepsFailure(R"([{"op": "share", "modules": "a"}])") ==
          at("/steps/0/modules", R"(expected an array of module names, got a string "a")"));
    // An empty list parses: sharing it raises the reference's ValueError when it runs.
    CHECK(stepsFailure(R"([{"op": "share", "modules": []}])") ==
          Failure{"", "", "parsed without an error"});
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "share", "modules": ["a", 2]}])") ==
          at("/steps/1/modules/1", "expected a string, got 2"));
  }

  TEST_CASE("forward checks batch, dtype, device and backward") {
    auto forward = [](const std::string& fields) {
      return stepsFailure("[" + kCreateA + R"(, {"op": "forward", "module": "a", )" + fields +
                          "}]");
    };
    CHECK(stepsFailure(R"([{"op": "forward"}])") ==
          at("/steps/0", "missing required key 'module'"));
    CHECK(forward(R"("batch": -1)") ==
          at("/steps/1/batch", "expected an integer in 0..16777216, got -1"));
    CHECK(forward(R"("batch": 0)") == Failure{"", "", "parsed without an error"});
    CHECK(forward(R"("batch": 8.5)") == at("/steps/1/batch", "expected an integer, got 8.5"));
    CHECK(forward(R"("dtype": "int64")") ==
          at("/steps/1/dtype", R"(expected one of "float32", "float64", "float16", )"
                               R"("bfloat16", got a string "int64")"));
    CHECK(
        forward(R"("device": "cdua")") ==
        at("/steps/1/device",
           R"(expected one of "auto", "cpu", "cuda", got a string "cdua"; did you mean "cuda"?)"));
    CHECK(forward(R"("backward": "yes")") ==
          at("/steps/1/backward", R"(expected true or false, got a string "yes")"));
  }

  TEST_CASE("backward, drop and close need a module, and drop collect is a boolean") {
    CHECK(stepsFailure(R"([{"op": "backward"}])") ==
          at("/steps/0", "missing required key 'module'"));
    CHECK(stepsFailure(R"([{"op": "close", "module": null}])") ==
          at("/steps/0/module", "expected a string, got null"));
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "drop", "module": "a", "collect": 1}])") ==
          at("/steps/1/collect", "expected true or false, got 1"));
  }

  // ---- check, fault, sleep -------------------------------------------------------------

  TEST_CASE("check fields each have their type") {
    // A check naming nothing checks nothing, as in the reference runner.
    CHECK(stepsFailure(R"([{"op": "check"}])") == Failure{"", "", "parsed without an error"});
    CHECK(stepsFailure(R"([{"op": "check", "groups": -1}])") ==
          at("/steps/0/groups", "expected an integer >= 0, got -1"));
    CHECK(stepsFailure(R"([{"op": "check", "bound_groups": 1.5}])") ==
          at("/steps/0/bound_groups", "expected an integer, got 1.5"));
    CHECK(stepsFailure(R"([{"op": "check", "runtime_live": 1}])") ==
          at("/steps/0/runtime_live", "expected true or false, got 1"));
    CHECK(parseSteps(R"([{"op": "check", "groups": 0}])").steps[0].groups == 0);
  }

  TEST_CASE("fault needs a known kind and takes only that kind's fields") {
    CHECK(stepsFailure(R"([{"op": "fault"}])") ==
          at("/steps/0",
             "missing required key 'kind' (close_error, release_error, busy, stall, crash, "
             "leak)"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "close_eror"}])") ==
          at("/steps/0/kind", R"(expected one of "close_error", "release_error", "busy", )"
                              R"("stall", "crash", "leak", got a string "close_eror"; )"
                              R"(did you mean "close_error"?)"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "crash", "seconds": 1}])") ==
          at("/steps/0/seconds",
             "unknown key 'seconds' for fault kind 'crash'; expected one of op, ranks, expect, "
             "expect_error, repeat, label, kind, planned; 'seconds' belongs to op sleep and fault kind "
             "stall"));
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "fault", "kind": "busy", "module": "a",
                          "count": 2}])") ==
          at("/steps/1/count",
             "unknown key 'count' for fault kind 'busy'; expected one of op, ranks, expect, "
             "expect_error, repeat, label, kind, module, busy; 'count' belongs to op repeat "
             "and fault kinds close_error, release_error"));
  }

  TEST_CASE("a leak fault: memory by default, bytes only for memory; the leak_trend key") {
    using hmc::scenario::LeakResource;
    using hmc::scenario::LeakTrendExpect;
    const auto memory = parseSteps(R"([{"op": "fault", "kind": "leak"}])").steps[0];
    CHECK((memory.leakResource == LeakResource::kMemory));
    CHECK(memory.leakBytes == 1 << 20);
    const auto small =
        parseSteps(R"([{"op": "fault", "kind": "leak", "resource": "memory", "bytes": 4096}])");
    CHECK(small.steps[0].leakBytes == 4096);
    const auto mapped =
        parseSteps(R"([{"op": "fault", "kind": "leak", "resource": "mapped", "bytes": 8192}])");
    CHECK((mapped.steps[0].leakResource == LeakResource::kMapped));
    CHECK(mapped.steps[0].leakBytes == 8192);
    CHECK((parseSteps(R"([{"op": "fault", "kind": "leak", "resource": "thread"}])")
               .steps[0]
               .leakResource == LeakResource::kThread));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "leak", "resource": "descriptor",
                          "bytes": 8}])") ==
          at("/steps/0/bytes", "bytes is for a leak of memory, not of a descriptor"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "leak", "bytes": 0}])") ==
          at("/steps/0/bytes", "expected an integer in 1..1073741824, got 0"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "leak", "resource": "socket"}])") ==
          at("/steps/0/resource", R"(expected one of "memory", "mapped", "descriptor", "thread", )"
                                  R"(got a )"
                                  R"(string "socket")"));
    CHECK((parseScenario(scenarioWith(json::array(), {{"leak_trend", "any"}}), kFile).leakTrend ==
           LeakTrendExpect::kAny));
    CHECK((parseScenario(scenarioWith(json::array()), kFile).leakTrend == LeakTrendExpect::kNone));
    CHECK(failureOf(scenarioWith(json::array(), {{"leak_trend", "some"}})) ==
          at("/leak_trend", R"(expected one of "none", "leak", "any", got a string "some")"));
  }

  TEST_CASE("fault fields are checked per kind") {
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "close_error", "count": 0}])") ==
          at("/steps/0/count", "expected an integer in 1..1000000, got 0"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "release_error", "count": "2"}])") ==
          at("/steps/0/count", R"(expected an integer, got a string "2")"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "busy"}])") ==
          at("/steps/0", "missing required key 'module'"));
    CHECK(stepsFailure(R"([)" + kCreateA + R"(, {"op": "fault", "kind": "busy", "module": "a",
                          "busy": "no"}])") ==
          at("/steps/1/busy", R"(expected true or false, got a string "no")"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "stall", "seconds": -1}])") ==
          at("/steps/0/seconds", "expected a number of seconds >= 0 and <= 3600, got -1"));
  }

  TEST_CASE("sleep seconds is a number of at least zero") {
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": -0.5}])") ==
          at("/steps/0/seconds", "expected a number of seconds >= 0 and <= 3600, got -0.5"));
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": null}])") ==
          at("/steps/0/seconds", "expected a number, got null"));
    CHECK(parseSteps(R"([{"op": "sleep", "seconds": 0}])").steps[0].seconds == 0);
  }

  // ---- repeat --------------------------------------------------------------------------

  TEST_CASE("repeat needs a count and an array of steps") {
    CHECK(stepsFailure(R"([{"op": "repeat", "steps": [{"op": "barrier"}]}])") ==
          at("/steps/0", "missing required key 'count'"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": -1, "steps": [{"op": "barrier"}]}])") ==
          at("/steps/0/count", "expected an integer in 0..1000000, got -1"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 0, "steps": [{"op": "barrier"}]}])") ==
          Failure{"", "", "parsed without an error"});
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1}])") ==
          at("/steps/0", "missing required key 'steps'"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1, "steps": []}])") ==
          Failure{"", "", "parsed without an error"});
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1, "steps": {"op": "barrier"}}])") ==
          at("/steps/0/steps", "expected an array of steps, got an object"));
  }

  TEST_CASE("errors in nested steps point into the nested steps") {
    CHECK(
        stepsFailure(R"([{"op": "barrier"}, {"op": "barrier"}, {"op": "repeat", "count": 2,
                          "steps": [{"op": "barrier", "ranks": [5]}]}])") ==
        at("/steps/2/steps/0/ranks/0", "rank 5 is out of range for world_size 2; ranks are 0..1"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 2, "steps": [{"op": "create",
                          "module": "a", "features": 3.0}]}])") ==
          at("/steps/0/steps/0/features", "expected an integer, got 3.0"));
  }

  TEST_CASE("repeat nests at most kMaxRepeatDepth levels") {
    auto nested = [](int levels) {
      json step = {{"op", "barrier"}};
      for (int i = 0; i < levels; ++i) {
        step = {{"op", "repeat"}, {"count", 1}, {"steps", json::array({step})}};
      }
      return scenarioWith(json::array({step}));
    };
    const Scenario scenario = parseScenario(nested(hmc::scenario::kMaxRepeatDepth), kFile);
    CHECK(scenario.steps[0].steps[0].steps[0].path == "/steps/0/steps/0/steps/0");
    std::string path = "/steps/0";
    for (int i = 0; i < hmc::scenario::kMaxRepeatDepth; ++i) path += "/steps/0";
    CHECK(failureOf(nested(hmc::scenario::kMaxRepeatDepth + 1)) ==
          at(path, "repeat steps nest deeper than 8 levels"));
  }

  // ---- limits (docs/scenario-extensions.md, "Limits") -------------------------------

  TEST_CASE("sleep and stall take at most an hour each") {
    CHECK(parseSteps(R"([{"op": "sleep", "seconds": 3600}])").steps[0].seconds == 3600);
    CHECK(parseSteps(R"([{"op": "fault", "kind": "stall", "seconds": 3600}])").steps[0].seconds ==
          3600);
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": 3600.5}])") ==
          at("/steps/0/seconds", "expected a number of seconds >= 0 and <= 3600, got 3600.5"));
    CHECK(stepsFailure(R"([{"op": "fault", "kind": "stall", "seconds": 1e6}])") ==
          at("/steps/0/seconds", "expected a number of seconds >= 0 and <= 3600, got 1000000.0"));
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": 1e300}])") ==
          at("/steps/0/seconds", "expected a number of seconds >= 0 and <= 3600, got 1e+300"));
  }

  TEST_CASE("a repeat count of a billion is refused, naming the limit and what to do") {
    CHECK(stepsFailure(R"([{"op": "barrier", "repeat": 1000000000}])") ==
          at("/steps/0/repeat", "expected an integer in 1..1000000, got 1000000000"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1000000000, "steps": []}])") ==
          at("/steps/0/count", "expected an integer in 0..1000000, got 1000000000"));
  }

  TEST_CASE("nested repeats that multiply past the step limit are refused with the total") {
    // 1e6 x 1e6 x ... would be 1e18 steps: the first repeat over the limit is named.
    json step = {{"op", "barrier"}};
    for (int i = 0; i < 3; ++i) {
      step = {{"op", "repeat"}, {"count", 1000000}, {"steps", json::array({step})}};
    }
    CHECK(failureOf(scenarioWith(json::array({{{"op", "barrier"}}, step}))) ==
          at("/steps/1/steps/0",
             "this repeat (count 1000000 x 1000000 nested steps) runs 1000000000000 steps on each "
             "rank, over the limit of 10000000 steps per rank (nested repeats multiply); lower "
             "'count' or 'repeat', or split the work into several scenarios"));
    // The step's own `repeat` multiplies too.
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1000, "repeat": 100001,
                            "steps": [{"op": "barrier"}]}])") ==
          at("/steps/0",
             "this repeat (count 1000 x 1 nested steps, repeated 100001 times) runs 100001000 "
             "steps on each rank, over the limit of 10000000 steps per rank (nested repeats "
             "multiply); lower 'count' or 'repeat', or split the work into several scenarios"));
    // Exactly at the limit is valid: 10 x 1e6 barriers.
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 10,
                            "steps": [{"op": "barrier", "repeat": 1000000}]}])") ==
          Failure{"", "", "parsed without an error"});
  }

  TEST_CASE("steps that add up past the step limit are refused at the step that crosses it") {
    json steps = json::array();
    for (int i = 0; i < 11; ++i) steps.push_back({{"op", "barrier"}, {"repeat", 1000000}});
    CHECK(failureOf(scenarioWith(steps)) ==
          at("/steps/10",
             "the steps up to this one run 11000000 steps on each rank, over the limit of "
             "10000000 steps per rank (nested repeats multiply); lower 'count' or 'repeat', or "
             "split the work into several scenarios"));
    // Nested arrays add up the same way (and empty repeats count one step each).
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1, "steps": [
                            {"op": "repeat", "count": 1000000, "steps": []},
                            {"op": "barrier", "repeat": 1000000}]},
                           {"op": "repeat", "count": 9, "steps": [
                            {"op": "barrier", "repeat": 1000000}]}])") ==
          at("/steps/1",
             "the steps up to this one run 11000000 steps on each rank, over the limit of "
             "10000000 steps per rank (nested repeats multiply); lower 'count' or 'repeat', or "
             "split the work into several scenarios"));
  }

  TEST_CASE("sleep and stall seconds of a rank add up to at most a day") {
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": 3600, "repeat": 25}])") ==
          at("/steps/0",
             "this step (3600 s, repeated 25 times) runs 90000 seconds of sleep and stall on each "
             "rank, over the limit of 86400 s (one day) per rank; lower 'seconds', 'count' or "
             "'repeat'"));
    CHECK(stepsFailure(R"([{"op": "repeat", "count": 1000000, "steps": [
                            {"op": "fault", "kind": "stall", "seconds": 0.1}]}])") ==
          at("/steps/0",
             "this repeat (count 1000000 x 1 nested steps) runs 100000 seconds of sleep and "
             "stall on each rank, over the limit of 86400 s (one day) per rank; lower "
             "'seconds', 'count' or 'repeat'"));
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": 3600, "repeat": 24},
                           {"op": "barrier"}, {"op": "sleep", "seconds": 0.5}])") ==
          at("/steps/2",
             "the steps up to this one run 86400.5 seconds of sleep and stall on each rank, over "
             "the limit of 86400 s (one day) per rank; lower 'seconds', 'count' or 'repeat'"));
    CHECK(stepsFailure(R"([{"op": "sleep", "seconds": 3600, "repeat": 24}])") ==
          Failure{"", "", "parsed without an error"});
  }

  TEST_CASE("every scenario of the library and of the e2e tests is within the limits") {
    namespace fs = std::filesystem;
    const fs::path root = HMC_SOURCE_DIR;
    int files = 0;
    for (const fs::path& dir : {root / "scenarios", root / "scenarios" / "gpu",
                               root / "tests" / "e2e" / "data" / "fail",
                               root / "tests" / "e2e" / "data" / "hang"}) {
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() != ".json") continue;
        ++files;
        CAPTURE(entry.path().string());
        CHECK_NOTHROW(loadScenario(entry.path().string()));
      }
    }
    CHECK(files >= 20);
  }

  TEST_CASE("user text in messages is escaped: no control character reaches the console") {
    // Keys, values and module names quote through JSON escapes plus hmc::printable (DEL,
    // C1, bidi); the file name and the JSON path are escaped in what().
    auto noControl = [](const std::string& text) {
      for (char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20 || byte == 0x7F) return false;
      }
      return text.find("\xC2\x85") == std::string::npos &&
             text.find("\xE2\x80\xAE") == std::string::npos;
    };
    const json key = scenarioWith(json::array(), {{"x\n# OK\x1b[2J", 1}});
    try {
      parseScenario(key, "bad\n# OK: 1 scenario passed\x1b]0;t\x07.json");
      FAIL("parsed without an error");
    } catch (const ScenarioError& error) {
      CHECK(error.jsonPath() == "/x\n# OK\x1b[2J");  // the accessors keep the raw text
      CHECK(std::string(error.what()).rfind(
                "bad\\n# OK: 1 scenario passed\\x1b]0;t\\x07.json: /x\\n# OK\\x1b[2J: "
                "unknown key 'x\\n# OK\\u001b[2J'",
                0) == 0);
      CHECK(noControl(error.what()));
    }
    const Failure value = stepsFailure(R"([{"op": "\u007f\u0085\u202e"}])");
    CHECK(value.detail.find(R"(got a string "\x7f\u0085\u202e")") != std::string::npos);
    CHECK(noControl(value.detail));
    const Failure module = stepsFailure(R"([{"op": "close", "module": "a\u0000\u009b31m"}])");
    CHECK(module == at("/steps/0/module",
                       R"(module 'a\u0000\u009b31m' is never created before this step)"));
  }

  TEST_CASE("parseScenarioText parses bytes as loadScenario parses a file") {
    const Scenario scenario = hmc::scenario::parseScenarioText(
        R"({"format": "hmc-scenario/1", "name": "t", "steps": [{"op": "barrier"}]})", "mem.json");
    CHECK(scenario.file == "mem.json");
    CHECK(scenario.steps.size() == 1);
    auto failure = [](std::string_view text) -> Failure {
      try {
        hmc::scenario::parseScenarioText(text, kFile);
      } catch (const ScenarioError& error) {
        return {error.file(), error.jsonPath(), error.detail()};
      }
      return {"", "", "parsed without an error"};
    };
    CHECK(failure(std::string_view("{\"a\0", 4)) == at("", "not a text file (a NUL byte at offset 3)"));
    CHECK(failure("  \n") ==
          at("", "file is empty; expected a JSON object in the hmc-scenario/1 format"));
    CHECK(failure(std::string((std::size_t{16} << 20) + 1, ' ')) ==
          at("", "file is 16777217 bytes, over the limit of 16 MiB (16777216 bytes) for scenario "
                 "files"));
  }

  // ---- files ---------------------------------------------------------------------------

  TEST_CASE("loadScenario reads a valid file and records where it came from") {
    TempDir dir;
    const std::string path =
        dir.write("ok.json",
                  "\xEF\xBB\xBF{\"format\": \"hmc-scenario/1\", \"name\": \"caf\xC3\xA9\",\n"
                  " \"steps\": [{\"op\": \"barrier\"}]}\n");
    const Scenario scenario = loadScenario(path);
    CHECK(scenario.file == path);
    CHECK(scenario.name == "caf\xC3\xA9");
    REQUIRE(scenario.steps.size() == 1);
    CHECK(name(scenario.steps[0].op) == "barrier");
  }

  TEST_CASE("loadScenario reports a missing or unreadable file with the OS reason") {
    TempDir dir;
    const std::string missing = dir.path("missing.json");
    CHECK(loadFailure(missing) == Failure{missing, "", "cannot read: No such file or directory"});
    CHECK(loadFailure(dir.path("")) == Failure{dir.path(""), "", "cannot read: Is a directory"});
    if (::geteuid() != 0) {
      const std::string locked = dir.write("locked.json", "{}");
      ::chmod(locked.c_str(), 0);
      CHECK(loadFailure(locked) == Failure{locked, "", "cannot read: Permission denied"});
    }
  }

  TEST_CASE("loadScenario rejects an empty file") {
    TempDir dir;
    const std::string empty = dir.write("empty.json", "");
    const std::string blank = dir.write("blank.json", " \n\t\r\n");
    const std::string detail = "file is empty; expected a JSON object in the hmc-scenario/1 format";
    CHECK(loadFailure(empty) == Failure{empty, "", detail});
    CHECK(loadFailure(blank) == Failure{blank, "", detail});
  }

  TEST_CASE("loadScenario reports invalid JSON with line, column and offset") {
    TempDir dir;
    const std::string bad = dir.write("bad.json", "{\n  \"format\": \"hmc-scenario/1\",\n  }\n");
    CHECK(loadFailure(bad) ==
          Failure{bad, "",
                  "invalid JSON at line 3, column 3 (offset 34): syntax error while parsing "
                  "object key - unexpected '}'; expected string literal"});
    const std::string truncated =
        dir.write("truncated.json", R"({"format": "hmc-scenario/1", "name": )");
    CHECK(loadFailure(truncated) ==
          Failure{truncated, "",
                  "invalid JSON at line 1, column 38 (offset 37): syntax error while parsing "
                  "value - unexpected end of input; expected '[', '{', or a literal"});
    const std::string trailing = dir.write("trailing.json", "{} {}");
    CHECK(loadFailure(trailing) ==
          Failure{trailing, "",
                  "invalid JSON at line 1, column 4 (offset 3): syntax error while parsing "
                  "value - unexpected '{'; expected end of input"});
  }

  TEST_CASE("loadScenario rejects binary content as not a text file") {
    TempDir dir;
    const std::string nul = dir.write("nul.json", std::string("{\"a\": 1}\0\0", 10));
    CHECK(loadFailure(nul) == Failure{nul, "", "not a text file (a NUL byte at offset 8)"});
    const std::string latin1 = dir.write("latin1.json", "{\"name\": \"caf\xE9\"}");
    CHECK(loadFailure(latin1) ==
          Failure{latin1, "", "not a text file (invalid UTF-8 at offset 13)"});
    const std::string surrogate = dir.write("surrogate.json", "\"\xED\xA0\x80\"");
    CHECK(loadFailure(surrogate) ==
          Failure{surrogate, "", "not a text file (invalid UTF-8 at offset 1)"});
    const std::string cut = dir.write("cut.json", "\"\xE2\x82");
    CHECK(loadFailure(cut) == Failure{cut, "", "not a text file (invalid UTF-8 at offset 1)"});
  }

  TEST_CASE("loadScenario rejects a top level that is not an object") {
    TempDir dir;
    const std::string array = dir.write("array.json", "[{\"op\": \"barrier\"}]");
    CHECK(loadFailure(array) ==
          Failure{array, "", "expected a JSON object at the top level, got an array"});
  }

  TEST_CASE("loadScenario rejects files over 16 MiB before reading them") {
    TempDir dir;
    const std::string big = dir.write("big.json", "{}");
    std::filesystem::resize_file(big, (std::uintmax_t{16} << 20) + 1);
    CHECK(loadFailure(big) ==
          Failure{big, "",
                  "file is 16777217 bytes, over the limit of 16 MiB (16777216 bytes) for "
                  "scenario files"});
  }

  TEST_CASE("loadScenario stops at 16 MiB on a device that never ends") {
    CHECK(loadFailure("/dev/zero") ==
          Failure{"/dev/zero", "",
                  "file is over the limit of 16 MiB (16777216 bytes) for scenario files"});
  }

  TEST_CASE("loadScenario does not wait on a FIFO without a writer") {
    TempDir dir;
    const std::string fifo = dir.path("fifo.json");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(loadFailure(fifo) ==
          Failure{fifo, "", "file is empty; expected a JSON object in the hmc-scenario/1 format"});
  }

  TEST_CASE("loadScenario survives deeply nested JSON") {
    TempDir dir;
    const std::string deep = dir.write("deep.json", std::string(1'000'000, '['));
    CHECK(loadFailure(deep) ==
          Failure{deep, "",
                  "invalid JSON at line 1, column 1000001 (offset 1000000): syntax error while "
                  "parsing value - unexpected end of input; expected '[', '{', or a literal"});
    const std::string deepCompat = dir.write(
        "compat.json", R"({"format": "hmc-scenario/1", "name": "t", "steps": [{"op": "create",
          "module": "a", "compat": )" +
                           std::string(100'000, '[') + std::string(100'000, ']') + "}]}");
    CHECK(loadFailure(deepCompat) ==
          Failure{deepCompat, "/steps/0/compat", "compat nests deeper than 64 levels"});
  }

  TEST_CASE("loadScenario validates the content and passes the world size option on") {
    TempDir dir;
    const std::string path = dir.write("ranks.json",
                                       R"({"format": "hmc-scenario/1", "name": "t", "world_size": 4,
            "steps": [{"op": "barrier", "ranks": [3]}]})");
    ParseOptions options;
    options.worldSize = 2;
    CHECK(loadFailure(path, options) ==
          Failure{path, "/steps/0/ranks/0",
                  "rank 3 is out of range for world_size 2 (the --world-size override); ranks "
                  "are 0..1"});
    CHECK(loadScenario(path).worldSize == 4);
  }
}
