#pragma once
// The `store` transport: ranks as processes (one or many hosts) meeting in a c10d TCPStore.
// The default for multi-process runs, and the out-of-band channel for hang diagnosis.
//
//   StoreTransportOptions options;
//   options.port = 29500;  options.rank = rank;  options.worldSize = world;
//   options.timeout = std::chrono::seconds(30);
//   StoreTransport transport(options);  // rank 0 hosts the store unless isServer says else
//   transport.exchange("recycle", payload);
//
// Construction is itself collective: it returns once every rank has connected to the store,
// or throws TimeoutError after options.timeout (BackendError when the server cannot be
// reached or its port cannot be bound). Every rank must use the same host, port, world size
// and prefix.
//
// An exchange writes this rank's envelope under "<prefix>/x/<sequence>/<rank>", waits for the
// others' keys (one store wait bounded by the collective's deadline) and reads them. Keys are
// namespaced by sequence number only, not by stage: ranks that entered different stages find
// each other's envelopes and raise CollectiveMismatch instead of timing out. A rank deletes
// its own key of sequence n-2 once it completed sequence n-1 (every rank has read it by then),
// so the store holds at most two generations of keys however long the run.
//
// Errors: a deadline that passes raises TimeoutError naming the ranks whose keys are missing
// ("'recycle' #6 timed out on rank 0 after 10 s: ranks [1] did not arrive"). A rank that
// crashed is seen the same way (its key never comes). The store server gone (its host rank
// died) raises RankFailure naming host:port.
//
// Destruction: the hosting rank's store server dies with it, so its destructor waits (up to
// the timeout) until every other rank has left ("<prefix>/bye/<rank>", set by every
// destructor); with a dead peer it therefore blocks for the timeout. Never throws.
//
// Thread safety: like every Collective, one thread at a time. keyValueStore() returns a
// separate connection that another thread (a watchdog) may use while an exchange blocks.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"

namespace hmc::detail {
struct StoreTransportState;
}  // namespace hmc::detail

namespace hmc::collective {

struct StoreTransportOptions {
  std::string host = "127.0.0.1";
  // The store's port. 0 on the hosting rank binds a free port (read it back with port());
  // the other ranks then need the real port.
  int port = 0;
  int rank = 0;
  int worldSize = 1;
  // Whether this rank hosts the store server; by default rank 0 does.
  std::optional<bool> isServer;
  // The collective deadline, also the bound on connecting to the store.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Namespace of this transport's keys: transports sharing a store need distinct prefixes.
  std::string prefix = "hmc";

  bool hostsServer() const noexcept { return isServer.value_or(rank == 0); }
  // Throws ValueError naming the first bad field.
  void validate() const;
};

// A small key-value view of the store for out-of-band use (flight records, diagnosis).
// Its own connection; thread-safe. Every call is bounded by the store timeout.
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

class StoreTransport final : public Collective {
 public:
  explicit StoreTransport(const StoreTransportOptions& options);
  ~StoreTransport() override;

  std::string_view transportName() const noexcept override { return "store"; }
  // The port the store listens on (the bound one when options.port was 0).
  int port() const noexcept;
  const std::string& host() const noexcept;
  // A new connection to the same store, keys under "<prefix>/kv/". Safe to use from
  // another thread while this transport blocks in an exchange.
  std::shared_ptr<KeyValueStore> keyValueStore();

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;

 private:
  std::unique_ptr<hmc::detail::StoreTransportState> state_;
};

}  // namespace hmc::collective
