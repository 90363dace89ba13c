#include "hmc/scenario/thread_driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/threads_transport.hpp"
#include "hmc/host.hpp"
#include "hmc/log.hpp"

namespace hmc::scenario {
namespace {

// The end-of-run agreement, out of band: each rank says whether it ended cleanly and waits
// (bounded) for the others.
class ShutdownVote {
 public:
  explicit ShutdownVote(int worldSize) : worldSize_(worldSize) {}

  // A thread rank that has not voted yet is still at its steps (each bounded: a collective by
  // its deadline, a stall by its seconds) and votes when it ends, crashed or hung included: its
  // vote is waited for as a collective close would wait for a rank at work, up to kLongest,
  // not only the collective deadline (a rank saving a checkpoint at the end is no hang).
  static constexpr std::chrono::milliseconds kLongest{300'000};

  bool vote(bool clean, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++posted_;
    allClean_ = allClean_ && clean;
    changed_.notify_all();
    const bool complete = changed_.wait_for(lock, std::max(timeout, kLongest), [&] {
      return posted_ == worldSize_ || !allClean_;
    });
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

namespace hmc::scenario {
namespace {

// The first step of `steps` (depth first, in order, into `repeat` blocks) that `match` accepts.
template <typename Match>
const Step* firstStep(const std::vector<Step>& steps, const Match& match) {
  for (const Step& step : steps) {
    if (match(step)) return &step;
    if (const Step* nested = firstStep(step.steps, match)) return nested;
  }
  return nullptr;
}

}  // namespace

std::optional<Scenario> warmUpScenario(const Scenario& scenario) {
  const Step* create =
      firstStep(scenario.steps, [](const Step& step) { return step.op == Op::kCreate; });
  if (create == nullptr) return std::nullopt;
  const Step* forward = firstStep(scenario.steps, [&](const Step& step) {
    return step.op == Op::kForward && step.module == create->module;
  });
  if (forward != nullptr && forward->device.value_or(scenario.device) == Device::kCuda) {
    return std::nullopt;
  }
  if (forward == nullptr && scenario.device == Device::kCuda) return std::nullopt;

  Scenario warm;
  warm.name = "rank warm-up";
  warm.worldSize = 1;
  warm.device = Device::kCpu;
  warm.dtype = scenario.dtype;
  warm.timeoutS = 30;
  const auto add = [&warm](Step step) {
    step.path = fmt::format("/steps/{}", warm.steps.size());
    warm.steps.push_back(std::move(step));
  };
  // The first calls do not depend on the sizes: small ones keep a scenario's 1 GiB workspace
  // or 16,384 features from being allocated twice at the start.
  Step made;
  made.op = Op::kCreate;
  made.module = create->module;
  made.type = create->type;
  made.features = std::min<std::int64_t>(create->features, kWarmUpMaxFeatures);
  if (create->workspaceBytes) {
    made.workspaceBytes = std::min<std::int64_t>(*create->workspaceBytes, kWarmUpMaxWorkspaceBytes);
  }
  made.compat = create->compat;
  made.scope = create->scope;
  add(std::move(made));
  Step run;
  run.op = Op::kForward;
  run.module = create->module;
  if (forward != nullptr) {
    run.batch = std::min<std::int64_t>(forward->batch, kWarmUpMaxBatch);
    run.dtype = forward->dtype;
  }
  run.device = Device::kCpu;
  add(std::move(run));
  Step drop;
  drop.op = Op::kDrop;
  drop.module = create->module;
  add(std::move(drop));
  Step closeAll;
  closeAll.op = Op::kCloseAll;
  add(std::move(closeAll));
  return warm;
}

RankWarmUp::RankWarmUp(const Scenario& scenario) {
  const auto variable = collective::processEnvironment()(kRankWarmUpVariable);
  if (variable && *variable == "0") {
    skipped_ = fmt::format("{}=0", kRankWarmUpVariable);
    return;
  }
  std::optional<Scenario> warm = warmUpScenario(scenario);
  if (!warm) {
    skipped_ = "the scenario creates no module on the CPU";
    return;
  }
  if (usesCuda(scenario)) {
    skipped_ = "the scenario uses CUDA";
    return;
  }
  restoreGenerator_ = saveCpuGeneratorState();
  start_ = collective::Clock::now();
  try {
    thread_ = std::thread([this, warm = std::move(*warm)] {
      try {
        ThreadRunOptions options;
        options.sampleProcess = false;
        const std::vector<RankResult> results = runOnThreads(warm, options);
        for (const StepResult& step : results.at(0).steps) {
          if (step.status != StepStatus::kOk) {
            logger()->debug("the rank's warm-up: step {} ({}) ended {}{}", step.index,
                            toString(step.op), toString(step.status),
                            step.error ? ": " + step.error->message : std::string());
          }
        }
      } catch (const std::exception& error) {
        logger()->debug("the rank's warm-up failed: {}", error.what());
      }
      end_ = collective::Clock::now();  // read after the join
    });
  } catch (const std::system_error& error) {
    skipped_ = fmt::format("its thread could not start: {}", error.what());
    restoreGenerator_ = nullptr;
  }
}

RankWarmUp::~RankWarmUp() { finish(); }

void RankWarmUp::finish() {
  if (!thread_.joinable()) return;
  const auto finishing = collective::Clock::now();
  thread_.join();
  restoreGenerator_();
  const auto ms = [](collective::Clock::duration span) {
    return std::chrono::duration<double, std::milli>(span).count();
  };
  took_ = end_ - start_;
  logger()->debug(
      "the rank's warm-up of LibTorch took {:.1f} ms; {:.1f} ms of it after the world formed",
      ms(*took_), ms(std::max(end_ - finishing, collective::Clock::duration(0))));
}

}  // namespace hmc::scenario
