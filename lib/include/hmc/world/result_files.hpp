#pragma once
// The results a rank process hands on, as a document: to the store under an external
// launcher (run_keys.hpp's result/<rank>: every repetition's), and under hmc-run's own launch
// to one file per repetition ("<stem>.<repetition>.json", written as the repetition ends and
// read and removed by the launcher: RepetitionFiles), so that neither side holds past
// repetitions (a long --repetitions run stays flat).

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hmc/scenario/rank_result.hpp"

namespace hmc::world {

// The document: {"repetitions": [RankResult JSON, ...]}.
std::string rankResultsDocument(const std::vector<scenario::RankResult>& results);
// Reads that document back. Throws (nlohmann::json or ValueError) on a malformed one.
std::vector<scenario::RankResult> parseRankResults(const std::string& text);
// The file a rank writes its result of `repetition` (0-based) to: "<stem>.<repetition>.json".
std::string repetitionResultFile(const std::string& stem, std::size_t repetition);
// A rank's result of one repetition as it wrote it, or nullopt when the file is missing or
// unreadable (logged).
std::optional<scenario::RankResult> readRankResult(const std::filesystem::path& file, int rank);

// Every repetition's results, every rank's in rank order, handed on in repetition order.
using RepetitionSink = std::function<void(std::vector<scenario::RankResult>)>;

// The launcher's side of the result files of `world` ranks in `folder` (rank R's stem is
// "<folder>/rank<R>"): hands each repetition on once every rank has written its file, and
// removes the files. Single-threaded.
class RepetitionFiles {
 public:
  RepetitionFiles(std::filesystem::path folder, int world, RepetitionSink sink);

  // The result file stem of `rank` (RankLaunch::resultFile).
  std::string stem(int rank) const;
  // Hands on the next repetitions that every rank has written, in order.
  void handOnReady();
  // The results `rank` wrote from the next repetition on, up to its first missing or
  // unreadable file.
  std::vector<scenario::RankResult> rest(int rank) const;
  // Hands on the next repetition and removes its files.
  void hand(std::vector<scenario::RankResult> ranks);
  std::size_t handedOn() const noexcept { return next_; }

 private:
  std::filesystem::path folder_;
  int world_;
  RepetitionSink sink_;
  std::size_t next_ = 0;
};

}  // namespace hmc::world
