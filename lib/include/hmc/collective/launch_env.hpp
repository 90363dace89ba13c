#pragma once
// Which rank this process is, when a launcher started it: torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), Slurm srun (SLURM_PROCID, SLURM_NTASKS), Open MPI mpirun
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE).
//
// The master (the host and port of rank 0's store), first match wins:
//   host  --master-addr; MASTER_ADDR; 127.0.0.1 when every rank runs on this node (mpirun:
//         OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE; srun: SLURM_STEP_NUM_NODES or
//         SLURM_NNODES is 1, or the node list names one host); srun: the first host of
//         SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST. torchrun always sets MASTER_ADDR.
//   port  --master-port; MASTER_PORT; mpirun: derivedMasterPort(OMPI_MCA_ess_base_jobid),
//         srun: derivedMasterPort(SLURM_JOB_ID, SLURM_STEP_ID), the same number on every rank
//         of one job and (almost always) different for two jobs sharing a node; else 29500.
//
// A rank's own address (what the tcp transport binds and announces to its peers) is
// HMC_ADVERTISE_ADDR when set, else the local address that routes to the master
// (advertiseAddress).
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
  // Where masterAddr and masterPort came from, for messages: "--master-addr", "MASTER_ADDR",
  // "one node: every rank is local", "first host of SLURM_JOB_NODELIST", ...
  std::string masterAddrOrigin;
  std::string masterPortOrigin;
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

// The integer in variable `name`'s `value`, within [low, high]; else a ValueError naming both
// ("RANK='x' is not an integer in 0..1048576"). Launchers' variables and hmc's own (HMC_RANK...).
int parseIntVariable(const std::string& name, const std::string& value, int low, int high);

// nullopt when no launcher variables are set. Throws ValueError as described above.
std::optional<LaunchEnv> detectLaunch(const EnvLookup& env, const LaunchOverrides& overrides = {});

// A TCP port held for a store or listener that this process or a child opens next: a socket
// bound to 127.0.0.1 on the kernel's choice of port, with SO_REUSEADDR, not listening. While
// it is held, the kernel gives the port to no bind to port 0 and no outgoing connection (a
// port with a bound socket is skipped by both), a bind to it without SO_REUSEADDR fails, and
// a listener that sets SO_REUSEADDR binds it all the same: c10d's TCPStore does (1.13's
// sockets, 2.x's sockets and libuv). Close-on-exec, and closed in forked rank processes
// (world::ProcessGroup), so that only the holder keeps it. Holding it for the whole run is
// harmless: it accepts no connection.
class PortReservation {
 public:
  // Throws RuntimeError with the OS reason.
  static PortReservation loopback();
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  int port() const noexcept { return port_; }

 private:
  PortReservation(int fd, int port) noexcept : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
};

// The first host of a Slurm node list: "node[01-04,07],gpu5" -> "node01".
std::string firstSlurmHost(const std::string& nodeList);

// How many hosts a Slurm node list names: "node[01-04,07],gpu5" -> 6.
int slurmHostCount(const std::string& nodeList);

// The master port every rank of one job computes alike from the job's identity (a decimal
// job id, optionally a step id): in 20000..29998, below Linux's ephemeral range, and even so
// that the gloo transport's port (master port + 1) stays in range. kDefaultMasterPort when
// `jobId` is not a number.
int derivedMasterPort(const std::string& jobId, const std::string& stepId = "");

// The variable that overrides a rank's advertised address (advertiseAddress).
inline constexpr const char* kAdvertiseAddrVariable = "HMC_ADVERTISE_ADDR";
// "0": the tcp transport connects to every peer over TCP, those on this host too
// (TcpTransportOptions::localSockets).
inline constexpr const char* kTcpLocalSocketsVariable = "HMC_TCP_LOCAL_SOCKETS";
// "0": the tcp transport exchanges on its sockets even where every rank is on this host
// (TcpTransportOptions::sharedMemory).
inline constexpr const char* kTcpSharedMemoryVariable = "HMC_TCP_SHARED_MEMORY";

// The address this process announces to its peers and binds its listeners to: the value of
// HMC_ADVERTISE_ADDR when set and not empty, else routeAddressToward(masterHost, masterPort)
// (as torch picks a rank's address). Does not check the value: binding to an address that is
// not this host's fails there, naming the variable.
std::string advertiseAddress(const std::string& masterHost, int masterPort,
                             const EnvLookup& env = processEnvironment());

// The local address of the interface that routes to host:port (a UDP socket "connected" to
// it, read back with getsockname; nothing is sent). `host` itself when it cannot be resolved
// or routed.
std::string routeAddressToward(const std::string& host, int port);

}  // namespace hmc::collective
