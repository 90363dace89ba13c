#include "hmc/world/world.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/diagnostics/diagnosis.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/diagnostics/hang_diagnosis.hpp"
#include "hmc/diagnostics/job_status.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/log.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/text.hpp"
#include "hmc/world/evidence_folder.hpp"
#include "hmc/world/rank_placement.hpp"
#include "hmc/world/result_gatherer.hpp"
#include "hmc/world/run_keys.hpp"
#include "hmc/world/signals.hpp"
#include "hmc/world/teardown.hpp"
#include "../collective/socket_guards.hpp"
#include "../collective/store_connection.hpp"

namespace hmc {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// After a hang the others may be stuck in a collective of their own for a whole deadline:
// rank 0 waits this long for their ends, then says what their heartbeats say.
constexpr std::chrono::milliseconds kWaitAfterHang{1000};
// After a launcher's termination signal, which every rank gets at about once: torchrun and srun
// leave seconds before their SIGKILL.
constexpr std::chrono::milliseconds kWaitAfterSignal{500};
// Open MPI's teardown sends SIGCONT, SIGTERM 1 s later and SIGKILL 50 ms after that (strace,
// Open MPI 4.1, 4 ranks: the report made at the SIGTERM never came): rank 0 reports at the
// SIGCONT, its wait for the others' ends within this, and the job status read after it.
constexpr std::chrono::milliseconds kWaitAtWarning{400};
// After a report made at that warning, the main thread's own end waits this long for the
// SIGTERM before it reports again (a SIGCONT not from a teardown: the job goes on).
constexpr std::chrono::milliseconds kAfterWarning{2000};
// Each store request of the end.
constexpr std::chrono::milliseconds kStoreRequest{2000};
inline constexpr const char* kEndFormat = "hmc-world-end/1";
// The open groups a rank's failure at the world's end quotes.
constexpr std::size_t kOpenGroupsShown = 8;

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::chrono::milliseconds secondsVariable(const char* name, const std::string& text) {
  try {
    std::size_t used = 0;
    const double seconds = std::stod(text, &used);
    if (used == text.size()) return collective::timeoutFromSeconds(seconds);
  } catch (const std::exception&) {
  }
  throw ValueError(
      fmt::format("{}='{}': expected a number of seconds > 0 and <= 1e6", name, printable(text)));
}

std::string programName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? std::string("program") : name;
}

world::RankPlacement placementOf(const JoinOptions& options) {
  if (options.rank || options.worldSize) {
    if (!options.rank || !options.worldSize) {
      throw ValueError(
          "hmc::joinWorld: rank and world size come together (JoinOptions::rank and worldSize, "
          "or HMC_RANK and HMC_WORLD_SIZE): set both, or neither to read the launcher's");
    }
    if (*options.worldSize < 1 || *options.rank < 0 || *options.rank >= *options.worldSize) {
      throw ValueError(fmt::format("hmc::joinWorld: rank {} is not a rank of a world of {}",
                                   *options.rank, *options.worldSize));
    }
    world::RankPlacement placement;
    placement.rank = *options.rank;
    placement.worldSize = *options.worldSize;
    placement.masterAddr = options.masterAddr.value_or("127.0.0.1");
    placement.masterPort = options.masterPort.value_or(collective::kDefaultMasterPort);
    if (placement.masterPort == 0 && placement.rank != 0) {
      throw ValueError(fmt::format(
          "hmc::joinWorld: rank {} needs the store's port (HMC_MASTER_PORT or "
          "JoinOptions::masterPort); 0 (a free port) is for the rank that hosts it, rank 0",
          placement.rank));
    }
    placement.launcher = "explicit";
    return placement;
  }
  const auto launch = collective::detectLaunch(collective::processEnvironment(),
                                               {options.masterAddr, options.masterPort});
  if (!launch) {
    throw ValueError(
        "hmc::joinWorld: no launcher started this process (no torchrun RANK/WORLD_SIZE, Open "
        "MPI OMPI_COMM_WORLD_RANK/SIZE or Slurm SLURM_PROCID/SLURM_NTASKS) and no rank was "
        "given: start it under torchrun, mpirun or srun, or set HMC_RANK, HMC_WORLD_SIZE, "
        "HMC_MASTER_ADDR and HMC_MASTER_PORT (or JoinOptions::rank and worldSize)");
  }
  return world::RankPlacement::fromLaunch(*launch);
}

// The store rank 0 hosts, gone while this rank set its world up after the join (rank 0 ended
// right after its own join: chaos seed 53752704, rank 2's connection reset): every request fails
// with what happened. The world forms all the same, and the program's first collective meets the
// rank that ended, as on the ranks that finished their set-up before it did; a joinWorld that
// threw there instead ended the program before its first step (an abort, read as a crash of its
// own beside rank 0's).
class LostStore final : public collective::KeyValueStore {
 public:
  explicit LostStore(std::string why) : why_(std::move(why)) {}
  void set(const std::string&, const collective::Bytes&) override { fail(); }
  collective::Bytes get(const std::string&, std::chrono::milliseconds) override { fail(); }
  bool check(const std::vector<std::string>&) override { fail(); }
  bool deleteKey(const std::string&) override { fail(); }
  std::int64_t add(const std::string&, std::int64_t) override { fail(); }

 private:
  [[noreturn]] void fail() const { throw BackendError(why_); }
  std::string why_;
};

// A new connection to the world's store for rank `rank` (not 0), or, where the store is gone
// (refused, reset, no answer), a LostStore that says so.
std::shared_ptr<collective::KeyValueStore> connectAfterJoin(collective::StoreTransport& control,
                                                            int rank, const std::string& address) {
  try {
    return control.keyValueStore();
  } catch (const std::exception& error) {  // refused, reset, or no answer (a TimeoutError)
    spdlog::warn("hmc world: rank {} lost the store at {} while it set up its world after the "
                 "join (rank 0 ended?): {}; its first collective will tell",
                 rank, address, error.what());
    return std::make_shared<LostStore>(
        fmt::format("the store at {} was lost while rank {} set up its world after the join: {}",
                    address, rank, error.what()));
  }
}

// One rank's end, as it publishes it under keys::worldEnd(rank).
struct RankEnd {
  int rank = 0;
  std::string host;
  std::int64_t pid = 0;
  std::string status = "ok";  // ok, hang (timeout or a lost rank), error
  std::string error;          // what the failed collective raised
  std::string stage;          // the stage it failed in ("" when none failed)
  std::uint64_t sequence = 0;
  // The leak check after the close: groups left (bound ones among them); unset when it could
  // not be checked (after a hang), with the reason.
  std::optional<std::size_t> groupsLeft;
  std::size_t boundGroupsLeft = 0;
  std::string leakReason;
  // This rank's first failure, caught by the program or not (hmc/diagnostics/diagnosis.hpp).
  std::optional<diagnostics::FailureView> failure;
  // It reached the world's end after this many collectives, with these groups open (their
  // specifications); unset when it did not come (a hang before, a signal).
  std::optional<std::uint64_t> atEndSequence;
  json openGroups;
  // Stopped (status "stopped") while it waited in `stage` #`sequence`: it had arrived there.
  bool stoppedWaiting = false;

  bool clean() const { return status == "ok" && groupsLeft && *groupsLeft == 0 && !failure; }

  json toJson() const {
    json out = {{"rank", rank},   {"host", host},   {"pid", pid},          {"status", status},
                {"error", error}, {"stage", stage}, {"sequence", sequence}};
    if (groupsLeft) {
      out["leaks"] = {
          {"checked", true}, {"groups_left", *groupsLeft}, {"bound_groups_left", boundGroupsLeft}};
    } else {
      out["leaks"] = {{"checked", false}, {"reason", leakReason}};
    }
    out["failure"] = failure ? failure->toJson() : json(nullptr);
    if (atEndSequence) {
      out["at_end"] = {{"collectives", *atEndSequence}, {"open_groups", openGroups}};
    }
    if (stoppedWaiting) out["stopped_waiting"] = true;
    return out;
  }
  static RankEnd fromJson(const json& value) {
    RankEnd end;
    end.rank = value.at("rank").get<int>();
    end.host = value.at("host").get<std::string>();
    end.pid = value.at("pid").get<std::int64_t>();
    end.status = value.at("status").get<std::string>();
    end.error = value.at("error").get<std::string>();
    end.stage = value.at("stage").get<std::string>();
    end.sequence = value.at("sequence").get<std::uint64_t>();
    const json& leaks = value.at("leaks");
    if (leaks.at("checked").get<bool>()) {
      end.groupsLeft = leaks.at("groups_left").get<std::size_t>();
      end.boundGroupsLeft = leaks.at("bound_groups_left").get<std::size_t>();
    } else {
      end.leakReason = leaks.at("reason").get<std::string>();
    }
    if (value.contains("at_end")) {
      end.atEndSequence = value.at("at_end").at("collectives").get<std::uint64_t>();
      end.openGroups = value.at("at_end").at("open_groups");
    }
    if (value.contains("failure") && !value.at("failure").is_null()) {
      end.failure = diagnostics::FailureView::fromJson(value.at("failure"));
    }
    end.stoppedWaiting = value.value("stopped_waiting", false);
    return end;
  }

  // `first`: the world's first failure; this rank's part in it is said in a few words (the
  // report's first line has it whole).
  std::string describe(const std::optional<diagnostics::FirstFailure>& first = {}) const {
    std::string what = status == "ok"        ? std::string("ended cleanly")
                       : status == "stopped" ? printable(error)
                                             : fmt::format("{} in '{}' #{}: {}", status, stage,
                                                           sequence, printable(error));
    std::string failed;
    if (failure) {
      const bool part = first && std::find(first->seenBy.begin(), first->seenBy.end(), rank) !=
                                     first->seenBy.end();
      // "(manifest mismatch in 'close validation' #2)", "(error in forward)": where it was.
      const std::string where = diagnostics::whereText(*failure, true);
      failed = part ? fmt::format("saw the first failure ({}{})",
                                  diagnostics::failureKindWords(failure->kind),
                                  where.empty() ? where : " in " + where)
                    : diagnostics::describeFailure(*failure);
    }
    if (status == "ok" && !failure && !groupsLeft && atEndSequence) {
      what = fmt::format("reached the world's end after {} collectives, with {} group(s) open",
                         *atEndSequence, openGroups.size());
    }
    if (failure && status == "ok") {
      what = fmt::format("{}, then ended: closed what was left", failed);
    } else if (failure && (failure->stage != stage || failure->sequence != sequence)) {
      what += fmt::format("; its first failure: {}", failed);
    }
    if (!groupsLeft) return fmt::format("{}; leaks: {}", what, leakReason);
    if (*groupsLeft == 0) return what;
    return fmt::format("{}; leaked: {} group(s) left open ({} bound)", what, *groupsLeft,
                       boundGroupsLeft);
  }
};

// The first collective of this rank that passed its deadline or lost a rank, if any.
std::optional<diagnostics::FlightEntry> firstHang(const diagnostics::FlightRecorder& recorder) {
  for (const auto& entry : recorder.entries()) {
    if (entry.status == "timeout" || entry.status == "rank_failure") return entry;
  }
  return std::nullopt;
}

// A launcher's teardown (torchrun and srun: SIGTERM; Ctrl-C: SIGINT; a lost terminal: SIGHUP):
// the SignalScope records the signal (hmc/world/signals.hpp, as hmc-run's own runs do) and a
// SignalForwarder hands it to the world on a thread of its own, which hands on what this rank
// did; then the signal ends the process as it would have (128 + signal for launchers). One
// world per process takes the signals.
// A signal that came while the world ended (the main thread reported first, or stopped the
// forwarder before it looked) ends the process too, once the program's handlers are back.
void reportStoppedJoin(const JoinOptions& options, const world::RankPlacement& placement,
                       int signal, std::optional<world::JoinState> recent = std::nullopt);
void reportFailedJoin(const JoinOptions& options, const world::RankPlacement& placement,
                      const std::exception& error);
bool standsInAtJoin(const world::RankPlacement& placement);
bool storeRefuses(const world::RankPlacement& placement);
std::string folderTag(const world::RankPlacement& placement);
void reportRank0LostAtJoin(const JoinOptions& options, const world::RankPlacement& placement,
                           const std::string& seen, bool storeRefused = false);

class TerminationSignals {
 public:
  // `onWarning`, when given: Open MPI's warning (SignalForwarder), on the same thread.
  TerminationSignals(std::function<void(int signal)> onSignal, std::function<void()> onWarning)
      : scope_(std::make_unique<world::SignalScope>()),
        forwarder_(std::make_unique<world::SignalForwarder>(
            [onSignal = std::move(onSignal)](int signal, const std::string&) {
              onSignal(signal);
              ::signal(signal, SIG_DFL);
              ::raise(signal);
            },
            std::move(onWarning))) {}
  TerminationSignals(const TerminationSignals&) = delete;
  TerminationSignals& operator=(const TerminationSignals&) = delete;
  ~TerminationSignals() {
    forwarder_.reset();  // stops before the scope restores the handlers
    const int signal = world::pendingSignal();
    scope_.reset();
    if (signal != 0) ::raise(signal);  // what it would have done without a world
  }

 private:
  std::unique_ptr<world::SignalScope> scope_;  // first: installed before the forwarder looks
  std::unique_ptr<world::SignalForwarder> forwarder_;
};

}  // namespace

JoinOptions JoinOptions::withEnvironment(JoinOptions options) {
  if (auto text = variable("HMC_RANK"))
    options.rank = collective::parseIntVariable("HMC_RANK", *text, 0, 1 << 24);
  if (auto text = variable("HMC_WORLD_SIZE"))
    options.worldSize = collective::parseIntVariable("HMC_WORLD_SIZE", *text, 1, 1 << 24);
  if (auto text = variable("HMC_MASTER_ADDR")) options.masterAddr = *text;
  if (auto text = variable("HMC_MASTER_PORT"))
    options.masterPort = collective::parseIntVariable("HMC_MASTER_PORT", *text, 0, 65535);
  if (auto text = variable("HMC_TRANSPORT")) {
    const auto transport = collective::transportFromString(*text);
    if (!transport || *transport == collective::Transport::kThreads ||
        *transport == collective::Transport::kAuto) {
      throw ValueError(fmt::format(
          "HMC_TRANSPORT='{}': a program's rank needs a transport between processes: tcp, "
          "store, gloo or nccl",
          printable(*text)));
    }
    options.transport = *transport;
  }
  if (auto text = variable("HMC_TIMEOUT")) options.timeout = secondsVariable("HMC_TIMEOUT", *text);
  if (auto text = variable("HMC_JOIN_TIMEOUT"))
    options.joinTimeout = secondsVariable("HMC_JOIN_TIMEOUT", *text);
  if (auto text = variable("HMC_NAME")) options.name = *text;
  if (auto text = variable("HMC_FLIGHT_CAPACITY"))
    options.flightCapacity = static_cast<std::size_t>(
        collective::parseIntVariable("HMC_FLIGHT_CAPACITY", *text, 1, 1 << 20));
  if (auto text = variable("HMC_REPORT")) options.reportPath = *text;
  if (auto text = variable("HMC_RECORD")) options.recordDirectory = *text;
  if (auto text = variable("HMC_RECORD_CAP")) {
    options.recordCap = static_cast<std::uint64_t>(
        collective::parseIntVariable("HMC_RECORD_CAP", *text, 4096, INT32_MAX));
  }
  return options;
}

struct World::Impl {
  JoinOptions options;
  world::RankPlacement placement;
  collective::ProcessTransport transport;
  std::shared_ptr<collective::KeyValueStore> kv;  // the end's own connection
  // Evidence that needs no store (hmc/world/evidence_folder.hpp): the ranks on rank 0's node
  // write their ends there too, and the lowest of them still alive reports when rank 0's
  // process is gone (and with it the store it hosted).
  world::EvidenceFolder folder;
  std::string storeAddress;
  std::shared_ptr<diagnostics::FlightRecorder> recorder;
  std::unique_ptr<diagnostics::Watchdog> watchdog;
  std::shared_ptr<lifecycle::ResourceManager> manager;
  std::unique_ptr<lifecycle::ResourceManager::ProcessScope> processScope;
  std::optional<WorldEnd> end;
  // A launcher's teardown: a connection of its own (the main thread may be in the store), and
  // one report, by whichever of the main thread and the signal's thread comes first.
  std::shared_ptr<collective::KeyValueStore> signalKv;
  std::mutex reportMutex;
  bool reported = false;
  // Open MPI's warning came (set first, read by a gather of the main thread's), and when rank
  // 0 reported at it (under reportMutex).
  std::atomic<bool> warning{false};
  std::optional<Clock::time_point> reportedAtWarning;
  // Rank 0 while the world forms: who has joined its store, read every 200 ms, so that the
  // report at a launcher's signal does not have to read it then (world/teardown.hpp).
  std::unique_ptr<world::JoinWatch> joinWatch;
  std::unique_ptr<TerminationSignals> signals;

  ~Impl() {
    // The signals first (their thread uses everything below), then the manager stops being
    // current before it goes, and the watchdog stops before the store.
    signals.reset();
    processScope.reset();
    watchdog.reset();
    if (transport.collective) transport.collective->setObserver(nullptr);
  }

  RankEnd closeOwn();
  // The ranks' meeting at the world's end, out of band (see its definition), before the
  // collective close. False when they did not all meet there (`own` then says why; `failure`:
  // this rank's wait there, when it gave up).
  bool meetAtEnd(RankEnd& own, std::optional<diagnostics::FailureView>& failure);
  // Whether every rank of `ranks` is alive and at work outside any collective, as its
  // heartbeat says (fresh, running, not announced dead).
  bool stillAtWork(collective::KeyValueStore& store, const std::vector<int>& ranks) const;
  // This rank's first failure as the manager noted it (the program's calls, caught or not).
  std::optional<diagnostics::FailureView> programFailure() const;
  // The specifications of this rank's open groups (at most kOpenGroupsShown).
  json openGroups() const;
  // What this rank was doing when `signal` came (0: Open MPI's warning of its teardown).
  RankEnd stoppedEnd(int signal) const;
  void publish(const RankEnd& own, collective::KeyValueStore& store);
  // Whether this rank reports in rank 0's place: rank 0's process on this node ended, and this
  // is the lowest rank of the node still alive.
  bool reportsForRank0() const;
  // Whether rank 0 hosted the store and its process on this node has ended.
  bool storeWentWithRank0() const;
  // Rank 0: every rank's end, printed (and written to reportPath); `signal`: stopped by it;
  // `atWarning`: at Open MPI's warning, the others' ends or the snapshots they published then.
  WorldEnd report(const RankEnd& own, collective::KeyValueStore& store, int signal = 0,
                  bool atWarning = false);
  // Every rank's end: polls until each is there, a rank is gone (rankGone: announced dead or
  // silent), or `wait` passes; cut to kWaitAtWarning once Open MPI's warning comes. With
  // `early` (or once warned), a rank's snapshot from the warning stands for its end.
  std::map<int, RankEnd> gatherEnds(const RankEnd& own, std::chrono::milliseconds wait,
                                    collective::KeyValueStore& store, bool early);
  // The ends of `ranks` (whose processes were seen to end after gatherEnds looked), read once
  // more into `ends`: a rank publishes its end before it exits, so one that ended after the
  // look may have published it in between (chaos --modes hosts --run-seed 432609112: ranks 2
  // and 5 finished their steps as rank 0 reported at mpirun's warning, and read as crashed).
  void lookAgain(std::map<int, RankEnd>& ends, const std::vector<int>& ranks,
                 collective::KeyValueStore& store) const;
  // Rank `rank`'s end document, where it is there: this node's evidence folder first, then
  // `store` (none: the folder alone); `early`: else its snapshot from Open MPI's warning, in
  // the same order. The store's errors propagate.
  std::optional<std::string> endText(int rank, collective::KeyValueStore* store,
                                     bool early) const;
  // The signal's thread: hand on what this rank did before the signal ends the process.
  void onSignal(int signal);
  // joinWorld failed with `error` before the world formed: rank 0 reports it (once), or the
  // rank standing in for a rank 0 that ended in or right after its join.
  void joinFailed(const std::exception& error);
  // joinWorld's steps after the join (see their definitions).
  void openStore();
  void setUp();
  // joinWorld failed on a rank other than 0 after it joined the evidence folder: its end there.
  void writeJoinEnd(const std::exception& error);
  // A rank stopped by `signal` (0: Open MPI's warning, which a SIGCONT after a SIGSTOP also
  // looks like) while at work outside any collective: its recording says so, as a sleep past
  // the deadline (and ends, at a signal), so that the merged replay has it at work where the
  // others waited for it, not crashed where its file ends (record/merge.cpp).
  void recordStop(int signal);
  // The signal's thread, at Open MPI's warning (mpirun only): each rank publishes a snapshot of
  // where it is; rank 0 reports from them, while the process still has a second.
  void onWarning();
  // Under reportMutex, once: publishes `own` (the end a signal that came already makes, in its
  // place) and, on rank 0, reports every rank's.
  WorldEnd handOn(RankEnd own, collective::KeyValueStore& store);
  void print(const WorldEnd& end, const std::vector<std::string>& lines,
             const std::optional<diagnostics::JobStatus>& status) const;
  void write(const WorldEnd& end, const nlohmann::json& ranks,
             const std::optional<diagnostics::JobStatus>& status,
             const diagnostics::Diagnosis& diagnosis) const;
};

std::optional<diagnostics::FailureView> World::Impl::programFailure() const {
  const auto noted = manager ? manager->firstFailure() : std::nullopt;
  if (!noted) return std::nullopt;
  diagnostics::FailureView view;
  view.rank = placement.rank;
  view.host = hostName();
  view.kind = diagnostics::failureKindOf(noted->errorKind, noted->mismatch.has_value());
  view.stage = noted->stage;
  view.sequence = noted->sequence;
  view.collectivesBefore = noted->collectivesBefore;
  view.op = noted->op;
  view.message = noted->message;
  if (noted->mismatch) view.mismatch = *noted->mismatch;
  return view;
}

json World::Impl::openGroups() const {
  json specs = json::array();
  for (const auto& group : manager->groups()) {
    if (specs.size() == kOpenGroupsShown) break;
    specs.push_back(group->specification);
  }
  return specs;
}

bool World::Impl::stillAtWork(collective::KeyValueStore& store,
                              const std::vector<int>& ranks) const {
  return world::ranksAtWork(store, storeAddress, ranks, kStoreRequest);
}

// Every rank meets at the world's end before the collective close of what is left, out of
// band (keys in the control store, as hmc-run's ranks agree on their shutdown): the close runs
// only once every rank is there and none hung. So a rank that reaches the end while the others
// still run a collective of the program (it skipped a close they run) does not enter that
// collective with its own close: it waits here, the others' collective names it as the rank
// that never arrived, and its end says that it was at the world's end, with which groups open.
// The wait is bounded: the deadline of a collective the others may be in, and a second, or,
// while every rank not there yet is alive and at work outside any collective (its heartbeat),
// up to the join timeout; a rank that stops waiting says so in the store, so that no rank
// closes without it.
bool World::Impl::meetAtEnd(RankEnd& own, std::optional<diagnostics::FailureView>& failure) {
  collective::KeyValueStore& store = *kv;
  const int size = placement.worldSize;
  const std::uint64_t sequence = transport.collective->sequence();
  const auto began = Clock::now();
  auto deadline = began + options.timeout + kWaitAfterHang;
  world::SilentRanks silent(options.timeout);
  const auto giveUp = [&](const std::string& why) {
    try {
      store.set(world::keys::kWorldEndUnclean, std::to_string(placement.rank));
    } catch (const std::exception&) {
    }
    own.leakReason = "not checked: " + why;
    return false;
  };
  // This rank's own failure here ('world end' #sequence): its view, and its end's status.
  const auto failHere = [&](std::string_view kind, const char* status, std::string message) {
    diagnostics::FailureView view;
    view.rank = placement.rank;
    view.host = hostName();
    view.kind = std::string(kind);
    view.stage = std::string(diagnostics::kWorldEndStage);
    view.sequence = sequence;
    view.collectivesBefore = sequence;
    view.op = "world end";
    view.message = std::move(message);
    failure = std::move(view);
    own.status = status;
    own.stage = std::string(diagnostics::kWorldEndStage);
    own.sequence = sequence;
    own.error = failure->message;
  };
  try {
    store.set(world::keys::worldAtEnd(placement.rank), std::to_string(sequence));
    store.add(world::keys::kWorldEndCount, 1);
    for (int round = 0;; ++round) {
      if (store.check({world::keys::kWorldEndUnclean})) {
        return giveUp(fmt::format("rank {} did not end its collectives cleanly: the world's "
                                  "collective close was skipped",
                                  store.get(world::keys::kWorldEndUnclean, kStoreRequest)));
      }
      if (store.add(world::keys::kWorldEndCount, 0) >= size) return true;
      std::vector<int> absent;
      if (round % 25 == 24 || Clock::now() >= deadline) {  // rank by rank: every 0.5 s
        for (int rank = 0; rank < size; ++rank) {
          if (!store.check({world::keys::worldAtEnd(rank)})) absent.push_back(rank);
        }
        for (const int rank : absent) {
          if (world::rankGone(store, nullptr, rank, placement.rank, &silent)) {
            return giveUp(fmt::format("rank {} is gone: the world's collective close was "
                                      "skipped",
                                      rank));
          }
        }
      }
      if (Clock::now() >= deadline && !absent.empty() && stillAtWork(store, absent) &&
          Clock::now() < began + options.joinTimeout) {
        // Every rank not here yet is alive and at work outside any collective (a checkpoint
        // saved by one rank): wait on, as a collective close would, up to the join timeout.
        deadline = Clock::now() + options.timeout;
      }
      if (Clock::now() >= deadline) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
            Clock::now() - began);
        failHere("timeout", "hang",
                 fmt::format("'{}' timed out on rank {} after {:g} s: ranks {} did not arrive",
                             diagnostics::kWorldEndStage, placement.rank,
                             std::chrono::duration<double>(waited).count(),
                             collective::formatRankList(absent)));
        failure->openGroups = openGroups();
        return giveUp("the ranks did not all reach the world's end");
      }
      // Two store requests a round: every 5 ms for the first 0.2 s (a world whose ranks end
      // together), then every 20 ms, so that a world of many ranks waiting here does not load
      // the store's host.
      std::this_thread::sleep_for(std::chrono::milliseconds(round < 40 ? 5 : 20));
    }
  } catch (const std::exception& error) {
    // Its end could not complete: a failure of its own (a partition of its host ended its
    // world while the others were fine), not an end with a note on its leaks. Ordered after a
    // crash that may have ended the store, before the ranks it left waiting.
    const std::string why =
        fmt::format("the store at {} failed at the world's end: {}", storeAddress, error.what());
    failHere(diagnostics::kStoreLost, "error", why);
    return giveUp(why);
  }
}

RankEnd World::Impl::closeOwn() {
  RankEnd own;
  own.rank = placement.rank;
  own.host = hostName();
  own.pid = processId();
  own.failure = programFailure();
  if (const auto hang = firstHang(*recorder)) {
    // A collective of this world hung already: nobody would come to a close.
    own.status = "hang";
    own.stage = hang->stage;
    own.sequence = hang->sequence;
    own.error = fmt::format("the program's '{}' #{} ended with {} before the world's end",
                            hang->stage, hang->sequence, hang->status);
    own.leakReason =
        fmt::format("not checked: the world hung in '{}' #{}", hang->stage, hang->sequence);
    try {  // the ranks waiting at the world's end need not wait for this one
      kv->set(world::keys::kWorldEndUnclean, std::to_string(placement.rank));
    } catch (const std::exception&) {
    }
    if (!own.failure) {
      diagnostics::FailureView view;
      view.rank = placement.rank;
      view.host = own.host;
      view.kind = hang->status;  // timeout or rank_failure
      view.stage = hang->stage;
      view.sequence = hang->sequence;
      view.collectivesBefore = hang->sequence;
      view.message = own.error;
      own.failure = std::move(view);
    }
    return own;
  }
  own.atEndSequence = transport.collective->sequence();
  own.openGroups = openGroups();
  std::optional<diagnostics::FailureView> atEnd;
  const bool met = meetAtEnd(own, atEnd);
  if (!own.failure) own.failure = atEnd;
  if (!met) return own;
  try {
    manager->closeGroups();
  } catch (const Error& error) {
    const bool hang =
        error.kind() == ErrorKind::kTimeout || error.kind() == ErrorKind::kRankFailure;
    own.status = hang ? "hang" : "error";
    own.error = error.what();
    if (const auto last = recorder->last()) {
      own.stage = last->stage;
      own.sequence = last->sequence;
    }
    if (!own.failure) own.failure = programFailure();  // the close_all, noted by the manager
    if (hang) {
      own.leakReason =
          fmt::format("not checked: the close hung in '{}' #{}", own.stage, own.sequence);
      return own;
    }
  }
  own.groupsLeft = manager->groupCount();
  own.boundGroupsLeft = manager->boundGroupCount();
  return own;
}

void World::Impl::publish(const RankEnd& own, collective::KeyValueStore& store) {
  // The folder first: a rank 0 that sees the store's key finds the file too, and a reporter in
  // rank 0's place needs no store.
  const std::string document = own.toJson().dump();
  if (folder.usable()) {
    if (const std::string problem = folder.writeResults(document); !problem.empty()) {
      spdlog::debug("hmc world: rank {} cannot write its end to {}: {}", placement.rank,
                    folder.path(), problem);
    }
  }
  try {
    store.set(world::keys::worldEnd(placement.rank), document);
  } catch (const std::exception& error) {
    spdlog::warn("hmc world: rank {} cannot publish its end (the store at {} is gone?): {}",
                 placement.rank, storeAddress, error.what());
  }
}

RankEnd World::Impl::stoppedEnd(int signal) const {
  RankEnd own;
  own.rank = placement.rank;
  own.host = hostName();
  own.pid = processId();
  own.status = "stopped";
  own.error = signal != 0 ? fmt::format("stopped by signal {} ({})", signal, strsignal(signal))
                          : std::string("stopped by mpirun's teardown (its SIGCONT, then SIGTERM)");
  if (const auto last = recorder->last()) {
    own.stage = last->stage;
    own.sequence = last->sequence;
    own.error +=
        last->endS ? fmt::format(" after '{}' #{} ({})", last->stage, last->sequence, last->status)
                   : fmt::format(" while waiting in '{}' #{}", last->stage, last->sequence);
    own.stoppedWaiting = !last->endS;
  }
  own.leakReason = "not checked: stopped by a signal before its end";
  // What went wrong before the signal (a caught error) comes first in the report, before the
  // launcher's teardown that may have followed it.
  own.failure = programFailure();
  return own;
}

void World::Impl::recordStop(int signal) {
  record::Recorder* recording = manager ? manager->recorder() : nullptr;
  if (recording == nullptr) return;
  const auto last = recorder->last();
  if (last && !last->endS) return;  // in a collective: the recording has that call in flight
  const double seconds = 2 * std::chrono::duration<double>(options.timeout).count() + 1;
  recording->append(record::EventOp::kSleep, -1, record::Outcome::kOk, std::chrono::nanoseconds(0),
                    {{"seconds", seconds},
                     {"stopped_by", signal != 0 ? fmt::format("signal {}", signal)
                                                : std::string("mpirun's teardown")}});
  // At Open MPI's warning the SIGKILL may come 50 ms after a SIGTERM this thread does not get
  // to: the marker stays; a merge drops it where the rank went on (a SIGCONT that was no
  // teardown). At the SIGTERM the recording ends.
  if (signal != 0) recording->end();
}

void World::Impl::onSignal(int signal) {
  recordStop(signal);
  std::lock_guard<std::mutex> guard(reportMutex);
  if (reported) return;
  if (!signalKv) {
    // While the world forms: rank 0 says that it did not, before the signal ends the process;
    // where rank 0 has ended (a crash right after its own join), the rank that stands in.
    if (placement.rank == 0) {
      reported = true;
      reportStoppedJoin(options, placement, signal,
                        joinWatch ? joinWatch->latest(std::chrono::seconds(1)) : std::nullopt);
    } else if (standsInAtJoin(placement) && storeRefuses(placement)) {
      // At once: mpirun's SIGKILL comes 50 ms after its SIGTERM. Nothing listens at rank 0's
      // store as the teardown's signal arrives: rank 0 had ended before it (a rank 0 stopped by
      // the same signal keeps its store while it reports, and reports itself).
      reported = true;
      reportRank0LostAtJoin(options, placement,
                            fmt::format("it was stopped by signal {} ({}) while the world formed",
                                        signal, strsignal(signal)),
                            true);
    }
    return;
  }
  if (reportedAtWarning) {
    reported = true;  // the report of the warning a second ago is this signal's
    return;
  }
  handOn(stoppedEnd(signal), *signalKv);
  std::fflush(stderr);
}

void World::Impl::joinFailed(const std::exception& error) {
  std::lock_guard<std::mutex> guard(reportMutex);
  if (reported) return;
  if (placement.rank == 0) {
    reported = true;
    reportFailedJoin(options, placement, error);
  } else if (standsInAtJoin(placement)) {
    reported = true;
    reportRank0LostAtJoin(options, placement, error.what());
  } else if (folder.usable()) {
    writeJoinEnd(error);
  }
}

void World::Impl::writeJoinEnd(const std::exception& error) {
  // joinWorld failed after this rank joined the evidence folder (HMC_RECORD's folder unusable,
  // say; a store lost there goes on with a LostStore instead, see connectAfterJoin). Its end
  // says so in the folder, where the rank reporting in rank 0's place reads it, rather than a
  // process that ended with no end, read as a crash (chaos seed 53752704). A store lost here is
  // ordered after a crash that may have ended it (kind store_lost).
  const auto* hmcError = dynamic_cast<const Error*>(&error);
  const bool storeLost = hmcError && hmcError->kind() == ErrorKind::kBackend;
  RankEnd own;
  own.rank = placement.rank;
  own.host = hostName();
  own.pid = processId();
  own.status = "error";
  own.stage = "join";
  own.error = fmt::format("hmc::joinWorld failed after the join{}: {}",
                          storeLost ? fmt::format(" (the store at {})", storeAddress) : "",
                          error.what());
  own.leakReason = "not checked: the world did not form";
  diagnostics::FailureView view;
  view.rank = own.rank;
  view.host = own.host;
  view.kind = storeLost ? std::string(diagnostics::kStoreLost) : std::string(diagnostics::kError);
  view.stage = own.stage;
  view.op = "join";
  view.message = own.error;
  own.failure = std::move(view);
  if (const std::string problem = folder.writeResults(own.toJson().dump()); !problem.empty()) {
    spdlog::debug("hmc world: rank {} cannot write its end to {}: {}", placement.rank,
                  folder.path(), problem);
  }
}

void World::Impl::onWarning() {
  warning = true;  // a gather of the main thread's stops waiting for the ranks that are gone
  recordStop(0);
  // The main thread reporting already finishes within the warning's second by itself.
  std::unique_lock<std::mutex> guard(reportMutex, std::try_to_lock);
  if (!guard.owns_lock() || reported) return;
  if (!signalKv) {
    // The world is forming. At the warning nothing of the teardown has ended yet: where
    // nothing listens at rank 0's store any more, rank 0 is what ended, and the rank standing
    // in for it reports (rank 0 alive reports itself at the SIGTERM).
    if (standsInAtJoin(placement) && storeRefuses(placement)) {
      reported = true;
      reportRank0LostAtJoin(options, placement, "mpirun began tearing the job down while the "
                                                "world formed (its SIGCONT)", true);
    }
    return;
  }
  const RankEnd own = stoppedEnd(0);
  // The rank that reports in rank 0's place (rank 0's process on this node ended) reports now,
  // as rank 0 would: the SIGKILL comes 50 ms after the SIGTERM, too soon for a report then.
  if (placement.rank != 0 && !reportsForRank0()) {
    const std::string document = own.toJson().dump();
    (void)folder.writeResults(document, /*early=*/true);
    try {
      signalKv->set(world::keys::worldEndAtWarning(placement.rank), document);
    } catch (const std::exception& error) {
      spdlog::warn("hmc world: rank {} cannot publish where it was at mpirun's teardown: {}",
                   placement.rank, error.what());
    }
    return;
  }
  report(own, *signalKv, SIGTERM, true);
  std::fflush(stderr);
  reportedAtWarning = Clock::now();
}

WorldEnd World::Impl::handOn(RankEnd own, collective::KeyValueStore& store) {
  // A launcher's teardown signal that came before this end is what ended this rank, even when
  // the main thread gets here first (its close failed as the peers went down with the same
  // signal): its end and the report say so. pendingSignal() counts only while the world holds
  // the signals.
  const int signal = signals ? world::pendingSignal() : 0;
  if (signal != 0 && own.status != "stopped") own = stoppedEnd(signal);
  publish(own, store);
  reported = true;
  if (placement.rank == 0 || reportsForRank0()) return report(own, store, signal);
  WorldEnd end;
  end.hung = own.status == "hang" || own.status == "stopped";
  end.clean = own.clean();
  end.exitCode = signal != 0 ? 128 + signal : end.hung ? 3 : (end.clean ? 0 : 1);
  end.summary = fmt::format("rank {}: {}", own.rank, own.describe());
  return end;
}

bool World::Impl::storeWentWithRank0() const {
  return placement.rank != 0 && placement.storeHost == world::StoreHost::kRankZero &&
         folder.ended(0);
}

bool World::Impl::reportsForRank0() const {
  return placement.rank != 0 && folder.ended(0) &&
         folder.lowestLiveRank(placement.worldSize) == placement.rank;
}

// The other ranks' ends, waiting up to `wait` (ranks that are gone are not waited for): from the
// evidence folder (the ranks of rank 0's node), else the store. Once the store fails (its host,
// rank 0, is gone), only the ranks of this node that are still alive are waited for.
std::map<int, RankEnd> World::Impl::gatherEnds(const RankEnd& own, std::chrono::milliseconds wait,
                                               collective::KeyValueStore& store, bool early) {
  std::map<int, RankEnd> ends{{own.rank, own}};
  world::SilentRanks silent(options.timeout);
  const int size = placement.worldSize;
  // In rank 0's place, with the store rank 0 hosted: the folder alone.
  bool storeUp = !storeWentWithRank0();
  const auto storeFailed = [&](const std::exception& error) {
    storeUp = false;
    spdlog::warn("hmc world: reading the ranks' ends from {}: {}", storeAddress, error.what());
  };
  const auto take = [&](int rank, const std::string& text) {
    try {
      ends[rank] = RankEnd::fromJson(json::parse(text));
    } catch (const json::exception& error) {
      spdlog::warn("hmc world: rank {}'s end is unreadable: {}", rank, error.what());
    }
  };
  // Rank `rank`'s end, if it is there yet: its own end, else (early) its snapshot.
  const auto look = [&](int rank) {
    try {
      if (auto text = endText(rank, storeUp ? &store : nullptr, early)) take(rank, *text);
    } catch (const std::exception& error) {
      storeFailed(error);
    }
  };
  const auto missingRanks = [&] {
    std::vector<int> missing;
    for (int rank = 0; rank < size; ++rank)
      if (ends.count(rank) == 0) missing.push_back(rank);
    return missing;
  };
  auto deadline = Clock::now() + wait;
  for (int round = 0;; ++round) {
    const std::vector<int> missing = missingRanks();
    if (missing.empty()) break;
    if (!early && warning.load()) {
      early = true;  // mpirun tears the job down: SIGKILL comes in a second
      deadline = std::min(deadline, Clock::now() + kWaitAtWarning);
    }
    // Each round one request for every end the store holds (the folder is written first, so
    // an end there is soon in the store too); every ~50 ms rank by rank (a file read, and a
    // request each): whose end is still missing, and whether one of them is gone (announced
    // dead, its process ended, or fallen silent: not waited for). Nothing per rank every round:
    // a world of a thousand ranks waits here.
    const bool rankByRank = round % 10 == 9;
    bool allInStore = false;
    if (storeUp && !rankByRank) {
      std::vector<std::string> keys;
      for (const int rank : missing) keys.push_back(world::keys::worldEnd(rank));
      try {
        allInStore = store.check(keys);
      } catch (const std::exception& error) {
        storeFailed(error);
      }
    }
    if (allInStore || rankByRank) {
      bool waiting = false;
      bool gone = false;
      for (const int rank : missing) {
        look(rank);
        if (ends.count(rank) != 0 || folder.ended(rank)) continue;  // ended: nothing will come
        if (!storeUp) {
          waiting = waiting || folder.alive(rank);  // nothing else can bring its end now
          continue;
        }
        waiting = true;
        if (rankByRank && !gone) {
          try {
            gone = world::rankGone(store, nullptr, rank, own.rank, &silent);
          } catch (const std::exception& error) {
            storeFailed(error);
          }
        }
      }
      if (!waiting || gone) break;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ends;
}

std::optional<std::string> World::Impl::endText(int rank, collective::KeyValueStore* store,
                                                bool early) const {
  if (auto text = folder.readResults(rank)) return text;
  if (early) {
    if (auto text = folder.readResults(rank, true)) return text;
  }
  if (store == nullptr) return std::nullopt;
  for (const auto& key : {world::keys::worldEnd(rank),
                          early ? world::keys::worldEndAtWarning(rank) : std::string()}) {
    if (!key.empty() && store->check({key})) return store->get(key, kStoreRequest);
  }
  return std::nullopt;
}

void World::Impl::lookAgain(std::map<int, RankEnd>& ends, const std::vector<int>& ranks,
                            collective::KeyValueStore& store) const {
  collective::KeyValueStore* const up = storeWentWithRank0() ? nullptr : &store;
  for (const int rank : ranks) {
    if (ends.count(rank) != 0) continue;
    try {
      if (auto text = endText(rank, up, false)) ends[rank] = RankEnd::fromJson(json::parse(*text));
    } catch (const std::exception& error) {
      spdlog::debug("hmc world: rank {}'s end, read again: {}", rank, error.what());
    }
  }
}

namespace {

// The furthest program collective a rank with an end failed in (chaos --modes hosts
// --run-seed 258839842: h3 cut off in 'recycle' #2 on the store transport, which ranks 0-3
// completed before they hung in #3 without h3; rank 5's heartbeat in #2 read as the hang).
std::optional<std::uint64_t> furthestFailure(const std::map<int, RankEnd>& ends) {
  std::optional<std::uint64_t> furthest;
  for (const auto& [rank, found] : ends) {
    if ((found.status == "hang" || found.status == "error") && found.stage != "join" &&
        found.stage != diagnostics::kWorldEndStage) {
      furthest = std::max(furthest.value_or(0), found.sequence);
    }
  }
  return furthest;
}

// The host rank `rank` joined from (its join wrote it in the store), or "".
std::string joinedHostOf(collective::KeyValueStore& store, int rank) {
  try {
    return collective::joinedHost(store, rank, kStoreRequest).value_or(std::string());
  } catch (const std::exception& error) {
    spdlog::debug("hmc world: rank {}'s host from the store: {}", rank, error.what());
    return std::string();
  }
}

// A rank that left no end within `wait`: where its heartbeat says it was, and its host.
// `endedPid`: its process on this node (the evidence folder's pid file) has ended.
json missingRank(int rank, const std::optional<diagnostics::JobStatus>& status,
                 std::chrono::milliseconds wait, bool connectionClosed,
                 std::optional<std::int64_t> endedPid, int reporter, bool resultLost,
                 const std::string& joinedHost) {
  // Without a heartbeat (a host lost right after the join): the host its join wrote, pid unknown.
  std::string where = endedPid             ? fmt::format("{}:{}", printable(hostName()), *endedPid)
                      : joinedHost.empty() ? std::string("host unknown")
                                           : fmt::format("{}:?", printable(joinedHost));
  std::string what = "no heartbeat";
  if (status && rank < static_cast<int>(status->ranks.size())) {
    const auto& rankStatus = status->ranks[rank];
    if (rankStatus.heartbeat) {
      const auto& beat = *rankStatus.heartbeat;
      where = fmt::format("{}:{}", printable(beat.host), beat.pid);
      what = std::string(diagnostics::toString(beat.state));
      if (beat.current && diagnostics::isWaitStatus(beat.current->status)) {
        what += fmt::format(" in '{}' #{} for {:.1f} s", beat.current->stage,
                            beat.current->sequence, rankStatus.inStageS);
      } else if (beat.lastCompleted) {
        what += fmt::format(" outside any collective, last completed '{}' #{}",
                            beat.lastCompleted->stage, beat.lastCompleted->sequence);
      }
    }
    if (rankStatus.dead) what += "; announced dead: " + *rankStatus.dead;
  }
  // To a tenth of a second: the wait may have been cut short (Open MPI's warning).
  const double waitedS = std::round(std::chrono::duration<double>(wait).count() * 10) / 10;
  std::string text;
  if (endedPid) {
    text = fmt::format("no end: its process ({}) has ended: it exited, crashed or was killed",
                       *endedPid);
    if (what != "no heartbeat") text += "; its heartbeat: " + what;
  } else if (resultLost) {
    text = fmt::format(
        "no end: the store went with rank 0, and this rank is not in the evidence folder of rank "
        "{}'s node ({}): it runs on another host (or never joined the folder), and its end had "
        "no way here",
        reporter, printable(hostName()));
    if (connectionClosed) {
      text += fmt::format("; its connection with rank {} had closed: it ended, exited, crashed or "
                          "was killed", reporter);
    }
  } else {
    text = fmt::format("no end within {:g} s; its heartbeat: {}", waitedS, what);
    if (connectionClosed) {
      text += fmt::format(
          "; its connection with rank {} had closed: it exited, crashed or was killed", reporter);
    }
  }
  json entry = {{"rank", rank}, {"status", "missing"}, {"where", where}, {"error", text}};
  // Its host as every other rank's entry has it ("" unknown), beside "where" (host:pid).
  entry["host"] = where == "host unknown" ? std::string() : where.substr(0, where.rfind(':'));
  if (resultLost) entry["result_lost"] = true;
  return entry;
}

}  // namespace

namespace {

// A rank's end as the diagnosis sees it: its first failure, else how its end failed, a leak, or
// nothing.
std::optional<diagnostics::FailureView> failureOf(const RankEnd& end) {
  if (end.failure) {
    diagnostics::FailureView view = *end.failure;
    view.rank = end.rank;
    if (view.host.empty()) view.host = end.host;
    return view;
  }
  diagnostics::FailureView view;
  view.rank = end.rank;
  view.host = end.host;
  view.message = end.error;
  if (end.status == "stopped") {
    view.kind = std::string(diagnostics::kStopped);
    // It had arrived where it waited: where the others waited for someone there, not the
    // cause (mpirun's teardown after a crash reached it first).
    if (end.stoppedWaiting) view.waitedIn = std::make_pair(end.stage, end.sequence);
  } else if (end.status == "hang" || end.status == "error") {
    view.kind = end.status == "hang" ? "timeout" : std::string(diagnostics::kError);
    view.stage = end.stage;
    view.sequence = end.sequence;
    view.collectivesBefore = end.sequence;
  } else if (end.groupsLeft && *end.groupsLeft > 0) {
    view.kind = std::string(diagnostics::kLeak);
    view.message = fmt::format("{} group(s) left open ({} bound) after the world's close",
                               *end.groupsLeft, end.boundGroupsLeft);
  } else {
    return std::nullopt;
  }
  return view;
}

// A rank that left no end: crashed (its process or connection ended), waiting in a collective
// (its heartbeat says so), or not known (missing).
// `passed`: the furthest collective a rank with an end failed in or reached the end after:
// a rank still waiting in an earlier one that others completed arrived there (its host cut
// off as it read the result), and is not where the world hung.
// `local`: the first failure it wrote in this node's evidence folder, if it did.
diagnostics::FailureView missingView(int rank, const json& entry,
                                     const std::optional<diagnostics::JobStatus>& status,
                                     bool ended, std::optional<std::uint64_t> passed,
                                     const std::optional<std::string>& local) {
  diagnostics::FailureView view;
  view.rank = rank;
  view.message = entry.at("error").get<std::string>();
  const std::string where = entry.at("where").get<std::string>();
  if (where != "host unknown") view.host = where.substr(0, where.rfind(':'));
  view.kind = std::string(ended ? diagnostics::kCrash : diagnostics::kMissing);
  const bool inStatus = status && rank < static_cast<int>(status->ranks.size());
  const auto* beat = inStatus ? &status->ranks[rank].heartbeat : nullptr;
  // Its own first failure: what it met before its end failed to come (killed later, or still
  // at work past the wait), from its heartbeat, else from this node's evidence folder.
  const auto ownFailure = [&](const json& document, const char* from) {
    try {
      diagnostics::FailureView own = diagnostics::FailureView::fromJson(document);
      own.rank = rank;
      if (own.host.empty()) own.host = view.host;
      return std::optional<diagnostics::FailureView>(std::move(own));
    } catch (const json::exception& error) {
      spdlog::warn("hmc world: rank {}'s {} has an unreadable first failure: {}", rank, from,
                   error.what());
      return std::optional<diagnostics::FailureView>();
    }
  };
  if (beat && *beat && (*beat)->firstFailure) {
    if (auto own = ownFailure(*(*beat)->firstFailure, "heartbeat")) return *own;
  } else if (local) {
    const json document = json::parse(*local, nullptr, false);
    if (!document.is_discarded()) {
      if (auto own = ownFailure(document, "evidence file")) return *own;
    }
  }
  if (!inStatus || ended) return view;
  const auto& heartbeat = status->ranks[rank].heartbeat;
  if (heartbeat && heartbeat->current && diagnostics::isWaitStatus(heartbeat->current->status) &&
      !status->ranks[rank].dead && (!passed || heartbeat->current->sequence >= *passed)) {
    view.kind = "timeout";
    view.stage = heartbeat->current->stage;
    view.sequence = heartbeat->current->sequence;
    view.collectivesBefore = heartbeat->current->sequence;
  }
  return view;
}

// The end document's head (hmc-world-end/1): what the world was.
json endDocument(const JoinOptions& options, const world::RankPlacement& placement,
                 const std::string& store) {
  return {{"format", kEndFormat},
          {"name", options.name},
          {"world_size", placement.worldSize},
          {"launcher", placement.launcher},
          {"transport", collective::toString(options.transport)},
          {"timeout_s", std::chrono::duration<double>(options.timeout).count()},
          {"store", store}};
}

// "rank 3", "ranks [1, 2]", "no rank named".
std::string namedRanks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank named";
  if (ranks.size() == 1) return fmt::format("rank {}", ranks.front());
  return fmt::format("ranks {}", collective::formatRankList(ranks));
}

// "manifest mismatch in 'close validation' #26": the verdict line's words for a first failure.
std::string verdictWords(const diagnostics::FirstFailure& first) {
  const std::string words = diagnostics::failureKindWords(first.kind);
  if (first.kind == diagnostics::kCollectiveMismatch && first.sequence) {
    return fmt::format("{} at #{}", words, *first.sequence);
  }
  if (first.sequence) return fmt::format("{} in '{}' #{}", words, first.stage, *first.sequence);
  if (!first.stage.empty()) return fmt::format("{} in '{}'", words, first.stage);
  return words;
}

}  // namespace

WorldEnd World::Impl::report(const RankEnd& own, collective::KeyValueStore& store, int signal,
                             bool atWarning) {
  const int size = placement.worldSize;
  const auto wait = atWarning              ? kWaitAtWarning
                    : signal != 0          ? kWaitAfterSignal
                    : own.status == "hang" ? kWaitAfterHang
                                           : options.timeout;
  const auto began = Clock::now();
  std::map<int, RankEnd> ends = gatherEnds(own, wait, store, atWarning);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began);
  // The ranks whose connections with this one closed (exited, crashed or killed), where the
  // transport can tell, for those that left no end.
  std::vector<int> closed;
  if (static_cast<int>(ends.size()) < size) {
    if (const auto closedPeers = collective::closedPeersOf(transport)) closed = closedPeers();
    std::vector<int> ended = closed;
    for (int rank = 0; rank < size; ++rank) {
      if (folder.ended(rank)) ended.push_back(rank);
    }
    lookAgain(ends, ended, store);
  }
  std::optional<diagnostics::JobStatus> status;
  const bool storeGone = storeWentWithRank0();
  if ((static_cast<int>(ends.size()) < size || !own.clean()) && !storeGone) {
    try {
      status = diagnostics::readJobStatus(store, storeAddress, kStoreRequest);
    } catch (const std::exception& error) {
      spdlog::warn("hmc world: reading the job's status from {}: {}", storeAddress, error.what());
    }
  }
  std::vector<diagnostics::FailureView> views;
  std::vector<std::string> hosts(size);
  json ranks = json::array();
  const std::optional<std::uint64_t> passed = furthestFailure(ends);
  for (int rank = 0; rank < size; ++rank) {
    if (auto it = ends.find(rank); it != ends.end()) {
      const RankEnd& found = it->second;
      hosts[rank] = found.host;
      ranks.push_back(found.toJson());
      if (auto view = failureOf(found)) views.push_back(std::move(*view));
    } else {
      const bool connectionClosed = std::find(closed.begin(), closed.end(), rank) != closed.end();
      const auto endedPid = folder.ended(rank) ? folder.pidOf(rank) : std::nullopt;
      // In rank 0's place with the store gone with it, a rank of another host had no way to
      // send its end here: a closed connection says that it ended, not how (it may have ended
      // by itself after its program met rank 0's end: chaos seed 1402272991).
      const bool resultLost = storeGone && !folder.known(rank);
      ranks.push_back(missingRank(rank, status, std::min(wait, waited), connectionClosed, endedPid,
                                  placement.rank, resultLost,
                                  storeGone ? std::string() : joinedHostOf(store, rank)));
      views.push_back(missingView(rank, ranks.back(), status,
                                  (connectionClosed && !resultLost) || endedPid, passed,
                                  folder.readFirstFailure(rank)));
      hosts[rank] = views.back().host;
    }
  }
  std::map<int, std::string> whereabouts;
  for (const auto& [rank, found] : ends) {
    if (!found.atEndSequence || found.failure) continue;
    std::vector<std::string> specs;
    for (const json& spec : found.openGroups) {
      specs.push_back(spec.is_string() ? spec.get<std::string>() : spec.dump());
    }
    whereabouts[rank] = fmt::format(
        "it had reached the world's end after {} collectives, with {} group(s) open{}",
        *found.atEndSequence, found.openGroups.size(),
        specs.empty() ? std::string() : fmt::format(" ({})", fmt::join(specs, ", ")));
  }
  const diagnostics::Diagnosis diagnosis =
      diagnostics::diagnose(views, size, hosts, whereabouts);
  const std::map<int, std::string> following = diagnosis.consequenceByRank();
  std::vector<std::string> lines;
  for (const json& rank : ranks) {
    const int number = rank.at("rank").get<int>();
    std::string line;
    if (auto it = ends.find(number); it != ends.end()) {
      line = fmt::format("  rank {} ({}:{}): {}", number, printable(it->second.host),
                         it->second.pid, it->second.describe(diagnosis.first));
    } else {
      line = fmt::format("  rank {} ({}): {}", number, rank.at("where").get<std::string>(),
                         rank.at("error").get<std::string>());
    }
    if (diagnosis.first) {
      const auto& named = diagnosis.first->ranks;
      if (std::find(named.begin(), named.end(), number) != named.end()) {
        line += " [the first failure]";
      } else if (following.count(number) != 0) {
        line += " [follows from the first failure]";
      }
    }
    lines.push_back(std::move(line));
  }
  WorldEnd end;
  end.hung = diagnosis.hang();
  end.clean = !diagnosis.first;
  end.exitCode = signal != 0 ? 128 + signal : !diagnosis.first ? 0 : (end.hung ? 3 : 1);
  if (diagnosis.first) end.firstFailure = diagnosis.first->line;
  end.summary =
      atWarning ? std::string(
                      "STOPPED: mpirun began tearing the job down (its SIGCONT, 1 s before "
                      "SIGTERM); what every rank did until then is above")
      : signal != 0
          ? fmt::format("STOPPED: rank {} was stopped by signal {} ({}); what every rank did "
                        "until then is above",
                        placement.rank, signal, strsignal(signal))
      : end.clean ? fmt::format("OK: every rank of {} ended cleanly", size)
                  : fmt::format("{}: {}, {}{}", end.hung ? "HUNG" : "FAILED",
                                verdictWords(*diagnosis.first),
                                namedRanks(diagnosis.first->ranks),
                                diagnosis.consequences.empty()
                                    ? std::string()
                                    : fmt::format("; {} rank(s) failed after it, following from it",
                                                  diagnosis.consequences.size()));
  print(end, lines, status);
  if (options.reportPath) {
    write(end, ranks, status, diagnosis);
  }
  folder.remove();  // the ends are reported; a rank that writes one now finds no folder
  return end;
}

void World::Impl::print(const WorldEnd& end, const std::vector<std::string>& lines,
                        const std::optional<diagnostics::JobStatus>& status) const {
  fmt::print(stderr,
             "# hmc: world '{}' of {} ranks ({}, transport {}, deadline {:g} s), store {}\n",
             options.name, placement.worldSize, placement.launcher,
             collective::toString(options.transport),
             std::chrono::duration<double>(options.timeout).count(), storeAddress);
  if (placement.rank != 0) {
    fmt::print(stderr,
               "# hmc: rank 0's process ({}) has ended without reporting; rank {}, the lowest "
               "rank of its node still alive, reports in its place from what the ranks of the "
               "node wrote\n",
               folder.pidOf(0).value_or(0), placement.rank);
  }
  if (!end.firstFailure.empty()) fmt::print(stderr, "# first failure: {}\n", end.firstFailure);
  for (const auto& line : lines) fmt::print(stderr, "{}\n", line);
  if (status && !end.clean) {
    if (!status->diagnosis.empty()) fmt::print(stderr, "# waits: {}\n", status->diagnosis);
    for (const auto& rank : status->ranks) {
      if (!rank.problem.empty()) fmt::print(stderr, "# {}\n", rank.problem);
    }
  }
  fmt::print(stderr, "# {} (exit {})\n", end.summary, end.exitCode);
}

void World::Impl::write(const WorldEnd& end, const json& ranks,
                        const std::optional<diagnostics::JobStatus>& status,
                        const diagnostics::Diagnosis& diagnosis) const {
  json document = endDocument(options, placement, storeAddress);
  document.update(json{{"outcome", end.clean ? "pass" : (end.hung ? "hang" : "fail")},
                   {"exit_code", end.exitCode},
                   {"verdict", end.summary}});
  document.update(diagnosis.toJson());  // first_failure, consequences: read first
  document["ranks"] = ranks;
  if (status) document["status"] = status->toJson();
  try {
    scenario::writeOutputFile(*options.reportPath, document.dump(2) + "\n");
  } catch (const std::exception& error) {
    fmt::print(stderr, "# hmc: cannot write the report to {}: {}\n", *options.reportPath,
               error.what());
  }
}

namespace {

// Rank 0's report of a world that did not form (a rank killed or absent while it formed): the
// verdict line and the end document, as for any end, before the error reaches the program.
// The verdict and the end document of a world that did not form, with `first` its first
// failure: `outcome` "hang" (exit 3) or, stopped by a launcher's signal, "stopped" (128 + it).
void reportWorldNotFormed(const JoinOptions& options, const world::RankPlacement& placement,
                          const diagnostics::FirstFailure& first, const std::string& summary,
                          int exitCode) {
  diagnostics::Diagnosis diagnosis;
  diagnosis.first = first;
  fmt::print(stderr,
             "# hmc: world '{}' of {} ranks ({}, transport {}, join timeout {:g} s) did not "
             "form\n# first failure: {}\n# {} (exit {})\n",
             options.name, placement.worldSize, placement.launcher,
             collective::toString(options.transport),
             std::chrono::duration<double>(options.joinTimeout).count(), first.line, summary,
             exitCode);
  std::fflush(stderr);
  if (!options.reportPath) return;
  json document =
      endDocument(options, placement, fmt::format("{}:{}", placement.masterAddr,
                                                  placement.masterPort));
  document.update(json{{"outcome", "hang"}, {"exit_code", exitCode}, {"verdict", summary}});
  document.update(diagnosis.toJson());
  document["ranks"] = json::array();
  try {
    scenario::writeOutputFile(*options.reportPath, document.dump(2) + "\n");
  } catch (const std::exception& problem) {
    fmt::print(stderr, "# hmc: cannot write the report to {}: {}\n", *options.reportPath,
               problem.what());
  }
}

// Rank 0's report of a world whose join failed (a rank killed or absent while it formed).
void reportFailedJoin(const JoinOptions& options, const world::RankPlacement& placement,
                      const std::exception& error) {
  const std::string text = error.what();
  const std::vector<int> missing = diagnostics::ranksNamedIn(text);
  diagnostics::FirstFailure first;
  first.kind = std::string(diagnostics::kHang);
  first.stage = "join";
  first.ranks = missing;
  first.seenBy = {placement.rank};
  first.line = fmt::format("hang in the world's join: {}: {}",
                           missing.empty() ? std::string("the world did not form")
                                           : namedRanks(missing) + " did not join",
                           printable(text));
  reportWorldNotFormed(options, placement, first,
                       fmt::format("HUNG: the world did not form, {}", namedRanks(missing)), 3);
}

// Rank 0's report of a world whose join a launcher's signal stopped: mpirun and torchrun tear a
// job down when one of its processes ends, which may be a rank killed before it joined, or
// after (its connections to rank 0's store closed). The ranks that had not joined are named
// (their hosts are not known: they never said), and those gone after joining, with theirs.
// `recent`: who had joined, read a moment ago (JoinWatch: a read now may outlast mpirun's
// SIGKILL); else read now.
void reportStoppedJoin(const JoinOptions& options, const world::RankPlacement& placement,
                       int signal, std::optional<world::JoinState> recent) {
  const std::string launcher = placement.launcher.empty() ? "the launcher" : placement.launcher;
  std::optional<world::JoinState> join = std::move(recent);
  if (!join && placement.masterPort != 0 && placement.worldSize >= 2) {
    std::string problem;
    join = world::readJoinState(placement, &problem);
    if (!join) {
      spdlog::warn("hmc world '{}': cannot read which ranks joined the store at {}:{}: {}",
                   options.name, placement.masterAddr, placement.masterPort, problem);
    }
  }
  if (join) world::probeJoinedHosts(*join, placement.rank, world::kHostProbe);
  const std::string store = fmt::format("{}:{}", placement.masterAddr, placement.masterPort);
  diagnostics::FirstFailure first;
  std::vector<int> lost;  // joined, then their processes ended or their hosts went silent
  if (join) {
    lost = join->gone;
    lost.insert(lost.end(), join->unreachable.begin(), join->unreachable.end());
  }
  first.kind = std::string(!lost.empty() ? diagnostics::kCrash : diagnostics::kStopped);
  first.stage = "join";
  if (join) {
    first.ranks = join->missing;
    first.ranks.insert(first.ranks.end(), lost.begin(), lost.end());
    std::sort(first.ranks.begin(), first.ranks.end());
    for (const int rank : lost) {
      const std::string& host = join->hosts.at(rank);
      if (std::find(first.hosts.begin(), first.hosts.end(), host) == first.hosts.end()) {
        first.hosts.push_back(host);
      }
    }
  }
  if (first.ranks.empty()) first.ranks = {placement.rank};
  first.seenBy = {placement.rank};
  std::string known;
  if (!join) {
    known = "which ranks had joined is not known (the store did not answer)";
  } else if (join->missing.empty() && lost.empty()) {
    known = "every rank had joined the store";
  } else {
    std::vector<std::string> parts;
    // "rank 3 (host h2) ... its host" or "ranks [2 (host h2), 3 (host h2)] ... their hosts".
    const auto withHosts = [&](const std::vector<int>& ranks) {
      std::vector<std::string> named;
      for (const int rank : ranks) {
        named.push_back(fmt::format("{} (host {})", rank, join->hosts.at(rank)));
      }
      return ranks.size() == 1 ? fmt::format("rank {}", named.front())
                               : fmt::format("ranks [{}]", fmt::join(named, ", "));
    };
    const auto whose = [](const std::vector<int>& ranks) {
      return ranks.size() == 1 ? "its host" : "their hosts";
    };
    if (!join->gone.empty()) {
      parts.push_back(fmt::format(
          "{} joined the store at {}, then every connection from {} to it closed (a process "
          "that ends closes them: killed, crashed, or its host went down)",
          withHosts(join->gone), store, whose(join->gone)));
    }
    if (!join->unreachable.empty()) {
      parts.push_back(fmt::format(
          "{} joined the store at {}, then {} stopped answering (no TCP handshake within {:g} s: "
          "down or cut off)",
          withHosts(join->unreachable), store, whose(join->unreachable),
          std::chrono::duration<double>(world::kHostProbe).count()));
    }
    if (join->storeNotUp) {
      parts.push_back(fmt::format(
          "rank {} had not started the store at {} yet, so {} had not joined it", placement.rank,
          store, namedRanks(join->missing)));
    } else if (!join->missing.empty()) {
      parts.push_back(
          fmt::format("{} had not joined the store at {}", namedRanks(join->missing), store));
    }
    known = fmt::format("{}", fmt::join(parts, "; "));
  }
  const std::string stopped = fmt::format("rank {} was stopped by signal {} ({}) while the world "
                                          "formed",
                                          placement.rank, signal, strsignal(signal));
  // A crash (ranks gone after they joined) first; else the stop, and what is known of who had
  // joined.
  first.line = fmt::format(
      "{} in the world's join: {}; {}; {} stops every rank when one of its processes ends: its "
      "output names the one that ended first",
      first.kind, first.kind == diagnostics::kCrash ? known : stopped,
      first.kind == diagnostics::kCrash ? stopped : known, launcher);
  reportWorldNotFormed(
      options, placement, first,
      fmt::format("STOPPED: the world did not form: rank {} was stopped by signal {} ({}) while "
                  "it formed",
                  placement.rank, signal, strsignal(signal)),
      128 + signal);
}

// The evidence folder's tag: the store's port, so that a rank of rank 0's node finds the folder
// of a rank 0 that ended before the others joined it.
std::string folderTag(const world::RankPlacement& placement) {
  return placement.masterPort == 0 ? std::string() : std::to_string(placement.masterPort);
}

// The rank's index on its node, from the launcher's environment.
std::optional<int> localRank() {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      return std::atoi(value);
    }
  }
  return std::nullopt;
}

// Under a launcher, the rank that reports in rank 0's place when rank 0 ended while the world
// formed: local rank 1 of the node that hosts rank 0's store.
bool standsInAtJoin(const world::RankPlacement& placement) {
  if (placement.rank == 0 || !placement.underLauncher() ||
      placement.storeHost != world::StoreHost::kRankZero || placement.masterPort == 0) {
    return false;
  }
  const bool storeHere = hmc::detail::loopbackListenAddress(placement.masterAddr).has_value() ||
                         placement.masterAddr == hostName();
  const auto local = localRank();
  return storeHere && local && *local == 1;
}

// Whether a new connection to rank 0's store is refused (nothing listens there any more).
bool storeRefuses(const world::RankPlacement& placement) {
  const std::string why = hmc::detail::handshakeFails(
      hmc::detail::resolveAddresses(placement.masterAddr, placement.masterPort),
      std::chrono::milliseconds(300));
  return why.find("refused") != std::string::npos;
}

// The rank standing in: reports the world that did not form because rank 0 ended after its own
// join (its evidence folder is there and its process has ended: it neither reported nor
// removed it), and removes that folder; a rank 0 that is alive reports itself. `seen`: what
// this rank met ("c10d store ... went away", a signal). `storeRefused`: nothing listens at
// rank 0's store (at Open MPI's warning or the teardown's signal). Without rank 0's folder that does not tell a rank 0 that ended from one that had not
// started its store yet (still loading): the report says the world was stopped and what is
// known of rank 0, not that it crashed.
void reportRank0LostAtJoin(const JoinOptions& options, const world::RankPlacement& placement,
                           const std::string& seen, bool storeRefused) {
  const auto orphans = world::EvidenceFolder::orphans(folderTag(placement), placement.rank);
  if (orphans.empty() && !storeRefused) return;
  const bool ended = !orphans.empty();
  diagnostics::FirstFailure first;
  first.kind = std::string(ended ? diagnostics::kCrash : diagnostics::kStopped);
  first.stage = "join";
  first.ranks = {0};
  first.hosts = {hostName()};
  first.seenBy = {placement.rank};
  first.line =
      ended ? fmt::format("crash in the world's join: rank 0 (host {}, the store's host) ended "
                          "right after its own join, while the others joined; rank {}: {}",
                          hostName(), placement.rank, printable(seen))
            : fmt::format("stopped in the world's join: rank {}: {}; nothing listens at rank 0's "
                          "store at {}:{} (host {}): rank 0 ended before it had finished "
                          "joining, or had not started its store yet",
                          placement.rank, printable(seen), placement.masterAddr,
                          placement.masterPort, hostName());
  fmt::print(stderr,
             "# hmc: rank 0 has not reported while the world formed; rank {}, of rank 0's node, "
             "reports in its place\n",
             placement.rank);
  if (ended) {
    reportWorldNotFormed(options, placement, first,
                         "HUNG: the world did not form: rank 0 (the store's host) ended while it "
                         "formed",
                         3);
  } else {
    reportWorldNotFormed(options, placement, first,
                         "STOPPED: the world did not form: the launcher stopped it while rank 0's "
                         "store was not there",
                         128 + SIGTERM);
  }
  for (const auto& folder : orphans) folder.remove();
}

}  // namespace

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;

World::~World() {
  if (!impl_ || impl_->end) return;
  try {
    close();
  } catch (const std::exception& error) {
    spdlog::error("hmc world: rank {}'s end failed: {}", impl_->placement.rank, error.what());
  }
}

int World::rank() const noexcept { return impl_->placement.rank; }
int World::worldSize() const noexcept { return impl_->placement.worldSize; }
const std::string& World::launcher() const noexcept { return impl_->placement.launcher; }
std::string World::storeAddress() const { return impl_->storeAddress; }
std::shared_ptr<lifecycle::ResourceManager> World::manager() const { return impl_->manager; }
lifecycle::ResourceManager::Scope World::scope() const {
  return lifecycle::ResourceManager::Scope(impl_->manager);
}

WorldEnd World::close() {
  if (impl_->end) return *impl_->end;
  impl_->recorder->setStep(-1);  // the program's body (step 0) is over: "after its steps"
  const RankEnd own = impl_->closeOwn();
  // The heartbeat of the close's last collective, not of one up to a period ago: rank 0's
  // report reads every rank's heartbeat right after (its "waits" line named rank 0's earlier
  // 'close validation' #21 while the close had ended in #26).
  impl_->watchdog->beatNow();
  // Complete before the report: a rank that is killed while the others report keeps it.
  if (record::Recorder* recording = impl_->manager->recorder()) recording->end();
  // Rank 0 reported at Open MPI's warning a moment ago: the SIGTERM that follows it within a
  // second ends the process; a report now would be a second one. Should it not come (a SIGCONT
  // that was not a teardown), the end goes on.
  std::optional<Clock::time_point> warned;
  {
    std::lock_guard<std::mutex> guard(impl_->reportMutex);
    warned = impl_->reportedAtWarning;
  }
  if (warned) {
    while (Clock::now() < *warned + kAfterWarning && world::pendingSignal() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  WorldEnd end;
  {
    std::lock_guard<std::mutex> guard(impl_->reportMutex);
    // A report made at Open MPI's warning whose SIGTERM came: that report is this end's, even
    // when this thread takes the lock before the signal's thread marks it reported (a second,
    // different report came out that way).
    if (impl_->reported || (impl_->reportedAtWarning && world::pendingSignal() != 0)) {
      // The signal's thread handed on this rank's end and ends the process.
      end.hung = true;
      end.summary = fmt::format("rank {}: stopped by a signal", own.rank);
      end.exitCode = 128 + world::pendingSignal();
    } else {
      end = impl_->handOn(own, *impl_->kv);
    }
  }
  // The heartbeats say "done" from here on; the manager is no longer current; a signal now does
  // what it would do without a world (one that came already ends the process here).
  impl_->signals.reset();
  impl_->watchdog.reset();
  impl_->processScope.reset();
  impl_->end = end;
  return end;
}

// After the join: this rank's connection to the world's store (rank 0 and the rank standing in
// for it fail joinWorld where it is gone; the others go on: connectAfterJoin), and the evidence
// folder of rank 0's node.
void World::Impl::openStore() {
  storeAddress = fmt::format("{}:{}", transport.control->host(), transport.control->port());
  if (placement.rank != 0 && !standsInAtJoin(placement)) {
    kv = connectAfterJoin(*transport.control, placement.rank, storeAddress);
  } else {
    try {
      kv = transport.control->keyValueStore();
    } catch (const std::exception& error) {
      joinFailed(error);  // rank 0, the store's host, ended right after its own join
      throw;
    }
  }
  if (placement.rank == 0) {
    folder = world::EvidenceFolder::create(0, folderTag(placement));
    folder.announce(*kv);
  } else {
    folder = world::EvidenceFolder::join(*kv, placement.rank, options.joinTimeout);
    if (!folder.usable() && dynamic_cast<LostStore*>(kv.get()) != nullptr) {
      // The announcement is out of reach with the store: rank 0's folder on this node, if
      // rank 0 ran here, is where the rank reporting in its place reads this rank's end.
      folder = world::EvidenceFolder::joinOrphan(folderTag(placement), placement.rank);
    }
  }
}

// After the join: the flight recorder, the manager, the watchdog, the signal thread's store,
// the recording; rank 0 prints the join line.
void World::Impl::setUp() {
  recorder = std::make_shared<diagnostics::FlightRecorder>(options.flightCapacity);
  recorder->keepDurations(false);  // bounded however long the program runs
  transport.collective->setObserver(recorder.get());
  // The program's body is its one step (step 0) for the heartbeats and the hang diagnosis:
  // "running" until close(), then "after its steps".
  recorder->setStep(0);
  diagnostics::WatchdogOptions watch;
  watch.rank = placement.rank;
  watch.deadline = options.timeout;
  if (placement.rank == 0) {
    watch.meta = diagnostics::JobMeta{options.name, placement.worldSize,
                                      std::chrono::duration<double>(options.timeout).count(),
                                      std::string(collective::toString(options.transport)),
                                      diagnostics::unixNow()};
  }
  watch.dumpSignal = SIGUSR1;
  // Created before the watchdog, whose thread reads its first failure for the heartbeat.
  manager = std::make_shared<lifecycle::ResourceManager>(transport.collective);
  watch.firstFailure = [this]() -> std::optional<json> {
    const auto view = programFailure();
    if (!view) return std::nullopt;
    return view->toJson();
  };
  // Past the join, rank 0's store may go with rank 0 (it ended right after its own join):
  // the other ranks go on without it, as the ranks that finished their set-up first do.
  const auto connect = [&] {
    return placement.rank == 0
               ? transport.control->keyValueStore()
               : connectAfterJoin(*transport.control, placement.rank, storeAddress);
  };
  watchdog = std::make_unique<diagnostics::Watchdog>(recorder, connect(), watch);
  manager->onFirstFailure([this] {
    if (watchdog) watchdog->beatNow();  // gone after close()
    // Also on this node's disk: the heartbeat goes with the store when rank 0 ends.
    if (const auto view = programFailure()) folder.writeFirstFailure(view->toJson().dump());
  });

  {
    // Connected outside the lock: a teardown's signal that comes meanwhile reports as in a
    // forming world (onSignal), not after the connection's wait, too late.
    auto signalStore = connect();
    std::lock_guard<std::mutex> guard(reportMutex);
    signalKv = std::move(signalStore);
  }

  processScope = std::make_unique<lifecycle::ResourceManager::ProcessScope>(manager);
  if (options.recordDirectory) {
    manager->setRecorder(record::openRankRecording(
        *options.recordDirectory, placement.rank, placement.worldSize, options.name,
        std::chrono::duration<double>(options.timeout).count(), options.recordCap));
  }
  if (placement.rank == 0) {
    const auto& control = *transport.control;
    fmt::print(stderr,
               "# hmc: world '{}' of {} ranks joined ({}, transport {}); store at {} (attach: "
               "hmc-run status --master-addr {} --master-port {})\n",
               options.name, placement.worldSize, placement.launcher,
               collective::toString(options.transport), storeAddress, control.host(),
               control.port());
  }
  // Open MPI's warning came while this rank set up (the world forming, nothing to report from
  // then): what it does at the warning, now, within the second before the SIGTERM. Rank 0 that
  // first reported at the SIGTERM was killed 50 ms later inside its report: no verdict line
  // (chaos --modes hosts --run-seed 316149940: rank 3 of h2 aborted in its join).
  if (warning.load()) onWarning();
}

World joinWorld(JoinOptions options) {
  setUpDefaultLogging();  // hmc/log.hpp: `warn` unless HMC_LOG_LEVEL, as under hmc-run
  auto impl = std::make_unique<World::Impl>();
  impl->options = JoinOptions::withEnvironment(std::move(options));
  JoinOptions& resolved = impl->options;
  if (resolved.name.empty()) resolved.name = programName();
  impl->placement = placementOf(resolved);
  const world::RankPlacement& placement = impl->placement;

  world::RankLaunch launch;  // the same transport options as hmc-run's launcher ranks
  launch.transport = resolved.transport;
  launch.placement = placement;
  launch.joinTimeout = resolved.joinTimeout;
  World::Impl* raw = impl.get();
  // From before the join: a launcher that tears the job down while the world forms (a rank
  // killed before it joined) gets rank 0's report of a world that did not form. Open MPI's
  // warning only under mpirun: no other launcher sends a SIGCONT to running ranks (Slurm's at
  // a time limit comes with its SIGTERM).
  impl->signals = std::make_unique<TerminationSignals>(
      [raw](int signal) { raw->onSignal(signal); },
      placement.launcher == "mpirun" ? std::function<void()>([raw] { raw->onWarning(); })
                                     : std::function<void()>());
  if (placement.rank == 0 && placement.underLauncher()) {
    impl->joinWatch = std::make_unique<world::JoinWatch>(placement);
  }
  try {
    impl->transport =
        collective::makeTransport(resolved.transport, launch.transportOptions(resolved.timeout));
    if (impl->joinWatch) impl->joinWatch->stop();
  } catch (const std::exception& error) {
    if (impl->joinWatch) impl->joinWatch->stop();
    impl->joinFailed(error);
    throw;
  }
  if (!impl->transport.control) {
    throw ValueError("hmc::joinWorld: the transport has no control store");
  }
  impl->openStore();
  try {
    impl->setUp();
  } catch (const std::exception& error) {
    // A world that never started (HMC_RECORD names no folder, ...): its folder holds only
    // rank 0's pid and nobody else would remove it. Elsewhere: rank 0 may have ended right
    // after its join (its store gone while this rank set up its watchdog).
    if (placement.rank == 0) {
      impl->folder.remove();
    } else {
      impl->joinFailed(error);
    }
    throw;
  }
  return World(std::move(impl));
}

}  // namespace hmc
