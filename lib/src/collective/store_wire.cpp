#include "hmc/collective/store_wire.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "store_connection.hpp"
#include "wait_text.hpp"

namespace hmc::collective {

namespace {

using hmc::detail::ConnectionFailure;

// c10d 1.x's c10d::detail::QueryType and its answers (TCPStore.cpp of 1.13).
enum class Query : std::uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kGetNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};
constexpr std::uint8_t kCheckReady = 0;
constexpr std::uint8_t kCheckNotReady = 1;
// c10d's client (TCPStore::keyPrefix_) puts this before every key it sends.
constexpr const char* kKeyPrefix = "/";
// No value hmc stores is near this; a longer length is not a c10d store talking.
constexpr std::uint64_t kMaxValueBytes = std::uint64_t{1} << 30;

// One request as c10d 1.x's client writes it: the query byte, then values in host byte order
// (c10d sends the integers' memory as it is), strings and byte vectors with a 64-bit length.
class Request {
 public:
  explicit Request(Query query) { bytes_.push_back(static_cast<char>(query)); }
  Request& u64(std::uint64_t value) { return raw(&value, sizeof value); }
  Request& i64(std::int64_t value) { return raw(&value, sizeof value); }
  Request& string(const std::string& text) {
    u64(text.size());
    bytes_ += text;
    return *this;
  }
  Request& key(const std::string& key) { return string(kKeyPrefix + key); }
  Request& vector(const std::vector<std::uint8_t>& value) {
    u64(value.size());
    bytes_.append(value.begin(), value.end());
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  Request& raw(const void* data, std::size_t size) {
    bytes_.append(static_cast<const char*>(data), size);
    return *this;
  }
  std::string bytes_;
};

class WireConnection final : public hmc::detail::StoreConnection {
 public:
  WireConnection(int fd, std::chrono::milliseconds readDeadline)
      : fd_(fd), readDeadline_(readDeadline) {}
  ~WireConnection() override { ::close(fd_); }
  WireConnection(const WireConnection&) = delete;
  WireConnection& operator=(const WireConnection&) = delete;

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    send(Request(Query::kSet).key(key).vector(value));
  }
  bool check(const std::vector<std::string>& keys) override {
    Request request(Query::kCheck);
    request.u64(keys.size());
    for (const auto& key : keys) request.key(key);
    send(request);
    const auto answer = receive<std::uint8_t>();
    if (answer == kCheckReady) return true;
    if (answer == kCheckNotReady) return false;
    throw ConnectionFailure(
        fmt::format("the store answered a check with {} (not ready or not_ready): is this a c10d "
                    "1.x store?",
                    answer),
        false);
  }
  // compareSet with an expected value that no stored value equals: the current value, and no
  // write (c10d 1.x's GET on a missing key would end the server's thread).
  std::vector<std::uint8_t> getExisting(const std::string& key) override {
    static const std::vector<std::uint8_t> kSentinel{0xff};
    send(Request(Query::kCompareSet).key(key).vector(kSentinel).vector(kSentinel));
    const auto size = receive<std::uint64_t>();
    if (size > kMaxValueBytes) {
      throw ConnectionFailure(
          fmt::format("the store announced a value of {} bytes: is this a c10d store?", size),
          false);
    }
    std::vector<std::uint8_t> value(size);
    if (size > 0) receiveExactly(value.data(), value.size());
    return value;
  }
  bool deleteKey(const std::string& key) override {
    send(Request(Query::kDeleteKey).key(key));
    return receive<std::int64_t>() == 1;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    send(Request(Query::kAdd).key(key).i64(delta));
    return receive<std::int64_t>();
  }

 private:
  // Waits until fd_ is ready for `events` or readDeadline_ passes without it (as c10d's
  // SO_RCVTIMEO bounds each read: a long value that keeps arriving is not cut off).
  void await(short events) {
    pollfd p{fd_, events, 0};
    const auto by = Clock::now() + readDeadline_;
    int ready = 0;
    while ((ready = ::poll(&p, 1, hmc::detail::pollMillis(by))) < 0 && errno == EINTR) {
    }
    if (ready < 0) throw ConnectionFailure(hmc::detail::osReason(errno), false);
    if (ready == 0) throw ConnectionFailure("Socket Timeout", true);
  }
  void send(const Request& request) {
    const std::string& bytes = request.bytes();
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        await(POLLOUT);
      } else if (n == 0) {  // not for a stream socket with bytes to send; never spin on it
        throw ConnectionFailure("the connection took no bytes", false);
      } else if (errno != EINTR) {
        throw ConnectionFailure(hmc::detail::osReason(errno), false);
      }
    }
  }
  void receiveExactly(void* into, std::size_t size) {
    auto* at = static_cast<char*>(into);
    while (size > 0) {
      const ssize_t n = ::recv(fd_, at, size, 0);
      if (n > 0) {
        at += n;
        size -= static_cast<std::size_t>(n);
      } else if (n == 0) {
        throw ConnectionFailure("Connection closed by peer", false);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        await(POLLIN);
      } else if (errno != EINTR) {
        throw ConnectionFailure(hmc::detail::osReason(errno), false);
      }
    }
  }
  template <typename T>
  T receive() {
    T value{};
    receiveExactly(&value, sizeof value);
    return value;
  }

  int fd_;
  std::chrono::milliseconds readDeadline_;
};

}  // namespace

bool storeWireClientAvailable() noexcept { return HMC_STORE_WIRE_CLIENT != 0; }

std::shared_ptr<KeyValueStore> connectKeyValueStoreWire(const std::string& host, int port,
                                                        const std::string& prefix,
                                                        std::chrono::milliseconds timeout) {
  if (!storeWireClientAvailable()) {
    throw RuntimeError(
        "this build of hmc has no client of its LibTorch's store protocol (LibTorch 2.x): use "
        "connectKeyValueStore (store_transport.hpp)");
  }
  const std::string endpoint = fmt::format("{}:{}", host, port);
  const auto addresses = hmc::detail::resolveAddresses(host, port);
  if (addresses.empty()) {
    throw BackendError(fmt::format("c10d store {}: cannot resolve the host '{}'", endpoint, host));
  }
  auto connect = [addresses, endpoint, timeout](std::chrono::milliseconds reads) {
    std::string why;
    const int fd = hmc::detail::connectAny(addresses, Clock::now() + timeout, why);
    if (fd < 0) {
      throw BackendError(fmt::format("c10d store {}: cannot connect within {}: {}", endpoint,
                                     hmc::detail::formatSeconds(timeout), why));
    }
    return std::unique_ptr<hmc::detail::StoreConnection>(new WireConnection(fd, reads));
  };
  return hmc::detail::makeStoreKeyValue(connect, timeout, prefix + "/kv/", host, port);
}

}  // namespace hmc::collective
