// TerminationWatcher on real forked processes: a termination signal runs the callback and exits
// with 128 + the signal unless the callback leaves the exit to its owner; a second signal during
// the callback ends the process, but for a SIGTERM repeated at once; a SIGCONT to a running
// process is Open MPI's warning (the callback runs), a SIGCONT that resumes a stopped process
// is not; the same for a SignalForwarder given a warning (hmc::World under mpirun).
#include "hmc/world/signals.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

// A child that blocks the signals, runs a watcher whose callbacks write a letter to `fd` ('w'
// for a warning, 't' for a termination signal), says 'r' when ready, and lives up to 20 s; it
// exits 7 when the termination callback returned `exitByItself` false.
pid_t startChild(int fd, bool exitByItself) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  hmc::world::blockTerminationSignals();
  std::atomic<bool> leftToUs{false};
  {
    hmc::world::TerminationWatcher watcher(
        [&](int) {
          (void)!write(fd, "t", 1);
          leftToUs = !exitByItself;
          return exitByItself;
        },
        5, [&] { (void)!write(fd, "w", 1); });
    (void)!write(fd, "r", 1);
    for (int i = 0; i < 2000 && !leftToUs; ++i) std::this_thread::sleep_for(10ms);
  }  // the watcher's thread is joined before the exit (TSan reports a thread left unjoined)
  _exit(leftToUs ? 7 : 0);
}

// What the child wrote so far (non-blocking read).
std::string drain(int fd) {
  std::string got;
  char c = 0;
  while (read(fd, &c, 1) == 1) got += c;
  return got;
}

// Waits until the child wrote `what`, at most 5 s.
bool waitFor(int fd, std::string& seen, const std::string& what) {
  for (int i = 0; i < 500; ++i) {
    seen += drain(fd);
    if (seen.find(what) != std::string::npos) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

int exitOf(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(10ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -2;
}

// The child (it said "r" on `fd`) gets a SIGCONT while it runs: a warning ("w"). Then it is
// stopped past the 1 s that marks a resume and continued: no warning for that SIGCONT, and
// none by 1.5 s later (past the 500 ms window after a resume, with room for a loaded machine:
// a CI run failed once with 500 ms). `seen` is then "rw".
void warnedThenResumed(pid_t child, int fd, std::string& seen) {
  kill(child, SIGCONT);
  CHECK(waitFor(fd, seen, "w"));
  kill(child, SIGSTOP);
  std::this_thread::sleep_for(1500ms);
  kill(child, SIGCONT);
  std::this_thread::sleep_for(1500ms);
  seen += drain(fd);
  CHECK(seen == "rw");
}

struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() {
    REQUIRE(pipe(fds) == 0);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
  }
  ~Pipe() {
    close(fds[0]);
    close(fds[1]);
  }
};

}  // namespace

TEST_SUITE("signals") {
  TEST_CASE("SIGTERM runs the callback and exits with 143") {
    Pipe p;
    const pid_t child = startChild(p.fds[1], true);
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    kill(child, SIGTERM);
    CHECK(exitOf(child) == 143);
    seen += drain(p.fds[0]);
    CHECK(seen == "rt");
  }

  TEST_CASE("a callback that leaves the exit to its owner does not end the process") {
    Pipe p;
    const pid_t child = startChild(p.fds[1], false);
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    kill(child, SIGTERM);
    CHECK(exitOf(child) == 7);
  }

  TEST_CASE("a SIGTERM repeated at once is the same request: the callback still reports") {
    // Slurm at a time limit: SIGTERM, SIGCONT, SIGTERM within milliseconds, while the callback
    // (the report) runs.
    Pipe p;
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      hmc::world::blockTerminationSignals();
      hmc::world::TerminationWatcher watcher(
          [&](int) {
            (void)!write(p.fds[1], "t", 1);
            std::this_thread::sleep_for(1500ms);  // reporting
            return true;                          // exit 143
          },
          30);
      (void)!write(p.fds[1], "r", 1);
      std::this_thread::sleep_for(30s);
      _exit(0);
    }
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    kill(child, SIGTERM);
    REQUIRE(waitFor(p.fds[0], seen, "t"));
    kill(child, SIGTERM);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK_FALSE(WIFSIGNALED(status));
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 143);
  }

  TEST_CASE("a second signal of another kind during the callback ends the process at once") {
    // The callback (a report at a launcher's SIGTERM) is still running when SIGINT comes.
    Pipe p;
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      hmc::world::blockTerminationSignals();
      hmc::world::TerminationWatcher watcher(
          [&](int) {
            (void)!write(p.fds[1], "t", 1);
            std::this_thread::sleep_for(20s);  // reporting
            return true;
          },
          30);
      (void)!write(p.fds[1], "r", 1);
      std::this_thread::sleep_for(30s);
      _exit(0);
    }
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    kill(child, SIGTERM);
    REQUIRE(waitFor(p.fds[0], seen, "t"));
    kill(child, SIGINT);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGINT);
  }

  TEST_CASE("a SIGCONT to a running process is a warning; one that resumes a stopped one is not") {
    Pipe p;
    const pid_t child = startChild(p.fds[1], true);
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    warnedThenResumed(child, p.fds[0], seen);
    kill(child, SIGTERM);
    CHECK(exitOf(child) == 143);
  }

  TEST_CASE("a forwarder with a warning: SIGCONT to a running process is one, a resume is not") {
    // hmc::World under mpirun: the program's threads take the signals (no blocking), the
    // forwarder's SIGCONT handler counts them and its thread calls onWarning.
    Pipe p;
    const int fd = p.fds[1];
    const pid_t child = fork();
    if (child == 0) {
      hmc::world::SignalScope scope;
      {
        hmc::world::SignalForwarder forwarder([&](int, const std::string&) { _exit(9); },
                                              [&] { (void)!write(fd, "w", 1); });
        (void)!write(fd, "r", 1);
        std::this_thread::sleep_for(20s);
      }
      _exit(0);
    }
    std::string seen;
    REQUIRE(waitFor(p.fds[0], seen, "r"));
    warnedThenResumed(child, p.fds[0], seen);
    kill(child, SIGCONT);  // running again for 1.5 s: a warning
    CHECK(waitFor(p.fds[0], seen, "rww"));
    kill(child, SIGTERM);  // the forwarder's signal callback
    CHECK(exitOf(child) == 9);
  }
}
