#include "hmc/log.hpp"

#include <spdlog/spdlog.h>

namespace hmc {

std::shared_ptr<spdlog::logger> logger() {
  std::shared_ptr<spdlog::logger> named = spdlog::get("hmc");
  return named ? named : spdlog::default_logger();
}

}  // namespace hmc
