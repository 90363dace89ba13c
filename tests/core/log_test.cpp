// hmc/log.hpp: the `hmc` logger that hmc-run sets up, and the one a program that joins a world
// gets by default (`warn`, or HMC_LOG_LEVEL).

#include "hmc/log.hpp"

#include <doctest/doctest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <memory>

#include "hmc/error.hpp"

namespace {

// Each case starts with no `hmc` logger and HMC_LOG_LEVEL unset, and leaves it so.
struct Fresh {
  Fresh() { reset(); }
  ~Fresh() { reset(); }
  static void reset() {
    spdlog::drop("hmc");
    ::unsetenv(hmc::kLogLevelVariable);
  }
};

}  // namespace

TEST_SUITE("log") {
  TEST_CASE("a program that joins a world logs at warn by default") {
    Fresh fresh;
    hmc::setUpDefaultLogging();
    auto registered = spdlog::get("hmc");
    REQUIRE(static_cast<bool>(registered));
    CHECK(registered->level() == spdlog::level::warn);
    CHECK((hmc::logger() == registered));
    CHECK((spdlog::default_logger() != registered));  // the program's default logger stays
  }

  TEST_CASE("HMC_LOG_LEVEL sets the level of a program that joins a world") {
    Fresh fresh;
    ::setenv(hmc::kLogLevelVariable, "info", 1);
    hmc::setUpDefaultLogging();
    REQUIRE(static_cast<bool>(spdlog::get("hmc")));
    CHECK(spdlog::get("hmc")->level() == spdlog::level::info);
  }

  TEST_CASE("an hmc logger the program registered is left as it is") {
    Fresh fresh;
    auto own =
        std::make_shared<spdlog::logger>("hmc", std::make_shared<spdlog::sinks::null_sink_mt>());
    own->set_level(spdlog::level::trace);
    spdlog::register_logger(own);
    ::setenv(hmc::kLogLevelVariable, "error", 1);
    hmc::setUpDefaultLogging();
    CHECK((spdlog::get("hmc") == own));
    CHECK(own->level() == spdlog::level::trace);
  }

  TEST_CASE("a log level that is not one is a value error naming where it came from") {
    Fresh fresh;
    ::setenv(hmc::kLogLevelVariable, "loud", 1);
    CHECK_THROWS_WITH_AS(hmc::setUpDefaultLogging(),
                         "HMC_LOG_LEVEL: 'loud' is not a log level; use trace, debug, info, "
                         "warn, error, critical or off",
                         hmc::ValueError);
    CHECK_FALSE(static_cast<bool>(spdlog::get("hmc")));
    CHECK_THROWS_AS(hmc::setUpLogging("verbose"), hmc::ValueError);
  }

  TEST_CASE("hmc-run's set-up makes the hmc logger the default at the level it is given") {
    Fresh fresh;
    const auto before = spdlog::default_logger();
    hmc::setUpLogging("debug");
    auto registered = spdlog::get("hmc");
    REQUIRE(static_cast<bool>(registered));
    CHECK(registered->level() == spdlog::level::debug);
    CHECK((spdlog::default_logger() == registered));
    hmc::setUpLogging("off");  // again: the same logger, another level
    CHECK((spdlog::get("hmc") == registered));
    CHECK(registered->level() == spdlog::level::off);
    spdlog::set_default_logger(before);
  }
}
