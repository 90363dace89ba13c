// One wording of each collective failure on every transport: the same timeout, mismatch and
// lost rank on the threads, tcp and store transports (ranks as threads of this process, one
// store on a held port) read the same, apart from what only one transport can know of a lost
// rank's cause.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/tcp_transport.hpp"
#include "hmc/collective/threads_transport.hpp"
#include "hmc/error.hpp"

using namespace std::chrono_literals;
using hmc::collective::Collective;

namespace {

const std::vector<std::string> kTransports = {"threads", "tcp", "store"};

// The deadline of the collectives that time out here; forming a world gets longer.
constexpr auto kDeadline = 500ms;
constexpr auto kLong = std::chrono::milliseconds(20s);

// Counts ranks that are done with their collective; a rank that must stay (its connections
// open) waits here until the others are.
class Gate {
 public:
  void done() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++done_;
    }
    changed_.notify_all();
  }
  void awaitDone(int count) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int done_ = 0;
};

// What rank r of a world sees: its collective, the thread world (threads transport only), the
// tcp or store transport's store (to announce a death), and the gate.
struct RankContext {
  int rank = 0;
  Collective* collective = nullptr;
  hmc::collective::ThreadWorld* threads = nullptr;
  std::function<std::shared_ptr<hmc::collective::KeyValueStore>()> keyValueStore;
  Gate* gate = nullptr;
};

// Rank r's collective on `transport`, formed under kLong.
std::unique_ptr<Collective> joinRank(const std::string& transport, int rank, int world, int port,
                                     hmc::collective::ThreadWorld& threads) {
  if (transport == "threads") return threads.collective(rank, kLong);
  hmc::collective::StoreTransportOptions store;
  store.port = port;
  store.rank = rank;
  store.worldSize = world;
  store.timeout = kLong;
  if (transport == "store") return std::make_unique<hmc::collective::StoreTransport>(store);
  hmc::collective::TcpTransportOptions tcp;
  tcp.store = store;
  return std::make_unique<hmc::collective::TcpTransport>(tcp);
}

// Runs `body` on each rank of a `world`-rank world of `transport`; returns what each rank
// raised as "kind: message", or "ok".
std::vector<std::string> runWorld(const std::string& transport, int world,
                                  const std::function<void(RankContext&)>& body) {
  const auto held = hmc::collective::PortReservation::loopback();
  auto threads = hmc::collective::ThreadWorld::create(world);
  Gate gate;
  std::vector<std::string> out(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        std::unique_ptr<Collective> collective =
            joinRank(transport, rank, world, held.port(), *threads);
        RankContext context;
        context.rank = rank;
        context.collective = collective.get();
        context.threads = threads.get();
        context.gate = &gate;
        context.keyValueStore = [&collective]() -> std::shared_ptr<hmc::collective::KeyValueStore> {
          if (auto* store = dynamic_cast<hmc::collective::StoreTransport*>(collective.get())) {
            return store->keyValueStore();
          }
          if (auto* tcp = dynamic_cast<hmc::collective::TcpTransport*>(collective.get())) {
            return tcp->keyValueStore();
          }
          return nullptr;
        };
        body(context);
        out[rank] = "ok";
      } catch (const std::exception& error) {
        out[rank] = std::string(hmc::toString(hmc::kindOf(error))) + ": " + error.what();
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  return out;
}

// The text with every rank number and rank list replaced: "rank N", "[N]".
std::string maskRanks(const std::string& text) {
  static const std::regex kRank(R"(rank \d+)");
  static const std::regex kList(R"(\[[0-9, ]*\])");
  return std::regex_replace(std::regex_replace(text, kRank, "rank N"), kList, "[N]");
}

}  // namespace

TEST_SUITE("failure text") {
  TEST_CASE("a timeout reads the same on every transport, apart from the rank numbers") {
    std::vector<std::string> masked;
    for (const auto& transport : kTransports) {
      for (int skipper : {1, 0}) {
        CAPTURE(transport);
        CAPTURE(skipper);
        const int waiter = 1 - skipper;
        const auto seen = runWorld(transport, 2, [&](RankContext& rank) {
          rank.collective->setTimeout(kDeadline);
          if (rank.rank == skipper) {
            rank.gate->awaitDone(1);  // its connections stay open until the waiter timed out
            return;
          }
          try {
            rank.collective->exchange("close validation", "");
          } catch (...) {
            rank.gate->done();
            throw;
          }
          rank.gate->done();
        });
        CHECK(seen[skipper] == "ok");
        if (skipper == 1) {
          CHECK(seen[waiter] ==
                "timeout: 'close validation' #0 timed out on rank 0 after 0.5 s: ranks [1] did "
                "not arrive");
        }
        masked.push_back(maskRanks(seen[waiter]));
      }
    }
    for (const auto& text : masked) {
      CHECK(text ==
            "timeout: 'close validation' #0 timed out on rank N after 0.5 s: ranks [N] did not "
            "arrive");
    }
  }

  TEST_CASE("a mismatch reads the same on every transport") {
    for (const auto& transport : kTransports) {
      CAPTURE(transport);
      const auto seen = runWorld(transport, 2, [&](RankContext& rank) {
        rank.collective->exchange(rank.rank == 0 ? "recycle" : "close validation", "");
      });
      for (const auto& text : seen) {
        CHECK(text ==
              "collective_mismatch: ranks entered different collectives at #0: ranks [0] "
              "entered 'recycle' #0, ranks [1] entered 'close validation' #0; every rank must "
              "run the same collectives in the same order");
      }
    }
  }

  TEST_CASE("a lost rank reads 'rank R <what this rank saw> in <collective>: <why>' everywhere") {
    // Each transport learns of the loss its own way and says what it knows, no more: an
    // announcement (the store's dead/<rank> key, a thread world's mark) in its author's words,
    // or a closed connection, which cannot tell a rank that ended from one that crashed.
    const std::string announced =
        "rank_failure: rank 1 was announced dead in 'close validation' #0: rank 1 exited with "
        "status 17; ranks [1] did not arrive";
    const std::vector<std::pair<std::string, std::string>> expected = {
        {"threads", announced},
        {"store", announced},
        {"tcp",
         "rank_failure: rank 1 closed its connection in 'close validation' #0: it ended, exited "
         "or crashed"}};
    for (const auto& [transport, text] : expected) {
      CAPTURE(transport);
      const auto seen = runWorld(transport, 2, [&](RankContext& rank) {
        if (rank.rank == 0) {
          rank.collective->exchange("close validation", "");
          return;
        }
        const std::string why = "rank 1 exited with status 17";
        if (transport == "threads") rank.threads->markFailed(1, why);
        if (transport == "store") {
          hmc::collective::announceDeadRank(*rank.keyValueStore(), 1, why);
        }
        // tcp: this rank's transport closes its connections as the body returns.
      });
      CHECK(seen[0] == text);
      CHECK(seen[1] == "ok");
    }
  }
}
