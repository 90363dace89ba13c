#pragma once
// The hidden `_rank` command's options: what hmc-run's own launcher passes to each of its rank
// processes (world::RankLaunch::toArgs), read back into the same struct.

#include "hmc/world/rank_launch.hpp"

namespace CLI {
class App;
}

namespace hmc::app {

// Declares the `_rank` command's arguments on `command`, writing into `launch`.
void addRankOptions(CLI::App& command, world::RankLaunch& launch);

}  // namespace hmc::app
