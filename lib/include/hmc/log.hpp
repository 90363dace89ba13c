#pragma once
// The library logs to the `hmc` spdlog logger, which the application configures (sinks,
// level, pattern); while none is registered, spdlog's default logger.
//
// hmc-run configures it with setUpLogging (--log-level, HMC_LOG_LEVEL, default `warn`); a
// program that joins a world (hmc::joinWorld) gets the same through setUpDefaultLogging,
// unless it registered an `hmc` logger of its own.

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/logger.h>

namespace hmc {

std::shared_ptr<spdlog::logger> logger();

// The environment variable that sets the library's log level, and the level without it.
inline constexpr const char* kLogLevelVariable = "HMC_LOG_LEVEL";
inline constexpr const char* kDefaultLogLevel = "warn";

// `text` as a log level: trace, debug, info, warn, error, critical or off. Throws ValueError
// naming `where` (e.g. "HMC_LOG_LEVEL") and the levels otherwise.
spdlog::level::level_enum parseLogLevel(std::string_view text, std::string_view where);

// hmc-run's logging: the `hmc` logger (on stderr, created when none is registered) at `level`
// with the pattern "[date time] [hmc] [level] message", made spdlog's default logger too.
// Throws ValueError for a level that is not one. Thread-safe.
void setUpLogging(std::string_view level);

// What a program that joins a world gets (hmc::joinWorld calls it first): when no `hmc`
// logger is registered, one on stderr with hmc-run's pattern at HMC_LOG_LEVEL, else at `warn`
// as hmc-run's default is, so that a run's stderr holds warnings, errors and the reports, not
// every rank's transport set-up lines (HMC_LOG_LEVEL=info shows them). An `hmc` logger the
// program registered is left as it is, and spdlog's default logger stays the program's.
// Throws ValueError when HMC_LOG_LEVEL is set but not a level. Thread-safe; later calls find
// the logger registered and return.
void setUpDefaultLogging();

}  // namespace hmc
