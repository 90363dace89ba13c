#pragma once
// A small key-value view of a rank's store for out-of-band use: launchers that announce a
// dead rank, watchdogs that publish flight records, the end-of-run vote. It never travels
// through a transport that may be stuck: StoreTransport::keyValueStore() and
// connectKeyValueStore() (store_transport.hpp) give it its own connection.
//
// Well-known keys (relative to the view's namespace, "<prefix>/kv/" of a StoreTransport):
//   dead/<rank>        set by the launcher that saw the rank process die; the value says how
//                      ("rank 1 exited with status 17 (fault crash)"). Ranks waiting for that
//                      rank raise RankFailure with this text instead of waiting for the deadline.
//   dead/any           set (after dead/<rank>) with every announcement: waiters poll this one
//                      key and look at dead/<rank> only once it exists (announceDeadRank()).
//   flight/<rank>      the rank's flight record, published by its watchdog once a collective
//                      passed its deadline (diagnostics/watchdog.hpp has the JSON).
//   flight/published   a counter bumped by every publication, so that readers poll one key.
//   joined/<rank>      set by each rank as it joins the world (StoreTransport's construction,
//                      the gloo transport's store); joined/count counts them, so that joining
//                      ranks poll one key and look rank by rank only to name who is missing.
//   address/<rank>     set just before joined/<rank>: "address:port", the rank's end of a
//                      connection to the store it keeps open and silent while it lives, so
//                      that the hosting rank can tell from its TCP table which ranks' processes
//                      have ended (StoreTransport::closedPeers).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"

namespace hmc::collective {

// Thread-safe; every call is bounded by the store timeout (or the one given). Calls throw
// TimeoutError when that passes and BackendError when the store is unreachable. The c10d view
// (store_transport.hpp) finds an unreachable store within 1.5 s of a request: one unanswered
// for 1 s is followed by a TCP handshake with the store's host (0.5 s); a host that answers it
// has a slow store, asked again on a fresh connection up to the store timeout; one that does
// not, or refuses, is a BackendError at once.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits for the key up to `timeout`; throws TimeoutError when it does not appear.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Whether all keys exist now (no wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual bool deleteKey(const std::string& key) = 0;
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

inline std::string deadRankKey(int rank) { return "dead/" + std::to_string(rank); }
inline std::string flightKey(int rank) { return "flight/" + std::to_string(rank); }
inline constexpr const char* kAnyDeadKey = "dead/any";
inline constexpr const char* kFlightPublishedKey = "flight/published";
inline std::string joinedRankKey(int rank) { return "joined/" + std::to_string(rank); }
inline constexpr const char* kJoinedCountKey = "joined/count";
inline std::string addressKey(int rank) { return "address/" + std::to_string(rank); }

// The host rank `rank` joined the world from (the value of joined/<rank>), or nullopt before
// it joined. Throws as the store's calls do.
inline std::optional<std::string> joinedHost(KeyValueStore& store, int rank,
                                             std::chrono::milliseconds timeout) {
  const std::string key = joinedRankKey(rank);
  if (!store.check({key})) return std::nullopt;
  const Bytes host = store.get(key, timeout);
  return std::string(host.begin(), host.end());
}

// What a launcher does when rank `rank` died: dead/<rank> = why, then dead/any.
inline void announceDeadRank(KeyValueStore& store, int rank, const std::string& why) {
  store.set(deadRankKey(rank), why);
  store.set(kAnyDeadKey, "1");
}

}  // namespace hmc::collective
