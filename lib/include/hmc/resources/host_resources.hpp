#pragma once
// Host (CPU) resources of the built-in module types: the per-rank resource environment
// (fault injection, the process runtime, leak accounting) and the host workspace.
// No torch includes: the lifecycle tests and the scenario runner share these.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "hmc/lifecycle/resource.hpp"
#include "hmc/resources/workspace.hpp"

namespace hmc::resources {

// Faults a scenario injects into one rank (scenario-format.md, op `fault`).
struct FaultCounters {
  int closeErrors = 0;    // the next N workspace closes throw
  int releaseErrors = 0;  // the next N runtime releases throw
};

// Bytes and handles allocated and freed by one rank; what the leak check reads.
struct Accounting {
  std::int64_t bytesAllocated = 0;
  std::int64_t bytesFreed = 0;
  std::int64_t workspacesCreated = 0;
  std::int64_t workspacesClosed = 0;
  std::int64_t runtimesCreated = 0;
  std::int64_t runtimesReleased = 0;
  // CUDA workspaces (which also count in workspacesCreated/Closed; bytes* stay host bytes).
  std::int64_t deviceBytesAllocated = 0;
  std::int64_t deviceBytesFreed = 0;
  std::int64_t streamsCreated = 0;
  std::int64_t streamsDestroyed = 0;
  std::int64_t eventsCreated = 0;
  std::int64_t eventsDestroyed = 0;

  std::int64_t bytesHeld() const noexcept { return bytesAllocated - bytesFreed; }
  std::int64_t workspacesHeld() const noexcept { return workspacesCreated - workspacesClosed; }
  std::int64_t deviceBytesHeld() const noexcept { return deviceBytesAllocated - deviceBytesFreed; }
  std::int64_t streamsHeld() const noexcept { return streamsCreated - streamsDestroyed; }
  std::int64_t eventsHeld() const noexcept { return eventsCreated - eventsDestroyed; }
};

class Runtime;
class NcclRuntime;  // nccl_runtime.hpp (hmc_cuda)

// Makes the rank's NCCL runtime for a first binding on CUDA device `device`: collective over
// the rank's world (every rank binds at the same point, after the manager's 'recycle'), or
// null when this rank gets none (one rank, more ranks than GPUs). Set by whoever knows the
// rank's collective (the scenario runner); hmc_core never calls NCCL itself.
using NcclRuntimeFactory = std::function<std::shared_ptr<NcclRuntime>(int device)>;

// Everything one rank's resources share: its faults, its runtime, its accounting. The
// reference keeps these per process; with thread ranks each rank has its own.
// Thread safety: owned by one rank thread.
class RankResources {
 public:
  RankResources() = default;
  RankResources(const RankResources&) = delete;
  RankResources& operator=(const RankResources&) = delete;

  FaultCounters& faults() noexcept { return faults_; }
  Accounting& accounting() noexcept { return accounting_; }
  const Accounting& accounting() const noexcept { return accounting_; }

  // The live runtime (created with the first workspace, cleared by its release), or null.
  std::shared_ptr<Runtime> liveRuntime() const noexcept { return live_; }
  // Creates the live runtime; returns its release function for the manager.
  std::function<void()> createRuntime();

  // The rank these resources belong to, for the owners in the device registry; -1: unknown.
  int rank() const noexcept { return rank_; }
  void setRank(int rank) noexcept { rank_ = rank; }

  // The process runtime on GPU. Without a factory (the default, and every CPU run) CUDA
  // bindings get no NCCL runtime and nothing changes on the host path.
  const NcclRuntimeFactory& ncclRuntimeFactory() const noexcept { return ncclFactory_; }
  void setNcclRuntimeFactory(NcclRuntimeFactory factory) { ncclFactory_ = std::move(factory); }
  // The live NCCL runtime (made with the live runtime by a CUDA binding, dropped by its
  // release), or null.
  const std::shared_ptr<NcclRuntime>& ncclRuntime() const noexcept { return nccl_; }
  void setNcclRuntime(std::shared_ptr<NcclRuntime> runtime) { nccl_ = std::move(runtime); }

 private:
  friend class Runtime;
  FaultCounters faults_;
  Accounting accounting_;
  std::shared_ptr<Runtime> live_;
  int rank_ = -1;
  NcclRuntimeFactory ncclFactory_;
  std::shared_ptr<NcclRuntime> nccl_;
};

// The process runtime shared by all workspaces of a rank (on GPU: the communicator and
// per-device handles). Released once by the manager.
class Runtime {
 public:
  explicit Runtime(RankResources& owner) : owner_(&owner) {}
  // Throws RuntimeError("injected runtime release failure") while a fault is armed.
  void release();
  bool released() const noexcept { return released_; }

 private:
  RankResources* owner_;
  bool released_ = false;
};

// A workspace of host memory (the reference runner's Workspace): `kind`, `nbytes` and dtype
// form its lifecycle signature; pending backward passes and a `busy` fault keep it open.
class HostWorkspace final : public Workspace {
 public:
  HostWorkspace(std::string kind, std::int64_t nbytes, std::string dtype,
                std::shared_ptr<RankResources> owner);
  ~HostWorkspace() override;

  nlohmann::json lifecycleSignature() const override;
  bool canClose() const override;
  // Throws RuntimeError("injected workspace close failure") while a fault is armed; frees
  // the buffer otherwise. Safe to call again.
  void close() override;

  bool closed() const noexcept { return closed_; }
  std::int64_t nbytes() const noexcept override { return nbytes_; }
  // The buffer, for the module's forward to touch; null after close.
  std::uint8_t* data() noexcept { return buffer_.get(); }

 private:
  void free() noexcept;

  std::string kind_;
  std::int64_t nbytes_;
  std::string dtype_;
  std::shared_ptr<RankResources> owner_;
  std::unique_ptr<std::uint8_t[]> buffer_;
  bool closed_ = false;
};

}  // namespace hmc::resources
