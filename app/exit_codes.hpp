// hmc-run's exit codes that more than one command returns (README: 0 every expectation met,
// 1 an expectation failed, 2 bad input or usage, 3 an unexpected hang).
#pragma once

namespace hmc::app {

constexpr int kExitUsage = 2;

}  // namespace hmc::app
