#include "hmc/diagnostics/flight_dump.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/error.hpp"

namespace hmc::diagnostics {
namespace {

std::atomic<int> gDumpRequests{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void onFlightDumpSignal(int) { gDumpRequests.fetch_add(1, std::memory_order_relaxed); }

std::string dumpStepText(int step) {
  return step < 0 ? std::string("outside the steps") : fmt::format("step {}", step);
}

}  // namespace

void installFlightDumpSignal(int signal) {
  struct sigaction action {};
  action.sa_handler = onFlightDumpSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(signal, &action, nullptr) != 0) {
    throw RuntimeError(
        fmt::format("sigaction({}) for the flight record dump: {}", signal, std::strerror(errno)));
  }
}

int takeFlightDumpRequests() noexcept { return gDumpRequests.exchange(0); }

void requestFlightDump() noexcept { gDumpRequests.fetch_add(1, std::memory_order_relaxed); }

std::string formatFlightDump(const FlightRecorder& recorder, int rank, std::string_view why) {
  const Heartbeat beat = heartbeatOf(recorder, rank);
  std::string where;
  if (beat.state == RankState::kWaiting) {
    where = fmt::format("waiting in '{}' #{} ({}) for {:.1f} s", beat.current->stage,
                        beat.current->sequence, dumpStepText(beat.current->step), beat.inStageS);
  } else {
    where = fmt::format("{} ({}), {:.1f} s since its last collective", toString(beat.state),
                        dumpStepText(beat.step), beat.inStageS);
  }
  const auto entries = recorder.entries();
  std::string out = fmt::format(
      "# hmc flight record of rank {} (pid {}, {}): {}; {} entries, {:.1f} s since start\n", rank,
      ::getpid(), why, where, entries.size(), beat.wallS);
  out += fmt::format("# {:>6} {:<24} {:>5} {:>10} {:>10} {:>9}  {}\n", "seq", "stage", "step",
                     "start_s", "end_s", "bytes", "status");
  for (const auto& entry : entries) {
    out += fmt::format("# {:>6} {:<24} {:>5} {:>10.3f} {:>10} {:>9}  {}\n", entry.sequence,
                       entry.stage, entry.step, entry.startS,
                       entry.endS ? fmt::format("{:.3f}", *entry.endS) : std::string("-"),
                       entry.payloadBytes, entry.status);
  }
  return out;
}

}  // namespace hmc::diagnostics
