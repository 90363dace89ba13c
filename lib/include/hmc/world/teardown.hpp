#pragma once
// The teardown protocol of a rank process: what it does when a termination signal comes
// (a launcher tearing the job down, Ctrl-C, hmc-run's own launcher stopping its ranks), and,
// under mpirun, at Open MPI's warning (the SIGCONT it sends 1 s before its SIGTERM, which
// SIGKILL follows within 20-50 ms, seen with strace: too soon to gather anything then).
//
// - hmc-run's own launch: the rank writes its current repetition's result file as far as it
//   got (the finished ones are in their files already); the launcher reads them.
// - an external launch: every rank writes its results to the local evidence folder (it needs
//   no store, which may stall or be gone in a teardown) and, if it does not report, to the
//   store for a reporting rank on another node. The reporting rank (rank 0, or the lowest
//   rank of rank 0's node still alive) gathers the others' (bounded: interruptWaits) and
//   reports through InterruptedReport. At Open MPI's warning every rank writes an early
//   snapshot to the evidence folder only (the job may yet go on: nothing a normal end reads),
//   and the reporting rank writes the report's files from them and keeps the console's text,
//   which it prints at the SIGTERM.
//
// Who hands on this rank's results once the run ends without a store is claimed once
// (claim()): the main thread (it has every rank's results and reports them; a SIGTERM then
// must not end the process in the middle of it) or the signal's thread, the first to claim.
// Both at once left a half-removed evidence folder.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/key_value_store.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/evidence_folder.hpp"
#include "hmc/world/rank_launch.hpp"
#include "hmc/world/rank_progress.hpp"

namespace hmc::world {

// How the reporting rank of an external launch reports when stopped by a signal.
enum class InterruptMode {
  kReport,        // stopped by `signal`: report `merged` (files and console), then exit
  kEarly,         // Open MPI's warning (SIGCONT, 1 s before SIGTERM): report `merged` as stopped
                  // by `signal` to the files, and keep the console's text for kPublishEarly
  kPublishEarly,  // the SIGTERM after kEarly (SIGKILL follows within 20-50 ms): print the kept
                  // text (`merged` is empty)
};
// Rank 0 of an external launch (or the lowest live rank of its node) stopped by `signal`: every
// rank's results so far (per repetition), to report before the process exits.
using InterruptedReport = std::function<void(std::vector<std::vector<scenario::RankResult>> merged,
                                             int signal, InterruptMode mode)>;

// What a rank does with a termination signal (early: Open MPI's warning).
enum class HandOff {
  kOwnFile,           // hmc-run's own launch: write the current repetition's result file
  kPrintEarlyReport,  // the reporting rank reported at the warning moments ago: print it
  kNothing,           // the report was made at the warning: nothing more to hand on
  kEarlySnapshot,     // at the warning, not reporting: an early snapshot in the folder only
  kLocalAndStore,     // not reporting: the evidence folder, then the store
  kEarlyReport,       // at the warning, reporting: gather, write the report's files
  kReport,            // reporting: gather and report
};
struct HandOffFacts {
  bool underLauncher = false;
  bool early = false;             // Open MPI's warning, not a termination signal
  bool reporting = false;         // this rank reports (lowest live rank of rank 0's node)
  bool earlyReportFresh = false;  // this rank reported at a warning less than 3 s ago
  bool folderReported = false;    // the reporting rank reported at the warning
};
HandOff decideHandOff(const HandOffFacts& facts) noexcept;

// How long the reporting rank waits for the others' results after a signal. Under mpirun the
// report is made at Open MPI's warning, so the waits must fit in that second: at most 400 ms
// for the local files of the ranks still alive, and the store read once without waiting (at
// the warning itself 200 ms). torchrun and srun give seconds after SIGTERM.
struct InterruptWaits {
  std::chrono::milliseconds local;
  std::chrono::milliseconds store;
  // How long to wait for a live rank's final file (written at its own SIGTERM) before taking
  // its early snapshot (written at Open MPI's warning).
  std::chrono::milliseconds earlySnapshotAfter;
};
InterruptWaits interruptWaits(const std::string& launcher, bool early);

// Which ranks had joined rank 0's store while the world formed (the transports'
// "joined/<rank>" keys, whose values are the ranks' hosts), read through a connection of its
// own, each request bounded by 1 s. nullopt, with `problem` set, where the store cannot be
// read (or there is none to read: a world of one, no port known).
struct JoinState {
  std::vector<int> missing;            // the ranks that had not joined, in order
  std::map<int, std::string> hosts;    // the ranks that had, with the host each gave
  // Read where this process hosts the store (rank 0 of a world whose rank 0 hosts it): the
  // ranks that had joined and whose liveness connection to the store (address/<rank>) is no
  // longer established: their processes ended after they joined.
  std::vector<int> gone;
  // The joined ranks' liveness ends ("address:port", where read) and, once
  // probeJoinedHosts ran, the joined ranks (not `gone`) whose host did not answer a TCP
  // handshake: down or cut off, its processes' connections still open on this side.
  std::map<int, std::string> ends;
  std::vector<int> unreachable;
  // This process hosts the store and nothing answered at its port: it had not started its
  // store yet (its ranks load LibTorch first), so no rank can have joined; `missing` holds
  // every other rank.
  bool storeNotUp = false;
};
std::optional<JoinState> readJoinState(const RankPlacement& placement, std::string* problem);
// At the report of a world that did not form: each host of a joined rank that is not `gone`
// gets one TCP handshake (to that rank's liveness end; a refused connection is an answer);
// the ranks of a host that gives none within `within` go to `unreachable` (a host lost
// during the join, its cable cut before its processes died: chaos --modes hosts --run-seed
// 1942532273, 1742360719).
void probeJoinedHosts(JoinState& state, int self, std::chrono::milliseconds within);
// The handshake's bound: a host that is up answers within milliseconds, however loaded; the
// report has about a second before mpirun's SIGKILL.
inline constexpr std::chrono::milliseconds kHostProbe{300};

// Rank 0 while its world forms: who has joined its store, read every kInterval on a thread of
// its own (one connection, made once the store answers; a rank seen joined is not asked
// again), so that a report at a launcher's
// signal does not have to read it then: a new connection and the reads took about 20 ms, and
// mpirun's SIGKILL followed its SIGTERM within that (its teardown after a lost daemon gives
// rank 0's host no warning first). Nothing runs on other ranks. stop() (or destruction) ends
// the thread; latest() stays usable after it.
class JoinWatch {
 public:
  explicit JoinWatch(const RankPlacement& placement);
  ~JoinWatch();
  JoinWatch(const JoinWatch&) = delete;
  JoinWatch& operator=(const JoinWatch&) = delete;
  void stop();
  // The last read, if it is not older than `fresh`.
  std::optional<JoinState> latest(std::chrono::milliseconds fresh) const;
  static constexpr std::chrono::milliseconds kInterval{200};

 private:
  void watch();
  const RankPlacement placement_;
  collective::LivenessTable table_;  // the watch thread's
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<JoinState> latest_;
  std::chrono::steady_clock::time_point readAt_;
  std::thread thread_;
};

// hmc-run's report of a world that a launcher's signal stopped while it formed (rank 0 in
// its join, no store of its own yet): one repetition's results, every rank unfinished. The
// ranks that had not joined are `notJoined` (stopped, their host unknown: the report's first
// failure names them); those gone after they joined crashed (the first failure); the others,
// rank `self` among them, are stopped in the join.
// `join` nullopt: the store could not be read (`problem`): who had joined is not known.
std::vector<scenario::RankResult> worldNotFormedResults(const RankPlacement& placement,
                                                        int signal,
                                                        const std::optional<JoinState>& join,
                                                        const std::string& problem);

class TerminationHandOff {
 public:
  enum class Claimant { kNobody, kMainThread, kWatcher };

  // `scenario` and `progress` must outlive the hand-off (the rank process's own).
  TerminationHandOff(const scenario::Scenario& scenario, RankLaunch launch,
                     const RankProgress& progress, InterruptedReport onInterrupted);

  // The store connection and the evidence folder, once the rank has them (any thread).
  void setStore(std::shared_ptr<collective::KeyValueStore> kv);
  // Which peers' connections with this rank are closed (Collective::closedPeers; null where
  // the transport cannot tell): a rank of another host that left no result and whose
  // connection closed before the signal ended (a node lost), it is not waiting.
  void setClosedPeers(collective::Collective::ClosedPeers closedPeers);
  void setFolder(EvidenceFolder folder);
  // Rank 0 while the world forms: who has joined (a signal then reports from it).
  void setJoinWatch(std::shared_ptr<const JoinWatch> watch);
  // The main thread claims the hand-off of the end of the run; false when a signal's hand-off
  // claimed it first (which then reports and exits the process).
  bool claimForMainThread();
  // The main thread's one exit after claimForMainThread() returned false: the signal's thread
  // owns the end of the run, reports, and ends the process (its TerminationWatcher exits with
  // 128 + the signal, or its hard limit's SIGALRM does). This waits for that; should neither
  // come within kAwaitSignalExit, it ends the process itself with 128 + the signal.
  [[noreturn]] void awaitSignalExit() const;
  // Both, the main thread's one way to the end of a run: returns when it claimed the end (it
  // reports); else awaitSignalExit, never returning.
  void claimOrAwaitSignalExit() {
    if (!claimForMainThread()) awaitSignalExit();
  }
  static constexpr std::chrono::seconds kAwaitSignalExit{30};

  // On the signal's thread: hands on what the rank did. Returns whether the process should
  // exit now (TerminationWatcher), false when the main thread is reporting already.
  bool onSignal(int signal) { return handOn(signal, false); }
  // Open MPI's warning.
  void onWarning(int signal) { handOn(signal, true); }

 private:
  bool handOn(int signal, bool early);
  void report(int signal, bool early, const std::vector<scenario::RankResult>& results,
              std::shared_ptr<collective::KeyValueStore> kv, const EvidenceFolder& folder,
              std::string storeProblem, const collective::Collective::ClosedPeers& closedPeers);

  const scenario::Scenario& scenario_;
  const RankLaunch launch_;
  const RankProgress& progress_;
  InterruptedReport onInterrupted_;
  std::mutex mutex_;
  std::shared_ptr<collective::KeyValueStore> kv_;  // its own connection
  collective::Collective::ClosedPeers closedPeers_;
  EvidenceFolder folder_;
  std::shared_ptr<const JoinWatch> joinWatch_;
  std::atomic<Claimant> claimant_{Claimant::kNobody};
  std::atomic<int> signal_{0};  // the signal whose hand-off claimed the end (awaitSignalExit)
  std::optional<std::chrono::steady_clock::time_point> earlyReportAt_;  // the signal's thread
};

}  // namespace hmc::world
