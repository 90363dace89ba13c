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
// - BM_ReuseCycleRunner: the scenario runner (hmc-run's per-rank step loop, thread driver,
//   one rank) on a `repeat` of create/forward/drop: adds step dispatch and report
//   bookkeeping. Time per cycle is the counter `cycle` (the set-up and close of the run are
//   amortised over kRunnerCycles).
//
// CPU time is the process's (every thread: the runner's rank is a thread), which the other
// loads of a shared machine disturb less than wall time. Ratio = cycle CPU time / floor CPU
// time; compare medians of --benchmark_repetitions.

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

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

void BM_ReuseCycleFloor(benchmark::State& state) {
  hmc::scenario::limitTorchThreads(1);
  for (auto _ : state) {
    torch::Tensor weight = (torch::randn({kFeatures, kFeatures}) * 0.01).requires_grad_(true);
    torch::Tensor x = torch::randn({kBatch, kFeatures}).requires_grad_(true);
    torch::Tensor y = FloorFn::apply(x, weight.to(x.device(), x.scalar_type()));
    y.sum().backward();
    benchmark::DoNotOptimize(weight.grad().data_ptr());
  }
}
BENCHMARK(BM_ReuseCycleFloor)->MeasureProcessCPUTime();

// Arg 1: the manager records every lifecycle call (HMC_RECORD, hmc/record/recording.hpp) to a
// file in TMPDIR; arg 0: no recording. The recording's cost is the ratio of the two.
void BM_ReuseCycleModule(benchmark::State& state) {
  hmc::scenario::limitTorchThreads(1);
  auto manager = std::make_shared<hmc::lifecycle::ResourceManager>(
      std::make_shared<hmc::collective::LocalCollective>());
  std::string folder;
  if (state.range(0) != 0) {
    const char* tmp = std::getenv("TMPDIR");
    folder = fmt::format("{}/hmc-bench-record-{}", tmp ? tmp : "/tmp", ::getpid());
    manager->setRecorder(hmc::record::openRankRecording(folder, 0, 1, "torch_bench", 60.0));
  }
  auto resources = std::make_shared<hmc::resources::RankResources>();
  std::int64_t cycles = 0;
  std::int64_t reused = 0;
  for (auto _ : state) {
    hmc::nn::ScratchOptions options;
    options.manager = manager;
    options.resources = resources;
    auto module = std::make_shared<hmc::nn::ScratchLinear>(std::move(options));
    torch::Tensor x = torch::randn({kBatch, kFeatures}).requires_grad_(true);
    torch::Tensor y = module->forward(x);
    y.sum().backward();
    ++cycles;
    if (module->lastBind() && module->lastBind()->reused) ++reused;
    module.reset();  // drop: the group turns idle and the next cycle's bind reuses it
  }
  manager->closeGroups();
  state.counters["reused"] = cycles > 0 ? static_cast<double>(reused) / cycles : 0.0;
  state.counters["groups"] = static_cast<double>(manager->groupCount());
  if (hmc::record::Recorder* recorder = manager->recorder()) {
    state.counters["bytes_per_event"] =
        static_cast<double>(recorder->bytesWritten()) / std::max<std::uint64_t>(1, recorder->events());
    manager->setRecorder(nullptr);
    std::remove((folder + "/" + hmc::record::recordingFileName(0)).c_str());
    ::rmdir(folder.c_str());
  }
}
BENCHMARK(BM_ReuseCycleModule)->ArgName("recorded")->Arg(0)->Arg(1)->MeasureProcessCPUTime();

void BM_ReuseCycleRunner(benchmark::State& state) {
  const std::string text = fmt::format(R"({{
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
  const auto scenario = hmc::scenario::parseScenarioText(text, "<torch_bench>");
  hmc::scenario::limitTorchThreads(1);
  for (auto _ : state) {
    const auto ranks = hmc::scenario::runOnThreads(scenario);
    bool ok = ranks.size() == 1 && !ranks[0].crashed && !ranks[0].hung;
    for (const auto& step : ok ? ranks[0].steps : std::vector<hmc::scenario::StepResult>{}) {
      ok = ok && step.status == hmc::scenario::StepStatus::kOk;
    }
    if (!ok) {
      state.SkipWithError("the reuse-cycle scenario did not pass on its one rank");
      break;
    }
  }
  state.counters["cycle"] = benchmark::Counter(
      kRunnerCycles, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ReuseCycleRunner)->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);

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

BENCHMARK(BM_LeakTrendCycle)->Args({0, 1})->Args({1, 1})->Args({0, 0})->Args({1, 0})->MeasureProcessCPUTime()->UseRealTime()->Unit(
    benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
