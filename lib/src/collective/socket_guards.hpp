#pragma once
// Two guards around c10d's TCPStore (1.13) sockets, by interposition: hmc defines bind() and
// recv() (socket_guards.cpp), which every binary linking hmc's transports uses instead of
// libc's; both forward to the next definition (libc's, or a sanitizer's) and change only the
// two cases below.
//
// 1. recv(): a TCPStore client's callback thread (TCPStoreWorkerDaemon) peeks one byte when
//    its socket is readable and, unless the peek says "closed" (0), reads a watch response;
//    a *reset* connection makes that read throw std::system_error on c10d's own thread, which
//    nothing catches: "terminate called after throwing an instance of 'std::system_error'
//    what(): Connection reset by peer", abort. It happens whenever a client connects while the
//    server is closing (the connection is reset from the accept queue): hmc-run's launcher
//    joining rank 0's store as a short run ends, `hmc-run status` attaching as a job ends.
//    A MSG_PEEK that fails with ECONNRESET returns 0 ("closed") instead, the case c10d
//    handles. tests/collective/store_reset_test.cpp reproduces the abort.
//    c10d "handles" a closed connection by polling it again, and a closed connection is always
//    readable: from the moment the server's host goes until the client is destroyed, the callback
//    thread spun a core on poll() and recv() (measured: 1.0 s of CPU per second; a rank waiting out
//    a deadline after its store host died burned a core for the whole wait). A one-byte peek that
//    reads "closed" now returns after kClosedPeekPause: the thread wakes 100 times a second, and a
//    store's destructor, which stops the thread through its control pipe, waits at most that long
//    more. Another caller that peeks one byte at a closed connection meets the same pause once.
//
// 2. bind(): confines the c10d store server of a loopback-only job to the loopback interface.
//
// c10d's TCPStore (1.13) has no option for the address its server listens on: it binds the
// wildcard address ([::] dual-stack, else 0.0.0.0), so a local run's store would accept
// connections from every interface of the host. hmc-run promises that a job whose master
// address is a loopback address listens on loopback only. While a ConfinedListen is alive,
// a bind() of a wildcard address in this process binds the confined address instead (same
// port); hmc defines bind() for that (socket_guards.cpp) and forwards every call to the
// next definition (libc's). Scopes are serialized; outside a scope bind() is unchanged.

#include <chrono>
#include <memory>
#include <optional>
#include <string>

namespace hmc::detail {

// How long a one-byte MSG_PEEK that reads a closed connection waits before it returns (1.).
inline constexpr std::chrono::milliseconds kClosedPeekPause{10};

// Whether this process's bind() and recv() are hmc's guards (false when some other definition
// comes first, e.g. an LD_PRELOADed library).
bool socketGuardsInstalled();

// The loopback address a store hosted for `host` should listen on: `host` itself for a
// numeric loopback address (127.0.0.0/8, ::1), 127.0.0.1 for "localhost"; nullopt for any other
// host (then the store listens on every interface, as torch's does).
std::optional<std::string> loopbackListenAddress(const std::string& host);

class ConfinedListen {
 public:
  // `address`: a numeric IPv4 or IPv6 address (from loopbackListenAddress). Throws
  // std::invalid_argument for anything else.
  explicit ConfinedListen(const std::string& address);
  ~ConfinedListen();
  ConfinedListen(const ConfinedListen&) = delete;
  ConfinedListen& operator=(const ConfinedListen&) = delete;

 private:
  struct Lock;
  std::unique_ptr<Lock> lock_;
};

}  // namespace hmc::detail
