#pragma once
// `hmc-run record merge`: the ranks' recordings (recording.hpp) become one hmc-scenario/1
// document that replays the recorded run on thread ranks.
//
// - Each rank's events become steps (create, share, forward, backward, drop, close,
//   close_all, fault, barrier, sleep, check; a forward whose backward was kept pending gets
//   "backward": false; the runtime release is part of the close that caused it).
// - Steps every rank made in the same order are shared steps; where ranks diverged, steps carry
//   `ranks` (a progressive longest-common-subsequence alignment, common prefix and suffix
//   first, so that identical ranks cost linear time).
// - A rank whose file ends without its end record (killed) gets a `fault crash` after its last
//   recorded call, unless that call was a crash fault already; its steps stop there.
// - `expect`: by default what the program expected: "ok" for a program's calls, the scenario's
//   own expectation for hmc-run's runs (recorded with each event). With `observed`, what each
//   call did ("error" with its message, "hang"), so that the scenario passes exactly while
//   the recorded behaviour reproduces (a CI regression test).
// - A module a program created (not one of hmc's two scratch types) replays as a
//   `scratch_linear` whose compatibility key holds the recorded type and key, labelled with
//   its type: the lifecycle is the same, the work inside is not.
// Missing, unreadable or foreign rank files are named with the reason; the merge writes what
// it can (their ranks run no steps) and says what it could not.
//
// Torch-free and pure apart from reading the files.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hmc/record/recording.hpp"

namespace hmc::record {

enum class MergeExpect { kProgram, kObserved };

struct MergeResult {
  nlohmann::json scenario;            // hmc-scenario/1
  std::vector<std::string> problems;  // files missing, unreadable, cut short: one line each
  std::vector<Recording> recordings;  // the ranks' recordings that could be read
  int worldSize = 0;
};

// Reads every rank-N.hmcrec of `directory` and merges them. Throws ValueError when no rank's
// file can be read at all.
MergeResult mergeRecordings(const std::string& directory, MergeExpect expect);

// The same from recordings already read (`worldSize`: the recorded world's size).
nlohmann::json mergeToScenario(const std::vector<Recording>& recordings, int worldSize,
                               MergeExpect expect, std::vector<std::string>& problems);

// One rank's events as scenario steps (JSON objects), in its order. A rank whose file ends
// without its end record (killed) ends with a `fault crash`; `deathSeen`: another rank saw a
// peer fail (a call that hung with rank_failure), so the run's report counted this rank's
// crash as a failure: the crash is `"planned": false`, and the replay's outcome is `fail` as
// the run's was. Else the rank was killed after the others' failure (a launcher's teardown of
// a rank that lingered), and the crash is the scenario's own: the replay hangs as the run did.
std::vector<nlohmann::json> stepsOf(const Recording& recording, MergeExpect expect,
                                    bool deathSeen = false);

// Whether `recording` saw a peer fail: a call that hung with rank_failure.
bool sawPeerFail(const Recording& recording);

}  // namespace hmc::record
