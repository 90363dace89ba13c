// One rank of a process-based transport test: `hmc_transport_peer TRANSPORT RANK WORLD PORT
// TIMEOUT_MS SCENARIO [JOIN_TIMEOUT_MS]`. Prints one line "RESULT <kind> <message>" to stdout
// (kind "ok" or the error's report kind) and exits 0; the test process asserts on these lines.
// Under the test's start gate (HMC_TEST_GATE, support/process_ranks.hpp) it waits there first.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/tcp_transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/lifecycle/resource_manager.hpp"
#include "hmc/resources/host_resources.hpp"
#include "support/process_ranks.hpp"
#if HMC_HAVE_GLOO
#include "hmc/collective/gloo_transport.hpp"
#endif

using namespace std::chrono_literals;
using hmc::collective::Bytes;
using hmc::collective::Collective;

namespace {

struct Args {
  std::string transport;
  int rank = 0;
  int world = 1;
  int port = 0;
  std::chrono::milliseconds timeout{0};
  std::string scenario;
  std::optional<std::chrono::milliseconds> joinTimeout;  // unset: the transports' default
};

// The store options of this rank's control store (the transport's own for gloo alone).
hmc::collective::StoreTransportOptions storeOptions(const Args& args) {
  hmc::collective::StoreTransportOptions options;
  options.port = args.port;
  options.rank = args.rank;
  options.worldSize = args.world;
  options.timeout = args.timeout;
  options.joinTimeout = args.joinTimeout;
  return options;
}

std::shared_ptr<Collective> connect(const Args& args) {
  const auto transport = hmc::collective::transportFromString(args.transport);
  if (!transport) throw hmc::ValueError("unknown transport " + args.transport);
  hmc::collective::TransportOptions options;
  options.rank = args.rank;
  options.worldSize = args.world;
  options.masterPort = args.port;
  options.timeout = args.timeout;
  options.joinTimeout = args.joinTimeout;
  options.glooControlStore = false;  // the transport under test alone, on the test's port
  return hmc::collective::makeTransport(*transport, options).collective;
}

// Waits (bounded by the join timeout) until every other rank has joined the world and waits in
// its construction for this one, then past the collective deadline: this rank provably joins
// later than a collective would have waited for it.
void joinLate(const Args& args) {
  auto options = storeOptions(args);
  options.isServer = false;
  // GlooTransport's own store namespaces its keys under "<prefix>/gloo".
  if (args.transport == "gloo") options.prefix = "hmc/gloo";
  const auto kv = hmc::collective::connectKeyValueStore(options);
  const auto until = std::chrono::steady_clock::now() + options.joinBound();
  while (kv->add(hmc::collective::kJoinedCountKey, 0) < args.world - 1) {
    if (std::chrono::steady_clock::now() >= until) {
      throw std::logic_error("peer check failed: the other ranks did not join");
    }
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(2 * args.timeout);
}

void expect(bool condition, const std::string& what) {
  if (!condition) throw std::logic_error("peer check failed: " + what);
}

Bytes patterned(int rank, std::size_t size) {
  Bytes out(size, '\0');
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 31 + rank * 7) & 0xff);
  return out;
}

void exchangeScenario(Collective& c) {
  const int world = c.worldSize();
  auto check = [&](const std::vector<Bytes>& got, auto expected, const std::string& what) {
    expect(static_cast<int>(got.size()) == world, what + ": size");
    for (int peer = 0; peer < world; ++peer) {
      expect(got[peer] == expected(peer), what + ": payload of rank " + std::to_string(peer));
    }
  };
  for (int round = 0; round < 20; ++round) {
    check(
        c.exchange("small", "rank-" + std::to_string(c.rank()) + "-" + std::to_string(round)),
        [&](int peer) { return "rank-" + std::to_string(peer) + "-" + std::to_string(round); },
        "small");
  }
  check(
      c.exchange("empty", Bytes()), [](int) { return Bytes(); }, "empty");
  check(
      c.exchange("large", patterned(c.rank(), 1 << 20)),
      [](int peer) { return patterned(peer, 1 << 20); }, "1 MiB");
  // Sizes differing per rank, only some above gloo's slot.
  check(
      c.exchange("mixed", patterned(c.rank(), c.rank() % 2 ? 5000 : 3)),
      [](int peer) { return patterned(peer, peer % 2 ? 5000 : 3); }, "mixed");
  c.barrier();
}

// Two ranks recycle and close through the manager (tests/lifecycle's scenario, as processes).
void lifecycleScenario(std::shared_ptr<Collective> collective) {
  using hmc::lifecycle::ResourceManager;
  using hmc::resources::HostWorkspace;
  using nlohmann::json;
  std::shared_ptr<Collective> shared = std::move(collective);
  auto manager = std::make_shared<ResourceManager>(shared);
  auto resources = std::make_shared<hmc::resources::RankResources>();
  const hmc::lifecycle::Binding binding{"cpu", "float32"};
  auto bind = [&](hmc::lifecycle::GroupPtr group) {
    group->moduleType = "ScratchLinear";
    manager->registerAutomaticCleanup();
    manager->recycle(*group, binding, json::array({"ScratchLinear", "torch.float32"}));
    if (group->resources) return true;
    group->resources = std::make_shared<HostWorkspace>("scratch_linear", 64, "float32", resources);
    group->binding = binding;
    group->bindingId = manager->nextBindingId();
    if (!manager->runtimeRelease()) manager->setRuntimeRelease(resources->createRuntime());
    return false;
  };
  auto [a, tokenA] = manager->createGroup(json{{"spec", "k"}}, "k", "default");
  expect(!bind(a), "first binding creates");
  auto* first = a->resources.get();
  manager->retire(a->identifier, tokenA);
  auto [b, tokenB] = manager->createGroup(json{{"spec", "k"}}, "k", "default");
  expect(bind(b), "compatible module reuses");
  expect(b->resources.get() == first, "same workspace");
  expect(a->closed, "orphan closed");
  manager->retire(b->identifier, tokenB);
  auto [c, tokenC] = manager->createGroup(json{{"spec", "k2"}}, "k2", "default");
  expect(!bind(c), "incompatible module creates");
  expect(b->closed && b->resources == nullptr, "incompatible orphan closed collectively");
  manager->closeGroups();
  expect(resources->liveRuntime() == nullptr, "runtime released");
  expect(resources->accounting().bytesHeld() == 0, "no bytes held");
  expect(resources->accounting().workspacesClosed == 2, "two workspaces closed");
  (void)tokenC;
}

// Many exchanges through a store transport whose key names come round every 3 exchanges (the
// fewest allowed), ranks out of step by random sleeps: a name reused too early would hand a
// peer the previous value, or a late delete would remove the new one (a hang).
void ringScenario(const Args& args) {
  hmc::collective::StoreTransportOptions options;
  options.port = args.port;
  options.rank = args.rank;
  options.worldSize = args.world;
  options.timeout = args.timeout;
  options.keySlots = 3;
  hmc::collective::StoreTransport c(options);
  std::srand(static_cast<unsigned>(::getpid()));
  for (int round = 0; round < 1000; ++round) {
    if (std::rand() % 4 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::rand() % 3000));
    }
    const auto payload = [&](int peer) {
      return Bytes(static_cast<std::size_t>(1 + (round * 7 + peer) % 50),
                   static_cast<char>('a' + (round + peer) % 26));
    };
    const std::vector<Bytes> got = c.exchange("ring", payload(c.rank()));
    for (int peer = 0; peer < args.world; ++peer) {
      expect(got[peer] == payload(peer),
             "round " + std::to_string(round) + ": payload of rank " + std::to_string(peer));
    }
  }
  c.barrier();
}

// The last rank joins the control store with the others, then sets up the tcp transport past
// the collective deadline ("late-setup"), or never ("no-setup": it leaves at once).
void tcpSetupScenario(const Args& args) {
  auto control = std::make_shared<hmc::collective::StoreTransport>(storeOptions(args));
  const bool last = args.rank == args.world - 1;
  if (last && args.scenario == "no-setup") return;
  if (last) std::this_thread::sleep_for(2 * args.timeout);
  hmc::collective::TcpTransportOptions options;
  options.control = control;
  hmc::collective::TcpTransport tcp(options);
  expect(tcp.exchange("first", std::to_string(args.rank)).size() ==
             static_cast<std::size_t>(args.world),
         "first exchange");
}

// The last rank of "skip" and "tcp-broken": alive (and out of every collective) until every
// other rank has exited. By hand, without the test's gate: the deadline and a margin.
void outliveTheOthers(const Args& args) {
  if (hmc::testing::gateFolder() == nullptr) {
    std::this_thread::sleep_for(args.timeout + 3s);
    return;
  }
  for (int rank = 0; rank < args.world - 1; ++rank) {
    expect(hmc::testing::gateAwaitExitOf(rank, args.timeout + 5min),
           "rank " + std::to_string(rank) + " exited");
  }
}

void run(const Args& args) {
  if (args.scenario == "ring") return ringScenario(args);
  if (args.scenario == "late-setup" || args.scenario == "no-setup") return tcpSetupScenario(args);
  if (args.scenario == "late" && args.rank == args.world - 1) joinLate(args);
  auto collective = connect(args);
  Collective& c = *collective;
  const int last = args.world - 1;
  if (args.scenario == "exchange") {
    exchangeScenario(c);
  } else if (args.scenario == "mismatch") {
    c.exchange(c.rank() == 0 ? "recycle" : "close validation", "x");
  } else if (args.scenario == "call-failure") {
    c.collectiveCall("close", [&] {
      if (c.rank() == 1 || c.rank() == last) {
        throw hmc::RuntimeError("boom on rank " + std::to_string(c.rank()));
      }
    });
  } else if (args.scenario == "skip") {
    c.barrier("warmup");
    if (c.rank() == last) {
      // Alive but never enters, until the others have timed out and exited (had it exited
      // first, a peer still waiting could see its connection close: a rank failure).
      outliveTheOthers(args);
      return;
    }
    c.exchange("recycle", "x");
  } else if (args.scenario == "arrive-late") {
    // The last rank enters 'recycle' once every other rank has given up on it (their marks);
    // they stay alive (rank 0 hosts the store) until it has exited.
    c.barrier("warmup");
    if (c.rank() == last) {
      for (int rank = 0; rank < last; ++rank) {
        expect(hmc::testing::gateAwait([&] {
                 return hmc::testing::gateFileExists("gave-up." + std::to_string(rank));
               }),
               "rank " + std::to_string(rank) + " gave up");
      }
      c.exchange("recycle", "x");
      return;
    }
    try {
      c.exchange("recycle", "x");
    } catch (const hmc::TimeoutError&) {
      expect(hmc::testing::gateMark("gave-up." + std::to_string(c.rank())), "gave-up mark written");
      expect(hmc::testing::gateAwaitExitOf(last, args.timeout + 5min), "the last rank exited");
      throw;
    }
  } else if (args.scenario == "crash") {
    c.barrier("warmup");
    if (c.rank() == last) {
      std::fflush(stdout);
      ::_exit(7);
    }
    c.exchange("recycle", "x");
  } else if (args.scenario == "tcp-broken") {
    // The last rank skips 'recycle': the others time out, then find the transport broken.
    c.barrier("warmup");
    if (c.rank() == last) {
      outliveTheOthers(args);
      return;
    }
    try {
      c.exchange("recycle", "x");
    } catch (const hmc::TimeoutError&) {
      c.exchange("again", "y");
    }
    throw std::logic_error("peer check failed: the exchange after a timeout did not throw");
  } else if (args.scenario == "closed-peers") {
    // The last rank exits once the others probed (nobody closed yet); they then wait, outside
    // any collective, for the probe to name it, and only it.
    c.barrier("warmup");
    const auto probe = c.closedPeers();
    expect(probe != nullptr, "the transport has a closed-peers probe");
    if (c.rank() == last) {
      expect(hmc::testing::gateAwait([&] {
               for (int rank = 0; rank < last; ++rank) {
                 if (!hmc::testing::gateFileExists("probed." + std::to_string(rank))) return false;
               }
               return true;
             }),
             "every other rank probed");
      std::fflush(stdout);
      ::_exit(7);
    }
    expect(probe().empty(), "no closed peer while every rank lives");
    expect(hmc::testing::gateMark("probed." + std::to_string(c.rank())), "probed mark written");
    expect(hmc::testing::gateAwaitExitOf(last), "the last rank exited");
    // The others stay until every rank has looked (a rank that leaves closes its connections).
    const auto seen = [&](const std::vector<int>& closed) {
      return std::find(closed.begin(), closed.end(), last) != closed.end();
    };
    expect(hmc::testing::gateAwait([&] { return seen(probe()); }),
           "the probe names the exited rank");
    expect(probe() == std::vector<int>{last}, "the probe names only the exited rank");
    expect(hmc::testing::gateMark("saw." + std::to_string(c.rank())), "saw mark written");
    expect(hmc::testing::gateAwait([&] {
             for (int rank = 0; rank < last; ++rank) {
               if (!hmc::testing::gateFileExists("saw." + std::to_string(rank))) return false;
             }
             return true;
           }),
           "every other rank saw it");
    if (c.rank() != 0) {  // rank 0's store would wait for the exited rank's goodbye
      collective.reset();
      expect(probe().empty(), "a probe outliving its transport answers nothing");
    }
  } else if (args.scenario == "server-gone") {
    c.barrier("warmup");
    // Rank 0 (the store's host) exits once every other rank has finished reading the warmup;
    // they ask for 'recycle' once it is gone.
    if (hmc::testing::gateFolder() == nullptr) {  // by hand, without the test's gate
      if (c.rank() == 0) {
        std::this_thread::sleep_for(300ms);
        ::_exit(0);
      }
      std::this_thread::sleep_for(600ms);
    } else if (c.rank() == 0) {
      expect(hmc::testing::gateAwait([&] {
               for (int rank = 1; rank < args.world; ++rank) {
                 if (!hmc::testing::gateFileExists("warm." + std::to_string(rank))) return false;
               }
               return true;
             }),
             "every rank finished the warmup");
      std::fflush(stdout);
      ::_exit(0);
    } else {
      expect(hmc::testing::gateMark("warm." + std::to_string(c.rank())), "warm mark written");
      expect(hmc::testing::gateAwaitExitOf(0), "rank 0 exited");
    }
    c.exchange("recycle", "x");
  } else if (args.scenario == "late" || args.scenario == "absent") {
    // "absent": a world whose last rank never starts; construction has failed before here.
    for (int round = 0; round < 3; ++round) {
      const auto got = c.exchange("first", "rank-" + std::to_string(c.rank()));
      for (int peer = 0; peer < args.world; ++peer) {
        expect(got[peer] == "rank-" + std::to_string(peer),
               "payload of rank " + std::to_string(peer));
      }
    }
  } else if (args.scenario == "lifecycle") {
    lifecycleScenario(std::move(collective));
  } else {
    throw hmc::ValueError("unknown scenario " + args.scenario);
  }
}

std::string oneLine(std::string text) {
  for (char& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return text;
}

int rankMain(int argc, char** argv) {
  // As hmc-run's rank processes do (app/main.cpp): a write to the socket of a peer that has
  // exited is an error the transport reports, not a signal that ends this process (gloo
  // writes without MSG_NOSIGNAL). Once in 14+ runs of gloo "server-gone" under load, rank 1
  // ended by a signal, without a RESULT line, 0.4 s after the go: SIGPIPE is the likely one.
  std::signal(SIGPIPE, SIG_IGN);
  if (argc != 7 && argc != 8) {
    std::fprintf(stderr,
                 "usage: %s TRANSPORT RANK WORLD PORT TIMEOUT_MS SCENARIO [JOIN_TIMEOUT_MS]\n",
                 argv[0]);
    return 2;
  }
  Args args{argv[1],
            std::atoi(argv[2]),
            std::atoi(argv[3]),
            std::atoi(argv[4]),
            std::chrono::milliseconds(std::atoi(argv[5])),
            argv[6],
            std::nullopt};
  if (argc == 8) args.joinTimeout = std::chrono::milliseconds(std::atoi(argv[7]));
  std::string kind = "ok";
  std::string message;
  // Started with the test's start gate: up to here is process start-up (LibTorch loaded); the
  // scenario, connecting included, begins at the go, when every rank is this far.
  if (!hmc::testing::gateWait(args.rank)) {
    std::printf("RESULT gate no go from the test at the start gate\n");
    std::fflush(stdout);
    return 0;
  }
  try {
    run(args);
  } catch (const std::exception& error) {
    kind = std::string(hmc::toString(hmc::kindOf(error)));
    message = error.what();
  }
  std::printf("RESULT %s %s\n", kind.c_str(), oneLine(message).c_str());
  std::fflush(stdout);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  // Started by the test's runProcessRanks: one process per world, which forks the ranks
  // (support/process_ranks.hpp); by hand, one rank.
  if (argc > 1 && std::string(argv[1]) == hmc::testing::kForkRanks) {
    return hmc::testing::forkRanksMain(argc, argv, rankMain);
  }
  return rankMain(argc, argv);
}
