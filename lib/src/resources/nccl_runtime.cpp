#include "hmc/resources/nccl_runtime.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <link.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cuda_device_guard.hpp"
#include "hmc/collective/collective.hpp"
#include "hmc/error.hpp"
#include "hmc/log.hpp"
#include "hmc/resources/cuda_check.hpp"

// ncclConfig_t (blocking = 0), ncclCommFinalize and ncclInProgress arrived in NCCL 2.14.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "hmc needs NCCL 2.14 or newer (non-blocking communicators, ncclCommFinalize)"
#endif

namespace hmc::resources {
namespace {

using Clock = std::chrono::steady_clock;

// Polls the communicator's asynchronous state until it leaves ncclInProgress or `deadline`
// passes; returns the last state.
ncclResult_t pollAsyncState(ncclComm_t comm, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(50);
  while (true) {
    ncclResult_t state = ncclInProgress;
    HMC_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress || Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
  }
}

std::string describe(ncclResult_t state, ncclComm_t comm) {
  std::string text = fmt::format("{}", ncclGetErrorString(state));
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') text += fmt::format(": {}", detail);
  return text;
}

std::string realPath(const char* path) {
  char resolved[PATH_MAX];
  return ::realpath(path, resolved) != nullptr ? std::string(resolved) : std::string(path);
}

int collectNccl(struct dl_phdr_info* info, std::size_t, void* out) {
  const char* name = info->dlpi_name;
  if (name != nullptr && std::strstr(name, "libnccl") != nullptr) {
    auto* paths = static_cast<std::vector<std::string>*>(out);
    const std::string path = realPath(name);
    if (std::find(paths->begin(), paths->end(), path) == paths->end()) paths->push_back(path);
  }
  return 0;
}

std::string libraryOf(const void* symbol) {
  Dl_info info{};
  if (::dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) return realPath(info.dli_fname);
  return "an unknown file";
}

}  // namespace

std::string NcclVersion::str() const { return fmt::format("{}.{}.{}", major, minor, patch); }

NcclVersion decodeNcclVersion(int code) noexcept {
  // NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  if (code >= 10000) return {code / 10000, (code % 10000) / 100, code % 100};
  return {code / 1000, (code % 1000) / 100, code % 100};
}

int compiledNcclVersionCode() noexcept { return NCCL_VERSION_CODE; }

int loadedNcclVersionCode() {
  int code = 0;
  HMC_NCCL_CHECK(ncclGetVersion(&code));
  return code;
}

std::vector<std::string> loadedNcclLibraries() {
  std::vector<std::string> paths;
  ::dl_iterate_phdr(&collectNccl, &paths);
  return paths;
}

void requireCompatibleNccl(int compiledCode, int loadedCode, const std::string& loadedFrom) {
  const NcclVersion compiled = decodeNcclVersion(compiledCode);
  const NcclVersion loaded = decodeNcclVersion(loadedCode);
  if (compiled.major == loaded.major) return;
  throw BackendError(fmt::format(
      "NCCL version mismatch: hmc was compiled against NCCL {} (nccl.h) but this process "
      "loaded NCCL {} from {}; rebuild hmc against the NCCL that torch loads "
      "(-DNCCL_PIP_DIR=<site-packages>/nvidia/nccl) and never load two different "
      "libnccl.so.2 in one process",
      compiled.str(), loaded.str(), loadedFrom));
}

NcclVersion checkNcclVersion() {
  const std::string from = libraryOf(reinterpret_cast<const void*>(&ncclGetVersion));
  const int loadedCode = loadedNcclVersionCode();
  requireCompatibleNccl(NCCL_VERSION_CODE, loadedCode, from);
  const std::vector<std::string> libraries = loadedNcclLibraries();
  if (libraries.size() > 1) {
    throw BackendError(fmt::format(
        "this process loaded {} different NCCL libraries ({}); hmc and torch must share one "
        "libnccl.so.2: rebuild hmc with -DNCCL_PIP_DIR pointing at the one torch loads",
        libraries.size(), fmt::join(libraries, ", ")));
  }
  const NcclVersion loaded = decodeNcclVersion(loadedCode);
  if (loadedCode != NCCL_VERSION_CODE) {
    logger()->warn("hmc was compiled against NCCL {} but runs with NCCL {} from {}",
                   decodeNcclVersion(NCCL_VERSION_CODE).str(), loaded.str(), from);
  }
  return loaded;
}

nlohmann::json NcclReleaseReport::toJson() const {
  return {{"rank", rank},
          {"finalized", finalized},
          {"aborted", aborted},
          {"timed_out", timedOut},
          {"error", error},
          {"seconds", seconds.count()},
          {"never_finalized", neverFinalized},
          {"timed_out_ranks", timedOutRanks},
          {"peers_known", peersKnown},
          {"peers_error", peersError}};
}

void NcclReleaseReport::throwIfFailed() const {
  if (ok()) return;
  std::string message = fmt::format("NCCL communicator release: ranks {} never finalized",
                                    collective::formatRankList(neverFinalized));
  if (!error.empty()) message += fmt::format(" (rank {}: {})", rank, error);
  if (!peersKnown) message += fmt::format("; the other ranks' outcome is unknown: {}", peersError);
  if (timedOut || !timedOutRanks.empty()) throw TimeoutError(message);
  throw BackendError(message);
}

NcclRuntime::NcclRuntime(std::shared_ptr<collective::Collective> collective,
                         NcclRuntimeOptions options)
    : collective_(std::move(collective)), options_(options) {
  if (!collective_) throw ValueError("NcclRuntime needs a collective");
  rank_ = collective_->rank();
  worldSize_ = collective_->worldSize();
  report_.rank = rank_;
  ScopedCheckRank checkRank(rank_);

  // Local checks first, their outcome travels with the id: a failure on one rank raises on
  // every rank here rather than as a timeout inside ncclCommInitRankConfig.
  ncclUniqueId id{};
  std::string payload;
  try {
    checkNcclVersion();
    detail::DeviceGuard guard(options_.device);
    if (rank_ == 0) HMC_NCCL_CHECK(ncclGetUniqueId(&id));
    payload = "+";
    if (rank_ == 0) payload.append(id.internal, sizeof(id.internal));
  } catch (const std::exception& error) {
    payload = std::string("-") + error.what();
  }
  const std::vector<collective::Bytes> outcomes = collective_->exchange("nccl_unique_id", payload);
  std::vector<int> failed;
  for (int r = 0; r < static_cast<int>(outcomes.size()); ++r) {
    if (outcomes[r].empty() || outcomes[r][0] != '+') failed.push_back(r);
  }
  if (!failed.empty()) {
    throw BackendError(fmt::format("NCCL runtime init failed on ranks {}: {}",
                                   collective::formatRankList(failed),
                                   outcomes[failed.front()].substr(1)));
  }
  if (outcomes[0].size() != 1 + sizeof(id.internal)) {
    throw BackendError(fmt::format("rank {}: the NCCL unique id from rank 0 has {} bytes, not {}",
                                   rank_, outcomes[0].size() - 1, sizeof(id.internal)));
  }
  std::memcpy(id.internal, outcomes[0].data() + 1, sizeof(id.internal));

  detail::DeviceGuard guard(options_.device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, worldSize_, id, rank_, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    const std::string message = detail::ncclFailureMessage(
        started, "ncclCommInitRankConfig(&comm, worldSize, id, rank, &config)", __FILE__, __LINE__,
        rank_);
    if (comm != nullptr) HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm));
    throw BackendError(message);
  }
  ncclResult_t state = ncclInProgress;
  try {
    state = pollAsyncState(comm, Clock::now() + options_.initTimeout);
  } catch (...) {
    HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm));
    throw;
  }
  if (state != ncclSuccess) {
    const std::string reason = describe(state, comm);
    HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm));
    if (state == ncclInProgress) {
      throw TimeoutError(
          fmt::format("rank {}: the NCCL communicator over {} ranks was not ready within {} ms "
                      "(ncclCommInitRankConfig); it was aborted",
                      rank_, worldSize_, options_.initTimeout.count()));
    }
    throw BackendError(fmt::format("rank {}: ncclCommInitRankConfig failed: {}", rank_, reason));
  }
  comm_ = comm;
  commId_ = DeviceRegistry::instance().add(
      DeviceHandleKind::kCommunicator, options_.device, 0,
      fmt::format("rank {} nccl communicator ({} ranks)", rank_, worldSize_));
}

NcclRuntime::~NcclRuntime() {
  if (comm_ == nullptr) return;
  try {
    logger()->warn("rank {}: NCCL communicator destroyed without release(); aborting it", rank_);
  } catch (...) {
  }
  detail::DeviceGuardNoThrow guard(options_.device);
  HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm_));
  comm_ = nullptr;
  DeviceRegistry::instance().remove(commId_);
}

void NcclRuntime::abort(const std::string& reason) noexcept {
  if (released_ || comm_ == nullptr) return;
  ScopedCheckRank checkRank(rank_);
  {
    detail::DeviceGuardNoThrow guard(options_.device);
    HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm_));
  }
  comm_ = nullptr;
  DeviceRegistry::instance().remove(commId_);
  released_ = true;
  try {
    report_ = NcclReleaseReport{};
    report_.rank = rank_;
    report_.aborted = true;
    report_.error = reason;
    report_.neverFinalized = {rank_};
    report_.peersError = "the communicator was aborted before its release";
  } catch (...) {
  }
}

void NcclRuntime::allReduceBytes(void* buffer, std::size_t bytes, CUstream_st* stream) {
  ScopedCheckRank checkRank(rank_);
  if (comm_ == nullptr) {
    throw BackendError(
        fmt::format("rank {}: the NCCL communicator was already released or aborted", rank_));
  }
  if (bytes == 0) return;
  detail::DeviceGuard guard(options_.device);
  HMC_NCCL_CHECK_ASYNC(ncclAllReduce(buffer, buffer, bytes, ncclUint8, ncclSum, comm_, stream));
  const ncclResult_t state = pollAsyncState(comm_, Clock::now() + options_.operationTimeout);
  if (state == ncclSuccess) return;
  const std::string reason =
      state == ncclInProgress
          ? fmt::format("ncclAllReduce of {} bytes was not enqueued within {} ms", bytes,
                        options_.operationTimeout.count())
          : "ncclAllReduce failed: " + describe(state, comm_);
  abort(reason);
  if (state == ncclInProgress) {
    throw TimeoutError(fmt::format("rank {}: {}; the communicator was aborted", rank_, reason));
  }
  throw BackendError(fmt::format("rank {}: {}; the communicator was aborted", rank_, reason));
}

NcclReleaseReport NcclRuntime::release() {
  if (released_) return report_;
  ScopedCheckRank checkRank(rank_);
  const Clock::time_point start = Clock::now();
  NcclReleaseReport report;
  report.rank = rank_;
  if (comm_ != nullptr) {
    detail::DeviceGuardNoThrow guard(options_.device);
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclSuccess || state == ncclInProgress) {
      try {
        state = pollAsyncState(comm_, start + options_.releaseTimeout);
      } catch (const std::exception& error) {
        state = ncclInternalError;
        report.error = error.what();
      }
    }
    if (state == ncclSuccess) {
      report.finalized = true;
      // After a finalize, destroy is local.
      HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommDestroy(comm_));
    } else {
      report.aborted = true;
      report.timedOut = state == ncclInProgress;
      if (report.timedOut) {
        report.error = fmt::format("ncclCommFinalize did not complete within {} ms",
                                   options_.releaseTimeout.count());
      } else if (report.error.empty()) {
        report.error = "ncclCommFinalize failed: " + describe(state, comm_);
      }
      HMC_NCCL_CHECK_ASYNC_NOTHROW(ncclCommAbort(comm_));
    }
    comm_ = nullptr;
    DeviceRegistry::instance().remove(commId_);
  } else {
    report.finalized = true;
  }

  // Outcome codes: 'F' finalized, 'T' timed out, 'E' failed.
  const char outcome = report.finalized ? 'F' : report.timedOut ? 'T' : 'E';
  if (options_.shareReleaseOutcome) {
    try {
      const std::vector<collective::Bytes> outcomes =
          collective_->exchange("nccl_release", std::string(1, outcome));
      for (int r = 0; r < static_cast<int>(outcomes.size()); ++r) {
        const char peer = outcomes[r].empty() ? 'E' : outcomes[r][0];
        if (peer != 'F') report.neverFinalized.push_back(r);
        if (peer == 'T') report.timedOutRanks.push_back(r);
      }
      report.peersKnown = true;
    } catch (const std::exception& error) {
      report.peersError = error.what();
    }
  }
  if (!report.peersKnown && outcome != 'F') {
    report.neverFinalized = {rank_};
    if (outcome == 'T') report.timedOutRanks = {rank_};
  }
  report.seconds = Clock::now() - start;
  if (!report.ok()) {
    logger()->warn("rank {}: NCCL communicator release: ranks {} never finalized{}{}", rank_,
                   collective::formatRankList(report.neverFinalized),
                   report.error.empty() ? "" : "; here: " + report.error,
                   report.peersKnown ? "" : "; other ranks unknown: " + report.peersError);
  }
  released_ = true;
  report_ = report;
  return report_;
}

}  // namespace hmc::resources
