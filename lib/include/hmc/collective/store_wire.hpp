#pragma once
// hmc's own client of the c10d TCPStore wire protocol: the out-of-band key-value view of a
// running job's store (key_value_store.hpp) without LibTorch, whose ~290 shared libraries take
// about a second of CPU to load. `hmc-run status` attaches with it from the torch-free front.
//
// It speaks the protocol of c10d 1.x (Debian's LibTorch 1.13): each request is a query type
// byte, then its keys and values as a 64-bit length and the bytes; c10d's client puts "/"
// before every key. 2.0 changed the protocol (a magic number before every query, renumbered
// query types), so a build against LibTorch 2.x has no wire client (storeWireClientAvailable()
// is false) and its users go through c10d's client (connectKeyValueStore, store_transport.hpp).

#include <chrono>
#include <memory>
#include <string>

#include "hmc/collective/key_value_store.hpp"

namespace hmc::collective {

// Whether this build speaks its LibTorch's store protocol without LibTorch (built against
// c10d 1.x: true).
bool storeWireClientAvailable() noexcept;

// The view of the job's store at host:port under `prefix` (a StoreTransport's options.prefix),
// on a connection of its own, as connectKeyValueStore() gives it: every call bounded by
// `timeout`, an unreachable store found within about 1.5 s of a request. Throws BackendError
// when host:port cannot be connected to within `timeout`, RuntimeError when
// !storeWireClientAvailable().
std::shared_ptr<KeyValueStore> connectKeyValueStoreWire(const std::string& host, int port,
                                                        const std::string& prefix,
                                                        std::chrono::milliseconds timeout);

}  // namespace hmc::collective
