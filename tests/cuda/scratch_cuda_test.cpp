// The built-in scratch modules on CUDA tensors: a CudaWorkspace on the tensor's device, used
// by the forward. Skipped, with the reason, where no CUDA device is usable or LibTorch has
// no CUDA (see support/cuda_skip.hpp).

#define DOCTEST_CONFIG_IMPLEMENT
// clang-format off: torch first, then doctest (support/torch_doctest.hpp says why).
#include "support/torch_doctest.hpp"
// clang-format on

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/resources/cuda_workspace.hpp"
#include "hmc/resources/device_registry.hpp"
#include "hmc/resources/nccl_runtime.hpp"
#include "hmc/torch/scratch_modules.hpp"
#include "support/cuda_skip.hpp"

using hmc::lifecycle::ResourceManager;
using hmc::nn::ScratchLinear;
using hmc::nn::ScratchOptions;
using hmc::resources::DeviceRegistry;
using hmc::resources::RankResources;

namespace {

struct RankEnv {
  RankEnv()
      : manager(std::make_shared<ResourceManager>(
            std::make_shared<hmc::collective::LocalCollective>())),
        resources(std::make_shared<RankResources>()) {}

  std::shared_ptr<ScratchLinear> linear(std::int64_t features, std::int64_t workspaceBytes) {
    ScratchOptions options;
    options.features = features;
    options.workspaceBytes = workspaceBytes;
    options.manager = manager;
    options.resources = resources;
    return std::make_shared<ScratchLinear>(options);
  }

  std::shared_ptr<ResourceManager> manager;
  std::shared_ptr<RankResources> resources;
};

bool waitUntilIdle(const hmc::resources::CudaWorkspace& workspace) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (workspace.inFlight()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string skipReason() {
  const auto probe = hmc::resources::cudaDeviceUsable();
  if (!probe) return probe.reason;
  if (!torch::cuda::is_available()) {
    return "no usable CUDA device: LibTorch has no CUDA (torch::cuda::is_available() is false)";
  }
  return "";
}

}  // namespace

TEST_SUITE("cuda_scratch") {
  TEST_CASE(
      "a scratch module bound to a CUDA tensor computes x @ weight through a CUDA workspace") {
    RankEnv env;
    auto module = env.linear(16, 64 * 1024);
    const auto x = torch::randn({8, 16}, torch::TensorOptions().device(torch::kCUDA, 0));
    const auto y = module->forward(x);
    REQUIRE(module->cudaWorkspace() != nullptr);
    CHECK(module->workspace() == nullptr);
    CHECK(module->cudaWorkspace()->device() == 0);
    CHECK(module->cudaWorkspace()->nbytes() == 64 * 1024);
    CHECK(y.device() == x.device());
    const auto weight = module->named_parameters()["weight"];
    CHECK(torch::allclose(y.cpu(), x.cpu().matmul(weight.detach()), 1e-4, 1e-5));
    CHECK(env.resources->accounting().deviceBytesHeld() == 64 * 1024);
    CHECK(env.resources->accounting().bytesHeld() == 0);
  }

  TEST_CASE("a pending backward on CUDA blocks close until it runs, then close frees the device") {
    RankEnv env;
    auto module = env.linear(32, 4 * 32 * 4);
    const auto x =
        torch::randn({4, 32}, torch::TensorOptions().device(torch::kCUDA, 0)).requires_grad_(true);
    auto y = module->forward(x);
    auto* workspace = module->cudaWorkspace();
    REQUIRE(workspace != nullptr);
    CHECK(workspace->pending() == 1);
    CHECK_THROWS_WITH(module->close(),
                      "multicore cleanup requires idle workspaces and no pending backward graphs");
    y.sum().backward();
    CHECK(workspace->pending() == 0);
    CHECK(x.grad().defined());
    REQUIRE(waitUntilIdle(*workspace));
    module->close();
    CHECK(module->isClosed());
    CHECK(env.resources->accounting().deviceBytesHeld() == 0);
    CHECK(env.resources->accounting().streamsHeld() == 0);
    CHECK(env.resources->accounting().workspacesHeld() == 0);
  }

  TEST_CASE("an input larger than the workspace still runs, staging what fits") {
    RankEnv env;
    auto module = env.linear(64, 256);
    const auto x = torch::randn({32, 64}, torch::TensorOptions().device(torch::kCUDA, 0));
    const auto weight = module->named_parameters()["weight"];
    CHECK(torch::allclose(module->forward(x).cpu(), x.cpu().matmul(weight.detach()), 1e-4, 1e-5));
    env.manager->shutdown();
    CHECK(env.resources->accounting().deviceBytesHeld() == 0);
  }

  TEST_CASE("a CUDA binding makes the NCCL runtime from the factory and the release finalizes it") {
    RankEnv env;
    auto collective = std::make_shared<hmc::collective::LocalCollective>();
    int made = 0;
    env.resources->setNcclRuntimeFactory([&](int device) {
      ++made;
      hmc::resources::NcclRuntimeOptions options;
      options.device = device;
      return std::make_shared<hmc::resources::NcclRuntime>(collective, options);
    });
    auto module = env.linear(16, 4096);
    module->forward(torch::randn({4, 16}, torch::TensorOptions().device(torch::kCUDA, 0)));
    CHECK(made == 1);
    REQUIRE(env.resources->ncclRuntime() != nullptr);
    CHECK(env.resources->liveRuntime() != nullptr);
    const auto comms = [] { return DeviceRegistry::instance().snapshot().communicators; };
    CHECK(comms() >= 1);
    // The release_error fault: the first release throws after the NCCL release, the retry
    // releases only the host runtime.
    env.resources->faults().releaseErrors = 1;
    REQUIRE(waitUntilIdle(*module->cudaWorkspace()));
    CHECK_THROWS_WITH(module->close(), doctest::Contains("injected runtime release failure"));
    CHECK(env.resources->ncclRuntime() == nullptr);
    CHECK(env.resources->liveRuntime() != nullptr);
    env.manager->shutdown();
    CHECK(env.resources->liveRuntime() == nullptr);
    CHECK(env.resources->accounting().runtimesReleased == 1);
    CHECK(comms() == 0);
  }
}

int main(int argc, char** argv) { return hmc::testing::runCudaSuite(argc, argv, skipReason()); }
