#include "socket_guards.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace hmc::detail {

namespace {

std::mutex scopeMutex;              // one scope at a time
std::atomic<bool> confined{false};  // a scope is alive: rewrite wildcard binds
sockaddr_in confinedV4{};           // written only while no scope is alive
sockaddr_in6 confinedV6{};
bool haveV4 = false;

}  // namespace

std::optional<std::string> loopbackListenAddress(const std::string& host) {
  if (host == "localhost") return std::string("127.0.0.1");
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    if ((ntohl(v4.s_addr) >> 24) == 127) return host;
    return std::nullopt;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6)) return host;
  return std::nullopt;
}

struct ConfinedListen::Lock {
  std::unique_lock<std::mutex> hold{scopeMutex};
};

ConfinedListen::ConfinedListen(const std::string& address) : lock_(std::make_unique<Lock>()) {
  in_addr v4{};
  in6_addr v6{};
  confinedV4 = sockaddr_in{};
  confinedV6 = sockaddr_in6{};
  confinedV4.sin_family = AF_INET;
  confinedV6.sin6_family = AF_INET6;
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    haveV4 = true;
    confinedV4.sin_addr = v4;
    // A dual-stack socket bound to the IPv4-mapped address serves IPv4 clients of `address`.
    confinedV6.sin6_addr.s6_addr[10] = 0xff;
    confinedV6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&confinedV6.sin6_addr.s6_addr[12], &v4, sizeof(v4));
  } else if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    haveV4 = false;
    confinedV6.sin6_addr = v6;
  } else {
    throw std::invalid_argument("ConfinedListen: '" + address + "' is not a numeric address");
  }
  confined.store(true, std::memory_order_release);
}

ConfinedListen::~ConfinedListen() { confined.store(false, std::memory_order_release); }

}  // namespace hmc::detail

extern "C" int bind(int fd, const sockaddr* address, socklen_t length) noexcept;
extern "C" ssize_t recv(int fd, void* buffer, size_t length, int flags);

namespace hmc::detail {

bool socketGuardsInstalled() {
  return ::dlsym(RTLD_DEFAULT, "bind") == reinterpret_cast<void*>(&::bind) &&
         ::dlsym(RTLD_DEFAULT, "recv") == reinterpret_cast<void*>(&::recv);
}

}  // namespace hmc::detail

// The process's recv(): a peek at a reset connection reads as a closed one, and a one-byte peek
// that finds the connection closed returns after kClosedPeekPause (see the header).
extern "C" ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  using Recv = ssize_t (*)(int, void*, size_t, int);
  static const Recv next = reinterpret_cast<Recv>(::dlsym(RTLD_NEXT, "recv"));
  if (next == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  ssize_t received = next(fd, buffer, length, flags);
  if ((flags & MSG_PEEK) == 0) return received;
  if (received < 0 && errno == ECONNRESET) received = 0;
  if (received == 0 && length == 1) {
    const int saved = errno;
    std::this_thread::sleep_for(hmc::detail::kClosedPeekPause);
    errno = saved;
  }
  return received;
}

// The process's bind(): forwards to the next definition (libc's, or a sanitizer's), rewriting
// a wildcard address to the confined one while a ConfinedListen is alive.
extern "C" int bind(int fd, const sockaddr* address, socklen_t length) noexcept {
  using Bind = int (*)(int, const sockaddr*, socklen_t);
  static const Bind next = reinterpret_cast<Bind>(::dlsym(RTLD_NEXT, "bind"));
  if (next == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (address == nullptr || !hmc::detail::confined.load(std::memory_order_acquire)) {
    return next(fd, address, length);
  }
  if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    sockaddr_in v4;
    std::memcpy(&v4, address, sizeof(v4));
    if (v4.sin_addr.s_addr != htonl(INADDR_ANY)) return next(fd, address, length);
    if (!hmc::detail::haveV4) {
      errno = EADDRNOTAVAIL;  // an IPv6 loopback store: no IPv4 listener
      return -1;
    }
    v4.sin_addr = hmc::detail::confinedV4.sin_addr;
    return next(fd, reinterpret_cast<const sockaddr*>(&v4), sizeof(v4));
  }
  if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    sockaddr_in6 v6;
    std::memcpy(&v6, address, sizeof(v6));
    if (!IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) return next(fd, address, length);
    v6.sin6_addr = hmc::detail::confinedV6.sin6_addr;
    return next(fd, reinterpret_cast<const sockaddr*>(&v6), sizeof(v6));
  }
  return next(fd, address, length);
}
