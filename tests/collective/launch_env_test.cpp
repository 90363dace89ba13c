#include "hmc/collective/launch_env.hpp"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <utility>

#include "hmc/error.hpp"

using hmc::collective::detectLaunch;
using hmc::collective::EnvLookup;

namespace {
EnvLookup fakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}
// A TCP socket bound to `address`:`port` (SO_REUSEADDR when `reuse`); -1 and errno when the
// bind fails.
int boundSocket(in_addr_t address, int port, bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const int one = 1;
  if (reuse) REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(address);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

int portOf(int fd) {
  sockaddr_in addr{};
  socklen_t length = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  return ntohs(addr.sin_port);
}
}  // namespace

TEST_SUITE("launch") {
  // What hmc-run's own launcher relies on to keep the master port it picked until rank 0's
  // store binds it (the race a freed port loses: another job's bind to port 0 or connection).
  TEST_CASE("a reserved port: no other bind takes it, a store's listener (SO_REUSEADDR) does") {
    auto held = hmc::collective::PortReservation::loopback();
    const int port = held.port();
    REQUIRE(port > 0);
    // Without SO_REUSEADDR, on the loopback and on the wildcard address: in use.
    for (const in_addr_t address : {INADDR_LOOPBACK, INADDR_ANY}) {
      CHECK(boundSocket(address, port, false) == -1);
      CHECK(errno == EADDRINUSE);
    }
    // The kernel's choice for port 0 never falls on it (a bound port is skipped).
    int picked = 0;
    for (int i = 0; i < 2000; ++i) {
      const int fd = boundSocket(INADDR_LOOPBACK, 0, false);
      REQUIRE(fd >= 0);
      if (portOf(fd) == port) ++picked;
      ::close(fd);
    }
    CHECK(picked == 0);
    // A listener as c10d's TCPStore makes one (SO_REUSEADDR, the wildcard address) binds it,
    // listens and accepts a connection while the reservation is held.
    const int listener = boundSocket(INADDR_ANY, port, true);
    REQUIRE(listener >= 0);
    REQUIRE(::listen(listener, 4) == 0);
    const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(client >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<std::uint16_t>(port));
    CHECK(::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
    const int accepted = ::accept(listener, nullptr, nullptr);
    CHECK(accepted >= 0);
    for (const int fd : {accepted, client, listener}) {
      if (fd >= 0) ::close(fd);
    }
    // A moved reservation keeps the port; the moved-from one holds nothing.
    auto moved = std::move(held);
    CHECK(moved.port() == port);
    CHECK(boundSocket(INADDR_LOOPBACK, port, false) == -1);
  }

  TEST_CASE("no launcher variables means no launch") { CHECK_FALSE(detectLaunch(fakeEnv({}))); }

  TEST_CASE("torchrun variables give rank, world and master") {
    auto launch = detectLaunch(fakeEnv(
        {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29400"}}));
    REQUIRE(launch);
    CHECK(launch->launcher == "torchrun");
    CHECK(launch->rank == 3);
    CHECK(launch->worldSize == 4);
    CHECK(launch->masterAddr == "node1");
    CHECK(launch->masterPort == 29400);
    CHECK_FALSE(launch->agentHostsStore);
  }

  TEST_CASE("torchrun's agent store is honoured") {
    auto launch = detectLaunch(fakeEnv({{"RANK", "0"},
                                        {"WORLD_SIZE", "1"},
                                        {"MASTER_ADDR", "h"},
                                        {"MASTER_PORT", "1"},
                                        {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
    CHECK(launch->agentHostsStore);
  }

  TEST_CASE("half a pair, bad numbers and out-of-range ranks are clear errors") {
    CHECK_THROWS_WITH_AS(detectLaunch(fakeEnv({{"RANK", "1"}})),
                         "RANK is set but WORLD_SIZE is not: a torchrun launch sets both; set the "
                         "missing one or unset the other",
                         hmc::ValueError);
    CHECK_THROWS_WITH_AS(detectLaunch(fakeEnv({{"SLURM_NTASKS", "2"}})),
                         "SLURM_NTASKS is set but SLURM_PROCID is not: a srun launch sets both; "
                         "set the missing one or unset the other",
                         hmc::ValueError);
    CHECK_THROWS_WITH_AS(
        detectLaunch(fakeEnv({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
        "RANK='x' is not an integer in 0..1048576", hmc::ValueError);
    CHECK_THROWS_WITH_AS(detectLaunch(fakeEnv({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
                         "RANK=2 is outside the world of WORLD_SIZE=2 ranks", hmc::ValueError);
    CHECK_THROWS_WITH_AS(detectLaunch(fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
                         "RANK and WORLD_SIZE are set (a torchrun launch) but MASTER_ADDR is not: "
                         "set it, or pass --master-addr HOST",
                         hmc::ValueError);
    CHECK_THROWS_AS(
        detectLaunch(fakeEnv(
            {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}})),
        hmc::ValueError);
  }

  TEST_CASE("srun takes the master from the first host of the node list") {
    auto launch = detectLaunch(fakeEnv({{"SLURM_PROCID", "1"},
                                        {"SLURM_NTASKS", "8"},
                                        {"SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1"}}));
    REQUIRE(launch);
    CHECK(launch->launcher == "srun");
    CHECK(launch->masterAddr == "gpu07");
    CHECK(launch->masterPort == 29500);
    CHECK(hmc::collective::firstSlurmHost("a1,b2") == "a1");
    CHECK(hmc::collective::firstSlurmHost("n[3]") == "n3");
  }

  TEST_CASE("mpirun needs a master and --master-addr/--master-port override the environment") {
    CHECK_THROWS_AS(
        detectLaunch(fakeEnv({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})),
        hmc::ValueError);
    CHECK_THROWS_WITH_AS(
        detectLaunch(fakeEnv({{"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})),
        "OMPI_COMM_WORLD_RANK is set (an mpirun launch) and the ranks span several nodes "
        "(OMPI_COMM_WORLD_LOCAL_SIZE=2, OMPI_COMM_WORLD_SIZE=4) but no master host is known: "
        "pass --master-addr HOST (the host of rank 0) or set MASTER_ADDR (mpirun -x "
        "MASTER_ADDR=HOST)",
        hmc::ValueError);
    hmc::collective::LaunchOverrides overrides{std::string("10.0.0.1"), 1234};
    auto launch = detectLaunch(
        fakeEnv({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), overrides);
    CHECK(launch->launcher == "mpirun");
    CHECK(launch->masterAddr == "10.0.0.1");
    CHECK(launch->masterPort == 1234);
  }

  TEST_CASE("mpirun on one node needs no flags: master 127.0.0.1, a port derived from the job") {
    const std::map<std::string, std::string> rank0{{"OMPI_COMM_WORLD_RANK", "0"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                                   {"OMPI_MCA_ess_base_jobid", "1113456641"}};
    auto rank3 = rank0;
    rank3["OMPI_COMM_WORLD_RANK"] = "3";
    const auto first = detectLaunch(fakeEnv(rank0));
    const auto last = detectLaunch(fakeEnv(rank3));
    REQUIRE(first);
    REQUIRE(last);
    CHECK(first->masterAddr == "127.0.0.1");
    CHECK(first->masterAddrOrigin == "one node: every rank is local");
    CHECK(first->masterPort == last->masterPort);  // every rank agrees without flags
    CHECK(first->masterPort == hmc::collective::derivedMasterPort("1113456641"));
    CHECK(first->masterPortOrigin == "derived from OMPI_MCA_ess_base_jobid");

    auto otherJob = rank0;
    otherJob["OMPI_MCA_ess_base_jobid"] = "1113522177";
    CHECK(detectLaunch(fakeEnv(otherJob))->masterPort != first->masterPort);

    auto noJob = rank0;
    noJob.erase("OMPI_MCA_ess_base_jobid");
    CHECK(detectLaunch(fakeEnv(noJob))->masterPort == 29500);
    noJob["MASTER_PORT"] = "31000";
    noJob["MASTER_ADDR"] = "10.1.2.3";
    const auto given = detectLaunch(fakeEnv(noJob));
    CHECK(given->masterPort == 31000);
    CHECK(given->masterAddr == "10.1.2.3");  // an explicit master wins over the one-node default
    CHECK(given->masterAddrOrigin == "MASTER_ADDR");
  }

  TEST_CASE("derived master ports are even, below the ephemeral range, and spread out") {
    std::map<int, int> seen;
    for (int job = 0; job < 200; ++job) {
      const int port = hmc::collective::derivedMasterPort(std::to_string(1113456641 + 65536 * job));
      CHECK(port >= 20000);
      CHECK(port <= 29998);
      CHECK(port % 2 == 0);
      ++seen[port];
    }
    CHECK(seen.size() >= 190);  // 200 jobs in 5,000 slots: a few collisions at most
    CHECK(hmc::collective::derivedMasterPort("7", "0") !=
          hmc::collective::derivedMasterPort("7", "1"));
    CHECK(hmc::collective::derivedMasterPort("") == 29500);
  }

  TEST_CASE("srun on one node needs no flags; on several it takes the first host") {
    auto one = detectLaunch(fakeEnv({{"SLURM_PROCID", "1"},
                                     {"SLURM_NTASKS", "4"},
                                     {"SLURM_NNODES", "1"},
                                     {"SLURM_JOB_NODELIST", "gpu07"},
                                     {"SLURM_JOB_ID", "4242"},
                                     {"SLURM_STEP_ID", "0"}}));
    CHECK(one->masterAddr == "127.0.0.1");
    CHECK(one->masterPort == hmc::collective::derivedMasterPort("4242", "0"));
    CHECK(one->masterPortOrigin == "derived from SLURM_JOB_ID and SLURM_STEP_ID");
    // A node list of one host is enough without SLURM_NNODES.
    CHECK(detectLaunch(fakeEnv({{"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "2"},
                                {"SLURM_JOB_NODELIST", "gpu[07]"}}))
              ->masterAddr == "127.0.0.1");
    // The step's nodes come before the job's.
    auto step = detectLaunch(fakeEnv({{"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_NNODES", "4"},
                                      {"SLURM_JOB_NODELIST", "gpu[01-04]"},
                                      {"SLURM_STEP_NUM_NODES", "2"},
                                      {"SLURM_STEP_NODELIST", "gpu[03-04]"}}));
    CHECK(step->masterAddr == "gpu03");
    CHECK(step->masterAddrOrigin == "first host of SLURM_STEP_NODELIST");
  }

  TEST_CASE("Slurm node lists are counted host by host") {
    using hmc::collective::slurmHostCount;
    CHECK(slurmHostCount("gpu07") == 1);
    CHECK(slurmHostCount("gpu[07]") == 1);
    CHECK(slurmHostCount("node[01-04,07],gpu5") == 6);
    CHECK(slurmHostCount("a,b,c") == 3);
    CHECK(slurmHostCount("a[1-2],b[5-6]") == 4);
    CHECK(slurmHostCount("") == 0);
  }

  TEST_CASE("HMC_ADVERTISE_ADDR overrides the address that routes to the master") {
    using hmc::collective::advertiseAddress;
    CHECK(advertiseAddress("127.0.0.2", 29500, fakeEnv({{"HMC_ADVERTISE_ADDR", "127.0.0.3"}})) ==
          "127.0.0.3");
    // Without it, the local end of the route to the master: on loopback, 127.0.0.1.
    CHECK(advertiseAddress("127.0.0.2", 29500, fakeEnv({})) == "127.0.0.1");
    CHECK(advertiseAddress("127.0.0.2", 29500, fakeEnv({{"HMC_ADVERTISE_ADDR", ""}})) ==
          "127.0.0.1");
    CHECK(hmc::collective::routeAddressToward("localhost", 1) == "127.0.0.1");
    // Unresolvable: the name itself, for the caller's error to name.
    CHECK(hmc::collective::routeAddressToward("no-such-host.invalid", 1) == "no-such-host.invalid");
  }

  TEST_CASE("torchrun wins over Slurm variables of the same process") {
    auto launch = detectLaunch(fakeEnv({{"RANK", "5"},
                                        {"WORLD_SIZE", "8"},
                                        {"MASTER_ADDR", "h"},
                                        {"MASTER_PORT", "1"},
                                        {"SLURM_PROCID", "1"},
                                        {"SLURM_NTASKS", "2"}}));
    CHECK(launch->launcher == "torchrun");
    CHECK(launch->rank == 5);
  }
}
