#pragma once
// The rank processes of hmc-run's own launch as a state machine, apart from what they run:
// spawn, reap without blocking, stop (SIGTERM, then SIGKILL after a grace period) at a
// deadline or at once, and never leave a child behind (the destructor kills and reaps what is
// left). Children die with the parent too (PR_SET_PDEATHSIG), so a SIGKILLed hmc-run does not
// orphan its ranks.
//
// Single-threaded: one owner calls poll() in its loop. Not copyable.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hmc::world {

// "exited with status 3", "killed by signal 9 (Killed)"; `crashStatus` is the exit status
// of the `crash` fault, described as "(fault crash)".
std::string describeWaitStatus(int status, int crashStatus = -1);

class ProcessGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // `killAfter`: how long a child has between SIGTERM and SIGKILL.
  explicit ProcessGroup(std::chrono::milliseconds killAfter = std::chrono::seconds(2));
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv[0] with `argv`; returns the child's index. Throws RuntimeError (fork failed:
  // the OS reason, e.g. a process limit). A child that cannot exec exits with status 127.
  int spawn(const std::vector<std::string>& argv);
  // Runs `body` in a forked copy of this process instead (no exec); its return value is the
  // child's exit status. The child starts as an exec'd one would: the default action for every
  // signal this process handles, no signal blocked, the descriptors marked close-on-exec
  // closed. Only for a caller whose other threads (if any) hold no lock the body needs.
  int spawn(const std::function<int()>& body);

  // One non-blocking pass: reaps the children that exited and sends the signals that are due.
  // Returns the indices that exited in this pass.
  std::vector<int> poll();

  // Stop every running child at `when` (the earliest request wins): SIGTERM then, SIGKILL
  // killAfter later.
  void stopAt(Clock::time_point when);
  void stopNow() { stopAt(Clock::now()); }
  bool stopping() const noexcept { return stopAt_.has_value(); }

  std::size_t size() const noexcept { return children_.size(); }
  int running() const noexcept { return running_; }
  pid_t pid(int index) const { return children_.at(index).pid; }
  // The wait status once the child exited.
  std::optional<int> status(int index) const { return children_.at(index).status; }

 private:
  struct Child {
    pid_t pid = -1;
    std::optional<int> status;
  };
  // Forks; the child runs `inChild` (which must not return), the parent records it.
  int start(const std::function<void()>& inChild, const std::string& what);
  void signalRunning(int signal);

  std::chrono::milliseconds killAfter_;
  std::vector<Child> children_;
  int running_ = 0;
  std::optional<Clock::time_point> stopAt_;
  std::optional<Clock::time_point> killAt_;
  bool killed_ = false;
};

}  // namespace hmc::world
