#pragma once
// Evidence that needs no store: a private folder on the node of rank 0 where the rank processes
// of an external launch (torchrun, srun, mpirun) write their results when the store cannot be
// relied on: on a termination signal (a launcher's teardown gives about a second before
// SIGKILL, and a store request may stall in that window) and when the store's host is gone.
// The reporting rank reads these files beside the store.
//
// Rank 0 creates the folder (mkdtemp under $TMPDIR, else /tmp: mode 0700) and announces
// "<host>\n<path>" in the store under "evidence/folder"; the other ranks join it when they are
// on the same host and the folder is a directory of their own user with mode 0700 (otherwise
// they have no local evidence and use the store only). Each rank writes its pid at start
// ("rank<R>.pid"), so that a reader can tell which ranks of the node are still alive, and its
// results document when asked ("rank<R>.json", atomically: temp file + rename).
//
// The process that reports removes the folder (rank 0 at the end of a normal run too).
// Thread safety: the methods only touch files; they may be called from any thread.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/key_value_store.hpp"

namespace hmc::world {

class EvidenceFolder {
 public:
  EvidenceFolder() = default;  // no folder: every method does nothing

  // Rank 0: creates the folder ("$TMPDIR/hmc-evidence-[<tag>-]XXXXXX"). A folder that cannot
  // be created leaves no local evidence (logged), never an error.
  static EvidenceFolder create(int rank, const std::string& tag = "");
  // The folders with `tag` in this node's TMPDIR whose rank 0 wrote its pid and has ended (a
  // world whose rank 0 died before the others joined its folder), as rank `rank` sees them.
  static std::vector<EvidenceFolder> orphans(const std::string& tag, int rank);
  // A rank that lost the store before it read the announcement (rank 0 ended right after its
  // own join): the one such folder of this node, joined (its pid written); else none.
  static EvidenceFolder joinOrphan(const std::string& tag, int rank);
  // Rank 0 announces the folder (or that it has none) in `kv`; the others read the announcement
  // (waiting up to `timeout`, as for any rendezvous key) and join it. Logged, never thrown.
  void announce(collective::KeyValueStore& kv) const;
  static EvidenceFolder join(collective::KeyValueStore& kv, int rank,
                             std::chrono::milliseconds timeout);

  bool usable() const noexcept { return !path_.empty(); }
  const std::string& path() const noexcept { return path_; }

  // Writes this rank's results document. Returns "" or why not. `early`: the snapshot taken
  // at Open MPI's SIGCONT, 1 s before its SIGTERM ("rank<R>.early.json"); only a reporting
  // rank stopped by a signal reads it, for a rank whose final file is not there in time.
  std::string writeResults(const std::string& document, bool early = false) const;
  // Rank `rank`'s results document (or its early snapshot), if it wrote one.
  std::optional<std::string> readResults(int rank, bool early = false) const;
  // This rank's first failure (a diagnostics::FailureView document), written when its program
  // meets it: a reporting rank of this node reads it for a rank that left no end and whose
  // heartbeat went with the store (rank 0, the store's host, crashed after an error it had
  // caught: chaos --run-seed 1694153872). Logged, never thrown.
  void writeFirstFailure(const std::string& document) const;
  std::optional<std::string> readFirstFailure(int rank) const;
  // The reporting rank made the report at Open MPI's warning ("reported"): the others need not
  // write their results at the SIGTERM that follows (a file written then could keep the
  // reporting rank from removing the folder).
  void markReported() const;
  bool reported() const;
  // Whether the report at the warning was made less than `age` ago (the mark's time).
  bool reportedWithin(std::chrono::seconds age) const;
  // Whether rank `rank` wrote its pid here and that process is alive (not a zombie). False
  // for a rank of another node.
  bool alive(int rank) const;
  // Whether rank `rank` wrote its pid here (it runs on this node).
  bool known(int rank) const;
  // Whether rank `rank` runs on this node and its process has ended (known, not alive): a rank
  // nobody may wait for.
  bool ended(int rank) const { return known(rank) && !alive(rank); }
  // The pid rank `rank` wrote here, if it did (it runs on this node).
  std::optional<std::int64_t> pidOf(int rank) const;
  // Who reports: the lowest rank below `worldSize` whose process is alive (this rank when no
  // lower one is), or -1 once the folder is gone, also when it went during the look (the
  // reporting rank removes it when done).
  int lowestLiveRank(int worldSize) const;
  // Removes the folder and everything in it.
  void remove() const;

 private:
  EvidenceFolder(std::string path, int rank) : path_(std::move(path)), rank_(rank) {}
  void writePid() const;
  std::string file(int rank, const char* suffix) const;

  std::string path_;
  int rank_ = 0;
};

}  // namespace hmc::world
