#pragma once
// Runs a function on N thread ranks over the `threads` transport and collects what each
// rank threw, so that assertions run on the test's own thread.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/threads_transport.hpp"
#include "hmc/error.hpp"

namespace hmc::testing {

struct RankOutcome {
  std::exception_ptr error;

  bool ok() const { return error == nullptr; }
  // The message of the error, "" when none.
  std::string message() const {
    if (!error) return "";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  // The report kind of the error ("" when none).
  std::string kind() const {
    if (!error) return "";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return std::string(toString(kindOf(e)));
    }
  }
};

using RankFn = std::function<void(int rank, std::shared_ptr<collective::Collective> collective)>;

inline std::vector<RankOutcome> runThreadRanks(
    int worldSize, const RankFn& fn,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  auto world = collective::ThreadWorld::create(worldSize);
  std::vector<RankOutcome> outcomes(worldSize);
  std::vector<std::thread> threads;
  threads.reserve(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::shared_ptr<collective::Collective> collective = world->collective(rank, timeout);
        fn(rank, collective);
      } catch (...) {
        outcomes[rank].error = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcomes;
}

}  // namespace hmc::testing
