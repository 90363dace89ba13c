#include "hmc/collective/nccl_transport.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>

#include "../resources/cuda_device_guard.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_check.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/nccl_runtime.hpp"
#include "wait_text.hpp"

namespace hmc::detail {

using collective::Clock;
using resources::DeviceHandleKind;
using resources::DeviceRegistry;

// One device buffer, grown on demand and registered with the device registry.
struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  DeviceRegistry::HandleId id = 0;
};

struct NcclTransportState {
  int device = 0;
  std::string owner;
  std::unique_ptr<resources::NcclRuntime> runtime;
  std::shared_ptr<collective::KeyValueStore> arrivals;
  cudaStream_t stream = nullptr;
  DeviceRegistry::HandleId streamId = 0;
  DeviceBuffer sendSize, recvSizes, sendData, recvData;
  bool aborted = false;
  std::string abortReason;

  void reserve(DeviceBuffer& buffer, std::size_t bytes) {
    if (buffer.bytes >= bytes) return;
    free(buffer);
    const std::size_t rounded = std::max<std::size_t>(bytes, 2 * buffer.bytes);
    HMC_CUDA_CHECK(cudaMalloc(&buffer.data, rounded));
    buffer.bytes = rounded;
    buffer.id = DeviceRegistry::instance().add(DeviceHandleKind::kMemory, device,
                                               static_cast<std::int64_t>(rounded), owner);
  }

  void free(DeviceBuffer& buffer) noexcept {
    if (buffer.data == nullptr) return;
    HMC_CUDA_CHECK_NOTHROW(cudaFree(buffer.data));
    DeviceRegistry::instance().remove(buffer.id);
    buffer = DeviceBuffer{};
  }

  void releaseAll() noexcept {
    resources::detail::DeviceGuardNoThrow guard(device);
    if (runtime) runtime->release();
    // After an abort the stream may hold work that never ran; freeing is still safe once
    // the communicator is gone.
    if (stream != nullptr) HMC_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream));
    for (DeviceBuffer* buffer : {&sendSize, &recvSizes, &sendData, &recvData}) free(*buffer);
    if (stream != nullptr) {
      HMC_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream));
      DeviceRegistry::instance().remove(streamId);
      stream = nullptr;
    }
  }
};

}  // namespace hmc::detail

namespace hmc::collective {
namespace {

using Clock = collective::Clock;

const Collective& requireBootstrap(const NcclTransportOptions& options) {
  options.validate();
  return *options.bootstrap;
}

int deviceFor(int rank, int requested) {
  const resources::DeviceProbe probe = resources::cudaDeviceUsable();
  if (!probe) throw BackendError("--transport nccl: " + probe.reason);
  if (requested >= 0) {
    if (requested >= probe.deviceCount) {
      throw ValueError(fmt::format("nccl transport: device {} requested but only {} visible",
                                   requested, probe.deviceCount));
    }
    return requested;
  }
  return rank % probe.deviceCount;
}

std::string arrivalKey(std::uint64_t sequence, int rank) {
  return fmt::format("nccl/{}/{}", sequence, rank);
}

}  // namespace

void NcclTransportOptions::validate() const {
  if (!bootstrap) throw ValueError("nccl transport: options.bootstrap is required");
  if (timeout.count() <= 0) {
    throw ValueError(
        fmt::format("nccl transport: timeout must be positive, got {} ms", timeout.count()));
  }
  if (joinTimeout && joinTimeout->count() <= 0) {
    throw ValueError(fmt::format("nccl transport: join timeout must be positive, got {} ms",
                                 joinTimeout->count()));
  }
  if (device < -1) throw ValueError(fmt::format("nccl transport: bad device {}", device));
}

NcclTransport::NcclTransport(const NcclTransportOptions& options)
    : Collective(requireBootstrap(options).rank(), requireBootstrap(options).worldSize(),
                 options.timeout),
      state_(std::make_unique<hmc::detail::NcclTransportState>()) {
  state_->device = deviceFor(rank(), options.device);
  state_->owner = fmt::format("rank {} nccl transport cuda:{}", rank(), state_->device);
  state_->arrivals = options.arrivals;
  resources::ScopedCheckRank checkRank(rank());
  resources::NcclRuntimeOptions runtime;
  runtime.device = state_->device;
  runtime.initTimeout = options.joinTimeout.value_or(options.timeout);
  runtime.releaseTimeout = options.timeout;
  runtime.operationTimeout = options.timeout;
  // The transport's release runs in its destructor: local, never another exchange.
  runtime.shareReleaseOutcome = false;
  state_->runtime = std::make_unique<resources::NcclRuntime>(options.bootstrap, runtime);
  try {
    resources::detail::DeviceGuard guard(state_->device);
    HMC_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking));
    state_->streamId = resources::DeviceRegistry::instance().add(
        resources::DeviceHandleKind::kStream, state_->device, 0, state_->owner);
    state_->reserve(state_->sendSize, sizeof(std::int64_t));
    state_->reserve(state_->recvSizes, sizeof(std::int64_t) * worldSize());
  } catch (...) {
    state_->releaseAll();
    throw;
  }
}

NcclTransport::~NcclTransport() { state_->releaseAll(); }

int NcclTransport::device() const noexcept { return state_->device; }

bool NcclTransport::aborted() const noexcept { return state_->aborted; }

std::vector<Bytes> NcclTransport::gather(std::uint64_t sequence, std::string_view stage,
                                         const Bytes& envelope, Clock::time_point deadline) {
  hmc::detail::NcclTransportState& s = *state_;
  resources::ScopedCheckRank checkRank(rank());
  if (s.aborted) {
    throw BackendError(fmt::format(
        "'{}' #{} on rank {}: the nccl transport is unusable since its communicator was "
        "aborted ({})",
        stage, sequence, rank(), s.abortReason));
  }
  if (s.arrivals) {
    s.arrivals->set(arrivalKey(sequence, rank()), "1");
    if (sequence >= 2) s.arrivals->deleteKey(arrivalKey(sequence - 2, rank()));
  }
  const auto start = Clock::now();
  ncclComm_t comm = s.runtime->comm();
  resources::detail::DeviceGuard guard(s.device);

  // Waits until the stream's work is done, polling NCCL's asynchronous state; past the
  // deadline aborts the communicator and raises.
  auto wait = [&](const char* what) {
    auto pause = std::chrono::microseconds(2);
    while (true) {
      ncclResult_t state = ncclSuccess;
      HMC_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        const std::string reason = fmt::format("{}: {}", what, ncclGetErrorString(state));
        s.aborted = true;
        s.abortReason = reason;
        s.runtime->abort(reason);
        throw BackendError(fmt::format("'{}' #{} on rank {}: {}; the communicator was aborted",
                                       stage, sequence, rank(), reason));
      }
      const cudaError_t done = cudaStreamQuery(s.stream);
      if (done == cudaSuccess && state == ncclSuccess) return;
      if (done != cudaErrorNotReady && done != cudaSuccess) HMC_CUDA_CHECK(done);
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
    std::string ranks =
        "which ranks did not arrive is not knowable from NCCL (set arrivals to name them)";
    if (s.arrivals) {
      std::vector<int> missing;
      try {
        for (int peer = 0; peer < worldSize(); ++peer) {
          if (!s.arrivals->check({arrivalKey(sequence, peer)})) missing.push_back(peer);
        }
        ranks = missing.empty()
                    ? std::string("every rank arrived, but the NCCL operation did not complete")
                    : fmt::format("ranks {} did not arrive", formatRankList(missing));
      } catch (const std::exception& error) {
        ranks += fmt::format(" (asking the arrivals store failed: {})", error.what());
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string reason =
        fmt::format("'{}' #{} timed out in {} after {:.3g} s", stage, sequence, what, seconds);
    s.aborted = true;
    s.abortReason = reason;
    s.runtime->abort(reason);
    throw TimeoutError(hmc::detail::timedOutText(
        stage, sequence, rank(), timeout(),
        fmt::format("{} (in the NCCL {}; the communicator was aborted)", ranks, what)));
  };
  auto enqueue = [&](ncclResult_t started, const char* what) {
    if (started != ncclSuccess && started != ncclInProgress) {
      const std::string reason = fmt::format("{}: {}", what, ncclGetErrorString(started));
      s.aborted = true;
      s.abortReason = reason;
      s.runtime->abort(reason);
      throw BackendError(fmt::format("'{}' #{} on rank {}: {}; the communicator was aborted", stage,
                                     sequence, rank(), reason));
    }
  };

  const int world = worldSize();
  const auto mySize = static_cast<std::int64_t>(envelope.size());
  HMC_CUDA_CHECK(
      cudaMemcpyAsync(s.sendSize.data, &mySize, sizeof mySize, cudaMemcpyHostToDevice, s.stream));
  enqueue(ncclAllGather(s.sendSize.data, s.recvSizes.data, 1, ncclInt64, comm, s.stream),
          "all-gather of sizes");
  std::vector<std::int64_t> sizes(world);
  HMC_CUDA_CHECK(cudaMemcpyAsync(sizes.data(), s.recvSizes.data, sizeof(std::int64_t) * world,
                                 cudaMemcpyDeviceToHost, s.stream));
  wait("all-gather of sizes");

  const std::int64_t padded =
      std::max<std::int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  const auto chunk = static_cast<std::size_t>(padded);
  s.reserve(s.sendData, chunk);
  s.reserve(s.recvData, chunk * world);
  if (!envelope.empty()) {
    HMC_CUDA_CHECK(cudaMemcpyAsync(s.sendData.data, envelope.data(), envelope.size(),
                                   cudaMemcpyHostToDevice, s.stream));
  }
  enqueue(ncclAllGather(s.sendData.data, s.recvData.data, chunk, ncclUint8, comm, s.stream),
          "all-gather of envelopes");
  Bytes all(chunk * world, '\0');
  HMC_CUDA_CHECK(
      cudaMemcpyAsync(all.data(), s.recvData.data, all.size(), cudaMemcpyDeviceToHost, s.stream));
  wait("all-gather of envelopes");

  std::vector<Bytes> out;
  out.reserve(world);
  for (int peer = 0; peer < world; ++peer) {
    const std::int64_t size = sizes[peer];
    if (size < 0 || size > padded) {
      throw BackendError(fmt::format("'{}' #{} on rank {}: rank {} sent a bad size {}", stage,
                                     sequence, rank(), peer, size));
    }
    out.emplace_back(all.data() + chunk * peer, static_cast<std::size_t>(size));
  }
  return out;
}

}  // namespace hmc::collective
