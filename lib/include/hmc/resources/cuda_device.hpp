#pragma once
// Whether this process can use a CUDA device, and how much device memory is free. Declared
// in every build: a build without CUDA (HMC_HAVE_CUDA 0) answers "not usable" with the
// reason, and deviceMemoryInfo throws. No CUDA includes.

#include <cstdint>
#include <string>

namespace hmc::resources {

// The message of every CUDA request in a build without CUDA.
inline constexpr const char* kBuiltWithoutCuda =
    "hmc was built without CUDA: rebuild with -DHMC_WITH_CUDA=ON";

struct DeviceProbe {
  bool usable = false;
  int deviceCount = 0;
  // Why no device is usable ("no usable CUDA device: cudaGetDeviceCount returned ..."); ""
  // when usable.
  std::string reason;

  explicit operator bool() const noexcept { return usable; }
};

// Counts the devices and creates the primary context of device 0 (cudaFree(nullptr)), so
// that a driver/runtime mismatch or a device in exclusive use shows here rather than in the
// first allocation. Never throws; clears the runtime's last error when a call failed.
DeviceProbe cudaDeviceUsable() noexcept;

struct DeviceMemoryInfo {
  std::int64_t freeBytes = 0;
  std::int64_t totalBytes = 0;
};

// cudaMemGetInfo on `device` (the calling thread's device is restored). Throws BackendError,
// also in a build without CUDA.
DeviceMemoryInfo deviceMemoryInfo(int device);

}  // namespace hmc::resources
