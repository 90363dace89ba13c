#include "hmc/world/preflight.hpp"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hmc::world {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kStoreFilesBase = 48;
constexpr std::uint64_t kStoreFilesPerRank = 14;
constexpr std::uint64_t kTasksPerRankProcess = 20;
constexpr std::uint64_t kTasksBase = 16;  // hmc-run's own threads (LibTorch, watchers)
constexpr std::uint64_t kMemoryPerRankProcess = 64 * kMiB;
constexpr std::uint64_t kMemoryPerThreadRank = kMiB / 2;
constexpr std::uint64_t kMemoryPerStepResult = 1536;

std::optional<std::uint64_t> finite(rlim_t value) {
  if (value == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(value);
}

std::string bytes(std::uint64_t value) {
  if (value >= (1ull << 30))
    return fmt::format("{:.1f} GiB", static_cast<double>(value) / (1ull << 30));
  if (value < kMiB) return fmt::format("{} KiB", (value + 1023) / 1024);
  return fmt::format("{} MiB", (value + kMiB - 1) / kMiB);
}

// A number from a "Key:   123 kB" line of a /proc file, in bytes (kB) or as is.
std::optional<std::uint64_t> procField(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() ||
        line[key.size()] != ':') {
      continue;
    }
    std::istringstream fields(line.substr(key.size() + 1));
    std::uint64_t value = 0;
    std::string unit;
    if (!(fields >> value)) return std::nullopt;
    fields >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

// The tasks (threads) of processes owned by `uid`, as RLIMIT_NPROC counts them.
std::uint64_t tasksOf(uid_t uid) {
  std::uint64_t tasks = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const std::string status = std::string("/proc/") + entry->d_name + "/status";
    std::ifstream in(status);
    std::string line;
    bool mine = false;
    std::uint64_t threads = 0;
    while (std::getline(in, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        std::istringstream fields(line.substr(4));
        uid_t real = 0;
        fields >> real;
        mine = real == uid;
      } else if (line.rfind("Threads:", 0) == 0) {
        threads = std::strtoull(line.c_str() + 8, nullptr, 10);
      }
    }
    if (mine) tasks += threads;
  }
  ::closedir(proc);
  return tasks;
}

}  // namespace

RunNeeds estimateNeeds(const RunShape& shape) {
  RunNeeds needs;
  const auto world = static_cast<std::uint64_t>(shape.worldSize);
  const std::uint64_t results = shape.recordedSteps * world *
                                static_cast<std::uint64_t>(std::max(1, shape.repetitions)) *
                                kMemoryPerStepResult;
  if (shape.hostsStore) {
    needs.storeHostFiles = kStoreFilesBase + kStoreFilesPerRank * world;
  } else if (shape.processes) {
    needs.storeHostFiles = kStoreFilesBase + kStoreFilesPerRank * world;
    needs.tasks = kTasksBase + kTasksPerRankProcess * world;
    needs.memory = kMemoryPerRankProcess * world + results;
    needs.addressSpace = results;  // the launcher gathers every rank's results
  } else {
    needs.tasks = kTasksBase + world;
    needs.memory = kMemoryPerThreadRank * world + results;
    needs.addressSpace = results + kMemoryPerThreadRank * world;  // stacks: added in checkRun
  }
  return needs;
}

HostLimits readHostLimits() {
  HostLimits limits;
  rlimit value{};
  if (::getrlimit(RLIMIT_NOFILE, &value) == 0) {
    limits.openFilesSoft = finite(value.rlim_cur);
    limits.openFilesHard = finite(value.rlim_max);
  }
  // The kernel does not hold root to RLIMIT_NPROC (fork checks it only without
  // CAP_SYS_RESOURCE/CAP_SYS_ADMIN), so it is checked for other users only.
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &value) == 0) {
    limits.tasks = finite(value.rlim_cur);
    if (limits.tasks) limits.tasksInUse = tasksOf(::getuid());
  }
  if (::getrlimit(RLIMIT_AS, &value) == 0) {
    limits.addressSpace = finite(value.rlim_cur);
    if (limits.addressSpace) {
      limits.addressSpaceInUse = procField("/proc/self/status", "VmSize").value_or(0);
    }
  }
  if (::getrlimit(RLIMIT_STACK, &value) == 0 && value.rlim_cur != RLIM_INFINITY) {
    limits.threadStack = static_cast<std::uint64_t>(value.rlim_cur);
  }
  limits.memoryAvailable = procField("/proc/meminfo", "MemAvailable");
  return limits;
}

PreflightResult checkRun(const RunShape& shape, const RunNeeds& needs, const HostLimits& limits) {
  PreflightResult result;
  const std::string what = shape.hostsStore
                               ? fmt::format("hosting the store of {} ranks", shape.worldSize)
                               : fmt::format("a {}-rank run with {} ranks", shape.worldSize,
                                             shape.processes ? "process" : "thread");
  const std::string fewer = shape.processes
                                ? "use fewer ranks (--world-size) or --transport threads"
                                : "use fewer ranks (--world-size)";
  if (limits.memoryAvailable && needs.memory > *limits.memoryAvailable) {
    result.refusal = fmt::format(
        "{} needs about {} of memory ({} per rank{} + {} per recorded step result and rank), "
        "but this host has {} available (MemAvailable, /proc/meminfo): {}, or fewer steps or "
        "repetitions",
        what, bytes(needs.memory),
        shape.processes ? bytes(kMemoryPerRankProcess) : bytes(kMemoryPerThreadRank),
        shape.processes ? " process" : "", fmt::format("{:.1f} KiB", kMemoryPerStepResult / 1024.0),
        bytes(*limits.memoryAvailable), fewer);
    return result;
  }
  if (needs.storeHostFiles > 0 && limits.openFilesSoft &&
      needs.storeHostFiles > *limits.openFilesSoft) {
    if (!limits.openFilesHard || needs.storeHostFiles <= *limits.openFilesHard) {
      std::uint64_t target = needs.storeHostFiles * 2;
      if (limits.openFilesHard) target = std::min(target, *limits.openFilesHard);
      result.raiseOpenFilesTo = target;
    } else {
      result.refusal = fmt::format(
          "{} needs about {} open files in the store's host (rank 0: {} + {} per rank), but the "
          "open-file limit is {} (ulimit -n, hard limit {}): raise it (ulimit -n {}) or {}",
          what, needs.storeHostFiles, kStoreFilesBase, kStoreFilesPerRank, *limits.openFilesSoft,
          *limits.openFilesHard, needs.storeHostFiles, fewer);
      return result;
    }
  }
  if (limits.tasks && needs.tasks > 0) {
    const std::uint64_t free =
        *limits.tasks > limits.tasksInUse ? *limits.tasks - limits.tasksInUse : 0;
    if (needs.tasks > free) {
      result.refusal = fmt::format(
          "{} needs about {} more processes and threads ({}), but the limit of this user's "
          "tasks is {} (ulimit -u) and {} are in use: raise it (ulimit -u) or {}",
          what, needs.tasks,
          shape.processes ? fmt::format("{} per rank process", kTasksPerRankProcess)
                          : std::string("one thread per rank"),
          *limits.tasks, limits.tasksInUse, fewer);
      return result;
    }
  }
  if (limits.addressSpace) {
    std::uint64_t grows = needs.addressSpace;
    if (!shape.processes && !shape.hostsStore) {
      grows += limits.threadStack * static_cast<std::uint64_t>(shape.worldSize);
    }
    if (limits.addressSpaceInUse + grows > *limits.addressSpace) {
      result.refusal = fmt::format(
          "{} needs about {} more address space in this process ({}step results{}), but the "
          "address-space limit is {} and {} is in use (ulimit -v): raise it (ulimit -v "
          "unlimited), {}, or fewer steps or repetitions",
          what, bytes(grows), shape.processes ? "" : "thread stacks, ",
          shape.processes ? " gathered from every rank" : "", bytes(*limits.addressSpace),
          bytes(limits.addressSpaceInUse), fewer);
      return result;
    }
  }
  return result;
}

std::string preflight(const RunShape& shape) {
  if (const char* skip = std::getenv("HMC_SKIP_PREFLIGHT");
      skip != nullptr && *skip != '\0' && std::string(skip) != "0") {
    return "";
  }
  const RunNeeds needs = estimateNeeds(shape);
  const PreflightResult result = checkRun(shape, needs, readHostLimits());
  if (!result.refusal.empty()) return result.refusal;
  if (result.raiseOpenFilesTo) {
    rlimit value{};
    ::getrlimit(RLIMIT_NOFILE, &value);
    const rlim_t before = value.rlim_cur;
    value.rlim_cur = static_cast<rlim_t>(*result.raiseOpenFilesTo);
    if (::setrlimit(RLIMIT_NOFILE, &value) != 0) {
      return fmt::format(
          "cannot raise the open-file limit from {} to {} (needed by the store's "
          "host): {}; raise it with ulimit -n",
          before, *result.raiseOpenFilesTo, std::strerror(errno));
    }
    fmt::print(stderr,
               "# hmc-run: raised the open-file soft limit (ulimit -n) from {} to {}: the "
               "store's host needs about {} for {} ranks\n",
               before, *result.raiseOpenFilesTo, needs.storeHostFiles, shape.worldSize);
  }
  return "";
}

}  // namespace hmc::world
