// Small helpers the transports share: an OS error's text, a duration as it appears in their
// messages, poll()'s timeout up to a deadline, and the one wording of a collective's timeout
// and of a lost peer on every transport (threads, tcp, store, gloo, nccl; a mismatch has
// describeMismatch in envelope.hpp). One home each, so that their messages stay alike (and a
// unity build sees one definition).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

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

// "ranks [1, 3] did not arrive".
inline std::string notArrivedText(const std::vector<int>& ranks) {
  return fmt::format("ranks {} did not arrive", collective::formatRankList(ranks));
}

// "'close validation' #1 timed out on rank 0 after 2 s: ranks [1] did not arrive": a
// collective's timeout on every transport. `timeout` is the collective's (timeout()), `what`
// says who did not arrive (notArrivedText), with what else the transport knows after it.
inline std::string timedOutText(std::string_view stage, std::uint64_t sequence, int rank,
                                std::chrono::milliseconds timeout, std::string_view what) {
  return fmt::format("'{}' #{} timed out on rank {} after {}: {}", stage, sequence, rank,
                     formatSeconds(timeout), what);
}

// "'recycle' #1 timed out on rank 3: it arrived after ranks [0, 1] had left this collective
// (they gave up waiting)": a rank that entered a collective the others had already left.
inline std::string arrivedLateText(std::string_view stage, std::uint64_t sequence, int rank,
                                   const std::vector<int>& left, std::string_view why) {
  return fmt::format(
      "'{}' #{} timed out on rank {}: it arrived after ranks {} had left this collective ({})",
      stage, sequence, rank, collective::formatRankList(left), why);
}

// "rank 3 closed its connection in 'close validation' #27: it ended, exited or crashed": a
// peer lost during a collective, on every transport. `event` is what this rank saw of it (its
// connection closed, its end announced), `why` what is known of the cause and no more.
// `who` is "rank 3", or "a peer" where the transport cannot tell which.
inline std::string lostRankText(std::string_view who, std::string_view event,
                                std::string_view stage, std::uint64_t sequence,
                                std::string_view why) {
  return fmt::format("{} {} in '{}' #{}: {}", who, event, stage, sequence, why);
}
inline std::string lostRankText(int lost, std::string_view event, std::string_view stage,
                                std::uint64_t sequence, std::string_view why) {
  return lostRankText(fmt::format("rank {}", lost), event, stage, sequence, why);
}

// What a closed connection says of its peer: it ended (its program returned, possibly after
// an error it caught), exited or crashed; which, the connection cannot tell.
inline constexpr std::string_view kClosedConnection = "closed its connection";
inline constexpr std::string_view kClosedConnectionWhy = "it ended, exited or crashed";
// What a store's dead/<rank> key (or a thread world's markFailed) says of its rank: someone
// (the launcher, a peer watching its process or heartbeat) announced its end; `why` is their
// announcement, in their words.
inline constexpr std::string_view kAnnouncedDead = "was announced dead";

}  // namespace hmc::detail
