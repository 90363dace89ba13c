#include "hmc/world/rank_placement.hpp"

namespace hmc::world {

std::string RankPlacement::storeHostName() const {
  return storeHost == StoreHost::kLauncherAgent
             ? std::string("the store's host (the launcher's agent)")
             : std::string("the store's host (rank 0)");
}

RankPlacement RankPlacement::fromLaunch(const collective::LaunchEnv& launch) {
  RankPlacement placement;
  placement.rank = launch.rank;
  placement.worldSize = launch.worldSize;
  placement.masterAddr = launch.masterAddr;
  placement.masterPort = launch.masterPort;
  placement.storeHost = launch.agentHostsStore ? StoreHost::kLauncherAgent : StoreHost::kRankZero;
  placement.launcher = launch.launcher;
  return placement;
}

}  // namespace hmc::world
