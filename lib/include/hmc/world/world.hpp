#pragma once
// hmc::joinWorld: one call that makes a LibTorch program a rank of an hmc world, with what
// hmc-run gives its own ranks. LibTorch has no init_process_group; a C++ program started by
// torchrun, srun or mpirun calls
//
//   hmc::World world = hmc::joinWorld();          // placement from the launcher's variables
//   auto module = std::make_shared<hmc::nn::ScratchLinear>();   // uses world's manager
//   ... forward, backward, drop, re-create, close ...
//   return world.close().exitCode;                // collective close, leak check, report
//
// and gets, from the same library code hmc-run's launcher ranks run (hmc/world/):
// - placement: rank, world size and master from torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
//   MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, ...), as
//   collective/launch_env.hpp reads them; or explicit (JoinOptions, or HMC_RANK,
//   HMC_WORLD_SIZE, HMC_MASTER_ADDR, HMC_MASTER_PORT);
// - the join, bounded by its own deadline (joinTimeout): a rank that does not come is named;
// - the transport (tcp by default; store, gloo; nccl where built with CUDA), every collective
//   bounded by `timeout`;
// - a ResourceManager over it, current() for every thread of the process (ProcessScope), so
//   that MulticoreModules made anywhere in the program use it; scope() for a thread that wants
//   it explicitly;
// - the flight recorder (the last flightCapacity collectives), the watchdog's heartbeats and
//   the job's metadata in the control store, so that `hmc-run status --master-addr A
//   --master-port P` attaches to the running program and names the rank that waits and where;
//   SIGUSR1 dumps this rank's flight record to stderr; a collective past its deadline publishes
//   it for the other ranks;
// - at the end (close(), or the destructor): the ranks meet out of band (store keys), then the
//   bounded collective close of every group still open (close_all) when all came and none hung,
//   the leak check, and on rank 0 one report of every rank's end, led by the world's first
//   failure (hmc/diagnostics/diagnosis.hpp; an error the program caught counts): which rank did
//   what first, in which stage, on which host, and what followed from it, on stderr and, where
//   asked, as JSON;
// - an evidence folder on rank 0's node (hmc/world/evidence_folder.hpp, under $TMPDIR): the
//   ranks of that node write their pids and their ends there beside the store; rank 0 does not
//   wait for one whose process has ended, and when rank 0's own process has ended without
//   reporting, the lowest rank of its node still alive reports in its place.
//
// Options from the environment: every HMC_* variable below, when set, replaces the value the
// program put in JoinOptions, so that a program is diagnosed without being rebuilt (a value
// that does not parse is a ValueError naming the variable).
//
// Thread rules: joinWorld, close and the destructor run on one thread (the program's main
// thread, usually). Modules may be made and used on any thread, but a rank's collectives
// (forward's first bind, close, recycle) must be called by one thread at a time and in the
// same order on every rank, as for ResourceManager. The World is movable, not copyable.
//
// A launcher's teardown: at SIGTERM, SIGINT or SIGHUP every rank publishes where it was and rank
// 0 reports (0.5 s for the others), then the signal ends the process as it would have; under
// mpirun at Open MPI's warning (the SIGCONT 1 s before its SIGTERM, whose SIGKILL follows in
// 50 ms) instead: rank 0 reports from the snapshots the others publish then (0.4 s).
//
// Not yet (see docs/embedding.md): the evidence folder beside the store, and an hmc-run
// report document of the program's lifecycle calls.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "hmc/collective/transport.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/record/recording.hpp"
#include "hmc/world/rank_launch.hpp"

namespace hmc {

struct JoinOptions {
  // Explicit placement (else the launcher's variables): HMC_RANK, HMC_WORLD_SIZE,
  // HMC_MASTER_ADDR, HMC_MASTER_PORT (29500 unset; 0 on rank 0: a free port, for a world of
  // one). masterAddr/masterPort also replace the launcher's.
  std::optional<int> rank;
  std::optional<int> worldSize;
  std::optional<std::string> masterAddr;
  std::optional<int> masterPort;
  // HMC_TRANSPORT: tcp, store, gloo or nccl.
  collective::Transport transport = collective::Transport::kTcp;
  // HMC_TIMEOUT (seconds): the deadline of every collective.
  std::chrono::milliseconds timeout{30'000};
  // HMC_JOIN_TIMEOUT (seconds): the bound on forming the world.
  std::chrono::milliseconds joinTimeout = world::kDefaultJoinTimeout;
  // HMC_NAME: the job's name in `hmc-run status` and the report ("" : the program's name).
  std::string name;
  // HMC_FLIGHT_CAPACITY: collectives the flight recorder keeps.
  std::size_t flightCapacity = 64;
  // HMC_REPORT: where rank 0 writes the end report (JSON, format "hmc-world-end/1").
  std::optional<std::string> reportPath;
  // HMC_RECORD: the folder where each rank records its lifecycle calls (rank-<N>.hmcrec,
  // hmc/record/recording.hpp; created when missing); `hmc-run record merge` makes a scenario
  // of them. HMC_RECORD_CAP (bytes): each file's cap.
  std::optional<std::string> recordDirectory;
  std::uint64_t recordCap = record::kDefaultCapBytes;

  // `options` with every HMC_* variable that is set in place. Throws ValueError.
  static JoinOptions withEnvironment(JoinOptions options);
};

// How the world ended, as close() found it.
struct WorldEnd {
  // No rank hung, failed or left resources behind (on rank 0: every rank; elsewhere: this
  // rank as far as it knows).
  bool clean = false;
  // Some collective passed its deadline or lost a rank.
  bool hung = false;
  // The report's verdict line ("OK: ...", "HUNG: ...", "FAILED: ...").
  std::string summary;
  // The first failure of the world, as rank 0's report leads with it ("" when none, and on the
  // other ranks): hmc/diagnostics/diagnosis.hpp. A collective error that the program caught
  // counts: the world then ends FAILED (exit 1), or HUNG (exit 3) when the first failure is a
  // hang or a crash.
  std::string firstFailure;
  // hmc-run's exit codes: 0 clean, 1 an error or a leak, 3 a hang.
  int exitCode = 0;
};

class World {
 public:
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  // close() if the program did not; never throws (an error is logged).
  ~World();

  int rank() const noexcept;
  int worldSize() const noexcept;
  // "torchrun", "mpirun", "srun", or "explicit".
  const std::string& launcher() const noexcept;
  // "host:port" of the control store, for `hmc-run status --master-addr host --master-port port`.
  std::string storeAddress() const;
  // The rank's manager (current() for the process while the world is open).
  std::shared_ptr<lifecycle::ResourceManager> manager() const;
  // Makes the manager current() for the calling thread until the Scope is destroyed.
  lifecycle::ResourceManager::Scope scope() const;

  // The end, once: the ranks meet out of band at the world's end (so that a rank that skipped
  // a collective the others run waits there and is named, rather than entering their
  // collective with a close of its own), then the collective close of every group still open
  // (skipped when a rank hung or did not come: nobody would close with it), the leak check,
  // then the ranks' ends meet in the store and rank 0 prints the report, led by the first
  // failure (and writes it to reportPath). Bounded: the meeting by the collective deadline and
  // a second (longer, up to the join timeout, while the ranks not there are at work outside
  // any collective), the close by the collective deadline, rank 0's wait for the others' ends
  // by the deadline too (1 s after a hang). A second call returns the first's result.
  WorldEnd close();

 private:
  struct Impl;
  explicit World(std::unique_ptr<Impl> impl);
  friend World joinWorld(JoinOptions options);
  std::unique_ptr<Impl> impl_;
};

// Joins this process's world (see the file comment). Throws ValueError for a placement that
// cannot be found or options that do not parse, and what forming the transport throws
// (TimeoutError naming the ranks that did not join within joinTimeout, BackendError).
World joinWorld(JoinOptions options = {});

}  // namespace hmc
