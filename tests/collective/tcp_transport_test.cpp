// The tcp transport's choice of socket per peer (TcpTransportOptions::localSockets) and of
// shared memory for a world on one host (sharedMemory): ranks in threads of this process, one
// store on a held port. Its exchanges and failures over each path, with ranks as processes:
// process_transport_test.
#include "hmc/collective/tcp_transport.hpp"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"

using hmc::collective::TcpTransport;
using hmc::collective::TcpTransportOptions;

namespace {

TcpTransportOptions optionsFor(int rank, int world, int port) {
  TcpTransportOptions options;
  options.store.port = port;
  options.store.rank = rank;
  options.store.worldSize = world;
  options.store.timeout = std::chrono::seconds(20);
  return options;
}

// What each rank of a world in threads saw: its local peers and whether it shares memory,
// after `body` ran its exchanges; `configure` sets rank r's options.
struct RankView {
  std::vector<int> localPeers;
  bool sharesMemory = false;
};

std::vector<RankView> runWorld(int world,
                               const std::function<void(int, TcpTransportOptions&)>& configure,
                               const std::function<std::string(int, TcpTransport&)>& body) {
  const auto held = hmc::collective::PortReservation::loopback();
  std::vector<RankView> out(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        TcpTransportOptions options = optionsFor(rank, world, held.port());
        configure(rank, options);
        TcpTransport transport(options);
        errors[rank] = body(rank, transport);
        out[rank] = {transport.localPeers(), transport.sharesMemory()};
      } catch (const std::exception& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (auto& thread : ranks) thread.join();
  for (int rank = 0; rank < world; ++rank) {
    INFO("rank ", rank);
    CHECK(errors[rank] == "");
  }
  return out;
}

// One exchange of every rank's number; "" when every payload came right.
std::string helloExchange(int rank, TcpTransport& transport) {
  const auto got = transport.exchange("hello", std::to_string(rank));
  std::string errors;
  for (int peer = 0; peer < transport.worldSize(); ++peer) {
    if (got.at(peer) != std::to_string(peer)) errors += "wrong payload; ";
  }
  return errors;
}

// Each rank's localPeers() after an exchange that delivered every rank's payload; `local`
// says whether rank r asks for local sockets.
std::vector<std::vector<int>> localPeersOf(int world, const std::function<bool(int)>& local) {
  std::vector<std::vector<int>> out;
  for (const auto& view : runWorld(
           world, [&](int rank, TcpTransportOptions&o) { o.localSockets = local(rank); },
           helloExchange)) {
    out.push_back(view.localPeers);
  }
  return out;
}

}  // namespace

TEST_SUITE("tcp transport") {
  TEST_CASE("ranks that announce one address connect over Unix-domain sockets") {
    const auto peers = localPeersOf(3, [](int) { return true; });
    CHECK(peers[0] == std::vector<int>{1, 2});
    CHECK(peers[1] == std::vector<int>{0, 2});
    CHECK(peers[2] == std::vector<int>{0, 1});
  }

  TEST_CASE("a rank without local sockets is reached over TCP, the others still locally") {
    const auto peers = localPeersOf(3, [](int rank) { return rank != 1; });
    CHECK(peers[0] == std::vector<int>{2});
    CHECK(peers[1].empty());
    CHECK(peers[2] == std::vector<int>{0});
  }

  TEST_CASE("HMC_TCP_LOCAL_SOCKETS=0 keeps every peer on TCP") {
    ::setenv(hmc::collective::kTcpLocalSocketsVariable, "0", 1);
    const auto peers = localPeersOf(2, [](int) { return true; });
    ::unsetenv(hmc::collective::kTcpLocalSocketsVariable);
    CHECK(peers[0].empty());
    CHECK(peers[1].empty());
  }

  TEST_CASE("a published local socket that is not on this host falls back to TCP") {
    // Rank 1 is played by hand: it joins the store, publishes its TCP port with the name of a
    // local socket that does not exist (as a rank of the same address in another network
    // namespace would), and accepts rank 0's connection on that port.
    const auto held = hmc::collective::PortReservation::loopback();
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof addr;
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
    const int tcpPort = ntohs(addr.sin_port);

    std::string rank0Error;
    std::vector<int> rank0Local{-1};
    std::uint32_t hello[3] = {};
    // The shared-memory handshake that follows (rank 0 offers, rank 1 answers, rank 0 says
    // the outcome): with a peer over TCP, rank 0 offers no region and the outcome is no.
    char offer = '?';
    char outcome = '?';
    std::thread rank1([&] {
      hmc::collective::StoreTransport control(optionsFor(1, 2, held.port()).store);
      control.keyValueStore()->set(
          "tcp/addr/1", "127.0.0.1 " + std::to_string(tcpPort) + " hmc-tcp-no-such-socket-here");
      const int accepted = ::accept(listener, nullptr, nullptr);
      if (accepted >= 0) {
        std::size_t got = 0;
        while (got < sizeof hello) {
          const ssize_t n =
              ::recv(accepted, reinterpret_cast<char*>(hello) + got, sizeof hello - got, 0);
          if (n <= 0) break;
          got += static_cast<std::size_t>(n);
        }
        if (::recv(accepted, &offer, 1, MSG_WAITALL) == 1 && ::send(accepted, "N", 1, 0) == 1) {
          ::recv(accepted, &outcome, 1, MSG_WAITALL);
        }
        ::close(accepted);
      }
    });
    try {
      TcpTransport transport(optionsFor(0, 2, held.port()));
      rank0Local = transport.localPeers();
    } catch (const std::exception& error) {
      rank0Error = error.what();
    }
    rank1.join();
    ::close(listener);
    CHECK(rank0Error == "");
    CHECK(rank0Local.empty());
    CHECK(hello[0] == 0x746d6368);  // rank 0's hello came over TCP: magic, rank 0, world 2
    CHECK(hello[1] == 0);
    CHECK(hello[2] == 2);
    CHECK(offer == 'N');
    CHECK(outcome == 'N');
  }

  TEST_CASE("a world on one host exchanges through shared memory, large envelopes on sockets") {
    // Sizes around the 64 KiB slot, changing every round and differing between ranks in one
    // round (some envelopes in the region, some on the sockets), over many rounds: the two
    // slots of each rank alternate.
    const auto payload = [](int rank, int round) {
      static const std::size_t kSizes[] = {0, 1, 100, 65535, 65536, 65537, 300000, 7};
      const std::size_t size = kSizes[(rank * 3 + round) % 8];
      std::string out(size, '\0');
      for (std::size_t i = 0; i < size; ++i) {
        out[i] = static_cast<char>((i * 131 + static_cast<std::size_t>(rank * 7 + round)) % 251);
      }
      return out;
    };
    const auto views = runWorld(
        3, [](int, TcpTransportOptions&) {},
        [&](int rank, TcpTransport& transport) {
          std::string errors;
          for (int round = 0; round < 40; ++round) {
            const auto got = transport.exchange("round", payload(rank, round));
            for (int peer = 0; peer < 3; ++peer) {
              if (got.at(peer) != payload(peer, round)) {
                errors += "round " + std::to_string(round) + ": rank " + std::to_string(peer) +
                          "'s payload wrong; ";
              }
            }
          }
          return errors;
        });
    for (const auto& view : views) CHECK(view.sharesMemory);
  }

  TEST_CASE("one rank that declines shared memory keeps the whole world on its sockets") {
    SUBCASE("the sharedMemory option") {
      const auto views = runWorld(
          3, [](int rank, TcpTransportOptions& o) { o.sharedMemory = rank != 2; }, helloExchange);
      for (const auto& view : views) {
        CHECK_FALSE(view.sharesMemory);
        CHECK(view.localPeers.size() == 2);  // still Unix-domain sockets
      }
    }
    SUBCASE("HMC_TCP_SHARED_MEMORY=0") {
      ::setenv(hmc::collective::kTcpSharedMemoryVariable, "0", 1);
      const auto views = runWorld(
          2, [](int, TcpTransportOptions&) {}, helloExchange);
      ::unsetenv(hmc::collective::kTcpSharedMemoryVariable);
      for (const auto& view : views) CHECK_FALSE(view.sharesMemory);
    }
    SUBCASE("a peer over TCP") {
      const auto views = runWorld(
          3, [](int rank, TcpTransportOptions& o) { o.localSockets = rank != 1; }, helloExchange);
      for (const auto& view : views) CHECK_FALSE(view.sharesMemory);
    }
  }
}
