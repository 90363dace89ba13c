#include "hmc/world/evidence_folder.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "hmc/host.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/world/run_keys.hpp"

namespace hmc::world {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whether pid is a live process (a zombie is dead: its parent has not reaped it yet).
bool processAlive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const auto stat = readFile(fmt::format("/proc/{}/stat", pid));
  if (!stat) return true;  // no /proc: kill's answer stands
  const auto close = stat->rfind(')');
  return close == std::string::npos || close + 2 >= stat->size() || (*stat)[close + 2] != 'Z';
}

}  // namespace

namespace {

fs::path temporaryFolder() {
  const char* tmp = std::getenv("TMPDIR");
  return fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
}

std::string folderPrefix(const std::string& tag) {
  return tag.empty() ? std::string("hmc-evidence-") : "hmc-evidence-" + tag + "-";
}

}  // namespace

EvidenceFolder EvidenceFolder::create(int rank, const std::string& tag) {
  std::string pattern = (temporaryFolder() / (folderPrefix(tag) + "XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    spdlog::warn(
        "rank {}: no local evidence folder (mkdtemp {}: {}); a launcher's teardown "
        "then leaves only what the store holds (set TMPDIR to a writable folder)",
        rank, pattern, std::strerror(errno));
    return {};
  }
  EvidenceFolder folder(pattern, rank);
  folder.writePid();
  return folder;
}

std::vector<EvidenceFolder> EvidenceFolder::orphans(const std::string& tag, int rank) {
  std::vector<EvidenceFolder> found;
  if (tag.empty()) return found;
  const std::string prefix = folderPrefix(tag);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(temporaryFolder(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() != prefix.size() + 6) continue;  // XXXXXX
    EvidenceFolder folder(entry.path().string(), rank);
    if (folder.ended(0)) found.push_back(std::move(folder));
  }
  return found;
}

EvidenceFolder EvidenceFolder::joinOrphan(const std::string& tag, int rank) {
  std::vector<EvidenceFolder> found = orphans(tag, rank);
  if (found.size() != 1) return {};  // none, or several worlds' (which one is not known)
  found.front().writePid();
  return std::move(found.front());
}

void EvidenceFolder::announce(collective::KeyValueStore& kv) const {
  try {
    // Without a folder too ("none"), so that no rank waits for the announcement.
    kv.set(keys::kEvidenceFolder, usable() ? hostName() + "\n" + path_ : std::string("none"));
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: cannot announce the evidence folder: {}", rank_, error.what());
  }
}

EvidenceFolder EvidenceFolder::join(collective::KeyValueStore& kv, int rank,
                                    std::chrono::milliseconds timeout) {
  std::string text;
  try {
    const auto bytes = kv.get(keys::kEvidenceFolder, timeout);
    text.assign(bytes.begin(), bytes.end());
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: no evidence folder announced: {}", rank, error.what());
    return {};
  }
  const auto newline = text.find('\n');
  if (newline == std::string::npos || text.substr(0, newline) != hostName()) return {};
  const std::string path = text.substr(newline + 1);
  struct stat info {};
  // Only a real folder of this user that nobody else may write: never follow a planted link.
  if (lstat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != geteuid() ||
      (info.st_mode & 0777) != 0700) {
    spdlog::debug("rank {}: the evidence folder {} is not a private folder of this user", rank,
                  path);
    return {};
  }
  EvidenceFolder folder(path, rank);
  folder.writePid();
  return folder;
}

std::string EvidenceFolder::file(int rank, const char* suffix) const {
  return fmt::format("{}/rank{}.{}", path_, rank, suffix);
}

void EvidenceFolder::writePid() const {
  try {
    scenario::writeOutputFile(file(rank_, "pid"), std::to_string(getpid()));
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: {}", rank_, error.what());
  }
}

std::string EvidenceFolder::writeResults(const std::string& document, bool early) const {
  if (!usable()) return "no local evidence folder";
  try {
    scenario::writeOutputFile(file(rank_, early ? "early.json" : "json"), document);
    return "";
  } catch (const std::exception& error) {
    return error.what();
  }
}

void EvidenceFolder::writeFirstFailure(const std::string& document) const {
  if (!usable()) return;
  try {
    scenario::writeOutputFile(file(rank_, "first.json"), document);
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: {}", rank_, error.what());
  }
}

std::optional<std::string> EvidenceFolder::readFirstFailure(int rank) const {
  if (!usable()) return std::nullopt;
  return readFile(file(rank, "first.json"));
}

void EvidenceFolder::markReported() const {
  if (!usable()) return;
  try {
    scenario::writeOutputFile(path_ + "/reported", "1");
  } catch (const std::exception& error) {
    spdlog::debug("rank {}: {}", rank_, error.what());
  }
}

bool EvidenceFolder::reported() const { return usable() && fs::exists(path_ + "/reported"); }

bool EvidenceFolder::reportedWithin(std::chrono::seconds age) const {
  if (!usable()) return false;
  std::error_code ec;
  const auto markedAt = fs::last_write_time(path_ + "/reported", ec);
  return !ec && fs::file_time_type::clock::now() - markedAt < age;
}

std::optional<std::string> EvidenceFolder::readResults(int rank, bool early) const {
  if (!usable()) return std::nullopt;
  return readFile(file(rank, early ? "early.json" : "json"));
}

bool EvidenceFolder::alive(int rank) const {
  const auto pid = pidOf(rank);
  return pid && processAlive(static_cast<pid_t>(*pid));
}

std::optional<std::int64_t> EvidenceFolder::pidOf(int rank) const {
  if (!usable()) return std::nullopt;
  const auto text = readFile(file(rank, "pid"));
  if (!text) return std::nullopt;
  return std::atoll(text->c_str());
}

bool EvidenceFolder::known(int rank) const { return usable() && fs::exists(file(rank, "pid")); }

int EvidenceFolder::lowestLiveRank(int worldSize) const {
  if (!usable() || !fs::exists(path_)) return -1;
  int lowest = rank_;
  for (int rank = 0; rank < worldSize; ++rank) {
    if (rank == rank_ || alive(rank)) {
      lowest = rank;
      break;
    }
  }
  // The reporting rank removes the folder (one rename) as it reports. A look that raced with
  // that removal read the lower ranks' pid files as missing, and would make this rank a second
  // reporter (its report, without rank 0's steps, replaced rank 0's under mpirun's SIGTERM on
  // a loaded machine): the folder gone after the look means nobody here reports.
  return fs::exists(path_) ? lowest : -1;
}

void EvidenceFolder::remove() const {
  if (!usable()) return;
  // Renamed first (atomic): a rank that writes its results at the same moment (each rank of a
  // launcher's teardown gets the signal at once) then finds no folder, instead of adding a file
  // between remove_all's listing and its rmdir, which left the folder behind.
  std::error_code ec;
  const std::string gone = path_ + ".removed";
  fs::rename(path_, gone, ec);
  fs::remove_all(ec ? path_ : gone, ec);
}

}  // namespace hmc::world
