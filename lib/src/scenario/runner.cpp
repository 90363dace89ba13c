#include "hmc/scenario/runner.hpp"

#include <algorithm>
#include <map>
#include <thread>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "hmc/error.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/resources/host_resources.hpp"
#include "hmc/torch/dtype.hpp"
#include "hmc/torch/scratch_modules.hpp"

namespace hmc::scenario {
namespace {

using nlohmann::json;
using Clock = collective::Clock;

std::string pythonBool(bool value) { return value ? "True" : "False"; }

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One rank's live objects while the steps run.
class RankState {
 public:
  RankState(const Scenario& scenario, RankEnvironment& env)
      : scenario_(scenario),
        env_(env),
        rank_(env.collective->rank()),
        manager_(std::make_shared<lifecycle::ResourceManager>(env.collective)),
        resources_(std::make_shared<resources::RankResources>()) {}

  ~RankState() {
    pending_.clear();
    modules_.clear();
  }

  lifecycle::ResourceManager& manager() { return *manager_; }
  resources::RankResources& resources() { return *resources_; }
  TimingSamples& timings() { return timings_; }

  FinalState finalState() const {
    return FinalState{static_cast<std::int64_t>(manager_->groupCount()),
                      static_cast<std::int64_t>(manager_->boundGroupCount()),
                      resources_->liveRuntime() != nullptr};
  }

  // Runs `step` (all its `repeat`s); the first failure ends it. `entry` is null for nested
  // steps, whose bind information is not reported (as in the reference runner).
  void run(const Step& step, StepResult* entry) {
    for (int i = 0; i < step.repeat; ++i) runOnce(step, entry);
  }

  void releaseAll() {
    pending_.clear();
    modules_.clear();
  }

  json heldBy() const {
    json out = json::array();
    for (const auto& group : manager_->groups()) {
      if (!group->resources) continue;
      const auto* workspace = dynamic_cast<const resources::Workspace*>(group->resources.get());
      std::string owner;
      for (const auto& [name, module] : modules_) {
        if (module->resourceGroup() == group) owner = name;
      }
      out.push_back({{"binding_id", group->bindingId ? json(*group->bindingId) : json(nullptr)},
                     {"module", owner.empty() ? json(nullptr) : json(owner)},
                     {"bytes", workspace ? workspace->nbytes() : 0},
                     {"pending_backward", workspace ? workspace->pending() : 0},
                     {"closing", group->closing}});
    }
    return out;
  }

 private:
  std::shared_ptr<nn::ScratchModule>& live(const std::string& name) {
    auto it = modules_.find(name);
    if (it == modules_.end()) {
      throw RuntimeError(fmt::format(
          "module '{}' is not live on rank {}: it was never created on this rank, or was "
          "dropped; check the step's `ranks` and the order of create/drop",
          name, rank_));
    }
    return it->second;
  }

  torch::Device resolveDevice(const Step& step) const {
    const Device device = step.device.value_or(scenario_.device);
    if (device == Device::kCpu) return torch::kCPU;
    const bool usable = torch::cuda::is_available();
    if (device == Device::kAuto) return usable ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
    if (!usable) {
      throw BackendError(fmt::format(
          "{}: device 'cuda' requested but torch::cuda::is_available() is false on rank {} (no "
          "usable GPU, or a CPU-only LibTorch); use \"device\": \"cpu\" or \"auto\"",
          step.path, rank_));
    }
    return torch::Device(torch::kCUDA, 0);
  }

  void runOnce(const Step& step, StepResult* entry) {
    switch (step.op) {
      case Op::kCreate: {
        if (modules_.count(step.module) != 0) {
          throw ValueError(fmt::format(
              "module '{}' is already live on rank {}: drop or close it before creating it "
              "again",
              step.module, rank_));
        }
        nn::ScratchOptions options;
        options.features = step.features;
        options.workspaceBytes = step.workspaceBytes;
        if (step.compat && !step.compat->is_null()) options.compat = step.compat;
        options.scope = step.scope;
        options.manager = manager_;
        options.resources = resources_;
        modules_[step.module] = nn::makeScratchModule(step.type, std::move(options));
        break;
      }
      case Op::kShare: {
        std::vector<nn::MulticoreModule*> members;
        for (const auto& name : step.modules) members.push_back(live(name).get());
        nn::MulticoreModule::shareExecutionResources(members);
        break;
      }
      case Op::kForward: {
        auto& module = live(step.module);
        const std::string dtypeName = step.dtype.value_or(scenario_.dtype);
        const auto dtype = nn::dtypeFromName(dtypeName);
        if (!dtype) throw ValueError(fmt::format("{}: unknown dtype '{}'", step.path, dtypeName));
        auto x = torch::randn({step.batch, module->features()},
                              torch::TensorOptions().dtype(*dtype).device(resolveDevice(step)))
                     .requires_grad_(true);
        torch::Tensor y = module->forward(x);
        if (const auto& bind = module->lastBind()) {
          const double seconds = bind->seconds.count();
          (bind->reused ? timings_.reusedBind : timings_.freshBind).push_back(seconds);
          if (entry != nullptr) {
            entry->bind = json{
                {"binding_id", bind->bindingId}, {"reused", bind->reused}, {"seconds", seconds}};
          }
        }
        if (step.backward) {
          y.sum().backward();
        } else {
          pending_[step.module].push_back(std::move(y));
        }
        break;
      }
      case Op::kBackward: {
        auto it = pending_.find(step.module);
        if (it == pending_.end()) break;
        std::vector<torch::Tensor> outputs = std::move(it->second);
        pending_.erase(it);
        for (auto& y : outputs) y.sum().backward();
        break;
      }
      case Op::kDrop:
        live(step.module);
        modules_.erase(step.module);
        break;
      case Op::kClose: {
        const auto start = Clock::now();
        live(step.module)->close();
        timings_.close.push_back(secondsSince(start));
        break;
      }
      case Op::kCloseAll: {
        const auto start = Clock::now();
        manager_->closeGroups();
        timings_.close.push_back(secondsSince(start));
        break;
      }
      case Op::kCheck: {
        const FinalState state = finalState();
        if (step.groups && *step.groups != state.groups) {
          throw CheckFailed(
              fmt::format("check failed: groups is {}, expected {}", state.groups, *step.groups));
        }
        if (step.boundGroups && *step.boundGroups != state.boundGroups) {
          throw CheckFailed(fmt::format("check failed: bound_groups is {}, expected {}",
                                        state.boundGroups, *step.boundGroups));
        }
        if (step.runtimeLive && *step.runtimeLive != state.runtimeLive) {
          throw CheckFailed(fmt::format("check failed: runtime_live is {}, expected {}",
                                        pythonBool(state.runtimeLive),
                                        pythonBool(*step.runtimeLive)));
        }
        break;
      }
      case Op::kFault:
        runFault(step);
        break;
      case Op::kBarrier:
        env_.collective->barrier();
        break;
      case Op::kSleep:
        std::this_thread::sleep_for(std::chrono::duration<double>(step.seconds));
        break;
      case Op::kRepeat:
        for (int i = 0; i < step.count; ++i) {
          for (const Step& inner : step.steps) {
            if (inner.ranks &&
                std::find(inner.ranks->begin(), inner.ranks->end(), rank_) == inner.ranks->end()) {
              continue;
            }
            run(inner, nullptr);
          }
        }
        break;
    }
  }

  void runFault(const Step& step) {
    switch (step.faultKind) {
      case FaultKind::kCloseError:
        resources_->faults().closeErrors += step.faultCount;
        break;
      case FaultKind::kReleaseError:
        resources_->faults().releaseErrors += step.faultCount;
        break;
      case FaultKind::kBusy: {
        auto& module = live(step.module);
        auto* workspace =
            dynamic_cast<resources::Workspace*>(module->resourceGroup()->resources.get());
        if (workspace == nullptr) {
          throw RuntimeError(fmt::format(
              "module '{}' on rank {} has no bound workspace to mark busy: run a forward first",
              step.module, rank_));
        }
        workspace->setBusy(step.busy);
        break;
      }
      case FaultKind::kStall:
        std::this_thread::sleep_for(std::chrono::duration<double>(step.seconds));
        break;
      case FaultKind::kCrash:
        env_.crash();
        break;
    }
  }

  const Scenario& scenario_;
  RankEnvironment& env_;
  int rank_;
  std::shared_ptr<lifecycle::ResourceManager> manager_;
  std::shared_ptr<resources::RankResources> resources_;
  std::map<std::string, std::shared_ptr<nn::ScratchModule>> modules_;
  std::map<std::string, std::vector<torch::Tensor>> pending_;
  TimingSamples timings_;
};

bool inRanks(const Step& step, int rank) {
  return !step.ranks || std::find(step.ranks->begin(), step.ranks->end(), rank) != step.ranks->end();
}

// The first line of a message (c10::Error carries its C++ backtrace after it).
std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

void recordError(StepResult& entry, const std::exception& error) {
  std::string message;
  if (const auto* c10Error = dynamic_cast<const c10::Error*>(&error)) {
    message = firstLine(c10Error->what_without_backtrace());
  } else {
    message = error.what();
  }
  const ErrorKind kind = kindOf(error);
  entry.errorKind = std::string(toString(kind));
  entry.errorMessage = std::move(message);
  entry.status = (kind == ErrorKind::kTimeout || kind == ErrorKind::kRankFailure)
                     ? StepStatus::kHang
                     : StepStatus::kError;
}

}  // namespace

std::string_view toString(StepStatus status) noexcept {
  switch (status) {
    case StepStatus::kOk: return "ok";
    case StepStatus::kError: return "error";
    case StepStatus::kHang: return "hang";
    case StepStatus::kSkipped: return "skipped";
    case StepStatus::kNotRun: return "not_run";
  }
  return "error";
}

StepStatus stepStatusFromString(std::string_view text) {
  for (StepStatus status : {StepStatus::kOk, StepStatus::kError, StepStatus::kHang,
                            StepStatus::kSkipped, StepStatus::kNotRun}) {
    if (toString(status) == text) return status;
  }
  throw ValueError(fmt::format("unknown step status '{}'", text));
}

void limitTorchThreads(int threads) { at::set_num_threads(std::max(1, threads)); }

std::string resolvedDeviceName(Device device) {
  if (device == Device::kAuto) return torch::cuda::is_available() ? "cuda" : "cpu";
  return std::string(toString(device));
}

std::string torchVersion() { return TORCH_VERSION; }

bool expectationMet(const Step& step, const StepResult& result) {
  if (result.status == StepStatus::kSkipped || result.status == StepStatus::kNotRun) return true;
  switch (step.expect) {
    case Expect::kAny: return true;
    case Expect::kError:
      return result.status == StepStatus::kError &&
             result.errorMessage.value_or("").find(step.expectError.value_or("")) !=
                 std::string::npos;
    case Expect::kOk: return result.status == StepStatus::kOk;
    case Expect::kHang: return result.status == StepStatus::kHang;
  }
  return false;
}

RankResult runRank(const Scenario& scenario, RankEnvironment& env) {
  const int rank = env.collective->rank();
  RankResult result;
  result.rank = rank;
  const auto recorderPtr = env.recorder ? env.recorder
                                        : std::make_shared<diagnostics::FlightRecorder>(
                                              env.flightCapacity, env.epoch);
  diagnostics::FlightRecorder& recorder = *recorderPtr;
  env.collective->setObserver(&recorder);
  struct Detach {
    collective::Collective& c;
    ~Detach() { c.setObserver(nullptr); }
  } detach{*env.collective};

  RankState state(scenario, env);
  for (int index = 0; index < static_cast<int>(scenario.steps.size()); ++index) {
    const Step& step = scenario.steps[index];
    StepResult entry;
    entry.index = index;
    entry.op = std::string(toString(step.op));
    if (!step.module.empty()) entry.module = step.module;
    entry.label = step.label;
    if (!inRanks(step, rank)) {
      entry.status = StepStatus::kSkipped;
    } else if (result.hung || result.crashed) {
      entry.status = StepStatus::kNotRun;
    } else {
      recorder.setStep(index);
      const auto start = Clock::now();
      entry.startS = std::chrono::duration<double>(start - env.epoch).count();
      try {
        state.run(step, &entry);
        entry.status = StepStatus::kOk;
      } catch (const RankCrashed&) {
        result.crashed = true;
        result.crashReason = "fault crash at step " + std::to_string(index);
        entry.status = StepStatus::kOk;  // it did what it was asked to
      } catch (const std::exception& error) {
        recordError(entry, error);
        if (entry.status == StepStatus::kHang) result.hung = true;
      }
      if (const auto& mismatch = state.manager().lastMismatch()) {
        entry.mismatch = *mismatch;
        state.manager().clearLastMismatch();
      }
      entry.seconds = secondsSince(start);
    }
    entry.expected = expectationMet(step, entry);
    if (env.onStep) env.onStep(entry);
    result.steps.push_back(std::move(entry));
  }
  recorder.setStep(-1);
  result.final = state.finalState();

  // Leak check: an automatic shutdown (collective) when every rank ended cleanly.
  const bool clean = !result.hung && !result.crashed;
  const bool everyone = env.agreeOnShutdown ? env.agreeOnShutdown(clean) : clean;
  LeakCheck& leaks = result.leaks;
  if (everyone) {
    try {
      state.manager().shutdown();
    } catch (const std::exception& error) {
      leaks.shutdownError = error.what();
    }
    leaks.checked = true;
  } else {
    leaks.reason = clean ? "another rank hung or crashed: the automatic shutdown was skipped"
                         : (result.crashed ? "this rank crashed" : "this rank hung") +
                               std::string(": the automatic shutdown was skipped");
  }
  const FinalState after = state.finalState();
  leaks.groups = after.groups;
  leaks.boundGroups = after.boundGroups;
  leaks.runtimeLive = after.runtimeLive;
  leaks.heldBy = state.heldBy();
  const auto& accounting = state.resources().accounting();
  leaks.bytesHeld = accounting.bytesHeld();
  leaks.workspacesHeld = accounting.workspacesHeld();
  leaks.bytesAllocated = accounting.bytesAllocated;
  leaks.workspacesCreated = accounting.workspacesCreated;

  result.timings = state.timings();
  for (const auto& [stage, seconds] : recorder.durations()) {
    result.timings.exchange.push_back(seconds);
  }
  result.flight = recorder.entries();
  result.collectives = env.collective->sequence();
  state.releaseAll();
  return result;
}

}  // namespace hmc::scenario
