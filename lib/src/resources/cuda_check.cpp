#include "hmc/resources/cuda_check.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <memory>

#include "hmc/error.hpp"
#include "hmc/log.hpp"

namespace hmc::resources {
namespace {

thread_local int tCheckRank = -1;

const char* baseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

const char* ncclResultName(ncclResult_t status) {
  switch (status) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

std::string prefix(int rank) { return rank >= 0 ? fmt::format("rank {}: ", rank) : ""; }

}  // namespace

int checkRank() noexcept { return tCheckRank; }

ScopedCheckRank::ScopedCheckRank(int rank) noexcept : previous_(tCheckRank) { tCheckRank = rank; }

ScopedCheckRank::~ScopedCheckRank() { tCheckRank = previous_; }

namespace detail {

std::string cudaFailureMessage(cudaError_t status, const char* call, const char* file, int line,
                               int rank) {
  return fmt::format("{}{} failed: {} ({}) [{}:{}]", prefix(rank), call, cudaGetErrorString(status),
                     cudaGetErrorName(status), baseName(file), line);
}

std::string ncclFailureMessage(ncclResult_t status, const char* call, const char* file, int line,
                               int rank) {
  std::string message = fmt::format("{}{} failed: {} ({})", prefix(rank), call,
                                    ncclGetErrorString(status), ncclResultName(status));
  // The last error of any communicator on this thread: NCCL's own detail, often the cause.
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && *detail != '\0') message += fmt::format(": {}", detail);
  return message + fmt::format(" [{}:{}]", baseName(file), line);
}

void throwCudaFailure(cudaError_t status, const char* call, const char* file, int line, int rank) {
  (void)cudaGetLastError();
  throw BackendError(cudaFailureMessage(status, call, file, line, rank));
}

void throwNcclFailure(ncclResult_t status, const char* call, const char* file, int line, int rank) {
  throw BackendError(ncclFailureMessage(status, call, file, line, rank));
}

bool cudaOk(cudaError_t status, const char* call, const char* file, int line) noexcept {
  if (status == cudaSuccess) return true;
  (void)cudaGetLastError();
  try {
    logger()->error(cudaFailureMessage(status, call, file, line, checkRank()));
  } catch (...) {
    // Logging must not turn a cleanup failure into a crash.
  }
  return false;
}

bool ncclOk(ncclResult_t status, const char* call, const char* file, int line,
            bool inProgressOk) noexcept {
  if (status == ncclSuccess || (inProgressOk && status == ncclInProgress)) return true;
  try {
    logger()->error(ncclFailureMessage(status, call, file, line, checkRank()));
  } catch (...) {
  }
  return false;
}

}  // namespace detail
}  // namespace hmc::resources
