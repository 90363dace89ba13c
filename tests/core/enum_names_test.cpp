// hmc/enum_names.hpp: every enum's table against the names that reports, scenario files, CLI
// values and wire formats hold (written out below as switches, so that the compiler's -Wswitch
// names an enumerator that this file does not know), and the one error convention.

#include "hmc/enum_names.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/compare/compare.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/scenario/leak_trend.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/scenario.hpp"

namespace {

using hmc::enumFromName;
using hmc::enumName;
using hmc::parseEnum;

// The contract: each value's name, byte for byte; "" for a value that is no enumerator.
std::string_view contract(hmc::collective::Transport value) {
  using hmc::collective::Transport;
  switch (value) {
    case Transport::kAuto:
      return "auto";
    case Transport::kThreads:
      return "threads";
    case Transport::kTcp:
      return "tcp";
    case Transport::kStore:
      return "store";
    case Transport::kGloo:
      return "gloo";
    case Transport::kNccl:
      return "nccl";
  }
  return "";
}

std::string_view contract(hmc::ErrorKind value) {
  using hmc::ErrorKind;
  switch (value) {
    case ErrorKind::kRuntimeError:
      return "runtime_error";
    case ErrorKind::kValueError:
      return "value_error";
    case ErrorKind::kTypeError:
      return "type_error";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kCheckFailed:
      return "check_failed";
    case ErrorKind::kCollectiveMismatch:
      return "collective_mismatch";
    case ErrorKind::kRankFailure:
      return "rank_failure";
    case ErrorKind::kScenario:
      return "scenario_error";
    case ErrorKind::kBackend:
      return "backend_error";
  }
  return "";
}

std::string_view contract(hmc::scenario::Op value) {
  using hmc::scenario::Op;
  switch (value) {
    case Op::kCreate:
      return "create";
    case Op::kShare:
      return "share";
    case Op::kForward:
      return "forward";
    case Op::kBackward:
      return "backward";
    case Op::kDrop:
      return "drop";
    case Op::kClose:
      return "close";
    case Op::kCloseAll:
      return "close_all";
    case Op::kCheck:
      return "check";
    case Op::kFault:
      return "fault";
    case Op::kBarrier:
      return "barrier";
    case Op::kSleep:
      return "sleep";
    case Op::kRepeat:
      return "repeat";
  }
  return "";
}

std::string_view contract(hmc::scenario::Device value) {
  using hmc::scenario::Device;
  switch (value) {
    case Device::kAuto:
      return "auto";
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "";
}

std::string_view contract(hmc::scenario::Expect value) {
  using hmc::scenario::Expect;
  switch (value) {
    case Expect::kOk:
      return "ok";
    case Expect::kError:
      return "error";
    case Expect::kHang:
      return "hang";
    case Expect::kAny:
      return "any";
  }
  return "";
}

std::string_view contract(hmc::scenario::FaultKind value) {
  using hmc::scenario::FaultKind;
  switch (value) {
    case FaultKind::kCloseError:
      return "close_error";
    case FaultKind::kReleaseError:
      return "release_error";
    case FaultKind::kBusy:
      return "busy";
    case FaultKind::kStall:
      return "stall";
    case FaultKind::kCrash:
      return "crash";
    case FaultKind::kLeak:
      return "leak";
  }
  return "";
}

std::string_view contract(hmc::scenario::LeakResource value) {
  using hmc::scenario::LeakResource;
  switch (value) {
    case LeakResource::kMemory:
      return "memory";
    case LeakResource::kMapped:
      return "mapped";
    case LeakResource::kDescriptor:
      return "descriptor";
    case LeakResource::kThread:
      return "thread";
  }
  return "";
}

std::string_view contract(hmc::scenario::TrendVerdict value) {
  using hmc::scenario::TrendVerdict;
  switch (value) {
    case TrendVerdict::kLeak:
      return "leak";
    case TrendVerdict::kFlat:
      return "flat";
    case TrendVerdict::kTooFewCycles:
      return "too_few_cycles";
  }
  return "";
}

std::string_view contract(hmc::scenario::LeakTrendExpect value) {
  using hmc::scenario::LeakTrendExpect;
  switch (value) {
    case LeakTrendExpect::kNone:
      return "none";
    case LeakTrendExpect::kLeak:
      return "leak";
    case LeakTrendExpect::kAny:
      return "any";
  }
  return "";
}

std::string_view contract(hmc::scenario::StepStatus value) {
  using hmc::scenario::StepStatus;
  switch (value) {
    case StepStatus::kOk:
      return "ok";
    case StepStatus::kError:
      return "error";
    case StepStatus::kHang:
      return "hang";
    case StepStatus::kSkipped:
      return "skipped";
    case StepStatus::kNotRun:
      return "not_run";
  }
  return "";
}

std::string_view contract(hmc::scenario::Outcome value) {
  using hmc::scenario::Outcome;
  switch (value) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kFail:
      return "fail";
    case Outcome::kHang:
      return "hang";
    case Outcome::kInvalid:
      return "invalid";
  }
  return "";
}

std::string_view contract(hmc::compare::SourceFormat value) {
  using hmc::compare::SourceFormat;
  switch (value) {
    case SourceFormat::kReport:
      return "hmc-run report";
    case SourceFormat::kGoogleBenchmark:
      return "Google Benchmark JSON";
  }
  return "";
}

std::string_view contract(hmc::compare::Verdict value) {
  using hmc::compare::Verdict;
  switch (value) {
    case Verdict::kFaster:
      return "faster";
    case Verdict::kSlower:
      return "slower";
    case Verdict::kSame:
      return "same";
    case Verdict::kUndecided:
      return "undecided";
    case Verdict::kInconclusive:
      return "inconclusive";
  }
  return "";
}

std::string_view contract(hmc::resources::DeviceHandleKind value) {
  using hmc::resources::DeviceHandleKind;
  switch (value) {
    case DeviceHandleKind::kMemory:
      return "memory";
    case DeviceHandleKind::kStream:
      return "stream";
    case DeviceHandleKind::kEvent:
      return "event";
    case DeviceHandleKind::kCommunicator:
      return "communicator";
  }
  return "";
}

std::string_view contract(hmc::diagnostics::RankState value) {
  using hmc::diagnostics::RankState;
  switch (value) {
    case RankState::kStarting:
      return "starting";
    case RankState::kRunning:
      return "running";
    case RankState::kWaiting:
      return "waiting";
    case RankState::kDone:
      return "done";
  }
  return "";
}

std::string_view contract(hmc::collective::CollectiveStatus value) {
  using hmc::collective::CollectiveStatus;
  switch (value) {
    case CollectiveStatus::kOk:
      return "ok";
    case CollectiveStatus::kTimeout:
      return "timeout";
    case CollectiveStatus::kMismatch:
      return "mismatch";
    case CollectiveStatus::kRankFailure:
      return "rank_failure";
    case CollectiveStatus::kError:
      return "error";
  }
  return "";
}

// The message of parseEnum<E>(name), or "" when it does not throw a ValueError.
template <typename E>
std::string parseError(std::string_view name) {
  try {
    (void)parseEnum<E>(name);
  } catch (const hmc::ValueError& error) {
    return error.what();
  }
  return "";
}

// Every value of E: named as the contract says, found by its name, and the last one.
template <typename E>
void checkTable(std::string_view what, std::size_t count) {
  const auto table = enumTable(E{});
  CAPTURE(what);
  CHECK(table.what() == what);
  REQUIRE(table.size() == count);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = static_cast<E>(i);
    const std::string_view name = enumName(value);
    CAPTURE(name);
    CHECK(name == contract(value));
    CHECK(!name.empty());
    const std::optional<E> found = enumFromName<E>(name);
    REQUIRE(found.has_value());
    CHECK(static_cast<std::size_t>(*found) == i);
    CHECK(static_cast<std::size_t>(parseEnum<E>(name)) == i);
    CHECK(enumName(*found) == name);
    names.emplace_back(name);
  }
  CHECK(hmc::enumNames<E>() == names);
  // The value after the last is no enumerator of E: the table misses none.
  const auto past = static_cast<E>(count);
  CHECK(contract(past) == "");
  CHECK(enumName(past) == "unknown");
}

}  // namespace

TEST_SUITE("enum_names") {
  TEST_CASE("every value of every enum round-trips through its contract name") {
    checkTable<hmc::collective::Transport>("transport", 6);
    checkTable<hmc::ErrorKind>("error kind", 9);
    checkTable<hmc::scenario::Op>("op", 12);
    checkTable<hmc::scenario::Device>("device", 3);
    checkTable<hmc::scenario::Expect>("expect value", 4);
    checkTable<hmc::scenario::FaultKind>("fault kind", 6);
    checkTable<hmc::scenario::LeakResource>("leak resource", 4);
    checkTable<hmc::scenario::LeakTrendExpect>("leak_trend value", 3);
    checkTable<hmc::scenario::TrendVerdict>("trend verdict", 3);
    checkTable<hmc::scenario::StepStatus>("step status", 5);
    checkTable<hmc::scenario::Outcome>("outcome", 4);
    checkTable<hmc::compare::SourceFormat>("source format", 2);
    checkTable<hmc::compare::Verdict>("verdict", 5);
    checkTable<hmc::resources::DeviceHandleKind>("device handle kind", 4);
    checkTable<hmc::diagnostics::RankState>("rank state", 4);
    checkTable<hmc::collective::CollectiveStatus>("collective status", 5);
  }

  TEST_CASE("the public toString wrappers answer the tables' names") {
    using hmc::collective::Transport;
    CHECK(hmc::collective::toString(Transport::kGloo) == "gloo");
    CHECK(hmc::toString(hmc::ErrorKind::kScenario) == "scenario_error");
    CHECK(hmc::scenario::toString(hmc::scenario::Op::kCloseAll) == "close_all");
    CHECK(hmc::scenario::toString(hmc::scenario::StepStatus::kNotRun) == "not_run");
    CHECK(hmc::scenario::toString(hmc::scenario::Outcome::kInvalid) == "invalid");
    CHECK(hmc::compare::toString(hmc::compare::SourceFormat::kGoogleBenchmark) ==
          "Google Benchmark JSON");
    CHECK(hmc::resources::toString(hmc::resources::DeviceHandleKind::kCommunicator) ==
          "communicator");
    CHECK(hmc::diagnostics::toString(hmc::diagnostics::RankState::kWaiting) == "waiting");
    CHECK(hmc::diagnostics::toString(hmc::collective::CollectiveStatus::kRankFailure) ==
          "rank_failure");
    CHECK((hmc::collective::transportFromString("nccl") == Transport::kNccl));
    CHECK(!hmc::collective::transportFromString("NCCL").has_value());
    CHECK(hmc::collective::transportNames() ==
          std::vector<std::string>{"auto", "threads", "tcp", "store", "gloo", "nccl"});
  }

  TEST_CASE("a name matches only exactly: no case folding, no trimming, no prefix") {
    using hmc::collective::Transport;
    for (std::string_view name : {"", "Threads", "THREADS", " threads", "threads ", "thread",
                                  "threadss", "unknown", "threads\n"}) {
      CAPTURE(name);
      CHECK(!enumFromName<Transport>(name).has_value());
      CHECK(parseError<Transport>(name) != "");
    }
    CHECK(!enumFromName<hmc::scenario::Outcome>("unknown").has_value());
  }

  TEST_CASE("an unknown name throws ValueError naming the enum, the name and every name") {
    CHECK(parseError<hmc::collective::Transport>("tpc") ==
          "unknown transport 'tpc' (expected one of: auto, threads, tcp, store, gloo, nccl)");
    CHECK(parseError<hmc::scenario::StepStatus>("passed") ==
          "unknown step status 'passed' (expected one of: ok, error, hang, skipped, not_run)");
    CHECK(parseError<hmc::diagnostics::RankState>("") ==
          "unknown rank state '' (expected one of: starting, running, waiting, done)");
    CHECK(parseError<hmc::compare::SourceFormat>("csv") ==
          "unknown source format 'csv' (expected one of: hmc-run report, Google Benchmark JSON)");
    try {
      (void)parseEnum<hmc::scenario::Device>("gpu");
      FAIL("no exception");
    } catch (const hmc::ValueError& error) {
      CHECK((error.kind() == hmc::ErrorKind::kValueError));
      CHECK(hmc::classNameOf(error) == "ValueError");
    }
  }

  TEST_CASE("an unknown name is shown escaped: it cannot end the message's line") {
    CHECK(parseError<hmc::scenario::Device>("cu\nda\x1b[2J") ==
          "unknown device 'cu\\nda\\x1b[2J' (expected one of: auto, cpu, cuda)");
  }

  TEST_CASE("a heartbeat with an unknown state is a JSON error in that shape") {
    nlohmann::json beat = hmc::diagnostics::Heartbeat{}.toJson();
    beat["state"] = "asleep";
    try {
      (void)hmc::diagnostics::Heartbeat::fromJson(beat);
      FAIL("no exception");
    } catch (const nlohmann::json::exception& error) {
      CHECK(std::string(error.what())
                .find("unknown rank state 'asleep' (expected one of: starting, running, waiting, "
                      "done)") != std::string::npos);
    }
  }
}
