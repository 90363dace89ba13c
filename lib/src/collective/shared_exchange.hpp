// The tcp transport's exchange among rank processes of one host, through shared memory
// (docs/multi-process.md). Where every rank of a world is on one host, each exchange costs a
// rank one store of its envelope and one atomic add; the last rank to arrive wakes the others
// with one futex call, where the sockets cost every rank a send to each peer, receives, a
// poll() and the wake-ups of each frame.
//
// The region (a memfd that rank 0 creates and hands to the others over their Unix-domain
// sockets) holds, for every rank, two slots: exchange n uses slot n % 2. A rank cannot be
// two exchanges ahead of another (exchange n + 1 completes only once every rank has
// arrived at it, so after every rank has read exchange n), so two slots are enough. An
// envelope larger than a slot is marked `kOnSocket` there and travels on the sockets.
//
// Not thread-safe: one exchange at a time per rank, as every Collective.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hmc::detail {

class SharedExchange {
 public:
  // An envelope up to this size travels in the region; a larger one on the sockets.
  static constexpr std::size_t kSlotBytes = 64 * 1024;
  // A slot's length when its envelope travels on the sockets.
  static constexpr std::uint64_t kOnSocket = ~std::uint64_t{0};

  SharedExchange() = default;
  SharedExchange(SharedExchange&& other) noexcept;
  SharedExchange& operator=(SharedExchange&& other) noexcept;
  SharedExchange(const SharedExchange&) = delete;
  SharedExchange& operator=(const SharedExchange&) = delete;
  ~SharedExchange();

  // A new region for `world` ranks (memfd_create, ftruncate, mmap). Throws BackendError
  // naming `what` when a call fails.
  static SharedExchange create(int world, const std::string& what);
  // Maps the region behind `fd` (from create(), on another process); closes `fd`.
  static SharedExchange attach(int fd, int world, const std::string& what);

  explicit operator bool() const noexcept { return base_ != nullptr; }
  // The region's descriptor while this rank still holds it (create() keeps it until
  // releaseDescriptor(), to hand to the other ranks), else -1.
  int descriptor() const noexcept { return fd_; }
  void releaseDescriptor() noexcept;

  // Puts this rank's envelope of exchange `round` (1, 2, ...) in its slot (kOnSocket when
  // larger than kSlotBytes) with the caller's sequence, then marks the rank arrived and
  // wakes the ranks that sleep when it was the last. `inSlot`: whether it went in the slot.
  // `lateAfter`: a rank gave up on `round` before this one arrived (giveUp marked its slot):
  // it has not arrived, and the exchange has failed.
  struct Published {
    bool inSlot = false;
    std::optional<int> lateAfter;
  };
  Published publish(int rank, std::uint64_t round, std::uint64_t sequence,
                    const std::string& envelope);
  // At `rank`'s deadline: marks the slot of every rank that has not arrived at `round`, so that
  // its arrival fails as late (one atomic step per slot decides: arrived, or marked), wakes
  // the ranks that sleep, and returns the ranks marked (empty: every rank arrived after all).
  std::vector<int> giveUp(int rank, std::uint64_t round);
  // The rank that gave up on `round` first, where one did.
  std::optional<int> gaveUpOn(std::uint64_t round) const noexcept;
  // Whether every rank has arrived at exchange `round`.
  bool allArrived(std::uint64_t round) const noexcept;
  // The ranks that have not arrived at exchange `round`.
  std::vector<int> missing(std::uint64_t round) const;
  // Sleeps until the last rank arrives at `round`, at most `timeout`; returns at once when
  // every rank has. May return early (an arrival, a signal): the caller checks allArrived().
  // Returns false when `timeout` passed.
  bool waitForArrival(std::uint64_t round, std::chrono::nanoseconds timeout) noexcept;

  // Rank `peer`'s slot of exchange `round` (every rank has arrived): its caller's sequence,
  // and its length (kOnSocket) and bytes.
  std::uint64_t sequence(int peer, std::uint64_t round) const noexcept;
  std::uint64_t length(int peer, std::uint64_t round) const noexcept;
  const char* bytes(int peer, std::uint64_t round) const noexcept;

  // The region's layout (shared_exchange.cpp).
  struct Header;
  struct Slot;

 private:
  void unmap() noexcept;  // and closes the descriptor
  Header* header() const noexcept;
  Slot* slot(int rank) const noexcept;

  void* base_ = nullptr;
  std::size_t size_ = 0;
  int world_ = 0;
  int fd_ = -1;
};

}  // namespace hmc::detail
