#pragma once
// Where this process runs, for reports, heartbeats and the evidence folder: across hosts a
// report names each rank's host and pid, so that a user finds the bad node.

#include <cstdint>
#include <string>

namespace hmc {

// gethostname(), or "unknown" when it fails.
std::string hostName();
// getpid().
std::int64_t processId() noexcept;

}  // namespace hmc
