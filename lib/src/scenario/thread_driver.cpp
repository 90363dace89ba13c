#include "hmc/scenario/thread_driver.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "hmc/collective/threads_transport.hpp"
#include "hmc/host.hpp"

namespace hmc::scenario {
namespace {

// The end-of-run agreement, out of band: each rank says whether it ended cleanly and waits
// (bounded) for the others.
class ShutdownVote {
 public:
  explicit ShutdownVote(int worldSize) : worldSize_(worldSize) {}

  bool vote(bool clean, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++posted_;
    allClean_ = allClean_ && clean;
    changed_.notify_all();
    const bool complete =
        changed_.wait_for(lock, timeout, [&] { return posted_ == worldSize_ || !allClean_; });
    return complete && allClean_;
  }

 private:
  int worldSize_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int posted_ = 0;
  bool allClean_ = true;
};

}  // namespace

void ThreadInterrupt::interrupt(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!reason_) reason_ = reason;
  if (!world_) return;
  for (int rank = 0; rank < world_->worldSize(); ++rank) world_->markFailed(rank, *reason_);
}

bool ThreadInterrupt::interrupted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_.has_value();
}

void ThreadInterrupt::attach(std::shared_ptr<collective::ThreadWorld> world) {
  std::lock_guard<std::mutex> lock(mutex_);
  world_ = std::move(world);
  if (reason_) {
    for (int rank = 0; rank < world_->worldSize(); ++rank) world_->markFailed(rank, *reason_);
  }
}

void ThreadInterrupt::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  world_.reset();
}

std::vector<RankResult> runOnThreads(const Scenario& scenario, const ThreadRunOptions& options) {
  const int worldSize = scenario.worldSize;
  const auto timeout = scenario.timeout();
  auto world = collective::ThreadWorld::create(worldSize);
  ShutdownVote vote(worldSize);
  const auto epoch = collective::Clock::now();
  std::vector<RankResult> results(worldSize);
  if (options.interrupt != nullptr) options.interrupt->attach(world);
  std::vector<std::thread> threads;
  threads.reserve(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    try {
      threads.emplace_back([&, rank] {
        RankEnvironment env;
        env.collective = world->collective(rank, timeout);
        env.epoch = epoch;
        env.flightCapacity = options.flightCapacity;
        env.sampleProcess = false;  // once, below, when every rank thread has ended
        env.crash = [&world, rank] {
          world->markFailed(rank, "exited at once (fault crash)");
          throw RankCrashed();
        };
        env.agreeOnShutdown = [&vote, timeout](bool clean) { return vote.vote(clean, timeout); };
        if (options.onStep) {
          env.onStep = [&options, rank](const StepResult& step) { options.onStep(rank, step); };
        }
        try {
          if (options.recordDirectory) {
            env.recording = record::openRankRecording(*options.recordDirectory, rank, worldSize,
                                                      scenario.name, scenario.timeoutS);
          }
          results[rank] = runRank(scenario, env);
        } catch (const std::exception& error) {
          results[rank].rank = rank;
          results[rank].crashed = true;
          results[rank].crashReason = std::string("runner failed: ") + error.what();
          world->markFailed(rank, results[rank].crashReason.value());
        }
      });
    } catch (const std::system_error& error) {
      // A limit on threads or on address space for their stacks: this rank and the ones after
      // it never run; the started ones see them failed instead of waiting for the deadline.
      const std::string reason = fmt::format(
          "could not start its thread: {} (a limit on threads: ulimit -u or "
          "/proc/sys/kernel/threads-max, or on address space for its stack: ulimit -v; run "
          "fewer ranks)",
          error.what());
      for (int missing = rank; missing < worldSize; ++missing) {
        results[missing].rank = missing;
        results[missing].crashed = true;
        results[missing].crashReason = reason;
        world->markFailed(missing, reason);
      }
      break;
    }
  }
  for (auto& thread : threads) thread.join();
  if (options.interrupt != nullptr) options.interrupt->detach();
  // Every thread rank ran here, also those whose runner failed or never started.
  for (auto& result : results) {
    result.host = hostName();
    result.pid = processId();
  }
  // The process every rank shared, once all of them ended (a cycle of the leak-trend check).
  if (options.sampleProcess && !results.empty()) {
    results[0].process = sampleProcessEvery(collective::Clock::now() - epoch);
    if (results[0].process) results[0].process->shared = true;
  }
  return results;
}

}  // namespace hmc::scenario
