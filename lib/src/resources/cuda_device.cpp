// cuda_device.hpp in a build with CUDA (hmc_cuda).
#include "hmc/resources/cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "cuda_device_guard.hpp"
#include "hmc/resources/cuda_check.hpp"

namespace hmc::resources {
namespace {

std::string describe(cudaError_t status) {
  return fmt::format("{} ({})", cudaGetErrorName(status), cudaGetErrorString(status));
}

}  // namespace

DeviceProbe cudaDeviceUsable() noexcept {
  DeviceProbe probe;
  try {
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    if (counted != cudaSuccess) {
      (void)cudaGetLastError();
      probe.reason = "no usable CUDA device: cudaGetDeviceCount returned " + describe(counted);
      return probe;
    }
    probe.deviceCount = count;
    if (count == 0) {
      probe.reason = "no usable CUDA device: cudaGetDeviceCount returned 0 devices";
      return probe;
    }
    int previous = 0;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    cudaError_t status = cudaSetDevice(0);
    if (status == cudaSuccess) status = cudaFree(nullptr);
    if (restore) (void)cudaSetDevice(previous);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      probe.reason = fmt::format(
          "no usable CUDA device: {} device(s) counted, but creating a context on device 0 "
          "returned {}",
          count, describe(status));
      return probe;
    }
    probe.usable = true;
  } catch (...) {
    probe.usable = false;
    probe.reason = "no usable CUDA device: the probe failed unexpectedly";
  }
  return probe;
}

DeviceMemoryInfo deviceMemoryInfo(int device) {
  detail::DeviceGuard guard(device);
  std::size_t freeBytes = 0;
  std::size_t totalBytes = 0;
  HMC_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
  return {static_cast<std::int64_t>(freeBytes), static_cast<std::int64_t>(totalBytes)};
}

}  // namespace hmc::resources
