// The evidence a launcher's teardown cannot take away (hmc/world/evidence_folder.hpp): a private
// folder on rank 0's node, joined only when it is safe to, its files, and who reports.

#include "hmc/world/evidence_folder.hpp"
#include "hmc/world/result_gatherer.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "support/dead_pid.hpp"
#include "support/memory_store.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using hmc::testing::MemoryStore;
using hmc::world::EvidenceFolder;

constexpr const char* kFolderKey = "evidence/folder";

std::string thisHost() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

using hmc::testing::deadPid;

void writePid(const EvidenceFolder& folder, int rank, pid_t pid) {
  std::ofstream out(folder.path() + "/rank" + std::to_string(rank) + ".pid", std::ios::trunc);
  out << pid;
}

}  // namespace

TEST_SUITE("evidence folder") {
  TEST_CASE("rank 0 creates a private folder, announces it, and a rank of its node joins") {
    MemoryStore kv;
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    struct stat info {};
    REQUIRE(lstat(zero.path().c_str(), &info) == 0);
    CHECK((info.st_mode & 0777) == 0700);
    CHECK(zero.known(0));
    CHECK(zero.alive(0));
    zero.announce(kv);
    CHECK(kv.get(kFolderKey, 0ms) == thisHost() + "\n" + zero.path());
    const EvidenceFolder two = EvidenceFolder::join(kv, 2, 1s);
    REQUIRE(two.usable());
    CHECK(two.path() == zero.path());
    CHECK(zero.known(2));
    CHECK_FALSE(zero.known(1));
    zero.remove();
    CHECK_FALSE(fs::exists(zero.path()));
  }

  TEST_CASE("a rank 0 that ended before the others joined its folder leaves an orphan, found") {
    // joinWorld's stand-in (world.cpp, reportRank0LostAtJoin): rank 0 created its folder,
    // tagged with its store's port, and ended before rank 1 read the announcement.
    const std::string tag = "orphan-test-" + std::to_string(::getpid());
    const EvidenceFolder live = EvidenceFolder::create(0, tag);
    REQUIRE(live.usable());
    CHECK(fs::path(live.path()).filename().string().rfind("hmc-evidence-" + tag + "-", 0) == 0);
    CHECK(EvidenceFolder::orphans(tag, 1).empty());  // rank 0 (this process) is alive
    writePid(live, 0, deadPid());
    const auto found = EvidenceFolder::orphans(tag, 1);
    REQUIRE(found.size() == 1);
    CHECK(found[0].path() == live.path());
    CHECK(EvidenceFolder::orphans(tag + "-other", 1).empty());  // another world's port
    CHECK(EvidenceFolder::orphans("", 1).empty());              // untagged: never guessed
    found[0].remove();
    CHECK_FALSE(fs::exists(live.path()));
  }

  TEST_CASE("a folder that is not safe to join, or not on this host, is not joined") {
    MemoryStore kv;
    CHECK_FALSE(EvidenceFolder::join(kv, 1, 0ms).usable());  // nothing announced
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    kv.set(kFolderKey, "another-host\n" + zero.path());
    CHECK_FALSE(EvidenceFolder::join(kv, 1, 0ms).usable());
    // Writable by others: someone could plant files in it.
    REQUIRE(chmod(zero.path().c_str(), 0755) == 0);
    kv.set(kFolderKey, thisHost() + "\n" + zero.path());
    CHECK_FALSE(EvidenceFolder::join(kv, 1, 0ms).usable());
    REQUIRE(chmod(zero.path().c_str(), 0700) == 0);
    // A link to it is never followed.
    const std::string link = zero.path() + "-link";
    fs::create_directory_symlink(zero.path(), link);
    kv.set(kFolderKey, thisHost() + "\n" + link);
    CHECK_FALSE(EvidenceFolder::join(kv, 1, 0ms).usable());
    fs::remove(link);
    // An announcement that says rank 0 has none.
    EvidenceFolder().announce(kv);
    CHECK_FALSE(EvidenceFolder::join(kv, 1, 0ms).usable());
    zero.remove();
  }

  TEST_CASE("each rank's results, early snapshot and first failure, and the reporting mark") {
    MemoryStore kv;
    const EvidenceFolder zero = EvidenceFolder::create(0);
    zero.announce(kv);
    const EvidenceFolder one = EvidenceFolder::join(kv, 1, 1s);
    REQUIRE(one.usable());
    CHECK_FALSE(zero.readResults(1).has_value());
    CHECK(one.writeResults("final").empty());
    CHECK(one.writeResults("early", true).empty());
    CHECK(zero.readResults(1) == std::optional<std::string>("final"));
    CHECK(zero.readResults(1, true) == std::optional<std::string>("early"));
    // Its first failure, apart from its results (a rank that crashed later wrote no results).
    CHECK_FALSE(zero.readFirstFailure(1).has_value());
    one.writeFirstFailure(R"({"kind": "error"})");
    CHECK(zero.readFirstFailure(1) == std::optional<std::string>(R"({"kind": "error"})"));
    CHECK_FALSE(zero.readFirstFailure(0).has_value());
    CHECK_FALSE(zero.reported());
    zero.markReported();
    CHECK(one.reported());
    zero.remove();
    CHECK_FALSE(one.writeResults("late").empty());  // gone: says why
  }

  TEST_CASE("who reports: the lowest rank of the node whose process is alive") {
    MemoryStore kv;
    const EvidenceFolder zero = EvidenceFolder::create(0);
    zero.announce(kv);
    const EvidenceFolder two = EvidenceFolder::join(kv, 2, 1s);
    CHECK(two.lowestLiveRank(4) == 0);
    writePid(zero, 0, deadPid());  // rank 0's process ended
    CHECK_FALSE(two.alive(0));
    CHECK(two.lowestLiveRank(4) == 2);
    writePid(zero, 1, getpid());  // a live rank 1 on this node comes first
    CHECK(two.lowestLiveRank(4) == 1);
    zero.remove();
    CHECK(two.lowestLiveRank(4) == -1);
  }

  TEST_CASE("a look that races with the reporter's removal never makes another rank report") {
    // 1,998 ended ranks, then a live rank 1998 (this process): rank 1999's look reads their pid
    // files one by one while the reporting rank removes the folder. The answer is rank 1998
    // (the look ended first) or nobody (the folder went), never rank 1999 itself (the pid
    // files read as missing because the folder went in the middle of the look).
    constexpr int kWorld = 2000;
    int gone = 0;
    for (int round = 0; round < 20; ++round) {
      MemoryStore kv;
      const EvidenceFolder zero = EvidenceFolder::create(0);
      REQUIRE(zero.usable());
      zero.announce(kv);
      const EvidenceFolder last = EvidenceFolder::join(kv, kWorld - 1, 1s);
      REQUIRE(last.usable());
      const auto dead = deadPid();
      for (int rank = 0; rank < kWorld - 2; ++rank) writePid(zero, rank, dead);
      writePid(zero, kWorld - 2, getpid());
      std::atomic<bool> go{false};
      std::thread reporter([&] {
        while (!go) std::this_thread::yield();
        zero.remove();
      });
      go = true;
      const int who = last.lowestLiveRank(kWorld);
      reporter.join();
      CHECK_MESSAGE((who == kWorld - 2 || who == -1), "round ", round, ": rank ", who,
                    " would report");
      if (who == -1) ++gone;
    }
    MESSAGE(gone, " of 20 looks saw the folder go");
  }

  TEST_CASE("no folder: every method does nothing and says so") {
    const EvidenceFolder none;
    CHECK_FALSE(none.usable());
    CHECK_FALSE(none.known(0));
    CHECK_FALSE(none.alive(0));
    CHECK(none.lowestLiveRank(2) == -1);
    CHECK(none.writeResults("x") == "no local evidence folder");
    CHECK_FALSE(none.readResults(0).has_value());
    none.remove();
  }

  TEST_CASE("the missing-rank rule: a rank of this node that ended, else what the caller knows") {
    const EvidenceFolder zero = EvidenceFolder::create(0);
    REQUIRE(zero.usable());
    writePid(zero, 1, deadPid());  // rank 1 ran here and its process ended
    writePid(zero, 2, getpid());   // rank 2 runs here, alive
    const auto why = hmc::world::missingRankRule(
        zero, 0, [](int rank) { return "deadline passed for rank " + std::to_string(rank); });
    CHECK(why(1) == hmc::world::endedWithoutResult(1, 0));
    CHECK(why(2) == "deadline passed for rank 2");  // alive: not ended
    CHECK(why(3) == "deadline passed for rank 3");  // another node's rank
    zero.remove();
  }
}
