#include "hmc/world/result_files.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace hmc::world {

namespace fs = std::filesystem;

std::string rankResultsDocument(const std::vector<scenario::RankResult>& results) {
  nlohmann::json repetitions = nlohmann::json::array();
  for (const auto& result : results) repetitions.push_back(scenario::toJson(result));
  return nlohmann::json{{"repetitions", std::move(repetitions)}}.dump();
}

std::vector<scenario::RankResult> parseRankResults(const std::string& text) {
  std::vector<scenario::RankResult> results;
  const auto document = nlohmann::json::parse(text);  // outlives the loop
  for (const auto& entry : document.at("repetitions")) {
    results.push_back(scenario::rankResultFromJson(entry));
  }
  return results;
}

std::string repetitionResultFile(const std::string& stem, std::size_t repetition) {
  return fmt::format("{}.{}.json", stem, repetition);
}

std::optional<scenario::RankResult> readRankResult(const fs::path& file, int rank) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  try {
    auto results = parseRankResults(std::string(std::istreambuf_iterator<char>(in), {}));
    if (results.size() == 1) return std::move(results.front());
    spdlog::warn("rank {} wrote {} results to {}, not one", rank, results.size(), file.string());
  } catch (const std::exception& error) {
    spdlog::warn("rank {} wrote an unreadable result {}: {}", rank, file.string(), error.what());
  }
  return std::nullopt;
}

RepetitionFiles::RepetitionFiles(fs::path folder, int world, RepetitionSink sink)
    : folder_(std::move(folder)), world_(world), sink_(std::move(sink)) {}

std::string RepetitionFiles::stem(int rank) const {
  return (folder_ / fmt::format("rank{}", rank)).string();
}

void RepetitionFiles::handOnReady() {
  for (;;) {
    std::vector<fs::path> files;
    for (int rank = 0; rank < world_; ++rank) {
      files.emplace_back(repetitionResultFile(stem(rank), next_));
      std::error_code ec;
      if (!fs::exists(files.back(), ec)) return;
    }
    std::vector<scenario::RankResult> ranks;
    for (int rank = 0; rank < world_; ++rank) {
      auto result = readRankResult(files[rank], rank);
      if (!result) return;  // read once every rank has exited (rest())
      ranks.push_back(std::move(*result));
    }
    hand(std::move(ranks));
  }
}

std::vector<scenario::RankResult> RepetitionFiles::rest(int rank) const {
  std::vector<scenario::RankResult> results;
  for (std::size_t r = next_;; ++r) {
    auto result = readRankResult(repetitionResultFile(stem(rank), r), rank);
    if (!result) return results;
    results.push_back(std::move(*result));
  }
}

void RepetitionFiles::hand(std::vector<scenario::RankResult> ranks) {
  if (sink_) sink_(std::move(ranks));
  for (int rank = 0; rank < world_; ++rank) {
    std::error_code ec;
    fs::remove(repetitionResultFile(stem(rank), next_), ec);
  }
  ++next_;
}

}  // namespace hmc::world
