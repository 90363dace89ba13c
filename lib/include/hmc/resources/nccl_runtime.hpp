#pragma once
// The process runtime on GPU (hmc_cuda): one NCCL communicator over the collective's world,
// one rank per GPU, created non-blocking and released with a deadline, so that a rank that
// never arrives cannot hang the others in cleanup (the hang users hit in
// torch.distributed.destroy_process_group).
//
// Creation is collective: every rank constructs its NcclRuntime. Each rank checks the NCCL
// the process loaded (checkNcclVersion); rank 0 creates the unique id; one exchange
// ("nccl_unique_id") shares the id and every rank's check outcome, so that a failure on any
// rank raises on every rank instead of leaving the others waiting in ncclCommInitRankConfig.
// The communicator is then created with ncclConfig_t.blocking = 0 and polled with
// ncclCommGetAsyncError until it is ready or initTimeout passes (then it is aborted).
//
// Release: ncclCommFinalize, polled with ncclCommGetAsyncError against releaseTimeout, then
// ncclCommDestroy. Past the deadline, or on an asynchronous error, ncclCommAbort. Which ranks
// never finalized: a rank knows only its own outcome, and NCCL cannot be asked once the
// communicator is in doubt. With shareReleaseOutcome (the default) release() therefore ends
// with one exchange ("nccl_release") of every rank's outcome over the collective's own
// transport (store, threads, Gloo: not NCCL). Because every rank bounds its finalize by the
// same deadline, the ranks that are alive reach that exchange within about releaseTimeout of
// each other, inside the collective's timeout when it is the larger. When the exchange
// itself fails (a rank died or hangs outside NCCL) the report keeps this rank's outcome and
// says why the others are unknown; the TimeoutError text of the collective names the ranks
// that did not arrive. With shareReleaseOutcome, release() is collective: every rank must
// call it, also the ranks whose release failed.
//
// Thread safety: one rank thread. The collective must outlive the runtime.

#include <chrono>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hmc/resources/device_registry.hpp"

// Only a pointer to the bootstrap Collective is held here: the collective layer's nccl
// transport includes this header, so this one must not include collective.hpp back.
namespace hmc::collective {
class Collective;
}

struct ncclComm;
struct CUstream_st;

namespace hmc::resources {

struct NcclRuntimeOptions {
  int device = 0;  // this rank's CUDA device
  // Bound of ncclCommInitRankConfig (the unique id exchange is bounded by the collective).
  std::chrono::milliseconds initTimeout{std::chrono::seconds(120)};
  // Bound of ncclCommFinalize; past it the communicator is aborted.
  std::chrono::milliseconds releaseTimeout{std::chrono::seconds(30)};
  // All-gather the release outcomes (see the file comment). Off: release() is local and the
  // report names this rank only.
  bool shareReleaseOutcome = true;
  // Bound of enqueueing one operation (allReduceBytes) on the non-blocking communicator.
  std::chrono::milliseconds operationTimeout{std::chrono::seconds(30)};
};

// How release() went on this rank.
struct NcclReleaseReport {
  int rank = 0;
  bool finalized = false;  // ncclCommFinalize completed before the deadline
  bool aborted = false;    // the communicator was aborted instead
  bool timedOut = false;   // ... because the deadline passed
  std::string error;       // why it was aborted ("" when finalized)
  std::chrono::duration<double> seconds{0};
  // Ranks that did not finalize. With peersKnown, every rank's; otherwise this rank alone,
  // when it did not.
  std::vector<int> neverFinalized;
  std::vector<int> timedOutRanks;  // those of neverFinalized whose deadline passed
  bool peersKnown = false;
  std::string peersError;  // why the outcome exchange failed

  bool ok() const noexcept { return finalized && neverFinalized.empty(); }
  // {"rank", "finalized", "aborted", "timed_out", "error", "seconds", "never_finalized",
  // "timed_out_ranks", "peers_known", "peers_error"}
  nlohmann::json toJson() const;
  // Throws TimeoutError (a deadline passed) or BackendError unless ok(), naming the ranks
  // that never finalized: what a runtime release registered with the manager raises.
  void throwIfFailed() const;
};

class NcclRuntime {
 public:
  // Collective (see the file comment). Throws BackendError (NCCL or CUDA failed, a version
  // mismatch, a failure on another rank), TimeoutError (the exchange or init deadline).
  NcclRuntime(std::shared_ptr<collective::Collective> collective, NcclRuntimeOptions options = {});
  // Aborts a communicator that was never released, logging it; never throws, never waits.
  ~NcclRuntime();
  NcclRuntime(const NcclRuntime&) = delete;
  NcclRuntime& operator=(const NcclRuntime&) = delete;

  // Bounded release (see the file comment). Returns the report rather than throwing: the
  // communicator is gone either way. A second call returns the first report.
  NcclReleaseReport release();
  bool released() const noexcept { return released_; }
  // Aborts the communicator now (ncclCommAbort, local, never waits for peers) and marks the
  // runtime released with an `aborted` report carrying `reason`; what a caller does when an
  // operation on the communicator passed its deadline. Does nothing after release.
  void abort(const std::string& reason) noexcept;

  // Sums `bytes` bytes at `buffer` (device memory on device()) as uint8 across the ranks, in
  // place, enqueued on `stream` (nullptr: the legacy default stream); returns once enqueued,
  // not once done. Collective over NCCL: every rank must call it with the same size, in the
  // same order as its other NCCL operations. Throws BackendError after release or when NCCL
  // fails, TimeoutError when enqueueing passes options.operationTimeout (the communicator is
  // then aborted).
  void allReduceBytes(void* buffer, std::size_t bytes, CUstream_st* stream);

  // The communicator (ncclComm_t); null after release.
  ncclComm* comm() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int worldSize() const noexcept { return worldSize_; }
  int device() const noexcept { return options_.device; }

 private:
  std::shared_ptr<collective::Collective> collective_;
  NcclRuntimeOptions options_;
  int rank_ = 0;
  int worldSize_ = 1;
  ncclComm* comm_ = nullptr;
  DeviceRegistry::HandleId commId_ = 0;
  bool released_ = false;
  NcclReleaseReport report_;
};

// NCCL version codes: 2.28.9 is 22809 (2.8.x and older: 2804).
struct NcclVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;
  std::string str() const;  // "2.28.9"
};
NcclVersion decodeNcclVersion(int code) noexcept;
// NCCL_VERSION_CODE of the nccl.h hmc was compiled with.
int compiledNcclVersionCode() noexcept;
// ncclGetVersion() of the library the process loaded. Throws BackendError.
int loadedNcclVersionCode();
// The files of every libnccl loaded in this process (normally exactly one).
std::vector<std::string> loadedNcclLibraries();
// Throws BackendError when the majors differ: hmc must call the libnccl.so.2 whose header it
// was compiled with (the one torch loads; point NCCL_PIP_DIR at it when building).
void requireCompatibleNccl(int compiledCode, int loadedCode, const std::string& loadedFrom);
// requireCompatibleNccl for this process, and a BackendError when more than one libnccl is
// loaded. Logs a warning when only minor versions differ. Returns the loaded version.
NcclVersion checkNcclVersion();

}  // namespace hmc::resources
