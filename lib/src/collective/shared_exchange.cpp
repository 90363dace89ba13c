#include "shared_exchange.hpp"

#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <utility>

#include "hmc/error.hpp"
#include "wait_text.hpp"

namespace hmc::detail {

// The region: one header, then one Slot per rank, then the slots' bytes ([rank][round % 2]).
// The words that ranks share are accessed with the __atomic builtins (C++17 has no
// atomic_ref), sequentially consistent where the arrival protocol needs it (below).
struct alignas(64) SharedExchange::Header {
  std::uint32_t arrivals;  // the futex word: every arrival adds 1
  std::uint32_t sleepers;  // ranks in (or about to enter) FUTEX_WAIT
};

struct alignas(64) SharedExchange::Slot {
  // The last exchange (round) this rank has published, or a gave-up mark (below) of the
  // round it had not arrived at when another rank gave up.
  std::uint64_t arrived;
  std::uint64_t sequence[2];
  std::uint64_t length[2];
};

namespace {

// A gave-up mark: the top bit, the rank that gave up in bits 40-62, the round in bits 0-39.
constexpr std::uint64_t kGaveUpBit = std::uint64_t{1} << 63;
constexpr int kRoundBits = 40;
constexpr std::uint64_t kRoundMask = (std::uint64_t{1} << kRoundBits) - 1;

std::uint64_t gaveUpMark(int by, std::uint64_t round) {
  return kGaveUpBit | (static_cast<std::uint64_t>(by) << kRoundBits) | (round & kRoundMask);
}
bool isMarkOf(std::uint64_t value, std::uint64_t round) {
  return (value & kGaveUpBit) != 0 && (value & kRoundMask) == (round & kRoundMask);
}
int markedBy(std::uint64_t value) {
  return static_cast<int>((value & ~kGaveUpBit) >> kRoundBits);
}
// Whether a slot's `arrived` word says its rank has arrived at `round`.
bool hasArrived(std::uint64_t value, std::uint64_t round) {
  return (value & kGaveUpBit) == 0 && value >= round;
}

std::size_t regionSize(int world) {
  return sizeof(SharedExchange::Header) + static_cast<std::size_t>(world) * 64 +
         static_cast<std::size_t>(world) * 2 * SharedExchange::kSlotBytes;
}

void* mapRegion(int fd, std::size_t size, const std::string& what) {
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    throw BackendError(
        fmt::format("{}: mmap of the shared exchange ({} bytes): {}", what, size, osReason(errno)));
  }
  return base;
}

}  // namespace

SharedExchange::SharedExchange(SharedExchange&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      world_(std::exchange(other.world_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedExchange& SharedExchange::operator=(SharedExchange&& other) noexcept {
  if (this != &other) {
    unmap();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    world_ = std::exchange(other.world_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SharedExchange::~SharedExchange() { unmap(); }

void SharedExchange::unmap() noexcept {
  if (base_ != nullptr) ::munmap(base_, size_);
  base_ = nullptr;
  releaseDescriptor();
}

void SharedExchange::releaseDescriptor() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SharedExchange SharedExchange::create(int world, const std::string& what) {
  static_assert(sizeof(Slot) <= 64, "a rank's slot header fits its cache line");
  SharedExchange out;
  out.world_ = world;
  out.size_ = regionSize(world);
  out.fd_ = static_cast<int>(::syscall(SYS_memfd_create, "hmc-tcp-exchange", MFD_CLOEXEC));
  if (out.fd_ < 0) {
    throw BackendError(
        fmt::format("{}: memfd_create for the shared exchange: {}", what, osReason(errno)));
  }
  if (::ftruncate(out.fd_, static_cast<off_t>(out.size_)) != 0) {
    throw BackendError(fmt::format("{}: ftruncate of the shared exchange to {} bytes: {}", what,
                                   out.size_, osReason(errno)));
  }
  out.base_ = mapRegion(out.fd_, out.size_, what);  // zero-filled: nobody has arrived
  return out;
}

SharedExchange SharedExchange::attach(int fd, int world, const std::string& what) {
  SharedExchange out;
  out.world_ = world;
  out.size_ = regionSize(world);
  out.fd_ = fd;  // closed with `out`, on a failure too
  out.base_ = mapRegion(fd, out.size_, what);
  out.releaseDescriptor();  // the mapping keeps the region
  return out;
}

SharedExchange::Header* SharedExchange::header() const noexcept {
  return static_cast<Header*>(base_);
}

SharedExchange::Slot* SharedExchange::slot(int rank) const noexcept {
  return reinterpret_cast<Slot*>(static_cast<char*>(base_) + sizeof(Header) +
                                 static_cast<std::size_t>(rank) * 64);
}

const char* SharedExchange::bytes(int peer, std::uint64_t round) const noexcept {
  return static_cast<const char*>(base_) + sizeof(Header) + static_cast<std::size_t>(world_) * 64 +
         (static_cast<std::size_t>(peer) * 2 + round % 2) * kSlotBytes;
}

// Arrival and sleep, sequentially consistent: a rank stores `arrived`, adds to `arrivals`,
// then reads every rank's `arrived` and `sleepers`; a waiter reads `arrivals`, adds to
// `sleepers`, then reads every rank's `arrived` before FUTEX_WAIT on the value it read. In
// the single order of these operations, either the waiter sees the last arrival (and does
// not sleep) or the last arriving rank sees the waiter's `sleepers` (and wakes it); an arrival
// between the waiter's read and its FUTEX_WAIT changes `arrivals`, so the wait returns at once.
// Arriving and giving up are one compare-and-swap each on the arriving rank's `arrived`: the
// rank arrives only where no mark of its round is there, and a rank gives up on it only where
// it has not arrived, so every rank sees the same outcome of the exchange.
SharedExchange::Published SharedExchange::publish(int rank, std::uint64_t round,
                                                  std::uint64_t sequence,
                                                  const std::string& envelope) {
  Slot& own = *slot(rank);
  Published out;
  std::uint64_t before = __atomic_load_n(&own.arrived, __ATOMIC_SEQ_CST);
  if (isMarkOf(before, round)) {
    out.lateAfter = markedBy(before);
    return out;
  }
  const int parity = static_cast<int>(round % 2);
  out.inSlot = envelope.size() <= kSlotBytes;
  if (out.inSlot) {
    std::memcpy(const_cast<char*>(bytes(rank, round)), envelope.data(), envelope.size());
  }
  own.sequence[parity] = sequence;
  own.length[parity] = out.inSlot ? envelope.size() : kOnSocket;
  if (!__atomic_compare_exchange_n(&own.arrived, &before, round, false, __ATOMIC_SEQ_CST,
                                   __ATOMIC_SEQ_CST)) {
    out.lateAfter = markedBy(before);  // only a giving-up rank writes another's word
    return out;
  }
  __atomic_fetch_add(&header()->arrivals, 1, __ATOMIC_SEQ_CST);
  if (allArrived(round) && __atomic_load_n(&header()->sleepers, __ATOMIC_SEQ_CST) != 0) {
    ::syscall(SYS_futex, &header()->arrivals, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  return out;
}

std::vector<int> SharedExchange::giveUp(int rank, std::uint64_t round) {
  std::vector<int> marked;
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank) continue;
    std::uint64_t seen = __atomic_load_n(&slot(peer)->arrived, __ATOMIC_SEQ_CST);
    for (;;) {
      if (hasArrived(seen, round)) break;
      if (isMarkOf(seen, round)) {  // another rank gave up on it first
        marked.push_back(peer);
        break;
      }
      if (__atomic_compare_exchange_n(&slot(peer)->arrived, &seen, gaveUpMark(rank, round), false,
                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        marked.push_back(peer);
        break;
      }
    }
  }
  if (!marked.empty()) {  // the ranks that sleep wake to find the marks
    __atomic_fetch_add(&header()->arrivals, 1, __ATOMIC_SEQ_CST);
    ::syscall(SYS_futex, &header()->arrivals, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
  return marked;
}

std::optional<int> SharedExchange::gaveUpOn(std::uint64_t round) const noexcept {
  for (int rank = 0; rank < world_; ++rank) {
    const std::uint64_t value = __atomic_load_n(&slot(rank)->arrived, __ATOMIC_SEQ_CST);
    if (isMarkOf(value, round)) return markedBy(value);
  }
  return std::nullopt;
}

bool SharedExchange::allArrived(std::uint64_t round) const noexcept {
  for (int rank = 0; rank < world_; ++rank) {
    if (!hasArrived(__atomic_load_n(&slot(rank)->arrived, __ATOMIC_SEQ_CST), round)) return false;
  }
  return true;
}

std::vector<int> SharedExchange::missing(std::uint64_t round) const {
  std::vector<int> out;
  for (int rank = 0; rank < world_; ++rank) {
    if (!hasArrived(__atomic_load_n(&slot(rank)->arrived, __ATOMIC_SEQ_CST), round)) {
      out.push_back(rank);
    }
  }
  return out;
}

bool SharedExchange::waitForArrival(std::uint64_t round,
                                    std::chrono::nanoseconds timeout) noexcept {
  Header& h = *header();
  const std::uint32_t seen = __atomic_load_n(&h.arrivals, __ATOMIC_SEQ_CST);
  __atomic_fetch_add(&h.sleepers, 1, __ATOMIC_SEQ_CST);
  bool inTime = true;
  if (!allArrived(round)) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    timespec relative{static_cast<time_t>(seconds.count()),
                      static_cast<long>((timeout - seconds).count())};
    // EAGAIN (an arrival since `seen`), EINTR and ETIMEDOUT all return to the caller's check.
    inTime = ::syscall(SYS_futex, &h.arrivals, FUTEX_WAIT, seen, &relative, nullptr, 0) == 0 ||
             errno != ETIMEDOUT;
  }
  __atomic_fetch_sub(&h.sleepers, 1, __ATOMIC_SEQ_CST);
  return inTime;
}

std::uint64_t SharedExchange::sequence(int peer, std::uint64_t round) const noexcept {
  return slot(peer)->sequence[round % 2];
}

std::uint64_t SharedExchange::length(int peer, std::uint64_t round) const noexcept {
  return slot(peer)->length[round % 2];
}

}  // namespace hmc::detail
