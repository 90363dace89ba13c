// The tcp transport's choice of socket per peer (TcpTransportOptions::localSockets): ranks in
// threads of this process, one store on a held port. Its exchanges and failures over both
// kinds of socket, with ranks as processes: process_transport_test.
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

// Each rank's localPeers() after an exchange that delivered every rank's payload; `local`
// says whether rank r asks for local sockets.
std::vector<std::vector<int>> localPeersOf(int world, const std::function<bool(int)>& local) {
  const auto held = hmc::collective::PortReservation::loopback();
  std::vector<std::vector<int>> out(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        TcpTransportOptions options = optionsFor(rank, world, held.port());
        options.localSockets = local(rank);
        TcpTransport transport(options);
        const auto got = transport.exchange("hello", std::to_string(rank));
        for (int peer = 0; peer < world; ++peer) {
          if (got.at(peer) != std::to_string(peer)) errors[rank] += "wrong payload; ";
        }
        out[rank] = transport.localPeers();
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
  }
}
