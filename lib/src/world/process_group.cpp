#include "hmc/world/process_group.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hmc/error.hpp"

namespace hmc::world {

std::string describeWaitStatus(int status, int crashStatus) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == crashStatus ? fmt::format("exited with status {} (fault crash)", code)
                               : fmt::format("exited with status {}", code);
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  }
  return fmt::format("ended with wait status {}", status);
}

ProcessGroup::ProcessGroup(std::chrono::milliseconds killAfter) : killAfter_(killAfter) {}

ProcessGroup::~ProcessGroup() {
  if (running_ == 0) return;
  signalRunning(SIGKILL);
  for (auto& child : children_) {
    if (child.status) continue;
    int status = 0;
    while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    child.status = status;
  }
  running_ = 0;
}

namespace {

// In a new child: die with the parent, and start from the signal state an exec'd program has.
void enterChild(pid_t parent) {
  // Die with the parent, also when it is SIGKILLed; it may have died before this line.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(128 + SIGKILL);
  // The parent's signal handlers and blocked signals are not the program's to inherit.
  // (exec resets caught signals, but a handler could run before it; ignored ones stay so.)
  for (int signal = 1; signal < NSIG; ++signal) {
    struct sigaction current {};
    if (signal == SIGKILL || signal == SIGSTOP || sigaction(signal, nullptr, &current) != 0) {
      continue;
    }
    const bool handled = (current.sa_flags & SA_SIGINFO) != 0 ||
                         (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
    if (handled || signal == SIGINT || signal == SIGTERM || signal == SIGHUP) {
      ::signal(signal, SIG_DFL);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// What exec would close: the descriptors marked close-on-exec (sockets and files the parent
// keeps for itself).
void closeCloseOnExec() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  std::vector<int> marked;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    const int flags = fcntl(static_cast<int>(fd), F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) != 0) marked.push_back(static_cast<int>(fd));
  }
  closedir(dir);
  for (int fd : marked) close(fd);
}

}  // namespace

int ProcessGroup::start(const std::function<void()>& inChild, const std::string& what) {
  const pid_t parent = getpid();
  // Nothing buffered in this process's streams is copied into the child, which flushes its
  // streams when a forked body ends (it would print the parent's pending output again).
  std::fflush(nullptr);
  // Every signal blocked across fork: the child runs none of this process's handlers (a
  // SIGTERM sent to it before it reset them ran the parent's handler in the child; TSan
  // reported that) and gets what was sent once it unblocks, with the default actions.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) {
    throw RuntimeError(fmt::format(
        "cannot start rank process {} of {}: fork: {} (a process or memory limit? see ulimit -u "
        "and ulimit -v)",
        children_.size(), what, std::strerror(errno)));
  }
  if (pid == 0) {
    enterChild(parent);
    inChild();  // does not return
  }
  children_.push_back(Child{pid, std::nullopt});
  ++running_;
  return static_cast<int>(children_.size()) - 1;
}

int ProcessGroup::spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  return start(
      [&argv] {
        execv(argv[0], argv.data());
        std::fprintf(stderr, "hmc-run: cannot start rank process %s: %s\n", argv[0],
                     std::strerror(errno));
        _exit(127);
      },
      args.empty() ? "" : args[0]);
}

int ProcessGroup::spawn(const std::function<int()>& body) {
  return start(
      [&body] {
        closeCloseOnExec();
        int code = 1;
        try {
          code = body();
        } catch (const std::exception& error) {
          std::fprintf(stderr, "hmc-run: rank process: %s\n", error.what());
        }
        std::fflush(nullptr);
        _exit(code);
      },
      "a forked rank");
}

std::vector<int> ProcessGroup::poll() {
  std::vector<int> exited;
  for (std::size_t i = 0; i < children_.size(); ++i) {
    Child& child = children_[i];
    if (child.status) continue;
    int status = 0;
    const pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) {
      child.status = status;
      --running_;
      exited.push_back(static_cast<int>(i));
    }
  }
  if (running_ == 0) return exited;
  const auto now = Clock::now();
  if (stopAt_ && now >= *stopAt_ && !killAt_) {
    signalRunning(SIGTERM);
    killAt_ = now + killAfter_;
  }
  if (killAt_ && now >= *killAt_ && !killed_) {
    signalRunning(SIGKILL);
    killed_ = true;  // once; the next polls reap them
  }
  return exited;
}

void ProcessGroup::stopAt(Clock::time_point when) {
  if (!stopAt_ || when < *stopAt_) stopAt_ = when;
}

void ProcessGroup::signalRunning(int signal) {
  for (const auto& child : children_) {
    if (child.status) continue;
    kill(child.pid, signal);
    // A stopped child (SIGSTOP) would keep SIGTERM pending: continue it so that it can act.
    if (signal == SIGTERM) kill(child.pid, SIGCONT);
  }
}

}  // namespace hmc::world
