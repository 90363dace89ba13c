#pragma once
// The `nccl` transport (hmc_cuda, only with HMC_HAVE_CUDA): exchanges as NCCL all-gathers
// between GPUs, the reference's own setting (WORLD on NCCL). One GPU holds one NCCL rank:
// every rank of the world needs its own device (rank r uses device r % deviceCount unless
// options.device says otherwise); runs with more ranks than GPUs use the store or Gloo.
//
//   NcclTransportOptions options;
//   options.bootstrap = storeTransport;  // shares rank 0's unique id; stays the control channel
//   options.timeout = std::chrono::seconds(30);
//   NcclTransport transport(options);    // collective: every rank constructs it
//   transport.exchange("recycle", payload);
//
// Construction is collective over the bootstrap: an NcclRuntime (resources/nccl_runtime.hpp)
// whose unique id rank 0 creates and the bootstrap's exchange shares; the non-blocking
// communicator is polled against options.timeout and aborted past it.
//
// An exchange is two all-gathers on the transport's own stream: the envelope sizes, then the
// envelopes padded to the largest, through device buffers that grow as needed and are kept.
// Each wait polls the stream and ncclCommGetAsyncError against the collective's deadline.
// Past it the communicator is aborted and the rank raises TimeoutError naming the stage;
// which ranks did not arrive is not knowable from NCCL, so the text says so, unless
// options.arrivals is set: then every rank marks its arrival there ("nccl/<seq>/<rank>",
// out of band) and the text names the ranks whose mark is missing. After an abort every
// later exchange raises BackendError: the transport is spent.
//
// Destruction releases the communicator locally (ncclCommFinalize bounded by the timeout,
// then ncclCommAbort), frees the buffers and the stream. Never throws.
//
// Thread safety: like every Collective, one thread at a time. The bootstrap and the arrivals
// store must outlive the transport.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/key_value_store.hpp"

namespace hmc::detail {
struct NcclTransportState;
}  // namespace hmc::detail

namespace hmc::collective {

struct NcclTransportOptions {
  // Carries the unique id (one exchange, "nccl_unique_id") and gives rank and world size.
  std::shared_ptr<Collective> bootstrap;
  // The CUDA device of this rank; -1: rank % the number of devices.
  int device = -1;
  // The collective deadline, also the bound of the communicator's release.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // The bound of the communicator's creation (part of forming the world); unset: `timeout`.
  std::optional<std::chrono::milliseconds> joinTimeout;
  // Optional out-of-band arrival marks, to name the ranks that did not arrive on a timeout.
  // Costs one store round trip per exchange; null: the timeout says the ranks are unknown.
  std::shared_ptr<KeyValueStore> arrivals;

  // Throws ValueError naming the first bad field.
  void validate() const;
};

class NcclTransport final : public Collective {
 public:
  // Collective over options.bootstrap. Throws ValueError (bad options), BackendError (no
  // usable device, NCCL or CUDA failed on any rank, more ranks than devices on a host),
  // TimeoutError (the bootstrap exchange or the communicator's creation passed the timeout).
  explicit NcclTransport(const NcclTransportOptions& options);
  ~NcclTransport() override;

  std::string_view transportName() const noexcept override { return "nccl"; }
  int device() const noexcept;
  // True once an exchange passed its deadline and the communicator was aborted.
  bool aborted() const noexcept;

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;

 private:
  std::unique_ptr<hmc::detail::NcclTransportState> state_;
};

}  // namespace hmc::collective
