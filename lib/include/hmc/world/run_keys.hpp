#pragma once
// The keys hmc-run's rank processes use in their control store, in one place. They are
// relative to the store's key-value view ("<prefix>/kv/" of a StoreTransport, see
// collective/key_value_store.hpp for the library's own: dead/, flight/, heartbeat/, meta).
//
//   result/<rank>        a rank's results document (result_files.hpp), at the end of a run
//                        under an external launcher, or when a signal stops it
//   vote/<rep>/<rank>    "1" or "0": whether the rank ended repetition <rep> cleanly (the
//                        end-of-run agreement); a rank drops its vote of <rep> - 1 after voting
//   results-read         set by the reporting rank once it read every result: the store may go
//   world/at-end/<rank>  a program's rank reached its world's end (world.hpp): the meeting
//   world/at-end-count   before the collective close; world/at-end-unclean: a rank that will
//   world/at-end-unclean not close (hung, or stopped waiting), so that no rank closes alone
//   world/end/<rank>     a program's rank at its world's end (hmc/world/world.hpp): how its close
//                        went and what it left; rank 0 reads them all for the report
//   evidence/folder      "<host>\n<path>" of rank 0's evidence folder, or "none" when it has
//                        none, so that no rank waits for the announcement (evidence_folder.hpp)
//   start/count          how many ranks are ready for their first step; the one that makes
//   start/go             it world_size sets start/go, which every rank waits for (bounded)

#include <string>

namespace hmc::world::keys {

inline std::string result(int rank) { return "result/" + std::to_string(rank); }
// The votes of one repetition: "<votes(rep)>/<rank>" (vote()).
inline std::string votes(int repetition) { return "vote/" + std::to_string(repetition); }
inline std::string vote(int repetition, int rank) {
  return votes(repetition) + "/" + std::to_string(rank);
}
inline std::string worldEnd(int rank) { return "world/end/" + std::to_string(rank); }
// hmc::World: where rank <rank> was at Open MPI's warning of its teardown (a snapshot that
// stands for its end when none comes before the SIGKILL).
inline std::string worldEndAtWarning(int rank) {
  return "world/end-at-warning/" + std::to_string(rank);
}
// hmc::World: rank <rank> reached its world's end (the collectives it had entered then), how
// many ranks did, and the first rank that will not close (it hung, or stopped waiting).
inline std::string worldAtEnd(int rank) { return "world/at-end/" + std::to_string(rank); }
inline constexpr const char* kWorldEndCount = "world/at-end-count";
inline constexpr const char* kWorldEndUnclean = "world/at-end-unclean";
inline constexpr const char* kResultsRead = "results-read";
inline constexpr const char* kEvidenceFolder = "evidence/folder";
inline constexpr const char* kStartCount = "start/count";
inline constexpr const char* kStartGo = "start/go";

}  // namespace hmc::world::keys
