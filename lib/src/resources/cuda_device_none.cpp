// cuda_device.hpp in a build without CUDA (hmc_core, HMC_HAVE_CUDA 0).
#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"

namespace hmc::resources {

DeviceProbe cudaDeviceUsable() noexcept {
  DeviceProbe probe;
  probe.reason = std::string("no usable CUDA device: ") + kBuiltWithoutCuda;
  return probe;
}

DeviceMemoryInfo deviceMemoryInfo(int device) { throw BackendError(kBuiltWithoutCuda); }

}  // namespace hmc::resources
