#include "hmc/collective/gloo_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d_compat.hpp"
#include "hmc/error.hpp"
#include "store_transport_state.hpp"

namespace hmc::detail {

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

  // After a failed allgather: which ranks never entered collective `sequence`. Ranks that
  // entered fail too (within the arrival skew) and leave a key; we look for the others' keys
  // for up to `grace`, on a fresh connection. Throws when the store is gone.
  // `deadWhy`: set to a launcher's announcement when every absent rank was announced dead.
  std::vector<int> absentRanks(std::uint64_t sequence, int self, int world,
                               std::chrono::milliseconds grace, std::string* deadWhy) {
    StoreTransportOptions quick = options.store;
    quick.timeout = std::min(quick.timeout, std::chrono::milliseconds(2000));
    auto probe = connectTcpStore(quick, false, false, port);
    probe->set(arrivalKey(sequence, self), {1});
    std::vector<int> absent;
    for (int peer = 0; peer < world; ++peer) {
      if (peer != self) absent.push_back(peer);
    }
    const auto end = collective::Clock::now() + grace;
    for (;;) {
      absent.erase(
          std::remove_if(absent.begin(), absent.end(),
                         [&](int peer) { return probe->check({arrivalKey(sequence, peer)}); }),
          absent.end());
      if (absent.empty() || collective::Clock::now() >= end) return absent;
      // Ranks a launcher announced dead will not arrive: stop waiting for them.
      if (probe->check({options.store.prefix + "/kv/" + collective::kAnyDeadKey}) &&
          std::all_of(absent.begin(), absent.end(), [&](int peer) {
            return probe->check({deadKeyOf(options.store.prefix, peer)});
          })) {
        *deadWhy = c10d_compat::toBytes(probe->get(deadKeyOf(options.store.prefix, absent[0])));
        return absent;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void createGroup() {
    const auto& so = options.store;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("{}/pg/{}", so.prefix, generation), store);
    auto pgOptions = c10d::ProcessGroupGloo::Options::create(so.timeout);
    pgOptions->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.deviceHost));
    pgOptions->threads = options.threads;
    try {
      group =
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, so.rank, so.worldSize, pgOptions);
    } catch (const std::exception& error) {
      const std::string reason = c10d_compat::messageOf(error);
      if (c10d_compat::isTimeout(reason)) {
        throw TimeoutError(fmt::format(
            "rank {} timed out after {} ms creating the gloo process group (store {}): {}", so.rank,
            so.timeout.count(), endpoint(), reason));
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

std::string formatSeconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

// One allgather of `slot`-byte frames: [u64 length][bytes, zero padded].
std::vector<at::Tensor> allgatherFrames(c10d::ProcessGroupGloo& group, const Bytes& envelope,
                                        std::size_t slot, int world,
                                        std::chrono::milliseconds wait) {
  at::Tensor input = at::zeros({static_cast<std::int64_t>(slot)}, at::kByte);
  const std::uint64_t length = envelope.size();
  std::memcpy(input.data_ptr(), &length, kLengthBytes);
  std::memcpy(static_cast<char*>(input.data_ptr()) + kLengthBytes, envelope.data(),
              std::min(envelope.size(), slot - kLengthBytes));
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int peer = 0; peer < world; ++peer) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  auto work = group.allgather(outputs, inputs);
  work->wait(wait);
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
  s.store = hmc::detail::connectTcpStore(s.options.store, host, true, options.store.port);
  s.port = host ? s.store->getPort() : options.store.port;
  s.createGroup();
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
  s.createGroup();
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
  try {
    const std::size_t slot = s.options.slotBytes;
    std::vector<at::Tensor> frames = allgatherFrames(*s.group, envelope, slot, world, wait);
    std::uint64_t longest = 0;
    for (const auto& frame : frames) longest = std::max(longest, frameLength(frame));
    if (longest + kLengthBytes > slot) {
      frames = allgatherFrames(*s.group, envelope, longest + kLengthBytes, world, wait);
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
    s.broken = fmt::format("'{}' #{}: {}", stage, sequence, reason);
    std::vector<int> absent;
    std::string deadWhy;
    try {
      absent = s.absentRanks(sequence, self, world,
                             std::min(timeout(), std::chrono::milliseconds(2000)), &deadWhy);
    } catch (const std::exception&) {
      throw RankFailure(
          fmt::format("{}: the c10d store server at {} is gone (so is the rank "
                      "hosting it); gloo: {}",
                      context(), s.endpoint(), reason));
    }
    if (!deadWhy.empty()) {
      throw RankFailure(fmt::format("{}: {}; ranks {} had not entered this collective (gloo: {})",
                                    context(), deadWhy, formatRankList(absent), reason));
    }
    if (compat::isTimeout(reason) || Clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "'{}' #{} timed out on rank {} after {}: ranks {} did not arrive (gloo: {})", stage,
          sequence, self, formatSeconds(timeout()), formatRankList(absent), reason));
    }
    if (compat::isConnectionLost(reason)) {
      throw RankFailure(
          fmt::format("{}: a peer closed its gloo connection (ranks {} had not "
                      "entered this collective): {}",
                      context(), formatRankList(absent), reason));
    }
    throw BackendError(fmt::format("{}: gloo allgather failed: {}", context(), reason));
  }
}

}  // namespace hmc::collective
