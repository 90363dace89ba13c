#pragma once
// The two built-in module types of the scenario format, `scratch_linear` and `scratch_mlp`
// (the reference runner's ScratchLinear / ScratchMLP): a features x features weight, a host
// workspace of `workspace_bytes` per group, and a custom autograd function that counts
// pending backward passes (the workspace cannot close while any is pending). The first
// binding of a rank creates its process runtime and registers its release.

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "hmc/resources/host_resources.hpp"
#include "hmc/torch/multicore_module.hpp"

namespace hmc::resources {
class CudaWorkspace;
}  // namespace hmc::resources

namespace hmc::nn {

struct ScratchOptions {
  std::int64_t features = 64;
  // Bytes of the workspace; nullopt means features * features * 4.
  std::optional<std::int64_t> workspaceBytes;
  // The compatibility key; nullopt means the specification {"features","type",
  // "workspace_bytes"}.
  std::optional<nlohmann::json> compat;
  nlohmann::json scope = "default";
  // The rank's resources; null means a process-wide default.
  std::shared_ptr<resources::RankResources> resources;
  // The rank's manager; null means ResourceManager::current().
  std::shared_ptr<lifecycle::ResourceManager> manager;
  std::string name;  // in the manager's recording (MulticoreOptions::name)
};

class ScratchModule : public MulticoreModule {
 public:
  // x [batch, features] -> x @ weight, through the workspace of the module's group.
  torch::Tensor forward(const torch::Tensor& x);

  const std::string& kind() const noexcept { return kind_; }
  std::int64_t features() const noexcept { return features_; }
  std::int64_t workspaceBytes() const noexcept { return workspaceBytes_; }
  // The bound workspace, or null while unbound or after close.
  resources::HostWorkspace* workspace() const;
  // The bound workspace of a module bound to a CUDA tensor (a CudaWorkspace on the tensor's
  // device), or null; always null in a build without CUDA, where binding to a CUDA tensor
  // throws BackendError("hmc was built without CUDA: ...").
  resources::CudaWorkspace* cudaWorkspace() const;
  resources::RankResources& rankResources() const noexcept { return *resources_; }

  static std::shared_ptr<resources::RankResources> defaultRankResources();

 protected:
  ScratchModule(std::string kind, ScratchOptions options);

  std::shared_ptr<lifecycle::Resource> createExecutionResources(
      const torch::Tensor& tensor, bool shared,
      const std::vector<nlohmann::json>& activeSpecifications) override;
  void registerRuntimeRelease(lifecycle::ResourceManager& manager,
                              lifecycle::Resource& resources) override;

 private:
  std::string kind_;
  std::int64_t features_;
  std::int64_t workspaceBytes_;
  std::shared_ptr<resources::RankResources> resources_;
  torch::Tensor weight_;
};

class ScratchLinear final : public ScratchModule {
 public:
  explicit ScratchLinear(ScratchOptions options = {});
  std::string typeName() const override { return "ScratchLinear"; }
};

class ScratchMLP final : public ScratchModule {
 public:
  explicit ScratchMLP(ScratchOptions options = {});
  std::string typeName() const override { return "ScratchMLP"; }
};

// "scratch_linear" or "scratch_mlp" -> a new module; nullptr for another name.
std::shared_ptr<ScratchModule> makeScratchModule(const std::string& type, ScratchOptions options);

namespace detail {
// A scratch module's specification as the manager keys it: the text of
// {"features": F, "type": KIND, "workspace_bytes": B} with sorted keys and no spaces, what
// nlohmann::json's dump() writes for it, built without a JSON document (once per module
// created, every reuse cycle) unless `kind` needs escaping (a subclass's own kind).
std::string specificationText(std::string_view kind, std::int64_t features,
                              std::int64_t workspaceBytes);
}  // namespace detail

}  // namespace hmc::nn
