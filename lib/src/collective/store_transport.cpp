#include "hmc/collective/store_transport.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "c10d_compat.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "socket_guards.hpp"
#include "store_connection.hpp"
#include "store_transport_state.hpp"
#include "wait_text.hpp"

namespace hmc::collective {

namespace compat = hmc::detail::c10d_compat;

namespace {

std::chrono::milliseconds remainingUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

using detail::formatSeconds;

// What a rank that gave up on an exchange leaves under the key of each rank that had not
// arrived (a compareSet on the absent key), so that the late rank finds it and fails instead
// of completing the exchange with the ones still waiting: 5 bytes, a marker byte and the rank
// that gave up. Shorter than any envelope (12 bytes or more), so never a payload.
constexpr std::uint8_t kGaveUpMarker = 0xfe;

std::vector<std::uint8_t> gaveUpMark(int rank) {
  std::vector<std::uint8_t> mark(1 + sizeof(std::int32_t), kGaveUpMarker);
  const auto value = static_cast<std::int32_t>(rank);
  std::memcpy(mark.data() + 1, &value, sizeof value);
  return mark;
}

// The rank that gave up, when `value` is a gave-up mark.
std::optional<int> gaveUpBy(const std::vector<std::uint8_t>& value) {
  if (value.size() != 1 + sizeof(std::int32_t) || value[0] != kGaveUpMarker) return std::nullopt;
  std::int32_t rank = 0;
  std::memcpy(&rank, value.data() + 1, sizeof rank);
  return rank;
}

// This rank's arrival at an exchange, atomic against a peer giving up on it: its key is
// written only where it is absent; a gave-up mark there means the others left the exchange
// before it came (TimeoutError, as the threads transport's late rank). compareSet wakes no
// waiter, so the set that follows (the same value) does.
void arrive(hmc::detail::StoreTransportState& s, const std::string& key,
            const std::vector<std::uint8_t>& envelope, std::string_view stage,
            std::uint64_t sequence, int self, const std::string& context) {
  const std::vector<std::uint8_t> stored = s.client->compareSet(key, {}, envelope);
  if (stored != envelope) {
    if (const auto by = gaveUpBy(stored)) {
      throw TimeoutError(hmc::detail::arrivedLateText(
          stage, sequence, self, {*by}, fmt::format("rank {} gave up waiting first", *by)));
    }
    throw BackendError(fmt::format(
        "{}: the c10d store at {} already held a value under this rank's exchange key '{}' "
        "({} bytes): is another job using the same store prefix '{}'?",
        context, s.endpoint(), key, stored.size(), s.options.prefix));
  }
  s.client->set(key, envelope);
}

// The peers whose key of exchange `sequence` is not in the store.
std::vector<int> absentPeers(hmc::detail::StoreTransportState& s, const std::vector<int>& peers,
                             std::uint64_t sequence) {
  std::vector<int> missing;
  for (int peer : peers) {
    if (!s.client->check({s.exchangeKey(sequence, peer)})) missing.push_back(peer);
  }
  return missing;
}

// At the deadline: marks the key of each peer that has not arrived (where it is still absent)
// and returns those peers; a peer whose key turns out written arrived in time. Empty: every
// rank arrived after all, and the exchange completes.
std::vector<int> giveUpOn(hmc::detail::StoreTransportState& s, const std::vector<int>& peers,
                          std::uint64_t sequence, int self) {
  std::vector<int> absent;
  for (int peer : absentPeers(s, peers, sequence)) {
    const std::vector<std::uint8_t> stored =
        s.client->compareSet(s.exchangeKey(sequence, peer), {}, gaveUpMark(self));
    if (gaveUpBy(stored)) absent.push_back(peer);
  }
  return absent;
}

// The peers' values of an exchange every rank's key is in: a peer that gave up first left its
// mark under the keys of the ranks it did not see, and this rank fails with it.
void failIfOneGaveUp(const std::vector<int>& peers,
                     const std::vector<std::vector<std::uint8_t>>& values, std::string_view stage,
                     std::uint64_t sequence, int self, std::chrono::milliseconds timeout) {
  std::vector<int> marked;
  std::optional<int> firstToGiveUp;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (const auto by = gaveUpBy(values[i])) {
      marked.push_back(peers[i]);
      if (!firstToGiveUp) firstToGiveUp = by;
    }
  }
  if (marked.empty()) return;
  throw TimeoutError(hmc::detail::timedOutText(
      stage, sequence, self, timeout,
      fmt::format("{} (rank {} gave up waiting first)", hmc::detail::notArrivedText(marked),
                  *firstToGiveUp)));
}

// On the hosting rank, after it read every value of exchange `sequence`: waits, up to
// options.readReceiptWait, until every peer has too (its read receipt, readKey), so that this
// rank, and the server with it, does not end (crash, exit) while a peer still reads this
// exchange's values. Without it the host could leave a finished exchange and crash before the
// others' reads reached the server: they then failed in an exchange the host had completed,
// and the report placed the host's end one collective early (chaos --run-seed 83052566,
// 854846914). The tcp and gloo transports hold the same guarantee through their own exchanges.
// A peer announced dead, or whose process ended (closed), is not waited for. Past the wait the
// host goes on (a peer that has not confirmed by then is stopped or cut off, and the next
// exchange names it at its deadline); never throws for a missing receipt.
void awaitReads(hmc::detail::StoreTransportState& s, const std::vector<int>& peers,
                std::uint64_t sequence, std::string_view stage, int self,
                const Collective::ClosedPeers& closed) {
  const auto until = Clock::now() + s.options.readReceiptWait;
  std::vector<int> waitFor = peers;
  const auto keysOf = [&] {
    std::vector<std::string> keys;
    keys.reserve(waitFor.size());
    for (int peer : waitFor) keys.push_back(s.readKey(sequence, peer));
    return keys;
  };
  std::vector<std::string> keys = keysOf();
  try {
    s.waiter->wait(keys, std::min(remainingUntil(until), StoreTransport::kFirstWait));
    return;
  } catch (const std::exception& error) {
    if (!compat::isTimeout(error)) throw;
    s.reconnectWaiter(fmt::format("'{}' #{} on rank {}", stage, sequence, self));
  }
  const std::string anyDead = s.options.prefix + "/kv/" + collective::kAnyDeadKey;
  while (!s.client->check(keys)) {
    // Peers that ended need not be waited for: they read or not, and the next exchange meets
    // their end.
    std::vector<int> ended = closed ? closed() : std::vector<int>{};
    if (s.client->check({anyDead})) {
      for (int peer : waitFor) {
        if (s.client->check({hmc::detail::deadKeyOf(s.options.prefix, peer)})) {
          ended.push_back(peer);
        }
      }
    }
    std::vector<int> unread;
    for (int peer : waitFor) {
      if (std::find(ended.begin(), ended.end(), peer) == ended.end() &&
          !s.client->check({s.readKey(sequence, peer)})) {
        unread.push_back(peer);
      }
    }
    if (unread.empty()) return;
    if (Clock::now() >= until) {
      spdlog::debug("'{}' #{} on rank {}: ranks {} had not confirmed reading it after {} ms; "
                    "going on",
                    stage, sequence, self, formatRankList(unread),
                    s.options.readReceiptWait.count());
      return;
    }
    waitFor = std::move(unread);
    keys = keysOf();
    std::this_thread::sleep_for(std::min(remainingUntil(until), StoreTransport::kPollInterval));
  }
}

}  // namespace

void StoreTransportOptions::validate() const {
  if (worldSize < 1)
    throw ValueError(fmt::format("worldSize must be at least 1, got {}", worldSize));
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
  if (joinTimeout && joinTimeout->count() <= 0) {
    throw ValueError(
        fmt::format("store join timeout must be positive, got {} ms", joinTimeout->count()));
  }
  if (prefix.empty()) throw ValueError("the store key prefix is empty");
  if (readReceiptWait.count() < 0) {
    throw ValueError(fmt::format("readReceiptWait must not be negative, got {} ms",
                                 readReceiptWait.count()));
  }
  if (keySlots < 3) {
    throw ValueError(fmt::format(
        "keySlots must be at least 3 (a name is reused once every rank read it), got {}",
        keySlots));
  }
}

}  // namespace hmc::collective

namespace hmc::detail {

using collective::Clock;

namespace {

const char* kCheckMaster =
    "check that MASTER_ADDR (--master-addr) is the host of rank 0 and MASTER_PORT "
    "(--master-port) the port of its store, and that rank 0 is running";

// After a listener closed or reset a probe's connection without answering: is anything still
// listening there? A foreign service accepts again; a store whose host just exited (rank 0
// killed while this rank connected, or the job tearing down) refuses. At most `bound` (and
// `deadline`) is spent finding out; anything but a refusal keeps the foreign-service wording.
bool refusedNow(const sockaddr_storage& address, socklen_t length, int family,
                Clock::time_point deadline) {
  Fd socket{::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
  if (socket.fd < 0) return false;
  if (::connect(socket.fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return false;
  if (errno == ECONNREFUSED) return true;
  if (errno != EINPROGRESS) return false;
  pollfd p{socket.fd, POLLOUT, 0};
  const auto by = std::min(deadline, Clock::now() + std::chrono::milliseconds(500));
  int ready = 0;
  while ((ready = ::poll(&p, 1, pollMillis(by))) < 0 && errno == EINTR) {
  }
  if (ready <= 0) return false;
  int error = 0;
  socklen_t size = sizeof(error);
  ::getsockopt(socket.fd, SOL_SOCKET, SO_ERROR, &error, &size);
  return error == ECONNREFUSED;
}

// Before c10d's client connects: something at host:port must accept a connection and answer
// one store request (c10d_compat::storeProbeRequest) before `deadline`. A refused or
// unroutable connection is retried (rank 0 may not listen yet), as c10d does.
void probeStore(const StoreTransportOptions& options, int port, Clock::time_point deadline,
                bool joining) {
  const std::string endpoint = fmt::format("{}:{}", options.host, port);
  const std::string who = fmt::format("rank {}", options.rank);
  const auto budget = collective::formatSeconds(options.joinBound());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(options.host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw BackendError(fmt::format("{} cannot resolve the store's host '{}' ({}): {}", who,
                                   options.host, ::gai_strerror(rc), kCheckMaster));
  }
  // Every address of the host, tried in order each round (as c10d does): a name may resolve
  // to an IPv6 address first that the store does not listen on.
  const std::vector<SocketAddress> candidates = addressesOf(found);
  ::freeaddrinfo(found);

  std::string lastReason = "no connection yet";
  for (std::size_t attempt = 0;; ++attempt) {
    const SocketAddress& candidate = candidates[attempt % candidates.size()];
    Fd socket{::socket(candidate.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
    const auto address = &candidate.address;
    const auto length = candidate.length;
    // One address may swallow the connection (a firewall): give it at most 2 s of the deadline
    // when there are others to try.
    const auto connectUntil = candidates.size() > 1
                                  ? std::min(deadline, Clock::now() + std::chrono::seconds(2))
                                  : deadline;
    // No socket (e.g. IPv6 disabled): try the next address.
    int error = socket.fd < 0 ? errno : connectBy(socket.fd, candidate, connectUntil);
    if (error == 0) {
      const std::string request = c10d_compat::storeProbeRequest();
      if (request.empty()) return;
      if (::send(socket.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
        error = errno;
      } else {
        char reply[c10d_compat::kStoreProbeReplyBytes];
        std::size_t got = 0;
        while (got < sizeof(reply)) {
          const ssize_t n = ::recv(socket.fd, reply + got, sizeof(reply) - got, 0);
          if (n > 0) {
            got += static_cast<std::size_t>(n);
            continue;
          }
          const int recvError = n < 0 ? errno : 0;
          const bool closed = n == 0 || recvError == ECONNRESET;
          if (closed && refusedNow(*address, length, candidate.family, deadline)) {
            throw BackendError(fmt::format(
                "{}: the c10d store at {} went away while this rank connected (it closed the "
                "connection, and nothing listens there any more): its host (rank 0, or the "
                "launcher's agent) exited or was killed; see that process's output for why",
                who, endpoint));
          }
          if (n == 0) {
            throw BackendError(fmt::format(
                "{}: the listener at {} closed the connection instead of answering as a c10d "
                "store: another service holds that port, or it is not hmc's master; {}",
                who, endpoint, kCheckMaster));
          }
          if (recvError == EINTR) continue;
          if (recvError != EAGAIN && recvError != EWOULDBLOCK) {
            throw BackendError(fmt::format(
                "{}: the listener at {} failed the c10d store's handshake ({}): another service "
                "holds that port, or it is not hmc's master; {}",
                who, endpoint, osReason(recvError), kCheckMaster));
          }
          pollfd p{socket.fd, POLLIN, 0};
          if (::poll(&p, 1, pollMillis(deadline)) == 0 && Clock::now() >= deadline) {
            throw TimeoutError(fmt::format(
                "{}: the listener at {} accepted a connection but did not answer as a c10d "
                "store within {}: another service holds that port, or it is not hmc's master; "
                "{}",
                who, endpoint, budget, kCheckMaster));
          }
        }
        return;
      }
    }
    lastReason = osReason(error);
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "{} found no c10d store at {} within {} ({}){}: {}{}", who, endpoint, budget, lastReason,
          joining ? ", so it could not join the world (--join-timeout)" : "", kCheckMaster,
          joining ? ", or raise --join-timeout if its start is slow" : ""));
    }
    // Refused (nothing listens yet) or unreachable: after a round of every address, try
    // again shortly, as c10d would.
    if ((attempt + 1) % candidates.size() != 0) continue;
    std::this_thread::sleep_for(
        std::min(std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(100)),
                 std::max(Clock::duration::zero(), deadline - Clock::now())));
  }
}

// The hosting rank's port taken by another process (c10d 1.13 binds [::] with IPV6_V6ONLY, so a
// listener on 127.0.0.1 alone would shadow hmc's store for loopback clients instead of
// failing): a bind of 0.0.0.0:port tells. Throws BackendError naming the port.
[[noreturn]] void portInUse(const StoreTransportOptions& options, int port) {
  throw BackendError(fmt::format(
      "rank {} cannot host the c10d store: port {} is already in use on this host (another job, "
      "another hmc-run or a leftover process holds it; `ss -ltnp 'sport = :{}'` shows which): "
      "pass --master-port with a free port or set MASTER_PORT",
      options.rank, port, port));
}

void checkPortFree(const StoreTransportOptions& options, int port) {
  if (port == 0) return;
  Fd socket{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (socket.fd < 0) return;  // c10d reports what fails next
  const int one = 1;
  ::setsockopt(socket.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(socket.fd, reinterpret_cast<const sockaddr*>(&any), sizeof(any)) != 0 &&
      errno == EADDRINUSE) {
    portInUse(options, port);
  }
}

}  // namespace

void boundReads(c10d::TCPStore& store, std::chrono::milliseconds timeout) {
  // c10d sets a connection's read deadline only in wait() (to that wait's timeout), and 1.13
  // connects without one: a request to a stopped server would block for good. A wait for no
  // key is answered at once and leaves the deadline at `timeout`.
  store.wait({}, timeout);
}

c10::intrusive_ptr<c10d::TCPStore> connectTcpStore(
    const StoreTransportOptions& options, bool asServer, bool joining, int port,
    std::optional<std::chrono::milliseconds> readTimeout) {
  const std::string endpoint = fmt::format("{}:{}", options.host, port);
  const auto bound = options.joinBound();
  const auto deadline = Clock::now() + bound;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    if (asServer) {
      checkPortFree(options, port);
    } else {
      probeStore(options, port, deadline, joining);
    }
    // c10d's own wait for workers is not used (joinWorld replaces it): it reads its first
    // reply without a deadline and cannot name the ranks that did not come.
    {
      // A store for a loopback master address listens on loopback only (c10d would bind every
      // interface); any other master address: every interface, as torch's store does.
      std::optional<hmc::detail::ConfinedListen> confine;
      if (asServer) {
        if (const auto address = hmc::detail::loopbackListenAddress(options.host)) {
          confine.emplace(*address);
        }
      }
      store = c10::make_intrusive<c10d::TCPStore>(
          options.host,
          c10d_compat::tcpStoreOptions(port, asServer, options.worldSize, false, bound));
    }
    if (asServer) probeStore(options, store->getPort(), deadline, joining);
    // From here on the collective deadline: c10d's get() and wait() without a timeout use the
    // store's, whatever bounded the connect.
    store->setTimeout(options.timeout);
    if (joining) {
      // The first request of a connection that forms the world may wait as long as the join
      // may (a server paused or cut off for less than that is late, not gone); see joinWorld.
      boundReads(*store, collective::remainingUntil(deadline));
    }
    boundReads(*store, readTimeout.value_or(options.timeout));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    const std::string reason = c10d_compat::messageOf(error);
    if (asServer && c10d_compat::isAddressInUse(reason)) portInUse(options, port);
    if (c10d_compat::isTimeout(reason)) {
      if (joining) {
        throw TimeoutError(fmt::format(
            "rank {} timed out after {} forming the world (--join-timeout): connecting to the "
            "c10d store at {} ({} ranks): {}; start every rank (the store's host first), or "
            "raise --join-timeout",
            options.rank, collective::formatSeconds(bound), endpoint, options.worldSize, reason));
      }
      throw TimeoutError(fmt::format(
          "rank {} timed out after {} ms connecting to the c10d store at {} ({} ranks): {}",
          options.rank, bound.count(), endpoint, options.worldSize, reason));
    }
    throw BackendError(fmt::format("rank {} could not {} the c10d store at {}: {}", options.rank,
                                   asServer ? "start" : "connect to", endpoint, reason));
  }
  return store;
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

void KeyJanitor::erase(std::uint64_t sequence, std::string key) {
  queue(Pending{sequence, std::move(key), false});
}

void KeyJanitor::set(std::uint64_t sequence, std::string key) {
  queue(Pending{sequence, std::move(key), true});
}

void KeyJanitor::queue(Pending next) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    keys_.push_back(std::move(next));
  }
  wake_.notify_one();
}

std::optional<bool> KeyJanitor::settle(std::uint64_t through,
                                       std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Sequences are queued in increasing order: the front and the one in flight are the oldest.
  const auto busy = [&] {
    return (inFlight_ && *inFlight_ <= through) ||
           (!keys_.empty() && keys_.front().sequence <= through);
  };
  if (!settled_.wait_until(lock, deadline, [&] { return !busy(); })) return std::nullopt;
  const bool deleted = deleted_.count(through) > 0;
  deleted_.erase(deleted_.begin(), deleted_.upper_bound(through));
  return deleted;
}

void KeyJanitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !keys_.empty(); });
    if (keys_.empty()) return;  // stopping with nothing left
    Pending next = std::move(keys_.front());
    keys_.pop_front();
    inFlight_ = next.sequence;
    lock.unlock();
    bool failed = false;
    try {
      if (next.write) {
        store_->set(next.key, std::vector<std::uint8_t>{1});
      } else {
        store_->deleteKey(next.key);
      }
    } catch (const std::exception&) {
      failed = true;  // the server is gone: the exchange path reports that
    }
    lock.lock();
    inFlight_.reset();
    if (failed) {
      // Stop deleting: settle() then finds nothing in flight and the exchange deletes (or
      // fails to) on its own connection.
      keys_.clear();
      stop_ = true;
    } else if (!next.write) {
      deleted_.insert(next.sequence);
    }
    settled_.notify_all();
    if (failed) return;
  }
}

void joinWorld(c10d::TCPStore& store, const StoreTransportOptions& options,
               const std::string& endpoint, Clock::time_point deadline,
               const std::string& liveness) {
  if (options.worldSize == 1) return;
  // While the world forms, a request may wait as long as the join may: a partition shorter
  // than the join timeout delays the join, it does not end it. With the collective deadline
  // as the read deadline a 4.5 s partition of h2 (deadline 3 s) failed rank 2's join with
  // "Socket Timeout", and the program aborted (chaos --modes hosts --run-seed 2050791164).
  // Back to the collective deadline once the world has formed.
  const std::string kv = options.prefix + "/kv/";
  const std::string countKey = kv + collective::kJoinedCountKey;
  // Added to the count by the hosting rank when its deadline passes; acknowledged in seenKey.
  constexpr std::int64_t kAbandoned = -(std::int64_t{1} << 40);
  const std::string seenKey = countKey + "/abandoned";
  const auto joinedKey = [&](int rank) { return kv + collective::joinedRankKey(rank); };
  const auto missingRanks = [&] {
    std::vector<int> missing;
    for (int peer = 0; peer < options.worldSize; ++peer) {
      if (!store.check({joinedKey(peer)})) missing.push_back(peer);
    }
    return missing;
  };
  try {
    boundReads(store, collective::remainingUntil(deadline));
    // Its liveness connection's end ("address:port"): the hosting rank tells from its TCP
    // table which ranks' processes have ended (StoreTransport::closedPeers).
    if (!liveness.empty()) {
      store.set(kv + collective::addressKey(options.rank), c10d_compat::toVector(liveness));
    }
    // Its host as the value: a report of a world that did not form says where the ranks that
    // joined are (world.cpp).
    store.set(joinedKey(options.rank), c10d_compat::toVector(hostName()));
    std::int64_t joined = store.add(countKey, 1);
    // One key polled whatever the world size; rank by rank only to name who is missing.
    auto pause = std::chrono::milliseconds(1);
    while (joined < options.worldSize) {
      if (store.check({kv + collective::kAnyDeadKey})) {
        const std::vector<int> missing = missingRanks();
        for (int peer : missing) {
          const std::string dead = deadKeyOf(options.prefix, peer);
          if (!store.check({dead})) continue;
          throw RankFailure(fmt::format(
              "rank {} could not form the world: {}; ranks {} did not join the c10d store at {}",
              options.rank, c10d_compat::toBytes(c10d_compat::getExisting(store, {dead}).front()),
              collective::formatRankList(missing), endpoint));
        }
      }
      const bool abandoned = joined < 0;
      if (abandoned || Clock::now() >= deadline) {
        const std::vector<int> missing = missingRanks();
        if (abandoned) {
          store.add(seenKey, 1);
        } else if (options.hostsServer()) {
          // The server dies with this rank's error: the ranks that joined learn why first (the
          // count turns negative), instead of failing on a lost store.
          const std::int64_t others = store.add(countKey, kAbandoned) - kAbandoned - 1;
          const auto until = Clock::now() + std::chrono::seconds(2);
          while (store.add(seenKey, 0) < others && Clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }
        throw TimeoutError(fmt::format(
            "rank {} timed out after {} forming the world (--join-timeout): ranks {} did not "
            "join the c10d store at {}{}; start them (or see why they exited), or raise "
            "--join-timeout",
            options.rank, collective::formatSeconds(options.joinBound()),
            collective::formatRankList(missing), endpoint,
            abandoned ? " (the store's host gave up at its join deadline)" : ""));
      }
      std::this_thread::sleep_for(
          std::min(pause, std::chrono::ceil<std::chrono::milliseconds>(
                              std::max(Clock::duration::zero(), deadline - Clock::now()))));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
      joined = store.add(countKey, 0);
    }
    boundReads(store, options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    const std::string reason = c10d_compat::messageOf(error);
    if (c10d_compat::isTimeout(reason)) {
      throw TimeoutError(fmt::format(
          "rank {} timed out after {} forming the world (--join-timeout): the c10d store at {} "
          "did not answer ({}); its host is down, overloaded or cut off from this one",
          options.rank, collective::formatSeconds(options.joinBound()), endpoint, reason));
    }
    if (c10d_compat::isConnectionLost(reason)) {
      throw RankFailure(fmt::format(
          "rank {} lost the c10d store at {} while forming the world: {}; its host (rank 0, or "
          "the launcher's agent) exited or was killed: see that process's output for why",
          options.rank, endpoint, reason));
    }
    throw BackendError(fmt::format("rank {} forming the world: c10d store {} failed: {}",
                                   options.rank, endpoint, reason));
  }
}

void leaveStore(c10d::Store& store, bool hostsServer,
                const StoreTransportOptions& options) noexcept {
  try {
    store.set(fmt::format("{}/bye/{}", options.prefix, options.rank), {1});
    if (!hostsServer || options.worldSize == 1) return;
    std::vector<int> waiting;
    for (int peer = 0; peer < options.worldSize; ++peer) {
      if (peer != options.rank) waiting.push_back(peer);
    }
    // Polls (one request for every key) rather than one wait, so that a peer announced dead
    // is not waited for.
    const auto byeKey = [&](int peer) { return fmt::format("{}/bye/{}", options.prefix, peer); };
    const std::string anyDead = options.prefix + "/kv/" + collective::kAnyDeadKey;
    const auto deadline = collective::Clock::now() + options.timeout;
    for (;;) {
      std::vector<std::string> keys;
      for (int peer : waiting) keys.push_back(byeKey(peer));
      if (store.check(keys)) return;
      if (store.check({anyDead})) {
        waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                     [&](int peer) {
                                       return store.check({byeKey(peer)}) ||
                                              store.check({deadKeyOf(options.prefix, peer)});
                                     }),
                      waiting.end());
        if (waiting.empty()) return;
      }
      if (collective::Clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    // A peer that died or timed out: nothing more to wait for.
  }
}

std::string deadKeyOf(const std::string& prefix, int rank) {
  return prefix + "/kv/" + collective::deadRankKey(rank);
}

std::string StoreTransportState::exchangeKey(std::uint64_t sequence, int rank) const {
  return fmt::format("{}/x/{}/{}", options.prefix,
                     sequence % static_cast<std::uint64_t>(options.keySlots), rank);
}

std::string StoreTransportState::readKey(std::uint64_t sequence, int rank) const {
  return fmt::format("{}/r/{}/{}", options.prefix,
                     sequence % static_cast<std::uint64_t>(options.keySlots), rank);
}

namespace {

// How long a TCP handshake with the store's host may take before a fresh connection is given
// up as unreachable (the out-of-band view's kHandshakeDeadline).
constexpr std::chrono::milliseconds kFreshHandshake{500};

c10::intrusive_ptr<c10d::TCPStore> freshConnection(const StoreTransportState& s,
                                                   std::string_view context) {
  // A host cut off or powered off never completes a handshake, and c10d's connect would retry
  // for its whole 2 s: after a timed-out exchange that cost a cut-off rank 2 s past its
  // deadline. Its kernel answers within milliseconds when it is up, however loaded.
  const std::string unreachable =
      handshakeFails(resolveAddresses(s.options.host, s.port), kFreshHandshake);
  if (!unreachable.empty()) {
    throw RankFailure(fmt::format(
        "{}: the c10d store server at {} is gone: {} (its host is down or cut off from this "
        "one, or the store's process ended)",
        context, s.endpoint(), unreachable));
  }
  try {
    StoreTransportOptions quick = s.options;
    quick.timeout = std::min(s.options.timeout, std::chrono::milliseconds(2000));
    quick.joinTimeout.reset();  // the world formed long ago: the server is there or gone
    // Requests get the whole store timeout, like the first connection's, not the 2 s.
    return connectTcpStore(quick, false, false, s.port, s.options.timeout);
  } catch (const Error& error) {
    throw RankFailure(fmt::format("{}: the c10d store server at {} is gone: {}", context,
                                  s.endpoint(), error.what()));
  }
}

}  // namespace

void StoreTransportState::reconnect(std::string_view context) {
  client = freshConnection(*this, context);
  waiter = freshConnection(*this, context);
}

void StoreTransportState::reconnectWaiter(std::string_view context) {
  waiter = freshConnection(*this, context);
}

// The hosting rank's closedPeers(): a LivenessTable over a connection of its own, made at the
// first question.
struct PeerAddressBook {
  int self = 0;
  int worldSize = 0;
  std::function<std::shared_ptr<collective::KeyValueStore>()> connect;
  std::atomic<bool> alive{true};  // false once the transport (and its server) is gone
  std::mutex mutex;
  std::shared_ptr<collective::KeyValueStore> kv;
  std::optional<collective::LivenessTable> table;

  std::vector<int> closed() {
    if (!alive) return {};
    std::lock_guard<std::mutex> lock(mutex);
    std::vector<int> others;
    for (int rank = 0; rank < worldSize; ++rank) {
      if (rank != self) others.push_back(rank);
    }
    try {
      if (!kv) kv = connect();
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: cannot connect to read the ranks' liveness connections: {}", self,
                    error.what());
      return {};
    }
    const std::vector<int> ended = table->ended(*kv, others);
    return alive ? ended : std::vector<int>{};
  }
};

}  // namespace hmc::detail

namespace hmc::collective {

namespace {
// A new connection to the store of a formed world (keyValueStore()'s), from a copy of what it
// needs: usable where the transport may be gone (PeerAddressBook's first question).
std::shared_ptr<KeyValueStore> formedKeyValueStore(StoreTransportOptions formed, int port);
}  // namespace

std::vector<int> LivenessTable::ended(KeyValueStore& kv, const std::vector<int>& ranks) {
  try {
    for (const int rank : ranks) {
      if (ends_.count(rank) != 0) continue;
      const std::string key = addressKey(rank);
      if (!kv.check({key})) continue;
      const Bytes value = kv.get(key, std::chrono::milliseconds(500));
      ends_[rank] = std::string(value.begin(), value.end());
    }
  } catch (const std::exception& error) {
    spdlog::debug("the ranks' liveness connections: cannot read their ends: {}", error.what());
  }
  const auto peers = hmc::detail::establishedPeersOf(port_);
  if (!peers) return {};
  std::vector<int> out;
  for (const int rank : ranks) {
    const auto it = ends_.find(rank);
    if (it != ends_.end() && peers->count(it->second) == 0) out.push_back(rank);
  }
  return out;
}

Collective::ClosedPeers StoreTransport::closedPeers() const {
  const std::shared_ptr<hmc::detail::PeerAddressBook> book = state_->addressBook;
  if (!book) return nullptr;
  return [book] { return book->closed(); };
}

StoreTransport::StoreTransport(const StoreTransportOptions& options)
    : Collective(options.rank, options.worldSize, options.timeout),
      state_(std::make_unique<hmc::detail::StoreTransportState>()) {
  options.validate();
  auto& s = *state_;
  s.options = options;
  s.port = options.port;
  // One join deadline for everything that forms the world; exchanges have the timeout.
  const auto deadline = Clock::now() + options.joinBound();
  if (options.hostsServer()) {
    s.server = hmc::detail::connectTcpStore(options, true, true, options.port);
    s.port = s.server->getPort();
    s.client = s.server;
  } else {
    s.client = hmc::detail::connectTcpStore(options, false, true, options.port);
  }
  s.waiter = hmc::detail::connectTcpStore(options, false, true, s.port);
  s.janitor = std::make_unique<hmc::detail::KeyJanitor>(
      hmc::detail::connectTcpStore(options, false, true, s.port));
  std::string liveness;
  if (options.worldSize > 1) {
    const auto [fd, end] = hmc::detail::openLiveness(options.host, s.port, std::chrono::seconds(1));
    s.liveness.fd = fd;
    liveness = end;
  }
  hmc::detail::joinWorld(*s.client, options, s.endpoint(), deadline, liveness);
  if (options.hostsServer() && options.worldSize > 1) {
    s.addressBook = std::make_shared<hmc::detail::PeerAddressBook>();
    s.addressBook->self = options.rank;
    s.addressBook->worldSize = options.worldSize;
    s.addressBook->table.emplace(s.port);
    s.addressBook->connect = [options = s.options, port = s.port] {
      return formedKeyValueStore(options, port);
    };
  }
}

StoreTransport::~StoreTransport() {
  auto& s = *state_;
  if (s.addressBook) s.addressBook->alive = false;
  s.janitor.reset();
  hmc::detail::leaveStore(*s.client, s.server.defined(), s.options);
}

int StoreTransport::port() const noexcept { return state_->port; }
std::chrono::milliseconds StoreTransport::joinTimeout() const noexcept {
  return state_->options.joinBound();
}
const std::string& StoreTransport::host() const noexcept { return state_->options.host; }

namespace {

// c10d's client as the out-of-band view's connection (store_connection.hpp): its errors as
// ConnectionFailure, timed out or broken.
class C10dConnection final : public hmc::detail::StoreConnection {
 public:
  explicit C10dConnection(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    guarded([&] { store_->set(key, value); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return guarded([&] { return store_->check(keys); });
  }
  std::vector<std::uint8_t> getExisting(const std::string& key) override {
    return guarded([&] { return compat::getExisting(*store_, {key}).front(); });
  }
  bool deleteKey(const std::string& key) override {
    return guarded([&] { return store_->deleteKey(key); });
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return guarded([&] { return store_->add(key, delta); });
  }

 private:
  template <typename Fn>
  static auto guarded(Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      const std::string reason = compat::messageOf(error);
      throw hmc::detail::ConnectionFailure(reason, compat::isTimeout(reason));
    }
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
};

// The view over c10d connections that `connect` opens.
std::shared_ptr<KeyValueStore> c10dKeyValueStore(
    std::function<c10::intrusive_ptr<c10d::TCPStore>(std::chrono::milliseconds)> connect,
    std::chrono::milliseconds timeout, std::string prefix, const std::string& host, int port) {
  return hmc::detail::makeStoreKeyValue(
      [connect = std::move(connect)](std::chrono::milliseconds reads) {
        return std::unique_ptr<hmc::detail::StoreConnection>(
            new C10dConnection(connect(reads)));
      },
      timeout, std::move(prefix), host, port);
}

}  // namespace

std::shared_ptr<KeyValueStore> connectKeyValueStore(const StoreTransportOptions& options) {
  StoreTransportOptions client = options;
  client.isServer = false;
  client.validate();
  return c10dKeyValueStore(
      [client](std::chrono::milliseconds reads) {
        return hmc::detail::connectTcpStore(client, false, false, client.port, reads);
      },
      client.timeout, client.prefix + "/kv/", client.host, client.port);
}

std::shared_ptr<KeyValueStore> StoreTransport::keyValueStore() {
  return formedKeyValueStore(state_->options, state_->port);
}

namespace {
std::shared_ptr<KeyValueStore> formedKeyValueStore(StoreTransportOptions formed, int port) {
  formed.joinTimeout.reset();  // the world has formed: the server is there
  return c10dKeyValueStore(
      [formed, port](std::chrono::milliseconds reads) {
        return hmc::detail::connectTcpStore(formed, false, false, port, reads);
      },
      formed.timeout, formed.prefix + "/kv/", formed.host, port);
}
}  // namespace

namespace {

// Before this rank's key of `sequence` is written: key names are reused every keySlots
// exchanges, so its key of `sequence + 1 - keySlots` (the name exchange `sequence + 1` reuses;
// every rank read it, since every rank has finished `sequence - 2`) must be gone, so that no
// peer reads it as new, and no delete of an older value of these names may still be on its way
// to the server, where it would remove the new one.
void settleStaleKeys(hmc::detail::StoreTransportState& s, std::uint64_t sequence, int self,
                     Clock::time_point deadline, const std::string& context,
                     std::chrono::milliseconds timeout) {
  const auto slots = static_cast<std::uint64_t>(s.options.keySlots);
  if (sequence + 1 < slots) return;
  const std::uint64_t stale = sequence + 1 - slots;
  const std::optional<bool> deleted = s.janitor->settle(stale, deadline);
  if (!deleted) {
    throw TimeoutError(fmt::format(
        "{}: this rank's deletes of exchange keys up to #{} had not reached the c10d store "
        "at {} by the deadline ({}); the store answers too slowly (is its host overloaded?)",
        context, stale, s.endpoint(), formatSeconds(timeout)));
  }
  if (!*deleted) {
    s.client->deleteKey(s.exchangeKey(stale, self));
    if (!s.options.hostsServer()) s.client->deleteKey(s.readKey(stale, self));
  }
}

// On the hosting rank, while it waits for the values of exchange `sequence`: a missing peer
// whose connection to the store closed (its process ended: liveness, closedPeers) is not
// coming. The host announces it in the store, as a launcher does (dead/<rank>), so that every
// rank waiting there fails at once, and fails itself in tcp's words. Before, under mpirun and
// srun (no launcher of hmc's to announce it) the ranks waited out the deadline, or met the
// launcher's teardown first and their recordings lost the call they were in (chaos --modes
// hosts --run-seed 599448387).
// `seenBefore`: the peers this wait saw closed on an earlier poll.
void failIfOneClosed(hmc::detail::StoreTransportState& s, const Collective::ClosedPeers& closed,
                     const std::vector<int>& peers, std::uint64_t sequence,
                     std::string_view stage, int self, std::vector<int>& seenBefore) {
  if (!closed) return;
  const std::vector<int> gone = closed();
  if (gone.empty()) return;
  const std::vector<int> missing = absentPeers(s, peers, sequence);
  for (const int peer : gone) {
    if (std::find(missing.begin(), missing.end(), peer) == missing.end()) continue;
    // Seen closed on two polls in a row: a launcher of hmc's own (hmc-run) announces the
    // rank's end, in better words (its exit status), within a poll; its notice comes first.
    if (std::find(seenBefore.begin(), seenBefore.end(), peer) == seenBefore.end()) {
      seenBefore.push_back(peer);
      continue;
    }
    const std::string why = fmt::format(
        "its connection to the store's host (rank {}) closed in '{}' #{}: {}", self, stage,
        sequence, hmc::detail::kClosedConnectionWhy);
    try {
      // Where absent only: never over a launcher's notice.
      const std::vector<std::uint8_t> value(why.begin(), why.end());
      s.client->compareSet(hmc::detail::deadKeyOf(s.options.prefix, peer), {}, value);
      s.client->set(s.options.prefix + "/kv/" + collective::kAnyDeadKey,
                    std::vector<std::uint8_t>{'1'});
    } catch (const std::exception& error) {
      spdlog::debug("rank {}: announcing rank {} dead: {}", self, peer, error.what());
    }
    throw RankFailure(hmc::detail::lostRankText(peer, hmc::detail::kClosedConnection, stage,
                                                sequence, hmc::detail::kClosedConnectionWhy));
  }
}

// Waits until every peer's key of exchange `sequence` is in the store. The common case: one
// blocking wait, on the waiter connection (see StoreTransportState::waiter); a wait that
// times out leaves its connection owing an answer, so the next wait uses a fresh one. Then it
// polls, two requests a round whatever the world size (all keys there? anyone announced
// dead?), and looks rank by rank only then. Throws RankFailure for a peer announced dead (or,
// on the host, one whose connection closed), TimeoutError at the deadline naming the peers
// that did not arrive; returns when they all did, also when the last ones came as it gave up.
void awaitValues(hmc::detail::StoreTransportState& s, const std::vector<int>& peers,
                 const std::vector<std::string>& peerKeys, std::uint64_t sequence,
                 std::string_view stage, int self, std::chrono::milliseconds timeout,
                 Clock::time_point deadline, const Collective::ClosedPeers& closed,
                 const std::string& context) {
  const auto first = std::min(remainingUntil(deadline), StoreTransport::kFirstWait);
  try {
    s.waiter->wait(peerKeys, first);
    return;
  } catch (const std::exception& error) {
    if (!compat::isTimeout(error)) throw;
    s.reconnectWaiter(context);
  }
  const std::string anyDead = s.options.prefix + "/kv/" + collective::kAnyDeadKey;
  std::vector<int> seenClosed;  // failIfOneClosed's first sightings
  while (!s.client->check(peerKeys)) {
    if (s.client->check({anyDead})) {
      const std::vector<int> missing = absentPeers(s, peers, sequence);
      for (int peer : missing) {
        const std::string dead = hmc::detail::deadKeyOf(s.options.prefix, peer);
        if (s.client->check({dead})) {
          const std::string why = compat::toBytes(compat::getExisting(*s.client, {dead}).front());
          throw RankFailure(hmc::detail::lostRankText(
              peer, hmc::detail::kAnnouncedDead, stage, sequence,
              fmt::format("{}; {}", why, hmc::detail::notArrivedText(missing))));
        }
      }
    }
    failIfOneClosed(s, closed, peers, sequence, stage, self, seenClosed);
    if (Clock::now() >= deadline) {
      const std::vector<int> absent = giveUpOn(s, peers, sequence, self);
      if (!absent.empty()) {
        throw TimeoutError(hmc::detail::timedOutText(stage, sequence, self, timeout,
                                                    hmc::detail::notArrivedText(absent)));
      }
      return;
    }
    std::this_thread::sleep_for(std::min(remainingUntil(deadline), StoreTransport::kPollInterval));
  }
}

}  // namespace

std::vector<Bytes> StoreTransport::gather(std::uint64_t sequence, std::string_view stage,
                                          const Bytes& envelope, Clock::time_point deadline) {
  auto& s = *state_;
  const int self = rank();
  const int world = worldSize();
  std::vector<int> peers;
  std::vector<std::string> peerKeys;
  peers.reserve(world - 1);
  peerKeys.reserve(world - 1);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == self) continue;
    peers.push_back(peer);
    peerKeys.push_back(s.exchangeKey(sequence, peer));
  }
  const std::string context = fmt::format("'{}' #{} on rank {}", stage, sequence, self);
  // After a failure, as the tcp and gloo transports: the ranks no longer agree on where they
  // are (a rank that did not come to #N would meet the others' #N+1 as its #N), and each later
  // collective would wait its whole deadline again for the rank that did not come (chaos
  // --modes hosts --run-seed 1438289707: a rank SIGSTOPped 7.7 s, the verdict 7.8 s after).
  if (s.broken) {
    throw BackendError(fmt::format(
        "{}: the store transport is unusable after an earlier failure ({})", context,
        *s.broken));
  }
  const auto broke = [&](const std::string& why) { s.broken = why; };
  const bool hosts = s.options.hostsServer();
  // The host watches its peers' connections (closedPeers); the others learn from its notice.
  const ClosedPeers closed = hosts ? closedPeers() : nullptr;
  bool waiting = false;
  try {
    settleStaleKeys(s, sequence, self, deadline, context, timeout());
    arrive(s, s.exchangeKey(sequence, self), compat::toVector(envelope), stage, sequence, self,
           context);
    std::vector<Bytes> out(world);
    out[self] = envelope;
    if (world > 1) {
      waiting = true;
      awaitValues(s, peers, peerKeys, sequence, stage, self, timeout(), deadline, closed,
                  context);
      waiting = false;
      const auto values = compat::getExisting(*s.client, peerKeys);
      failIfOneGaveUp(peers, values, stage, sequence, self, timeout());
      for (std::size_t i = 0; i < peers.size(); ++i) out[peers[i]] = compat::toBytes(values[i]);
      if (hosts) awaitReads(s, peers, sequence, stage, self, closed);
    }
    // Every rank has entered this exchange, so every rank has finished reading the previous
    // one (and the hosting rank its receipts): our keys of it can go.
    if (sequence > 0) {
      s.janitor->erase(sequence - 1, s.exchangeKey(sequence - 1, self));
      if (!hosts) s.janitor->erase(sequence - 1, s.readKey(sequence - 1, self));
    }
    if (world > 1 && !hosts) s.janitor->set(sequence, s.readKey(sequence, self));
    return out;
  } catch (const Error& error) {
    broke(error.what());
    throw;
  } catch (const std::exception& error) {
    const std::string reason = compat::messageOf(error);
    const bool timedOut = waiting && (compat::isTimeout(reason) || Clock::now() >= deadline);
    if (!timedOut && compat::isConnectionLost(reason)) {
      RankFailure gone(fmt::format("{}: the c10d store server at {} is gone: {}", context,
                                   s.endpoint(), reason));
      broke(gone.what());
      throw gone;
    }
    // The old connection may still owe an answer to the wait: never reuse it.
    s.reconnect(context);
    if (!timedOut) {
      BackendError failed(
          fmt::format("{}: c10d store {} failed: {}", context, s.endpoint(), reason));
      broke(failed.what());
      throw failed;
    }
    TimeoutError late = TimeoutError(hmc::detail::timedOutText(
        stage, sequence, self, timeout(),
        hmc::detail::notArrivedText(giveUpOn(s, peers, sequence, self))));
    broke(late.what());
    throw late;
  }
}

}  // namespace hmc::collective
