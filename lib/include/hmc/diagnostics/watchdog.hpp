#pragma once
// The watchdog of a rank process: publishes the rank's flight record out of band, through a
// KeyValueStore connection of its own (never through the transport, which may be stuck), so
// that the hang diagnosis can still say where a rank was when that rank is later killed
// (SIGKILL after the launcher's grace period) or never writes a result.
//
// A thread looks at the rank's FlightRecorder every `period` and publishes
//   - when the last collective is still in flight past the deadline, or ended with
//     "timeout" or "rank_failure" (once per collective and status);
//   - when another rank published (the counter "flight/published" grew, polled every
//     `peerPeriod`) and this rank's position changed since its own last publication, so a
//     rank stuck outside any collective (a long step) is located too.
// A publication sets "flight/<rank>" (JSON of PublishedFlight: the last `entries` flight
// entries and the current step) and adds 1 to "flight/published". Readers: the local launcher
// (for ranks without a result file) and rank 0 under an external launcher (for ranks whose
// result never came), through readPublishedFlights().
//
// The same thread keeps the rank's heartbeat ("heartbeat/<rank>", heartbeat.hpp) for
// `hmc-run status`: written at start, whenever the rank's position (state, step, collective
// and its status) changed, at most once per `period`, at least once per `keepalive`, and
// once more when the watchdog stops. Rank 0's watchdog also writes the job's "meta" once at
// start when `meta` is set. None of this touches the rank's exchanges: the thread reads the
// FlightRecorder (a short lock) and writes through its own store connection.
//
// With `dumpSignal` set it installs flight_dump.hpp's handler for that signal and writes the
// flight record to stderr within one period of each signal (`kill -USR1 <pid>`).
//
// Bounded: at most one publication per collective status change or peer publication; every
// store call is bounded by the store's timeout; a store that fails stops the publications
// and heartbeats (logged at debug level), not the dumps. Thread safety: the public methods
// may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hmc/collective/key_value_store.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/diagnostics/heartbeat.hpp"

namespace hmc::diagnostics {

// What a rank published: {"rank", "step", "reason", "entries": [FlightEntry JSON, ...]}.
struct PublishedFlight {
  int rank = 0;
  int step = -1;  // the step the rank was in (-1: outside the steps)
  std::string reason;
  std::vector<FlightEntry> entries;

  nlohmann::json toJson() const;
  static PublishedFlight fromJson(const nlohmann::json& value);
};

struct WatchdogOptions {
  int rank = 0;
  std::chrono::milliseconds deadline{30000};  // the collective deadline (timeout_s)
  std::chrono::milliseconds period{100};
  std::chrono::milliseconds peerPeriod{500};
  std::size_t entries = 16;  // flight entries per publication
  bool heartbeat = true;     // keep "heartbeat/<rank>" (off: only the flight publications)
  std::chrono::milliseconds keepalive{1000};  // rewrite an unchanged heartbeat this often
  std::optional<JobMeta> meta;                // written once under "meta" (rank 0)
  int dumpSignal = 0;  // dump the flight record to stderr on this signal (0: none)
  // The rank's first failure so far, for its heartbeat (Heartbeat::firstFailure); called on
  // the watchdog's thread at each beat, so it must be cheap and thread-safe.
  std::function<std::optional<nlohmann::json>()> firstFailure;
};

class Watchdog {
 public:
  Watchdog(std::shared_ptr<const FlightRecorder> recorder,
           std::shared_ptr<collective::KeyValueStore> store, WatchdogOptions options);
  // Stops the thread and joins it (within one store call). Never throws.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Publishes now with `reason`. Never throws; returns whether it reached the store.
  bool publish(const std::string& reason) noexcept;
  // Writes the heartbeat now, changed or not (a reader that must see the rank's last position,
  // not the one of up to a period ago). Never throws; returns whether it reached the store.
  bool beatNow() noexcept;
  // Publications that reached the store so far.
  std::size_t publications() const;
  // Heartbeats that reached the store so far.
  std::size_t heartbeats() const;

 private:
  using Position = std::tuple<std::uint64_t, std::string, int>;  // sequence, status, step
  using BeatKey = std::tuple<RankState, int, std::uint64_t, std::string, bool>;
  void run();
  Position position() const;
  // Writes the heartbeat when it changed or `force`; false when the store failed.
  bool beat(bool force);
  void dumpIfRequested();

  std::shared_ptr<const FlightRecorder> recorder_;
  std::shared_ptr<collective::KeyValueStore> store_;
  WatchdogOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool storeFailed_ = false;
  std::size_t publications_ = 0;
  std::size_t heartbeats_ = 0;
  std::optional<BeatKey> lastBeat_;
  collective::Clock::time_point lastBeatAt_{};
  std::int64_t seenPublished_ = 0;
  std::optional<Position> published_;
  std::thread thread_;
};

// Every rank's published record that is present now (ranks 0..worldSize-1). Never throws:
// a store that fails yields what was read so far.
std::map<int, PublishedFlight> readPublishedFlights(collective::KeyValueStore& store,
                                                    int worldSize);

}  // namespace hmc::diagnostics
