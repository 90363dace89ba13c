#pragma once
// What a run needs from this host, checked before it starts (issue 12: "exhaustion").
//
// A run that cannot fit used to find out halfway: forks until fork fails, a store that dies
// of "Too many open files", threads that cannot start, an allocation that aborts. hmc-run
// estimates what a run needs from measured per-rank figures (below) and compares it with the
// limits of this process and host before starting any rank: a run that does not fit is
// refused (exit 2) naming the limit and what to change; an open-file soft limit below the
// need is raised up to the hard limit, with a note on stderr.
//
// The figures, measured on Debian 12 / LibTorch 1.13 (hmc-run rank processes of the tcp,
// store and gloo transports at 2, 4 and 8 ranks; thread ranks at 16 ranks x 2,000 and 20,000
// steps), rounded up:
//   - the store host's descriptors: 27..38 + 11..12.3 per rank -> 48 + 14 per rank;
//   - a rank process: 57-58 MiB private memory, 10-15 threads -> 64 MiB, 20 tasks;
//   - a recorded step result (one per top-level step, rank and repetition): 1.24 KiB -> 1.5 KiB;
//   - a thread rank: 0.2-0.3 MiB resident -> 0.5 MiB, plus its stack's address space.

#include <cstdint>
#include <optional>
#include <string>

namespace hmc::world {

struct RunShape {
  bool processes = false;   // rank processes of hmc-run's own launch (else thread ranks)
  bool hostsStore = false;  // this process hosts the store and no other rank (a launcher's rank 0)
  int worldSize = 1;
  std::uint64_t recordedSteps = 0;  // top-level steps (one result each per rank)
  int repetitions = 1;
};

struct HostLimits {
  std::optional<std::uint64_t> openFilesSoft;  // RLIMIT_NOFILE; nullopt: unlimited
  std::optional<std::uint64_t> openFilesHard;
  std::optional<std::uint64_t> tasks;            // RLIMIT_NPROC; nullopt: unlimited or exempt
  std::uint64_t tasksInUse = 0;                  // this user's tasks (threads) now
  std::optional<std::uint64_t> addressSpace;     // RLIMIT_AS; nullopt: unlimited
  std::uint64_t addressSpaceInUse = 0;           // this process's now (VmSize)
  std::uint64_t threadStack = 8ull << 20;        // a thread's stack (RLIMIT_STACK, else 8 MiB)
  std::optional<std::uint64_t> memoryAvailable;  // MemAvailable; nullopt: unknown
};

struct RunNeeds {
  std::uint64_t storeHostFiles = 0;  // descriptors of the store's host (0: no store)
  std::uint64_t tasks = 0;           // tasks (processes and threads) the run adds
  std::uint64_t memory = 0;          // bytes the run adds (all processes together)
  std::uint64_t addressSpace = 0;    // bytes this process's address space grows by
};

RunNeeds estimateNeeds(const RunShape& shape);

// The limits of this process (getrlimit) and host (/proc/meminfo, /proc/*/status).
HostLimits readHostLimits();

struct PreflightResult {
  std::string refusal;                            // empty: the run fits
  std::optional<std::uint64_t> raiseOpenFilesTo;  // raise the soft limit to this first
};

PreflightResult checkRun(const RunShape& shape, const RunNeeds& needs, const HostLimits& limits);

// checkRun on this host; raises the open-file soft limit when asked (a note on stderr).
// Returns the refusal ("" when the run may start). HMC_SKIP_PREFLIGHT=1 skips it (for a host
// where the estimates are wrong: the run then meets the limits themselves).
std::string preflight(const RunShape& shape);

}  // namespace hmc::world
