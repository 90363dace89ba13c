#pragma once
// Runs N rank processes of a helper executable on 127.0.0.1 and collects what each printed,
// reaping every child: a child still alive at the bound is killed (SIGKILL) and reaped, so no
// test leaves a process behind.
//
// The helper is executed once per world, in its start mode (`HELPER --fork-ranks ...`, handled
// by forkRanksMain below), and forks the ranks from there: LibTorch, which the helpers link,
// is loaded once per world and not once per rank (0.85 s of CPU each time; 161 rank processes
// of process_transport_test spent 136 s of the suite's CPU on it). The test process is the
// ranks' subreaper (PR_SET_CHILD_SUBREAPER): once the start process has exited, the ranks are
// its children, which it waits for, kills and reaps as if it had forked them itself.
//
// The start gate (`startGate`): process start-up (exec, loading LibTorch) on a loaded machine
// takes seconds and differs between ranks, and it is no part of what a case times. With the
// gate, each child finds a folder in HMC_TEST_GATE, creates "ready.<rank>" (its pid) there once
// it runs main(), and waits for "go" (gateWait below); the test creates "go" once every rank is
// ready (or one has already exited), and the bound and each outcome's seconds count from then.
// The folder also serves the ranks of a case to wait for each other's observable states
// (gateMark, gateAwait, gateAwaitExitOf) where they would otherwise sleep for a time.

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
  double seconds = 0;   // from the start of all ranks (with the gate: the go) to this exit
};

inline constexpr const char* kGateVariable = "HMC_TEST_GATE";

// The gate's folder in a child started with the gate, or nullptr.
inline const char* gateFolder() { return std::getenv(kGateVariable); }

// In a child: polls until `done()` holds, at most `bound`; whether it held.
template <typename Done>
bool gateAwait(Done done, std::chrono::milliseconds bound = std::chrono::minutes(5)) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline bool gateFileExists(const std::string& name) {
  const char* folder = gateFolder();
  return folder != nullptr && ::access((std::string(folder) + "/" + name).c_str(), F_OK) == 0;
}

// In a child: creates `name` in the gate's folder holding `text` (written whole, then renamed
// into place, so a reader never sees it half written). False without the gate.
inline bool gateMark(const std::string& name, const std::string& text = "") {
  const char* folder = gateFolder();
  if (folder == nullptr) return false;
  const std::string path = std::string(folder) + "/" + name;
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << text;
    if (!out) return false;
  }
  return std::rename(partial.c_str(), path.c_str()) == 0;
}

// In a child started with the gate: the pid rank `rank` wrote at the gate (0 if none).
inline pid_t gatePidOf(int rank) {
  const char* folder = gateFolder();
  if (folder == nullptr) return 0;
  std::ifstream in(std::string(folder) + "/ready." + std::to_string(rank));
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// In a child started with the gate: waits until rank `rank`'s process is gone (exited and
// reaped by the test, which reaps every few milliseconds), at most `bound`.
inline bool gateAwaitExitOf(int rank, std::chrono::milliseconds bound = std::chrono::minutes(5)) {
  const pid_t pid = gatePidOf(rank);
  if (pid <= 0) return false;
  return gateAwait([&] { return ::kill(pid, 0) != 0 && errno == ESRCH; }, bound);
}

// In a child started with the gate (HMC_TEST_GATE set): says it runs ("ready.<rank>" holding
// its pid), then waits for the go, at most `bound`. Returns false when no go came. Without
// the variable: true at once.
inline bool gateWait(int rank, std::chrono::milliseconds bound = std::chrono::minutes(5)) {
  if (gateFolder() == nullptr) return true;
  if (!gateMark("ready." + std::to_string(rank), std::to_string(::getpid()))) return false;
  return gateAwait([] { return gateFileExists("go"); }, bound);
}

// Whether this process has any child left (reaped or not).
inline bool hasChildren() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

inline constexpr const char* kForkRanks = "--fork-ranks";

// The helper's main in its start mode: `HELPER --fork-ranks REPORT_FD N OUT_FD... -- ARGS... --
// ARGS...` (N output descriptors, then N argument lists, each ended by "--"). Forks one child
// per list, whose stdout is its output descriptor and which returns rankMain(its argv, the
// helper's path first) as its exit status; writes each child's pid on a line of REPORT_FD, in
// rank order, and returns 0 (1 on bad arguments or a failed fork: the report then lacks the
// ranks not started, which the test sees).
template <typename RankMain>
int forkRanksMain(int argc, char** argv, RankMain rankMain) {
  if (argc < 4 || std::string(argv[1]) != kForkRanks) return 1;
  const int report = std::atoi(argv[2]);
  const int world = std::atoi(argv[3]);
  if (world < 1 || argc < 4 + world) return 1;
  std::vector<int> outs;
  for (int rank = 0; rank < world; ++rank) outs.push_back(std::atoi(argv[4 + rank]));
  std::vector<std::vector<char*>> lists(1);
  for (int i = 4 + world; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      lists.emplace_back();
    } else {
      lists.back().push_back(argv[i]);
    }
  }
  lists.pop_back();  // after the last "--"
  if (static_cast<int>(lists.size()) != world) return 1;
  std::fflush(nullptr);
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      ::dup2(outs[rank], STDOUT_FILENO);
      for (int fd : outs) ::close(fd);
      ::close(report);
      std::vector<char*> rankArgv{argv[0]};
      rankArgv.insert(rankArgv.end(), lists[rank].begin(), lists[rank].end());
      const int code = rankMain(static_cast<int>(rankArgv.size()), rankArgv.data());
      std::fflush(nullptr);
      ::_exit(code);
    }
    const std::string line = std::to_string(pid) + "\n";
    if (::write(report, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
  }
  return 0;
}

// Starts `argvOf(rank)` (the helper's path first, the same for every rank) for every rank
// through one start process (above), waits at most `bound` for all, kills the rest. With
// `startGate`, the children wait at the gate (see above) and `bound` counts from the go; the
// wait for every rank to be ready is bounded by `startBound`. A rank the start process could
// not start is reported with exit code 127 and no output.
template <typename ArgvOf>
std::vector<ProcessOutcome> runProcessRanks(
    int worldSize, ArgvOf argvOf, std::chrono::milliseconds bound, bool startGate = false,
    std::chrono::milliseconds startBound = std::chrono::minutes(3)) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  std::vector<ProcessOutcome> outcomes(worldSize);
  std::vector<pid_t> pids(worldSize, -1);
  std::vector<std::string> outputs(worldSize);
  std::string gate;
  if (startGate) {
    char folder[] = "/tmp/hmc-gate-XXXXXX";
    if (::mkdtemp(folder) == nullptr) throw std::runtime_error("mkdtemp failed");
    gate = folder;
    ::setenv(kGateVariable, gate.c_str(), 1);  // inherited by the children, unset below
  }
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw std::runtime_error("prctl(PR_SET_CHILD_SUBREAPER) failed");
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<int> outs;
  std::vector<std::string> args;  // HELPER --fork-ranks REPORT_FD N OUT_FD... -- ARGS... -- ...
  std::vector<std::vector<std::string>> lists;
  for (int rank = 0; rank < worldSize; ++rank) lists.push_back(argvOf(rank));
  args = {lists.at(0).at(0), kForkRanks, std::to_string(report[1]), std::to_string(worldSize)};
  for (int rank = 0; rank < worldSize; ++rank) {
    char path[] = "/tmp/hmc-rank-XXXXXX";
    const int fd = ::mkstemp(path);  // no O_CLOEXEC: the start process inherits it
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    outputs[rank] = path;
    outs.push_back(fd);
    args.push_back(std::to_string(fd));
  }
  for (const auto& list : lists) {
    args.insert(args.end(), list.begin() + 1, list.end());
    args.emplace_back("--");
  }
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t starter = ::fork();
  if (starter == 0) {
    ::fcntl(report[1], F_SETFD, 0);  // kept across the exec
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(report[1]);
  for (int fd : outs) ::close(fd);
  if (starter < 0) throw std::runtime_error("fork failed");
  // The start process forks and exits at once; one still there at `startBound` is killed.
  // From its exit on, the ranks it started are this process's children.
  int starterStatus = 0;
  while (::waitpid(starter, &starterStatus, WNOHANG) == 0) {
    if (Clock::now() - start > startBound) {
      ::kill(starter, SIGKILL);
      ::waitpid(starter, &starterStatus, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string pidLines;
  char buffer[256];
  for (ssize_t got; (got = ::read(report[0], buffer, sizeof buffer)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    pidLines.append(buffer, static_cast<size_t>(got));
  }
  ::close(report[0]);
  std::istringstream lines(pidLines);
  for (int rank = 0; rank < worldSize; ++rank) {
    long pid = 0;
    if (!(lines >> pid) || pid <= 0) {
      outcomes[rank].exitCode = 127;  // never started
      continue;
    }
    pids[rank] = static_cast<pid_t>(pid);
  }
  if (startGate) {
    ::unsetenv(kGateVariable);
    // Every rank ready, or one gone already (it cannot get ready: open the gate for the
    // others, whose outcomes then say what its absence did).
    auto ready = [&] {
      for (int rank = 0; rank < worldSize; ++rank) {
        if (pids[rank] < 0) return true;  // never started
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(pids[rank]), &info, WEXITED | WNOHANG | WNOWAIT) ==
                0 &&
            info.si_pid == pids[rank]) {
          return true;
        }
      }
      for (int rank = 0; rank < worldSize; ++rank) {
        if (::access((gate + "/ready." + std::to_string(rank)).c_str(), F_OK) != 0) return false;
      }
      return true;
    };
    while (!ready() && Clock::now() - start < startBound) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const std::string go = gate + "/go";
    const int goFd = ::open(go.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    if (goFd >= 0) ::close(goFd);
    start = Clock::now();
  }
  int alive = static_cast<int>(
      std::count_if(pids.begin(), pids.end(), [](pid_t pid) { return pid > 0; }));
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
  if (startGate) {
    // Every child is reaped: nothing reads the gate any more.
    if (DIR* dir = ::opendir(gate.c_str())) {
      while (const dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") std::remove((gate + "/" + name).c_str());
      }
      ::closedir(dir);
    }
    ::rmdir(gate.c_str());
  }
  return outcomes;
}

}  // namespace hmc::testing
