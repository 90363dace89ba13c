#include "hmc/collective/gloo_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d_compat.hpp"
#include "hmc/error.hpp"
#include "store_transport_state.hpp"
#include "wait_text.hpp"

namespace hmc::detail {

namespace {

using WallTime = std::chrono::system_clock::time_point;

long long wallMillis(WallTime time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}

// A process group whose collectives have another deadline than its creation: 1.13 takes one
// timeout for both (Options::timeout, copied into each gloo context at creation) and has no
// setter; the contexts are protected. Formed under the join deadline, then set to the
// collective one.
class GlooGroup final : public c10d::ProcessGroupGloo {
 public:
  using ProcessGroupGloo::ProcessGroupGloo;
  void setCollectiveTimeout(std::chrono::milliseconds timeout) {
    options_->timeout = timeout;
    for (auto& context : contexts_) context->setTimeout(timeout);
  }
};

}  // namespace

struct GlooTransportState {
  collective::GlooTransportOptions options;
  int port = 0;
  c10::intrusive_ptr<c10d::TCPStore> store;  // owns the server on the hosting rank
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  int generation = 0;
  std::optional<std::string> broken;  // why the group is unusable

  std::string endpoint() const { return fmt::format("{}:{}", options.store.host, port); }
  std::string arrivalKey(std::uint64_t sequence, int rank) const {
    return fmt::format("{}/at/{}/{}", options.store.prefix, sequence, rank);
  }

  // After a failed allgather: which ranks had not entered collective `sequence` by this rank's
  // deadline. Ranks that entered fail too (within the arrival skew, or at once when a failing
  // rank closes its group) and leave a key saying when they entered and when they failed; we
  // look for the others' keys for up to `grace`, on a fresh connection. A rank that enters
  // after our deadline fails at once on the closed connections and leaves a key within the
  // grace too: its entry time tells it apart. The times are wall-clock milliseconds, so
  // ranks on different hosts compare them within their clocks' skew. Throws when the store is
  // gone.
  struct Arrivals {
    std::vector<int> absent;      // no key, or entered after our deadline
    std::vector<int> leftBefore;  // had failed before we entered
    std::string deadWhy;          // a launcher's announcement, when every absent rank was one
  };
  Arrivals absentRanks(std::uint64_t sequence, int self, int world, std::chrono::milliseconds grace,
                       WallTime entered, WallTime failed, WallTime deadline) {
    StoreTransportOptions quick = options.store;
    quick.timeout = std::min(quick.timeout, std::chrono::milliseconds(2000));
    quick.joinTimeout.reset();
    auto probe = connectTcpStore(quick, false, false, port);
    probe->set(arrivalKey(sequence, self), c10d_compat::toVector(fmt::format(
                                               "{} {}", wallMillis(entered), wallMillis(failed))));
    Arrivals out;
    std::vector<int> unseen;
    for (int peer = 0; peer < world; ++peer) {
      if (peer != self) unseen.push_back(peer);
    }
    const auto end = collective::Clock::now() + grace;
    for (;;) {
      for (auto it = unseen.begin(); it != unseen.end();) {
        const std::string key = arrivalKey(sequence, *it);
        if (!probe->check({key})) {
          ++it;
          continue;
        }
        long long peerEntered = 0;
        long long peerFailed = 0;
        std::istringstream value(c10d_compat::toBytes(probe->get(key)));
        if (value >> peerEntered >> peerFailed) {
          if (peerEntered > wallMillis(deadline)) out.absent.push_back(*it);
          if (peerFailed < wallMillis(entered)) out.leftBefore.push_back(*it);
        }
        it = unseen.erase(it);
      }
      if (unseen.empty() || collective::Clock::now() >= end) break;
      // Ranks a launcher announced dead will not arrive: stop waiting for them.
      if (probe->check({options.store.prefix + "/kv/" + collective::kAnyDeadKey}) &&
          std::all_of(unseen.begin(), unseen.end(), [&](int peer) {
            return probe->check({deadKeyOf(options.store.prefix, peer)});
          })) {
        out.deadWhy = c10d_compat::toBytes(probe->get(deadKeyOf(options.store.prefix, unseen[0])));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    out.absent.insert(out.absent.end(), unseen.begin(), unseen.end());
    std::sort(out.absent.begin(), out.absent.end());
    if (!out.deadWhy.empty() && out.absent != unseen) out.deadWhy.clear();
    return out;
  }

  // Creates the process group within `setup` (the rest of the join deadline at construction,
  // the collective one in rebuild()); its collectives then have options.store.timeout.
  // `joining`: at construction, and a timeout says it was the join.
  void createGroup(std::chrono::milliseconds setup, bool joining) {
    const auto& so = options.store;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("{}/pg/{}", so.prefix, generation), store);
    auto pgOptions = c10d::ProcessGroupGloo::Options::create(setup);
    pgOptions->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.deviceHost));
    pgOptions->threads = options.threads;
    try {
      auto created = c10::make_intrusive<GlooGroup>(prefixed, so.rank, so.worldSize, pgOptions);
      created->setCollectiveTimeout(so.timeout);
      group = std::move(created);
      // The rendezvous' waits left this connection's read deadline at `setup`.
      store->wait({}, so.timeout);
    } catch (const std::exception& error) {
      const std::string reason = c10d_compat::messageOf(error);
      if (c10d_compat::isTimeout(reason)) {
        if (joining) {
          throw TimeoutError(fmt::format(
              "rank {} timed out after {} forming the world (--join-timeout): creating the gloo "
              "process group (store {}): {}; start every rank, or raise --join-timeout",
              so.rank, fmt::format("{:g} s", static_cast<double>(setup.count()) / 1000.0),
              endpoint(), reason));
        }
        throw TimeoutError(fmt::format(
            "rank {} timed out after {} ms creating the gloo process group (store {}): {}", so.rank,
            setup.count(), endpoint(), reason));
      }
      throw BackendError(fmt::format("rank {}: ProcessGroupGloo (store {}) failed: {}", so.rank,
                                     endpoint(), reason));
    }
    broken.reset();
  }
};

}  // namespace hmc::detail

namespace hmc::collective {

namespace compat = hmc::detail::c10d_compat;

namespace {

constexpr std::size_t kLengthBytes = 8;

using detail::formatSeconds;

// One allgather of `slot`-byte frames: [u64 length][bytes, zero padded]. `running` is set
// when it throws because `wait` passed while the allgather still runs.
std::vector<at::Tensor> allgatherFrames(c10d::ProcessGroupGloo& group, const Bytes& envelope,
                                        std::size_t slot, int world, std::chrono::milliseconds wait,
                                        bool* running) {
  at::Tensor input = at::zeros({static_cast<std::int64_t>(slot)}, at::kByte);
  const std::uint64_t length = envelope.size();
  std::memcpy(input.data_ptr(), &length, kLengthBytes);
  std::memcpy(static_cast<char*>(input.data_ptr()) + kLengthBytes, envelope.data(),
              std::min(envelope.size(), slot - kLengthBytes));
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int peer = 0; peer < world; ++peer) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  auto work = group.allgather(outputs, inputs);
  try {
    work->wait(wait);
  } catch (...) {
    *running = !work->isCompleted();
    throw;
  }
  return outputs[0];
}

std::uint64_t frameLength(const at::Tensor& frame) {
  std::uint64_t length = 0;
  std::memcpy(&length, frame.data_ptr(), kLengthBytes);
  return length;
}

}  // namespace

void GlooTransportOptions::validate() const {
  store.validate();
  if (threads < 1)
    throw ValueError(fmt::format("gloo threads must be at least 1, got {}", threads));
  if (slotBytes <= kLengthBytes) {
    throw ValueError(fmt::format("gloo slotBytes must exceed {}, got {}", kLengthBytes, slotBytes));
  }
  if (deviceHost.empty()) throw ValueError("the gloo device host is empty");
}

GlooTransport::GlooTransport(const GlooTransportOptions& options)
    : Collective(options.store.rank, options.store.worldSize, options.store.timeout),
      state_(std::make_unique<hmc::detail::GlooTransportState>()) {
  options.validate();
  auto& s = *state_;
  s.options = options;
  s.options.store.prefix = options.store.prefix + "/gloo";
  const bool host = options.store.hostsServer();
  // One join deadline for the store, the barrier and the group; collectives have the timeout.
  const auto deadline = Clock::now() + options.store.joinBound();
  s.store = hmc::detail::connectTcpStore(s.options.store, host, true, options.store.port);
  s.port = host ? s.store->getPort() : options.store.port;
  // Every rank there first, so that a rank that never starts is named (gloo's own rendezvous
  // only times out).
  hmc::detail::joinWorld(*s.store, s.options.store, s.endpoint(), deadline);
  s.createGroup(std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                         std::chrono::milliseconds(1000)),
                true);
}

GlooTransport::~GlooTransport() {
  auto& s = *state_;
  s.group.reset();
  hmc::detail::leaveStore(*s.store, s.options.store.hostsServer(), s.options.store);
}

int GlooTransport::port() const noexcept { return state_->port; }
bool GlooTransport::broken() const noexcept { return state_->broken.has_value(); }

void GlooTransport::rebuild() {
  auto& s = *state_;
  s.group.reset();
  ++s.generation;
  s.createGroup(s.options.store.timeout, false);
}

std::vector<Bytes> GlooTransport::gather(std::uint64_t sequence, std::string_view stage,
                                         const Bytes& envelope, Clock::time_point deadline) {
  auto& s = *state_;
  const int self = rank();
  const int world = worldSize();
  const auto context = [&] { return fmt::format("'{}' #{} on rank {}", stage, sequence, self); };
  if (s.broken) {
    throw BackendError(fmt::format(
        "{}: the gloo process group is unusable after an earlier failure ({}); every rank must "
        "call rebuild()",
        context(), *s.broken));
  }
  // The process group's own timeout ends the operation; the extra second lets its error (a
  // better message than ours) arrive first.
  const auto wait =
      std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
               std::chrono::milliseconds(1)) +
      std::chrono::seconds(1);
  const auto entered = std::chrono::system_clock::now();
  bool running = false;
  try {
    const std::size_t slot = s.options.slotBytes;
    std::vector<at::Tensor> frames =
        allgatherFrames(*s.group, envelope, slot, world, wait, &running);
    std::uint64_t longest = 0;
    for (const auto& frame : frames) longest = std::max(longest, frameLength(frame));
    if (longest + kLengthBytes > slot) {
      frames = allgatherFrames(*s.group, envelope, longest + kLengthBytes, world, wait, &running);
    }
    std::vector<Bytes> out(world);
    for (int peer = 0; peer < world; ++peer) {
      const auto* data = static_cast<const char*>(frames[peer].data_ptr());
      out[peer].assign(data + kLengthBytes, frameLength(frames[peer]));
    }
    return out;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    const std::string reason = compat::messageOf(error);
    const auto failedAt = Clock::now();
    const auto failed = std::chrono::system_clock::now();
    s.broken = fmt::format("'{}' #{}: {}", stage, sequence, reason);
    // Close this rank's side at once: a peer still waiting in this allgather (the ring passes
    // frames along, so one rank's failure can leave another waiting on a live rank) fails on
    // the closed connection instead of at its own deadline, and leaves its arrival key in
    // time. Not while the allgather still runs: the group's destructor would wait for it.
    if (!running) s.group.reset();
    hmc::detail::GlooTransportState::Arrivals arrivals;
    try {
      arrivals = s.absentRanks(
          sequence, self, world, std::min(timeout(), std::chrono::milliseconds(2000)), entered,
          failed,
          failed +
              std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - failedAt));
    } catch (const std::exception&) {
      throw RankFailure(
          fmt::format("{}: the c10d store server at {} is gone (so is the rank "
                      "hosting it); gloo: {}",
                      context(), s.endpoint(), reason));
    }
    const std::vector<int>& absent = arrivals.absent;
    const std::string gloo = fmt::format("(gloo: {})", reason);
    if (!arrivals.deadWhy.empty()) {
      // deadWhy is set only when every absent rank was announced dead; it is the first's.
      throw RankFailure(hmc::detail::lostRankText(
          absent.front(), hmc::detail::kAnnouncedDead, stage, sequence,
          fmt::format("{}; {} {}", arrivals.deadWhy, hmc::detail::notArrivedText(absent), gloo)));
    }
    if (absent.empty() && !arrivals.leftBefore.empty()) {
      // This rank is the late one: the others gave up on the collective before it entered.
      throw TimeoutError(hmc::detail::arrivedLateText(
          stage, sequence, self, arrivals.leftBefore,
          fmt::format("their deadline passed or they failed; gloo: {}", reason)));
    }
    if (compat::isTimeout(reason) || Clock::now() >= deadline) {
      throw TimeoutError(hmc::detail::timedOutText(
          stage, sequence, self, timeout(),
          fmt::format("{} {}", hmc::detail::notArrivedText(absent), gloo)));
    }
    if (compat::isConnectionLost(reason)) {
      // Which peer closed its connection gloo does not say; the ranks without a key are named.
      const std::string named =
          absent.empty() ? std::string() : "; " + hmc::detail::notArrivedText(absent);
      throw RankFailure(hmc::detail::lostRankText(
          "a peer", hmc::detail::kClosedConnection, stage, sequence,
          fmt::format("{}{} {}", hmc::detail::kClosedConnectionWhy, named, gloo)));
    }
    throw BackendError(fmt::format("{}: gloo allgather failed: {}", context(), reason));
  }
}

}  // namespace hmc::collective
