// CudaWorkspace and NcclRuntime on a real device. Skipped, with the reason, where no CUDA
// device is usable (see support/cuda_skip.hpp).

#define DOCTEST_CONFIG_IMPLEMENT
#include "hmc/resources/cuda_workspace.hpp"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_check.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/nccl_runtime.hpp"
#include "support/cuda_skip.hpp"

using hmc::resources::CudaWorkspace;
using hmc::resources::CudaWorkspaceOptions;
using hmc::resources::DeviceRegistry;
using hmc::resources::NcclRuntime;
using hmc::resources::RankResources;

namespace {

constexpr std::int64_t kMiB = 1 << 20;

CudaWorkspaceOptions optionsOf(std::int64_t nbytes,
                               std::chrono::milliseconds closeTimeout = std::chrono::seconds(10)) {
  CudaWorkspaceOptions options;
  options.kind = "scratch_linear";
  options.nbytes = nbytes;
  options.dtype = "float32";
  options.device = 0;
  options.closeTimeout = closeTimeout;
  options.owner = "cuda_workspace_test";
  return options;
}

// Keeps a stream busy with a host function until open() (or destruction): in-flight work
// without a kernel, for as long as the test needs.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    HMC_CUDA_CHECK(cudaLaunchHostFunc(stream, &StreamGate::hold, &open_));
  }
  ~StreamGate() { open(); }
  void open() { open_.store(true); }

 private:
  static void hold(void* flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto* open = static_cast<std::atomic<bool>*>(flag);
    while (!open->load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::atomic<bool> open_{false};
};

bool waitUntilIdle(const CudaWorkspace& workspace) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (workspace.inFlight()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("the device probe finds a usable device") {
    const auto probe = hmc::resources::cudaDeviceUsable();
    CHECK(probe.usable);
    CHECK(probe.deviceCount >= 1);
    CHECK(probe.reason.empty());
    const auto memory = hmc::resources::deviceMemoryInfo(0);
    CHECK(memory.totalBytes > 0);
    CHECK(memory.freeBytes <= memory.totalBytes);
  }

  TEST_CASE("a CUDA workspace allocates zeroed device memory on its device and accounts for it") {
    auto resources = std::make_shared<RankResources>();
    const auto before = DeviceRegistry::instance().snapshot();
    {
      CudaWorkspace workspace(optionsOf(4 * kMiB), resources);
      REQUIRE(workspace.data() != nullptr);
      REQUIRE(workspace.stream() != nullptr);
      cudaPointerAttributes attributes{};
      HMC_CUDA_CHECK(cudaPointerGetAttributes(&attributes, workspace.data()));
      CHECK(attributes.type == cudaMemoryTypeDevice);
      CHECK(attributes.device == 0);
      std::vector<std::uint8_t> host(4 * kMiB, 0xff);
      HMC_CUDA_CHECK(
          cudaMemcpy(host.data(), workspace.data(), host.size(), cudaMemcpyDeviceToHost));
      CHECK(host.front() == 0);
      CHECK(host.back() == 0);

      CHECK(workspace.lifecycleSignature().dump() ==
            R"(["scratch_linear",4194304,"torch.float32"])");
      const auto& accounting = resources->accounting();
      CHECK(accounting.deviceBytesAllocated == 4 * kMiB);
      CHECK(accounting.deviceBytesHeld() == 4 * kMiB);
      CHECK(accounting.bytesAllocated == 0);  // host bytes stay host bytes
      CHECK(accounting.streamsHeld() == 1);
      CHECK(accounting.eventsHeld() == 2);
      CHECK(accounting.workspacesHeld() == 1);
      const auto live = DeviceRegistry::instance().snapshot();
      CHECK(live.liveBytes - before.liveBytes == 4 * kMiB);
      CHECK(live.allocations - before.allocations == 1);
      CHECK(live.streams - before.streams == 1);
      CHECK(live.events - before.events == 2);

      CHECK(workspace.canClose());
      workspace.close();
      CHECK(workspace.closed());
      CHECK(workspace.data() == nullptr);
      CHECK(accounting.deviceBytesHeld() == 0);
      CHECK(accounting.streamsHeld() == 0);
      CHECK(accounting.eventsHeld() == 0);
      CHECK(accounting.workspacesHeld() == 0);
    }
    const auto after = DeviceRegistry::instance().snapshot();
    CHECK(after.liveBytes == before.liveBytes);
    CHECK(after.streams == before.streams);
    CHECK(after.events == before.events);
  }

  TEST_CASE("canClose is false while work is in flight on the workspace stream") {
    auto resources = std::make_shared<RankResources>();
    CudaWorkspace workspace(optionsOf(kMiB), resources);
    {
      StreamGate gate(workspace.stream());
      workspace.recordWork();
      CHECK(workspace.inFlight());
      CHECK_FALSE(workspace.canClose());
      gate.open();
      REQUIRE(waitUntilIdle(workspace));
    }
    CHECK(workspace.canClose());
    workspace.close();
  }

  TEST_CASE("close waits for in-flight work only until its deadline, and a retry closes") {
    auto resources = std::make_shared<RankResources>();
    CudaWorkspace workspace(optionsOf(kMiB, std::chrono::milliseconds(100)), resources);
    {
      StreamGate gate(workspace.stream());
      workspace.recordWork();
      CHECK_THROWS_AS(workspace.close(), hmc::TimeoutError);
      CHECK_FALSE(workspace.closed());
      CHECK(workspace.data() != nullptr);  // nothing freed under running work
      CHECK(resources->accounting().deviceBytesHeld() == kMiB);
      gate.open();
      REQUIRE(waitUntilIdle(workspace));
    }
    workspace.close();
    CHECK(workspace.closed());
    CHECK(resources->accounting().deviceBytesHeld() == 0);
  }

  TEST_CASE("canClose is false while a backward is pending or a busy fault is set") {
    CudaWorkspace workspace(optionsOf(kMiB), std::make_shared<RankResources>());
    workspace.addPending();
    CHECK(workspace.pending() == 1);
    CHECK_FALSE(workspace.canClose());
    workspace.removePending();
    CHECK(workspace.canClose());
    workspace.setBusy(true);
    CHECK_FALSE(workspace.canClose());
    workspace.setBusy(false);
    CHECK(workspace.canClose());
  }

  TEST_CASE("close is idempotent") {
    auto resources = std::make_shared<RankResources>();
    CudaWorkspace workspace(optionsOf(2 * kMiB), resources);
    workspace.close();
    workspace.close();
    CHECK(workspace.closed());
    CHECK(workspace.canClose());
    CHECK(resources->accounting().workspacesClosed == 1);
    CHECK(resources->accounting().deviceBytesFreed == 2 * kMiB);
    CHECK(resources->accounting().eventsDestroyed == 2);
    CHECK(resources->accounting().streamsDestroyed == 1);
  }

  TEST_CASE("an injected close failure keeps everything, and the retry closes") {
    auto resources = std::make_shared<RankResources>();
    CudaWorkspace workspace(optionsOf(kMiB), resources);
    resources->faults().closeErrors = 1;
    CHECK_THROWS_WITH_AS(workspace.close(), "injected workspace close failure", hmc::RuntimeError);
    CHECK_FALSE(workspace.closed());
    CHECK(workspace.data() != nullptr);
    CHECK(resources->accounting().deviceBytesHeld() == kMiB);
    workspace.close();
    CHECK(workspace.closed());
    CHECK(resources->faults().closeErrors == 0);
    CHECK(resources->accounting().deviceBytesHeld() == 0);
    CHECK(resources->accounting().workspacesHeld() == 0);
  }

  TEST_CASE("copyIn stages device memory into the workspace, ordered with the default stream") {
    CudaWorkspace workspace(optionsOf(kMiB), std::make_shared<RankResources>());
    std::vector<std::uint8_t> pattern(64 * 1024);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 7);
    void* source = nullptr;
    HMC_CUDA_CHECK(cudaMalloc(&source, pattern.size()));
    HMC_CUDA_CHECK(cudaMemcpy(source, pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
    workspace.copyIn(source, pattern.size(), nullptr);
    std::vector<std::uint8_t> back(pattern.size());
    // The default stream waits for the copy: a plain cudaMemcpy sees it.
    HMC_CUDA_CHECK(cudaMemcpy(back.data(), workspace.data(), back.size(), cudaMemcpyDeviceToHost));
    CHECK(back == pattern);
    CHECK_THROWS_AS(workspace.copyIn(source, 2 * kMiB, nullptr), hmc::ValueError);
    HMC_CUDA_CHECK(cudaFree(source));
    workspace.trackWorkOn(nullptr);
    REQUIRE(waitUntilIdle(workspace));
    workspace.close();
    CHECK_THROWS_AS(workspace.recordWork(), hmc::ValueError);
  }

  TEST_CASE("a zero-byte workspace holds a stream and events but no memory") {
    auto resources = std::make_shared<RankResources>();
    CudaWorkspace workspace(optionsOf(0), resources);
    CHECK(workspace.data() == nullptr);
    CHECK(workspace.stream() != nullptr);
    CHECK(resources->accounting().workspacesHeld() == 1);
    workspace.close();
    CHECK(resources->accounting().workspacesHeld() == 0);
    CHECK(resources->accounting().streamsHeld() == 0);
  }

  TEST_CASE("a failed CUDA call raises BackendError naming the rank and the call") {
    hmc::resources::ScopedCheckRank rank(5);
    void* pointer = nullptr;
    // More memory than any device has.
    const std::size_t huge = std::size_t{1} << 60;
    try {
      HMC_CUDA_CHECK(cudaMalloc(&pointer, huge));
      FAIL("cudaMalloc of 2^60 bytes succeeded");
    } catch (const hmc::BackendError& error) {
      const std::string message = error.what();
      CHECK(message.rfind("rank 5: cudaMalloc(&pointer, huge) failed: ", 0) == 0);
      CHECK(message.find("cudaErrorMemoryAllocation") != std::string::npos);
    }
    CHECK(cudaGetLastError() == cudaSuccess);  // cleared for LibTorch's own checks
  }

  TEST_CASE("the NCCL runtime creates and releases a communicator over a world of one") {
    auto collective = std::make_shared<hmc::collective::LocalCollective>();
    const auto before = DeviceRegistry::instance().snapshot();
    hmc::resources::NcclRuntimeOptions options;
    options.device = 0;
    options.releaseTimeout = std::chrono::seconds(20);
    NcclRuntime runtime(collective, options);
    REQUIRE(runtime.comm() != nullptr);
    CHECK(runtime.rank() == 0);
    CHECK(runtime.worldSize() == 1);
    CHECK(DeviceRegistry::instance().snapshot().communicators - before.communicators == 1);

    // The communicator works: an all-reduce over a workspace on the workspace's stream.
    CudaWorkspace workspace(optionsOf(kMiB), std::make_shared<RankResources>());
    HMC_NCCL_CHECK_ASYNC(ncclAllReduce(workspace.data(), workspace.data(), kMiB / 4, ncclFloat,
                                       ncclSum, runtime.comm(), workspace.stream()));
    ncclResult_t state = ncclInProgress;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      HMC_NCCL_CHECK(ncclCommGetAsyncError(runtime.comm(), &state));
    }
    CHECK(state == ncclSuccess);
    workspace.recordWork();
    REQUIRE(waitUntilIdle(workspace));
    workspace.close();

    const auto report = runtime.release();
    CHECK(report.ok());
    CHECK(report.finalized);
    CHECK_FALSE(report.aborted);
    CHECK(report.peersKnown);
    CHECK(report.neverFinalized.empty());
    CHECK(runtime.released());
    CHECK(runtime.comm() == nullptr);
    CHECK(runtime.release().toJson() == report.toJson());  // a second release changes nothing
    CHECK(DeviceRegistry::instance().snapshot().communicators == before.communicators);
    CHECK_NOTHROW(report.throwIfFailed());
  }
}

int main(int argc, char** argv) {
  const auto probe = hmc::resources::cudaDeviceUsable();
  return hmc::testing::runCudaSuite(argc, argv, probe.usable ? "" : probe.reason);
}
