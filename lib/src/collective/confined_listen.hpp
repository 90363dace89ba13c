#pragma once
// Confines the c10d store server of a loopback-only job to the loopback interface.
//
// c10d's TCPStore (1.13) has no option for the address its server listens on: it binds the
// wildcard address ([::] dual-stack, else 0.0.0.0), so a local run's store would accept
// connections from every interface of the host. hmc-run promises that a job whose master
// address is a loopback address listens on loopback only. While a ConfinedListen is alive,
// a bind() of a wildcard address in this process binds the confined address instead (same
// port); hmc defines bind() for that (confined_listen.cpp) and forwards every call to the
// next definition (libc's). Scopes are serialized; outside a scope bind() is unchanged.

#include <memory>
#include <optional>
#include <string>

namespace hmc::detail {

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
