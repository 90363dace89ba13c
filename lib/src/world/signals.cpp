#include "hmc/world/signals.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>

namespace hmc::world {
namespace {

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
// Sent by ~TerminationWatcher to wake its own thread (never delivered to anything else).
constexpr int kStopWatcher = SIGUSR2;

std::atomic<int> gSignal{0};
// When the first termination signal came (CLOCK_MONOTONIC, ns), for repeatedTerm.
std::atomic<std::int64_t> gFirstSignalNs{0};
// A SIGTERM this soon after the first one is the same request sent twice, not a user who means
// it: Slurm at a job's time limit sends SIGTERM, SIGCONT and SIGTERM within milliseconds (the
// step's and the batch script's teardown), and its SIGKILL after KillWait still bounds us.
constexpr std::int64_t kRepeatWindowNs = 1'000'000'000;

std::int64_t monotonicNs() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

bool repeatedTerm(int signal) noexcept {
  return signal == SIGTERM && monotonicNs() - gFirstSignalNs.load() < kRepeatWindowNs;
}

// The handler once a termination signal was taken: a second one ends the process at once
// (default action), but for a repeated SIGTERM (repeatedTerm).
extern "C" void secondSignal(int signal) {
  if (repeatedTerm(signal)) return;
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

// SIGCONTs seen while a SignalForwarder with a warning takes them.
std::atomic<std::uint64_t> gContinues{0};
extern "C" void countContinue(int) { gContinues.fetch_add(1); }

extern "C" void recordSignal(int signal) {
  if (gSignal.exchange(signal) != 0) {
    secondSignal(signal);  // the user means it, unless a launcher only repeated its SIGTERM
    return;
  }
  gFirstSignalNs.store(monotonicNs());
}

void takeSecondSignals() {
  struct sigaction action {};
  action.sa_handler = secondSignal;
  sigemptyset(&action.sa_mask);
  for (int signal : kSignals) sigaction(signal, &action, nullptr);
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
    // From now on a second termination signal ends the process at once (delivered to this
    // thread, the only one that unblocks them; secondSignal), and nothing outlives the hard
    // limit.
    gFirstSignalNs.store(monotonicNs());
    takeSecondSignals();
    sigset_t unblock = terminationSet();
    pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    ::alarm(hardLimitSeconds_);
    if (onSignal_(signal)) ::_exit(128 + signal);
    // The owner's thread reports and exits by itself (within the hard limit): later signals
    // stay blocked, so that nothing cuts its report short (a launcher's SIGKILL still can).
  });
}

TerminationWatcher::~TerminationWatcher() {
  pthread_kill(thread_.native_handle(), kStopWatcher);
  thread_.join();
}

SignalForwarder::SignalForwarder(std::function<void(int, const std::string&)> onSignal,
                                 std::function<void()> onWarning) {
  if (onWarning) {
    struct sigaction action {};
    action.sa_handler = countContinue;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    takesContinue_ = sigaction(SIGCONT, &action, &oldContinue_) == 0;
  }
  // Counted from before the thread starts: a SIGCONT right after this constructor returns is
  // one (the test's child saw none when the thread read the count only once it ran).
  const std::uint64_t before = gContinues.load();
  thread_ = std::thread([this, onSignal = std::move(onSignal), onWarning = std::move(onWarning),
                         before] {
    using Clock = std::chrono::steady_clock;
    auto lastWake = Clock::now();
    auto resumedAt = lastWake - std::chrono::hours(1);  // never resumed yet
    std::uint64_t continues = before;
    while (!done_.load()) {
      if (const int signal = pendingSignal(); signal != 0) {
        onSignal(signal, fmt::format("interrupted by signal {} ({})", signal, strsignal(signal)));
        return;
      }
      if (onWarning) {
        // A wake over a second after the last marks a resume (the SIGCONT that ended a stop
        // may be counted at this wake or the next).
        const auto now = Clock::now();
        if (now - lastWake > std::chrono::seconds(1)) resumedAt = now;
        lastWake = now;
        if (const std::uint64_t seen = gContinues.load(); seen != continues) {
          continues = seen;
          if (now - resumedAt > std::chrono::milliseconds(500)) onWarning();
          lastWake = Clock::now();
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

SignalForwarder::~SignalForwarder() {
  done_ = true;
  thread_.join();
  if (takesContinue_) sigaction(SIGCONT, &oldContinue_, nullptr);
}

}  // namespace hmc::world
