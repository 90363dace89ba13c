// The reuse cycle of hmc at one rank (create a module, forward with backward, drop it; every
// cycle after the first reuses the idle workspace) against its floor: the same LibTorch work
// done alone, side by side in one run.
//
// - BM_ReuseCycleFloor: LibTorch only. Per cycle a new 64x64 weight (randn * 0.01, a leaf
//   that requires grad, as ScratchModule's parameter), an 8x64 input that requires grad, a
//   custom autograd Function computing x @ weight (ScratchFn's forward and backward without
//   the workspace), and backward of the sum: what scenarios/reuse-churn.json asks of LibTorch.
// - BM_ReuseCycleModule: hmc::nn::ScratchLinear on a one-rank manager: the same work plus
//   hmc's module (torch::nn::Module, group creation, bind through recycle, retire on drop).
//   With /recorded:1 the manager records every call (docs/record-replay.md): its cost.
// - BM_ReuseCycleFloorPaired: the two above, a cycle of each per iteration, each timed alone:
//   the ratio that holds on a shared machine.
// - BM_ReuseCycleRunner: the scenario runner (hmc-run's per-rank step loop, thread driver,
//   one rank) on a `repeat` of create/forward/drop: adds step dispatch and report
//   bookkeeping. Time per cycle is the counter `cycle` (the set-up and close of the run are
//   amortised over kRunnerCycles). BM_ReuseCycleRunnerPaired: the runner's own cycle timing
//   (what a report gives as repeat/<label>) and a block of floor cycles, alternating.
//
// CPU time is the process's (every thread: the runner's rank is a thread), which the other
// loads of a shared machine disturb less than wall time. Ratio = cycle CPU time / floor CPU
// time; compare medians of --benchmark_repetitions.
//
// The paired benchmarks run on one CPU (the one the benchmark starts on; counter `cpu`), their
// threads too: the CPUs of a virtual machine need not be alike. On the 2-core development
// machine, 2026-12-06, `taskset -c 0` and `-c 1` gave BM_ReuseCycleFloor 65.9 and 67.1 us
// against 108.9 and 104.8 us (the "bimodal" floor of earlier notes), and the runner's rank
// thread, placed on the other CPU than the floor's, read 1.8x the floor.

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/resources/host_resources.hpp"
#include "hmc/scenario/leak_trend.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "hmc/torch/scratch_modules.hpp"

namespace {

constexpr std::int64_t kFeatures = 64;  // the scenario format's defaults
constexpr std::int64_t kBatch = 8;
constexpr int kRunnerCycles = 1000;

struct FloorFn : public torch::autograd::Function<FloorFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return x.matmul(weight);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& grad = grads[0];
    return {grad.matmul(saved[1].t()), saved[0].t().matmul(grad)};
  }
};

// One cycle of the floor: the LibTorch work of a reuse cycle, without hmc.
void floorCycle() {
  torch::Tensor weight = (torch::randn({kFeatures, kFeatures}) * 0.01).requires_grad_(true);
  torch::Tensor x = torch::randn({kBatch, kFeatures}).requires_grad_(true);
  torch::Tensor y = FloorFn::apply(x, weight.to(x.device(), x.scalar_type()));
  y.sum().backward();
  benchmark::DoNotOptimize(weight.grad().data_ptr());
}

void BM_ReuseCycleFloor(benchmark::State& state) {
  hmc::scenario::limitTorchThreads(1);
  for (auto _ : state) floorCycle();
}
BENCHMARK(BM_ReuseCycleFloor)->MeasureProcessCPUTime();

// The median of `values` (0 for none).
double medianOf(std::vector<double> values) {
  if (values.empty()) return 0.0;
  auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// Runs `work` and appends how long it took (nanoseconds, steady clock) to `into`; returns what
// `work` returns.
template <typename Work>
bool timedNs(std::vector<double>& into, Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  const bool ok = work();
  into.push_back(
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
  return ok;
}

// Holds the calling thread (and the threads it starts: they inherit its mask) on the CPU it
// runs on, for a paired benchmark's two halves to run on the same CPU; restores the mask.
class PinnedToThisCpu {
 public:
  explicit PinnedToThisCpu(benchmark::State& state) {
    if (::sched_getaffinity(0, sizeof before_, &before_) != 0) return;
    const int cpu = ::sched_getcpu();
    if (cpu < 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned_ = ::sched_setaffinity(0, sizeof one, &one) == 0;
    state.counters["cpu"] = pinned_ ? cpu : -1;
  }
  ~PinnedToThisCpu() {
    if (pinned_) ::sched_setaffinity(0, sizeof before_, &before_);
  }
  PinnedToThisCpu(const PinnedToThisCpu&) = delete;
  PinnedToThisCpu& operator=(const PinnedToThisCpu&) = delete;

 private:
  cpu_set_t before_{};
  bool pinned_ = false;
};

// Runs `a` and `b` once each per iteration of `state`, which goes first alternating from one
// iteration to the next, so that what disturbs a shared machine falls on both alike (the
// paired benchmarks). When one returns false the benchmark stops with `error`.
template <typename A, typename B>
void alternate(benchmark::State& state, A&& a, B&& b, const char* error) {
  bool bFirst = false;
  for (auto _ : state) {
    const bool ok = bFirst ? b() && a() : a() && b();
    bFirst = !bFirst;
    if (!ok) {
      state.SkipWithError(error);
      break;
    }
  }
}

// One reuse cycle of hmc's module: create, forward and backward, drop (the group turns idle
// and the next cycle's bind reuses it). Returns whether the bind recycled a workspace.
bool reuseCycle(const std::shared_ptr<hmc::lifecycle::ResourceManager>& manager,
                const std::shared_ptr<hmc::resources::RankResources>& resources) {
  hmc::nn::ScratchOptions options;
  options.manager = manager;
  options.resources = resources;
  auto module = std::make_shared<hmc::nn::ScratchLinear>(std::move(options));
  torch::Tensor x = torch::randn({kBatch, kFeatures}).requires_grad_(true);
  torch::Tensor y = module->forward(x);
  y.sum().backward();
  return module->lastBind() && module->lastBind()->reused;
}

// The manager's recording of every lifecycle call (HMC_RECORD), in a folder of its own under
// TMPDIR; ended and removed with this object.
class BenchRecording {
 public:
  explicit BenchRecording(std::shared_ptr<hmc::lifecycle::ResourceManager> manager)
      : manager_(std::move(manager)) {
    const char* tmp = std::getenv("TMPDIR");
    folder_ = fmt::format("{}/hmc-bench-record-{}", tmp ? tmp : "/tmp", ::getpid());
    manager_->setRecorder(hmc::record::openRankRecording(folder_, 0, 1, "torch_bench", 60.0));
  }
  ~BenchRecording() {
    manager_->setRecorder(nullptr);
    std::remove((folder_ + "/" + hmc::record::recordingFileName(0)).c_str());
    ::rmdir(folder_.c_str());
  }
  BenchRecording(const BenchRecording&) = delete;
  BenchRecording& operator=(const BenchRecording&) = delete;

  double bytesPerEvent() const {
    const auto* recorder = manager_->recorder();
    return static_cast<double>(recorder->bytesWritten()) /
           static_cast<double>(std::max<std::uint64_t>(1, recorder->events()));
  }

 private:
  std::shared_ptr<hmc::lifecycle::ResourceManager> manager_;
  std::string folder_;
};

// Arg 1: the manager records every lifecycle call (HMC_RECORD, hmc/record/recording.hpp) to a
// file in TMPDIR; arg 0: no recording. The recording's cost is the ratio of the two.
void BM_ReuseCycleModule(benchmark::State& state) {
  hmc::scenario::limitTorchThreads(1);
  auto manager = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  std::optional<BenchRecording> recording;
  if (state.range(0) != 0) recording.emplace(manager);
  auto resources = std::make_shared<hmc::resources::RankResources>();
  std::int64_t cycles = 0;
  std::int64_t reused = 0;
  for (auto _ : state) {
    ++cycles;
    if (reuseCycle(manager, resources)) ++reused;
  }
  manager->closeGroups();
  state.counters["reused"] = cycles > 0 ? static_cast<double>(reused) / cycles : 0.0;
  state.counters["groups"] = static_cast<double>(manager->groupCount());
  if (recording) state.counters["bytes_per_event"] = recording->bytesPerEvent();
}
BENCHMARK(BM_ReuseCycleModule)->ArgName("recorded")->Arg(0)->Arg(1)->MeasureProcessCPUTime();

// hmc's module against its floor, paired: each iteration runs one floor cycle and one module
// cycle (their order alternates), each timed alone, so that what disturbs a shared machine
// (the floor alone reads 65-70 us or 100-120 us here, by the machine's load) falls on both
// alike. Counters: the median of each (floor_us, module_us) and `ratio`, module / floor: the
// lean issue's goal is at most 1.1. Run with --benchmark_repetitions to see its spread.
void BM_ReuseCycleFloorPaired(benchmark::State& state) {
  const PinnedToThisCpu pinned(state);
  hmc::scenario::limitTorchThreads(1);
  auto manager = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  auto resources = std::make_shared<hmc::resources::RankResources>();
  std::vector<double> floorNs;
  std::vector<double> moduleNs;
  std::int64_t reused = 0;
  alternate(
      state,
      [&] {
        return timedNs(floorNs, [] {
          floorCycle();
          return true;
        });
      },
      [&] {
        return timedNs(moduleNs, [&] {
          reused += reuseCycle(manager, resources) ? 1 : 0;
          return true;
        });
      },
      "");
  manager->closeGroups();
  const double floorMedian = medianOf(floorNs);
  const double moduleMedian = medianOf(moduleNs);
  state.counters["floor_us"] = floorMedian / 1e3;
  state.counters["module_us"] = moduleMedian / 1e3;
  state.counters["ratio"] = floorMedian > 0 ? moduleMedian / floorMedian : 0.0;
  state.counters["reused"] =
      moduleNs.empty() ? 0.0 : static_cast<double>(reused) / static_cast<double>(moduleNs.size());
}
BENCHMARK(BM_ReuseCycleFloorPaired)->MeasureProcessCPUTime();

// The recording's cost, paired: each iteration runs one cycle on a manager that does not
// record and one on a manager that records (their order alternates), each timed alone, so
// that what disturbs a shared machine falls on both alike. Counters: the median cycle of
// each (off_us, on_us) and `cost_pct`, the median on/off ratio's excess in percent.
// Run with --benchmark_repetitions to see its spread.
void BM_RecordingCostPaired(benchmark::State& state) {
  const PinnedToThisCpu pinned(state);
  hmc::scenario::limitTorchThreads(1);
  auto off = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  auto on = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  BenchRecording recording(on);
  auto resources = std::make_shared<hmc::resources::RankResources>();
  std::vector<double> offNs;
  std::vector<double> onNs;
  const auto cycleOn = [&](const std::shared_ptr<hmc::lifecycle::ResourceManager>& manager,
                           std::vector<double>& into) {
    return timedNs(into, [&] {
      benchmark::DoNotOptimize(reuseCycle(manager, resources));
      return true;
    });
  };
  alternate(state, [&] { return cycleOn(off, offNs); }, [&] { return cycleOn(on, onNs); }, "");
  off->closeGroups();
  on->closeGroups();
  const double offMedian = medianOf(offNs);
  const double onMedian = medianOf(onNs);
  state.counters["off_us"] = offMedian / 1e3;
  state.counters["on_us"] = onMedian / 1e3;
  state.counters["cost_pct"] = offMedian > 0 ? (onMedian / offMedian - 1.0) * 100.0 : 0.0;
  state.counters["bytes_per_event"] = recording.bytesPerEvent();
}
BENCHMARK(BM_RecordingCostPaired)->MeasureProcessCPUTime();

// The recording's own work for one reuse cycle, without LibTorch's: the calls a cycle makes (a
// creation of a known specification, the module's type, which a reader infers after the first
// cycle, the binding, the drop) on a real recording. Its time over
// BM_ReuseCycleModule/recorded:0's is the share of the cycle that recording takes.
void BM_RecorderCycleEvents(benchmark::State& state) {
  auto manager = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  BenchRecording recording(manager);
  hmc::record::Recorder& recorder = *manager->recorder();
  // As ScratchLinear's: its specification's text, the same as its compatibility key.
  const nlohmann::json specification = nlohmann::json{
      {"type", "scratch_linear"},
      {"features", kFeatures},
      {"workspace_bytes",
       kFeatures * kFeatures * 4}}.dump();
  const nlohmann::json& compatibility = specification;
  const nlohmann::json scope = nullptr;
  for (auto _ : state) {
    const std::int32_t index = recorder.create("", specification, compatibility, scope);
    if (!recorder.typeKnown(index)) recorder.setType(index, "hmc.nn", "ScratchLinear");
    recorder.bound(index, std::chrono::nanoseconds(1500), "cpu", "float32", true);
    recorder.append(hmc::record::EventOp::kDrop, index, hmc::record::Outcome::kOk,
                    std::chrono::nanoseconds(0));
  }
  state.counters["bytes_per_event"] = recording.bytesPerEvent();
}
// A million cycles (3 events of 38 bytes on average each) stay under the default cap of 256 MiB.
BENCHMARK(BM_RecorderCycleEvents)->Iterations(1000000);

// The runner's scenario: kRunnerCycles reuse cycles on one rank, then a check and close_all.
std::string reuseCycleScenarioText() {
  return fmt::format(R"({{
    "format": "hmc-scenario/1", "name": "reuse-cycle-bench", "world_size": 1, "device": "cpu",
    "dtype": "float32", "timeout_s": 60,
    "steps": [
      {{"op": "repeat", "count": {}, "label": "cycles", "steps": [
        {{"op": "create", "module": "m"}},
        {{"op": "forward", "module": "m"}},
        {{"op": "drop", "module": "m"}}
      ]}},
      {{"op": "check", "groups": 1, "bound_groups": 1, "runtime_live": true}},
      {{"op": "close_all"}}
    ]}})",
                     kRunnerCycles);
}

constexpr const char* kRunnerFailed = "the reuse-cycle scenario did not pass on its one rank";

// Whether the runner's scenario passed: one rank, neither crashed nor hung, every step ok.
bool passedOnOneRank(const std::vector<hmc::scenario::RankResult>& ranks) {
  if (ranks.size() != 1 || ranks[0].crashed || ranks[0].hung) return false;
  return std::all_of(ranks[0].steps.begin(), ranks[0].steps.end(), [](const auto& step) {
    return step.status == hmc::scenario::StepStatus::kOk;
  });
}

void BM_ReuseCycleRunner(benchmark::State& state) {
  const auto scenario = hmc::scenario::parseScenarioText(reuseCycleScenarioText(),
                                                         "<torch_bench>");
  hmc::scenario::limitTorchThreads(1);
  for (auto _ : state) {
    if (!passedOnOneRank(hmc::scenario::runOnThreads(scenario))) {
      state.SkipWithError(kRunnerFailed);
      break;
    }
  }
  state.counters["cycle"] = benchmark::Counter(
      kRunnerCycles, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ReuseCycleRunner)->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);

// hmc-run's own cycle timing against the floor, paired: each iteration runs kRunnerCycles
// floor cycles (timed as a block) and the runner's scenario (its `repeat` step's seconds over
// its cycles: the per-cycle time a report gives as repeat/<label>), their order alternating.
// Counters: the median per cycle of each (floor_us, runner_us) and `ratio`, runner / floor.
void BM_ReuseCycleRunnerPaired(benchmark::State& state) {
  const PinnedToThisCpu pinned(state);
  const auto scenario = hmc::scenario::parseScenarioText(reuseCycleScenarioText(),
                                                         "<torch_bench>");
  hmc::scenario::limitTorchThreads(1);
  std::vector<double> floorBlockNs;
  std::vector<double> runnerCycleNs;
  const auto floorBlock = [&] {
    return timedNs(floorBlockNs, [] {
      for (int cycle = 0; cycle < kRunnerCycles; ++cycle) floorCycle();
      return true;
    });
  };
  const auto runner = [&] {
    const auto ranks = hmc::scenario::runOnThreads(scenario);
    if (!passedOnOneRank(ranks)) return false;
    runnerCycleNs.push_back(ranks[0].steps[0].seconds * 1e9 / kRunnerCycles);
    return true;
  };
  alternate(state, floorBlock, runner, kRunnerFailed);
  const double floorMedian = medianOf(floorBlockNs) / kRunnerCycles;
  const double runnerMedian = medianOf(runnerCycleNs);
  state.counters["floor_us"] = floorMedian / 1e3;
  state.counters["runner_us"] = runnerMedian / 1e3;
  state.counters["ratio"] = floorMedian > 0 ? runnerMedian / floorMedian : 0.0;
}
BENCHMARK(BM_ReuseCycleRunnerPaired)
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

// One cycle of the leak-trend check as hmc-run runs it on thread ranks: a repetition of a short
// scenario (2 ranks: create, forward, close_all) and the report builder taking it, with the
// process sampled at its end (arg 1: what every run does) or not (arg 0: the baseline). Run
// side by side: --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true.
void BM_LeakTrendCycle(benchmark::State& state) {
  const auto scenario = hmc::scenario::parseScenarioText(R"({
    "format": "hmc-scenario/1", "name": "leak-trend-cycle", "world_size": 2, "device": "cpu",
    "timeout_s": 60, "leak_trend": "any",
    "steps": [
      {"op": "create", "module": "m", "features": 16},
      {"op": "forward", "module": "m", "batch": 2},
      {"op": "close_all"}
    ]})",
                                                         "<torch_bench>");
  hmc::scenario::limitTorchThreads(1);
  hmc::scenario::ThreadRunOptions options;
  options.sampleProcess = state.range(0) != 0;
  hmc::scenario::ReportBuilder builder(scenario, 1);
  for (auto _ : state) {
    auto ranks = hmc::scenario::runOnThreads(scenario, options);
    if (ranks[0].crashed || ranks[0].hung || ranks[1].crashed || ranks[1].hung) {
      state.SkipWithError("the cycle did not pass");
      break;
    }
    if (state.range(1) != 0) builder.add(std::move(ranks));
  }
  state.SetLabel(options.sampleProcess ? "sampled" : "not sampled");
}
// One sample of this process (resident memory, descriptors, threads): what a cycle pays.
void BM_SampleProcess(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(hmc::scenario::sampleProcess());
}
BENCHMARK(BM_SampleProcess)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_LeakTrendCycle)
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({0, 0})
    ->Args({1, 0})
    ->MeasureProcessCPUTime()
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
