#include "hmc/diagnostics/watchdog.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "hmc/diagnostics/flight_dump.hpp"

namespace hmc::diagnostics {
namespace {

using Clock = collective::Clock;

bool endedWaiting(const std::string& status) {
  return status == "timeout" || status == "rank_failure";
}

}  // namespace

nlohmann::json PublishedFlight::toJson() const {
  nlohmann::json entryList = nlohmann::json::array();
  for (const auto& entry : entries) entryList.push_back(entry.toJson());
  return {{"rank", rank}, {"step", step}, {"reason", reason}, {"entries", std::move(entryList)}};
}

PublishedFlight PublishedFlight::fromJson(const nlohmann::json& value) {
  PublishedFlight out;
  out.rank = value.at("rank").get<int>();
  out.step = value.at("step").get<int>();
  out.reason = value.at("reason").get<std::string>();
  for (const auto& entry : value.at("entries")) out.entries.push_back(FlightEntry::fromJson(entry));
  return out;
}

Watchdog::Watchdog(std::shared_ptr<const FlightRecorder> recorder,
                   std::shared_ptr<collective::KeyValueStore> store, WatchdogOptions options)
    : recorder_(std::move(recorder)), store_(std::move(store)), options_(std::move(options)) {
  if (options_.dumpSignal != 0) installFlightDumpSignal(options_.dumpSignal);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::size_t Watchdog::publications() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return publications_;
}

std::size_t Watchdog::heartbeats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heartbeats_;
}

bool Watchdog::beat(bool force) {
  const auto now = Clock::now();
  Heartbeat heartbeat = heartbeatOf(*recorder_, options_.rank, now);
  if (options_.firstFailure) heartbeat.firstFailure = options_.firstFailure();
  BeatKey key{heartbeat.state, heartbeat.step,
              heartbeat.current ? heartbeat.current->sequence : 0,
              heartbeat.current ? heartbeat.current->status : std::string(),
              heartbeat.firstFailure.has_value()};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (storeFailed_) return false;
    if (!force && lastBeat_ == key && now - lastBeatAt_ < options_.keepalive) return true;
    heartbeat.beat = heartbeats_;
  }
  heartbeat.writtenAtUnix = unixNow();
  try {
    store_->set(heartbeatKey(options_.rank), heartbeat.toJson().dump());
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: the watchdog cannot write its heartbeat: {}", options_.rank,
                  error.what());
    std::lock_guard<std::mutex> lock(mutex_);
    storeFailed_ = true;
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++heartbeats_;
  lastBeat_ = key;
  lastBeatAt_ = now;
  return true;
}

bool Watchdog::beatNow() noexcept {
  try {
    return beat(true);
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: the watchdog cannot write its heartbeat: {}", options_.rank,
                  error.what());
    return false;
  }
}

void Watchdog::dumpIfRequested() {
  if (options_.dumpSignal == 0 || takeFlightDumpRequests() == 0) return;
  const std::string text = formatFlightDump(*recorder_, options_.rank, "SIGUSR1");
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

Watchdog::Position Watchdog::position() const {
  const auto last = recorder_->last();
  return {last ? last->sequence : 0, last ? last->status : std::string(), recorder_->step()};
}

bool Watchdog::publish(const std::string& reason) noexcept {
  try {
    PublishedFlight flight;
    flight.rank = options_.rank;
    flight.reason = reason;
    const Position at = position();
    flight.step = std::get<2>(at);
    auto entries = recorder_->entries();
    const std::size_t from =
        entries.size() > options_.entries ? entries.size() - options_.entries : 0;
    flight.entries.assign(entries.begin() + static_cast<std::ptrdiff_t>(from), entries.end());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (storeFailed_) return false;
    }
    store_->set(collective::flightKey(options_.rank), flight.toJson().dump());
    const std::int64_t count = store_->add(collective::kFlightPublishedKey, 1);
    std::lock_guard<std::mutex> lock(mutex_);
    ++publications_;
    seenPublished_ = count;
    published_ = at;
    return true;
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: the watchdog cannot publish its flight record: {}", options_.rank,
                  error.what());
    std::lock_guard<std::mutex> lock(mutex_);
    storeFailed_ = true;
    return false;
  }
}

void Watchdog::run() {
  if (options_.meta) {
    try {
      store_->set(kJobMetaKey, options_.meta->toJson().dump());
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: the watchdog cannot write the job's meta: {}", options_.rank,
                    error.what());
      std::lock_guard<std::mutex> lock(mutex_);
      storeFailed_ = true;
    }
  }
  if (options_.heartbeat) beat(true);
  auto nextPeerPoll = Clock::now() + options_.peerPeriod;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, options_.period, [&] { return stop_; });
    const bool stopping = stop_;
    const bool storeFailed = storeFailed_;
    const std::optional<Position> lastPublished = published_;
    const std::int64_t seen = seenPublished_;
    lock.unlock();
    dumpIfRequested();
    if (stopping) {
      // The last word: where the rank stopped ("done" after its steps).
      if (options_.heartbeat && !storeFailed) beat(true);
      return;
    }
    if (storeFailed) {
      lock.lock();
      continue;  // dumps still work without the store
    }

    std::string reason;
    if (const auto last = recorder_->last()) {
      const double age =
          std::chrono::duration<double>(Clock::now() - recorder_->epoch()).count() - last->startS;
      const double deadline = std::chrono::duration<double>(options_.deadline).count();
      const bool stuck = (!last->endS && age > deadline) || endedWaiting(last->status);
      if (stuck && position() != lastPublished) {
        reason = last->endS ? fmt::format("'{}' #{} ended with {}", last->stage, last->sequence,
                                          last->status)
                            : fmt::format("'{}' #{} passed its {:g} s deadline", last->stage,
                                          last->sequence, deadline);
      }
    }
    if (reason.empty() && Clock::now() >= nextPeerPoll) {
      nextPeerPoll = Clock::now() + options_.peerPeriod;
      try {
        const std::int64_t count = store_->add(collective::kFlightPublishedKey, 0);
        if (count > seen) {
          if (position() != lastPublished) reason = "another rank published its flight record";
          lock.lock();
          seenPublished_ = std::max(seenPublished_, count);
          lock.unlock();
        }
      } catch (const std::exception& error) {
        spdlog::debug("rank {}: the watchdog lost the store: {}", options_.rank, error.what());
        lock.lock();
        storeFailed_ = true;
        continue;
      }
    }
    if (!reason.empty()) publish(reason);
    if (options_.heartbeat) beat(false);
    lock.lock();
  }
}

std::map<int, PublishedFlight> readPublishedFlights(collective::KeyValueStore& store,
                                                    int worldSize) {
  std::map<int, PublishedFlight> out;
  try {
    for (int rank = 0; rank < worldSize; ++rank) {
      const std::string key = collective::flightKey(rank);
      if (!store.check({key})) continue;
      try {
        out[rank] = PublishedFlight::fromJson(
            nlohmann::json::parse(store.get(key, std::chrono::milliseconds(1000))));
      } catch (const nlohmann::json::exception& error) {
        spdlog::warn("rank {} published an unreadable flight record: {}", rank, error.what());
      }
    }
  } catch (const std::exception& error) {
    spdlog::debug("reading published flight records: {}", error.what());
  }
  return out;
}

}  // namespace hmc::diagnostics
