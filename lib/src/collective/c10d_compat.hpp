#pragma once
// Every LibTorch version difference of the c10d surface hmc uses, in one place.
// Debian's LibTorch 1.13 on CPU machines, pip wheels 2.x on GPU machines.
//
//  - TCPStoreOptions: 2.x adds fields (useLibUV, masterListenFd); the ones set here exist in both.
//  - Reading a key known to exist: 1.13's get() is two round trips (a wait, then the read).
//    compareSet with an expected value no envelope can equal returns the current value in one
//    round trip; 2.1+ has multiGet (one wait plus one read for all keys).
//  - Connect timeouts: 1.13's SocketOptions holds whole seconds (tcpStoreOptions rounds up).
//  - Errors: 1.13 throws c10::Error with "Socket Timeout"/"Wait timeout"; 2.x throws
//    c10::DistNetworkError / DistStoreError (subclasses of c10::Error) with other texts.
//  - The gloo work type is c10d::ProcessGroup::Work in 1.13 and c10d::Work in 2.x.

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#define HMC_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||      \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace hmc::detail::c10d_compat {

inline c10d::TCPStoreOptions tcpStoreOptions(int port, bool isServer, int worldSize,
                                             bool waitWorkers, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = isServer;
  options.numWorkers = waitWorkers ? c10::optional<std::size_t>(worldSize) : c10::nullopt;
  options.waitWorkers = waitWorkers;
  // 1.13 keeps the connect timeout in whole seconds (truncating: 500 ms fails at once) and
  // retries a refused connection only while more than a second is left: round up.
  options.timeout = std::chrono::ceil<std::chrono::seconds>(timeout);
  options.multiTenant = false;
#if HMC_TORCH_AT_LEAST(2, 2)
  options.useLibUV = false;  // the libuv server's latency differs; keep one implementation
#endif
  return options;
}

inline std::vector<std::uint8_t> toVector(std::string_view bytes) {
  return std::vector<std::uint8_t>(bytes.begin(), bytes.end());
}
inline std::string toBytes(const std::vector<std::uint8_t>& value) {
  return std::string(value.begin(), value.end());
}

// Reads keys that a wait has shown to exist, in order. `sentinel` must differ from every
// value stored under the keys (hmc envelopes are at least 12 bytes; the sentinel is 1).
inline std::vector<std::vector<std::uint8_t>> getExisting(c10d::Store& store,
                                                          const std::vector<std::string>& keys) {
  std::vector<std::vector<std::uint8_t>> values;
  values.reserve(keys.size());
#if HMC_TORCH_AT_LEAST(2, 1)
  values = store.multiGet(keys);
#else
  static const std::vector<std::uint8_t> kSentinel{0xff};
  for (const std::string& key : keys) {
    values.push_back(store.compareSet(key, kSentinel, kSentinel));
  }
#endif
  return values;
}

// A request that a c10d store server answers at once, sent on a connection of hmc's own
// before c10d's client connects, to tell a store from another listener on its port: 1.13's
// client reads its first reply (TCPStore's constructor, waitForWorkers) without a deadline,
// so a listener that accepts and stays silent would block a rank for good.
//   1.13: GETNUMKEYS (query type 6 of c10d::detail::QueryType), answered with an int64.
//   2.x: the protocol changed (a VALIDATE query with a magic number comes first, the query
//   types are renumbered) and its client bounds its reads: empty, hmc only checks that
//   something accepts connections there.
inline std::string storeProbeRequest() {
#if HMC_TORCH_AT_LEAST(2, 0)
  return {};
#else
  return std::string(1, '\x06');
#endif
}
inline constexpr std::size_t kStoreProbeReplyBytes = 8;

// c10d's message when the server's port is taken (1.13: "failed to bind to [::]:P (errno:
// 98 - Address already in use)"; 2.x words it alike).
inline bool isAddressInUse(std::string_view text) {
  return text.find("Address already in use") != std::string_view::npos ||
         text.find("EADDRINUSE") != std::string_view::npos;
}

// The message of an error from c10d (c10::Error without its backtrace) or from the socket
// layer under it (std::system_error: "Connection reset by peer").
inline std::string messageOf(const std::exception& error) {
  if (const auto* c10Error = dynamic_cast<const c10::Error*>(&error)) {
    return c10Error->what_without_backtrace();
  }
  return error.what();
}

// Whether a store call failed because its timeout passed (as opposed to a broken connection).
inline bool isTimeout(std::string_view text) {
  return text.find("imeout") != std::string_view::npos ||
         text.find("imed out") != std::string_view::npos;
}
inline bool isTimeout(const std::exception& error) { return isTimeout(messageOf(error)); }

// The peer closed or reset the connection (the store server or a gloo peer is gone).
inline bool isConnectionLost(std::string_view text) {
  for (std::string_view marker :
       {"Connection closed by peer", "Connection reset", "Broken pipe", "Connection refused",
        "ECONNRESET", "EPIPE", "closed by peer", "Socket closed"}) {
    if (text.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

}  // namespace hmc::detail::c10d_compat
