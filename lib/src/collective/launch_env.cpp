#include "hmc/collective/launch_env.hpp"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "hmc/error.hpp"
#include "hmc/text.hpp"

namespace hmc::collective {
namespace {

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
  const int world = parseIntVariable(pair.sizeVar, *size, 1, 1 << 20);
  const int r = parseIntVariable(pair.rankVar, *rank, 0, 1 << 20);
  if (r >= world) {
    throw ValueError(fmt::format("{}={} is outside the world of {}={} ranks", pair.rankVar, r,
                                 pair.sizeVar, world));
  }
  return std::make_pair(r, world);
}

// The port: --master-port, MASTER_PORT, the launcher's derived default, else 29500.
void choosePort(LaunchEnv& launch, const EnvLookup& env, const LaunchOverrides& overrides,
                const char* jobVar, const char* stepVar) {
  if (overrides.masterPort) {
    launch.masterPort = *overrides.masterPort;
    launch.masterPortOrigin = "--master-port";
  } else if (const auto port = env("MASTER_PORT")) {
    launch.masterPort = parseIntVariable("MASTER_PORT", *port, 1, 65535);
    launch.masterPortOrigin = "MASTER_PORT";
  } else if (const auto job = jobVar ? env(jobVar) : std::nullopt; job && !job->empty()) {
    const auto step = stepVar ? env(stepVar) : std::nullopt;
    launch.masterPort = derivedMasterPort(*job, step.value_or(""));
    launch.masterPortOrigin =
        fmt::format("derived from {}{}{}", jobVar, step ? " and " : "", step ? stepVar : "");
  } else {
    launch.masterPort = kDefaultMasterPort;
    launch.masterPortOrigin = "the default";
  }
}

// --master-addr, else MASTER_ADDR; false when neither is set (or both are empty).
bool explicitAddr(LaunchEnv& launch, const EnvLookup& env, const LaunchOverrides& overrides) {
  if (overrides.masterAddr && !overrides.masterAddr->empty()) {
    launch.masterAddr = *overrides.masterAddr;
    launch.masterAddrOrigin = "--master-addr";
    return true;
  }
  if (const auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    launch.masterAddr = *addr;
    launch.masterAddrOrigin = "MASTER_ADDR";
    return true;
  }
  return false;
}

constexpr const char* kOneNode = "one node: every rank is local";
constexpr const char* kLoopback = "127.0.0.1";

}  // namespace

int parseIntVariable(const std::string& name, const std::string& value, int low, int high) {
  std::size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || parsed < low || parsed > high) {
    throw ValueError(
        fmt::format("{}='{}' is not an integer in {}..{}", name, printable(value), low, high));
  }
  return static_cast<int>(parsed);
}

EnvLookup processEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

PortReservation PortReservation::loopback() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw RuntimeError(fmt::format(
        "cannot reserve a TCP port on 127.0.0.1 for a store: socket: {} (descriptors left "
        "under ulimit -n?)",
        std::strerror(errno)));
  }
  const int one = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw RuntimeError(fmt::format(
        "cannot reserve a TCP port on 127.0.0.1 for a store: {} (is the loopback interface "
        "up? `ip link show lo`)",
        reason));
  }
  return PortReservation(fd, ntohs(addr.sin_port));
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

PortReservation::~PortReservation() {
  if (fd_ >= 0) ::close(fd_);
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
    if (!explicitAddr(launch, env, overrides)) {
      throw ValueError(
          "RANK and WORLD_SIZE are set (a torchrun launch) but MASTER_ADDR is not: set it, or "
          "pass --master-addr HOST");
    }
    if (!overrides.masterPort && !env("MASTER_PORT")) {
      throw ValueError(
          "RANK and WORLD_SIZE are set (a torchrun launch) but MASTER_PORT is not: set it, or "
          "pass --master-port PORT");
    }
    choosePort(launch, env, overrides, nullptr, nullptr);
    const auto agent = env("TORCHELASTIC_USE_AGENT_STORE");
    launch.agentHostsStore = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    return launch;
  }
  if (const auto mpi = readPair(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"})) {
    LaunchEnv launch;
    launch.launcher = "mpirun";
    std::tie(launch.rank, launch.worldSize) = *mpi;
    if (!explicitAddr(launch, env, overrides)) {
      const auto local = env("OMPI_COMM_WORLD_LOCAL_SIZE");
      const int localSize =
          local ? parseIntVariable("OMPI_COMM_WORLD_LOCAL_SIZE", *local, 1, 1 << 20) : 0;
      if (localSize != launch.worldSize) {
        throw ValueError(fmt::format(
            "OMPI_COMM_WORLD_RANK is set (an mpirun launch) and the ranks span several nodes "
            "(OMPI_COMM_WORLD_LOCAL_SIZE={}, OMPI_COMM_WORLD_SIZE={}) but no master host is "
            "known: pass --master-addr HOST (the host of rank 0) or set MASTER_ADDR "
            "(mpirun -x MASTER_ADDR=HOST)",
            local.value_or("unset"), launch.worldSize));
      }
      launch.masterAddr = kLoopback;
      launch.masterAddrOrigin = kOneNode;
    }
    choosePort(launch, env, overrides, "OMPI_MCA_ess_base_jobid", nullptr);
    return launch;
  }
  if (const auto slurm = readPair(env, {"SLURM_PROCID", "SLURM_NTASKS", "srun"})) {
    LaunchEnv launch;
    launch.launcher = "srun";
    std::tie(launch.rank, launch.worldSize) = *slurm;
    if (!explicitAddr(launch, env, overrides)) {
      // A step may run on fewer nodes than its job: the step's own variables come first.
      const char* listVar = "SLURM_STEP_NODELIST";
      auto nodes = env(listVar);
      if (!nodes || nodes->empty()) nodes = env(listVar = "SLURM_JOB_NODELIST");
      const char* countVar = "SLURM_STEP_NUM_NODES";
      auto count = env(countVar);
      if (!count) count = env(countVar = "SLURM_NNODES");
      const bool oneNode = (count && parseIntVariable(countVar, *count, 1, 1 << 20) == 1) ||
                           (nodes && !nodes->empty() && slurmHostCount(*nodes) == 1);
      if (oneNode) {
        launch.masterAddr = kLoopback;
        launch.masterAddrOrigin = kOneNode;
      } else if (nodes && !nodes->empty()) {
        launch.masterAddr = firstSlurmHost(*nodes);
        launch.masterAddrOrigin = fmt::format("first host of {}", listVar);
      } else {
        throw ValueError(
            "SLURM_PROCID is set (an srun launch) but no master host is known: pass "
            "--master-addr HOST or run inside a job with SLURM_JOB_NODELIST");
      }
    }
    choosePort(launch, env, overrides, "SLURM_JOB_ID", "SLURM_STEP_ID");
    return launch;
  }
  return std::nullopt;
}

int slurmHostCount(const std::string& nodeList) {
  int hosts = 0;
  std::size_t i = 0;
  while (i < nodeList.size()) {
    // One item: a prefix and at most one bracketed range list, up to a comma outside brackets.
    const std::size_t open = nodeList.find_first_of("[,", i);
    if (open == std::string::npos || nodeList[open] == ',') {
      if (open != i) ++hosts;  // a plain host name (an empty item counts nothing)
      i = open == std::string::npos ? nodeList.size() : open + 1;
      continue;
    }
    const std::size_t close = nodeList.find(']', open);
    const std::string ranges = nodeList.substr(
        open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
    std::size_t r = 0;
    while (r <= ranges.size()) {
      std::size_t comma = ranges.find(',', r);
      if (comma == std::string::npos) comma = ranges.size();
      const std::string range = ranges.substr(r, comma - r);
      const auto dash = range.find('-');
      long first = 0;
      long last = 0;
      try {
        first = std::stol(range.substr(0, dash));
        last = dash == std::string::npos ? first : std::stol(range.substr(dash + 1));
      } catch (const std::exception&) {
        first = last = 0;  // not a number: count the item once
      }
      hosts += static_cast<int>(std::max(1L, last - first + 1));
      r = comma + 1;
    }
    i = close == std::string::npos ? nodeList.size() : close + 1;
    if (i < nodeList.size() && nodeList[i] == ',') ++i;
  }
  return hosts;
}

int derivedMasterPort(const std::string& jobId, const std::string& stepId) {
  if (jobId.empty()) return kDefaultMasterPort;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a, stable across builds and hosts
  for (char c : jobId + "." + stepId) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return 20000 + 2 * static_cast<int>(hash % 5000);
}

std::string routeAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port <= 0 ? 1 : port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    return host;
  }
  std::string out = host;
  const int fd = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    char numeric[NI_MAXHOST] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), length, numeric, sizeof numeric, nullptr,
                      0, NI_NUMERICHOST) == 0) {
      out = numeric;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

std::string advertiseAddress(const std::string& masterHost, int masterPort, const EnvLookup& env) {
  if (const auto addr = env(kAdvertiseAddrVariable); addr && !addr->empty()) return *addr;
  return routeAddressToward(masterHost, masterPort);
}

}  // namespace hmc::collective
