#include "hmc/log.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>

#include "hmc/error.hpp"

namespace hmc {
namespace {

constexpr const char* kPattern = "[%Y-%m-%d %H:%M:%S.%e] [hmc] [%^%l%$] %v";

constexpr std::array<std::pair<std::string_view, spdlog::level::level_enum>, 7> kLevels = {{
    {"trace", spdlog::level::trace},
    {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},
    {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},
    {"critical", spdlog::level::critical},
    {"off", spdlog::level::off},
}};

// Creating the `hmc` logger is a look-up and a registration: one thread at a time, so that
// two threads never both create it (spdlog throws for the second).
std::mutex& setUpMutex() {
  static std::mutex mutex;
  return mutex;
}

std::shared_ptr<spdlog::logger> hmcLogger(spdlog::level::level_enum level) {
  std::shared_ptr<spdlog::logger> named = spdlog::get("hmc");
  if (!named) named = spdlog::stderr_color_mt("hmc");
  named->set_pattern(kPattern);
  named->set_level(level);
  return named;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  std::shared_ptr<spdlog::logger> named = spdlog::get("hmc");
  return named ? named : spdlog::default_logger();
}

spdlog::level::level_enum parseLogLevel(std::string_view text, std::string_view where) {
  for (const auto& [name, level] : kLevels) {
    if (text == name) return level;
  }
  throw ValueError(fmt::format(
      "{}: '{}' is not a log level; use trace, debug, info, warn, error, critical or off", where,
      text));
}

void setUpLogging(std::string_view level) {
  const spdlog::level::level_enum parsed = parseLogLevel(level, "the log level");
  std::lock_guard<std::mutex> lock(setUpMutex());
  spdlog::set_default_logger(hmcLogger(parsed));
}

void setUpDefaultLogging() {
  std::lock_guard<std::mutex> lock(setUpMutex());
  if (spdlog::get("hmc")) return;
  const char* set = std::getenv(kLogLevelVariable);
  const bool given = set != nullptr && *set != '\0';
  hmcLogger(parseLogLevel(given ? set : kDefaultLogLevel, kLogLevelVariable));
}

}  // namespace hmc
