// RankResult <-> JSON: how a rank's results travel to rank 0 and into the report.

#include <fmt/format.h>

#include "hmc/scenario/runner.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;

json stepToJson(const StepResult& step) {
  json out = {{"index", step.index}, {"op", step.op}};
  if (step.module) out["module"] = *step.module;
  out["status"] = toString(step.status);
  out["expected"] = step.expected;
  out["seconds"] = step.seconds;
  if (step.errorKind) out["error"] = {{"kind", *step.errorKind}, {"message", *step.errorMessage}};
  if (step.bind) out["bind"] = *step.bind;
  if (step.label) out["label"] = *step.label;
  if (step.mismatch) out["mismatch"] = *step.mismatch;
  out["start_s"] = step.startS;
  return out;
}

json optionalBytes(const std::optional<std::int64_t>& bytes) {
  return bytes ? json(*bytes) : json();
}

// leaks.device: {"device", "free_bytes_before", "free_bytes_after", "free_bytes_delta",
// "total_bytes", "memory_info_error", "bytes_allocated", "bytes_held", "streams_held",
// "events_held", "communicators_held", "live", "leaked"}.
json deviceLeaksToJson(const DeviceLeakCheck& device) {
  json delta;
  if (device.freeBytesBefore && device.freeBytesAfter) {
    delta = *device.freeBytesBefore - *device.freeBytesAfter;
  }
  return {{"device", device.device},
          {"free_bytes_before", optionalBytes(device.freeBytesBefore)},
          {"free_bytes_after", optionalBytes(device.freeBytesAfter)},
          {"free_bytes_delta", std::move(delta)},
          {"total_bytes", device.totalBytes},
          {"memory_info_error", device.memoryInfoError},
          {"bytes_allocated", device.bytesAllocated},
          {"bytes_held", device.bytesHeld},
          {"streams_held", device.streamsHeld},
          {"events_held", device.eventsHeld},
          {"communicators_held", device.communicatorsHeld},
          {"live", device.live},
          {"leaked", device.leaked()}};
}

DeviceLeakCheck deviceLeaksFromJson(const json& value) {
  DeviceLeakCheck device;
  device.device = value.value("device", 0);
  if (value.contains("free_bytes_before") && !value["free_bytes_before"].is_null()) {
    device.freeBytesBefore = value["free_bytes_before"].get<std::int64_t>();
  }
  if (value.contains("free_bytes_after") && !value["free_bytes_after"].is_null()) {
    device.freeBytesAfter = value["free_bytes_after"].get<std::int64_t>();
  }
  device.totalBytes = value.value("total_bytes", std::int64_t{0});
  device.memoryInfoError = value.value("memory_info_error", "");
  device.bytesAllocated = value.value("bytes_allocated", std::int64_t{0});
  device.bytesHeld = value.value("bytes_held", std::int64_t{0});
  device.streamsHeld = value.value("streams_held", std::int64_t{0});
  device.eventsHeld = value.value("events_held", std::int64_t{0});
  device.communicatorsHeld = value.value("communicators_held", std::int64_t{0});
  device.live = value.value("live", json::array());
  return device;
}

StepResult stepFromJson(const json& value) {
  StepResult step;
  step.index = value.at("index").get<int>();
  step.op = value.at("op").get<std::string>();
  if (value.contains("module")) step.module = value["module"].get<std::string>();
  step.status = stepStatusFromString(value.at("status").get<std::string>());
  step.expected = value.at("expected").get<bool>();
  step.seconds = value.value("seconds", 0.0);
  if (value.contains("error")) {
    step.errorKind = value["error"].at("kind").get<std::string>();
    step.errorMessage = value["error"].at("message").get<std::string>();
  }
  if (value.contains("bind")) step.bind = value["bind"];
  if (value.contains("label")) step.label = value["label"].get<std::string>();
  if (value.contains("mismatch")) step.mismatch = value["mismatch"];
  step.startS = value.value("start_s", 0.0);
  return step;
}

}  // namespace

json RankResult::toJson() const {
  json steps_ = json::array();
  for (const auto& step : steps) steps_.push_back(stepToJson(step));
  json flight_ = json::array();
  for (const auto& entry : flight) flight_.push_back(entry.toJson());
  json out = {
      {"rank", rank},
      {"steps", std::move(steps_)},
      {"final",
       {{"groups", final.groups},
        {"bound_groups", final.boundGroups},
        {"runtime_live", final.runtimeLive}}},
  };
  if (crashed) {
    out["crashed"] = true;
    out["crash_reason"] = crashReason.value_or("");
  }
  out["hung"] = hung;
  out["leaks"] = {{"checked", leaks.checked},
                  {"reason", leaks.reason},
                  {"shutdown_error", leaks.shutdownError ? json(*leaks.shutdownError) : json()},
                  {"groups", leaks.groups},
                  {"bound_groups", leaks.boundGroups},
                  {"runtime_live", leaks.runtimeLive},
                  {"bytes_held", leaks.bytesHeld},
                  {"workspaces_held", leaks.workspacesHeld},
                  {"bytes_allocated", leaks.bytesAllocated},
                  {"workspaces_created", leaks.workspacesCreated},
                  {"held_by", leaks.heldBy},
                  {"leaked", leaks.leaked()}};
  if (leaks.device) out["leaks"]["device"] = deviceLeaksToJson(*leaks.device);
  out["timing_samples"] = {{"fresh_bind", timings.freshBind},
                           {"reused_bind", timings.reusedBind},
                           {"close", timings.close},
                           {"exchange", timings.exchange}};
  out["flight"] = std::move(flight_);
  out["collectives"] = collectives;
  return out;
}

RankResult RankResult::fromJson(const json& value) {
  RankResult result;
  result.rank = value.at("rank").get<int>();
  for (const auto& step : value.at("steps")) result.steps.push_back(stepFromJson(step));
  const json& final = value.at("final");
  result.final = FinalState{final.at("groups").get<std::int64_t>(),
                            final.at("bound_groups").get<std::int64_t>(),
                            final.at("runtime_live").get<bool>()};
  result.crashed = value.value("crashed", false);
  if (value.contains("crash_reason")) result.crashReason = value["crash_reason"].get<std::string>();
  result.hung = value.value("hung", false);
  if (value.contains("leaks")) {
    const json& leaks = value["leaks"];
    result.leaks.checked = leaks.value("checked", false);
    result.leaks.reason = leaks.value("reason", "");
    if (leaks.contains("shutdown_error") && !leaks["shutdown_error"].is_null()) {
      result.leaks.shutdownError = leaks["shutdown_error"].get<std::string>();
    }
    result.leaks.groups = leaks.value("groups", 0);
    result.leaks.boundGroups = leaks.value("bound_groups", 0);
    result.leaks.runtimeLive = leaks.value("runtime_live", false);
    result.leaks.bytesHeld = leaks.value("bytes_held", 0);
    result.leaks.workspacesHeld = leaks.value("workspaces_held", 0);
    result.leaks.bytesAllocated = leaks.value("bytes_allocated", 0);
    result.leaks.workspacesCreated = leaks.value("workspaces_created", 0);
    result.leaks.heldBy = leaks.value("held_by", json::array());
    if (leaks.contains("device") && leaks["device"].is_object()) {
      result.leaks.device = deviceLeaksFromJson(leaks["device"]);
    }
  }
  if (value.contains("timing_samples")) {
    const json& t = value["timing_samples"];
    result.timings.freshBind = t.value("fresh_bind", std::vector<double>{});
    result.timings.reusedBind = t.value("reused_bind", std::vector<double>{});
    result.timings.close = t.value("close", std::vector<double>{});
    result.timings.exchange = t.value("exchange", std::vector<double>{});
  }
  if (value.contains("flight")) {
    for (const auto& entry : value["flight"]) {
      result.flight.push_back(diagnostics::FlightEntry::fromJson(entry));
    }
  }
  result.collectives = value.value("collectives", std::uint64_t{0});
  return result;
}

}  // namespace hmc::scenario
