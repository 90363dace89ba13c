#pragma once
// What a rank process has done so far, for the thread that hands it on when a termination
// signal comes (teardown.hpp) while the main thread runs the steps: the finished
// repetitions (kept only under an external launcher, where the store gathers them at the
// end; under hmc-run's own launch each is handed on as it ends), and the current one's
// finished steps and flight recorder. Thread-safe.

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::world {

class RankProgress {
 public:
  // `keepDone`: keep the finished repetitions' results (done(), snapshot()).
  explicit RankProgress(bool keepDone) : keepDone_(keepDone) {}

  void beginRepetition(std::shared_ptr<diagnostics::FlightRecorder> recorder) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.clear();
    recorder_ = std::move(recorder);
  }
  void stepDone(const scenario::StepResult& step) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_.push_back(step);
  }
  // `handOn` runs under the lock: a signal's snapshot sees the repetition either running or
  // handed on, never both nor neither.
  void repetitionDone(const scenario::RankResult& result, const std::function<void()>& handOn) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handOn) handOn();
    if (keepDone_) done_.push_back(result);
    ++completed_;
    steps_.clear();
    recorder_.reset();
  }

  // The finished repetitions' results kept (keepDone), in order.
  std::vector<scenario::RankResult> done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  struct Snapshot {
    std::size_t first = 0;  // the repetition of results[0]
    std::vector<scenario::RankResult> results;
  };
  // The finished repetitions kept, plus the current one as far as it got when `signal` stopped
  // the rank: a rank waiting in a collective records a hang there (so the report's hang
  // diagnosis says where it waited); otherwise it is a rank stopped in a step.
  Snapshot snapshot(const scenario::Scenario& scenario, int rank, int signal) const;

 private:
  mutable std::mutex mutex_;
  bool keepDone_;
  std::size_t completed_ = 0;
  std::vector<scenario::RankResult> done_;
  std::vector<scenario::StepResult> steps_;
  std::shared_ptr<diagnostics::FlightRecorder> recorder_;
};

}  // namespace hmc::world
