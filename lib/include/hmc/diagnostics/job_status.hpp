#pragma once
// What `hmc-run status` says about a running or hung job: every rank's heartbeat
// (heartbeat.hpp) judged against the job's deadline, the launcher's death notices
// ("dead/<rank>", key_value_store.hpp) and the hang diagnosis (hang_diagnosis.hpp).
//
// readJobStatus() only reads the store (check and get, each bounded by `timeout`); it never
// writes a key, so attaching to a job cannot change what the job does. assessJob() is the
// pure judgement, for tests.

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/key_value_store.hpp"
#include "hmc/diagnostics/diagnosis.hpp"
#include "hmc/diagnostics/heartbeat.hpp"

namespace hmc::diagnostics {

inline constexpr const char* kStatusFormat = "hmc-status/1";
// A rank that is not done and wrote no heartbeat for this long is taken for stopped (the
// watchdog writes one at least every second).
inline constexpr double kStaleHeartbeatS = 3.0;

struct RankStatus {
  int rank = 0;
  std::optional<Heartbeat> heartbeat;  // unset: it wrote none yet
  double heartbeatAgeS = 0;            // since the heartbeat was written (reader's clock)
  double inStageS = 0;                 // the heartbeat's in_stage_s plus its age
  std::optional<std::string> dead;     // the launcher's notice, when it announced the death
  bool stale = false;                  // not done, and no heartbeat for kStaleHeartbeatS
  // Why it does not progress ("rank 0 waits in 'close validation' #5 for 31.0 s, past its
  // 30 s deadline"), or "" when it does.
  std::string problem;

  nlohmann::json toJson() const;
};

struct JobStatus {
  std::string endpoint;  // "host:port" of the store
  JobMeta meta;
  std::vector<RankStatus> ranks;
  std::string diagnosis;  // diagnoseWaits() over the heartbeats; "" when no rank waits
  // The first failure so far (hmc/diagnostics/diagnosis.hpp) from the ranks that do not
  // progress: a wait past the deadline, a lost rank, a death; unset while every rank progresses.
  std::optional<FirstFailure> firstFailure;
  // Some rank waits past its deadline, ended a collective with timeout or rank_failure, died
  // or stopped writing heartbeats.
  bool hung = false;

  nlohmann::json toJson() const;
};

// Judges `heartbeats` (index: rank; world size: meta.worldSize) at `nowUnix`.
JobStatus assessJob(const JobMeta& meta, const std::vector<std::optional<Heartbeat>>& heartbeats,
                    const std::map<int, std::string>& dead, double nowUnix);

// Reads "meta", every "heartbeat/<rank>" and the death notices from `store` and judges them.
// Throws RuntimeError when the store holds no job metadata (not an hmc-run job, or rank 0
// has not started its steps yet), and what the store's calls throw (TimeoutError,
// BackendError) when it fails.
JobStatus readJobStatus(collective::KeyValueStore& store, const std::string& endpoint,
                        std::chrono::milliseconds timeout, double nowUnix = unixNow());

}  // namespace hmc::diagnostics
