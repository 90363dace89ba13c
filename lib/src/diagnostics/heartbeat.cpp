#include "hmc/diagnostics/heartbeat.hpp"

#include <chrono>

#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"

namespace hmc::diagnostics {
namespace {

nlohmann::json optionalEntry(const std::optional<FlightEntry>& entry) {
  return entry ? entry->toJson() : nlohmann::json(nullptr);
}

std::optional<FlightEntry> entryFrom(const nlohmann::json& value) {
  if (value.is_null()) return std::nullopt;
  return FlightEntry::fromJson(value);
}

}  // namespace

nlohmann::json Heartbeat::toJson() const {
  nlohmann::json out = {{"format", kHeartbeatFormat},
          {"rank", rank},
          {"state", toString(state)},
          {"step", step},
          {"current", optionalEntry(current)},
          {"last_completed", optionalEntry(lastCompleted)},
          {"in_stage_s", inStageS},
          {"wall_s", wallS},
          {"written_at", writtenAtUnix},
          {"beat", beat},
          {"host", host},
          {"pid", pid}};
  if (firstFailure) out["first_failure"] = *firstFailure;
  return out;
}

Heartbeat Heartbeat::fromJson(const nlohmann::json& value) {
  Heartbeat out;
  out.rank = value.at("rank").get<int>();
  try {
    out.state = parseEnum<RankState>(value.at("state").get<std::string>());
  } catch (const ValueError& error) {
    throw nlohmann::json::other_error::create(501, error.what(), &value);
  }
  out.step = value.at("step").get<int>();
  out.current = entryFrom(value.at("current"));
  out.lastCompleted = entryFrom(value.at("last_completed"));
  out.inStageS = value.at("in_stage_s").get<double>();
  out.wallS = value.at("wall_s").get<double>();
  out.writtenAtUnix = value.at("written_at").get<double>();
  out.beat = value.at("beat").get<std::uint64_t>();
  out.host = value.value("host", std::string());
  out.pid = value.value("pid", std::int64_t{0});
  if (const auto found = value.find("first_failure"); found != value.end() && found->is_object()) {
    out.firstFailure = *found;
  }
  return out;
}

nlohmann::json JobMeta::toJson() const {
  return {{"format", kJobMetaFormat}, {"scenario", scenario},   {"world_size", worldSize},
          {"timeout_s", timeoutS},    {"transport", transport}, {"started_at", startedAtUnix}};
}

JobMeta JobMeta::fromJson(const nlohmann::json& value) {
  JobMeta out;
  out.scenario = value.at("scenario").get<std::string>();
  out.worldSize = value.at("world_size").get<int>();
  out.timeoutS = value.at("timeout_s").get<double>();
  out.transport = value.at("transport").get<std::string>();
  out.startedAtUnix = value.at("started_at").get<double>();
  return out;
}

Heartbeat heartbeatOf(const FlightRecorder& recorder, int rank, collective::Clock::time_point now) {
  static const std::string host = hostName();  // once per process: it writes every 100 ms
  Heartbeat out;
  out.rank = rank;
  out.host = host;
  out.pid = processId();
  out.step = recorder.step();
  out.wallS = std::chrono::duration<double>(now - recorder.epoch()).count();
  const auto entries = recorder.entries();
  if (!entries.empty()) out.current = entries.back();
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (!isWaitStatus(it->status)) {
      out.lastCompleted = *it;
      break;
    }
  }
  const bool inFlight = out.current && !out.current->endS;
  if (inFlight) {
    out.state = RankState::kWaiting;
    out.inStageS = out.wallS - out.current->startS;
  } else {
    out.state = out.step >= 0           ? RankState::kRunning
                : recorder.stepsBegun() ? RankState::kDone
                                        : RankState::kStarting;
    out.inStageS = out.current ? out.wallS - *out.current->endS : out.wallS;
  }
  return out;
}

double unixNow() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::optional<Heartbeat> readHeartbeat(collective::KeyValueStore& kv, int rank,
                                       std::chrono::milliseconds timeout, std::string* problem) {
  const std::string key = heartbeatKey(rank);
  if (!kv.check({key})) return std::nullopt;
  try {
    return Heartbeat::fromJson(nlohmann::json::parse(kv.get(key, timeout)));
  } catch (const nlohmann::json::exception& error) {
    if (problem != nullptr) *problem = error.what();
    return std::nullopt;
  }
}

}  // namespace hmc::diagnostics
