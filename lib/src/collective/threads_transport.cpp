#include "hmc/collective/threads_transport.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "envelope.hpp"
#include "hmc/error.hpp"
#include "wait_text.hpp"

namespace hmc::collective {
namespace {

class ThreadCollective final : public Collective {
 public:
  ThreadCollective(std::shared_ptr<ThreadWorld> world, int rank, std::chrono::milliseconds timeout)
      : Collective(rank, world->worldSize(), timeout), world_(std::move(world)) {}
  std::string_view transportName() const noexcept override { return "threads"; }

 protected:
  SharedPayloads gatherAgreed(std::uint64_t sequence, std::string_view stage, const Bytes& payload,
                              Clock::time_point deadline) override {
    return world_->gatherAgreed(rank(), sequence, stage, payload, deadline, timeout()).payloads;
  }
  Bytes gatherReduced(std::uint64_t sequence, std::string_view stage, const Bytes& payload,
                      Clock::time_point deadline, const Reducer& reduce) override {
    ThreadWorld::Gathered gathered = world_->gatherAgreed(
        rank(), sequence, stage, payload, deadline, timeout(), reduce ? &reduce : nullptr);
    if (gathered.reduced) return *gathered.reduced;
    // The completing rank passed no reduction (a rank called exchangeShared instead).
    return reduce ? reduce(*gathered.payloads) : Bytes();
  }
  // Unused (gatherAgreed above replaces the base path that calls it); kept correct: the
  // envelopes gathered as payloads of the same stage.
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override {
    return *world_->gatherAgreed(rank(), sequence, stage, envelope, deadline, timeout()).payloads;
  }

 private:
  std::shared_ptr<ThreadWorld> world_;
};

}  // namespace

std::shared_ptr<ThreadWorld> ThreadWorld::create(int worldSize) {
  if (worldSize < 1) {
    throw ValueError(fmt::format("a thread world needs at least one rank, got {}", worldSize));
  }
  return std::shared_ptr<ThreadWorld>(new ThreadWorld(worldSize));
}

ThreadWorld::ThreadWorld(int worldSize) : worldSize_(worldSize), failed_(worldSize) {}

std::unique_ptr<Collective> ThreadWorld::collective(int rank, std::chrono::milliseconds timeout) {
  return std::make_unique<ThreadCollective>(shared_from_this(), rank, timeout);
}

void ThreadWorld::markFailed(int rank, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_.at(rank)) ++failedCount_;
    failed_.at(rank) = reason;
  }
  changed_.notify_all();
}

ThreadWorld::Gathered ThreadWorld::gatherAgreed(int rank, std::uint64_t sequence,
                                                std::string_view stage, const Bytes& payload,
                                                Clock::time_point deadline,
                                                std::chrono::milliseconds timeout,
                                                const Reducer* reduce) {
  std::unique_lock<std::mutex> lock(mutex_);
  Slot& slot = slots_[sequence];
  if (slot.present.empty()) {
    slot.payloads.resize(worldSize_);
    slot.stages.resize(worldSize_);
    slot.present.resize(worldSize_, 0);
  }
  slot.payloads[rank] = payload;
  slot.stages[rank] = std::string(stage);
  slot.present[rank] = 1;
  // The completing rank checks agreement once for everyone and publishes the result. Waiters
  // need waking only then (or when the slot is abandoned, or a rank fails): waking all of them
  // on every arrival costs O(ranks^2) wake-ups per collective.
  if (++slot.arrived == worldSize_ && !slot.abandonedBy) {
    const bool agreed = std::all_of(slot.stages.begin(), slot.stages.end(),
                                    [&](const std::string& s) { return s == slot.stages[0]; });
    if (agreed) {
      slot.result = std::make_shared<const std::vector<Bytes>>(std::move(slot.payloads));
      if (reduce != nullptr) {
        try {
          slot.reduced = std::make_shared<const Bytes>((*reduce)(*slot.result));
        } catch (const std::exception& error) {
          slot.reduceError = error.what();
        }
      }
    } else {
      std::vector<detail::Envelope> envelopes(worldSize_);
      for (int peer = 0; peer < worldSize_; ++peer) {
        envelopes[peer].sequence = sequence;
        envelopes[peer].stage = slot.stages[peer];
      }
      slot.mismatch = detail::describeMismatch(sequence, envelopes);
    }
    changed_.notify_all();
  }

  auto missing = [&] {
    std::vector<int> ranks;
    for (int peer = 0; peer < worldSize_; ++peer) {
      if (!slot.present[peer]) ranks.push_back(peer);
    }
    return ranks;
  };
  auto deadPeer = [&]() -> std::optional<int> {
    if (failedCount_ == 0) return std::nullopt;
    for (int peer = 0; peer < worldSize_; ++peer) {
      if (!slot.present[peer] && failed_[peer]) return peer;
    }
    return std::nullopt;
  };
  auto leave = [&] {
    // An abandoned slot stays, so that ranks arriving late fail at once.
    if (++slot.departed == worldSize_) slots_.erase(sequence);
  };

  while (slot.abandonedBy || slot.arrived < worldSize_) {
    // A dead peer first: every rank of this collective then reports the same rank_failure,
    // whether it arrived before or after another rank gave up.
    if (auto dead = deadPeer()) {
      const std::string why = *failed_[*dead];
      slot.abandonedBy = rank;
      leave();
      throw RankFailure(hmc::detail::lostRankText(
          *dead, hmc::detail::kAnnouncedDead, stage, sequence,
          fmt::format("{}; {}", why, hmc::detail::notArrivedText(missing()))));
    }
    if (slot.abandonedBy) {
      const int by = *slot.abandonedBy;
      const std::vector<int> absent = missing();
      leave();
      const std::string gaveUp = fmt::format("rank {} gave up waiting first", by);
      if (absent.empty()) {
        throw TimeoutError(hmc::detail::arrivedLateText(stage, sequence, rank, {by}, gaveUp));
      }
      throw TimeoutError(hmc::detail::timedOutText(
          stage, sequence, rank, timeout,
          fmt::format("{} ({})", hmc::detail::notArrivedText(absent), gaveUp)));
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
        slot.arrived < worldSize_) {
      const std::vector<int> absent = missing();
      slot.abandonedBy = rank;
      leave();
      changed_.notify_all();
      throw TimeoutError(hmc::detail::timedOutText(stage, sequence, rank, timeout,
                                                   hmc::detail::notArrivedText(absent)));
    }
  }
  // Every rank sees the same stages, so every rank raises the same mismatch.
  if (slot.mismatch) {
    const std::string message = *slot.mismatch;
    leave();
    throw CollectiveMismatch(message);
  }
  if (slot.reduceError) {
    const std::string message = *slot.reduceError;
    leave();
    throw RuntimeError(fmt::format("'{}' #{}: the reduction failed: {}", stage, sequence, message));
  }
  Gathered result{slot.result, slot.reduced};
  leave();
  return result;
}

}  // namespace hmc::collective
