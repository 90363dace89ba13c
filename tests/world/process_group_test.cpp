// ProcessGroup: hmc-run's rank processes as a state machine (spawn, reap, stop, never leave a
// child behind), on real child processes.
#include "hmc/world/process_group.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using hmc::world::ProcessGroup;
using namespace std::chrono_literals;

// Polls until every child exited, at most `limit`.
bool reapAll(ProcessGroup& group, std::chrono::milliseconds limit = 10s) {
  const auto until = ProcessGroup::Clock::now() + limit;
  while (group.running() > 0 && ProcessGroup::Clock::now() < until) {
    group.poll();
    std::this_thread::sleep_for(5ms);
  }
  return group.running() == 0;
}

bool alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// Polls until `path` exists, at most `limit` (a bound on an observable state, not a delay).
bool waitForFile(const std::string& path, std::chrono::milliseconds limit = 60s) {
  const auto until = ProcessGroup::Clock::now() + limit;
  while (access(path.c_str(), F_OK) != 0) {
    if (ProcessGroup::Clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_SUITE("process_group") {
  TEST_CASE("a child's exit status is reaped and described") {
    ProcessGroup group;
    const int ok = group.spawn({"/bin/sh", "-c", "exit 0"});
    const int three = group.spawn({"/bin/sh", "-c", "exit 3"});
    const int crash = group.spawn({"/bin/sh", "-c", "exit 17"});
    REQUIRE(reapAll(group));
    CHECK(hmc::world::describeWaitStatus(*group.status(ok)) == "exited with status 0");
    CHECK(hmc::world::describeWaitStatus(*group.status(three)) == "exited with status 3");
    CHECK(hmc::world::describeWaitStatus(*group.status(crash), 17) ==
          "exited with status 17 (fault crash)");
  }

  TEST_CASE("a program that cannot be started exits with status 127") {
    ProcessGroup group;
    const int missing = group.spawn({"/nonexistent/hmc-rank"});
    REQUIRE(reapAll(group));
    CHECK(WIFEXITED(*group.status(missing)));
    CHECK(WEXITSTATUS(*group.status(missing)) == 127);
  }

  TEST_CASE("stopNow sends SIGTERM to every running child") {
    ProcessGroup group;
    group.spawn({"/bin/sleep", "30"});
    group.spawn({"/bin/sleep", "30"});
    group.poll();
    CHECK(group.running() == 2);
    CHECK_FALSE(group.stopping());
    group.stopNow();
    CHECK(group.stopping());
    REQUIRE(reapAll(group, 5s));
    for (int i = 0; i < 2; ++i) {
      CHECK(hmc::world::describeWaitStatus(*group.status(i)) == "killed by signal 15 (Terminated)");
    }
  }

  TEST_CASE("a child that ignores SIGTERM gets SIGKILL after the grace period") {
    // The shell says when its trap is in place (a file it creates after `trap`): a SIGTERM
    // before that would end it with 15, whatever the grace period does.
    char folder[] = "/tmp/hmc-process-group-XXXXXX";
    REQUIRE(mkdtemp(folder) != nullptr);
    const std::string trapped = std::string(folder) + "/trapped";
    ProcessGroup group(200ms);
    group.spawn(
        {"/bin/sh", "-c", "trap '' TERM; : > \"$0\"; while :; do sleep 0.1; done", trapped});
    const bool ready = waitForFile(trapped);
    std::remove(trapped.c_str());
    rmdir(folder);
    REQUIRE_MESSAGE(ready, "the shell did not install its trap within 60 s");
    group.stopNow();
    REQUIRE(reapAll(group, 5s));
    CHECK(hmc::world::describeWaitStatus(*group.status(0)) == "killed by signal 9 (Killed)");
  }

  TEST_CASE("a stop scheduled later leaves children running until then") {
    ProcessGroup group;
    group.spawn({"/bin/sleep", "30"});
    group.stopAt(ProcessGroup::Clock::now() + 1h);
    group.poll();
    CHECK(group.running() == 1);
    group.stopAt(ProcessGroup::Clock::now());  // the earliest request wins
    REQUIRE(reapAll(group, 5s));
  }

  TEST_CASE("the destructor kills and reaps every child still running") {
    pid_t pid = -1;
    {
      ProcessGroup group;
      group.spawn({"/bin/sleep", "30"});
      pid = group.pid(0);
      CHECK(alive(pid));
    }
    CHECK_FALSE(alive(pid));
  }

  TEST_CASE("a forked body: its return value is the exit status, its start an exec'd one's") {
    // What exec would reset: a handled signal, a blocked one, a close-on-exec descriptor.
    struct sigaction handler {};
    struct sigaction previous {};
    handler.sa_handler = [](int) {};
    sigemptyset(&handler.sa_mask);
    sigaction(SIGUSR1, &handler, &previous);
    sigset_t hangup;
    sigset_t mask;
    sigemptyset(&hangup);
    sigaddset(&hangup, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hangup, &mask);
    int closing[2];
    int keeping[2];
    REQUIRE(pipe2(closing, O_CLOEXEC) == 0);
    REQUIRE(pipe(keeping) == 0);
    ProcessGroup group;
    const int checked = group.spawn([&closing, &keeping]() {
      int wrong = 0;
      struct sigaction now {};
      sigaction(SIGUSR1, nullptr, &now);
      if (now.sa_handler != SIG_DFL) wrong |= 1;
      sigset_t blocked;
      pthread_sigmask(SIG_SETMASK, nullptr, &blocked);
      if (sigismember(&blocked, SIGHUP) == 1) wrong |= 2;
      if (fcntl(closing[0], F_GETFD) != -1) wrong |= 4;   // closed, as exec closes it
      if (fcntl(keeping[0], F_GETFD) == -1) wrong |= 8;   // inherited, as exec keeps it
      return 40 + wrong;
    });
    const int threw = group.spawn([]() -> int { throw std::runtime_error("a rank's error"); });
    sigaction(SIGUSR1, &previous, nullptr);
    pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    for (int fd : {closing[0], closing[1], keeping[0], keeping[1]}) close(fd);
    REQUIRE(reapAll(group));
    CHECK(hmc::world::describeWaitStatus(*group.status(checked)) == "exited with status 40");
    CHECK(hmc::world::describeWaitStatus(*group.status(threw)) == "exited with status 1");
  }

  TEST_CASE("output this process has buffered is not written again by a forked child") {
    char path[] = "/tmp/hmc-process-group-out-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    std::FILE* out = std::fopen(path, "w");
    REQUIRE(out != nullptr);
    std::fputs("once\n", out);  // buffered, not yet written
    ProcessGroup group;
    group.spawn([] { return 0; });  // the child flushes every stream as it ends
    REQUIRE(reapAll(group));
    std::fclose(out);
    std::FILE* in = std::fopen(path, "r");
    REQUIRE(in != nullptr);
    char text[64] = {};
    const std::size_t read = std::fread(text, 1, sizeof(text) - 1, in);
    std::fclose(in);
    std::remove(path);
    CHECK(std::string(text, read) == "once\n");
  }

  TEST_CASE("a forked body stops at SIGTERM like an exec'd child") {
    ProcessGroup group;
    group.spawn([] {
      for (;;) pause();
      return 0;
    });
    group.stopNow();
    REQUIRE(reapAll(group, 5s));
    CHECK(hmc::world::describeWaitStatus(*group.status(0)) == "killed by signal 15 (Terminated)");
  }
}
