#pragma once
// Private to hmc_torch: LibTorch's current CUDA stream as a cudaStream_t, across LibTorch
// versions. c10::Stream::native_handle() arrived in LibTorch 2.2; before it only the default
// stream (the legacy null stream, nullptr) can be named without linking c10_cuda. The CUDA
// device guard is reached through c10's registry, so no CUDA header is needed here.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include "hmc/error.hpp"

struct CUstream_st;

namespace hmc::nn::detail {

// The stream LibTorch queues work on for `device` (a CUDA device); nullptr is the legacy
// default stream.
inline CUstream_st* currentCudaStream(const c10::Device& device) {
  const c10::Stream stream =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  return static_cast<CUstream_st*>(stream.native_handle());
#else
  if (stream.id() != 0) {
    throw BackendError(
        "hmc's CUDA workspaces need LibTorch 2.2 or newer to follow a non-default current "
        "CUDA stream; run on the default stream or use a newer LibTorch");
  }
  return nullptr;
#endif
}

}  // namespace hmc::nn::detail
