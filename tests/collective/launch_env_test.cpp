#include "hmc/collective/launch_env.hpp"

#include <doctest/doctest.h>

#include <map>

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
}  // namespace

TEST_SUITE("launch") {
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
    hmc::collective::LaunchOverrides overrides{std::string("10.0.0.1"), 1234};
    auto launch = detectLaunch(
        fakeEnv({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), overrides);
    CHECK(launch->launcher == "mpirun");
    CHECK(launch->masterAddr == "10.0.0.1");
    CHECK(launch->masterPort == 1234);
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
