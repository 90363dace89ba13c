#pragma once
// Internal: the envelope every collective's payload travels in (sequence, stage, payload), and
// the CollectiveMismatch text, shared by Collective and the threads transport.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/collective/collective.hpp"

namespace hmc::collective::detail {

struct Envelope {
  std::uint64_t sequence = 0;
  std::string_view stage;
  std::string_view payload;  // views into the encoded bytes
};

Bytes encodeEnvelope(std::uint64_t sequence, std::string_view stage, const Bytes& payload);
// Throws RuntimeError naming `fromRank` when the bytes are too short.
Envelope decodeEnvelope(const Bytes& bytes, int fromRank);

// "ranks entered different collectives at #5: ranks [0] entered 'recycle' #5, ranks [1]
// entered 'close validation' #5; ...": ranks grouped by the collective they entered.
std::string describeMismatch(std::uint64_t sequence, const std::vector<Envelope>& envelopes);

}  // namespace hmc::collective::detail
