#include "rank_process.hpp"

#include <fmt/format.h>
#include <signal.h>  // hook (issue 9 item 5): SIGUSR1
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/tcp_transport.hpp"
#include "hmc/config.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#if HMC_HAVE_GLOO
#include "hmc/collective/gloo_transport.hpp"
#endif
#if HMC_HAVE_CUDA
#include "hmc/collective/nccl_transport.hpp"
#endif

namespace hmc::app {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds timeoutOf(const scenario::Scenario& scenario) {
  return collective::timeoutFromSeconds(scenario.timeoutS);
}

// Polls for `keys` until all exist or `deadline` passes.
bool waitForKeys(collective::KeyValueStore& kv, const std::vector<std::string>& keys,
                 Clock::time_point deadline) {
  while (true) {
    if (kv.check(keys)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<std::string> rankKeys(const std::string& stem, int worldSize) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < worldSize; ++rank) keys.push_back(fmt::format("{}/{}", stem, rank));
  return keys;
}

// Polls for every rank's "<stem>/<rank>" until all exist, a rank whose key is missing is
// announced dead ("dead/<rank>", set by hmc-run's launcher), or `deadline` passes.
bool waitForRanks(collective::KeyValueStore& kv, const std::string& stem, int worldSize,
                  Clock::time_point deadline) {
  const auto keys = rankKeys(stem, worldSize);
  for (int round = 0;; ++round) {
    if (kv.check(keys)) return true;
    if (round % 10 == 9 && kv.check({collective::kAnyDeadKey})) {  // every ~50 ms
      for (int rank = 0; rank < worldSize; ++rank) {
        if (!kv.check({keys[rank]}) && kv.check({collective::deadRankKey(rank)})) return false;
      }
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights) {
  scenario::RankResult result;
  result.rank = rank;
  result.crashed = true;
  result.leaks.reason = std::move(leakReason);
  if (auto it = flights.find(rank); it != flights.end()) {
    result.flight = it->second.entries;
    reason += it->second.step < 0 ? std::string("; last seen after its steps")
                                  : fmt::format("; last seen in step {}", it->second.step);
  }
  result.crashReason = std::move(reason);
  return result;
}

RankProcessOutcome runRankProcess(const scenario::Scenario& scenario,
                                  const RankProcessOptions& options, bool gatherOnRankZero) {
  const auto timeout = timeoutOf(scenario);
  collective::StoreTransportOptions storeOptions;
  storeOptions.host = options.masterAddr;
  storeOptions.port = options.masterPort;
  storeOptions.rank = options.rank;
  storeOptions.worldSize = options.worldSize;
  storeOptions.timeout = timeout;
  storeOptions.prefix = "hmc";
  if (options.agentHostsStore) storeOptions.isServer = false;
  // The control store: out-of-band votes and results, and the `store` transport itself.
  auto control = std::make_shared<collective::StoreTransport>(storeOptions);
  std::shared_ptr<collective::KeyValueStore> kv = control->keyValueStore();

  std::shared_ptr<collective::Collective> transport = control;
  if (options.transport == "tcp") {
    // Direct connections between the ranks; the control store is only the rendezvous and
    // stays the out-of-band channel.
    collective::TcpTransportOptions tcp;
    tcp.control = control;
    transport = std::make_shared<collective::TcpTransport>(tcp);
  } else if (options.transport == "gloo") {
#if HMC_HAVE_GLOO
    collective::GlooTransportOptions gloo;
    gloo.store = storeOptions;
    gloo.store.port = options.glooPort != 0 ? options.glooPort : options.masterPort + 1;
    gloo.store.prefix = "hmc-gloo";
    gloo.deviceHost = options.masterAddr == "localhost" ? "127.0.0.1" : options.masterAddr;
    transport = std::make_shared<collective::GlooTransport>(gloo);
#else
    throw BackendError(
        "--transport gloo: this hmc-run was built without Gloo (HMC_WITH_GLOO=OFF or "
        "ProcessGroupGloo.hpp missing); use --transport tcp or store");
#endif
  } else if (options.transport == "nccl") {
#if HMC_HAVE_CUDA
    // NCCL all-gathers between GPUs (rank r on device r % deviceCount); the store stays the
    // bootstrap (the unique id) and the out-of-band channel, and names the ranks that did
    // not arrive when an exchange times out.
    collective::NcclTransportOptions nccl;
    nccl.bootstrap = control;
    nccl.timeout = timeout;
    nccl.arrivals = control->keyValueStore();
    transport = std::make_shared<collective::NcclTransport>(nccl);
#else
    throw BackendError(
        "--transport nccl: this hmc-run was built without CUDA (HMC_WITH_CUDA=OFF, or the "
        "CUDA toolkit or NCCL was not found); use --transport tcp, store or gloo");
#endif
  }

  scenario::RankEnvironment env;
  env.collective = transport;
  env.recorder = std::make_shared<diagnostics::FlightRecorder>(options.flightCapacity, env.epoch);
  env.crash = [] { _exit(kCrashExitStatus); };
  env.agreeOnShutdown = [&](bool clean) {
    kv->set(fmt::format("vote/{}", options.rank), clean ? "1" : "0");
    // A dead rank never votes: stop waiting for it (it cannot shut down cleanly anyway).
    if (!waitForRanks(*kv, "vote", options.worldSize, Clock::now() + timeout)) return false;
    for (const auto& key : rankKeys("vote", options.worldSize)) {
      if (kv->get(key, timeout) != "1") return false;
    }
    return true;
  };

  RankProcessOutcome outcome;
  {
    // Publishes this rank's flight record out of band when a collective passes its deadline
    // (diagnostics/watchdog.hpp); its own store connection.
    diagnostics::WatchdogOptions watch;
    watch.rank = options.rank;
    watch.deadline = timeout;
    // hook (issue 9 item 5): rank 0 names the job for `hmc-run status`; SIGUSR1 dumps the
    // flight record to stderr.
    if (options.rank == 0) watch.meta = diagnostics::JobMeta{scenario.name, options.worldSize,
                                                             scenario.timeoutS, options.transport,
                                                             diagnostics::unixNow()};
    watch.dumpSignal = SIGUSR1;
    diagnostics::Watchdog watchdog(env.recorder, control->keyValueStore(), watch);
    outcome.result = scenario::runRank(scenario, env);
  }
  // The hosting rank's transport waits (bounded) in its destructor until every rank left.
  if (!gatherOnRankZero) return outcome;

  kv->set(fmt::format("result/{}", options.rank), outcome.result.toJson().dump());
  if (options.rank != 0) {
    // Wait (bounded) until rank 0 has read every result before the store may go away.
    waitForKeys(*kv, {"results-read"}, Clock::now() + timeout);
    return outcome;
  }
  std::vector<scenario::RankResult> merged(options.worldSize);
  const auto deadline = Clock::now() + timeout;
  std::optional<std::map<int, diagnostics::PublishedFlight>> published;
  for (int rank = 0; rank < options.worldSize; ++rank) {
    const std::string key = fmt::format("result/{}", rank);
    if (waitForKeys(*kv, {key}, deadline)) {
      merged[rank] = scenario::RankResult::fromJson(nlohmann::json::parse(kv->get(key, timeout)));
    } else {
      // Where it was, if its watchdog published its flight record.
      if (!published) published = diagnostics::readPublishedFlights(*kv, options.worldSize);
      merged[rank] = missingRankResult(
          rank,
          fmt::format("no result from rank {} within {} s: it died or never finished its steps",
                      rank, scenario.timeoutS),
          "no result from this rank: not checked", *published);
    }
  }
  kv->set("results-read", "1");
  outcome.merged = std::move(merged);
  return outcome;
}

}  // namespace hmc::app
