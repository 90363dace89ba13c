// hmc-run's preflight (hmc/world/preflight.hpp): what a run needs against fixed limits. The limits
// of the machine the test runs on do not enter: every case passes its own HostLimits.

#include "hmc/world/preflight.hpp"

#include <doctest/doctest.h>

#include <string>

using hmc::world::checkRun;
using hmc::world::estimateNeeds;
using hmc::world::HostLimits;
using hmc::world::RunShape;

namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

RunShape processes(int world, std::uint64_t steps = 8) {
  RunShape shape;
  shape.processes = true;
  shape.worldSize = world;
  shape.recordedSteps = steps;
  return shape;
}

RunShape threads(int world, std::uint64_t steps = 8) {
  RunShape shape = processes(world, steps);
  shape.processes = false;
  return shape;
}

HostLimits roomy() {
  HostLimits limits;
  limits.openFilesSoft = 1024;
  limits.openFilesHard = 1u << 20;
  limits.memoryAvailable = 16 * kGiB;
  return limits;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("needs grow with ranks and steps") {
  const auto two = estimateNeeds(processes(2));
  const auto four = estimateNeeds(processes(4));
  CHECK(four.storeHostFiles - two.storeHostFiles == 2 * 14);
  CHECK(four.memory > two.memory);
  CHECK(estimateNeeds(threads(4)).storeHostFiles == 0);  // thread ranks use no store
  CHECK(estimateNeeds(threads(4, 1000)).memory > estimateNeeds(threads(4, 10)).memory);
  RunShape repeated = threads(4, 1000);
  repeated.repetitions = 3;
  CHECK(estimateNeeds(repeated).memory > estimateNeeds(threads(4, 1000)).memory);
}

TEST_CASE("a run that fits starts") {
  const auto result = checkRun(processes(4), estimateNeeds(processes(4)), roomy());
  CHECK(result.refusal.empty());
  CHECK_FALSE(result.raiseOpenFilesTo);
}

TEST_CASE("too little memory for the rank processes is refused naming MemAvailable") {
  HostLimits limits = roomy();
  limits.memoryAvailable = 2 * kGiB;
  const auto result = checkRun(processes(64), estimateNeeds(processes(64)), limits);
  CHECK(contains(result.refusal, "MemAvailable"));
  CHECK(contains(result.refusal, "64 MiB per rank process"));
  CHECK(contains(result.refusal, "--transport threads"));
  CHECK(checkRun(processes(16), estimateNeeds(processes(16)), limits).refusal.empty());
}

TEST_CASE("an open-file soft limit below the need is raised up to the hard limit") {
  HostLimits limits = roomy();
  limits.openFilesSoft = 64;
  const auto needs = estimateNeeds(processes(16));
  const auto result = checkRun(processes(16), needs, limits);
  CHECK(result.refusal.empty());
  REQUIRE(result.raiseOpenFilesTo);
  CHECK(*result.raiseOpenFilesTo >= needs.storeHostFiles);
  limits.openFilesHard = 300;
  CHECK(*checkRun(processes(16), needs, limits).raiseOpenFilesTo == 300);
}

TEST_CASE("an open-file hard limit below the need is refused naming ulimit -n") {
  HostLimits limits = roomy();
  limits.openFilesSoft = 64;
  limits.openFilesHard = 64;
  const auto result = checkRun(processes(16), estimateNeeds(processes(16)), limits);
  CHECK(contains(result.refusal, "ulimit -n"));
  CHECK(contains(result.refusal, "limit is 64"));
  CHECK_FALSE(result.raiseOpenFilesTo);
  // Rank 0 under a launcher hosts the store too.
  RunShape host = processes(16);
  host.processes = false;
  host.hostsStore = true;
  CHECK(contains(checkRun(host, estimateNeeds(host), limits).refusal, "hosting the store"));
}

TEST_CASE("the task limit counts what is already in use and is refused naming ulimit -u") {
  HostLimits limits = roomy();
  limits.tasks = 1000;
  limits.tasksInUse = 100;
  CHECK(checkRun(threads(800), estimateNeeds(threads(800)), limits).refusal.empty());
  const auto result = checkRun(threads(900), estimateNeeds(threads(900)), limits);
  CHECK(contains(result.refusal, "ulimit -u"));
  CHECK(contains(result.refusal, "100 are in use"));
  CHECK(contains(checkRun(processes(60), estimateNeeds(processes(60)), limits).refusal,
                 "20 per rank process"));
}

TEST_CASE("thread stacks count against the address-space limit, named as ulimit -v") {
  HostLimits limits = roomy();
  limits.addressSpace = 3 * kGiB;
  limits.addressSpaceInUse = kGiB;
  limits.threadStack = 8ull << 20;
  CHECK(checkRun(threads(128), estimateNeeds(threads(128)), limits).refusal.empty());
  const auto result = checkRun(threads(512), estimateNeeds(threads(512)), limits);
  CHECK(contains(result.refusal, "ulimit -v"));
  CHECK(contains(result.refusal, "thread stacks"));
}
