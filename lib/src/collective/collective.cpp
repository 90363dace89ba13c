#include "hmc/collective/collective.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "envelope.hpp"
#include "hmc/error.hpp"

namespace hmc::collective {
namespace detail {

// Envelope: u64 sequence | u32 stage length | stage | payload.
Bytes encodeEnvelope(std::uint64_t sequence, std::string_view stage, const Bytes& payload) {
  Bytes out;
  out.resize(12 + stage.size() + payload.size());
  std::memcpy(out.data(), &sequence, 8);
  const auto stageSize = static_cast<std::uint32_t>(stage.size());
  std::memcpy(out.data() + 8, &stageSize, 4);
  std::memcpy(out.data() + 12, stage.data(), stage.size());
  std::memcpy(out.data() + 12 + stage.size(), payload.data(), payload.size());
  return out;
}

Envelope decodeEnvelope(const Bytes& bytes, int fromRank) {
  Envelope env;
  std::uint32_t stageSize = 0;
  if (bytes.size() < 12) {
    throw RuntimeError(fmt::format("malformed collective envelope from rank {}", fromRank));
  }
  std::memcpy(&env.sequence, bytes.data(), 8);
  std::memcpy(&stageSize, bytes.data() + 8, 4);
  if (bytes.size() < 12 + static_cast<std::size_t>(stageSize)) {
    throw RuntimeError(fmt::format("malformed collective envelope from rank {}", fromRank));
  }
  env.stage = std::string_view(bytes.data() + 12, stageSize);
  env.payload = std::string_view(bytes.data() + 12 + stageSize, bytes.size() - 12 - stageSize);
  return env;
}

// "collective mismatch at #5: ranks [0] entered 'recycle' #5, ranks [1] entered 'close
// validation' #5; ..." grouping ranks by the collective they entered, in rank order.
std::string describeMismatch(std::uint64_t sequence, const std::vector<Envelope>& envelopes) {
  std::vector<std::pair<const Envelope*, std::vector<int>>> groups;
  for (int peer = 0; peer < static_cast<int>(envelopes.size()); ++peer) {
    const Envelope& env = envelopes[peer];
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& group) {
      return group.first->stage == env.stage && group.first->sequence == env.sequence;
    });
    if (it == groups.end()) {
      groups.push_back({&env, {peer}});
    } else {
      it->second.push_back(peer);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [env, ranks] : groups) {
    parts.push_back(
        fmt::format("ranks {} entered '{}' #{}", formatRankList(ranks), env->stage, env->sequence));
  }
  return fmt::format(
      "ranks entered different collectives at #{}: {}; every rank must run the same collectives "
      "in the same order",
      sequence, fmt::join(parts, ", "));
}

}  // namespace detail

namespace {

class ObserverScope {
 public:
  ObserverScope(CollectiveObserver* observer, std::uint64_t sequence, std::string_view stage,
                std::size_t bytes)
      : observer_(observer) {
    if (observer_ == nullptr) return;
    record_.sequence = sequence;
    record_.stage = std::string(stage);
    record_.payloadBytes = bytes;
    record_.start = Clock::now();
    observer_->onEnter(record_);
  }
  ~ObserverScope() {
    if (observer_ == nullptr) return;
    record_.end = Clock::now();
    observer_->onExit(record_);
  }
  void setStatus(CollectiveStatus status) noexcept { record_.status = status; }

 private:
  CollectiveObserver* observer_;
  CollectiveRecord record_;
};

CollectiveStatus statusOf(const std::exception& error) {
  switch (kindOf(error)) {
    case ErrorKind::kTimeout:
      return CollectiveStatus::kTimeout;
    case ErrorKind::kCollectiveMismatch:
      return CollectiveStatus::kMismatch;
    case ErrorKind::kRankFailure:
      return CollectiveStatus::kRankFailure;
    default:
      return CollectiveStatus::kError;
  }
}

}  // namespace

std::string formatRankList(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

std::chrono::milliseconds timeoutFromSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > kMaxTimeoutSeconds) {
    throw ValueError(
        fmt::format("a collective timeout must be a number of seconds in (0, {:g}], got {}",
                    kMaxTimeoutSeconds, seconds));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

Collective::Collective(int rank, int worldSize, std::chrono::milliseconds timeout)
    : rank_(rank), worldSize_(worldSize), timeout_(timeout) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    throw ValueError(fmt::format("invalid rank {} for a world of {} ranks", rank, worldSize));
  }
  setTimeout(timeout);
}

void Collective::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0 || timeout.count() > kMaxTimeoutSeconds * 1000.0) {
    throw ValueError(fmt::format("collective timeout must be in (0, {:g}] ms, got {} ms",
                                 kMaxTimeoutSeconds * 1000.0, timeout.count()));
  }
  timeout_ = timeout;
}

std::vector<Bytes> Collective::exchange(std::string_view stage, const Bytes& payload) {
  return *exchangeShared(stage, payload);
}

SharedPayloads Collective::exchangeShared(std::string_view stage, const Bytes& payload) {
  const std::uint64_t sequence = sequence_++;
  if (lastStage_ != stage) lastStage_.assign(stage);  // no allocation once it has grown
  ObserverScope scope(observer_, sequence, stage, payload.size());
  try {
    return gatherAgreed(sequence, stage, payload, Clock::now() + timeout_);
  } catch (const std::exception& error) {
    scope.setStatus(statusOf(error));
    throw;
  }
}

Bytes Collective::exchangeReduced(std::string_view stage, const Bytes& payload,
                                  const Reducer& reduce) {
  const std::uint64_t sequence = sequence_++;
  if (lastStage_ != stage) lastStage_.assign(stage);  // no allocation once it has grown
  ObserverScope scope(observer_, sequence, stage, payload.size());
  try {
    return gatherReduced(sequence, stage, payload, Clock::now() + timeout_, reduce);
  } catch (const std::exception& error) {
    scope.setStatus(statusOf(error));
    throw;
  }
}

Bytes Collective::gatherReduced(std::uint64_t sequence, std::string_view stage,
                                const Bytes& payload, Clock::time_point deadline,
                                const Reducer& reduce) {
  const SharedPayloads payloads = gatherAgreed(sequence, stage, payload, deadline);
  return reduce ? reduce(*payloads) : Bytes();
}

SharedPayloads Collective::gatherAgreed(std::uint64_t sequence, std::string_view stage,
                                        const Bytes& payload, Clock::time_point deadline) {
  const std::vector<Bytes> envelopes =
      gather(sequence, stage, detail::encodeEnvelope(sequence, stage, payload), deadline);
  std::vector<detail::Envelope> decoded;
  decoded.reserve(envelopes.size());
  bool agreed = true;
  for (int peer = 0; peer < static_cast<int>(envelopes.size()); ++peer) {
    decoded.push_back(detail::decodeEnvelope(envelopes[peer], peer));
    agreed = agreed && decoded.back().stage == stage && decoded.back().sequence == sequence;
  }
  // Every rank sees the same envelopes, so every rank raises the same mismatch.
  if (!agreed) throw CollectiveMismatch(detail::describeMismatch(sequence, decoded));
  auto out = std::make_shared<std::vector<Bytes>>();
  out->reserve(decoded.size());
  for (const detail::Envelope& env : decoded) out->emplace_back(env.payload);
  return out;
}

void Collective::collectiveCall(std::string_view stage, const std::function<void()>& fn) {
  exchangeShared(stage, Bytes());  // agree on the stage before the side effect
  std::optional<std::string> localError;
  try {
    fn();
  } catch (const std::exception& error) {
    localError = fmt::format("{}: {}", classNameOf(error), error.what());
  }
  const SharedPayloads shared = exchangeShared(stage, localError ? "1" + *localError : Bytes("0"));
  const std::vector<Bytes>& peers = *shared;
  std::vector<int> failed;
  const Bytes* firstError = nullptr;
  for (int peer = 0; peer < static_cast<int>(peers.size()); ++peer) {
    if (!peers[peer].empty() && peers[peer][0] == '1') {
      failed.push_back(peer);
      if (firstError == nullptr) firstError = &peers[peer];
    }
  }
  if (!failed.empty()) {
    throw RuntimeError(fmt::format("{} failed on ranks {}: {}", stage, formatRankList(failed),
                                   std::string_view(*firstError).substr(1)));
  }
}

void Collective::barrier(std::string_view stage) { exchangeShared(stage, Bytes()); }

LocalCollective::LocalCollective(std::chrono::milliseconds timeout) : Collective(0, 1, timeout) {}

std::vector<Bytes> LocalCollective::gather(std::uint64_t, std::string_view, const Bytes& envelope,
                                           Clock::time_point) {
  return {envelope};
}

}  // namespace hmc::collective
