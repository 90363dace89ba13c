#include "hmc/collective/launch_env.hpp"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "hmc/error.hpp"

namespace hmc::collective {
namespace {

int parseInt(const std::string& name, const std::string& value, int low, int high) {
  std::size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || parsed < low || parsed > high) {
    throw ValueError(fmt::format("{}='{}' is not an integer in {}..{}", name, value, low, high));
  }
  return static_cast<int>(parsed);
}

struct Pair {
  const char* rankVar;
  const char* sizeVar;
  const char* launcher;
};

std::optional<std::pair<int, int>> readPair(const EnvLookup& env, const Pair& pair) {
  const auto rank = env(pair.rankVar);
  const auto size = env(pair.sizeVar);
  if (!rank && !size) return std::nullopt;
  if (!rank || !size) {
    throw ValueError(fmt::format(
        "{} is set but {} is not: a {} launch sets both; set the missing one or unset the other",
        rank ? pair.rankVar : pair.sizeVar, rank ? pair.sizeVar : pair.rankVar, pair.launcher));
  }
  const int world = parseInt(pair.sizeVar, *size, 1, 1 << 20);
  const int r = parseInt(pair.rankVar, *rank, 0, 1 << 20);
  if (r >= world) {
    throw ValueError(fmt::format("{}={} is outside the world of {}={} ranks", pair.rankVar, r,
                                 pair.sizeVar, world));
  }
  return std::make_pair(r, world);
}

int masterPort(const EnvLookup& env, const LaunchOverrides& overrides) {
  if (overrides.masterPort) return *overrides.masterPort;
  if (const auto port = env("MASTER_PORT")) return parseInt("MASTER_PORT", *port, 1, 65535);
  return kDefaultMasterPort;
}

}  // namespace

EnvLookup processEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw RuntimeError(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw RuntimeError("cannot find a free loopback port: " + reason);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string firstSlurmHost(const std::string& nodeList) {
  // Up to the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodeList) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const auto close = first.find(']', open);
  std::string range =
      first.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
  range = range.substr(0, range.find(','));
  range = range.substr(0, range.find('-'));
  return first.substr(0, open) + range;
}

std::optional<LaunchEnv> detectLaunch(const EnvLookup& env, const LaunchOverrides& overrides) {
  if (const auto torchrun = readPair(env, {"RANK", "WORLD_SIZE", "torchrun"})) {
    LaunchEnv launch;
    launch.launcher = "torchrun";
    std::tie(launch.rank, launch.worldSize) = *torchrun;
    const auto addr = overrides.masterAddr ? overrides.masterAddr : env("MASTER_ADDR");
    if (!addr || addr->empty()) {
      throw ValueError(
          "RANK and WORLD_SIZE are set (a torchrun launch) but MASTER_ADDR is not: set it, or "
          "pass --master-addr HOST");
    }
    if (!overrides.masterPort && !env("MASTER_PORT")) {
      throw ValueError(
          "RANK and WORLD_SIZE are set (a torchrun launch) but MASTER_PORT is not: set it, or "
          "pass --master-port PORT");
    }
    launch.masterAddr = *addr;
    launch.masterPort = masterPort(env, overrides);
    const auto agent = env("TORCHELASTIC_USE_AGENT_STORE");
    launch.agentHostsStore = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    return launch;
  }
  if (const auto mpi = readPair(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"})) {
    LaunchEnv launch;
    launch.launcher = "mpirun";
    std::tie(launch.rank, launch.worldSize) = *mpi;
    const auto addr = overrides.masterAddr ? overrides.masterAddr : env("MASTER_ADDR");
    if (!addr || addr->empty()) {
      throw ValueError(
          "OMPI_COMM_WORLD_RANK is set (an mpirun launch) but no master host is known: pass "
          "--master-addr HOST (the host of rank 0) or set MASTER_ADDR");
    }
    launch.masterAddr = *addr;
    launch.masterPort = masterPort(env, overrides);
    return launch;
  }
  if (const auto slurm = readPair(env, {"SLURM_PROCID", "SLURM_NTASKS", "srun"})) {
    LaunchEnv launch;
    launch.launcher = "srun";
    std::tie(launch.rank, launch.worldSize) = *slurm;
    std::optional<std::string> addr = overrides.masterAddr;
    if (!addr) addr = env("MASTER_ADDR");
    if (!addr) {
      if (const auto nodes = env("SLURM_JOB_NODELIST")) addr = firstSlurmHost(*nodes);
    }
    if (!addr || addr->empty()) {
      throw ValueError(
          "SLURM_PROCID is set (an srun launch) but no master host is known: pass "
          "--master-addr HOST or run inside a job with SLURM_JOB_NODELIST");
    }
    launch.masterAddr = *addr;
    launch.masterPort = masterPort(env, overrides);
    return launch;
  }
  return std::nullopt;
}

}  // namespace hmc::collective
