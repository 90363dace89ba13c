#include "hmc/scenario/runner.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/version.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>

#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/log.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/host_resources.hpp"
#include "hmc/torch/dtype.hpp"
#include "hmc/torch/scratch_modules.hpp"
#if HMC_HAVE_CUDA
#include "hmc/resources/cuda_workspace.hpp"
#include "hmc/resources/nccl_runtime.hpp"
#endif

namespace hmc::scenario {
namespace {

// What `leak` faults keep, for the life of the process (the seeded leak of the leak-trend
// check): touched memory (so that it is resident) from the C allocator or mapped on its own,
// descriptors of /dev/null, and threads that wait for the process to end. Thread-safe: thread
// ranks share it.
class LeakPit {
 public:
  void keep(LeakResource resource, std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    switch (resource) {
      case LeakResource::kMemory: {
        auto block = std::make_unique<char[]>(static_cast<std::size_t>(bytes));
        std::memset(block.get(), 0x5a, static_cast<std::size_t>(bytes));
        memory_.push_back(std::move(block));
        break;
      }
      case LeakResource::kMapped: {
        // Whole pages; never unmapped.
        const auto length = static_cast<std::size_t>(bytes);
        void* pages =
            ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages == MAP_FAILED) {
          throw RuntimeError(fmt::format("fault leak: cannot map {} bytes: {}", bytes,
                                         std::system_category().message(errno)));
        }
        std::memset(pages, 0x5a, length);
        break;
      }
      case LeakResource::kDescriptor: {
        const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
          throw RuntimeError(fmt::format("fault leak: cannot open /dev/null: {}",
                                         std::system_category().message(errno)));
        }
        descriptors_.push_back(fd);
        break;
      }
      case LeakResource::kThread:
        // Sleeps until the process ends. (Waiting on a static condition variable instead hung
        // the process's exit: glibc's destructor of a condition variable waits for its waiters.)
        std::thread([] {
          for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
        }).detach();
        break;
    }
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<char[]>> memory_;
  std::vector<int> descriptors_;
};

LeakPit& leakPit() {
  static auto* pit = new LeakPit();  // never destroyed: what it keeps stays to the end
  return *pit;
}

using Clock = collective::Clock;

std::string pythonBool(bool value) { return value ? "True" : "False"; }

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool stepsUseCuda(const std::vector<Step>& steps) {
  return std::any_of(steps.begin(), steps.end(), [](const Step& step) {
    return step.device == Device::kCuda || stepsUseCuda(step.steps);
  });
}

// The CUDA device of `rank`: one GPU per rank while there are enough, shared beyond.
int cudaDeviceOf(int rank) {
  const auto count = static_cast<int>(torch::cuda::device_count());
  return count > 0 ? rank % count : 0;
}

#if HMC_HAVE_CUDA
// The rank's NCCL runtime for CUDA bindings (RankResources::setNcclRuntimeFactory): one
// communicator over the world when every rank has its own GPU; none for one rank, or for
// more ranks than GPUs (they share the GPU for workspaces and use the collective's own
// transport for control, as without NCCL).
resources::NcclRuntimeFactory ncclFactoryFor(std::shared_ptr<collective::Collective> collective) {
  return [collective](int device) -> std::shared_ptr<resources::NcclRuntime> {
    const int world = collective->worldSize();
    if (world < 2) return nullptr;
    const auto devices = static_cast<int>(torch::cuda::device_count());
    if (world > devices) {
      if (collective->rank() == 0) {
        logger()->info(
            "{} ranks on {} GPUs: no NCCL runtime (one GPU holds one NCCL rank); the "
            "ranks share the GPUs for workspaces and use the {} transport for control",
            world, devices, collective->transportName());
      }
      return nullptr;
    }
    resources::NcclRuntimeOptions options;
    options.device = device;
    options.initTimeout = collective->timeout();
    options.releaseTimeout = collective->timeout();
    options.operationTimeout = collective->timeout();
    return std::make_shared<resources::NcclRuntime>(collective, options);
  };
}
#endif

// One rank's live objects while the steps run.
class RankState {
 public:
  RankState(const Scenario& scenario, RankEnvironment& env)
      : scenario_(scenario),
        env_(env),
        rank_(env.collective->rank()),
        manager_(std::make_shared<lifecycle::ResourceManager>(env.collective)),
        resources_(std::make_shared<resources::RankResources>()) {
    resources_->setRank(rank_);
    manager_->setRecorder(env.recording);
#if HMC_HAVE_CUDA
    resources_->setNcclRuntimeFactory(ncclFactoryFor(env.collective));
#endif
  }

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
    record::Recorder* recording = manager_->recorder();
    if (recording != nullptr && step.op != Op::kRepeat) {
      recording->expect(toString(step.expect), step.expectError);
    }
    for (int i = 0; i < step.repeat; ++i) runOnce(step, entry);
    if (recording != nullptr) recording->expect("ok", std::nullopt);
  }

  void releaseAll() {
    pending_.clear();
    modules_.clear();
  }

  std::vector<HeldWorkspace> heldBy() const {
    std::vector<HeldWorkspace> out;
    for (const auto& group : manager_->groups()) {
      if (!group->resources) continue;
      const auto* workspace = dynamic_cast<const resources::Workspace*>(group->resources.get());
      HeldWorkspace held;
      held.bindingId = group->bindingId;
      for (const auto& [name, module] : modules_) {
        if (module->resourceGroup() == group) held.module = name;
      }
      held.bytes = workspace ? static_cast<std::int64_t>(workspace->nbytes()) : 0;
      held.pendingBackward = workspace ? static_cast<std::int64_t>(workspace->pending()) : 0;
      held.closing = group->closing;
#if HMC_HAVE_CUDA
      if (const auto* cuda = dynamic_cast<const resources::CudaWorkspace*>(workspace)) {
        held.device = fmt::format("cuda:{}", cuda->device());
      }
#endif
      out.push_back(std::move(held));
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
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(cudaDeviceOf(rank_)));
  }

  // A forward of a fresh input (its dtype and device), its bind's timing, and its backward now
  // or pending (backward: false, until a backward step).
  void runForward(const Step& step, StepResult* entry) {
    auto& module = live(step.module);
    const std::string dtypeName = step.dtype.value_or(scenario_.dtype);
    const auto dtype = nn::dtypeFromName(dtypeName);
    if (!dtype) throw ValueError(fmt::format("{}: unknown dtype '{}'", step.path, dtypeName));
    auto x = torch::randn({step.batch, module->features()},
                          torch::TensorOptions().dtype(*dtype).device(resolveDevice(step)))
                 .requires_grad_(true);
    torch::Tensor y = module->forward(x);
    waitForDeviceWork(*module, step);
    if (const auto& bind = module->lastBind()) {
      const double seconds = bind->seconds.count();
      (bind->reused ? timings_.reusedBind : timings_.freshBind).push_back(seconds);
      if (entry != nullptr) {
        entry->bind =
            BindInfo{static_cast<std::int64_t>(bind->bindingId), bind->reused, seconds};
      }
    }
    if (step.backward) {
      y.sum().backward();
    } else {
      pending_[step.module].push_back(std::move(y));
      if (record::Recorder* recording = manager_->recorder()) {
        recording->append(record::EventOp::kPending, module->recordIndex(),
                          record::Outcome::kOk, std::chrono::nanoseconds(0));
      }
    }
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
        options.name = step.module;
        modules_[step.module] = nn::makeScratchModule(step.type, std::move(options));
        break;
      }
      case Op::kShare: {
        std::vector<nn::MulticoreModule*> members;
        for (const auto& name : step.modules) members.push_back(live(name).get());
        nn::MulticoreModule::shareExecutionResources(members);
        break;
      }
      case Op::kForward:
        runForward(step, entry);
        break;
      case Op::kBackward: {
        auto it = pending_.find(step.module);
        if (it == pending_.end()) break;
        const std::int32_t index = live(step.module)->recordIndex();
        std::vector<torch::Tensor> outputs = std::move(it->second);
        pending_.erase(it);
        record::recordCall(manager_->recorder(), record::EventOp::kBackward, index, [&] {
          for (auto& y : outputs) y.sum().backward();
        });
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
      case Op::kCheck:
        record::recordCall(manager_->recorder(), record::EventOp::kCheck, -1,
                           [&] { runCheck(step); }, checkDetail(step));
        break;
      case Op::kFault:
        if (step.faultKind == FaultKind::kCrash && manager_->recorder()) {
          // Recorded first: the process exits (a thread rank unwinds) inside.
          manager_->recorder()->append(record::EventOp::kFault, -1, record::Outcome::kOk,
                                       std::chrono::nanoseconds(0), faultDetail(step));
          runFault(step);
          break;
        }
        record::recordCall(manager_->recorder(), record::EventOp::kFault,
                           step.module.empty() ? -1 : live(step.module)->recordIndex(),
                           [&] { runFault(step); }, faultDetail(step));
        break;
      case Op::kBarrier:
        record::recordCall(manager_->recorder(), record::EventOp::kBarrier, -1,
                           [&] { env_.collective->barrier(); });
        break;
      case Op::kSleep:
        record::recordCall(
            manager_->recorder(), record::EventOp::kSleep, -1,
            [&] { std::this_thread::sleep_for(std::chrono::duration<double>(step.seconds)); },
            {{"seconds", step.seconds}});
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

  static nlohmann::json checkDetail(const Step& step) {
    nlohmann::json detail = nlohmann::json::object();
    if (step.groups) detail["groups"] = *step.groups;
    if (step.boundGroups) detail["bound_groups"] = *step.boundGroups;
    if (step.runtimeLive) detail["runtime_live"] = *step.runtimeLive;
    return detail;
  }

  static nlohmann::json faultDetail(const Step& step) {
    nlohmann::json detail = {{"fault", toString(step.faultKind)}};
    switch (step.faultKind) {
      case FaultKind::kCloseError:
      case FaultKind::kReleaseError:
        detail["count"] = step.faultCount;
        break;
      case FaultKind::kBusy:
        detail["busy"] = step.busy;
        break;
      case FaultKind::kStall:
        detail["seconds"] = step.seconds;
        break;
      case FaultKind::kCrash:
        break;
      case FaultKind::kLeak:
        detail["resource"] = toString(step.leakResource);
        if (step.leakResource == LeakResource::kMemory ||
            step.leakResource == LeakResource::kMapped) {
          detail["bytes"] = step.leakBytes;
        }
        break;
    }
    return detail;
  }

  void runCheck(const Step& step) {
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
  }

  // A forward on CUDA returns with its work queued; the step waits for it (bounded by the
  // scenario's timeout), as a host forward is done when it returns, so that the next bind
  // finds the workspace idle and reuse does not depend on GPU timing.
  void waitForDeviceWork(const nn::ScratchModule& module, const Step& step) const {
#if HMC_HAVE_CUDA
    const resources::CudaWorkspace* workspace = module.cudaWorkspace();
    if (workspace == nullptr) return;
    const auto deadline = Clock::now() + scenario_.timeout();
    auto pause = std::chrono::microseconds(5);
    while (workspace->inFlight()) {
      if (Clock::now() >= deadline) {
        throw TimeoutError(
            fmt::format("{}: the forward's GPU work on rank {} did not finish within {} s (an NCCL "
                        "all-reduce waiting for a rank that does not run this forward?)",
                        step.path, rank_, scenario_.timeoutS));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
#else
    (void)module;
    (void)step;
#endif
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
      case FaultKind::kLeak:
        leakPit().keep(step.leakResource, step.leakBytes);
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
  return !step.ranks ||
         std::find(step.ranks->begin(), step.ranks->end(), rank) != step.ranks->end();
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
  entry.error = StepError{kind, std::move(message)};
  entry.status = (kind == ErrorKind::kTimeout || kind == ErrorKind::kRankFailure)
                     ? StepStatus::kHang
                     : StepStatus::kError;
}

}  // namespace

void limitTorchThreads(int threads) {
  // LibTorch's pool (libpthreadpool) does not check pthread_create: with no thread left under
  // this user's limit it waits for its workers for good (a rank process run as a user with
  // `ulimit -u` reached hung until hmc-run killed it). One thread started and joined first
  // turns that into an error; a limit reached between the two still hangs there.
  try {
    std::thread([] {}).join();
  } catch (const std::system_error& error) {
    throw RuntimeError(fmt::format(
        "this process cannot start a thread ({}), which LibTorch's thread pool needs: the "
        "limit on this user's processes and threads (ulimit -u) or the cgroup's pids.max is "
        "reached; raise it, or run fewer ranks",
        error.code().message()));
  }
  at::set_num_threads(std::max(1, threads));
}

std::string resolvedDeviceName(Device device) {
  if (device == Device::kAuto) return torch::cuda::is_available() ? "cuda" : "cpu";
  return std::string(toString(device));
}

bool usesCuda(const Scenario& scenario) {
  if (scenario.device == Device::kCuda || stepsUseCuda(scenario.steps)) return true;
  return scenario.device == Device::kAuto && torch::cuda::is_available();
}

std::string cudaUnusableReason() {
  if (torch::cuda::is_available()) return "";
  const resources::DeviceProbe probe = resources::cudaDeviceUsable();
  if (!probe) return probe.reason;
  return fmt::format(
      "no usable CUDA device: the CUDA runtime sees {} device(s), but LibTorch {} has no CUDA "
      "(a CPU-only build)",
      probe.deviceCount, TORCH_VERSION);
}

std::string torchVersion() { return TORCH_VERSION; }

std::function<void()> saveCpuGeneratorState() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  return [generator, state]() mutable {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  };
}

bool expectationMet(const Step& step, const StepResult& result) {
  if (result.status == StepStatus::kSkipped || result.status == StepStatus::kNotRun) return true;
  switch (step.expect) {
    case Expect::kAny:
      return true;
    case Expect::kError:
      return result.status == StepStatus::kError && result.error &&
             result.error->message.find(step.expectError.value_or("")) != std::string::npos;
    case Expect::kOk:
      return result.status == StepStatus::kOk;
    case Expect::kHang:
      return result.status == StepStatus::kHang;
  }
  return false;
}

namespace {

// Device leak accounting of a rank whose inputs are on CUDA: the free device memory before,
// and the registry's handles that exist already (a transport's own), which the run does not
// answer for.
class DeviceLeakProbe {
 public:
  DeviceLeakProbe(const Scenario& scenario, int rank) : rank_(rank) {
    if (!usesCuda(scenario) || !torch::cuda::is_available()) return;
    check_.emplace();
    check_->device = cudaDeviceOf(rank);
    try {
      const resources::DeviceMemoryInfo info = resources::deviceMemoryInfo(check_->device);
      check_->freeBytesBefore = info.freeBytes;
      check_->totalBytes = info.totalBytes;
    } catch (const std::exception& error) {
      check_->memoryInfoError = error.what();
    }
    for (const auto& record : resources::DeviceRegistry::instance().snapshot().live) {
      handlesBefore_.push_back(record.id);
    }
  }

  // What the run left on the device after the shutdown; nullopt on CPU runs.
  std::optional<DeviceLeakCheck> finish(const resources::RankResources& resources) {
    if (!check_) return std::nullopt;
    DeviceLeakCheck device = std::move(*check_);
    try {
      device.freeBytesAfter = resources::deviceMemoryInfo(device.device).freeBytes;
    } catch (const std::exception& error) {
      device.memoryInfoError = error.what();
    }
    const auto& accounting = resources.accounting();
    device.bytesAllocated = accounting.deviceBytesAllocated;
    device.bytesHeld = accounting.deviceBytesHeld();
    device.streamsHeld = accounting.streamsHeld();
    device.eventsHeld = accounting.eventsHeld();
    const std::string prefix = fmt::format("rank {} ", rank_);
    for (const auto& record : resources::DeviceRegistry::instance().snapshot().live) {
      if (record.owner.rfind(prefix, 0) != 0 ||
          std::find(handlesBefore_.begin(), handlesBefore_.end(), record.id) !=
              handlesBefore_.end()) {
        continue;
      }
      if (record.kind == resources::DeviceHandleKind::kCommunicator) ++device.communicatorsHeld;
      device.live.push_back(LiveDeviceHandle{std::string(resources::toString(record.kind)),
                                             record.device, static_cast<std::int64_t>(record.bytes),
                                             record.owner});
    }
    return device;
  }

 private:
  int rank_;
  std::optional<DeviceLeakCheck> check_;
  std::vector<std::uint64_t> handlesBefore_;
};

// Runs top-level step `index` on this rank (or records why it did not run).
StepResult runStep(const Scenario& scenario, int index, RankState& state, RankResult& result,
                   diagnostics::FlightRecorder& recorder, const RankEnvironment& env) {
  const Step& step = scenario.steps[index];
  StepResult entry;
  entry.index = index;
  entry.op = step.op;
  if (!step.module.empty()) entry.module = step.module;
  entry.label = step.label;
  if (!inRanks(step, result.rank)) {
    entry.status = StepStatus::kSkipped;
  } else if (result.hung || result.crashed) {
    entry.status = StepStatus::kNotRun;
  } else {
    recorder.setStep(index);
    const auto start = Clock::now();
    entry.startS = std::chrono::duration<double>(start - env.epoch).count();
    const std::uint64_t before = env.collective->sequence();
    try {
      state.run(step, &entry);
      entry.status = StepStatus::kOk;
    } catch (const RankCrashed&) {
      result.crashed = true;
      result.crashReason = "fault crash at step " + std::to_string(index);
      entry.status = StepStatus::kOk;  // it did what it was asked to
    } catch (const std::exception& error) {
      recordError(entry, error);
      const auto where = state.manager().describeFailure(toString(step.op), error, before);
      entry.error->stage = where.stage;
      entry.error->sequence = where.sequence;
      entry.error->collectivesBefore = before;
      if (entry.status == StepStatus::kHang) result.hung = true;
    }
    if (const auto& mismatch = state.manager().lastMismatch()) {
      entry.mismatch = *mismatch;
      state.manager().clearLastMismatch();
    }
    entry.seconds = secondsSince(start);
  }
  entry.expected = expectationMet(step, entry);
  return entry;
}

// The leak check: an automatic shutdown (collective) when every rank ended cleanly, then
// what is left.
LeakCheck checkLeaks(RankState& state, const RankResult& result, const RankEnvironment& env,
                     DeviceLeakProbe& device) {
  LeakCheck leaks;
  const bool clean = !result.hung && !result.crashed;
  const bool everyone = env.agreeOnShutdown ? env.agreeOnShutdown(clean) : clean;
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
  leaks.device = device.finish(state.resources());
  return leaks;
}

}  // namespace

RankResult runRank(const Scenario& scenario, RankEnvironment& env) {
  const auto began = collective::Clock::now();
  RankResult result;
  result.rank = env.collective->rank();
  result.host = hostName();
  result.pid = processId();
  const auto recorderPtr =
      env.recorder ? env.recorder
                   : std::make_shared<diagnostics::FlightRecorder>(env.flightCapacity, env.epoch);
  diagnostics::FlightRecorder& recorder = *recorderPtr;
  env.collective->setObserver(&recorder);
  struct Detach {
    collective::Collective& c;
    ~Detach() { c.setObserver(nullptr); }
  } detach{*env.collective};

  RankState state(scenario, env);
  DeviceLeakProbe device(scenario, result.rank);
  for (int index = 0; index < static_cast<int>(scenario.steps.size()); ++index) {
    StepResult entry = runStep(scenario, index, state, result, recorder, env);
    if (env.onStep) env.onStep(entry);
    result.steps.push_back(std::move(entry));
  }
  recorder.setStep(-1);
  // What follows (the automatic shutdown, the modules' release) is the runner's, not a step's.
  if (env.recording) {
    env.recording->end();
    state.manager().setRecorder(nullptr);
  }
  result.final = state.finalState();
  result.leaks = checkLeaks(state, result, env, device);
  result.timings = state.timings();
  for (const auto& [stage, seconds] : recorder.durations()) {
    result.timings.collectives[stage].push_back(seconds);
  }
  result.flight = recorder.entries();
  result.collectives = env.collective->sequence();
  state.releaseAll();
  // What the process holds once everything of this run is released (a cycle of the
  // leak-trend check).
  if (env.sampleProcess) {
    result.process = sampleProcessEvery(collective::Clock::now() - began, env.sampleHeap);
  }
  return result;
}

}  // namespace hmc::scenario
