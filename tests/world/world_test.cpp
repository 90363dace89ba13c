// hmc::joinWorld (hmc/world/world.hpp) in one process: the options read from HMC_* variables,
// the placement errors, a world of one rank from join to its end, and ResourceManager's
// ProcessScope that makes the world's manager current for every thread. Worlds of several
// ranks under real launchers: tests/e2e/test_embedding.py.

#include "hmc/world/world.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/error.hpp"
#include "support/scoped_variable.hpp"

using namespace std::chrono_literals;
using hmc::JoinOptions;
using hmc::lifecycle::ResourceManager;

namespace {

using Variable = hmc::testing::ScopedVariable;

std::shared_ptr<ResourceManager> currentOnAnotherThread() {
  std::shared_ptr<ResourceManager> seen;
  std::thread([&] { seen = ResourceManager::current(); }).join();
  return seen;
}

std::string errorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const hmc::ValueError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("world") {
  TEST_CASE("ProcessScope makes a manager current for threads without a Scope of their own") {
    const auto fallback = ResourceManager::processDefault();
    auto manager =
        std::make_shared<ResourceManager>(std::make_shared<hmc::collective::LocalCollective>());
    CHECK(currentOnAnotherThread() == fallback);
    {
      ResourceManager::ProcessScope process(manager);
      CHECK(currentOnAnotherThread() == manager);
      CHECK(ResourceManager::current() == manager);
      auto own =
          std::make_shared<ResourceManager>(std::make_shared<hmc::collective::LocalCollective>());
      ResourceManager::Scope scope(own);  // a thread's Scope wins over the process's
      CHECK(ResourceManager::current() == own);
      CHECK(currentOnAnotherThread() == manager);
    }
    CHECK(currentOnAnotherThread() == fallback);
  }

  TEST_CASE("HMC_* variables replace what the program set, and bad values name the variable") {
    JoinOptions options;
    options.timeout = 7s;
    options.name = "program";
    {
      Variable timeout("HMC_TIMEOUT", "2.5");
      Variable name("HMC_NAME", "diagnosed");
      Variable transport("HMC_TRANSPORT", "store");
      Variable capacity("HMC_FLIGHT_CAPACITY", "128");
      Variable rank("HMC_RANK", "3");
      Variable size("HMC_WORLD_SIZE", "4");
      Variable port("HMC_MASTER_PORT", "29555");
      const JoinOptions read = JoinOptions::withEnvironment(options);
      CHECK((read.timeout == 2500ms));
      CHECK(read.name == "diagnosed");
      CHECK((read.transport == hmc::collective::Transport::kStore));
      CHECK(read.flightCapacity == 128);
      CHECK(read.rank.value_or(-1) == 3);
      CHECK(read.worldSize.value_or(-1) == 4);
      CHECK(read.masterPort.value_or(-1) == 29555);
      CHECK((read.joinTimeout == options.joinTimeout));  // not set: the program's
    }
    const JoinOptions unchanged = JoinOptions::withEnvironment(options);
    CHECK((unchanged.timeout == 7s));
    CHECK(unchanged.name == "program");
    for (const auto& [name, value, words] :
         {std::tuple{"HMC_TIMEOUT", "soon", "HMC_TIMEOUT='soon'"},
          std::tuple{"HMC_TIMEOUT", "0", "seconds > 0"},
          std::tuple{"HMC_RANK", "1x", "HMC_RANK='1x'"},
          std::tuple{"HMC_MASTER_PORT", "70000", "not an integer in 0..65535"},
          std::tuple{"HMC_TRANSPORT", "threads", "between processes"}}) {
      CAPTURE(name);
      CAPTURE(value);
      Variable bad(name, value);
      CHECK(errorOf([&] { JoinOptions::withEnvironment(options); }).find(words) !=
            std::string::npos);
    }
  }

  TEST_CASE("without a launcher or a rank, the join says what to set") {
    const std::string why = errorOf([] { hmc::joinWorld(); });
    CHECK(why.find("no launcher started this process") != std::string::npos);
    CHECK(why.find("HMC_RANK") != std::string::npos);
    JoinOptions half;
    half.rank = 0;
    CHECK(errorOf([&] { hmc::joinWorld(half); }).find("come together") != std::string::npos);
    JoinOptions outside;
    outside.rank = 2;
    outside.worldSize = 2;
    CHECK(errorOf([&] { hmc::joinWorld(outside); }).find("not a rank of a world of 2") !=
          std::string::npos);
    JoinOptions noPort;
    noPort.rank = 1;
    noPort.worldSize = 2;
    noPort.masterPort = 0;
    CHECK(errorOf([&] { hmc::joinWorld(noPort); }).find("needs the store's port") !=
          std::string::npos);
  }

  TEST_CASE("a world of one rank: its manager is current everywhere until its clean end") {
    JoinOptions options;
    options.rank = 0;
    options.worldSize = 1;
    options.masterPort = 0;  // a free port
    options.timeout = 5s;
    options.name = "one";
    hmc::World world = hmc::joinWorld(options);
    CHECK(world.rank() == 0);
    CHECK(world.worldSize() == 1);
    CHECK(world.launcher() == "explicit");
    CHECK(world.storeAddress().find(':') != std::string::npos);
    CHECK(currentOnAnotherThread() == world.manager());
    {
      auto scope = world.scope();
      CHECK(ResourceManager::current() == world.manager());
    }
    hmc::World moved = std::move(world);  // movable: the end belongs to the new owner
    const hmc::WorldEnd end = moved.close();
    CHECK(end.clean);
    CHECK_FALSE(end.hung);
    CHECK(end.exitCode == 0);
    CHECK(end.summary == "OK: every rank of 1 ended cleanly");
    CHECK(currentOnAnotherThread() == ResourceManager::processDefault());
    const hmc::WorldEnd again = moved.close();  // once: the first's result
    CHECK(again.summary == end.summary);
  }

  // The evidence folder (hmc/world/evidence_folder.hpp) is made in TMPDIR by rank 0 at the
  // join, holds its pid while the world runs, and is removed by its report; a world that fails
  // to start removes it too.
  TEST_CASE("the world's evidence folder lives from the join to the report") {
    char pattern[] = "/tmp/hmc-world-test-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    const std::filesystem::path tmp = pattern;
    Variable tmpdir("TMPDIR", pattern);
    const auto folders = [&] {
      std::vector<std::filesystem::path> found;
      for (const auto& entry : std::filesystem::directory_iterator(tmp)) {
        if (entry.path().filename().string().rfind("hmc-evidence-", 0) == 0)
          found.push_back(entry.path());
      }
      return found;
    };
    JoinOptions options;
    options.rank = 0;
    options.worldSize = 1;
    options.masterPort = 0;
    options.timeout = 5s;
    {
      hmc::World world = hmc::joinWorld(options);
      const auto running = folders();
      REQUIRE(running.size() == 1);
      std::ifstream pid(running[0] / "rank0.pid");
      long written = 0;
      pid >> written;
      CHECK(written == ::getpid());
      CHECK(world.close().clean);
      CHECK(folders().empty());
    }
    options.recordDirectory = (tmp / "missing" / "record").string();
    CHECK_THROWS_AS(hmc::joinWorld(options), hmc::RuntimeError);
    CHECK(folders().empty());
    std::filesystem::remove_all(tmp);
  }

  // torchrun's teardown sends SIGTERM to every rank at about once: a rank's close could fail on
  // the peer that went first and report before its signal's thread looked (a HUNG report, then
  // a process that lived on until the launcher's SIGKILL). The signal's end wins, and it still
  // ends the process.
  TEST_CASE("a termination signal just before close(): the report says stopped, and it ends") {
    char folder[] = "/tmp/hmc-world-test-XXXXXX";
    REQUIRE(::mkdtemp(folder) != nullptr);
    const std::string report = std::string(folder) + "/report.json";
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::signal(SIGTERM, SIG_DFL);  // a program's own (doctest's crash handler is not)
      JoinOptions options;
      options.rank = 0;
      options.worldSize = 1;
      options.masterPort = 0;
      options.timeout = 5s;
      options.name = "stopped";
      options.reportPath = report;
      hmc::World world = hmc::joinWorld(options);
      ::raise(SIGTERM);  // recorded; the forwarding thread looks every 20 ms
      world.close();     // mostly first to the report
      std::fflush(nullptr);
      ::_exit(42);       // the signal did not end the process
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGTERM);
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == -1);  // shows the exit status
    std::ifstream in(report);
    std::stringstream text;
    text << in.rdbuf();
    INFO(text.str());
    CHECK(text.str().find("\"exit_code\": 143") != std::string::npos);
    CHECK(text.str().find("\"status\": \"stopped\"") != std::string::npos);
    std::filesystem::remove_all(folder);
  }
}
