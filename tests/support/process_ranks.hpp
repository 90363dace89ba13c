#pragma once
// Runs N rank processes (fork + exec of a helper executable) on 127.0.0.1 and collects what
// each printed, reaping every child: a child still alive at the bound is killed (SIGKILL)
// and reaped, so no test leaves a process behind.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"

namespace hmc::testing {

struct ProcessOutcome {
  std::string kind;     // "ok", an error kind, or "" when the child printed no RESULT line
  std::string message;  // the error's message
  int exitCode = -1;    // -1 when killed by a signal
  int signal = 0;
  bool killed = false;  // still alive at the bound
  double seconds = 0;   // from the start of all ranks to this child's exit
};

using hmc::collective::freeLoopbackPort;

// Whether this process has any child left (reaped or not).
inline bool hasChildren() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

// Starts `argvOf(rank)` for every rank, waits at most `bound` for all, kills the rest.
template <typename ArgvOf>
std::vector<ProcessOutcome> runProcessRanks(int worldSize, ArgvOf argvOf,
                                            std::chrono::milliseconds bound) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<ProcessOutcome> outcomes(worldSize);
  std::vector<pid_t> pids(worldSize, -1);
  std::vector<std::string> outputs(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    std::vector<std::string> args = argvOf(rank);
    char path[] = "/tmp/hmc-rank-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    outputs[rank] = path;
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fd);
    pids[rank] = pid;
  }
  int alive = worldSize;
  while (alive > 0) {
    for (int rank = 0; rank < worldSize; ++rank) {
      if (pids[rank] < 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[rank], &status, WNOHANG);
      if (done != pids[rank]) continue;
      auto& outcome = outcomes[rank];
      outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) outcome.exitCode = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
      pids[rank] = -1;
      --alive;
    }
    if (alive > 0 && Clock::now() - start > bound) {
      for (int rank = 0; rank < worldSize; ++rank) {
        if (pids[rank] < 0) continue;
        ::kill(pids[rank], SIGKILL);
        int status = 0;
        ::waitpid(pids[rank], &status, 0);
        outcomes[rank].killed = true;
        outcomes[rank].signal = SIGKILL;
        pids[rank] = -1;
      }
      alive = 0;
    }
    if (alive > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < worldSize; ++rank) {
    std::ifstream in(outputs[rank]);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("RESULT ", 0) != 0) continue;
      const std::string rest = line.substr(7);
      const auto space = rest.find(' ');
      outcomes[rank].kind = rest.substr(0, space);
      outcomes[rank].message = space == std::string::npos ? "" : rest.substr(space + 1);
    }
    std::remove(outputs[rank].c_str());
  }
  return outcomes;
}

}  // namespace hmc::testing
