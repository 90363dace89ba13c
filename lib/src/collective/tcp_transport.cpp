#include "hmc/collective/tcp_transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <system_error>
#include <utility>

#include "hmc/collective/launch_env.hpp"
#include "hmc/error.hpp"
#include "hmc/log.hpp"
#include "shared_exchange.hpp"
#include "wait_text.hpp"

namespace hmc::detail {
namespace {

using collective::Bytes;
using collective::Clock;

constexpr std::uint32_t kHelloMagic = 0x746d6368;  // "hcmt"
constexpr std::size_t kHelloBytes = 12;            // magic, rank, world size
constexpr std::size_t kHeaderBytes = 16;           // sequence, length
constexpr std::size_t kChunk = 64 * 1024;
// How long a rank waits on the shared exchange's futex before it looks for closed sockets.
constexpr std::chrono::milliseconds kSharedCheck{10};

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Socket() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void setNonBlocking(int fd, const std::string& what) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw BackendError(fmt::format("{}: fcntl(O_NONBLOCK): {}", what, osReason(errno)));
  }
}

void setNoDelay(int fd, const std::string& what) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    throw BackendError(fmt::format("{}: setsockopt(TCP_NODELAY): {}", what, osReason(errno)));
  }
}

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

Address resolve(const std::string& host, int port, int socketType, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socketType;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw BackendError(fmt::format("{}: cannot resolve '{}': {}", what, host, ::gai_strerror(rc)));
  }
  Address out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

// The numeric host and the port of a socket address.
std::pair<std::string, int> numeric(const Address& address) {
  char host[NI_MAXHOST] = {};
  char service[NI_MAXSERV] = {};
  if (::getnameinfo(address.get(), address.length, host, sizeof(host), service, sizeof(service),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return {"", 0};
  }
  return {host, std::atoi(service)};
}

// After a call on a nonblocking socket moved nothing (`n` <= 0; `events` POLLIN for a read,
// POLLOUT for a write): throws BackendError naming `what` and `call` on EOF (a read) or a
// socket error, else waits until the socket is ready. Returns false when `deadline` passed.
bool awaitSocket(int fd, ssize_t n, short events, Clock::time_point deadline,
                 const std::string& what, const char* call) {
  if (n == 0 && events == POLLIN) {
    throw BackendError(fmt::format("{}: the peer closed the connection", what));
  }
  if (n < 0 && errno == EINTR) return true;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
    throw BackendError(fmt::format("{}: {}: {}", what, call, osReason(errno)));
  }
  pollfd p{fd, events, 0};
  return !(::poll(&p, 1, pollMillis(deadline)) == 0 && Clock::now() >= deadline);
}

// Writes or reads exactly `size` bytes on a nonblocking socket before `deadline`. Returns
// false when the deadline passed; throws BackendError (naming `what`) on a socket error or EOF.
bool writeAll(int fd, const char* data, std::size_t size, Clock::time_point deadline,
              const std::string& what) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (!awaitSocket(fd, n, POLLOUT, deadline, what, "send")) {
      return false;
    }
  }
  return true;
}

bool readAll(int fd, char* data, std::size_t size, Clock::time_point deadline,
             const std::string& what) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (!awaitSocket(fd, n, POLLIN, deadline, what, "recv")) {
      return false;
    }
  }
  return true;
}

std::string hello(int rank, int world) {
  std::string out(kHelloBytes, '\0');
  const std::uint32_t fields[3] = {kHelloMagic, static_cast<std::uint32_t>(rank),
                                   static_cast<std::uint32_t>(world)};
  std::memcpy(out.data(), fields, kHelloBytes);
  return out;
}

}  // namespace

struct TcpPeer {
  int rank = 0;
  Socket socket;
  bool local = false;  // a Unix-domain socket
  // Received bytes not yet consumed: the current frame, and possibly the start of the next.
  std::string in;
  std::size_t sent = 0;
  bool done = false;
};

// The peers' sockets for closedPeers(), shared with the probes it hands out: the transport
// marks them gone (under the mutex) before it closes the sockets, so a probe never polls a
// descriptor number that a later file may reuse.
struct PeerSockets {
  std::mutex mutex;
  bool gone = false;
  std::vector<std::pair<int, int>> rankAndFd;
};

struct TcpTransportState {
  std::shared_ptr<collective::StoreTransport> control;  // destroyed last
  collective::TcpTransportOptions options;
  std::string host;
  std::string publishedHost;  // the numeric address in the store ("127.0.0.1")
  int port = 0;
  std::vector<TcpPeer> peers;  // every other rank, in rank order
  std::shared_ptr<PeerSockets> watched = std::make_shared<PeerSockets>();
  std::optional<std::string> broken;
  std::string frame;
  std::vector<pollfd> polls;
  std::vector<TcpPeer*> polled;
  // Every rank on this host: exchanges through shared memory (shared_exchange.hpp), the
  // sockets only for envelopes too large for a slot and to see a peer's end.
  SharedExchange shared;
  std::uint64_t round = 0;  // exchanges done through `shared`
  char chunk[kChunk];
};

}  // namespace hmc::detail

namespace hmc::detail {
namespace {

// One rank setting up its connections: part of forming the world, so bounded by the join
// deadline, not the collective one.
struct SetUp {
  TcpTransportState& s;
  int self = 0;
  int world = 0;
  std::chrono::milliseconds joinTimeout{0};
  Clock::time_point deadline;
  std::string what;  // "rank 3 setting up the tcp transport"

  TcpPeer& slot(int peer) const { return s.peers[peer < self ? peer : peer - 1]; }
  std::string addressKey(int peer) const { return fmt::format("{}/addr/{}", s.options.name, peer); }
  TimeoutError timedOut(const std::vector<int>& ranks, const char* how) const {
    return TimeoutError(fmt::format(
        "rank {} timed out after {} forming the world (--join-timeout) setting up the tcp "
        "transport: ranks {} {}; start them (or see why they exited), or raise --join-timeout",
        self, formatSeconds(joinTimeout), collective::formatRankList(ranks), how));
  }
};

// Binds and listens on this rank's address; returns the listener and the "host port" to
// publish.
std::pair<Socket, std::string> listenForPeers(const SetUp& up) {
  // The address this rank binds and announces: options.host, else HMC_ADVERTISE_ADDR, else
  // the interface that routes to the store's host (as torch chooses a rank's address).
  const auto advertised = collective::processEnvironment()(collective::kAdvertiseAddrVariable);
  std::string origin;
  if (!up.s.options.host.empty()) {
    up.s.host = up.s.options.host;
    origin = "the tcp transport's host option";
  } else {
    up.s.host = collective::advertiseAddress(up.s.control->host(), up.s.control->port());
    origin = advertised && !advertised->empty()
                 ? fmt::format("{}={}", collective::kAdvertiseAddrVariable, *advertised)
                 : fmt::format("the local address that routes to the store's host {}",
                               up.s.control->host());
  }

  const Address bindAddress = resolve(
      up.s.host, 0, SOCK_STREAM, fmt::format("{}: the address to listen on ({})", up.what, origin));
  Socket listener(::socket(bindAddress.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0)
    throw BackendError(fmt::format("{}: socket: {}", up.what, osReason(errno)));
  if (::bind(listener.get(), bindAddress.get(), bindAddress.length) != 0) {
    const int error = errno;
    throw BackendError(fmt::format(
        "{}: cannot listen on {} ({}): {}{}", up.what, up.s.host, origin, osReason(error),
        error == EADDRNOTAVAIL
            ? fmt::format("; it is not an address of this host: set {} to one that is (ip -brief "
                          "address lists them) or unset it",
                          collective::kAdvertiseAddrVariable)
            : std::string()));
  }
  if (::listen(listener.get(), SOMAXCONN) != 0) {
    throw BackendError(fmt::format("{}: listen: {}", up.what, osReason(errno)));
  }
  setNonBlocking(listener.get(), up.what);
  Address bound;
  bound.length = sizeof(bound.storage);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length);
  const auto [boundHost, boundPort] = numeric(bound);
  up.s.port = boundPort;
  up.s.publishedHost = boundHost;
  hmc::logger()->info("rank {} of the tcp transport listens on {} port {} ({})", up.self, boundHost,
                      boundPort, origin);
  return {std::move(listener), fmt::format("{} {}", boundHost, boundPort)};
}

// The address of an abstract Unix-domain socket (Linux: a name in the network namespace, no
// file; gone with its last descriptor).
std::pair<sockaddr_un, socklen_t> localAddress(const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t size = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), size);  // sun_path[0] = '\0': abstract
  return {addr, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + size)};
}

// Ranks that announce the same address are on one host (in one network namespace), where a
// Unix-domain socket carries a frame for a fraction of what the loopback TCP stack costs (no
// segments, acknowledgements or softirq work; measured in docs/multi-process.md). Each rank
// also listens on an abstract socket of a random name and publishes the name after its
// address; a lower rank (ranks connect to the higher ones) that announces the same address
// connects there, and falls back to TCP when the name is not found (another network
// namespace, another machine). Returns the listener and its name, or an invalid socket and ""
// when local sockets are off or the listener cannot be made (then every peer uses TCP).
std::pair<Socket, std::string> listenLocally(const SetUp& up) {
  const auto variable = collective::processEnvironment()(collective::kTcpLocalSocketsVariable);
  if (!up.s.options.localSockets || (variable && *variable == "0")) {
    hmc::logger()->info("rank {} of the tcp transport: TCP to every peer ({})", up.self,
                        up.s.options.localSockets
                            ? fmt::format("{}=0", collective::kTcpLocalSocketsVariable)
                            : std::string("the localSockets option"));
    return {Socket(), ""};
  }
  std::random_device entropy;
  const std::uint64_t token = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
  const std::string name =
      fmt::format("hmc-tcp-{}-{}-{:016x}", static_cast<long>(::getpid()), up.self, token);
  Socket listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const auto [addr, length] = localAddress(name);
  if (listener.get() < 0 ||
      ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0 ||
      ::listen(listener.get(), SOMAXCONN) != 0) {
    hmc::logger()->info(
        "rank {} of the tcp transport: no local socket ({}); peers on this host "
        "connect over TCP",
        up.self, osReason(errno));
    return {Socket(), ""};
  }
  setNonBlocking(listener.get(), up.what);
  return {std::move(listener), name};
}

// A connection to the abstract socket `name` on this host, or an invalid socket when nothing
// listens there.
Socket connectLocally(const std::string& name) {
  Socket socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socket.get() < 0) return Socket();
  const auto [addr, length] = localAddress(name);
  // Blocking: a listener that exists completes it from its backlog (SOMAXCONN, more than any
  // world's ranks); one that does not fails at once (ECONNREFUSED).
  int rc = 0;
  while ((rc = ::connect(socket.get(), reinterpret_cast<const sockaddr*>(&addr), length)) != 0 &&
         errno == EINTR) {
  }
  if (rc != 0) return Socket();
  return socket;
}

// Connects to every higher rank: each listens before it publishes, so the kernel completes
// the connection from its backlog without waiting for the peer to accept.
void connectToHigherRanks(const SetUp& up, collective::KeyValueStore& kv, bool useLocal) {
  const std::string helloBytes = hello(up.self, up.world);
  for (int peer = up.self + 1; peer < up.world; ++peer) {
    Bytes published;
    try {
      published = kv.get(up.addressKey(peer),
                         std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      up.deadline - Clock::now()),
                                  std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int other = peer; other < up.world; ++other) {
        if (!kv.check({up.addressKey(other)})) missing.push_back(other);
      }
      throw up.timedOut(missing, "did not publish their address");
    }
    // "HOST PORT" or "HOST PORT LOCAL-NAME".
    const auto space = published.find(' ');
    const std::string peerHost = published.substr(0, space);
    const int peerPort = space == Bytes::npos ? 0 : std::atoi(published.c_str() + space + 1);
    const auto second = space == Bytes::npos ? Bytes::npos : published.find(' ', space + 1);
    const std::string peerLocal = second == Bytes::npos ? "" : published.substr(second + 1);
    const std::string to =
        fmt::format("{} connecting to rank {} at {} port {}", up.what, peer, peerHost, peerPort);
    if (useLocal && !peerLocal.empty() && peerHost == up.s.publishedHost) {
      Socket onHost = connectLocally(peerLocal);
      if (onHost.get() >= 0) {
        setNonBlocking(onHost.get(), to);
        if (!writeAll(onHost.get(), helloBytes.data(), helloBytes.size(), up.deadline, to)) {
          throw up.timedOut({peer}, "did not accept");
        }
        up.slot(peer).socket = std::move(onHost);
        up.slot(peer).local = true;
        continue;
      }
    }
    const Address remote = resolve(peerHost, peerPort, SOCK_STREAM, to);
    Socket socket(::socket(remote.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (socket.get() < 0) throw BackendError(fmt::format("{}: socket: {}", to, osReason(errno)));
    setNonBlocking(socket.get(), to);
    if (::connect(socket.get(), remote.get(), remote.length) != 0) {
      if (errno != EINPROGRESS) throw BackendError(fmt::format("{}: {}", to, osReason(errno)));
      pollfd p{socket.get(), POLLOUT, 0};
      while (::poll(&p, 1, pollMillis(up.deadline)) < 0 && errno == EINTR) {
      }
      if ((p.revents & (POLLOUT | POLLERR | POLLHUP)) == 0)
        throw up.timedOut({peer}, "did not accept");
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(socket.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) throw BackendError(fmt::format("{}: {}", to, osReason(error)));
    }
    setNoDelay(socket.get(), to);
    if (!writeAll(socket.get(), helloBytes.data(), helloBytes.size(), up.deadline, to)) {
      throw up.timedOut({peer}, "did not accept");
    }
    up.slot(peer).socket = std::move(socket);
  }
}

// Accepts one connection from every lower rank, over TCP or on the local socket (when there
// is one); anything else that connects is dropped.
void acceptLowerRanks(const SetUp& up, const Socket& listener, const Socket& local) {
  int waiting = up.self;
  while (waiting > 0) {
    pollfd polls[2] = {{listener.get(), POLLIN, 0}, {local.get(), POLLIN, 0}};
    const int ready = ::poll(polls, local.get() >= 0 ? 2 : 1, pollMillis(up.deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 && Clock::now() >= up.deadline) {
      std::vector<int> missing;
      for (int peer = 0; peer < up.self; ++peer) {
        if (up.slot(peer).socket.get() < 0) missing.push_back(peer);
      }
      throw up.timedOut(missing, "did not connect");
    }
    const bool tcp = local.get() < 0 || polls[1].revents == 0;
    Socket socket(::accept4(tcp ? listener.get() : local.get(), nullptr, nullptr,
                            SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (socket.get() < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        continue;
      throw BackendError(fmt::format("{}: accept: {}", up.what, osReason(errno)));
    }
    std::uint32_t fields[3] = {};
    try {
      if (!readAll(socket.get(), reinterpret_cast<char*>(fields), kHelloBytes, up.deadline,
                   up.what)) {
        continue;  // the loop reports the timeout
      }
    } catch (const BackendError&) {
      continue;  // not one of ours
    }
    const int peer = static_cast<int>(fields[1]);
    if (fields[0] != kHelloMagic || static_cast<int>(fields[2]) != up.world || peer >= up.self ||
        up.slot(peer).socket.get() >= 0) {
      continue;
    }
    if (tcp) setNoDelay(socket.get(), up.what);
    up.slot(peer).socket = std::move(socket);
    up.slot(peer).local = !tcp;
    --waiting;
  }
}

// One byte of the shared-memory handshake on a peer's socket, with a descriptor attached
// (SCM_RIGHTS, Unix-domain sockets only) when `passed` >= 0. False when the deadline passed.
bool sendHandshake(int fd, char byte, int passed, Clock::time_point deadline,
                   const std::string& what) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec data{&byte, 1};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  if (passed >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &passed, sizeof(int));
  }
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n == 1) return true;
    if (!awaitSocket(fd, n, POLLOUT, deadline, what, "sendmsg")) return false;
  }
}

// Reads one byte of the handshake; a descriptor that came with it goes to `*passed` (else -1).
bool receiveHandshake(int fd, char& byte, int* passed, Clock::time_point deadline,
                      const std::string& what) {
  if (passed != nullptr) *passed = -1;
  for (;;) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec data{&byte, 1};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (n == 1) {
      for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
           header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        int got = -1;
        std::memcpy(&got, CMSG_DATA(header), sizeof(int));
        if (passed != nullptr && *passed < 0) {
          *passed = got;
        } else {
          ::close(got);
        }
      }
      return true;
    }
    if (!awaitSocket(fd, n, POLLIN, deadline, what, "recvmsg")) return false;
  }
}

// Whether this rank may exchange through shared memory: every peer on this host (a Unix-domain
// socket) and nothing turns it off; else the reason it may not.
std::optional<std::string> sharedMemoryRefusal(const SetUp& up) {
  const auto variable = collective::processEnvironment()(collective::kTcpSharedMemoryVariable);
  if (!up.s.options.sharedMemory) return std::string("the sharedMemory option");
  if (variable && *variable == "0") {
    return fmt::format("{}=0", collective::kTcpSharedMemoryVariable);
  }
  for (const TcpPeer& peer : up.s.peers) {
    if (!peer.local) return fmt::format("rank {} is not on a Unix-domain socket", peer.rank);
  }
  return std::nullopt;
}

// The shared-memory handshake, after every connection stands: rank 0 offers a region ('M',
// with its descriptor) or none ('N') to every peer, each answers whether it takes it ('Y' or
// 'N'), and rank 0 tells every peer the outcome ('Y' only when every rank took it). So either
// every rank exchanges through shared memory or none does. It runs on the sockets before any
// exchange, so no frame comes between its bytes.
void agreeOnSharedMemory(const SetUp& up) {
  if (up.world < 2) return;
  const auto refusal = sharedMemoryRefusal(up);
  const std::string what = fmt::format("{} (shared-memory handshake)", up.what);
  const auto with = [&](int peer) {
    return fmt::format("{} (shared-memory handshake with rank {})", up.what, peer);
  };
  const auto late = [&](int peer) {
    return up.timedOut({peer}, "did not answer the shared-memory handshake");
  };
  bool agreed = false;
  if (up.self == 0) {
    SharedExchange region;
    std::optional<std::string> reason = refusal;
    if (!reason) {
      try {
        region = SharedExchange::create(up.world, what);
      } catch (const BackendError& error) {
        reason = error.what();
      }
    }
    for (const TcpPeer& peer : up.s.peers) {
      if (!sendHandshake(peer.socket.get(), reason ? 'N' : 'M', reason ? -1 : region.descriptor(),
                         up.deadline, with(peer.rank))) {
        throw late(peer.rank);
      }
    }
    region.releaseDescriptor();
    agreed = !reason;
    for (const TcpPeer& peer : up.s.peers) {
      char answer = 'N';
      if (!receiveHandshake(peer.socket.get(), answer, nullptr, up.deadline, with(peer.rank))) {
        throw late(peer.rank);
      }
      if (answer != 'Y' && agreed) {
        agreed = false;
        reason = fmt::format("rank {} declined", peer.rank);
      }
    }
    for (const TcpPeer& peer : up.s.peers) {
      if (!sendHandshake(peer.socket.get(), agreed ? 'Y' : 'N', -1, up.deadline, with(peer.rank))) {
        throw late(peer.rank);
      }
    }
    if (agreed) {
      up.s.shared = std::move(region);
    } else {
      hmc::logger()->info(
          "the tcp transport exchanges on its sockets, not through shared memory: {}", *reason);
    }
  } else {
    const TcpPeer& root = up.slot(0);
    char offer = 'N';
    int descriptor = -1;
    if (!receiveHandshake(root.socket.get(), offer, &descriptor, up.deadline, with(0))) {
      throw late(0);
    }
    SharedExchange region;
    std::optional<std::string> reason = refusal;
    if (!reason && (offer != 'M' || descriptor < 0)) reason = std::string("rank 0 offered none");
    if (!reason) {
      try {
        region = SharedExchange::attach(std::exchange(descriptor, -1), up.world, what);
      } catch (const BackendError& error) {
        reason = error.what();
      }
    }
    if (descriptor >= 0) ::close(descriptor);
    if (reason) hmc::logger()->info("rank {} declines the shared exchange: {}", up.self, *reason);
    char outcome = 'N';
    if (!sendHandshake(root.socket.get(), reason ? 'N' : 'Y', -1, up.deadline, with(0)) ||
        !receiveHandshake(root.socket.get(), outcome, nullptr, up.deadline, with(0))) {
      throw late(0);
    }
    agreed = outcome == 'Y' && !reason;
    if (agreed) up.s.shared = std::move(region);
  }
  if (agreed) {
    hmc::logger()->info(
        "rank {} of the tcp transport exchanges through shared memory (every rank "
        "on this host)",
        up.self);
  }
}

}  // namespace
}  // namespace hmc::detail

namespace hmc::collective {

using hmc::detail::TcpPeer;

void TcpTransportOptions::validate() const {
  if (!control) store.validate();
  if (name.empty()) throw ValueError("the tcp transport's key name is empty");
}

namespace {

std::shared_ptr<StoreTransport> controlOf(const TcpTransportOptions& options) {
  options.validate();
  return options.control ? options.control : std::make_shared<StoreTransport>(options.store);
}

}  // namespace

TcpTransport::TcpTransport(const TcpTransportOptions& options)
    : TcpTransport(options, controlOf(options)) {}

TcpTransport::TcpTransport(const TcpTransportOptions& options,
                           std::shared_ptr<StoreTransport> control)
    : Collective(control->rank(), control->worldSize(), control->timeout()),
      state_(std::make_unique<hmc::detail::TcpTransportState>()) {
  using namespace hmc::detail;
  auto& s = *state_;
  s.control = std::move(control);
  s.options = options;
  s.options.control = nullptr;  // held once, in s.control
  const int self = rank();
  const int world = worldSize();
  // Setting up is part of forming the world: the join deadline, not the collective one.
  const auto joinTimeout = s.control->joinTimeout();
  const SetUp up{s,
                 self,
                 world,
                 joinTimeout,
                 Clock::now() + joinTimeout,
                 fmt::format("rank {} setting up the tcp transport", self)};
  const auto [listener, address] = listenForPeers(up);
  const auto [localListener, localName] = listenLocally(up);
  s.peers.resize(world - 1);
  for (int peer = 0, i = 0; peer < world; ++peer) {
    if (peer != self) s.peers[i++].rank = peer;
  }
  auto kv = s.control->keyValueStore();
  kv->set(up.addressKey(self), localName.empty() ? address : address + " " + localName);
  // A rank without a local listener does not connect to its peers' either: the pair uses TCP.
  connectToHigherRanks(up, *kv, !localName.empty());
  acceptLowerRanks(up, listener, localListener);
  if (!s.peers.empty()) {
    std::vector<int> overTcp;
    std::vector<int> local;
    for (const TcpPeer& peer : s.peers) (peer.local ? local : overTcp).push_back(peer.rank);
    hmc::logger()->info(
        "rank {} of the tcp transport: {}{}{}", self,
        overTcp.empty() ? "" : fmt::format("ranks {} over TCP", formatRankList(overTcp)),
        overTcp.empty() || local.empty() ? "" : ", ",
        local.empty()
            ? ""
            : fmt::format("ranks {} over a Unix-domain socket (this host)", formatRankList(local)));
  }
  agreeOnSharedMemory(up);
  for (const TcpPeer& peer : s.peers) {
    s.watched->rankAndFd.emplace_back(peer.rank, peer.socket.get());
  }
}

TcpTransport::~TcpTransport() {
  std::lock_guard<std::mutex> lock(state_->watched->mutex);
  state_->watched->gone = true;
}

Collective::ClosedPeers TcpTransport::closedPeers() const {
  return [sockets = state_->watched] {
    std::lock_guard<std::mutex> lock(sockets->mutex);
    std::vector<int> closed;
    if (sockets->gone) return closed;
    std::vector<pollfd> polls;
    for (const auto& [rank, fd] : sockets->rankAndFd) polls.push_back({fd, POLLRDHUP, 0});
    int ready = 0;
    while ((ready = ::poll(polls.data(), polls.size(), 0)) < 0 && errno == EINTR) {
    }
    for (std::size_t i = 0; ready > 0 && i < polls.size(); ++i) {
      if (polls[i].revents & (POLLRDHUP | POLLHUP | POLLERR))
        closed.push_back(sockets->rankAndFd[i].first);
    }
    return closed;
  };
}

const std::string& TcpTransport::host() const noexcept { return state_->host; }
int TcpTransport::port() const noexcept { return state_->port; }
StoreTransport& TcpTransport::control() noexcept { return *state_->control; }
std::shared_ptr<KeyValueStore> TcpTransport::keyValueStore() {
  return state_->control->keyValueStore();
}
bool TcpTransport::broken() const noexcept { return state_->broken.has_value(); }

bool TcpTransport::sharesMemory() const noexcept { return static_cast<bool>(state_->shared); }

std::vector<int> TcpTransport::localPeers() const {
  std::vector<int> out;
  for (const TcpPeer& peer : state_->peers) {
    if (peer.local) out.push_back(peer.rank);
  }
  return out;
}

std::vector<Bytes> TcpTransport::gather(std::uint64_t sequence, std::string_view stage,
                                        const Bytes& envelope, Clock::time_point deadline) {
  using hmc::detail::osReason;
  auto& s = *state_;
  const int self = rank();
  if (s.broken) {
    throw BackendError(fmt::format(
        "'{}' #{} on rank {}: the tcp transport is unusable after an earlier failure ({})", stage,
        sequence, self, *s.broken));
  }
  std::vector<Bytes> out(worldSize());
  out[self] = envelope;
  if (s.peers.empty()) return out;

  const auto makeFrame = [&] {
    s.frame.resize(hmc::detail::kHeaderBytes + envelope.size());
    const std::uint64_t header[2] = {sequence, envelope.size()};
    std::memcpy(s.frame.data(), header, hmc::detail::kHeaderBytes);
    std::memcpy(s.frame.data() + hmc::detail::kHeaderBytes, envelope.data(), envelope.size());
  };

  const auto closed = [&](const TcpPeer& peer) {
    return RankFailure(hmc::detail::lostRankText(peer.rank, hmc::detail::kClosedConnection, stage,
                                                 sequence, hmc::detail::kClosedConnectionWhy));
  };
  const auto failed = [&](const TcpPeer& peer, const char* call, int error) {
    return BackendError(fmt::format("'{}' #{} on rank {}: {} with rank {}: {}", stage, sequence,
                                    self, call, peer.rank, osReason(error)));
  };
  const auto outOfStep = [&](const TcpPeer& peer, std::uint64_t theirs) {
    return BackendError(fmt::format(
        "'{}' #{} on rank {}: rank {} sent a frame for collective #{}: the streams are out of "
        "step",
        stage, sequence, self, peer.rank, theirs));
  };
  // Takes the current frame out of `peer.in` once complete.
  const auto parse = [&](TcpPeer& peer) {
    if (peer.in.size() < hmc::detail::kHeaderBytes) return;
    std::uint64_t got[2];
    std::memcpy(got, peer.in.data(), hmc::detail::kHeaderBytes);
    if (got[0] != sequence) throw outOfStep(peer, got[0]);
    if (peer.in.size() - hmc::detail::kHeaderBytes < got[1]) return;
    out[peer.rank].assign(peer.in, hmc::detail::kHeaderBytes, got[1]);
    peer.in.erase(0, hmc::detail::kHeaderBytes + got[1]);
    peer.done = true;
  };
  const auto receive = [&](TcpPeer& peer) {
    while (!peer.done) {
      const ssize_t n = ::recv(peer.socket.get(), s.chunk, sizeof(s.chunk), 0);
      if (n > 0) {
        peer.in.append(s.chunk, static_cast<std::size_t>(n));
        parse(peer);
        continue;
      }
      if (n == 0) throw closed(peer);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == ECONNRESET || errno == EPIPE) throw closed(peer);
      throw failed(peer, "recv", errno);
    }
  };
  const auto transmit = [&](TcpPeer& peer) {
    while (peer.sent < s.frame.size()) {
      const ssize_t n = ::send(peer.socket.get(), s.frame.data() + peer.sent,
                               s.frame.size() - peer.sent, MSG_NOSIGNAL);
      if (n > 0) {
        peer.sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) throw closed(peer);
      throw failed(peer, "send", n < 0 ? errno : EIO);
    }
  };

  // Waits until every rank has published exchange `round`: one yield first (as before poll()
  // below: where ranks outnumber cores, a peer on this core runs now), then on the futex, in
  // slices of kSharedCheck after each of which a closed socket (closedPeers()) of a rank that
  // has not arrived raises RankFailure, as its EOF does on the sockets.
  // A rank that gave up first marked the ranks it did not see: this rank fails with it.
  const auto waitShared = [&](std::uint64_t round) {
    if (s.shared.allArrived(round)) return;
    sched_yield();
    while (!s.shared.allArrived(round)) {
      if (const auto by = s.shared.gaveUpOn(round)) {
        throw TimeoutError(hmc::detail::timedOutText(
            stage, sequence, self, timeout(),
            fmt::format("{} (rank {} gave up waiting first)",
                        hmc::detail::notArrivedText(s.shared.missing(round)), *by)));
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        const std::vector<int> absent = s.shared.giveUp(self, round);
        if (absent.empty()) continue;  // the last ones arrived as this rank gave up
        throw TimeoutError(hmc::detail::timedOutText(stage, sequence, self, timeout(),
                                                     hmc::detail::notArrivedText(absent)));
      }
      if (s.shared.waitForArrival(
              round, std::min<Clock::duration>(deadline - now, hmc::detail::kSharedCheck))) {
        continue;
      }
      const std::vector<int> missing = s.shared.missing(round);
      for (const int gone : closedPeers()()) {
        if (std::binary_search(missing.begin(), missing.end(), gone)) {
          throw closed(s.peers[gone < self ? gone : gone - 1]);
        }
      }
    }
  };

  try {
    if (s.shared) {
      // Through shared memory; the sockets carry only envelopes too large for a slot.
      const std::uint64_t round = ++s.round;
      const auto published = s.shared.publish(self, round, sequence, envelope);
      if (published.lateAfter) {
        const int by = *published.lateAfter;
        throw TimeoutError(hmc::detail::arrivedLateText(
            stage, sequence, self, {by}, fmt::format("rank {} gave up waiting first", by)));
      }
      if (published.inSlot) {
        s.frame.clear();
      } else {
        makeFrame();
      }
      waitShared(round);
      for (auto& peer : s.peers) {
        peer.sent = 0;
        const std::uint64_t theirs = s.shared.sequence(peer.rank, round);
        if (theirs != sequence) throw outOfStep(peer, theirs);
        const std::uint64_t length = s.shared.length(peer.rank, round);
        peer.done = length != hmc::detail::SharedExchange::kOnSocket;
        if (peer.done) {
          out[peer.rank].assign(s.shared.bytes(peer.rank, round), length);
        } else {
          parse(peer);
        }
      }
    } else {
      makeFrame();
      for (auto& peer : s.peers) {
        peer.sent = 0;
        peer.done = false;
        parse(peer);  // a fast peer's frame may already be here
      }
    }
    for (auto& peer : s.peers) transmit(peer);
    for (;;) {
      s.polls.clear();
      s.polled.clear();
      for (auto& peer : s.peers) {
        const short events = static_cast<short>((peer.done ? 0 : POLLIN) |
                                                (peer.sent < s.frame.size() ? POLLOUT : 0));
        if (events == 0) continue;
        s.polls.push_back(pollfd{peer.socket.get(), events, 0});
        s.polled.push_back(&peer);
      }
      if (s.polls.empty()) break;
      // Frames are still missing: let a runnable peer send first, instead of sleeping in poll()
      // and being woken by each of its frames. Where ranks outnumber cores (4 rank processes
      // on 2), a rank's send wakes a peer that preempts it before its other sends, and each
      // frame cost a sleep and a wake-up; yielding first made the 4-rank reuse cycle 18% and
      // the fresh one 20% faster (docs/multi-process.md). With a core free it returns at once.
      sched_yield();
      const int ready = ::poll(s.polls.data(), s.polls.size(), hmc::detail::pollMillis(deadline));
      if (ready < 0) {
        if (errno == EINTR) continue;
        throw BackendError(
            fmt::format("'{}' #{} on rank {}: poll: {}", stage, sequence, self, osReason(errno)));
      }
      if (ready == 0) {
        if (Clock::now() < deadline) continue;
        std::vector<int> missing;
        std::vector<int> unsent;
        for (const auto& peer : s.peers) {
          if (!peer.done) missing.push_back(peer.rank);
          if (peer.sent < s.frame.size()) unsent.push_back(peer.rank);
        }
        throw TimeoutError(hmc::detail::timedOutText(
            stage, sequence, self, timeout(),
            missing.empty()
                ? fmt::format("ranks {} did not take this rank's envelope", formatRankList(unsent))
                : hmc::detail::notArrivedText(missing)));
      }
      for (std::size_t i = 0; i < s.polls.size(); ++i) {
        const short revents = s.polls[i].revents;
        if (revents == 0) continue;
        TcpPeer& peer = *s.polled[i];
        if (!peer.done && (revents & (POLLIN | POLLHUP | POLLERR))) receive(peer);
        if (peer.sent < s.frame.size() && (revents & (POLLOUT | POLLHUP | POLLERR))) {
          transmit(peer);
        }
      }
    }
  } catch (const Error& error) {
    s.broken = error.what();
    throw;
  }
  return out;
}

}  // namespace hmc::collective
