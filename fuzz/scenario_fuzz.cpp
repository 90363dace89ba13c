// libFuzzer target: any bytes through the scenario parser and validator, as hmc-run reads a
// file (parseScenarioText). A ScenarioError is the expected answer to bad input; anything
// else (another exception, a crash, a sanitizer report, a hang, a leak) is a finding.
// The second half checks what a valid scenario promises: the limits hold and every step
// records its JSON path. Run with scripts/fuzz.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/text.hpp"

namespace {

namespace sc = hmc::scenario;

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "scenario_fuzz: %s: %s\n", what, hmc::printable(detail).c_str());
  std::abort();
}

// Steps executed by one rank as the limits count them (docs/scenario-extensions.md).
std::uint64_t stepsOf(const std::vector<sc::Step>& steps, double& seconds, int depth) {
  if (depth > sc::kMaxRepeatDepth) broken("repeat nesting over the limit", steps.front().path);
  std::uint64_t total = 0;
  for (const sc::Step& step : steps) {
    if (step.path.empty() || step.path.front() != '/') broken("a step without a path", "");
    if (step.repeat < 1 || step.repeat > sc::kMaxRepeat) broken("repeat out of range", step.path);
    std::uint64_t own = 1;
    double ownSeconds = 0;
    if (step.op == sc::Op::kRepeat) {
      if (step.count < 0 || step.count > sc::kMaxRepeat) broken("count out of range", step.path);
      double nestedSeconds = 0;
      const std::uint64_t nested = stepsOf(step.steps, nestedSeconds, depth + 1);
      const std::uint64_t perIteration = nested > 0 ? nested : 1;
      own = static_cast<std::uint64_t>(step.count) * perIteration;
      if (own == 0) own = 1;
      ownSeconds = step.count * nestedSeconds;
    } else if (step.op == sc::Op::kSleep ||
               (step.op == sc::Op::kFault && step.faultKind == sc::FaultKind::kStall)) {
      if (!(step.seconds >= 0 && step.seconds <= sc::kMaxStepSeconds)) {
        broken("seconds out of range", step.path);
      }
      ownSeconds = step.seconds;
    }
    total += own * static_cast<std::uint64_t>(step.repeat);
    seconds += ownSeconds * step.repeat;
    if (total > static_cast<std::uint64_t>(sc::kMaxStepsPerRank)) {
      broken("a valid scenario over the step limit", step.path);
    }
  }
  return total;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sc::Scenario scenario;
  try {
    scenario = sc::parseScenarioText(text, "fuzz.json");
  } catch (const hmc::ScenarioError& error) {
    // The message must name the file and be printable as it is.
    const std::string message = error.what();
    if (message.rfind("fuzz.json: ", 0) != 0) broken("a message without the file", message);
    if (hmc::printable(message) != message) broken("a message with control characters", message);
    return 0;
  }
  if (scenario.worldSize < 1 || scenario.worldSize > sc::kMaxWorldSize) {
    broken("world_size out of range", std::to_string(scenario.worldSize));
  }
  double seconds = 0;
  stepsOf(scenario.steps, seconds, 0);
  if (seconds > sc::kMaxSleepSecondsPerRank) broken("a valid scenario over a day of sleep", "");
  return 0;
}
