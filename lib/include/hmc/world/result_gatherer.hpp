#pragma once
// The reporting rank of an external launch (torchrun, srun, mpirun) gathers every rank's
// results: from the local evidence folder (evidence_folder.hpp) first, then the control store
// (run_keys.hpp's result/<rank>), and fills in the ranks that left none (missing_ranks.hpp)
// from their heartbeats and published flight records. Also the bounded waits on other ranks'
// keys that never wait for a rank known to be gone. Every wait here is bounded by the deadline
// it is given; the store may be null (gone), and a store that fails is given up at its first
// error.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/key_value_store.hpp"
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/world/evidence_folder.hpp"
#include "hmc/world/rank_placement.hpp"

namespace hmc::world {

using Clock = std::chrono::steady_clock;
using ResultsByRank = std::map<int, std::vector<scenario::RankResult>>;
// Why rank `rank` left no result: the start of its crash reason.
using MissingWhy = std::function<std::string(int rank)>;

// The bound on reading the store beyond a wait, should the store not answer.
inline constexpr std::chrono::milliseconds kStoreReadMargin{300};

// How long a report waits for a connection that has not shown closed yet, where another
// missing rank's has (gatherResults): a host's processes die one by one, and the signal of a
// launcher that saw the first die may reach the reporting rank before the last is gone.
inline constexpr std::chrono::milliseconds kClosingGrace{200};

// Polls for `keys` until all exist or `deadline` passes.
bool waitForKeys(collective::KeyValueStore& kv, const std::vector<std::string>& keys,
                 Clock::time_point deadline);

// Ranks on other hosts that fell silent: a rank whose heartbeat (its watchdog writes one at
// least every second while the rank runs its steps) has not changed for kSilentAfter while it
// waits in a collective whose deadline passed kDeadlineSlack ago. The silence counts from the
// beat's writing (`written_at`, by the writer's system clock; a beat "from the future", where
// the clocks disagree, counts from this rank's first look at it), so a rank silent since long
// before anyone looked is known at the first look. A live rank times out of that collective by
// itself and writes a fresh heartbeat at once; one that did not is on a host that lost power or
// its link (or is stopped), and nobody should wait a whole deadline more for its vote, its
// result or its goodbye. A rank running a step outside any collective (how long that takes is
// not known, but its watchdog writes on) is silent once its heartbeat stopped for a whole
// collective deadline (at least kSilentAfter). A rank starting (the join deadline bounds it)
// or done is never judged silent. Not thread-safe: one per waiting thread.
class SilentRanks {
 public:
  static constexpr std::chrono::milliseconds kSilentAfter{2500};
  static constexpr std::chrono::milliseconds kDeadlineSlack{1000};

  explicit SilentRanks(std::chrono::milliseconds deadline) : deadline_(deadline) {}
  // Why rank `rank` is silent, as the store's dead/<rank> announcement says it ("rank 4 (host
  // h3) fell silent: ..."), or nullopt. Reads its heartbeat from `kv`; `self` is the asking
  // rank.
  // `now` and `unixNow` (diagnostics::unixNow) are this rank's clocks at the call.
  std::optional<std::string> check(collective::KeyValueStore& kv, int rank, int self,
                                   Clock::time_point now = Clock::now(),
                                   double unixNow = diagnostics::unixNow());
  // From here on (gatherResults: the world formed, its ranks' results are awaited) a rank whose
  // last heartbeat says "starting" or "done" and stopped counts too: a short plan runs between
  // two beats, and its results follow its last beat within moments. Before, a starting rank
  // is bounded by the join's deadline, and a done one may be in a vote or a wait of its own
  // with its watchdog stopped.
  void awaitResults() noexcept { awaitingResults_ = true; }

 private:
  struct Seen {
    std::uint64_t beat = 0;
    Clock::time_point since;  // when this rank first read that beat
  };
  std::chrono::milliseconds deadline_;
  std::map<int, Seen> seen_;
  bool awaitingResults_ = false;
};

// Whether rank `rank` is known to be gone: announced dead in the store (hmc-run's own launcher
// does that), or its process on this node ended (the evidence folder's pid file: torchrun,
// mpirun and srun announce nothing, and Open MPI tears the job down 1 s after a rank's death,
// so nobody may wait for a dead rank's vote or result up to the deadline), or (with `silent`)
// it fell silent (SilentRanks). A rank found gone through the folder or its silence is
// announced in the store for the other ranks, the store host's wait for goodbyes and
// `hmc-run status`. `self`: the asking rank, for the announcement's words.
bool rankGone(collective::KeyValueStore& kv, const EvidenceFolder* folder, int rank, int self,
              SilentRanks* silent = nullptr);

// Polls until every rank's key exists (keyOf(rank), ranks 0..worldSize-1: true), a rank whose
// key is missing is gone (rankGone: false), or `deadline` passes (false).
bool waitForRanks(collective::KeyValueStore& kv, const std::function<std::string(int)>& keyOf,
                  int worldSize, Clock::time_point deadline, const EvidenceFolder* folder, int self,
                  SilentRanks* silent = nullptr);

// Whether every one of `ranks` is alive and at work outside any collective: its heartbeat (in
// `kv`, read with `request` per call) says running, fresh, not announced dead. An end that
// waits for ranks (a world's end, the end-of-run vote) waits on for those, as a collective close
// would: a rank saving a checkpoint at the end is no hang. `endpoint` names the store in errors.
bool ranksAtWork(collective::KeyValueStore& kv, const std::string& endpoint,
                 const std::vector<int>& ranks, std::chrono::milliseconds request);

// The results the other ranks wrote to the local evidence folder: polls until every rank of
// this node that is still alive wrote its own, or `deadline` passes. With `earlyAfter`, a rank
// whose final file is still missing that long after the call is taken from its early snapshot
// (EvidenceFolder::writeResults), if it wrote one.
ResultsByRank readLocalResults(const EvidenceFolder& local, int worldSize, int self,
                               Clock::time_point deadline,
                               std::optional<std::chrono::milliseconds> earlyAfter = std::nullopt);

// Every rank's results, [repetition][rank]: `local` first, then the store `kv` (waiting up to
// `wait` for a rank's result/<rank>; null: the store is gone), then fillMissing with the rank's
// heartbeat and published flight record from the store; a rank without any is a crashed rank
// saying missingWhy(rank).
// A rank announced dead in the store by another rank (it fell silent) and not seen ended
// through `folder` is reported as such: "no result from rank R: <the announcement>", never as
// hung. With `silent`, the wait for a rank's result ends once it falls silent.
// `closedPeers` (Collective::closedPeers, may be null), asked after the waits: a rank of
// another host whose connection with this rank closed and that left no result ended (killed,
// crashed, or stopped by the same teardown): crashed, never hung. Where one rank without a
// result has closed, a rank without one whose heartbeat says waiting is asked about again for
// up to kClosingGrace (all of them together, and no later than half kStoreReadMargin past
// `wait`) before it is reported hung.
// `atTeardown`: the report is made at a launcher's teardown (MissingRankEvidence::atTeardown).
std::vector<std::vector<scenario::RankResult>> gatherResults(
    collective::KeyValueStore* kv, const RankPlacement& placement, ResultsByRank local,
    std::chrono::milliseconds wait, const MissingWhy& missingWhy, const EvidenceFolder& folder,
    SilentRanks* silent = nullptr, const collective::Collective::ClosedPeers& closedPeers = {},
    bool atTeardown = false);

// What the reporting rank gathers (gatherEveryRank), and how long it may wait for each source.
struct GatherPlan {
  RankPlacement placement;
  EvidenceFolder folder;                 // this node's (may be unusable)
  std::vector<scenario::RankResult> own;  // this rank's results, as it has them now
  // The other ranks of this node, through `folder`: waited for until this point (now: read
  // what is there), and from their early snapshots after `earlyAfter` (readLocalResults).
  Clock::time_point localDeadline = Clock::now();
  std::optional<std::chrono::milliseconds> earlyAfter;
  // The control store (null: lost, or never joined) and how long to wait there for the ranks
  // not found in the folder.
  std::shared_ptr<collective::KeyValueStore> kv;
  std::string noStore = "the rank has no store";  // why kv is null, where it is
  std::chrono::milliseconds storeWait{0};
  bool atTeardown = false;  // made at a launcher's teardown signal or Open MPI's warning
  std::optional<SilentRanks> silent;  // the waiting rank's, copied (gatherResults)
  collective::Collective::ClosedPeers closedPeers;
  // Why a rank left no result; with `whenStoreUnread`, why when the store could not be read
  // (its error is the second argument), else missingWhy then too.
  MissingWhy missingWhy;
  std::function<std::string(int rank, const std::string& storeProblem)> whenStoreUnread;
};

struct Gathered {
  std::vector<std::vector<scenario::RankResult>> merged;  // [repetition][rank], own in place
  std::size_t localResults = 0;  // ranks found in the folder, this one aside
  bool storeRead = false;
  std::string storeProblem;  // why the store was not read; empty when read or not needed
  Clock::duration localTook{};
  Clock::duration storeTook{};
};

// The one gatherer of every rank's results, for each way a reporting rank ends a run under a
// launcher (rank_process.cpp: the run ended, or the store was lost; teardown.cpp: a signal):
// the folder's files until `localDeadline`, then the store for the ranks still missing (on a
// thread of its own, given up after storeWait + kStoreReadMargin should the store stall: the
// process exits soon after, so the abandoned read is never waited for), then fillMissing for
// the rest (gatherResults). Every wait is bounded by the plan; it throws nothing the store
// throws.
Gathered gatherEveryRank(GatherPlan plan);

// `merged` with this rank's own results (as it has them now) in place, grown to as many
// repetitions as it has (the others missing there).
std::vector<std::vector<scenario::RankResult>> withOwn(
    std::vector<std::vector<scenario::RankResult>> merged,
    const std::vector<scenario::RankResult>& own, const RankPlacement& placement);

// A rank of this node whose process is gone and left no result, as `reporter` says it.
std::string endedWithoutResult(int rank, int reporter);

// The missing-rank rule's one home, for every gathering (the end of a run, a lost store, a
// signal): a rank of this node whose process ended says endedWithoutResult(rank, self); any
// other says `otherwise(rank)`, what the caller knows of why it left none (its deadline
// passed, the store was lost, the signal came first).
MissingWhy missingRankRule(const EvidenceFolder& folder, int self, MissingWhy otherwise);

}  // namespace hmc::world
