#pragma once
// Private to hmc_cuda: makes `device` current for a scope and restores the caller's device,
// so that hmc never changes which device LibTorch or the user's code sees as current.

#include <cuda_runtime_api.h>

#include "hmc/resources/cuda_check.hpp"

namespace hmc::resources::detail {

class DeviceGuard {
 public:
  // Throws BackendError when the device cannot be made current.
  explicit DeviceGuard(int device) {
    HMC_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) HMC_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { HMC_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_)); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A guard for noexcept paths: false from ok() when the device could not be made current
// (logged).
class DeviceGuardNoThrow {
 public:
  explicit DeviceGuardNoThrow(int device) noexcept {
    restore_ = HMC_CUDA_CHECK_NOTHROW(cudaGetDevice(&previous_));
    ok_ = restore_ && (previous_ == device || HMC_CUDA_CHECK_NOTHROW(cudaSetDevice(device)));
  }
  ~DeviceGuardNoThrow() {
    if (restore_) HMC_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceGuardNoThrow(const DeviceGuardNoThrow&) = delete;
  DeviceGuardNoThrow& operator=(const DeviceGuardNoThrow&) = delete;
  bool ok() const noexcept { return ok_; }

 private:
  int previous_ = 0;
  bool restore_ = false;
  bool ok_ = false;
};

}  // namespace hmc::resources::detail
