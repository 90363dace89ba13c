#include "signals.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

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
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblockTerminationSignals() {
  sigset_t set = terminationSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

TerminationWatcher::TerminationWatcher(std::function<void(int)> onSignal, unsigned hardLimitSeconds)
    : onSignal_(std::move(onSignal)), hardLimitSeconds_(hardLimitSeconds) {
  thread_ = std::thread([this] {
    sigset_t set = terminationSet();
    sigaddset(&set, kStopWatcher);
    int signal = 0;
    while (sigwait(&set, &signal) != 0) {
    }
    if (signal == kStopWatcher) return;
    // From now on a second termination signal ends the process at once (default action,
    // delivered to this thread, the only one that unblocks them), and nothing outlives the
    // hard limit.
    for (int s : kSignals) ::signal(s, SIG_DFL);
    sigset_t unblock = terminationSet();
    pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    ::alarm(hardLimitSeconds_);
    onSignal_(signal);
    ::_exit(128 + signal);
  });
}

TerminationWatcher::~TerminationWatcher() {
  pthread_kill(thread_.native_handle(), kStopWatcher);
  thread_.join();
}

}  // namespace hmc::app
