#pragma once
// A workspace on a CUDA device (hmc_cuda): `nbytes` of device memory, a stream and an event
// on the bound device, accounted in the rank's RankResources and in the process-wide
// DeviceRegistry. The counterpart of HostWorkspace, with the same lifecycle signature and
// the same pending / busy / fault behaviour.
//
// canClose() is false while work recorded on the workspace (its event) has not finished, a
// backward is pending or a `busy` fault is set. close() waits for that work (bounded by
// closeTimeout), then frees the memory and destroys the event and stream; every step clears
// its handle only once it succeeded, so close() may be called again after a failure and
// goes on where it stopped, and after success it does nothing.
//
// Streams: the workspace's stream is a blocking stream (it orders with the legacy default
// stream). The calls that take a `CUstream_st*` order themselves against that stream with
// events; nullptr means the legacy default stream, where LibTorch queues work unless a
// CUDAStreamGuard says otherwise.
//
// No CUDA includes: CUstream_st* is cudaStream_t.
// Thread safety: one rank thread; pending counts may change on an autograd thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "hmc/lifecycle/resource.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/host_resources.hpp"
#include "hmc/resources/workspace.hpp"

struct CUstream_st;
struct CUevent_st;

namespace hmc::resources {

struct CudaWorkspaceOptions {
  std::string kind;         // the module type ("scratch_linear"): part of the signature
  std::int64_t nbytes = 0;  // workspace_bytes, >= 0
  std::string dtype;        // "float32": part of the signature
  int device = 0;           // CUDA device index
  // Bound of close()'s (and the destructor's) wait for work still in flight.
  std::chrono::milliseconds closeTimeout{std::chrono::seconds(30)};
  // Who holds it, for the registry ("rank 0 scratch_linear cuda:0"); "" means kind + device.
  std::string owner;
};

class CudaWorkspace final : public Workspace {
 public:
  // Allocates on options.device (the caller's current device is restored). Throws
  // ValueError for a negative size, BackendError when an allocation fails (nothing is left
  // allocated then).
  CudaWorkspace(CudaWorkspaceOptions options, std::shared_ptr<RankResources> owner);
  // Releases what close() did not, logging failures; never throws. Memory that is still in
  // use after closeTimeout is left allocated (and stays in the registry) rather than freed
  // under running work.
  ~CudaWorkspace() override;
  CudaWorkspace(const CudaWorkspace&) = delete;
  CudaWorkspace& operator=(const CudaWorkspace&) = delete;

  // ["<kind>", nbytes, "torch.<dtype>"], as HostWorkspace.
  nlohmann::json lifecycleSignature() const override;
  // No pending backward, not busy, and no recorded work in flight. Throws BackendError when
  // the device reports an error.
  bool canClose() const override;
  // Throws RuntimeError("injected workspace close failure") while a fault is armed (nothing
  // is released then), TimeoutError when work is still in flight after closeTimeout,
  // BackendError when CUDA fails. Safe to call again.
  void close() override;

  bool closed() const noexcept { return closed_; }
  std::int64_t nbytes() const noexcept override { return options_.nbytes; }
  int device() const noexcept { return options_.device; }
  // Device memory of nbytes(); null after close and for a workspace of 0 bytes.
  void* data() const noexcept { return data_; }
  // The workspace's stream; null after close.
  CUstream_st* stream() const noexcept { return stream_; }

  // True while work recorded on the workspace has not finished (cudaEventQuery). Throws
  // BackendError on a device error.
  bool inFlight() const;
  // Records the workspace event after the work queued so far on stream(). Non-blocking.
  void recordWork();
  // Makes the workspace stream wait for the work queued so far on `stream`, then records the
  // workspace event: inFlight() stays true until that work is done. Non-blocking.
  void trackWorkOn(CUstream_st* stream);
  // Copies `bytes` (<= nbytes()) of device memory at `src` into the workspace on its stream,
  // after the work queued so far on `stream`; `stream` then waits for the copy. Non-blocking.
  // Throws ValueError when `bytes` is too large or the workspace is closed.
  void copyIn(const void* src, std::size_t bytes, CUstream_st* stream);

 private:
  void requireOpen(const char* what) const;
  // Waits for the stream against `deadline`; false when the work is still running then.
  bool waitIdle(std::chrono::steady_clock::time_point deadline) const;
  void releaseAll();                  // throwing steps, for close()
  void releaseAllNoThrow() noexcept;  // logging steps, for the destructor

  CudaWorkspaceOptions options_;
  std::shared_ptr<RankResources> owner_;
  void* data_ = nullptr;
  CUstream_st* stream_ = nullptr;
  CUevent_st* event_ = nullptr;  // the last recorded work
  CUevent_st* fence_ = nullptr;  // orders the workspace stream after another stream
  DeviceRegistry::HandleId dataId_ = 0;
  DeviceRegistry::HandleId streamId_ = 0;
  DeviceRegistry::HandleId eventId_ = 0;
  DeviceRegistry::HandleId fenceId_ = 0;
  bool closed_ = false;
  bool counted_ = false;  // counted in workspacesCreated, not yet in workspacesClosed
};

}  // namespace hmc::resources
