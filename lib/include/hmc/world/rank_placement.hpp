#pragma once
// Where one rank process sits in its world, held by value wherever it is needed: its rank,
// the world's size, the master (the control store's host and port), the gloo transport's own
// store port, who hosts the control store, and which launcher started it. Decided once: by
// hmc-run's own launcher for its rank processes, or from a launcher's environment
// (fromLaunch).

#include <string>

#include "hmc/collective/launch_env.hpp"

namespace hmc::world {

// Who hosts the control store: rank 0's process (hmc-run's own launch, mpirun, srun), or the
// launcher's agent (torchrun's TORCHELASTIC_USE_AGENT_STORE), every rank then a client.
enum class StoreHost { kRankZero, kLauncherAgent };

struct RankPlacement {
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  int glooPort = 0;  // the gloo transport's own store; 0: masterPort + 1
  StoreHost storeHost = StoreHost::kRankZero;
  // "torchrun", "mpirun", "srun"; "" for a rank process of hmc-run's own launch.
  std::string launcher;

  // Whether this process hosts the control store's server.
  bool hostsStore() const noexcept { return storeHost == StoreHost::kRankZero && rank == 0; }
  // Started by an external launcher: rank 0 gathers every rank's results through the store
  // and reports; under hmc-run's own launch each rank writes result files for its parent.
  bool underLauncher() const noexcept { return !launcher.empty(); }
  // What losing the store is called in messages: "the store's host (rank 0)" or "the store's
  // host (the launcher's agent)".
  std::string storeHostName() const;

  static RankPlacement fromLaunch(const collective::LaunchEnv& launch);
};

}  // namespace hmc::world
