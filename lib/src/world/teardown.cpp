#include "hmc/world/teardown.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sys/socket.h>
#include <thread>

#include "hmc/collective/store_transport.hpp"
#include "hmc/host.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/result_gatherer.hpp"
#include "hmc/world/run_keys.hpp"
#include "../collective/store_connection.hpp"

namespace hmc::world {
namespace {

// A report made at Open MPI's warning is printed at the SIGTERM that follows within about 1 s;
// one older than this (the warning was not a teardown) is made again.
constexpr std::chrono::seconds kEarlyReportFresh{3};

// "" when the store at placement's address answers a TCP handshake within 200 ms, else why
// not. c10d's client would retry a store that is not up yet (rank 0 still loading, or gone)
// for a second: past a launcher's SIGKILL, 50 ms after its SIGTERM under mpirun.
std::string storeSilence(const RankPlacement& placement) {
  return hmc::detail::handshakeFails(
      hmc::detail::resolveAddresses(placement.masterAddr, placement.masterPort),
      std::chrono::milliseconds(200));
}

// A connection to the store for reading who joined: 1 s bounds on each request.
std::shared_ptr<collective::KeyValueStore> connectForJoin(const RankPlacement& placement) {
  collective::StoreTransportOptions client;
  client.host = placement.masterAddr;
  client.port = placement.masterPort;
  client.rank = placement.rank;
  client.worldSize = placement.worldSize;
  client.timeout = std::chrono::seconds(1);
  client.joinTimeout = std::chrono::seconds(1);
  return collective::connectKeyValueStore(client);
}

// Who has joined. `known`: an earlier read, whose joined ranks (a rank's host never changes)
// are not asked again; `table`: where this process hosts the store (rank 0 of a world whose
// rank 0 hosts it), the ranks that joined and have ended since.
JoinState readJoinStateFrom(collective::KeyValueStore& kv, const RankPlacement& placement,
                            collective::LivenessTable& table,
                            const std::optional<JoinState>& known = std::nullopt) {
  JoinState state;
  if (known) state.hosts = known->hosts;
  for (int rank = 0; rank < placement.worldSize; ++rank) {
    if (state.hosts.count(rank) != 0) continue;
    if (auto host = collective::joinedHost(kv, rank, std::chrono::seconds(1))) {
      state.hosts[rank] = std::move(*host);
    } else {
      state.missing.push_back(rank);
    }
  }
  if (placement.rank == 0 && placement.storeHost == StoreHost::kRankZero) {
    std::vector<int> joined;
    for (const auto& [rank, host] : state.hosts) {
      if (rank != placement.rank) joined.push_back(rank);
    }
    state.gone = table.ended(kv, joined);
    for (const int rank : joined) {
      if (auto end = table.endOf(rank)) state.ends[rank] = std::move(*end);
    }
  }
  return state;
}

}  // namespace

std::optional<JoinState> readJoinState(const RankPlacement& placement, std::string* problem) {
  const auto fail = [problem](std::string why) -> std::optional<JoinState> {
    if (problem != nullptr) *problem = std::move(why);
    return std::nullopt;
  };
  if (placement.worldSize < 2) return fail("a world of one rank has no store to join");
  if (placement.masterPort == 0) return fail("the store's port is not known");
  if (const std::string silence = storeSilence(placement); !silence.empty()) {
    if (placement.hostsStore()) {
      // The store would be this process's own: nothing listens at its port, so it had not
      // been started, and nobody can have joined it (a lost host before then read "which
      // ranks had joined is not known", and no rank was named).
      JoinState none;
      none.storeNotUp = true;
      for (int rank = 0; rank < placement.worldSize; ++rank) {
        if (rank != placement.rank) none.missing.push_back(rank);
      }
      return none;
    }
    return fail(fmt::format("nothing answers at {}:{} yet: {}", placement.masterAddr,
                            placement.masterPort, silence));
  }
  try {
    collective::LivenessTable table(placement.masterPort);
    return readJoinStateFrom(*connectForJoin(placement), placement, table);
  } catch (const std::exception& error) {
    return fail(error.what());
  }
}

JoinWatch::JoinWatch(const RankPlacement& placement)
    : placement_(placement), table_(placement.masterPort) {
  if (placement.rank != 0 || placement.worldSize < 2 || placement.masterPort == 0) return;
  thread_ = std::thread([this] { watch(); });
}

JoinWatch::~JoinWatch() { stop(); }

void JoinWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<JoinState> JoinWatch::latest(std::chrono::milliseconds fresh) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!latest_ || std::chrono::steady_clock::now() - readAt_ > fresh) return std::nullopt;
  return latest_;
}

void JoinWatch::watch() {
  std::shared_ptr<collective::KeyValueStore> kv;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const std::optional<JoinState> known = latest_;  // its joined ranks are not asked again
    lock.unlock();
    std::optional<JoinState> state;
    try {
      // One connection, once the store answers (rank 0 makes it as it joins).
      if (!kv && storeSilence(placement_).empty()) kv = connectForJoin(placement_);
      if (kv) state = readJoinStateFrom(*kv, placement_, table_, known);
    } catch (const std::exception& error) {
      spdlog::debug("rank 0: reading who joined the store: {}", error.what());
      kv.reset();
    }
    lock.lock();
    if (state) {
      latest_ = std::move(state);
      readAt_ = std::chrono::steady_clock::now();
    }
    wake_.wait_for(lock, kInterval, [this] { return stopping_; });
  }
}

void probeJoinedHosts(JoinState& state, int self, std::chrono::milliseconds within) {
  std::map<std::string, std::vector<int>> byAddress;  // the end's address: its ranks
  std::map<std::string, int> portOf;
  for (const auto& [rank, end] : state.ends) {
    if (rank == self || std::find(state.gone.begin(), state.gone.end(), rank) != state.gone.end())
      continue;
    const auto colon = end.rfind(':');
    if (colon == std::string::npos) continue;
    const std::string address = end.substr(0, colon);
    byAddress[address].push_back(rank);
    portOf[address] = std::atoi(end.c_str() + colon + 1);
  }
  // One handshake per host, all at once under one deadline: the report has about a second.
  const auto by = Clock::now() + within;
  std::vector<std::pair<std::string, std::vector<hmc::detail::SocketAddress>>> probes;
  for (const auto& [address, ranks] : byAddress) {
    probes.emplace_back(address, hmc::detail::resolveAddresses(address, portOf[address]));
  }
  std::vector<char> answered(probes.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < probes.size(); ++i) {
    threads.emplace_back([&, i] {
      for (const auto& resolved : probes[i].second) {
        hmc::detail::Fd socket{
            ::socket(resolved.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
        if (socket.fd < 0) continue;
        // Connected, or refused (its kernel answered: nothing listens at a connection's end).
        const int error = hmc::detail::connectBy(socket.fd, resolved, by);
        if (error == 0 || error == ECONNREFUSED) {
          answered[i] = 1;
          return;
        }
      }
      if (probes[i].second.empty()) answered[i] = 1;  // not resolved: nothing to judge by
    });
  }
  for (auto& thread : threads) thread.join();
  for (std::size_t i = 0; i < probes.size(); ++i) {
    if (answered[i]) continue;
    const auto& ranks = byAddress[probes[i].first];
    state.unreachable.insert(state.unreachable.end(), ranks.begin(), ranks.end());
  }
  std::sort(state.unreachable.begin(), state.unreachable.end());
}

std::vector<scenario::RankResult> worldNotFormedResults(const RankPlacement& placement,
                                                        int signal,
                                                        const std::optional<JoinState>& join,
                                                        const std::string& problem) {
  const int self = placement.rank;
  const std::string store = fmt::format("{}:{}", placement.masterAddr, placement.masterPort);
  const std::string launcher = placement.launcher.empty() ? "the launcher" : placement.launcher;
  const std::string stop = fmt::format("stopped by signal {} ({})", signal, strsignal(signal));
  std::vector<int> others;  // the ranks, this one aside, that had not joined
  if (join) {
    std::copy_if(join->missing.begin(), join->missing.end(), std::back_inserter(others),
                 [self](int rank) { return rank != self; });
  }
  std::string known;
  if (!join) {
    known = fmt::format("which ranks had joined is not known: the store at {} could not be read ({})",
                        store, problem);
  } else if (join->storeNotUp) {
    known = fmt::format("this rank had not started the store at {} yet, so no rank had joined it",
                        store);
  } else if (others.empty()) {
    known = fmt::format("every other rank had joined the store at {}", store);
  } else {
    known = fmt::format("{} {} had not joined the store at {}",
                        others.size() == 1 ? "rank" : "ranks", collective::formatRankList(others),
                        store);
  }
  // "rank 3 ... its host" or "ranks [2, 3] ... their hosts".
  const auto who = [](const std::vector<int>& ranks) {
    return ranks.size() == 1 ? fmt::format("rank {}", ranks.front())
                             : fmt::format("ranks {}", collective::formatRankList(ranks));
  };
  const auto whose = [](const std::vector<int>& ranks) {
    return ranks.size() == 1 ? "its host" : "their hosts";
  };
  if (join && !join->gone.empty()) {
    known += fmt::format("; {} joined it, then every connection from {} to it closed",
                         who(join->gone), whose(join->gone));
  }
  if (join && !join->unreachable.empty()) {
    known += fmt::format("; {} joined it, then {} stopped answering (down or cut off)",
                         who(join->unreachable), whose(join->unreachable));
  }
  std::vector<scenario::RankResult> results(static_cast<std::size_t>(placement.worldSize));
  for (int rank = 0; rank < placement.worldSize; ++rank) {
    scenario::RankResult& result = results[static_cast<std::size_t>(rank)];
    result.rank = rank;
    result.stopped = true;
    result.leaks.reason = "the world did not form";
    const bool missing = std::find(others.begin(), others.end(), rank) != others.end();
    const bool gone = join && std::find(join->gone.begin(), join->gone.end(), rank) !=
                                  join->gone.end();
    const bool unreachable =
        join && std::find(join->unreachable.begin(), join->unreachable.end(), rank) !=
                    join->unreachable.end();
    if (rank == self) {
      result.host = hostName();
      result.pid = processId();
      result.crashReason = fmt::format("{} while the world formed (in its join); {}", stop, known);
    } else if (missing) {
      result.notJoined = true;
      result.crashReason = fmt::format(
          "had not joined the store at {} when rank {} was {} while the world formed: its "
          "process ended, never started, or is on a host that went down; {} stops every rank "
          "when one of its processes ends: its output names the one that ended first",
          store, self, stop, launcher);
    } else if (gone || unreachable) {
      // Joined, then lost: its process ended (its connections closed), or its host went silent.
      result.stopped = false;
      result.crashed = true;
      result.host = join->hosts.at(rank);
      result.crashReason =
          gone ? fmt::format("joined the store at {}, then every connection from its host {} to "
                             "it closed while the world formed: its process ended (killed or "
                             "crashed), or its host went down",
                             store, result.host)
               : fmt::format("joined the store at {}, then its host {} stopped answering while "
                             "the world formed (no TCP handshake): it went down or was cut off",
                             store, result.host);
    } else if (join) {
      result.host = join->hosts.count(rank) != 0 ? join->hosts.at(rank) : std::string();
      result.crashReason = fmt::format(
          "had joined the store at {}; the world was stopped before it formed (rank {} {})",
          store, self, stop);
    } else {
      result.crashReason = fmt::format(
          "unknown: the world was stopped before it formed (rank {} {}), and the store at {} "
          "could not be read ({}): whether it had joined is not known",
          self, stop, store, problem);
    }
  }
  return results;
}

HandOff decideHandOff(const HandOffFacts& facts) noexcept {
  if (!facts.underLauncher) return HandOff::kOwnFile;
  if (facts.early) return facts.reporting ? HandOff::kEarlyReport : HandOff::kEarlySnapshot;
  if (facts.reporting)
    return facts.earlyReportFresh ? HandOff::kPrintEarlyReport : HandOff::kReport;
  return facts.folderReported ? HandOff::kNothing : HandOff::kLocalAndStore;
}

InterruptWaits interruptWaits(const std::string& launcher, bool early) {
  using std::chrono::milliseconds;
  const bool mpirun = launcher == "mpirun";
  InterruptWaits waits{mpirun ? milliseconds(400) : milliseconds(1000),
                       mpirun ? milliseconds(0) : milliseconds(1000), milliseconds(20)};
  if (early) {
    waits.store = milliseconds(200);
    waits.earlySnapshotAfter = milliseconds(0);
  }
  return waits;
}

TerminationHandOff::TerminationHandOff(const scenario::Scenario& scenario, RankLaunch launch,
                                       const RankProgress& progress,
                                       InterruptedReport onInterrupted)
    : scenario_(scenario),
      launch_(std::move(launch)),
      progress_(progress),
      onInterrupted_(std::move(onInterrupted)) {}

void TerminationHandOff::setStore(std::shared_ptr<collective::KeyValueStore> kv) {
  std::lock_guard<std::mutex> lock(mutex_);
  kv_ = std::move(kv);
}

void TerminationHandOff::setClosedPeers(collective::Collective::ClosedPeers closedPeers) {
  std::lock_guard<std::mutex> lock(mutex_);
  closedPeers_ = std::move(closedPeers);
}

void TerminationHandOff::setJoinWatch(std::shared_ptr<const JoinWatch> watch) {
  std::lock_guard<std::mutex> lock(mutex_);
  joinWatch_ = std::move(watch);
}

void TerminationHandOff::setFolder(EvidenceFolder folder) {
  std::lock_guard<std::mutex> lock(mutex_);
  folder_ = std::move(folder);
}

bool TerminationHandOff::claimForMainThread() {
  Claimant nobody = Claimant::kNobody;
  return claimant_.compare_exchange_strong(nobody, Claimant::kMainThread);
}

void TerminationHandOff::awaitSignalExit() const {
  const auto until = Clock::now() + kAwaitSignalExit;
  while (Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int signal = signal_.load();
  spdlog::error("rank {}: the hand-off of signal {} did not end the process within {} s",
                launch_.placement.rank, signal, kAwaitSignalExit.count());
  std::_Exit(128 + (signal != 0 ? signal : SIGTERM));
}

bool TerminationHandOff::handOn(int signal, bool early) {
  // The main thread reports and exits by itself (the watcher's hard limit still bounds it).
  if (early) {
    if (claimant_.load() == Claimant::kMainThread) return true;
  } else if (Claimant nobody = Claimant::kNobody;
             !claimant_.compare_exchange_strong(nobody, Claimant::kWatcher)) {
    return false;
  } else {
    signal_ = signal;
  }
  const RankPlacement& placement = launch_.placement;
  std::shared_ptr<collective::KeyValueStore> kv;
  EvidenceFolder folder;
  collective::Collective::ClosedPeers closedPeers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kv = kv_;
    folder = folder_;
    closedPeers = closedPeers_;
  }
  // Who reports, decided before this rank's file exists: a reporting rank that finds every
  // file it waits for removes the folder and exits.
  HandOffFacts facts;
  facts.underLauncher = placement.underLauncher();
  facts.early = early;
  facts.earlyReportFresh =
      earlyReportAt_ && std::chrono::steady_clock::now() - *earlyReportAt_ < kEarlyReportFresh;
  // The rank that reported at the warning moments ago is the reporting rank without a look at
  // the folder: the other ranks of its node remove the folder at this same SIGTERM, and a look
  // after that would find no reporter.
  facts.reporting =
      onInterrupted_ != nullptr &&
      (facts.earlyReportFresh ||
       (folder.usable() ? folder.lowestLiveRank(placement.worldSize) : 0) == placement.rank);
  facts.folderReported = folder.reported();
  const HandOff what = decideHandOff(facts);
  // Under mpirun the SIGKILL follows this SIGTERM by 50 ms: the hand-offs that print the report
  // made at the warning, or do nothing, come first, without this rank's snapshot.
  if (what == HandOff::kPrintEarlyReport) {
    folder.remove();
    onInterrupted_({}, signal, InterruptMode::kPublishEarly);
    return true;
  }
  if (what == HandOff::kNothing) {
    // The reporting rank removes the folder at this SIGTERM too, and on a loaded node its
    // signal thread may not have run before the SIGKILL, which left the folder behind. Every
    // rank of the node removes it (the report at the warning has read it), unless that report
    // is stale: then the reporting rank reports again from it.
    if (folder.reportedWithin(kEarlyReportFresh)) folder.remove();
    return true;
  }
  const auto snap = progress_.snapshot(scenario_, placement.rank, signal);
  const auto& results = snap.results;
  if (what == HandOff::kOwnFile) {
    // Only the current repetition's: the finished ones are in their files.
    if (!results.empty()) {
      scenario::writeOutputFile(repetitionResultFile(launch_.resultFile, snap.first),
                                rankResultsDocument(results));
    }
    return true;
  }
  const std::string document = rankResultsDocument(results);
  const std::string localProblem = folder.writeResults(document, early);
  if (what == HandOff::kEarlySnapshot) return true;
  std::string storeProblem = kv ? "" : "the rank had not joined the store yet";
  if (what == HandOff::kLocalAndStore) {
    // The store too, for a reporting rank on another node.
    if (kv) {
      try {
        kv->set(keys::result(placement.rank), document);
      } catch (const std::exception& error) {
        storeProblem = error.what();
      }
    }
    if (!storeProblem.empty() && !localProblem.empty()) {
      fmt::print(stderr,
                 "hmc-run rank {}: stopped by signal {}; cannot hand on its results: {}; {}\n",
                 placement.rank, signal, storeProblem, localProblem);
    }
    return true;
  }
  report(signal, early, results, std::move(kv), folder, std::move(storeProblem), closedPeers);
  return true;
}

// This rank reports. The others write theirs as they receive the same signal: the local files
// of the ranks still alive (bounded), then the store for the rest (bounded even when the store
// stalls: a launcher's SIGKILL follows soon; the read runs on its own thread, abandoned past
// its time, as the process exits right after).
void TerminationHandOff::report(int signal, bool early,
                                const std::vector<scenario::RankResult>& results,
                                std::shared_ptr<collective::KeyValueStore> kv,
                                const EvidenceFolder& folder, std::string storeProblem,
                                const collective::Collective::ClosedPeers& closedPeers) {
  const RankPlacement placement = launch_.placement;
  if (!kv) {
    // The world had not formed: no rank has a result or a folder but this one's, and the store
    // says who had joined it (a rank that never did is what a launcher's teardown follows).
    std::string problem;
    std::shared_ptr<const JoinWatch> watch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      watch = joinWatch_;
    }
    // Read a moment ago (a read now may outlast mpirun's SIGKILL), else now.
    std::optional<JoinState> join = watch ? watch->latest(std::chrono::seconds(1)) : std::nullopt;
    if (!join) join = readJoinState(placement, &problem);
    if (join) probeJoinedHosts(*join, placement.rank, kHostProbe);
    std::vector<std::vector<scenario::RankResult>> merged{
        worldNotFormedResults(placement, signal, join, problem)};
    if (early) {
      onInterrupted_(std::move(merged), signal, InterruptMode::kEarly);
      earlyReportAt_ = Clock::now();
      folder.markReported();
    } else {
      folder.remove();
      onInterrupted_(std::move(merged), signal, InterruptMode::kReport);
    }
    return;
  }
  const InterruptWaits waits = interruptWaits(placement.launcher, early);
  const int self = placement.rank;
  GatherPlan plan;
  plan.placement = placement;
  plan.folder = folder;
  plan.own = results;
  plan.localDeadline = Clock::now() + waits.local;
  plan.earlyAfter = waits.earlySnapshotAfter;
  plan.kv = std::move(kv);
  if (!storeProblem.empty()) plan.noStore = storeProblem;
  plan.storeWait = waits.store;
  plan.atTeardown = true;
  plan.closedPeers = closedPeers;
  plan.missingWhy = missingRankRule(folder, self, [](int rank) {
    return fmt::format("no result from rank {}: it died, was stopped, or never finished its steps",
                       rank);
  });
  plan.whenStoreUnread = [self](int rank, const std::string& problem) {
    return fmt::format(
        "unknown: no result from rank {} in the local evidence folder, and the store could not "
        "be read when rank {} was stopped ({})",
        rank, self, problem);
  };
  Gathered gathered = gatherEveryRank(std::move(plan));
  if (early) {
    onInterrupted_(std::move(gathered.merged), signal, InterruptMode::kEarly);
    earlyReportAt_ = Clock::now();
    folder.markReported();
  } else {
    folder.remove();  // read: gone before the report, which a SIGKILL may cut short
    onInterrupted_(std::move(gathered.merged), signal, InterruptMode::kReport);
  }
  // Only after the report: under mpirun a write to stderr blocked in some teardowns here
  // (Open MPI stops reading the ranks' output), which lost the report when logged before.
  spdlog::debug(
      "rank {}: evidence after signal {}{}: {} local results in {} ms, store {} in {} ms",
      placement.rank, signal, early ? " (early, at SIGCONT)" : "", gathered.localResults,
      std::chrono::duration_cast<std::chrono::milliseconds>(gathered.localTook).count(),
      gathered.storeRead ? "read"
                         : (gathered.storeProblem.empty() ? "not needed" : gathered.storeProblem),
      std::chrono::duration_cast<std::chrono::milliseconds>(gathered.storeTook).count());
}

}  // namespace hmc::world
