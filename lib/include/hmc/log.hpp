#pragma once
// The library logs to the `hmc` spdlog logger, which the application configures (sinks,
// level, pattern); while none is registered, spdlog's default logger.

#include <memory>

#include <spdlog/logger.h>

namespace hmc {

std::shared_ptr<spdlog::logger> logger();

}  // namespace hmc
