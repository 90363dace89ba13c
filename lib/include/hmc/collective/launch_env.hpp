#pragma once
// Which rank this process is, when a launcher started it: torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), Slurm srun (SLURM_PROCID, SLURM_NTASKS, master from
// --master-addr or the first host of SLURM_JOB_NODELIST), Open MPI mpirun
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, master from --master-addr or MASTER_ADDR).
//
// Precedence when several are present: torchrun, then Open MPI, then Slurm (torchrun under
// srun is common: its RANK is the global rank, SLURM_PROCID the node's). A pair given half
// (RANK without WORLD_SIZE), a value that is not a number, a rank outside the world, or a
// master that cannot be found is a ValueError that names the variables and what to do.

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hmc::collective {

inline constexpr int kDefaultMasterPort = 29500;

struct LaunchEnv {
  std::string launcher;  // "torchrun", "mpirun", "srun"
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr;
  int masterPort = kDefaultMasterPort;
  // torchrun's agent already hosts a store on the master port (TORCHELASTIC_USE_AGENT_STORE):
  // every rank connects as a client.
  bool agentHostsStore = false;
};

struct LaunchOverrides {
  std::optional<std::string> masterAddr;  // --master-addr
  std::optional<int> masterPort;          // --master-port
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup processEnvironment();

// nullopt when no launcher variables are set. Throws ValueError as described above.
std::optional<LaunchEnv> detectLaunch(const EnvLookup& env, const LaunchOverrides& overrides = {});

// A TCP port free right now on 127.0.0.1 (the kernel's choice for port 0), for a store or a
// listener started next. Throws RuntimeError with the OS reason.
int freeLoopbackPort();

// The first host of a Slurm node list: "node[01-04,07],gpu5" -> "node01".
std::string firstSlurmHost(const std::string& nodeList);

}  // namespace hmc::collective
