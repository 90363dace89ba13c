#pragma once
// The diagnosis model: one verdict, the first failure first, for every view of a run (hmc-run's
// report, a program's world end, `record show`, `status`, the pages). Each rank contributes
// what it saw go wrong first (a FailureView: its first failed call or collective, caught by the
// program or not, or how it ended when it did not end itself); diagnose() finds the first
// failure of the world (the earliest collective where the ranks' outcomes diverge or fail, or
// the earliest local error), names the ranks that caused it (the rank whose manifest differs,
// the ranks that entered another collective, the ranks that never arrived, the crashed ranks),
// and labels every other rank's failure as following from it.
//
//   first failure: collective mismatch at #26: rank 3 reached the world's end with 2 group(s)
//   open while ranks [0, 1, 2] were in 'close validation' #26
//
// Ordering: the ranks of a world run the same collectives in the same order, so a collective's
// sequence number orders failures across ranks; a local error (no collective entered) comes
// before the collective its rank would have entered next. A crash or a stop known only from
// outside (the process ended, a signal) comes after every failure a rank saw itself: what the
// others saw of it (a lost rank, a timeout) places it.
// Pure functions; no store, no clock; thread-safe.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hmc::diagnostics {

// What one rank saw go wrong first.
struct FailureView {
  int rank = 0;
  std::string host;  // "" when unknown
  // "manifest_mismatch" (the manager's manifests or signatures differ), "collective_mismatch"
  // (ranks entered different collectives), "timeout", "rank_failure" (a peer was lost), "error"
  // (any other error), and, known from outside: "crash" (its process ended without an end),
  // "stopped" (a signal ended it), "missing" (it left no end and is not known to have ended:
  // what its heartbeat says), "leak" (it ended with groups left open).
  std::string kind;
  std::string stage;                      // the collective's stage; "" for a local call
  std::optional<std::uint64_t> sequence;  // the collective's number; nullopt for a local call
  std::uint64_t collectivesBefore = 0;    // collectives the rank entered before the call
  std::optional<int> step;                // hmc-run: the top-level step (1-based index)
  std::string op;                         // the call: "close", "forward", "close_all", ...
  std::string message;
  nlohmann::json mismatch;    // the manager's manifest diagnosis (lastMismatch), or null
  nlohmann::json openGroups;  // at the world's end: the specifications of its open groups
  // A rank known from outside (crash, stopped): the collective its last heartbeat showed it
  // waiting in before it ended (stage, sequence), if any; a hang there counts it among those
  // that arrived. Not in toJson.
  std::optional<std::pair<std::string, std::uint64_t>> waitedIn;

  nlohmann::json toJson() const;
  static FailureView fromJson(const nlohmann::json& value);  // throws nlohmann::json::exception
};

// The kind names of FirstFailure::kind.
inline constexpr std::string_view kManifestMismatch = "manifest_mismatch";
inline constexpr std::string_view kCollectiveMismatch = "collective_mismatch";
inline constexpr std::string_view kHang = "hang";
inline constexpr std::string_view kCrash = "crash";
inline constexpr std::string_view kError = "error";
inline constexpr std::string_view kStopped = "stopped";
inline constexpr std::string_view kLeak = "leak";
inline constexpr std::string_view kMissing = "missing";  // a view's kind, never a first failure's
// A rank that lost the world's store at the world's end (its host cut off, or the store's
// down): after a crash, which may be what ended the store, before the ranks it left waiting.
inline constexpr std::string_view kStoreLost = "store_lost";
// The stage of the world's end (hmc::World::close): a collective of its own, so that a rank
// that reaches the end while the others run a collective of the program is named.
inline constexpr std::string_view kWorldEndStage = "world end";

struct FirstFailure {
  std::string kind;  // one of the names above
  std::string stage;
  std::optional<std::uint64_t> sequence;
  std::optional<int> step;
  std::vector<int> ranks;          // the ranks it names as the cause
  std::vector<std::string> hosts;  // their hosts, where known (distinct, in rank order)
  std::vector<int> seenBy;         // the ranks whose own record shows it
  std::string line;                // one line, what a person reads first
  nlohmann::json detail;           // kind-specific (the manifest difference, the stages, ...)
};

// A rank's failure that follows from the first one.
struct Consequence {
  int rank = 0;
  std::string line;
};

struct Diagnosis {
  std::optional<FirstFailure> first;
  std::vector<Consequence> consequences;

  // Whether the first failure is a hang or a crash (hmc-run's exit code 3).
  bool hang() const;
  // The ranks whose failure is a consequence (rank -> line).
  std::map<int, std::string> consequenceByRank() const;
  // {"first_failure": null | {...}, "consequences": [{"rank", "line", "follows_from"}]}
  nlohmann::json toJson() const;
};

// The diagnosis of a world of `worldSize` ranks from every rank's first failure (ranks that saw
// none have no view). `hosts`: each rank's host where known (index = rank). `whereabouts`:
// where a rank without a failure of its own was, for the ranks a hang names as never arriving
// ("it was at the world's end, with 1 group open (...)", "finished its steps").
Diagnosis diagnose(const std::vector<FailureView>& views, int worldSize,
                   const std::vector<std::string>& hosts = {},
                   const std::map<int, std::string>& whereabouts = {});

// "manifest mismatch in 'close validation' #26 (step 4): <message>": one rank's failure.
std::string describeFailure(const FailureView& view);
// A kind as words: "manifest mismatch", "lost a rank" (rank_failure).
std::string failureKindWords(std::string_view kind);
// Where a failure happened: "'close validation' #26 (step 4)"; `orOp`: for a failure no
// collective raised, the call ("forward").
std::string whereText(const FailureView& view, bool orOp);
// The ranks a failure's text names: "ranks [1] did not arrive" (or "did not join"), "failed on
// ranks [1, 2]", "rank 3 closed its connection", "rank 3 was announced dead"; empty otherwise.
std::vector<int> ranksNamedIn(const std::string& message);

// The view of a collective error a rank raised: kind from the error kind's name
// ("collective_mismatch", "timeout", "rank_failure", anything else "error"), or
// "manifest_mismatch" when `mismatch` is set.
std::string failureKindOf(std::string_view errorKind, bool manifestMismatch);

// The groups of a collective mismatch's text ("ranks [0, 1] entered 'close validation' #26,
// ranks [2] entered 'world end' #26"): stage -> ranks, with each group's sequence. Empty when
// the text is not a mismatch's.
struct StageGroup {
  std::string stage;
  std::uint64_t sequence = 0;
  std::vector<int> ranks;
};
std::vector<StageGroup> parseMismatchGroups(std::string_view message);

}  // namespace hmc::diagnostics
