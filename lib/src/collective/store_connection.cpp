#include "store_connection.hpp"

#include <fmt/format.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "hmc/error.hpp"
#include "wait_text.hpp"

namespace hmc::detail {

namespace {

using collective::Clock;

std::chrono::milliseconds remainingUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

std::vector<SocketAddress> addressesOf(const addrinfo* found) {
  std::vector<SocketAddress> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    SocketAddress address;
    std::memcpy(&address.address, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
    address.family = a->ai_family;
    out.push_back(address);
  }
  return out;
}

int connectBy(int socket, const SocketAddress& address, Clock::time_point by) {
  if (::connect(socket, reinterpret_cast<const sockaddr*>(&address.address), address.length) ==
      0) {
    return 0;
  }
  int error = errno;
  if (error != EINPROGRESS) return error;
  pollfd p{socket, POLLOUT, 0};
  int ready = 0;
  while ((ready = ::poll(&p, 1, pollMillis(by))) < 0 && errno == EINTR) {
  }
  error = ETIMEDOUT;
  if (ready > 0) {
    socklen_t size = sizeof(error);
    ::getsockopt(socket, SOL_SOCKET, SO_ERROR, &error, &size);
  }
  return error;
}

std::vector<SocketAddress> resolveAddresses(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return {};
  std::vector<SocketAddress> out = addressesOf(found);
  ::freeaddrinfo(found);
  return out;
}

namespace {

// One /proc/net/tcp{,6} address ("0100007F:1F90", or 32 hex digits and a port): its text and
// port; nullopt when malformed. The kernel prints each 32-bit word of the address as a number
// in this host's byte order, so the words are copied back as they are.
std::optional<std::pair<std::string, int>> procAddress(const std::string& field, bool six) {
  const auto colon = field.find(':');
  const std::size_t digits = six ? 32 : 8;
  if (colon != digits) return std::nullopt;
  std::uint32_t words[4] = {};
  for (std::size_t word = 0; word < digits / 8; ++word) {
    char* end = nullptr;
    const std::string part = field.substr(word * 8, 8);
    words[word] = static_cast<std::uint32_t>(std::strtoul(part.c_str(), &end, 16));
    if (end != part.c_str() + 8) return std::nullopt;
  }
  char* end = nullptr;
  const long port = std::strtol(field.c_str() + colon + 1, &end, 16);
  if (end == field.c_str() + colon + 1) return std::nullopt;
  char text[INET6_ADDRSTRLEN] = {};
  if (!six) {
    in_addr address{};
    std::memcpy(&address, words, 4);
    if (::inet_ntop(AF_INET, &address, text, sizeof(text)) == nullptr) return std::nullopt;
  } else {
    in6_addr address{};
    std::memcpy(&address, words, 16);
    if (IN6_IS_ADDR_V4MAPPED(&address)) {
      in_addr four{};
      std::memcpy(&four, address.s6_addr + 12, 4);
      if (::inet_ntop(AF_INET, &four, text, sizeof(text)) == nullptr) return std::nullopt;
    } else if (::inet_ntop(AF_INET6, &address, text, sizeof(text)) == nullptr) {
      return std::nullopt;
    }
  }
  return std::make_pair(std::string(text), static_cast<int>(port));
}

}  // namespace

std::pair<int, std::string> openLiveness(const std::string& host, int port,
                                         std::chrono::milliseconds within) {
  std::string why;
  Fd socket{connectAny(resolveAddresses(host, port), Clock::now() + within, why)};
  if (socket.fd < 0) return {-1, {}};
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (::getsockname(socket.fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return {-1, {}};
  char text[INET6_ADDRSTRLEN] = {};
  int localPort = 0;
  if (local.ss_family == AF_INET) {
    const auto* four = reinterpret_cast<const sockaddr_in*>(&local);
    if (::inet_ntop(AF_INET, &four->sin_addr, text, sizeof(text)) == nullptr) return {-1, {}};
    localPort = ntohs(four->sin_port);
  } else {
    const auto* six = reinterpret_cast<const sockaddr_in6*>(&local);
    if (IN6_IS_ADDR_V4MAPPED(&six->sin6_addr)) {
      in_addr four{};
      std::memcpy(&four, six->sin6_addr.s6_addr + 12, 4);
      if (::inet_ntop(AF_INET, &four, text, sizeof(text)) == nullptr) return {-1, {}};
    } else if (::inet_ntop(AF_INET6, &six->sin6_addr, text, sizeof(text)) == nullptr) {
      return {-1, {}};
    }
    localPort = ntohs(six->sin6_port);
  }
  return {socket.release(), std::string(text) + ":" + std::to_string(localPort)};
}

std::optional<std::set<std::string>> establishedPeersOf(int port) {
  std::set<std::string> peers;
  bool read = false;
  for (const bool six : {false, true}) {
    std::ifstream table(six ? "/proc/net/tcp6" : "/proc/net/tcp");
    if (!table) continue;
    read = true;
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state)) continue;
      if (state != "01") continue;  // TCP_ESTABLISHED
      const auto here = procAddress(local, six);
      const auto there = procAddress(remote, six);
      if (here && there && here->second == port) {
        peers.insert(there->first + ":" + std::to_string(there->second));
      }
    }
  }
  if (!read) return std::nullopt;
  return peers;
}

std::string handshakeFails(const std::vector<SocketAddress>& addresses,
                           std::chrono::milliseconds within) {
  if (addresses.empty()) return {};  // not resolved: nothing to judge by (never "unreachable")
  std::string why;
  for (const SocketAddress& address : addresses) {
    Fd socket{::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
    if (socket.fd < 0) continue;
    const int error = connectBy(socket.fd, address, Clock::now() + within);
    if (error == 0) return {};
    why = error == ETIMEDOUT
              ? fmt::format("no TCP handshake with it within {}", formatSeconds(within))
              : fmt::format("a new connection to it fails ({})", osReason(error));
  }
  return why;
}

int connectAny(const std::vector<SocketAddress>& addresses, Clock::time_point deadline,
               std::string& why) {
  why = addresses.empty() ? "the host does not resolve" : "";
  for (const SocketAddress& address : addresses) {
    Fd socket{::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
    if (socket.fd < 0) {
      why = osReason(errno);
      continue;
    }
    const int error = connectBy(socket.fd, address, deadline);
    if (error == 0) return socket.release();
    why = osReason(error);
  }
  return -1;
}

namespace {

// Every request of the out-of-band view is one round trip that a store answers at once, but a
// store whose host went down or was cut off never answers, and c10d would block for the
// connection's whole read deadline (the collective's: a rank cut off from rank 0 ended one
// deadline late, after its collective had already timed out). So the connection's reads give up
// after kRequestDeadline; then a TCP handshake with the store's address tells a store that is
// merely slow (a loaded host, a stopped process: the kernel still answers) from one that cannot
// be reached. Slow: a fresh connection (the old one owes the late answer) and the request again,
// until the store timeout; unreachable or refused: BackendError at once.
//
// Every connection of a process to one store shares what the last of them learned: once one
// found the store's host unreachable (the watchdog's, polling every 0.5 s, learns it seconds
// before a collective's deadline), the others' next request begins with the handshake and
// fails at once when it still fails, instead of waiting kRequestDeadline first. A handshake
// that succeeds, or any answer, clears the mark: a cut that healed costs nothing.
class UnreachableStores {
 public:
  static UnreachableStores& instance() {
    static UnreachableStores stores;
    return stores;
  }
  void mark(const std::string& endpoint, std::string reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    reasons_[endpoint] = std::move(reason);
    marked_.store(true, std::memory_order_release);
  }
  void clear(const std::string& endpoint) {
    if (!marked_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    reasons_.erase(endpoint);
    marked_.store(!reasons_.empty(), std::memory_order_release);
  }
  std::optional<std::string> reason(const std::string& endpoint) const {
    if (!marked_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = reasons_.find(endpoint);
    if (found == reasons_.end()) return std::nullopt;
    return found->second;
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> marked_{false};
  std::map<std::string, std::string> reasons_;
};

class StoreKeyValue final : public collective::KeyValueStore {
 public:
  static constexpr std::chrono::milliseconds kRequestDeadline{1000};
  static constexpr std::chrono::milliseconds kHandshakeDeadline{500};

  StoreKeyValue(ConnectStore connect, std::chrono::milliseconds timeout, std::string prefix,
                const std::string& host, int port)
      : connect_(std::move(connect)),
        timeout_(timeout),
        readDeadline_(std::min(timeout, kRequestDeadline)),
        store_(connect_(readDeadline_)),
        prefix_(std::move(prefix)),
        endpoint_(fmt::format("{}:{}", host, port)),
        addresses_(resolveAddresses(host, port)) {}

  void set(const std::string& key, const collective::Bytes& value) override {
    call("set", [&] { store_->set(prefix_ + key, toVector(value)); });
  }
  // Polls rather than waiting on the server, which would leave this connection's read deadline
  // at `timeout` for every later request (and, timed out, owing the server's late answer).
  collective::Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      bool present = false;
      call("get", [&] { present = store_->check({prefix_ + key}); });
      if (present) break;
      if (Clock::now() >= deadline) {
        throw TimeoutError(fmt::format("c10d store {} get: key '{}' was not set within {}",
                                       endpoint_, key, formatSeconds(timeout)));
      }
      std::this_thread::sleep_for(std::min(pause, remainingUntil(deadline)));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
    std::vector<std::uint8_t> out;
    call("get", [&] { out = store_->getExisting(prefix_ + key); });
    return collective::Bytes(out.begin(), out.end());
  }
  bool check(const std::vector<std::string>& keys) override {
    std::vector<std::string> full;
    for (const auto& key : keys) full.push_back(prefix_ + key);
    bool out = false;
    call("check", [&] { out = store_->check(full); });
    return out;
  }
  bool deleteKey(const std::string& key) override {
    bool out = false;
    call("deleteKey", [&] { out = store_->deleteKey(prefix_ + key); });
    return out;
  }
  // Asked again after a late answer, an add may count twice: hmc adds only to counters that
  // readers poll for a change (flight/published), where that does no harm.
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t out = 0;
    call("add", [&] { out = store_->add(prefix_ + key, delta); });
    return out;
  }

 private:
  static std::vector<std::uint8_t> toVector(const collective::Bytes& bytes) {
    return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
  }

  template <typename Fn>
  void call(const char* what, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);  // one request in flight per connection
    auto& unreachableStores = UnreachableStores::instance();
    if (const auto earlier = unreachableStores.reason(endpoint_)) {
      const std::string unreachable = handshakeFails(addresses_, kHandshakeDeadline);
      if (!unreachable.empty()) {
        throw BackendError(fmt::format(
            "c10d store {} {}: {} (another connection of this process), and {} now: its host "
            "is down or cut off from this one, or the store's process ended",
            endpoint_, what, *earlier, unreachable));
      }
      unreachableStores.clear(endpoint_);
    }
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      try {
        fn();
        unreachableStores.clear(endpoint_);
        return;
      } catch (const ConnectionFailure& failure) {
        const std::string reason = failure.what();
        if (!failure.timedOut()) {
          throw BackendError(fmt::format("c10d store {} {}: {}", endpoint_, what, reason));
        }
        const std::string unreachable = handshakeFails(addresses_, kHandshakeDeadline);
        if (!unreachable.empty()) {
          const std::string silence =
              fmt::format("no answer within {}", formatSeconds(readDeadline_));
          unreachableStores.mark(endpoint_, silence);
          throw BackendError(fmt::format(
              "c10d store {} {}: {}, and {}: its host is down or cut off from this one, or the "
              "store's process ended",
              endpoint_, what, silence, unreachable));
        }
        if (Clock::now() >= deadline) {
          throw TimeoutError(fmt::format("c10d store {} {}: {} (no answer within {})",
                                         endpoint_, what, reason, formatSeconds(timeout_)));
        }
        spdlog::debug("c10d store {} {}: no answer within {}, but its host answers: asking "
                      "again on a fresh connection",
                      endpoint_, what, formatSeconds(readDeadline_));
        store_ = connect_(readDeadline_);
      }
    }
  }

  std::mutex mutex_;
  ConnectStore connect_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds readDeadline_;
  std::unique_ptr<StoreConnection> store_;
  std::string prefix_;
  std::string endpoint_;
  std::vector<SocketAddress> addresses_;
};

}  // namespace

std::shared_ptr<collective::KeyValueStore> makeStoreKeyValue(ConnectStore connect,
                                                             std::chrono::milliseconds timeout,
                                                             std::string prefix,
                                                             const std::string& host, int port) {
  return std::make_shared<StoreKeyValue>(std::move(connect), timeout, std::move(prefix), host,
                                         port);
}

}  // namespace hmc::detail
