#include "signals.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

namespace hmc::app {
namespace {

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
// Sent by ~TerminationWatcher to wake its own thread (never delivered to anything else).
constexpr int kStopWatcher = SIGUSR2;

std::atomic<int> gSignal{0};

extern "C" void recordSignal(int signal) {
  if (gSignal.exchange(signal) != 0) {
    // The second one: the user means it.
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

sigset_t terminationSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : kSignals) sigaddset(&set, signal);
  return set;
}

}  // namespace

int pendingSignal() noexcept { return gSignal.load(); }

SignalScope::SignalScope() {
  gSignal.store(0);
  struct sigaction action {};
  action.sa_handler = recordSignal;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &action, &old_[i]);
}

SignalScope::~SignalScope() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
}

void blockTerminationSignals() {
  sigset_t set = terminationSet();
  sigaddset(&set, kStopWatcher);
  sigaddset(&set, SIGCONT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblockTerminationSignals() {
  sigset_t set = terminationSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

TerminationWatcher::TerminationWatcher(std::function<bool(int)> onSignal, unsigned hardLimitSeconds,
                                       std::function<void()> onWarning)
    : onSignal_(std::move(onSignal)),
      hardLimitSeconds_(hardLimitSeconds),
      onWarning_(std::move(onWarning)) {
  thread_ = std::thread([this] {
    sigset_t set = terminationSet();
    sigaddset(&set, kStopWatcher);
    if (onWarning_) sigaddset(&set, SIGCONT);
    // Wakes every 200 ms, so that a SIGCONT that resumes a stopped process (the last wake long
    // ago) is told apart from Open MPI's warning to a running one.
    const timespec tick{0, 200 * 1000 * 1000};
    // A wait that ended over a second after it began marks a resume; the SIGCONT may come with
    // that wake or with the next one (the stop interrupts the wait with EINTR).
    using Clock = std::chrono::steady_clock;
    auto lastWake = Clock::now();
    auto resumedAt = lastWake - std::chrono::hours(1);  // never resumed yet
    int signal = 0;
    for (;;) {
      signal = sigtimedwait(&set, nullptr, &tick);
      const auto now = Clock::now();
      if (now - lastWake > std::chrono::seconds(1)) resumedAt = now;
      lastWake = now;
      if (signal < 0) continue;  // the tick (EAGAIN) or EINTR
      if (signal != SIGCONT) break;
      if (now - resumedAt > std::chrono::milliseconds(500)) onWarning_();
      lastWake = Clock::now();
    }
    if (signal == kStopWatcher) return;
    // From now on a second termination signal ends the process at once (default action,
    // delivered to this thread, the only one that unblocks them), and nothing outlives the
    // hard limit.
    for (int s : kSignals) ::signal(s, SIG_DFL);
    sigset_t unblock = terminationSet();
    pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    ::alarm(hardLimitSeconds_);
    if (onSignal_(signal)) ::_exit(128 + signal);
    // The owner's thread reports and exits by itself (within the hard limit).
  });
}

TerminationWatcher::~TerminationWatcher() {
  pthread_kill(thread_.native_handle(), kStopWatcher);
  thread_.join();
}

}  // namespace hmc::app
