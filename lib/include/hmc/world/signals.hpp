#pragma once
// Termination signals (SIGINT, SIGTERM, SIGHUP) in hmc-run.
//
// - The reporting process (threads, or the parent of its own rank processes) installs a
//   SignalScope: a handler only records the signal; the run loop asks pendingSignal() and
//   stops the ranks, reports what they did (marked interrupted) and exits 130. A second signal
//   ends the process at once.
// - A rank process calls blockTerminationSignals() before it starts any thread, then runs a
//   TerminationWatcher: a thread that sigwait()s and calls its callback once (publish the
//   rank's evidence, then _exit); a second signal during the callback ends the process at
//   once, and the callback is bounded by a hard deadline (alarm) too.

#include <atomic>
#include <csignal>
#include <functional>
#include <string>
#include <thread>

namespace hmc::world {

// The termination signal received since the scope began, or 0.
int pendingSignal() noexcept;

class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_[3] = {};
};

// Blocks SIGINT, SIGTERM and SIGHUP (and SIGCONT, for a TerminationWatcher's warning; its
// default action, resuming a stopped process, happens blocked or not) in the calling thread and
// every thread it starts later.
void blockTerminationSignals();
// Unblocks them in the calling thread (where a SignalScope's handler, or the default action,
// should take them).
void unblockTerminationSignals();

// Under a SignalScope: watches pendingSignal() on a thread of its own (every 20 ms) and calls
// `onSignal(signal, "interrupted by signal N (NAME)")` once, at the first; stops with its
// destructor. The one home of that loop for the thread ranks' driver and for shrink, which keeps
// one for all its trials.
//
// `onWarning`, when given: the forwarder also takes SIGCONT (a handler that counts it, the
// previous action restored by the destructor) and calls onWarning() on its thread at a SIGCONT
// to a running process: Open MPI's warning, 1 s before its SIGTERM (teardown.hpp). A SIGCONT
// that resumes a stopped process is told apart as TerminationWatcher does: the forwarder, awake
// every 20 ms, saw no wake for over a second. onWarning must return within a second.
class SignalForwarder {
 public:
  explicit SignalForwarder(std::function<void(int signal, const std::string& why)> onSignal,
                           std::function<void()> onWarning = nullptr);
  ~SignalForwarder();
  SignalForwarder(const SignalForwarder&) = delete;
  SignalForwarder& operator=(const SignalForwarder&) = delete;

 private:
  std::atomic<bool> done_{false};
  bool takesContinue_ = false;
  struct sigaction oldContinue_ = {};
  std::thread thread_;
};

class TerminationWatcher {
 public:
  // `onSignal(signal)` runs on the watcher's thread at the first termination signal; when it
  // returns true the process exits (_exit) with 128 + signal, false leaves the exit to the
  // owner's thread (which is reporting already); either way within `hardLimitSeconds`, else
  // SIGALRM ends the process. `onWarning`, when
  // given, runs on the same thread at a SIGCONT to a running process (Open MPI sends SIGCONT
  // 1 s before its SIGTERM, which it follows with SIGKILL within 20-50 ms); not for a SIGCONT
  // that resumes a stopped process (the watcher, woken every 200 ms, saw no wake for over a
  // second). It must return within a second and must not end the process.
  TerminationWatcher(std::function<bool(int signal)> onSignal, unsigned hardLimitSeconds = 5,
                     std::function<void()> onWarning = nullptr);
  ~TerminationWatcher();  // the process keeps the signals blocked; the thread is stopped
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

 private:
  std::function<bool(int)> onSignal_;
  unsigned hardLimitSeconds_;
  std::function<void()> onWarning_;
  std::thread thread_;
};

}  // namespace hmc::world
