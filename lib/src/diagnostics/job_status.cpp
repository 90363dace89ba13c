#include "hmc/diagnostics/job_status.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/error.hpp"

namespace hmc::diagnostics {
namespace {

std::string statusStepText(int step) {
  return step < 0 ? std::string("after its steps") : fmt::format("step {}", step);
}

std::string problemOf(const RankStatus& status, double deadlineS) {
  if (status.dead) return fmt::format("rank {} died: {}", status.rank, *status.dead);
  if (!status.heartbeat) return "";
  const Heartbeat& beat = *status.heartbeat;
  if (status.stale) {
    const std::string where =
        beat.state == RankState::kWaiting && beat.current
            ? fmt::format("waits in '{}' #{} for {:.1f} s{}", beat.current->stage,
                          beat.current->sequence, status.inStageS,
                          status.inStageS > deadlineS
                              ? fmt::format(", past its {:g} s deadline,", deadlineS)
                              : std::string(","))
            : fmt::format("was {} ({}),", toString(beat.state), statusStepText(beat.step));
    return fmt::format(
        "rank {} {} and wrote no heartbeat for {:.1f} s: its process is stopped, "
        "frozen or gone",
        status.rank, where, status.heartbeatAgeS);
  }
  if (!beat.current) return "";
  const FlightEntry& at = *beat.current;
  if (beat.state == RankState::kWaiting && status.inStageS > deadlineS) {
    return fmt::format("rank {} waits in '{}' #{} for {:.1f} s, past its {:g} s deadline",
                       status.rank, at.stage, at.sequence, status.inStageS, deadlineS);
  }
  if (at.endS && at.status == "timeout") {
    return fmt::format("rank {} waited in '{}' #{} until its {:g} s deadline (timeout)",
                       status.rank, at.stage, at.sequence, deadlineS);
  }
  if (at.endS && at.status == "rank_failure") {
    return fmt::format("rank {} left '{}' #{} with rank_failure: a peer failed", status.rank,
                       at.stage, at.sequence);
  }
  return "";
}

}  // namespace

nlohmann::json RankStatus::toJson() const {
  nlohmann::json out = {{"rank", rank}};
  if (heartbeat) {
    const Heartbeat& beat = *heartbeat;
    out["state"] = toString(beat.state);
    out["step"] = beat.step;
    out["stage"] = beat.current ? nlohmann::json(beat.current->stage) : nlohmann::json(nullptr);
    out["sequence"] =
        beat.current ? nlohmann::json(beat.current->sequence) : nlohmann::json(nullptr);
    out["collective_status"] =
        beat.current ? nlohmann::json(beat.current->status) : nlohmann::json(nullptr);
    out["in_stage_s"] = inStageS;
    out["last_completed"] = beat.lastCompleted ? beat.lastCompleted->toJson() : nullptr;
    out["heartbeat_age_s"] = heartbeatAgeS;
    out["wall_s"] = beat.wallS + heartbeatAgeS;
    out["host"] = beat.host.empty() ? nlohmann::json(nullptr) : nlohmann::json(beat.host);
    out["pid"] = beat.pid == 0 ? nlohmann::json(nullptr) : nlohmann::json(beat.pid);
  } else {
    out["state"] = "unknown";
    out["host"] = nullptr;
    out["pid"] = nullptr;
  }
  out["dead"] = dead ? nlohmann::json(*dead) : nlohmann::json(nullptr);
  out["stale"] = stale;
  out["problem"] = problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(problem);
  return out;
}

nlohmann::json JobStatus::toJson() const {
  nlohmann::json rankList = nlohmann::json::array();
  for (const auto& rank : ranks) rankList.push_back(rank.toJson());
  return {{"format", kStatusFormat},
          {"store", endpoint},
          {"job", meta.toJson()},
          {"ranks", std::move(rankList)},
          {"diagnosis", diagnosis.empty() ? nlohmann::json(nullptr) : nlohmann::json(diagnosis)},
          {"first_failure", firstFailure ? nlohmann::json(firstFailure->line)
                                         : nlohmann::json(nullptr)},
          {"verdict", hung ? "hung" : "progressing"}};
}

namespace {

// A rank that does not progress as the diagnosis sees it: dead (a crash), waiting past its
// deadline or ended its collective with a timeout or a lost rank, or silent.
std::optional<FailureView> failureOf(const RankStatus& status, const std::string& host) {
  if (status.problem.empty()) return std::nullopt;
  FailureView view;
  view.rank = status.rank;
  view.host = host;
  view.message = status.problem;
  if (status.dead) {
    view.kind = std::string(kCrash);
    view.message = *status.dead;
    return view;
  }
  const auto& current = status.heartbeat ? status.heartbeat->current : std::nullopt;
  if (current && isWaitStatus(current->status)) {
    view.kind = current->status == "rank_failure" ? "rank_failure" : "timeout";
    view.stage = current->stage;
    view.sequence = current->sequence;
    view.collectivesBefore = current->sequence;
    return view;
  }
  view.kind = std::string(kMissing);
  return view;
}

}  // namespace

JobStatus assessJob(const JobMeta& meta, const std::vector<std::optional<Heartbeat>>& heartbeats,
                    const std::map<int, std::string>& dead, double nowUnix) {
  JobStatus out;
  out.meta = meta;
  std::vector<RankWhereabouts> where;
  std::vector<FailureView> views;
  std::vector<std::string> hosts;
  std::map<int, std::string> whereabouts;
  for (int rank = 0; rank < meta.worldSize; ++rank) {
    RankStatus status;
    status.rank = rank;
    if (rank < static_cast<int>(heartbeats.size())) status.heartbeat = heartbeats[rank];
    if (auto it = dead.find(rank); it != dead.end()) status.dead = it->second;
    RankWhereabouts place;
    place.rank = rank;
    if (status.heartbeat) {
      const Heartbeat& beat = *status.heartbeat;
      place.host = beat.host;
      status.heartbeatAgeS = std::max(0.0, nowUnix - beat.writtenAtUnix);
      status.inStageS = beat.inStageS + status.heartbeatAgeS;
      status.stale = beat.state != RankState::kDone && status.heartbeatAgeS > kStaleHeartbeatS;
      if (beat.lastCompleted) place.flight.push_back(*beat.lastCompleted);
      if (beat.current &&
          (!beat.lastCompleted || beat.current->sequence != beat.lastCompleted->sequence)) {
        place.flight.push_back(*beat.current);
      }
      place.hung = beat.current && isWaitStatus(beat.current->status);
      switch (beat.state) {
        case RankState::kDone:
          place.elsewhere = "finished its steps";
          break;
        case RankState::kStarting:
          place.elsewhere = "has not begun its steps";
          break;
        default:
          place.elsewhere = fmt::format("runs {}", statusStepText(beat.step));
      }
    } else {
      place.elsewhere = "wrote no heartbeat yet";
    }
    status.problem = problemOf(status, meta.timeoutS);
    // A silent rank stays where its last heartbeat put it; its problem says it is silent.
    if (status.dead) place.gone = *status.dead;
    hosts.push_back(place.host);
    if (auto view = failureOf(status, place.host)) {
      views.push_back(std::move(*view));
    } else {
      whereabouts[rank] = "it " + place.elsewhere;
    }
    out.hung = out.hung || !status.problem.empty();
    out.ranks.push_back(std::move(status));
    where.push_back(std::move(place));
  }
  out.diagnosis = diagnoseWaits(where);
  if (out.hung) out.firstFailure = diagnose(views, meta.worldSize, hosts, whereabouts).first;
  return out;
}

JobStatus readJobStatus(collective::KeyValueStore& store, const std::string& endpoint,
                        std::chrono::milliseconds timeout, double nowUnix) {
  if (!store.check({kJobMetaKey})) {
    throw RuntimeError(fmt::format(
        "the store at {} holds no hmc-run job (no key '{}' under the prefix): the job's rank 0 "
        "has not begun its steps yet, or this is not an hmc-run store; retry in a moment or "
        "check --master-addr/--master-port",
        endpoint, kJobMetaKey));
  }
  JobMeta meta;
  try {
    meta = JobMeta::fromJson(nlohmann::json::parse(store.get(kJobMetaKey, timeout)));
  } catch (const nlohmann::json::exception& error) {
    throw RuntimeError(
        fmt::format("the store at {} holds unreadable job metadata: {}", endpoint, error.what()));
  }
  std::vector<std::optional<Heartbeat>> heartbeats(std::max(meta.worldSize, 0));
  for (int rank = 0; rank < meta.worldSize; ++rank) {
    // An unreadable heartbeat reads as none; the rank shows as "unknown".
    heartbeats[rank] = readHeartbeat(store, rank, timeout);
  }
  std::map<int, std::string> dead;
  if (store.check({collective::kAnyDeadKey})) {
    for (int rank = 0; rank < meta.worldSize; ++rank) {
      const std::string key = collective::deadRankKey(rank);
      if (store.check({key})) dead[rank] = store.get(key, timeout);
    }
  }
  JobStatus out = assessJob(meta, heartbeats, dead, nowUnix);
  out.endpoint = endpoint;
  return out;
}

}  // namespace hmc::diagnostics
