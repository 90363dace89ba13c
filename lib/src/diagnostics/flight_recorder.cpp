#include "hmc/diagnostics/flight_recorder.hpp"

namespace hmc::diagnostics {

nlohmann::json FlightEntry::toJson() const {
  nlohmann::json out = {{"sequence", sequence},  {"stage", stage},    {"step", step},
                        {"bytes", payloadBytes}, {"start_s", startS}, {"status", status}};
  out["end_s"] = endS ? nlohmann::json(*endS) : nlohmann::json(nullptr);
  return out;
}

FlightEntry FlightEntry::fromJson(const nlohmann::json& value) {
  FlightEntry entry;
  entry.sequence = value.at("sequence").get<std::uint64_t>();
  entry.stage = value.at("stage").get<std::string>();
  entry.step = value.at("step").get<int>();
  entry.payloadBytes = value.at("bytes").get<std::size_t>();
  entry.startS = value.at("start_s").get<double>();
  if (!value.at("end_s").is_null()) entry.endS = value.at("end_s").get<double>();
  entry.status = value.at("status").get<std::string>();
  return entry;
}

FlightRecorder::FlightRecorder(std::size_t capacity, collective::Clock::time_point epoch)
    : capacity_(capacity == 0 ? 1 : capacity), epoch_(epoch) {}

void FlightRecorder::setStep(int step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  if (step >= 0) stepsBegun_ = true;
}

bool FlightRecorder::stepsBegun() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stepsBegun_;
}

int FlightRecorder::step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_;
}

double FlightRecorder::sinceEpoch(collective::Clock::time_point t) const {
  return std::chrono::duration<double>(t - epoch_).count();
}

void FlightRecorder::onEnter(const collective::CollectiveRecord& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEntry entry;
  entry.sequence = record.sequence;
  entry.stage = record.stage;
  entry.step = step_;
  entry.payloadBytes = record.payloadBytes;
  entry.startS = sinceEpoch(record.start);
  entries_.push_back(std::move(entry));
  while (entries_.size() > capacity_) entries_.pop_front();
}

void FlightRecorder::onExit(const collective::CollectiveRecord& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->sequence == record.sequence) {
      it->endS = sinceEpoch(record.end);
      it->status = std::string(toString(record.status));
      break;
    }
  }
  if (keepDurations_) {
    durations_.emplace_back(record.stage,
                            std::chrono::duration<double>(record.end - record.start).count());
  }
}

void FlightRecorder::keepDurations(bool keep) {
  std::lock_guard<std::mutex> lock(mutex_);
  keepDurations_ = keep;
  if (!keep) {
    durations_.clear();
    durations_.shrink_to_fit();
  }
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {entries_.begin(), entries_.end()};
}

std::optional<FlightEntry> FlightRecorder::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.empty()) return std::nullopt;
  return entries_.back();
}

std::vector<std::pair<std::string, double>> FlightRecorder::durations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return durations_;
}

}  // namespace hmc::diagnostics
