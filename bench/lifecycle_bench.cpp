// Benchmarks of the lifecycle core: creating and retiring groups, the first binding of a group
// (recycle that reuses an idle compatible group, or a fresh workspace), closing a group
// collectively, and the threads transport's exchange. hmc::core only: modules are emulated
// as in tests/lifecycle/resource_manager_test.cpp (MulticoreModule's binding steps without
// torch).
//
// The FirstBind* and RecycleThreads benchmarks time the bind alone (manual time, two clock
// reads per iteration); the create and retire around it cost what BM_CreateRetire reports.
// The thread-rank benchmarks report wall-clock time of rank 0 (the benchmark thread).
// Counters: `groups` the groups the manager holds, `exchanges` collectives per iteration,
// `reused` the fraction of binds that reused an idle group (a check of what was measured).

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/threads_transport.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/resources/host_resources.hpp"

namespace {

using hmc::collective::Bytes;
using hmc::collective::Collective;
using hmc::collective::LocalCollective;
using hmc::collective::SharedPayloads;
using hmc::collective::ThreadWorld;
using hmc::lifecycle::Binding;
using hmc::lifecycle::GroupPtr;
using hmc::lifecycle::MemberToken;
using hmc::lifecycle::ResourceManager;
using hmc::resources::HostWorkspace;
using hmc::resources::RankResources;
using nlohmann::json;
using BenchClock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kTimeout{10000};
constexpr std::int64_t kWorkspaceBytes = 64;
constexpr const char* kModuleType = "ScratchLinear";
constexpr const char* kKey = "k";
const Binding kCpuF32{"cpu", "float32"};

// One rank's manager and resources, and a module's binding steps (getExecutionResources:
// recycle first, then create).
class BenchRank {
 public:
  struct Module {
    GroupPtr group;
    MemberToken token = 0;
  };

  explicit BenchRank(std::shared_ptr<Collective> collective)
      : manager_(std::make_shared<ResourceManager>(std::move(collective))),
        resources_(std::make_shared<RankResources>()),
        signature_(json::array({kModuleType, "torch." + kCpuF32.dtype})) {}

  ResourceManager& manager() noexcept { return *manager_; }

  Module create(const std::string& compat = kKey) {
    auto [group, token] = manager_->createGroup(json{{"spec", compat}}, compat, "default");
    return {std::move(group), token};
  }
  void drop(const Module& module) { manager_->retire(module.group->identifier, module.token); }

  // Returns whether the bind reused an idle group.
  bool bind(const Module& module) {
    GroupPtr group = module.group;
    group->moduleType = kModuleType;
    manager_->registerAutomaticCleanup();
    manager_->recycle(*group, kCpuF32, signature_);
    if (group->resources) return true;
    group->resources = std::make_shared<HostWorkspace>("scratch_linear", kWorkspaceBytes,
                                                       kCpuF32.dtype, resources_);
    group->binding = kCpuF32;
    group->bindingId = manager_->nextBindingId();
    if (!manager_->runtimeRelease()) manager_->setRuntimeRelease(resources_->createRuntime());
    return false;
  }
  void close(const Module& module) { manager_->closeGroups(std::vector<GroupPtr>{module.group}); }

  // `count` bound groups whose modules stay alive: every recycle sees them in its manifest
  // and skips them (not idle).
  std::vector<Module> bindBusy(int count) {
    std::vector<Module> modules;
    modules.reserve(count);
    for (int index = 0; index < count; ++index) {
      modules.push_back(create());
      bind(modules.back());
    }
    return modules;
  }
  // A bound group whose module is gone: the group the next compatible bind reuses.
  void bindIdle() {
    const Module module = create();
    bind(module);
    drop(module);
  }

 private:
  std::shared_ptr<ResourceManager> manager_;
  std::shared_ptr<RankResources> resources_;
  json signature_;
};

double secondsOf(BenchClock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

void setCounters(benchmark::State& state, BenchRank& rank, std::uint64_t sequenceBefore,
                 std::int64_t reused) {
  const auto exchanges =
      static_cast<double>(rank.manager().collective().sequence() - sequenceBefore);
  state.counters["groups"] = static_cast<double>(rank.manager().groupCount());
  state.counters["exchanges"] = benchmark::Counter(exchanges, benchmark::Counter::kAvgIterations);
  state.counters["reused"] =
      benchmark::Counter(static_cast<double>(reused), benchmark::Counter::kAvgIterations);
}

// Runs `helper` on ranks 1..worldSize-1 as threads and `leader` on the calling thread as
// rank 0, then joins. A rank that throws is marked failed in the world, so that every peer's
// wait raises RankFailure at once instead of at its deadline: no rank is left waiting.
// The error of the rank that failed first (the cause, not its peers' RankFailure) is recorded
// with SkipWithError.
void runRanks(benchmark::State& state, int worldSize,
              const std::function<void(int, std::shared_ptr<Collective>)>& helper,
              const std::function<void(std::shared_ptr<Collective>)>& leader) {
  const std::shared_ptr<ThreadWorld> world = ThreadWorld::create(worldSize);
  std::vector<std::string> errors(worldSize);
  std::atomic<int> firstFailed{-1};
  auto guarded = [&](int rank, const std::function<void(std::shared_ptr<Collective>)>& fn) {
    try {
      fn(world->collective(rank, kTimeout));
    } catch (const std::exception& error) {
      errors[rank] = error.what();
    } catch (...) {
      errors[rank] = "unknown exception";
    }
    if (errors[rank].empty()) return;
    int none = -1;
    firstFailed.compare_exchange_strong(none, rank);
    world->markFailed(rank, errors[rank]);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(worldSize - 1);
  for (int rank = 1; rank < worldSize; ++rank) {
    helpers.emplace_back([&, rank] {
      guarded(rank, [&](std::shared_ptr<Collective> collective) { helper(rank, collective); });
    });
  }
  guarded(0, leader);
  for (std::thread& thread : helpers) thread.join();
  if (const int rank = firstFailed.load(); rank >= 0) {
    const std::string message = fmt::format("rank {}: {}", rank, errors[rank]);
    state.SkipWithError(message.c_str());
  }
}

// createGroup + retire of its only member (the group is forgotten: no resources).
void BM_CreateRetire(benchmark::State& state) {
  BenchRank rank(std::make_shared<LocalCollective>(kTimeout));
  const std::uint64_t sequenceBefore = rank.manager().collective().sequence();
  for (auto _ : state) {
    const BenchRank::Module module = rank.create();
    rank.drop(module);
  }
  setCounters(state, rank, sequenceBefore, 0);
}
BENCHMARK(BM_CreateRetire);

// The timed loop of the recycle benchmarks: create a module, time its first bind (which
// should reuse the idle group), drop it so that the group is idle again. Returns the binds
// that reused.
std::int64_t timeRecycleBinds(benchmark::State& state, BenchRank& rank) {
  std::int64_t reused = 0;
  for (auto _ : state) {
    const BenchRank::Module module = rank.create();
    const auto start = BenchClock::now();
    reused += rank.bind(module) ? 1 : 0;
    state.SetIterationTime(secondsOf(BenchClock::now() - start));
    rank.drop(module);
  }
  return reused;
}

// The first bind of a new group that reuses the one idle compatible group, with
// state.range(0) busy bound groups present. Each iteration's retire makes the group idle
// again for the next one. Times the bind only.
void BM_FirstBindRecycle(benchmark::State& state) {
  BenchRank rank(std::make_shared<LocalCollective>(kTimeout));
  const auto busy = rank.bindBusy(static_cast<int>(state.range(0)));
  rank.bindIdle();
  const std::uint64_t sequenceBefore = rank.manager().collective().sequence();
  const std::int64_t reused = timeRecycleBinds(state, rank);
  setCounters(state, rank, sequenceBefore, reused);
  if (reused != static_cast<std::int64_t>(state.iterations())) {
    state.SkipWithError("a bind did not reuse the idle group");
  }
}
BENCHMARK(BM_FirstBindRecycle)->ArgName("groups")->Arg(0)->Arg(16)->Arg(256)->UseManualTime();

// The first bind of a new group that finds nothing to reuse and creates a workspace, with
// state.range(0) busy bound groups present. Times the bind only; the group is then closed
// (untimed). With 0 groups the close also releases the runtime, so each bind there also
// creates the runtime, as a process's first bind does.
void BM_FirstBindFresh(benchmark::State& state) {
  BenchRank rank(std::make_shared<LocalCollective>(kTimeout));
  const auto busy = rank.bindBusy(static_cast<int>(state.range(0)));
  const std::uint64_t sequenceBefore = rank.manager().collective().sequence();
  std::int64_t reused = 0;
  BenchClock::duration closing{};
  for (auto _ : state) {
    const BenchRank::Module module = rank.create();
    const auto start = BenchClock::now();
    reused += rank.bind(module) ? 1 : 0;
    const auto bound = BenchClock::now();
    state.SetIterationTime(secondsOf(bound - start));
    rank.close(module);
    closing += BenchClock::now() - bound;
  }
  setCounters(state, rank, sequenceBefore, reused);
  // The exchanges counter includes the untimed close's; report the close's time beside it.
  state.counters["close_us"] =
      benchmark::Counter(secondsOf(closing) * 1e6, benchmark::Counter::kAvgIterations);
  if (reused != 0) state.SkipWithError("a fresh bind reused a group");
}
BENCHMARK(BM_FirstBindFresh)->ArgName("groups")->Arg(0)->Arg(16)->Arg(256)->UseManualTime();

// Create, bind (fresh) and close one group collectively on one rank. With runtime=1 another
// busy bound group keeps the runtime alive; with runtime=0 each close also releases it (one
// more collective) and each bind creates it again.
void BM_CloseGroup(benchmark::State& state) {
  BenchRank rank(std::make_shared<LocalCollective>(kTimeout));
  const auto keeper = rank.bindBusy(state.range(0) != 0 ? 1 : 0);
  const std::uint64_t sequenceBefore = rank.manager().collective().sequence();
  for (auto _ : state) {
    const BenchRank::Module module = rank.create();
    rank.bind(module);
    rank.close(module);
  }
  setCounters(state, rank, sequenceBefore, 0);
}
BENCHMARK(BM_CloseGroup)->ArgName("runtime")->Arg(0)->Arg(1);

// One exchange (all-gather of 64 bytes per rank) on state.range(0) thread ranks. Helpers loop
// on exchange until rank 0's payload is kStop; rank 0 sends it in one final exchange after
// the timed loop, so every helper makes exactly as many exchanges as rank 0 and none waits
// on a rank that has left. A failing rank is marked failed, which ends every peer's wait.
void BM_ThreadsExchange(benchmark::State& state) {
  static const Bytes kStop = "stop";
  constexpr std::size_t kPayloadBytes = 64;
  constexpr std::string_view kStage = "bench exchange";
  const int worldSize = static_cast<int>(state.range(0));
  runRanks(
      state, worldSize,
      [&](int rank, std::shared_ptr<Collective> collective) {
        const Bytes payload(kPayloadBytes, static_cast<char>('0' + rank % 10));
        while (collective->exchange(kStage, payload).front() != kStop) {
        }
      },
      [&](std::shared_ptr<Collective> collective) {
        const Bytes payload(kPayloadBytes, 'g');
        collective->exchange(kStage, payload);  // every helper has started
        for (auto _ : state) {
          std::vector<Bytes> gathered = collective->exchange(kStage, payload);
          benchmark::DoNotOptimize(gathered.data());
        }
        collective->exchange(kStage, kStop);
      });
  state.counters["ranks"] = worldSize;
}
// 256..4,096 ranks: time per collective should grow linearly in ranks (issue 10).
BENCHMARK(BM_ThreadsExchange)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// BM_ThreadsExchange with exchangeShared: every rank reads the one immutable vector of the
// collective instead of copying it, so the time per collective is linear in ranks. Side by
// side with BM_ThreadsExchange (a copy per rank: O(ranks^2) bytes per collective).
void BM_ThreadsExchangeShared(benchmark::State& state) {
  static const Bytes kStop = "stop";
  constexpr std::size_t kPayloadBytes = 64;
  constexpr std::string_view kStage = "bench exchange";
  const int worldSize = static_cast<int>(state.range(0));
  runRanks(
      state, worldSize,
      [&](int rank, std::shared_ptr<Collective> collective) {
        const Bytes payload(kPayloadBytes, static_cast<char>('0' + rank % 10));
        while (collective->exchangeShared(kStage, payload)->front() != kStop) {
        }
      },
      [&](std::shared_ptr<Collective> collective) {
        const Bytes payload(kPayloadBytes, 'g');
        collective->exchangeShared(kStage, payload);  // every helper has started
        for (auto _ : state) {
          SharedPayloads gathered = collective->exchangeShared(kStage, payload);
          benchmark::DoNotOptimize(gathered.get());
        }
        collective->exchangeShared(kStage, kStop);
      });
  state.counters["ranks"] = worldSize;
}
BENCHMARK(BM_ThreadsExchangeShared)
    ->ArgName("ranks")
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// BM_FirstBindRecycle on state.range(0) thread ranks with state.range(1) busy bound groups
// per rank: every rank creates, binds (reusing its idle group) and retires in lockstep.
// Rank 0 times its bind: from entering recycle until every rank's manifest has arrived.
// Helpers run exactly state.max_iterations iterations (known before the loop), then every
// rank closes its groups collectively.
void BM_RecycleThreads(benchmark::State& state) {
  const int worldSize = static_cast<int>(state.range(0));
  const int busyCount = static_cast<int>(state.range(1));
  const auto iterations = static_cast<std::int64_t>(state.max_iterations);
  std::int64_t reused = 0;
  runRanks(
      state, worldSize,
      [&](int, std::shared_ptr<Collective> collective) {
        BenchRank rank(std::move(collective));
        const auto busy = rank.bindBusy(busyCount);
        rank.bindIdle();
        for (std::int64_t index = 0; index < iterations; ++index) {
          const BenchRank::Module module = rank.create();
          rank.bind(module);
          rank.drop(module);
        }
        rank.manager().closeGroups();
      },
      [&](std::shared_ptr<Collective> collective) {
        BenchRank rank(std::move(collective));
        const auto busy = rank.bindBusy(busyCount);
        rank.bindIdle();
        const std::uint64_t sequenceBefore = rank.manager().collective().sequence();
        reused += timeRecycleBinds(state, rank);
        setCounters(state, rank, sequenceBefore, reused);
        rank.manager().closeGroups();
      });
  if (!state.error_occurred() && reused != iterations) {
    state.SkipWithError("a bind did not reuse the idle group");
  }
}
BENCHMARK(BM_RecycleThreads)
    ->ArgNames({"ranks", "groups"})
    ->ArgsProduct({{2, 4, 8}, {0, 256}})
    ->UseManualTime();

// Counts the payload bytes this rank sends in 'recycle' collectives.
class RecycleBytes final : public hmc::collective::CollectiveObserver {
 public:
  void onEnter(const hmc::collective::CollectiveRecord& record) override {
    if (record.stage == hmc::lifecycle::kRecycleStage) bytes_ += record.payloadBytes;
  }
  void onExit(const hmc::collective::CollectiveRecord&) override {}
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

// The digest agreement against the full-manifest gather (Agreement::kFullManifest, the
// reference's way), side by side: state.range(0) thread ranks, state.range(1) busy bound
// groups per rank, state.range(2) 0 = digest, 1 = full manifest. Rank 0 times each first bind
// (reusing the idle group); counters: bytes each rank sends per bind ('recycle' payload).
// Goal (issue 10): bytes per rank flat in ranks; at 1,024 x 64 at least 10x less time.
void BM_RecycleAgreement(benchmark::State& state) {
  const int worldSize = static_cast<int>(state.range(0));
  const int busyCount = static_cast<int>(state.range(1));
  const auto agreement = state.range(2) != 0 ? hmc::lifecycle::Agreement::kFullManifest
                                             : hmc::lifecycle::Agreement::kDigest;
  const auto iterations = static_cast<std::int64_t>(state.max_iterations);
  std::int64_t reused = 0;
  RecycleBytes bytes;
  runRanks(
      state, worldSize,
      [&](int, std::shared_ptr<Collective> collective) {
        BenchRank rank(std::move(collective));
        const auto busy = rank.bindBusy(busyCount);
        rank.bindIdle();
        rank.manager().setAgreement(agreement);  // every rank, at the same point
        for (std::int64_t index = 0; index < iterations; ++index) {
          const BenchRank::Module module = rank.create();
          rank.bind(module);
          rank.drop(module);
        }
        rank.manager().closeGroups();
      },
      [&](std::shared_ptr<Collective> collective) {
        BenchRank rank(collective);
        const auto busy = rank.bindBusy(busyCount);
        rank.bindIdle();
        rank.manager().setAgreement(agreement);
        collective->setObserver(&bytes);
        reused += timeRecycleBinds(state, rank);
        collective->setObserver(nullptr);
        rank.manager().closeGroups();
      });
  if (!state.error_occurred() && reused != iterations) {
    state.SkipWithError("a bind did not reuse the idle group");
  }
  state.counters["bytes_per_rank"] =
      benchmark::Counter(static_cast<double>(bytes.bytes()), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_RecycleAgreement)
    ->ArgNames({"ranks", "groups", "full"})
    ->ArgsProduct({{64, 256, 1024}, {16, 64}, {0, 1}})
    ->UseManualTime()
    ->MinTime(0.2)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
