// Small helpers the socket-level transports (tcp, store, gloo) share: an OS error's text, a
// duration as it appears in their messages, and poll()'s timeout up to a deadline. One home
// each, so that their messages stay alike (and a unity build sees one definition).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <system_error>

#include "hmc/collective/collective.hpp"

namespace hmc::detail {

// strerror's text for `error`, thread-safe.
inline std::string osReason(int error) { return std::system_category().message(error); }

// "2.5 s": a deadline as the transports' messages print it.
inline std::string formatSeconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

// Milliseconds until `deadline` for poll(), rounded up so that poll never returns early.
inline int pollMillis(collective::Clock::time_point deadline) {
  const auto left = deadline - collective::Clock::now();
  if (left <= collective::Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

}  // namespace hmc::detail
