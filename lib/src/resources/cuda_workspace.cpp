#include "hmc/resources/cuda_workspace.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "cuda_device_guard.hpp"
#include "hmc/error.hpp"
#include "hmc/log.hpp"
#include "hmc/resources/cuda_check.hpp"

namespace hmc::resources {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

CudaWorkspace::CudaWorkspace(CudaWorkspaceOptions options, std::shared_ptr<RankResources> owner)
    : options_(std::move(options)), owner_(std::move(owner)) {
  if (options_.nbytes < 0) throw ValueError("workspace_bytes must be >= 0");
  if (options_.device < 0) throw ValueError("a CUDA workspace needs a device index >= 0");
  if (options_.owner.empty()) {
    options_.owner = fmt::format("{} cuda:{}", options_.kind, options_.device);
  }
  DeviceRegistry& registry = DeviceRegistry::instance();
  Accounting* accounting = owner_ ? &owner_->accounting() : nullptr;
  try {
    detail::DeviceGuard guard(options_.device);
    HMC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    streamId_ = registry.add(DeviceHandleKind::kStream, options_.device, 0, options_.owner);
    if (accounting) ++accounting->streamsCreated;
    HMC_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    eventId_ = registry.add(DeviceHandleKind::kEvent, options_.device, 0, options_.owner);
    if (accounting) ++accounting->eventsCreated;
    HMC_CUDA_CHECK(cudaEventCreateWithFlags(&fence_, cudaEventDisableTiming));
    fenceId_ = registry.add(DeviceHandleKind::kEvent, options_.device, 0, options_.owner);
    if (accounting) ++accounting->eventsCreated;
    if (options_.nbytes > 0) {
      const auto bytes = static_cast<std::size_t>(options_.nbytes);
      HMC_CUDA_CHECK(cudaMalloc(&data_, bytes));
      dataId_ =
          registry.add(DeviceHandleKind::kMemory, options_.device, options_.nbytes, options_.owner);
      if (accounting) accounting->deviceBytesAllocated += options_.nbytes;
      // First touch, as HostWorkspace's memset: a fresh bind pays for the memory it gets.
      HMC_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, stream_));
      HMC_CUDA_CHECK(cudaEventRecord(event_, stream_));
      if (!waitIdle(Clock::now() + options_.closeTimeout)) {
        throw TimeoutError(
            fmt::format("CUDA workspace on cuda:{}: clearing {} bytes did not finish within {} ms",
                        options_.device, options_.nbytes, options_.closeTimeout.count()));
      }
    }
  } catch (...) {
    releaseAllNoThrow();
    throw;
  }
  if (accounting) ++accounting->workspacesCreated;
  counted_ = true;
}

CudaWorkspace::~CudaWorkspace() { releaseAllNoThrow(); }

nlohmann::json CudaWorkspace::lifecycleSignature() const {
  return nlohmann::json::array({options_.kind, options_.nbytes, "torch." + options_.dtype});
}

bool CudaWorkspace::canClose() const { return idle() && !inFlight(); }

void CudaWorkspace::close() {
  if (owner_ && owner_->faults().closeErrors > 0) {
    --owner_->faults().closeErrors;
    throw RuntimeError("injected workspace close failure");
  }
  releaseAll();
  closed_ = true;
}

bool CudaWorkspace::inFlight() const {
  if (event_ == nullptr) return false;
  detail::DeviceGuard guard(options_.device);
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return true;
  HMC_CUDA_CHECK(status);
  return false;
}

void CudaWorkspace::recordWork() {
  requireOpen("recordWork");
  detail::DeviceGuard guard(options_.device);
  HMC_CUDA_CHECK(cudaEventRecord(event_, stream_));
}

void CudaWorkspace::trackWorkOn(CUstream_st* stream) {
  requireOpen("trackWorkOn");
  detail::DeviceGuard guard(options_.device);
  HMC_CUDA_CHECK(cudaEventRecord(fence_, stream));
  HMC_CUDA_CHECK(cudaStreamWaitEvent(stream_, fence_, 0));
  HMC_CUDA_CHECK(cudaEventRecord(event_, stream_));
}

void CudaWorkspace::copyIn(const void* src, std::size_t bytes, CUstream_st* stream) {
  requireOpen("copyIn");
  if (bytes > static_cast<std::size_t>(options_.nbytes)) {
    throw ValueError(fmt::format("copyIn of {} bytes into a CUDA workspace of {} bytes", bytes,
                                 options_.nbytes));
  }
  if (bytes == 0) return;
  detail::DeviceGuard guard(options_.device);
  HMC_CUDA_CHECK(cudaEventRecord(fence_, stream));
  HMC_CUDA_CHECK(cudaStreamWaitEvent(stream_, fence_, 0));
  HMC_CUDA_CHECK(cudaMemcpyAsync(data_, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  HMC_CUDA_CHECK(cudaEventRecord(event_, stream_));
  HMC_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

void CudaWorkspace::requireOpen(const char* what) const {
  if (stream_ == nullptr) {
    throw ValueError(fmt::format("CudaWorkspace::{} on a closed workspace", what));
  }
}

bool CudaWorkspace::waitIdle(Clock::time_point deadline) const {
  // Polled rather than cudaStreamSynchronize: every wait in hmc has a deadline.
  auto pause = std::chrono::microseconds(20);
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) HMC_CUDA_CHECK(status);
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
  }
}

void CudaWorkspace::releaseAll() {
  if (stream_ == nullptr && data_ == nullptr && event_ == nullptr && fence_ == nullptr) {
    return;
  }
  DeviceRegistry& registry = DeviceRegistry::instance();
  Accounting* accounting = owner_ ? &owner_->accounting() : nullptr;
  detail::DeviceGuard guard(options_.device);
  if (stream_ != nullptr && !waitIdle(Clock::now() + options_.closeTimeout)) {
    throw TimeoutError(fmt::format(
        "CUDA workspace on cuda:{}: work on its stream is still in flight after {} ms; close "
        "again once it has finished",
        options_.device, options_.closeTimeout.count()));
  }
  if (data_ != nullptr) {
    HMC_CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    registry.remove(dataId_);
    if (accounting) accounting->deviceBytesFreed += options_.nbytes;
  }
  for (auto [event, id] : {std::pair{&fence_, &fenceId_}, std::pair{&event_, &eventId_}}) {
    if (*event == nullptr) continue;
    HMC_CUDA_CHECK(cudaEventDestroy(*event));
    *event = nullptr;
    registry.remove(*id);
    if (accounting) ++accounting->eventsDestroyed;
  }
  if (stream_ != nullptr) {
    HMC_CUDA_CHECK(cudaStreamDestroy(stream_));
    stream_ = nullptr;
    registry.remove(streamId_);
    if (accounting) ++accounting->streamsDestroyed;
  }
  if (counted_ && accounting) ++accounting->workspacesClosed;
  counted_ = false;
}

void CudaWorkspace::releaseAllNoThrow() noexcept {
  if (stream_ == nullptr && data_ == nullptr && event_ == nullptr && fence_ == nullptr) {
    return;
  }
  DeviceRegistry& registry = DeviceRegistry::instance();
  Accounting* accounting = owner_ ? &owner_->accounting() : nullptr;
  detail::DeviceGuardNoThrow guard(options_.device);
  bool idle = true;
  if (stream_ != nullptr) {
    try {
      idle = waitIdle(Clock::now() + options_.closeTimeout);
    } catch (const std::exception& error) {
      // A device error: the context is unusable, the frees below report their own failures.
      logger()->error("CUDA workspace on cuda:{}: {}", options_.device, error.what());
    }
  }
  if (data_ != nullptr) {
    if (!idle) {
      logger()->error(
          "CUDA workspace on cuda:{}: work still in flight after {} ms; leaving {} bytes "
          "allocated ({})",
          options_.device, options_.closeTimeout.count(), options_.nbytes, options_.owner);
    } else if (HMC_CUDA_CHECK_NOTHROW(cudaFree(data_))) {
      data_ = nullptr;
      registry.remove(dataId_);
      if (accounting) accounting->deviceBytesFreed += options_.nbytes;
    }
  }
  for (auto [event, id] : {std::pair{&fence_, &fenceId_}, std::pair{&event_, &eventId_}}) {
    if (*event != nullptr && HMC_CUDA_CHECK_NOTHROW(cudaEventDestroy(*event))) {
      *event = nullptr;
      registry.remove(*id);
      if (accounting) ++accounting->eventsDestroyed;
    }
  }
  // A stream destroyed with work queued is released once that work completes.
  if (stream_ != nullptr && HMC_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_))) {
    stream_ = nullptr;
    registry.remove(streamId_);
    if (accounting) ++accounting->streamsDestroyed;
  }
  if (data_ == nullptr && counted_ && accounting) {
    ++accounting->workspacesClosed;
    counted_ = false;
  }
}

}  // namespace hmc::resources
