#pragma once
// Internal, torch-free: one connection to a c10d TCPStore server as the out-of-band key-value
// view (StoreKeyValue, store_connection.cpp) uses it, whoever speaks to the server. Two speak:
// c10d's own client (store_transport.cpp, LibTorch) and hmc's client of the 1.x wire protocol
// (store_wire.cpp), with which `hmc-run status` attaches without loading LibTorch.

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hmc/collective/key_value_store.hpp"

namespace hmc::detail {

// A request that failed on the connection: `timedOut` when no answer came in the read
// deadline (the server may still answer late), else the connection broke.
class ConnectionFailure : public std::runtime_error {
 public:
  ConnectionFailure(const std::string& what, bool timedOut)
      : std::runtime_error(what), timedOut_(timedOut) {}
  bool timedOut() const noexcept { return timedOut_; }

 private:
  bool timedOut_;
};

// One connection; each request waits for its answer up to the connection's read deadline and
// throws ConnectionFailure (or hmc's Error) when it does not come. Not thread-safe.
class StoreConnection {
 public:
  virtual ~StoreConnection() = default;
  virtual void set(const std::string& key, const std::vector<std::uint8_t>& value) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The value of a key a check has shown to exist, in one round trip.
  virtual std::vector<std::uint8_t> getExisting(const std::string& key) = 0;
  virtual bool deleteKey(const std::string& key) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

// Opens a connection whose reads give up after the given deadline.
using ConnectStore = std::function<std::unique_ptr<StoreConnection>(std::chrono::milliseconds)>;

// The key-value view over connections that `connect` opens: keys are `prefix` + key; requests
// are bounded as KeyValueStore says (kRequestDeadline, then a handshake with host:port).
std::shared_ptr<collective::KeyValueStore> makeStoreKeyValue(ConnectStore connect,
                                                             std::chrono::milliseconds timeout,
                                                             std::string prefix,
                                                             const std::string& host, int port);

// A socket descriptor, closed when it goes out of scope unless released.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// One resolved address of a host and port.
struct SocketAddress {
  sockaddr_storage address{};
  socklen_t length = 0;
  int family = 0;
};

// The addresses getaddrinfo found, in its order.
std::vector<SocketAddress> addressesOf(const addrinfo* found);

// A non-blocking connect of `socket` (a fresh non-blocking socket of address.family) to
// `address`, waiting for the handshake until `by`: 0 once connected, else the error
// (ETIMEDOUT at `by`).
int connectBy(int socket, const SocketAddress& address, collective::Clock::time_point by);

// The addresses of host:port (getaddrinfo), in its order; empty when it does not resolve.
std::vector<SocketAddress> resolveAddresses(const std::string& host, int port);

// "" when a TCP handshake with one of `addresses` completes within `within` (the kernel of the
// host answers, whatever its process does; also "" for no addresses), else why not: "no TCP
// handshake with it within 0.5 s", "a new connection to it fails (Connection refused)".
std::string handshakeFails(const std::vector<SocketAddress>& addresses,
                           std::chrono::milliseconds within);

// The peers ("address:port", the address as inet_ntop writes it) of this network namespace's
// established TCP connections whose local port is `port` (/proc/net/tcp and /proc/net/tcp6; an
// IPv4-mapped IPv6 peer as its IPv4 text, so that both compare with openLiveness's); nullopt
// when neither file can be read.
std::optional<std::set<std::string>> establishedPeersOf(int port);

// A TCP connection to host:port that says nothing and is kept for as long as the process
// lives (close-on-exec): its end closes when the process does, however it ends, which the
// listening side sees in its TCP table (establishedPeersOf). Returns the socket (-1 when it
// cannot connect within `within`) and its own end as "address:port".
std::pair<int, std::string> openLiveness(const std::string& host, int port,
                                         std::chrono::milliseconds within);

// A connected, non-blocking TCP socket to one of `addresses` (tried in order until `deadline`),
// or -1 with `why` saying what the last attempt met.
int connectAny(const std::vector<SocketAddress>& addresses, collective::Clock::time_point deadline,
               std::string& why);

}  // namespace hmc::detail
