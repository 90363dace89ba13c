#include "hmc/collective/store_transport.hpp"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "c10d_compat.hpp"
#include "hmc/error.hpp"
#include "store_transport_state.hpp"

namespace hmc::collective {

namespace compat = hmc::detail::c10d_compat;

namespace {

std::chrono::milliseconds remainingUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string formatSeconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

class StoreKeyValue final : public KeyValueStore {
 public:
  StoreKeyValue(c10::intrusive_ptr<c10d::TCPStore> store, std::string prefix, std::string endpoint)
      : store_(std::move(store)), prefix_(std::move(prefix)), endpoint_(std::move(endpoint)) {}

  void set(const std::string& key, const Bytes& value) override {
    call("set", [&] { store_->set(prefix_ + key, compat::toVector(value)); });
  }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    Bytes out;
    call("get", [&] {
      store_->wait({prefix_ + key}, timeout);
      out = compat::toBytes(compat::getExisting(*store_, {prefix_ + key}).front());
    });
    return out;
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
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t out = 0;
    call("add", [&] { out = store_->add(prefix_ + key, delta); });
    return out;
  }

 private:
  template <typename Fn>
  void call(const char* what, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);  // one request in flight per connection
    try {
      fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      const std::string reason = compat::messageOf(error);
      if (compat::isTimeout(reason)) {
        throw TimeoutError(fmt::format("c10d store {} {}: {}", endpoint_, what, reason));
      }
      throw BackendError(fmt::format("c10d store {} {}: {}", endpoint_, what, reason));
    }
  }

  std::mutex mutex_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string prefix_;
  std::string endpoint_;
};

}  // namespace

void StoreTransportOptions::validate() const {
  if (worldSize < 1) throw ValueError(fmt::format("worldSize must be at least 1, got {}", worldSize));
  if (rank < 0 || rank >= worldSize) {
    throw ValueError(fmt::format("rank {} is outside a world of {} ranks", rank, worldSize));
  }
  if (port < 0 || port > 65535) throw ValueError(fmt::format("invalid store port {}", port));
  if (port == 0 && !hostsServer()) {
    throw ValueError(fmt::format(
        "rank {} joins the store at {} but no port is given (only the hosting rank may use 0)",
        rank, host));
  }
  if (host.empty()) throw ValueError("the store host is empty");
  if (timeout.count() <= 0) {
    throw ValueError(fmt::format("store timeout must be positive, got {} ms", timeout.count()));
  }
  if (prefix.empty()) throw ValueError("the store key prefix is empty");
}

}  // namespace hmc::collective

namespace hmc::detail {

c10::intrusive_ptr<c10d::TCPStore> connectTcpStore(const StoreTransportOptions& options,
                                                   bool asServer, bool waitWorkers, int port) {
  const std::string endpoint = fmt::format("{}:{}", options.host, port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(
        options.host, c10d_compat::tcpStoreOptions(port, asServer, options.worldSize,
                                                   waitWorkers, options.timeout));
  } catch (const std::exception& error) {
    const std::string reason = c10d_compat::messageOf(error);
    if (c10d_compat::isTimeout(reason)) {
      throw TimeoutError(fmt::format(
          "rank {} timed out after {} ms connecting to the c10d store at {} ({} ranks): {}",
          options.rank, options.timeout.count(), endpoint, options.worldSize, reason));
    }
    throw BackendError(fmt::format("rank {} could not {} the c10d store at {}: {}", options.rank,
                                   asServer ? "start" : "connect to", endpoint, reason));
  }
}

KeyJanitor::KeyJanitor(c10::intrusive_ptr<c10d::TCPStore> store)
    : store_(std::move(store)), thread_([this] { run(); }) {}

KeyJanitor::~KeyJanitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void KeyJanitor::erase(std::string key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keys_.push_back(std::move(key));
  }
  wake_.notify_one();
}

void KeyJanitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !keys_.empty(); });
    if (keys_.empty()) return;  // stopping with nothing left
    std::string key = std::move(keys_.front());
    keys_.pop_front();
    lock.unlock();
    try {
      store_->deleteKey(key);
    } catch (const std::exception&) {
      // The server is gone: the exchange path reports that; stop deleting.
      lock.lock();
      keys_.clear();
      return;
    }
    lock.lock();
  }
}

void leaveStore(c10d::Store& store, bool hostsServer, const StoreTransportOptions& options) noexcept {
  try {
    store.set(fmt::format("{}/bye/{}", options.prefix, options.rank), {1});
    if (hostsServer && options.worldSize > 1) {
      std::vector<std::string> keys;
      for (int peer = 0; peer < options.worldSize; ++peer) {
        if (peer != options.rank) keys.push_back(fmt::format("{}/bye/{}", options.prefix, peer));
      }
      store.wait(keys, options.timeout);
    }
  } catch (const std::exception&) {
    // A peer that died or timed out: nothing more to wait for.
  }
}

std::string StoreTransportState::exchangeKey(std::uint64_t sequence, int rank) const {
  return fmt::format("{}/x/{}/{}", options.prefix, sequence, rank);
}

void StoreTransportState::reconnect(std::string_view context) {
  try {
    StoreTransportOptions quick = options;
    quick.timeout = std::min(options.timeout, std::chrono::milliseconds(2000));
    client = connectTcpStore(quick, false, false, port);
  } catch (const Error& error) {
    throw RankFailure(fmt::format("{}: the c10d store server at {} is gone: {}", context,
                                  endpoint(), error.what()));
  }
}

}  // namespace hmc::detail

namespace hmc::collective {

StoreTransport::StoreTransport(const StoreTransportOptions& options)
    : Collective(options.rank, options.worldSize, options.timeout),
      state_(std::make_unique<hmc::detail::StoreTransportState>()) {
  options.validate();
  auto& s = *state_;
  s.options = options;
  s.port = options.port;
  if (options.hostsServer()) {
    s.server = hmc::detail::connectTcpStore(options, true, true, options.port);
    s.port = s.server->getPort();
    s.client = s.server;
  } else {
    s.client = hmc::detail::connectTcpStore(options, false, true, options.port);
  }
  s.janitor = std::make_unique<hmc::detail::KeyJanitor>(
      hmc::detail::connectTcpStore(options, false, false, s.port));
}

StoreTransport::~StoreTransport() {
  auto& s = *state_;
  s.janitor.reset();
  hmc::detail::leaveStore(*s.client, s.server.defined(), s.options);
}

int StoreTransport::port() const noexcept { return state_->port; }
const std::string& StoreTransport::host() const noexcept { return state_->options.host; }

std::shared_ptr<KeyValueStore> StoreTransport::keyValueStore() {
  auto& s = *state_;
  return std::make_shared<StoreKeyValue>(hmc::detail::connectTcpStore(s.options, false, false, s.port),
                                         s.options.prefix + "/kv/", s.endpoint());
}

std::vector<Bytes> StoreTransport::gather(std::uint64_t sequence, std::string_view stage,
                                          const Bytes& envelope, Clock::time_point deadline) {
  auto& s = *state_;
  const int self = rank();
  const int world = worldSize();
  std::vector<std::string> peerKeys;
  peerKeys.reserve(world - 1);
  for (int peer = 0; peer < world; ++peer) {
    if (peer != self) peerKeys.push_back(s.exchangeKey(sequence, peer));
  }
  const auto context = [&] { return fmt::format("'{}' #{} on rank {}", stage, sequence, self); };

  bool waiting = false;
  try {
    s.client->set(s.exchangeKey(sequence, self), compat::toVector(envelope));
    std::vector<Bytes> out(world);
    out[self] = envelope;
    if (world > 1) {
      waiting = true;
      s.client->wait(peerKeys, remainingUntil(deadline));
      waiting = false;
      auto values = compat::getExisting(*s.client, peerKeys);
      for (int peer = 0, i = 0; peer < world; ++peer) {
        if (peer != self) out[peer] = compat::toBytes(values[i++]);
      }
    }
    // Every rank has entered this exchange, so every rank has finished reading the previous
    // one: our key of it can go.
    if (sequence > 0) s.janitor->erase(s.exchangeKey(sequence - 1, self));
    return out;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    const std::string reason = compat::messageOf(error);
    const bool timedOut = waiting && (compat::isTimeout(reason) || Clock::now() >= deadline);
    if (!timedOut && compat::isConnectionLost(reason)) {
      throw RankFailure(fmt::format("{}: the c10d store server at {} is gone: {}", context(),
                                    s.endpoint(), reason));
    }
    // The old connection may still owe an answer to the wait: never reuse it.
    s.reconnect(context());
    if (!timedOut) {
      throw BackendError(fmt::format("{}: c10d store {} failed: {}", context(), s.endpoint(), reason));
    }
    std::vector<int> missing;
    for (int peer = 0; peer < world; ++peer) {
      if (peer != self && !s.client->check({s.exchangeKey(sequence, peer)})) missing.push_back(peer);
    }
    throw TimeoutError(fmt::format("'{}' #{} timed out on rank {} after {}: ranks {} did not arrive",
                                   stage, sequence, self, formatSeconds(timeout()),
                                   formatRankList(missing)));
  }
}

}  // namespace hmc::collective
