#pragma once
// Checks of CUDA runtime and NCCL calls (hmc_cuda only).
//
//   HMC_CUDA_CHECK(cudaMalloc(&ptr, n));
//   HMC_NCCL_CHECK(ncclGetUniqueId(&id));
//
// throw hmc::BackendError("rank 0: cudaMalloc(&ptr, n) failed: out of memory
// (cudaErrorMemoryAllocation) [cuda_workspace.cpp:57]"). The rank is the calling thread's
// check rank (ScopedCheckRank; omitted while unknown). HMC_NCCL_CHECK_ASYNC also accepts
// ncclInProgress, the answer of calls on a non-blocking communicator.
//
// Destructors and cleanup paths use the non-throwing variants, which log the same message at
// error level to the `hmc` spdlog logger (the default logger while none is registered) and
// evaluate to true when the call succeeded:
//
//   if (!HMC_CUDA_CHECK_NOTHROW(cudaFree(ptr))) { ... }
//
// A failed CUDA call's error is also cleared from the runtime's last-error slot
// (cudaGetLastError), so that LibTorch's own checks do not blame their next kernel for it.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace hmc::resources {

// The rank named by failed checks on this thread; -1 while unknown.
int checkRank() noexcept;

// Sets the calling thread's check rank for its lifetime (thread ranks: one per thread).
class ScopedCheckRank {
 public:
  explicit ScopedCheckRank(int rank) noexcept;
  ~ScopedCheckRank();
  ScopedCheckRank(const ScopedCheckRank&) = delete;
  ScopedCheckRank& operator=(const ScopedCheckRank&) = delete;

 private:
  int previous_;
};

namespace detail {

// "rank 0: <call> failed: <library's message> (<enum name>) [<file>:<line>]".
std::string cudaFailureMessage(cudaError_t status, const char* call, const char* file, int line,
                               int rank);
std::string ncclFailureMessage(ncclResult_t status, const char* call, const char* file, int line,
                               int rank);
[[noreturn]] void throwCudaFailure(cudaError_t status, const char* call, const char* file, int line,
                                   int rank);
[[noreturn]] void throwNcclFailure(ncclResult_t status, const char* call, const char* file,
                                   int line, int rank);
// True for cudaSuccess; logs otherwise.
bool cudaOk(cudaError_t status, const char* call, const char* file, int line) noexcept;
// True for ncclSuccess (and ncclInProgress when `inProgressOk`); logs otherwise.
bool ncclOk(ncclResult_t status, const char* call, const char* file, int line,
            bool inProgressOk) noexcept;

}  // namespace detail
}  // namespace hmc::resources

#define HMC_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t hmc_cuda_status_ = (call);                                              \
    if (hmc_cuda_status_ != cudaSuccess) {                                                    \
      ::hmc::resources::detail::throwCudaFailure(hmc_cuda_status_, #call, __FILE__, __LINE__, \
                                                 ::hmc::resources::checkRank());              \
    }                                                                                         \
  } while (false)

#define HMC_NCCL_CHECK(call)                                                                  \
  do {                                                                                        \
    const ncclResult_t hmc_nccl_status_ = (call);                                             \
    if (hmc_nccl_status_ != ncclSuccess) {                                                    \
      ::hmc::resources::detail::throwNcclFailure(hmc_nccl_status_, #call, __FILE__, __LINE__, \
                                                 ::hmc::resources::checkRank());              \
    }                                                                                         \
  } while (false)

#define HMC_NCCL_CHECK_ASYNC(call)                                                            \
  do {                                                                                        \
    const ncclResult_t hmc_nccl_status_ = (call);                                             \
    if (hmc_nccl_status_ != ncclSuccess && hmc_nccl_status_ != ncclInProgress) {              \
      ::hmc::resources::detail::throwNcclFailure(hmc_nccl_status_, #call, __FILE__, __LINE__, \
                                                 ::hmc::resources::checkRank());              \
    }                                                                                         \
  } while (false)

#define HMC_CUDA_CHECK_NOTHROW(call) \
  ::hmc::resources::detail::cudaOk((call), #call, __FILE__, __LINE__)
#define HMC_NCCL_CHECK_NOTHROW(call) \
  ::hmc::resources::detail::ncclOk((call), #call, __FILE__, __LINE__, false)
#define HMC_NCCL_CHECK_ASYNC_NOTHROW(call) \
  ::hmc::resources::detail::ncclOk((call), #call, __FILE__, __LINE__, true)
