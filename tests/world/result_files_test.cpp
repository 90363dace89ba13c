// The results a rank process hands on (hmc/world/result_files.hpp): the document's round trip, and
// the launcher's side of the per-repetition files, on a real folder.

#include "hmc/world/result_files.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using hmc::scenario::RankResult;
using hmc::world::RepetitionFiles;
using hmc::world::repetitionResultFile;

class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (fs::temp_directory_path() / "hmc-result-files-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

RankResult resultOf(int rank, int marker) {
  RankResult result;
  result.rank = rank;
  result.collectives = static_cast<std::uint64_t>(marker);
  return result;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

}  // namespace

TEST_SUITE("result files") {
  TEST_CASE("a results document reads back what was written") {
    RankResult crashed = resultOf(3, 7);
    crashed.crashed = true;
    crashed.crashReason = "killed by signal 9 (Killed)";
    const auto back =
        hmc::world::parseRankResults(hmc::world::rankResultsDocument({resultOf(3, 1), crashed}));
    REQUIRE(back.size() == 2);
    CHECK(back[0].rank == 3);
    CHECK(back[0].collectives == 1);
    CHECK(back[1].crashed);
    CHECK(back[1].crashReason == "killed by signal 9 (Killed)");
    CHECK_THROWS(hmc::world::parseRankResults("{\"repetitions\": 3"));
    CHECK(repetitionResultFile("/x/rank2", 5) == "/x/rank2.5.json");
  }

  TEST_CASE("repetitions are handed on in order once every rank wrote its file, then removed") {
    TempFolder folder;
    std::vector<std::vector<RankResult>> handed;
    RepetitionFiles files(folder.path(), 2, [&](std::vector<RankResult> ranks) {
      handed.push_back(std::move(ranks));
    });
    const auto put = [&](int rank, std::size_t repetition) {
      write(repetitionResultFile(files.stem(rank), repetition),
            hmc::world::rankResultsDocument({resultOf(rank, static_cast<int>(repetition))}));
    };
    put(0, 0);
    put(0, 1);
    files.handOnReady();
    CHECK(handed.empty());  // rank 1 has not finished repetition 0
    put(1, 0);
    files.handOnReady();
    REQUIRE(handed.size() == 1);
    CHECK(handed[0][0].rank == 0);
    CHECK(handed[0][1].rank == 1);
    CHECK(files.handedOn() == 1);
    CHECK_FALSE(fs::exists(repetitionResultFile(files.stem(0), 0)));
    CHECK_FALSE(fs::exists(repetitionResultFile(files.stem(1), 0)));
    // What is left: rank 0's repetition 1, nothing of rank 1.
    const auto rest0 = files.rest(0);
    REQUIRE(rest0.size() == 1);
    CHECK(rest0[0].collectives == 1);
    CHECK(files.rest(1).empty());
    files.hand({resultOf(0, 1), resultOf(1, 1)});
    CHECK(files.handedOn() == 2);
    CHECK(handed.size() == 2);
    CHECK(fs::is_empty(folder.path()));
  }

  TEST_CASE("an unreadable file is not handed on, nor read as the rank's rest") {
    TempFolder folder;
    int calls = 0;
    RepetitionFiles files(folder.path(), 1, [&](std::vector<RankResult>) { ++calls; });
    write(repetitionResultFile(files.stem(0), 0), "{\"repetitions\": [");
    files.handOnReady();
    CHECK(calls == 0);
    CHECK(files.rest(0).empty());
    CHECK_FALSE(hmc::world::readRankResult(folder.path() / "missing.json", 0).has_value());
  }
}
