#include "hmc/host.hpp"

#include <unistd.h>

namespace hmc {

std::string hostName() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  return buffer;
}

std::int64_t processId() noexcept { return static_cast<std::int64_t>(::getpid()); }

}  // namespace hmc
