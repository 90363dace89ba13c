#pragma once
// A rank's heartbeat: where the rank is now, small enough to write into the control store
// every 100 ms, so that `hmc-run status` can attach to a running or hung job and say where
// every rank is without asking the ranks anything.
//
// Keys (relative to the control store's "<prefix>/kv/", like key_value_store.hpp's):
//   heartbeat/<rank>   Heartbeat JSON, written by the rank's Watchdog thread (watchdog.hpp):
//                      when its position changed (at most every period, 100 ms) and at
//                      least every keepalive (1 s) so that readers see it is alive.
//   meta               JobMeta JSON, written once by rank 0's Watchdog: what a reader needs
//                      to find the other keys (world size) and to judge deadlines.
// Readers only read these keys (KeyValueStore::check and get); they never write.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "hmc/collective/key_value_store.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/enum_names.hpp"

namespace hmc::diagnostics {

inline std::string heartbeatKey(int rank) { return "heartbeat/" + std::to_string(rank); }
inline constexpr const char* kJobMetaKey = "meta";
inline constexpr const char* kHeartbeatFormat = "hmc-heartbeat/1";
inline constexpr const char* kJobMetaFormat = "hmc-job/1";

// starting: no step began yet; running: in a step, outside any collective; waiting: inside
// a collective (its last flight entry is in flight); done: left its steps.
enum class RankState { kStarting, kRunning, kWaiting, kDone };
inline constexpr EnumName<RankState> kRankStateNames[] = {
    {RankState::kStarting, "starting"},
    {RankState::kRunning, "running"},
    {RankState::kWaiting, "waiting"},
    {RankState::kDone, "done"},
};
constexpr EnumTable<RankState> enumTable(RankState) { return {"rank state", kRankStateNames}; }
inline std::string_view toString(RankState state) noexcept { return enumName(state); }

struct Heartbeat {
  int rank = 0;
  RankState state = RankState::kStarting;
  int step = -1;  // the scenario step it is in (-1: outside the steps)
  // The collective it waits in (state waiting), else the last one it entered; unset before
  // its first collective.
  std::optional<FlightEntry> current;
  // The last collective that completed (status not in_flight, timeout or rank_failure).
  std::optional<FlightEntry> lastCompleted;
  double inStageS = 0;       // seconds in `current` (waiting) or since leaving it, when written
  double wallS = 0;          // seconds since the rank's epoch, when written
  double writtenAtUnix = 0;  // the writer's system clock, seconds since 1970
  std::uint64_t beat = 0;    // how many heartbeats this rank wrote before this one
  std::string host;          // where the rank runs (hostName()); "" in a heartbeat without it
  std::int64_t pid = 0;      // its process id; 0 when unknown
  // The rank's first failure so far (a FailureView's JSON, diagnosis.hpp), caught or not: what
  // a report knows of a rank whose own end does not come (killed, or still at work).
  std::optional<nlohmann::json> firstFailure;

  nlohmann::json toJson() const;
  // Throws nlohmann::json::exception for a malformed document.
  static Heartbeat fromJson(const nlohmann::json& value);
};

// What rank 0 writes once under "meta".
struct JobMeta {
  std::string scenario;
  int worldSize = 1;
  double timeoutS = 0;  // the collective deadline
  std::string transport;
  double startedAtUnix = 0;

  nlohmann::json toJson() const;
  static JobMeta fromJson(const nlohmann::json& value);
};

// The heartbeat of the rank `recorder` watches, at `now` (beat and writtenAtUnix unset).
Heartbeat heartbeatOf(const FlightRecorder& recorder, int rank,
                      collective::Clock::time_point now = collective::Clock::now());

// Rank `rank`'s heartbeat in `kv`, the one reader of the key for every caller (the reporting
// rank's gatherer, hmc-run's launcher, `hmc-run status`): nullopt when the rank wrote none, or
// when what it wrote does not parse (then `*problem`, if given, says why). Each store request
// is bounded by `timeout`; the store's own errors propagate.
std::optional<Heartbeat> readHeartbeat(collective::KeyValueStore& kv, int rank,
                                       std::chrono::milliseconds timeout,
                                       std::string* problem = nullptr);

// Seconds since 1970 on the system clock.
double unixNow() noexcept;

}  // namespace hmc::diagnostics
