#pragma once
// A per-rank flight recorder: a ring buffer of the rank's last collectives (sequence number,
// stage, scenario step, start and end, payload size, status), attached to a Collective as
// its observer. What the hang diagnosis reads to say where every rank is.
// Thread safety: written by the rank's thread, read by any thread (a watchdog) under a lock.

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"

namespace hmc::diagnostics {

struct FlightEntry {
  std::uint64_t sequence = 0;
  std::string stage;
  int step = -1;  // the scenario step that ran it (-1: outside the steps, e.g. shutdown)
  std::size_t payloadBytes = 0;
  double startS = 0;                 // seconds since the recorder's epoch
  std::optional<double> endS;        // unset while in flight
  std::string status = "in_flight";  // "ok", "timeout", "mismatch", "rank_failure", "error"

  nlohmann::json toJson() const;
  static FlightEntry fromJson(const nlohmann::json& value);
};

class FlightRecorder final : public collective::CollectiveObserver {
 public:
  explicit FlightRecorder(std::size_t capacity = 64,
                          collective::Clock::time_point epoch = collective::Clock::now());

  // The scenario step that runs next (-1 for none).
  void setStep(int step);
  // The step set last (-1 for none): where the rank is now.
  int step() const;
  // Whether some step began (setStep(s >= 0) was called): with step() == -1, the rank has
  // left its steps rather than not reached them yet.
  bool stepsBegun() const;
  void onEnter(const collective::CollectiveRecord& record) override;
  void onExit(const collective::CollectiveRecord& record) override;

  std::vector<FlightEntry> entries() const;
  // Last entry, if any.
  std::optional<FlightEntry> last() const;
  collective::Clock::time_point epoch() const noexcept { return epoch_; }
  // Every collective's duration in seconds (not only the ring's), by stage: one entry per
  // collective, for a scenario run's timings. Empty when not kept.
  std::vector<std::pair<std::string, double>> durations() const;
  // Whether durations() keeps every collective's (default: yes). A program's world runs for
  // as long as the program does: its recorder keeps none, so that it stays bounded.
  void keepDurations(bool keep);

 private:
  double sinceEpoch(collective::Clock::time_point t) const;

  mutable std::mutex mutex_;
  std::size_t capacity_;
  collective::Clock::time_point epoch_;
  int step_ = -1;
  bool stepsBegun_ = false;
  bool keepDurations_ = true;
  std::deque<FlightEntry> entries_;
  std::vector<std::pair<std::string, double>> durations_;
};

inline std::string_view toString(collective::CollectiveStatus status) noexcept {
  return enumName(status);
}

}  // namespace hmc::diagnostics
