#pragma once
// On-demand dump of a rank's flight record, like PyTorch's Flight Recorder: `kill -USR1 <pid>`
// on a rank process makes its watchdog (watchdog.hpp) write the record to stderr.
//
// The signal handler is async-signal-safe: it only bumps a lock-free counter. The watchdog
// thread notices the request within its period (100 ms) and does the formatting and the
// writing. The handler is installed with SA_RESTART; hmc's transports retry the system calls
// that a signal interrupts anyway, so a dump never disturbs an exchange.

#include <string>
#include <string_view>

#include "hmc/diagnostics/flight_recorder.hpp"

namespace hmc::diagnostics {

// Installs the flag-setting handler for `signal` (SIGUSR1 in hmc-run's rank processes). It
// stays installed for the life of the process: a later signal is then counted and ignored
// instead of terminating the process. Throws RuntimeError when sigaction fails.
void installFlightDumpSignal(int signal);

// How many dumps were requested by signal since the last call; clears the count. Thread-safe.
int takeFlightDumpRequests() noexcept;

// For tests and other triggers: counts a request as the handler does.
void requestFlightDump() noexcept;

// The dump: a header line ("# hmc flight record of rank 2 (pid 123, SIGUSR1): waiting in
// 'close validation' #5 (step 2) for 3.2 s") and one line per entry, oldest first, each
// starting with "# ".
std::string formatFlightDump(const FlightRecorder& recorder, int rank, std::string_view why);

}  // namespace hmc::diagnostics
