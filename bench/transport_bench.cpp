// Exchange latency of the transports beside a raw loopback TCP ping-pong measured in the same
// run: threads (2, 4, 8 ranks in this process), store, tcp and gloo (2 and 4 processes: this
// process is rank 0, the others are this program re-executed with --peer), 64-byte payloads.
//
//   transport_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// The heartbeat's cost (issue 9): BM_TcpExchangeRecorded and BM_StoreExchangeRecorded run
// every rank as hmc-run's rank processes do, with a FlightRecorder attached; the
// *Heartbeat variants add each rank's Watchdog (diagnostics/watchdog.hpp: heartbeats every
// 100 ms at most, its own store connection). Compare them in one run, interleaved:
//   transport_bench --benchmark_filter='Recorded|Heartbeat' --benchmark_repetitions=10
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// Rank 0 drives the iterations; its payload tells the peers whether to go on ("go"/"stop").

#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/tcp_transport.hpp"
#include "hmc/collective/threads_transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/config.hpp"
#include "hmc/diagnostics/flight_recorder.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#if HMC_HAVE_GLOO
#include "hmc/collective/gloo_transport.hpp"
#endif

using namespace std::chrono_literals;
using hmc::collective::Bytes;
using hmc::collective::Collective;

namespace {

constexpr std::size_t kPayload = 64;
constexpr auto kTimeout = 60s;

pid_t spawnSelf(std::vector<std::string> args) {
  args.insert(args.begin(), "/proc/self/exe");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits up to `bound` for `pid`, then kills it; always reaps.
void reap(pid_t pid, std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(1ms);
  }
}

std::shared_ptr<Collective> connect(const std::string& transport, int rank, int world, int port,
                                    int glooThreads) {
  hmc::collective::TransportOptions options;
  options.rank = rank;
  options.worldSize = world;
  options.masterPort = port;
  options.timeout = kTimeout;
  options.glooThreads = glooThreads;
  options.glooControlStore = false;  // one transport on one port
  return hmc::collective::makeTransport(*hmc::collective::transportFromString(transport), options)
      .collective;
}

// What each rank runs beside its exchanges: nothing (plain), a FlightRecorder attached as in
// hmc-run's rank processes (recorded), or that and a Watchdog writing heartbeats (heartbeat).
struct Diagnostics {
  std::shared_ptr<hmc::diagnostics::FlightRecorder> recorder;
  std::unique_ptr<hmc::diagnostics::Watchdog> watchdog;

  Diagnostics(Collective& collective, const std::string& mode, int rank, int world, int port) {
    if (mode == "plain") return;
    recorder = std::make_shared<hmc::diagnostics::FlightRecorder>();
    collective.setObserver(recorder.get());
    if (mode != "heartbeat") return;
    hmc::collective::StoreTransportOptions store;
    store.port = port;
    store.rank = rank;
    store.worldSize = world;
    store.timeout = kTimeout;
    hmc::diagnostics::WatchdogOptions options;
    options.rank = rank;
    options.deadline = kTimeout;
    watchdog = std::make_unique<hmc::diagnostics::Watchdog>(
        recorder, hmc::collective::connectKeyValueStore(store), options);
  }
};

// Peer side: exchange until rank 0 says stop.
int runPeer(const std::string& transport, int rank, int world, int port, int glooThreads,
            const std::string& mode) {
  auto collective = connect(transport, rank, world, port, glooThreads);
  Diagnostics diagnostics(*collective, mode, rank, world, port);
  const Bytes payload(kPayload, 'p');
  while (collective->exchange("bench", payload)[0].rfind("stop", 0) != 0) {
  }
  if (diagnostics.watchdog) {
    std::fprintf(stderr, "# rank %d wrote %zu heartbeats\n", rank,
                 diagnostics.watchdog->heartbeats());
  }
  diagnostics.watchdog.reset();  // its last heartbeat, while rank 0's store is still up
  return 0;
}

// Echo side of the TCP ping-pong.
int runEcho(int port) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 1;
  ::listen(listener, 1);
  const int fd = ::accept(listener, nullptr, nullptr);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char buffer[kPayload];
  for (;;) {
    std::size_t got = 0;
    while (got < kPayload) {
      const ssize_t n = ::recv(fd, buffer + got, kPayload - got, 0);
      if (n <= 0) return 0;
      got += static_cast<std::size_t>(n);
    }
    if (::send(fd, buffer, kPayload, MSG_NOSIGNAL) != static_cast<ssize_t>(kPayload)) return 0;
  }
}

// A process world kept for the whole run (setting one up costs far more than an exchange).
struct ProcessWorld {
  std::shared_ptr<Collective> rank0;
  std::unique_ptr<Diagnostics> diagnostics;
  std::vector<pid_t> peers;

  ~ProcessWorld() {
    try {
      rank0->exchange("bench", "stop");
    } catch (const std::exception& error) {
      std::fprintf(stderr, "# stopping peers failed: %s\n", error.what());
    }
    diagnostics.reset();
    rank0.reset();
    for (pid_t pid : peers) reap(pid, 10s);
  }
};

std::map<std::string, std::unique_ptr<ProcessWorld>>& worlds() {
  static std::map<std::string, std::unique_ptr<ProcessWorld>> cache;
  return cache;
}

ProcessWorld& processWorld(const std::string& transport, int world, int glooThreads = 1,
                           const std::string& mode = "plain") {
  const std::string key =
      transport + "/" + std::to_string(world) + "/" + std::to_string(glooThreads) + "/" + mode;
  auto& slot = worlds()[key];
  if (!slot) {
    // Held until rank 0 (this process) has its store up on it.
    const auto held = hmc::collective::PortReservation::loopback();
    const int port = held.port();
    auto created = std::make_unique<ProcessWorld>();
    for (int rank = 1; rank < world; ++rank) {
      created->peers.push_back(
          spawnSelf({"--peer", transport, std::to_string(rank), std::to_string(world),
                     std::to_string(port), std::to_string(glooThreads), mode}));
    }
    created->rank0 = connect(transport, 0, world, port, glooThreads);
    created->diagnostics = std::make_unique<Diagnostics>(*created->rank0, mode, 0, world, port);
    slot = std::move(created);
  }
  return *slot;
}

void exchangeLoop(benchmark::State& state, Collective& collective) {
  const Bytes payload = "go" + Bytes(kPayload - 2, 'x');
  for (auto _ : state) {
    benchmark::DoNotOptimize(collective.exchange("bench", payload));
  }
  state.counters["ranks"] = collective.worldSize();
}

void BM_TcpPingPong(benchmark::State& state) {
  const auto held = hmc::collective::PortReservation::loopback();  // the echo: SO_REUSEADDR
  const int port = held.port();
  const pid_t echo = spawnSelf({"--echo", std::to_string(port)});
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  const auto giveUp = std::chrono::steady_clock::now() + 10s;
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (std::chrono::steady_clock::now() > giveUp) {
      state.SkipWithError("the echo process did not listen");
      reap(echo, 1s);
      return;
    }
    std::this_thread::sleep_for(1ms);
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char buffer[kPayload] = {};
  for (auto _ : state) {
    ::send(fd, buffer, kPayload, MSG_NOSIGNAL);
    std::size_t got = 0;
    while (got < kPayload) {
      const ssize_t n = ::recv(fd, buffer + got, kPayload - got, 0);
      if (n <= 0) {
        state.SkipWithError("the echo process closed the connection");
        break;
      }
      got += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  reap(echo, 5s);
}
BENCHMARK(BM_TcpPingPong)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_ThreadsExchange(benchmark::State& state) {
  const int world = static_cast<int>(state.range(0));
  auto threadWorld = hmc::collective::ThreadWorld::create(world);
  std::vector<std::thread> peers;
  for (int rank = 1; rank < world; ++rank) {
    peers.emplace_back([threadWorld, rank] {
      auto collective = threadWorld->collective(rank, kTimeout);
      const Bytes payload(kPayload, 'p');
      while (collective->exchange("bench", payload)[0].rfind("stop", 0) != 0) {
      }
    });
  }
  auto rank0 = threadWorld->collective(0, kTimeout);
  exchangeLoop(state, *rank0);
  rank0->exchange("bench", "stop");
  for (auto& peer : peers) peer.join();
}
BENCHMARK(BM_ThreadsExchange)->Arg(2)->Arg(4)->Arg(8)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_StoreExchange(benchmark::State& state) {
  exchangeLoop(state, *processWorld("store", static_cast<int>(state.range(0))).rank0);
}
BENCHMARK(BM_StoreExchange)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_TcpExchange(benchmark::State& state) {
  exchangeLoop(state, *processWorld("tcp", static_cast<int>(state.range(0))).rank0);
}
BENCHMARK(BM_TcpExchange)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_TcpExchangeRecorded(benchmark::State& state) {
  exchangeLoop(state, *processWorld("tcp", static_cast<int>(state.range(0)), 1, "recorded").rank0);
}
BENCHMARK(BM_TcpExchangeRecorded)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_TcpExchangeHeartbeat(benchmark::State& state) {
  auto& world = processWorld("tcp", static_cast<int>(state.range(0)), 1, "heartbeat");
  exchangeLoop(state, *world.rank0);
  state.counters["heartbeats_rank0"] =
      static_cast<double>(world.diagnostics->watchdog->heartbeats());
}
BENCHMARK(BM_TcpExchangeHeartbeat)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_StoreExchangeRecorded(benchmark::State& state) {
  exchangeLoop(state,
               *processWorld("store", static_cast<int>(state.range(0)), 1, "recorded").rank0);
}
BENCHMARK(BM_StoreExchangeRecorded)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_StoreExchangeHeartbeat(benchmark::State& state) {
  auto& world = processWorld("store", static_cast<int>(state.range(0)), 1, "heartbeat");
  exchangeLoop(state, *world.rank0);
  state.counters["heartbeats_rank0"] =
      static_cast<double>(world.diagnostics->watchdog->heartbeats());
}
BENCHMARK(BM_StoreExchangeHeartbeat)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMicrosecond);

#if HMC_HAVE_GLOO
// Args: ranks, ProcessGroupGloo worker threads.
void BM_GlooExchange(benchmark::State& state) {
  auto& world =
      processWorld("gloo", static_cast<int>(state.range(0)), static_cast<int>(state.range(1)));
  exchangeLoop(state, *world.rank0);
}
BENCHMARK(BM_GlooExchange)
    ->Args({2, 1})
    ->Args({4, 1})
    ->Args({2, 2})
    ->Args({4, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::strcmp(argv[1], "--peer") == 0) {
    try {
      return runPeer(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                     std::atoi(argv[6]), argv[7]);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "# peer %s failed: %s\n", argv[3], error.what());
      return 1;
    }
  }
  if (argc == 3 && std::strcmp(argv[1], "--echo") == 0) return runEcho(std::atoi(argv[2]));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  worlds().clear();  // stops and reaps every peer process
  return 0;
}
