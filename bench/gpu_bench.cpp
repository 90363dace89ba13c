// GPU benchmarks (built with HMC_HAVE_CUDA): fresh against reused binds of CUDA workspaces,
// and exchange latency over NCCL against the store.
//
//   BM_FreshBind/<bytes>   a bind that allocates: cudaMalloc + first touch of the workspace
//   BM_ReusedBind/<bytes>  a bind that takes the idle workspace of a dropped compatible module
//     Both through the real path (ScratchLinear::forward on a CUDA tensor, one rank), timed
//     as the manager's bind (MulticoreModule::lastBind), for 1 MiB, 256 MiB and 1 GiB,
//     side by side. Goal: a reused 1 GiB bind at least 100x faster than a fresh one.
//   BM_NcclExchange/<ranks>/<bytes>   the `nccl` transport, ranks as threads, one GPU each
//   BM_StoreExchange/<ranks>/<bytes>  the `store` transport, ranks as threads, loopback
//
//   gpu_bench --benchmark_out=gpu-bench.json --benchmark_out_format=json
//
// Where no CUDA device is usable every benchmark is skipped with
// "no usable CUDA device: ..." (error_occurred in the JSON), never a crash.

#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/nccl_transport.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/threads_transport.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/cuda_workspace.hpp"
#include "hmc/resources/host_resources.hpp"
#include "hmc/torch/scratch_modules.hpp"

using namespace std::chrono_literals;
using hmc::collective::Bytes;
using hmc::collective::Collective;

namespace {

constexpr auto kTimeout = 120s;
constexpr std::int64_t kFeatures = 64;

// "" when benchmarks can use CUDA tensors, else why not.
const std::string& noDevice() {
  static const std::string reason = [] {
    const hmc::resources::DeviceProbe probe = hmc::resources::cudaDeviceUsable();
    if (!probe) return probe.reason;
    if (!torch::cuda::is_available()) {
      return std::string("no usable CUDA device: LibTorch was built without CUDA");
    }
    return std::string();
  }();
  return reason;
}

int deviceCount() { return static_cast<int>(torch::cuda::device_count()); }

// One rank's lifecycle environment: a manager over a one-rank world and its resources.
struct BindRank {
  std::shared_ptr<hmc::lifecycle::ResourceManager> manager =
      std::make_shared<hmc::lifecycle::ResourceManager>(
          std::make_shared<hmc::collective::LocalCollective>(kTimeout));
  std::shared_ptr<hmc::resources::RankResources> resources =
      std::make_shared<hmc::resources::RankResources>();
  torch::Tensor input = torch::randn({8, kFeatures}, torch::TensorOptions().device(torch::kCUDA));

  std::shared_ptr<hmc::nn::ScratchLinear> module(std::int64_t bytes, const std::string& compat) {
    hmc::nn::ScratchOptions options;
    options.features = kFeatures;
    options.workspaceBytes = bytes;
    options.compat = compat;
    options.manager = manager;
    options.resources = resources;
    return std::make_shared<hmc::nn::ScratchLinear>(options);
  }

  // Forward, wait for its GPU work, return the bind's seconds (or -1 when it did not bind).
  double bind(hmc::nn::ScratchLinear& linear) {
    torch::Tensor out = linear.forward(input);
    if (const hmc::resources::CudaWorkspace* workspace = linear.cudaWorkspace()) {
      while (workspace->inFlight()) std::this_thread::yield();
    }
    const auto& info = linear.lastBind();
    return info ? info->seconds.count() : -1.0;
  }

  ~BindRank() {
    try {
      manager->shutdown();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "# shutdown failed: %s\n", error.what());
    }
  }
};

void BM_FreshBind(benchmark::State& state) {
  if (!noDevice().empty()) {
    state.SkipWithError(noDevice().c_str());
    return;
  }
  const std::int64_t bytes = state.range(0);
  BindRank rank;
  for (auto _ : state) {
    auto linear = rank.module(bytes, "fresh");
    const double seconds = rank.bind(*linear);
    state.SetIterationTime(seconds);
    // Closed outside the measured bind: the next bind allocates again.
    linear->close();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["workspace_bytes"] = static_cast<double>(bytes);
}

void BM_ReusedBind(benchmark::State& state) {
  if (!noDevice().empty()) {
    state.SkipWithError(noDevice().c_str());
    return;
  }
  const std::int64_t bytes = state.range(0);
  BindRank rank;
  {
    auto first = rank.module(bytes, "reused");
    rank.bind(*first);  // the one allocation; dropped here, its workspace stays idle
  }
  for (auto _ : state) {
    auto linear = rank.module(bytes, "reused");
    const double seconds = rank.bind(*linear);
    if (!linear->lastBind() || !linear->lastBind()->reused) {
      state.SkipWithError("the bind did not reuse the idle workspace");
      break;
    }
    state.SetIterationTime(seconds);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["workspace_bytes"] = static_cast<double>(bytes);
}

void bindSizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes")->Arg(1 << 20)->Arg(256 << 20)->Arg(std::int64_t{1} << 30);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_FreshBind)->Apply(bindSizes);
BENCHMARK(BM_ReusedBind)->Apply(bindSizes);

// A world of thread ranks kept for the whole run (setting one up costs far more than an
// exchange); rank 0 drives, the peers exchange until its payload says "stop".
struct ExchangeWorld {
  std::shared_ptr<Collective> rank0;
  std::vector<std::thread> peers;
  std::string error;

  ~ExchangeWorld() {
    if (rank0) {
      try {
        rank0->exchange("bench", "stop");
      } catch (const std::exception& failure) {
        std::fprintf(stderr, "# stopping peers failed: %s\n", failure.what());
      }
    }
    for (auto& peer : peers) peer.join();
    rank0.reset();
  }
};

// Builds rank `rank` of a `kind` world ("nccl" over a threads bootstrap, or "store").
std::shared_ptr<Collective> connect(const std::string& kind, int rank, int world, int port,
                                    const std::shared_ptr<hmc::collective::ThreadWorld>& threads) {
  if (kind == "store") {
    hmc::collective::StoreTransportOptions store;
    store.port = port;
    store.rank = rank;
    store.worldSize = world;
    store.timeout = kTimeout;
    return std::make_shared<hmc::collective::StoreTransport>(store);
  }
  hmc::collective::NcclTransportOptions nccl;
  nccl.bootstrap = threads->collective(rank, kTimeout);
  nccl.device = rank;
  nccl.timeout = kTimeout;
  return std::make_shared<hmc::collective::NcclTransport>(nccl);
}

ExchangeWorld& exchangeWorld(const std::string& kind, int world) {
  static std::map<std::string, std::unique_ptr<ExchangeWorld>> cache;
  auto& slot = cache[kind + "/" + std::to_string(world)];
  if (slot) return *slot;
  slot = std::make_unique<ExchangeWorld>();
  const auto held = hmc::collective::PortReservation::loopback();  // until rank 0's store binds
  const int port = held.port();
  auto threads = hmc::collective::ThreadWorld::create(world);
  for (int rank = 1; rank < world; ++rank) {
    slot->peers.emplace_back([kind, rank, world, port, threads] {
      try {
        auto collective = connect(kind, rank, world, port, threads);
        const Bytes payload = "p";
        while (collective->exchange("bench", payload)[0].rfind("stop", 0) != 0) {
        }
      } catch (const std::exception& failure) {
        std::fprintf(stderr, "# %s rank %d: %s\n", kind.c_str(), rank, failure.what());
      }
    });
  }
  try {
    slot->rank0 = connect(kind, 0, world, port, threads);
  } catch (const std::exception& failure) {
    slot->error = failure.what();
  }
  return *slot;
}

void exchangeLoop(benchmark::State& state, const std::string& kind) {
  if (!noDevice().empty()) {
    state.SkipWithError(noDevice().c_str());
    return;
  }
  const int world = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  if (kind == "nccl" && world > deviceCount()) {
    state.SkipWithError(("one GPU holds one NCCL rank: " + std::to_string(world) +
                         " ranks need as many GPUs, found " + std::to_string(deviceCount()))
                            .c_str());
    return;
  }
  ExchangeWorld& ranks = exchangeWorld(kind, world);
  if (!ranks.rank0) {
    state.SkipWithError((kind + " world: " + ranks.error).c_str());
    return;
  }
  const Bytes payload = "go" + Bytes(bytes > 2 ? bytes - 2 : 0, 'x');
  try {
    for (auto _ : state) benchmark::DoNotOptimize(ranks.rank0->exchange("bench", payload));
  } catch (const std::exception& failure) {
    state.SkipWithError(failure.what());
    return;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes) * world);
  state.counters["ranks"] = world;
}

void BM_NcclExchange(benchmark::State& state) { exchangeLoop(state, "nccl"); }
void BM_StoreExchange(benchmark::State& state) { exchangeLoop(state, "store"); }

// Args: ranks, payload bytes. World 1..8; NCCL worlds beyond the GPUs are skipped.
void exchangeShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ranks", "bytes"});
  for (int world : {1, 2, 4, 8}) {
    for (int bytes : {64, 1 << 20}) b->Args({world, bytes});
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_NcclExchange)->Apply(exchangeShapes);
BENCHMARK(BM_StoreExchange)->Apply(exchangeShapes);

}  // namespace

BENCHMARK_MAIN();
