// RankResult <-> JSON: the wire format `hmc-rank-result/1` in which rank processes hand their
// results to the reporting process, and the leak check's JSON shape (shared with the report).

#include "hmc/scenario/rank_result.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace hmc::scenario {
namespace {

using nlohmann::json;

json optionalJson(const std::optional<std::int64_t>& value) {
  return value ? json(*value) : json(nullptr);
}
json optionalJson(const std::optional<std::string>& value) {
  return value ? json(*value) : json(nullptr);
}

// Strict reading: `object[key]` must exist; the error names the field's path.
class Reader {
 public:
  Reader(const json& object, std::string path) : object_(object), path_(std::move(path)) {
    if (!object_.is_object()) {
      throw ValueError(fmt::format("{}: {} {}: expected an object, got {}", kRankResultFormat,
                                   "field", path_.empty() ? "/" : path_, object_.type_name()));
    }
  }
  const json& at(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end()) {
      throw ValueError(
          fmt::format("{}: missing field {}/{} (a rank process of another hmc "
                      "version, or a truncated result?)",
                      kRankResultFormat, path_, key));
    }
    return *it;
  }
  template <typename T>
  T get(const char* key) const {
    try {
      return at(key).get<T>();
    } catch (const json::exception& error) {
      throw ValueError(
          fmt::format("{}: field {}/{}: {}", kRankResultFormat, path_, key, error.what()));
    }
  }
  template <typename T>
  std::optional<T> optional(const char* key) const {
    const json& value = at(key);
    if (value.is_null()) return std::nullopt;
    return get<T>(key);
  }
  bool has(const char* key) const { return object_.contains(key); }
  Reader child(const char* key) const { return Reader(at(key), path_ + "/" + key); }
  std::string path(const char* key) const { return path_ + "/" + key; }

 private:
  const json& object_;
  std::string path_;
};

json toJson(const StepResult& step) {
  json out = {{"index", step.index},
              {"op", toString(step.op)},
              {"module", optionalJson(step.module)},
              {"label", optionalJson(step.label)},
              {"status", toString(step.status)},
              {"expected", step.expected},
              {"seconds", step.seconds},
              {"start_s", step.startS},
              {"error", nullptr},
              {"bind", nullptr},
              {"mismatch", step.mismatch ? *step.mismatch : json(nullptr)}};
  if (step.error) {
    out["error"] = {{"kind", toString(step.error->kind)},
                    {"message", step.error->message},
                    {"stage", step.error->stage},
                    {"sequence", step.error->sequence ? json(*step.error->sequence) : json()},
                    {"collectives_before", step.error->collectivesBefore}};
  }
  if (step.bind) {
    out["bind"] = {{"binding_id", step.bind->bindingId},
                   {"reused", step.bind->reused},
                   {"seconds", step.bind->seconds}};
  }
  return out;
}

StepResult stepFromJson(const Reader& in) {
  StepResult step;
  step.index = in.get<int>("index");
  step.op = parseEnum<Op>(in.get<std::string>("op"));
  step.module = in.optional<std::string>("module");
  step.label = in.optional<std::string>("label");
  step.status = parseEnum<StepStatus>(in.get<std::string>("status"));
  step.expected = in.get<bool>("expected");
  step.seconds = in.get<double>("seconds");
  step.startS = in.get<double>("start_s");
  if (!in.at("error").is_null()) {
    const Reader error = in.child("error");
    step.error = StepError{parseEnum<ErrorKind>(error.get<std::string>("kind")),
                           error.get<std::string>("message")};
    const json& raw = in.at("error");
    step.error->stage = raw.value("stage", "");
    if (raw.contains("sequence") && raw.at("sequence").is_number_unsigned()) {
      step.error->sequence = raw.at("sequence").get<std::uint64_t>();
    }
    step.error->collectivesBefore = raw.value("collectives_before", std::uint64_t{0});
  }
  if (!in.at("bind").is_null()) {
    const Reader bind = in.child("bind");
    step.bind = BindInfo{bind.get<std::int64_t>("binding_id"), bind.get<bool>("reused"),
                         bind.get<double>("seconds")};
  }
  if (!in.at("mismatch").is_null()) step.mismatch = in.at("mismatch");
  return step;
}

// leaks.device: {"device", "free_bytes_before", "free_bytes_after", "free_bytes_delta",
// "total_bytes", "memory_info_error", "bytes_allocated", "bytes_held", "streams_held",
// "events_held", "communicators_held", "live", "leaked"}.
json toJson(const DeviceLeakCheck& device) {
  json delta;
  if (device.freeBytesBefore && device.freeBytesAfter) {
    delta = *device.freeBytesBefore - *device.freeBytesAfter;
  }
  json live = json::array();
  for (const auto& handle : device.live) {
    live.push_back({{"kind", handle.kind},
                    {"device", handle.device},
                    {"bytes", handle.bytes},
                    {"owner", handle.owner}});
  }
  return {{"device", device.device},
          {"free_bytes_before", optionalJson(device.freeBytesBefore)},
          {"free_bytes_after", optionalJson(device.freeBytesAfter)},
          {"free_bytes_delta", std::move(delta)},
          {"total_bytes", device.totalBytes},
          {"memory_info_error", device.memoryInfoError},
          {"bytes_allocated", device.bytesAllocated},
          {"bytes_held", device.bytesHeld},
          {"streams_held", device.streamsHeld},
          {"events_held", device.eventsHeld},
          {"communicators_held", device.communicatorsHeld},
          {"live", std::move(live)},
          {"leaked", device.leaked()}};
}

DeviceLeakCheck deviceLeaksFromJson(const Reader& in) {
  DeviceLeakCheck device;
  device.device = in.get<int>("device");
  device.freeBytesBefore = in.optional<std::int64_t>("free_bytes_before");
  device.freeBytesAfter = in.optional<std::int64_t>("free_bytes_after");
  device.totalBytes = in.get<std::int64_t>("total_bytes");
  device.memoryInfoError = in.get<std::string>("memory_info_error");
  device.bytesAllocated = in.get<std::int64_t>("bytes_allocated");
  device.bytesHeld = in.get<std::int64_t>("bytes_held");
  device.streamsHeld = in.get<std::int64_t>("streams_held");
  device.eventsHeld = in.get<std::int64_t>("events_held");
  device.communicatorsHeld = in.get<std::int64_t>("communicators_held");
  const json& live = in.at("live");
  for (std::size_t i = 0; i < live.size(); ++i) {
    const Reader handle(live.at(i), fmt::format("{}/{}", in.path("live"), i));
    device.live.push_back(
        LiveDeviceHandle{handle.get<std::string>("kind"), handle.get<int>("device"),
                         handle.get<std::int64_t>("bytes"), handle.get<std::string>("owner")});
  }
  return device;
}

LeakCheck leaksFromJson(const Reader& in) {
  LeakCheck leaks;
  leaks.checked = in.get<bool>("checked");
  leaks.reason = in.get<std::string>("reason");
  leaks.shutdownError = in.optional<std::string>("shutdown_error");
  leaks.groups = in.get<std::int64_t>("groups");
  leaks.boundGroups = in.get<std::int64_t>("bound_groups");
  leaks.runtimeLive = in.get<bool>("runtime_live");
  leaks.bytesHeld = in.get<std::int64_t>("bytes_held");
  leaks.workspacesHeld = in.get<std::int64_t>("workspaces_held");
  leaks.bytesAllocated = in.get<std::int64_t>("bytes_allocated");
  leaks.workspacesCreated = in.get<std::int64_t>("workspaces_created");
  const json& held = in.at("held_by");
  for (std::size_t i = 0; i < held.size(); ++i) {
    const Reader entry(held.at(i), fmt::format("{}/{}", in.path("held_by"), i));
    HeldWorkspace workspace;
    workspace.bindingId = entry.optional<std::int64_t>("binding_id");
    workspace.module = entry.optional<std::string>("module");
    workspace.bytes = entry.get<std::int64_t>("bytes");
    workspace.pendingBackward = entry.get<std::int64_t>("pending_backward");
    workspace.closing = entry.get<bool>("closing");
    if (held.at(i).contains("device")) workspace.device = entry.get<std::string>("device");
    leaks.heldBy.push_back(std::move(workspace));
  }
  if (in.has("device")) leaks.device = deviceLeaksFromJson(in.child("device"));
  return leaks;
}

}  // namespace

std::vector<double> TimingSamples::exchange() const {
  std::vector<double> all;
  for (const auto& [stage, samples] : collectives)
    all.insert(all.end(), samples.begin(), samples.end());
  return all;
}

json toJson(const LeakCheck& leaks) {
  json heldBy = json::array();
  for (const auto& held : leaks.heldBy) {
    json entry = {{"binding_id", optionalJson(held.bindingId)},
                  {"module", optionalJson(held.module)},
                  {"bytes", held.bytes},
                  {"pending_backward", held.pendingBackward},
                  {"closing", held.closing}};
    if (held.device) entry["device"] = *held.device;
    heldBy.push_back(std::move(entry));
  }
  json out = {{"checked", leaks.checked},
              {"reason", leaks.reason},
              {"shutdown_error", optionalJson(leaks.shutdownError)},
              {"groups", leaks.groups},
              {"bound_groups", leaks.boundGroups},
              {"runtime_live", leaks.runtimeLive},
              {"bytes_held", leaks.bytesHeld},
              {"workspaces_held", leaks.workspacesHeld},
              {"bytes_allocated", leaks.bytesAllocated},
              {"workspaces_created", leaks.workspacesCreated},
              {"held_by", std::move(heldBy)},
              {"leaked", leaks.leaked()}};
  // Absent on CPU runs (the report's documented shape), so optional on reading too.
  if (leaks.device) out["device"] = toJson(*leaks.device);
  return out;
}

json toJson(const RankResult& result) {
  json steps = json::array();
  for (const auto& step : result.steps) steps.push_back(toJson(step));
  json flight = json::array();
  for (const auto& entry : result.flight) flight.push_back(entry.toJson());
  return {{"format", kRankResultFormat},
          {"rank", result.rank},
          {"host", result.host},
          {"pid", result.pid},
          {"crashed", result.crashed},
          {"crash_reason", optionalJson(result.crashReason)},
          {"hung", result.hung},
          {"stopped", result.stopped},
          {"not_joined", result.notJoined},
          {"result_lost", result.resultLost},
          {"steps", std::move(steps)},
          {"final",
           {{"groups", result.final.groups},
            {"bound_groups", result.final.boundGroups},
            {"runtime_live", result.final.runtimeLive}}},
          {"leaks", toJson(result.leaks)},
          {"timing_samples",
           {{"fresh_bind", result.timings.freshBind},
            {"reused_bind", result.timings.reusedBind},
            {"close", result.timings.close},
            {"collectives", result.timings.collectives}}},
          {"flight", std::move(flight)},
          {"collectives", result.collectives},
          {"process", result.process ? json{{"resident_bytes", result.process->residentBytes},
                                            {"open_descriptors", result.process->openDescriptors},
                                            {"threads", result.process->threads},
                                            {"heap_bytes", result.process->heapBytes},
                                            {"resident_used_bytes",
                                             result.process->residentUsedBytes},
                                            {"shared", result.process->shared}}
                                     : json(nullptr)}};
}

RankResult rankResultFromJson(const json& value) {
  const Reader in(value, "");
  const auto format = in.get<std::string>("format");
  if (format != kRankResultFormat) {
    throw ValueError(
        fmt::format("a rank result in format '{}', expected '{}': every rank must "
                    "run the same hmc-run version",
                    format, kRankResultFormat));
  }
  RankResult result;
  result.rank = in.get<int>("rank");
  result.host = in.get<std::string>("host");
  result.pid = in.get<std::int64_t>("pid");
  result.crashed = in.get<bool>("crashed");
  result.crashReason = in.optional<std::string>("crash_reason");
  result.hung = in.get<bool>("hung");
  result.stopped = in.optional<bool>("stopped").value_or(false);
  result.notJoined = in.optional<bool>("not_joined").value_or(false);
  result.resultLost = in.optional<bool>("result_lost").value_or(false);
  const json& steps = in.at("steps");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    result.steps.push_back(stepFromJson(Reader(steps.at(i), fmt::format("/steps/{}", i))));
  }
  const Reader final = in.child("final");
  result.final =
      FinalState{final.get<std::int64_t>("groups"), final.get<std::int64_t>("bound_groups"),
                 final.get<bool>("runtime_live")};
  result.leaks = leaksFromJson(in.child("leaks"));
  const Reader timings = in.child("timing_samples");
  result.timings.freshBind = timings.get<std::vector<double>>("fresh_bind");
  result.timings.reusedBind = timings.get<std::vector<double>>("reused_bind");
  result.timings.close = timings.get<std::vector<double>>("close");
  result.timings.collectives =
      timings.get<std::map<std::string, std::vector<double>>>("collectives");
  for (const auto& entry : in.at("flight")) {
    result.flight.push_back(diagnostics::FlightEntry::fromJson(entry));
  }
  result.collectives = in.get<std::uint64_t>("collectives");
  if (!in.at("process").is_null()) {
    const Reader process = in.child("process");
    ProcessSample sample;
    sample.residentBytes = process.get<std::int64_t>("resident_bytes");
    sample.openDescriptors = process.get<std::int64_t>("open_descriptors");
    sample.threads = process.get<std::int64_t>("threads");
    sample.heapBytes = process.get<std::int64_t>("heap_bytes");
    sample.residentUsedBytes = process.get<std::int64_t>("resident_used_bytes");
    sample.shared = process.get<bool>("shared");
    result.process = sample;
  }
  return result;
}

}  // namespace hmc::scenario
